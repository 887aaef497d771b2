//! The `brain` command line's flags and subcommands (clap), with the checks and conversions
//! of their values.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "brain",
    version,
    about = "Tether brain: enrols workers and runs commands on them",
    long_about = "Tether brain: the long-lived half of Tether. It enrols workers over mutual TLS and drives them.\n\nQuickstart on one machine:\n  brain init\n  brain serve &\n  brain token create          # prints the `worker join ...` line to run\n  worker join ...             # on the worker machine\n  brain workers\n  brain exec WORKER -- uname -a\n\nData lives in --data (default $TETHER_DATA or ~/.local/share/tether)."
)]
pub struct Cli {
    /// Data dir holding the CA, certificates and the store
    #[arg(long, global = true, env = "TETHER_DATA")]
    pub data: Option<PathBuf>,
    /// Brain to talk to for admin commands (default: the address `brain serve` wrote in the data dir)
    #[arg(long, global = true, env = "TETHER_BRAIN")]
    pub brain: Option<String>,
    /// Admin identity dir (ca.pem, cert.pem, key.pem; default: the data dir's admin identity)
    #[arg(long, global = true, env = "TETHER_IDENTITY")]
    pub identity: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

// Parsed once per process: the size of its largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Cmd {
    /// Create the CA, the server certificate and an admin identity in the data dir
    Init {
        /// Extra host name or IP address for the server certificate (repeatable); localhost
        /// and 127.0.0.1 are always included
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Replace an existing CA (every enrolled worker will have to join again)
        #[arg(long)]
        force: bool,
        /// The model agent tasks use when they name none, written to the data dir's
        /// config.toml as [llm] default_model (e.g. anthropic:claude-sonnet-4-5, or
        /// openai:NAME with a local server's base_url)
        #[arg(long)]
        model: Option<String>,
    },
    /// Run the brain until SIGTERM or Ctrl-C
    Serve(ServeArgs),
    /// Start an agent task toward GOAL on a worker and follow it live: steps, tool calls and
    /// their output, approvals asked, tokens and cost. Ctrl-C detaches; the task goes on.
    /// With --plan FILE, run a scripted plan instead (JSON: {"steps":[{"run":[...],"check":[...]},{"write":{"path":...,"content":...}}]})
    Run(RunArgs),
    /// Approve the call a task waits on
    Approve {
        task: String,
        /// Also the same command (in the same directory), or any change to the same file,
        /// for the rest of this task: it is not asked again
        #[arg(long)]
        always: bool,
    },
    /// Deny the call a task waits on; the agent is told why
    Deny {
        task: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// List tasks; CHECK says `verified`, `unverified` (finished without a check, or ended before its check ran), `failing`
    /// or `pending` (`--json`: an array, stable field names)
    Tasks {
        #[arg(long)]
        json: bool,
    },
    /// Act on one task
    #[command(subcommand)]
    Task(TaskCmd),
    /// Follow a task's events live until it ends (Ctrl-C detaches; it never cancels)
    Watch {
        task: String,
        /// Only what comes after this sequence number (the `seq` of the last record seen):
        /// a watch cut off resumes with nothing missed and nothing twice
        #[arg(long, default_value_t = 0)]
        since: u64,
        /// One JSON object per line (records as `task log --json`)
        #[arg(long, conflicts_with = "full")]
        json: bool,
        /// Every record as it is (as `task log --full`)
        #[arg(long)]
        full: bool,
    },
    /// Write a backup of the running brain's whole store to FILE (JSON lines)
    Backup { file: PathBuf },
    /// Restore the store from a backup FILE; the brain must be stopped. The current store is
    /// moved aside, not deleted
    Restore { file: PathBuf },
    /// The store itself, with the brain stopped
    #[command(subcommand)]
    Store(StoreCmd),
    /// Join tokens
    #[command(subcommand)]
    Token(TokenCmd),
    /// Credentials tasks' commands may use without seeing them: stored sealed in the brain,
    /// each bound to hosts, put into requests to those hosts by the egress proxy
    #[command(subcommand)]
    Secret(SecretCmd),
    /// List workers
    Workers {
        /// Print JSON for programs
        #[arg(long)]
        json: bool,
    },
    /// Act on one worker
    #[command(subcommand)]
    Worker(WorkerCmd),
    /// The brain's config file
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Machines this brain created (provider, id, address, spec, task, age, cost, state);
    /// `brain machines release ID` destroys one
    Machines {
        #[command(subcommand)]
        cmd: Option<MachinesCmd>,
        /// Print JSON for programs
        #[arg(long)]
        json: bool,
        /// Include released and failed machines
        #[arg(long)]
        all: bool,
    },
    /// Create a machine that runs a worker joining this brain (within the provider's quota);
    /// it is released after its idle timeout or time to live, or by `brain machines release`
    #[command(subcommand)]
    Provision(ProvisionCmd),
    /// Run a command on a worker, streaming its output; exits with its exit code
    /// (124 timed out, 75 worker lost or not connected, 125 could not run)
    Exec(ExecArgs),
    /// File operations in a worker's workspace
    #[command(subcommand)]
    File(FileCmd),
    /// Admin identities, and the HTTP API's tokens
    #[command(subcommand)]
    Admin(AdminCmd),
    /// The web page (`brain serve --web-listen ADDR`)
    #[command(subcommand)]
    Web(WebCmd),
    /// Run the whole thing on this machine: a temporary brain, two local workers, remote
    /// execution, a refused escape and a worker killed and brought back
    Demo {
        /// Keep the demo's temp dir (logs, store, workspaces) afterwards
        #[arg(long)]
        keep: bool,
        /// Run the agent on this model (e.g. anthropic:claude-sonnet-4-5, with its key in
        /// ANTHROPIC_API_KEY) instead of the recorded transcript
        #[arg(long)]
        model: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum MachinesCmd {
    /// Destroy a machine and revoke its worker
    Release { id: String },
}

#[derive(clap::Args)]
pub struct ProvisionOpts {
    /// Label key=value for the machine's worker (repeatable; used for placement)
    #[arg(long = "label", value_parser = shared::parse_label)]
    pub labels: Vec<(String, String)>,
    /// Worker name (default: the machine id)
    #[arg(long)]
    pub name: Option<String>,
    /// How long to wait for the worker to join ("0s": do not wait)
    #[arg(long, default_value = "2m", value_parser = shared::parse_duration)]
    pub wait: Duration,
    /// The URL the machine dials to reach this brain (default: provision.brain_url in the
    /// config, else this brain's listen address)
    #[arg(long)]
    pub brain_url: Option<String>,
    /// CPUs (docker: the container's limit; 0: the provider's default)
    #[arg(long, default_value_t = 0)]
    pub cpu: u32,
    /// Memory in GiB (docker: the container's limit, without swap; 0: the provider's default)
    #[arg(long, default_value_t = 0)]
    pub memory_gb: u32,
    /// Disk in GB (k8s: ephemeral storage; otherwise recorded with the machine)
    #[arg(long, default_value_t = 0)]
    pub disk_gb: u32,
    /// GPUs (k8s: the configured GPU resource; ec2: an instance type that has them)
    #[arg(long, default_value_t = 0)]
    pub gpu: u32,
    /// Print the machine as JSON (the fields of `brain machines --json`), and no progress
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum ProvisionCmd {
    /// A worker process on the brain's own machine
    Local(ProvisionOpts),
    /// A worker container on the local Docker engine ([provision.docker] names the image and
    /// network), with CPU, memory and pids limits, a read-only root and no capabilities
    Docker(ProvisionOpts),
    /// An EC2 instance ([provision.ec2]: ami, instance types, worker_url and its sha256) whose
    /// cloud-init installs the worker and joins; AWS credentials stay with the brain
    Ec2(ProvisionOpts),
    /// A worker Pod on a Kubernetes cluster ([provision.k8s]: kubeconfig or the pod's service
    /// account, namespace, image) with the request as its resources, a read-only root, no
    /// capabilities, and its join token in a Secret deleted once it has joined
    K8s(ProvisionOpts),
    /// A worker on a host reached over ssh (the brain's ssh config and agent apply; an
    /// unknown or changed host key is refused unless that config accepts it)
    Ssh {
        /// [USER@]HOST
        destination: String,
        /// ssh port (default: the ssh config's, or 22)
        #[arg(long, short)]
        port: Option<u16>,
        /// Private key file on the brain's machine (default: the ssh config's and the agent's)
        #[arg(long, short)]
        identity: Option<String>,
        #[command(flatten)]
        opts: ProvisionOpts,
    },
}

#[derive(Subcommand)]
pub enum StoreCmd {
    /// Copy this data dir's store (sled) into an empty PostgreSQL database for replicas
    /// (`--to`), or a PostgreSQL store into this data dir, which must have no store yet
    /// (`--from`). The brain must be stopped. Task records keep their numbers and times; the
    /// registry, credentials, sealed secrets, machines and the mirror's blobs go too, and the
    /// CA with them. Everything is read back and compared, record by record; the source is
    /// never changed. Replicas then need this data dir's secrets key (secrets.key, or
    /// TETHER_SECRET_KEY)
    #[command(group(clap::ArgGroup::new("way").required(true).args(["to", "from"])))]
    Copy {
        /// The PostgreSQL URL to copy into (postgres://USER:PASSWORD@HOST:PORT/DATABASE)
        #[arg(long)]
        to: Option<String>,
        /// The PostgreSQL URL to copy from
        #[arg(long)]
        from: Option<String>,
        /// Print what was copied as JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum SecretCmd {
    /// Store a secret, or replace one: the value is read from standard input (or --file),
    /// never from the command line
    Set {
        /// 1-64 characters of a-z, 0-9, '_', '-'
        name: String,
        /// A host it may be sent to: exact, or *.suffix for names under it (repeatable)
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// The port it may be sent to
        #[arg(long, default_value_t = 443)]
        port: u16,
        /// How it goes into a request: bearer (Authorization: Bearer), basic:USER (Basic
        /// auth with it as the password), header:NAME, query:NAME
        #[arg(long, default_value = "bearer")]
        inject: String,
        /// The environment variable commands find its placeholder in (default: NAME in
        /// capitals)
        #[arg(long)]
        env: Option<String>,
        /// Read the value from this file instead of standard input
        #[arg(long)]
        file: Option<PathBuf>,
        /// An LLM or cloud-provider key: held for the brain's own use, never resolved for
        /// a command
        #[arg(long)]
        provider: bool,
    },
    /// The secrets: names, tiers, hosts, how each is injected (never values)
    List {
        /// Print JSON for programs
        #[arg(long)]
        json: bool,
    },
    /// Remove a secret
    Rm { name: String },
}

#[derive(Subcommand)]
pub enum TokenCmd {
    /// Mint a one-time join token and print the `worker join` line to run
    Create {
        /// How long the token stays valid
        #[arg(long, default_value = "1h", value_parser = shared::parse_duration)]
        ttl: Duration,
        /// Label key=value given to the worker that joins with it (repeatable)
        #[arg(long = "label", value_parser = shared::parse_label)]
        labels: Vec<(String, String)>,
    },
}

/// `brain serve`'s flags.
#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on; a VPS uses 0.0.0.0:7443
    #[arg(long, default_value = "127.0.0.1:7443")]
    pub listen: SocketAddr,
    /// Mark a worker lost after this long without a message
    #[arg(long, default_value = "15s", value_parser = shared::parse_duration)]
    pub lost_after: Duration,
    /// Store a snapshot of a task's state every this many events
    #[arg(long, default_value_t = 100)]
    pub snapshot_every: u64,
    /// How long a task's call waits for its worker to come back before it counts as
    /// interrupted
    #[arg(long, default_value = "10m", value_parser = shared::parse_duration)]
    pub worker_wait: Duration,
    /// How long a task's worker may be gone before the task fails over to another
    /// connected worker (from its last barrier)
    #[arg(long, default_value = "30s", value_parser = shared::parse_duration)]
    pub failover_after: Duration,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Turn the network off for every command (a fresh network namespace on the worker)
    #[arg(long)]
    pub network_off: bool,
    /// Most bytes of files a task may keep in its workspace and temp dir together, e.g.
    /// 10GiB; checked at every barrier (after each call that can change files), and a
    /// task over it is stopped with the reason. Default: none
    #[arg(long, value_parser = shared::parse_bytes)]
    pub disk_quota: Option<u64>,
    /// Most files and directories a task may keep there (an inode quota). Default: none
    #[arg(long)]
    pub disk_files: Option<u64>,
    /// Confinement a worker must have before a task is placed on it, comma-separated
    /// (landlock, cgroup, mountns, proc, netns, egress, rlimits, user); see `worker doctor`
    #[arg(long, value_delimiter = ',')]
    pub require_sandbox: Vec<String>,
    /// The config file: LLM providers, models, prices and agent defaults (TOML; see
    /// ARCHITECTURE.md). Default: config.toml in the data dir; a missing file means
    /// every default
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Serve the HTTP API and the web page on this address (plain HTTP, loopback only,
    /// e.g. 127.0.0.1:7480; put a TLS reverse proxy in front to reach it from elsewhere).
    /// Log in with `brain web login`
    #[arg(long)]
    pub web_listen: Option<SocketAddr>,
    /// Keep the brain's state in this PostgreSQL database
    /// (postgres://USER:PASSWORD@HOST:PORT/DATABASE) instead of sled in the data dir, shared
    /// with any other `brain serve` on it: replicas, each driving the tasks it holds a lease
    /// on and taking over those of a replica that stops. Also `[store] url`. Every replica
    /// needs the same secrets key (`secrets.key` or $TETHER_SECRET_KEY)
    #[arg(long, env = "TETHER_STORE", hide_env_values = true)]
    pub store: Option<String>,
    /// The name this replica holds task leases under: unique among the replicas, the same
    /// across its restarts. Default: this host's name and the port it listens on
    #[arg(long, env = "TETHER_REPLICA")]
    pub replica: Option<String>,
}

#[derive(Subcommand)]
pub enum TaskCmd {
    /// A task's state: status, whether its result is verified by its acceptance check,
    /// budgets (`--json`: one object, stable field names)
    Show {
        task: String,
        #[arg(long)]
        json: bool,
    },
    /// A task's event log, at a glance: each command once with its output, bookkeeping
    /// folded away (`--full`: every record, nothing cut; `--json`: one JSON object per line,
    /// stable field names)
    Log {
        task: String,
        /// Only the call issued at this record (`#14`, as the log names it), whole
        #[arg(value_parser = parse_call)]
        call: Option<u64>,
        #[arg(long, conflicts_with = "full")]
        json: bool,
        /// Every record as it is, no output cut
        #[arg(long)]
        full: bool,
    },
    /// The request the task's model received at one of its turns, as its API was sent it:
    /// the system prompt, the messages and the tools (in text tool-call mode, as the prompt
    /// describes them). Rendered again from the log and checked against the version of the
    /// words and the hash logged when it was sent; one sent with other words says so.
    /// Secrets masked
    Prompt {
        task: String,
        /// The request the model answered with this step's call (steps as `task log`
        /// numbers them). Default: the task's last request
        #[arg(long, value_name = "STEP", conflicts_with = "seq")]
        at: Option<u32>,
        /// The request logged at this record (`task log --json`'s "seq"), or the last
        /// before it
        #[arg(long, value_name = "SEQ")]
        seq: Option<u64>,
        /// One JSON object: {"task", "seq", "turn", "model", "tools", "version",
        /// "sent_version", "hash", "sent_hash", "exact", "request"}
        #[arg(long)]
        json: bool,
    },
    /// Wait until a task reaches a status, following its log (no polling), and print it.
    /// Exits 0 when it does, 1 when the task ended in another status, 124 on --timeout
    Wait {
        task: String,
        /// The statuses to wait for, comma-separated (created, queued, running, waiting,
        /// budget_exhausted, finished, failed, cancelled, stuck, stalled). Default: the task
        /// has ended or stopped for its budget
        #[arg(long, value_delimiter = ',', value_parser = parse_status)]
        until: Vec<crate::model::Status>,
        /// Give up after this long (e.g. 10m). Default: wait as long as it takes
        #[arg(long, value_parser = humantime::parse_duration)]
        timeout: Option<Duration>,
        /// One JSON object: {"id", "status", "reason", "reached"}
        #[arg(long)]
        json: bool,
    },
    /// Cancel a task
    Cancel { task: String },
    /// Move a running task to another worker at its next tool-call boundary: the workspace
    /// goes along (only what the target lacks is sent) and the task carries on there
    Move {
        task: String,
        /// Worker id or unique name
        #[arg(long)]
        to: String,
        /// Wait this long for the move to complete (e.g. 2m), showing its progress; exits 1
        /// if it was aborted, 124 if it is still going on
        #[arg(long, value_parser = shared::parse_duration)]
        wait: Option<std::time::Duration>,
    },
    /// Continue a task stopped for budget, with more (added to what it has spent)
    Resume {
        task: String,
        #[command(flatten)]
        budget: BudgetArgs,
    },
    /// What the task changed: a unified diff from its starting workspace (the imported
    /// repository, or the first barrier of a --dir task) to its last barrier; `.git/` left out
    Diff {
        task: String,
        /// Only the files changed and how much (`git diff --stat`)
        #[arg(long)]
        stat: bool,
        /// The workspace at this barrier (its root hash, as `task log` shows) instead of the
        /// last one
        #[arg(long, value_name = "ROOT")]
        at: Option<String>,
    },
    /// What the task changed, as one commit in a mail `git am` applies (`brain task patch
    /// t-1 | git am` in a clone of the repository)
    Patch { task: String },
    /// Write the files of the task's last barrier into DIR (new or empty), `.git/` left out
    Export { task: String, dir: PathBuf },
    /// Deliver a --git task's last barrier as a git branch pushed with the brain's
    /// credentials: `tether/<task>` once it finished, `tether/<task>-wip` for any other task
    /// (failed, stuck, cancelled, out of budget), so work done is never lost. Delivering the
    /// same work again changes nothing
    Deliver {
        task: String,
        /// Open a pull request for the branch too (GitHub; the token [deliver]
        /// github_token_env names)
        #[arg(long)]
        pr: bool,
        #[arg(long)]
        json: bool,
    },
}

/// A task status by its name, as `brain tasks` shows it.
pub(super) fn parse_status(s: &str) -> Result<crate::model::Status, String> {
    serde_json::from_value(serde_json::Value::String(s.trim().to_string())).map_err(|_| {
        "not a task status: use created, queued, running, waiting, budget_exhausted, finished, failed, cancelled, stuck or stalled".to_string()
    })
}

pub use super::run_args::{BudgetArgs, RunArgs};

#[derive(Subcommand)]
pub enum ConfigCmd {
    /// Check a config file before the brain uses it: every setting, and whether the default
    /// model could be asked with the keys of this environment (exit 78 when the file is
    /// invalid)
    Check {
        /// The file (default: the data dir's config.toml)
        file: Option<PathBuf>,
    },
    /// The agent loop's assists (accommodations for small models): what each does, why,
    /// and which are on for MODEL (default: the default model) by the config file's
    /// [llm.models."MODEL"] assists, else by its tool mode (text: all; native: those that
    /// help any model). `brain run --assists` overrides it for a run
    Assists {
        /// The model spec, e.g. openai:qwen2.5-coder-1.5b
        model: Option<String>,
        /// The file (default: the data dir's config.toml)
        #[arg(long)]
        file: Option<PathBuf>,
        /// One JSON object: {"model", "assists": [{"name", "family", "changes",
        /// "native_default", "on", "what", "why"}]}
        #[arg(long)]
        json: bool,
    },
    /// Make the running brain read its config file again (as SIGHUP does): [llm] and [agent]
    /// apply to tasks that start from now on; a change elsewhere is named as needing a
    /// restart; an invalid file changes nothing (exit 78)
    Reload {
        /// One JSON object: {"file", "applied", "need_restart"}
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum WorkerCmd {
    /// Revoke a worker: its session is cut at once and its certificate refused from then on
    Revoke {
        /// Worker id or unique name
        worker: String,
    },
    /// Revoke a worker and forget it: its name is free for another, and the worker process,
    /// refused from then on, exits saying so
    Remove {
        /// Worker id or unique name
        worker: String,
    },
}

/// Resource limits for commands (0 or unset: the worker's defaults).
#[derive(Args, Clone, Default)]
pub struct LimitArgs {
    /// Memory limit per command, e.g. 2GiB
    #[arg(long, value_parser = shared::parse_bytes)]
    pub memory: Option<u64>,
    /// Most processes per command
    #[arg(long)]
    pub pids: Option<u32>,
    /// CPU share per command, in cores (e.g. 1.5)
    #[arg(long)]
    pub cpus: Option<f64>,
    /// CPU time per command, e.g. 10m
    #[arg(long, value_parser = shared::parse_duration)]
    pub cpu_time: Option<Duration>,
    /// Largest file a command may write, e.g. 1GiB
    #[arg(long, value_parser = shared::parse_bytes)]
    pub file_size: Option<u64>,
}

impl LimitArgs {
    pub fn to_proto(&self, network_off: bool) -> proto::Limits {
        proto::Limits {
            memory_bytes: self.memory.unwrap_or(0),
            pids: self.pids.unwrap_or(0),
            cpus: self.cpus.unwrap_or(0.0),
            file_size_bytes: self.file_size.unwrap_or(0),
            cpu_seconds: self.cpu_time.map(|d| d.as_secs().max(1)).unwrap_or(0),
            network_off,
        }
    }
}

#[derive(Args)]
pub struct ExecArgs {
    /// Worker id or unique name
    pub worker: String,
    /// Working directory, relative to the workspace root
    #[arg(long, default_value = "")]
    pub cwd: String,
    /// Kill the command's whole process group after this long
    #[arg(long, default_value = "10m", value_parser = shared::parse_duration)]
    pub timeout: Duration,
    /// Workspace name on the worker
    #[arg(long, default_value = "default")]
    pub workspace: String,
    /// Cap on combined output bytes; the rest is dropped and counted
    #[arg(long, default_value_t = shared::limits::DEFAULT_OUTPUT_CAP_BYTES)]
    pub output_cap: u64,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Run without network (a fresh network namespace)
    #[arg(long)]
    pub network_off: bool,
    /// The command and its arguments (after `--`)
    #[arg(last = true, required = true)]
    pub argv: Vec<String>,
}

#[derive(Subcommand)]
pub enum FileCmd {
    /// Print a file (or a byte range of it) to stdout
    Read {
        worker: String,
        path: String,
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Bytes to read; 0 reads up to the per-call limit
        #[arg(long, default_value_t = 0)]
        length: u64,
        #[arg(long, default_value = "default")]
        workspace: String,
    },
    /// Write stdin (or --from FILE) to a file, atomically
    Write {
        worker: String,
        path: String,
        #[arg(long)]
        from: Option<PathBuf>,
        /// Permission bits in octal
        #[arg(long, default_value = "644")]
        mode: String,
        /// Create missing parent directories
        #[arg(long, short = 'p')]
        parents: bool,
        #[arg(long, default_value = "default")]
        workspace: String,
    },
    /// List a directory
    Ls {
        worker: String,
        #[arg(default_value = "")]
        path: String,
        #[arg(long, default_value = "default")]
        workspace: String,
    },
    /// Show one entry
    Stat {
        worker: String,
        path: String,
        #[arg(long, default_value = "default")]
        workspace: String,
    },
    /// Files matching a glob (.gitignore-aware), e.g. `'*.rs'` or `'src/**/*.py'`
    Find {
        worker: String,
        #[arg(default_value = "")]
        glob: String,
        #[arg(long, default_value = "default")]
        workspace: String,
    },
    /// Lines matching a regular expression (.gitignore-aware)
    Search {
        worker: String,
        pattern: String,
        /// Only files matching this glob
        #[arg(long, default_value = "")]
        glob: String,
        #[arg(long, default_value = "default")]
        workspace: String,
    },
    /// Remove a file or directory
    Rm {
        worker: String,
        path: String,
        #[arg(long, short = 'r')]
        recursive: bool,
        #[arg(long, default_value = "default")]
        workspace: String,
    },
}

#[derive(Subcommand)]
pub enum AdminCmd {
    /// Issue another admin identity into DIR (for driving this brain from another machine)
    Issue {
        name: String,
        #[arg(long)]
        out: PathBuf,
    },
    /// Withdraw an admin identity
    Revoke { name: String },
    /// Bearer tokens for the HTTP API (programs without a certificate)
    #[command(subcommand)]
    Token(ApiTokenCmd),
}

#[derive(Subcommand)]
pub enum ApiTokenCmd {
    /// Create a token and print it (once: the brain keeps only its hash)
    Create {
        /// Who or what it is for (1-64 characters of [A-Za-z0-9._-])
        #[arg(long)]
        name: String,
        /// viewer reads; operator also approves, denies, moves, cancels, delivers, provisions
        #[arg(long, default_value = "viewer")]
        role: String,
        /// How long it works
        #[arg(long, default_value = "30d", value_parser = shared::parse_duration)]
        ttl: Duration,
        #[arg(long)]
        json: bool,
    },
    /// Tokens and browser sessions (never their secrets)
    List {
        /// Include expired and revoked ones
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token or session by id, or every one of a name
    Revoke { id: String },
}

#[derive(Subcommand)]
pub enum WebCmd {
    /// Print a one-time link that logs a browser in (it works once, within 10 minutes)
    Login {
        /// The name the session acts as (shown in approvals and logs)
        #[arg(long, default_value = "admin")]
        name: String,
        /// viewer or operator
        #[arg(long, default_value = "operator")]
        role: String,
        /// How long the session lasts
        #[arg(long, default_value = "12h", value_parser = shared::parse_duration)]
        ttl: Duration,
        #[arg(long)]
        json: bool,
    },
}

/// A call as the log names it: `#14` (or `14`), the record that issued it.
fn parse_call(s: &str) -> Result<u64, String> {
    s.trim_start_matches('#')
        .parse()
        .map_err(|_| format!("{s:?} is not a call: give it as the log shows it, e.g. #14"))
}
