//! The `brain` command line's flags and subcommands (clap), with the checks and conversions
//! of their values.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
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
    },
    /// Run the brain until SIGTERM or Ctrl-C
    Serve {
        /// Address to listen on; a VPS uses 0.0.0.0:7443
        #[arg(long, default_value = "127.0.0.1:7443")]
        listen: SocketAddr,
        /// Mark a worker lost after this long without a message
        #[arg(long, default_value = "15s", value_parser = shared::parse_duration)]
        lost_after: Duration,
        /// Store a snapshot of a task's state every this many events
        #[arg(long, default_value_t = 100)]
        snapshot_every: u64,
        /// How long a task's call waits for its worker to come back before it counts as
        /// interrupted
        #[arg(long, default_value = "10m", value_parser = shared::parse_duration)]
        worker_wait: Duration,
        /// How long a task's worker may be gone before the task fails over to another
        /// connected worker (from its last barrier)
        #[arg(long, default_value = "30s", value_parser = shared::parse_duration)]
        failover_after: Duration,
        #[command(flatten)]
        limits: LimitArgs,
        /// Turn the network off for every command (a fresh network namespace on the worker)
        #[arg(long)]
        network_off: bool,
        /// Most bytes of files a task may keep in its workspace and temp dir together, e.g.
        /// 10GiB; checked at every barrier (after each call that can change files), and a
        /// task over it is stopped with the reason. Default: none
        #[arg(long, value_parser = shared::parse_bytes)]
        disk_quota: Option<u64>,
        /// Most files and directories a task may keep there (an inode quota). Default: none
        #[arg(long)]
        disk_files: Option<u64>,
        /// Confinement a worker must have before a task is placed on it, comma-separated
        /// (landlock, cgroup, mountns, proc, netns, egress, rlimits, user); see `worker doctor`
        #[arg(long, value_delimiter = ',')]
        require_sandbox: Vec<String>,
        /// The config file: LLM providers, models, prices and agent defaults (TOML; see
        /// ARCHITECTURE.md). Default: config.toml in the data dir; a missing file means
        /// every default
        #[arg(long)]
        config: Option<PathBuf>,
        /// Serve the HTTP API and the web page on this address (plain HTTP, loopback only,
        /// e.g. 127.0.0.1:7480; put a TLS reverse proxy in front to reach it from elsewhere).
        /// Log in with `brain web login`
        #[arg(long)]
        web_listen: Option<SocketAddr>,
    },
    /// Start an agent task toward GOAL on a worker and follow it live: steps, tool calls and
    /// their output, approvals asked, tokens and cost. Ctrl-C detaches; the task goes on.
    /// With --plan FILE, run a scripted plan instead (JSON: {"steps":[{"run":[...],"check":[...]},{"write":{"path":...,"content":...}}]})
    Run(RunArgs),
    /// Approve the call a task waits on
    Approve { task: String },
    /// Deny the call a task waits on; the agent is told why
    Deny {
        task: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// List tasks; CHECK says `verified`, `unverified` (finished without a check), `failing`
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
        #[arg(long)]
        json: bool,
    },
    /// Write a backup of the running brain's whole store to FILE (JSON lines)
    Backup { file: PathBuf },
    /// Restore the store from a backup FILE; the brain must be stopped. The current store is
    /// moved aside, not deleted
    Restore { file: PathBuf },
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

#[derive(Subcommand)]
pub enum TaskCmd {
    /// A task's state: status, whether its result is verified by its acceptance check,
    /// budgets (`--json`: one object, stable field names)
    Show {
        task: String,
        #[arg(long)]
        json: bool,
    },
    /// A task's event log (`--json`: one JSON object per line, stable field names)
    Log {
        task: String,
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

/// Budgets of an agent task (unset: the config file's defaults).
#[derive(Args, Clone, Default)]
pub struct BudgetArgs {
    /// Money budget in USD
    #[arg(long)]
    pub budget_usd: Option<f64>,
    /// Token budget (prompt + completion)
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// Most LLM calls
    #[arg(long)]
    pub max_steps: Option<u32>,
    /// Wall time, e.g. 30m
    #[arg(long, value_parser = shared::parse_duration)]
    pub max_wall: Option<Duration>,
}

impl BudgetArgs {
    pub fn to_proto(&self) -> anyhow::Result<proto::Budget> {
        if let Some(u) = self.budget_usd
            && !(u.is_finite() && u > 0.0)
        {
            bail!("--budget-usd must be a positive number of dollars, not {u}");
        }
        Ok(proto::Budget {
            usd: self.budget_usd.unwrap_or(0.0),
            tokens: self.max_tokens.unwrap_or(0),
            steps: self.max_steps.unwrap_or(0),
            wall_ms: self.max_wall.map_or(0, |d| d.as_millis() as u64),
        })
    }
}

#[derive(Args)]
pub struct RunArgs {
    /// What the agent should achieve
    pub goal: Option<String>,
    /// Worker id or unique name (default: any connected worker)
    #[arg(long)]
    pub worker: Option<String>,
    /// The model: openai:gpt-4.1, anthropic:claude-sonnet-4-5, ollama:qwen2.5-coder, or
    /// replay:FILE to replay a recorded transcript without an API key (default: the config's)
    #[arg(long)]
    pub model: Option<String>,
    /// read-only, ask (every change waits for `brain approve`), auto (the config's
    /// allow-lists run, the rest asks) or full (default: the config's)
    #[arg(long)]
    pub permission: Option<String>,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Write the model's answers to FILE as a transcript that `--model replay:FILE` replays
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Print the task id and return instead of following the task
    #[arg(long)]
    pub detach: bool,
    /// The acceptance check: a shell command run in the workspace when the model calls
    /// `finish` (exit 0: done, the task ends verified; otherwise the model sees why and goes
    /// on). Default: the repository's `.tether/check`, else `[agent] check` in the config
    #[arg(long)]
    pub check: Option<String>,
    /// How long one run of the check may take
    #[arg(long, value_parser = shared::parse_duration)]
    pub check_timeout: Option<std::time::Duration>,
    /// Files the check relies on (a glob, repeatable, e.g. `test_*.py`): the model may not
    /// change them with its file tools, and they are put back as the task started before
    /// every run of the check
    #[arg(long = "protect")]
    pub protect: Vec<String>,
    /// A secret (by name, see `brain secret list`) the task's commands may use: they get
    /// its placeholder in its environment variable, and requests to the hosts it is bound
    /// to get the value put in by the brain on the way out (repeatable). Puts the commands
    /// behind the egress proxy
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// Let the task's commands reach this host besides its secrets' hosts (repeatable):
    /// `HOST[:PORT[,PORT]]` directly, `HOST[:PORTS] GET,HEAD` with only those methods (seen
    /// through the brain), `pass:HOST` never intercepted (pinned certificates). `*.suffix`
    /// matches names under it. Puts the commands behind the egress proxy
    #[arg(long = "allow", value_name = "RULE")]
    pub allow: Vec<String>,
    /// The allow-list preset: `none`, `registries` (the common package registries) or
    /// `all` (any host, still through the proxy). Default: `[egress] preset` in the config
    /// (none). Puts the commands behind the egress proxy
    #[arg(long, value_parser = ["none", "registries", "all"])]
    pub egress: Option<String>,
    /// Start from this git repository: the brain clones it (shallow) with its own
    /// credentials and the worker gets the files, never the credentials
    #[arg(long)]
    pub git: Option<String>,
    /// Branch or tag of --git
    #[arg(long, requires = "git")]
    pub git_ref: Option<String>,
    /// How a --git task's result is delivered when it finishes: `branch` pushes a commit
    /// as branch tether/<task> to the repository, `pr` opens a pull request for it too, `none`
    /// leaves it to `brain task diff|patch|export|deliver`. Default: [deliver] mode in the
    /// config (none). Followed, `brain run` waits for the delivery and exits 1 if it failed
    #[arg(long, requires = "git", value_parser = ["branch", "pr", "none"])]
    pub deliver: Option<String>,
    /// Start from a copy of this directory on the task's worker, named with --worker (the
    /// laptop case; a relative path is taken from here, for a worker on this machine). Only
    /// what the brain lacks is sent; the agent works on the copy
    #[arg(long, conflicts_with = "git")]
    pub dir: Option<PathBuf>,
    /// Sync the workspace's .git/ too (left out by default)
    #[arg(long)]
    pub include_git: bool,
    /// Also leave this file or directory name out of the workspace's sync, wherever it is
    /// (besides .gitignore and the defaults target, node_modules, .venv, __pycache__)
    #[arg(long = "exclude", value_name = "NAME")]
    pub excludes: Vec<String>,
    /// Do not leave out the default build outputs (target, node_modules, .venv, __pycache__)
    #[arg(long)]
    pub no_default_excludes: bool,
    /// A label (k=v) the task's worker must have, now and when the task moves or fails over;
    /// repeatable
    #[arg(long = "require-label", value_name = "K=V", value_parser = shared::parse_label)]
    pub require_labels: Vec<(String, String)>,
    /// Run a scripted plan from this JSON file instead of the agent. Its commands run under
    /// --secret, --allow and --egress as an agent's do; the agent's own flags (--model,
    /// budgets, --check, --git, --dir, --deliver, ...) are refused with it
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// The goal (same as GOAL; for scripted plans, shown in `brain tasks`)
    #[arg(long = "goal", hide = true)]
    pub goal_flag: Option<String>,
    /// Run N attempts from the same base, each a task of its own on a worker of its own
    /// where there are enough, and let the check pick the winner; the task's result is the
    /// winner's. Default: [agent] attempts in the config (1)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=16))]
    pub attempts: Option<u32>,
    /// Which verified attempt wins: `first` (the others are stopped) or `smallest` (all run
    /// to their end; the fewest changed lines wins)
    #[arg(long, value_parser = ["first", "smallest"])]
    pub pick: Option<String>,
    /// A model for the attempts after the first, in turn with --model; repeatable
    #[arg(long = "attempt-model", value_name = "MODEL")]
    pub attempt_models: Vec<String>,
    /// The sampling temperature of the attempts after the first. Default: [agent]
    /// attempt_temperature in the config (0.9)
    #[arg(long, value_name = "T")]
    pub attempt_temperature: Option<f32>,
    /// When no attempt passes the check, one more attempt on this model, told how the check
    /// ended on the others; repeatable, tried in order (cheap local models first)
    #[arg(long = "escalate-model", value_name = "MODEL")]
    pub escalate_models: Vec<String>,
}

/// A task status by its name, as `brain tasks` shows it.
fn parse_status(s: &str) -> Result<crate::model::Status, String> {
    serde_json::from_value(serde_json::Value::String(s.trim().to_string())).map_err(|_| {
        "not a task status: use created, queued, running, waiting, budget_exhausted, finished, failed, cancelled, stuck or stalled".to_string()
    })
}

/// Why the agent's flags do not apply to a scripted plan, and what to do instead.
const NO_MODEL: &str = "a plan runs no model; drop it (the plan's steps are the whole task)";
const NO_BUDGET: &str = "a plan spends no tokens or model steps; drop it and bound each step with its \"timeout\" in the plan (default 10m)";
const NO_CHECK: &str = "a plan has no acceptance check; make the check the plan's last step (a \"run\" step that fails fails the task), or give a step its own \"check\"";
const NO_SOURCE: &str = "a plan starts from an empty workspace; drop it and write the files the plan needs with \"write\" steps, or run an agent task with it";
const NO_ATTEMPTS: &str =
    "a plan runs its steps once, the same each time; attempts are for the agent (drop it)";
const NO_DELIVERY: &str = "a plan is not delivered (it takes no --git); drop it and get the result with `brain task patch` or `brain task export`";

impl RunArgs {
    /// The flags given that a scripted plan (`--plan`) cannot honour, each with why and
    /// what to do instead. The egress flags (`--secret`, `--allow`, `--egress`), `--worker`,
    /// `--require-label`, `--goal` and `--detach` apply to plans too.
    pub fn not_for_plans(&self) -> Vec<(&'static str, &'static str)> {
        let b = &self.budget;
        [
            ("--model", self.model.is_some(), NO_MODEL),
            ("--permission", self.permission.is_some(), NO_MODEL),
            ("--record", self.record.is_some(), NO_MODEL),
            ("--budget-usd", b.budget_usd.is_some(), NO_BUDGET),
            ("--max-tokens", b.max_tokens.is_some(), NO_BUDGET),
            ("--max-steps", b.max_steps.is_some(), NO_BUDGET),
            ("--max-wall", b.max_wall.is_some(), NO_BUDGET),
            ("--check", self.check.is_some(), NO_CHECK),
            ("--check-timeout", self.check_timeout.is_some(), NO_CHECK),
            ("--protect", !self.protect.is_empty(), NO_CHECK),
            ("--git", self.git.is_some(), NO_SOURCE),
            ("--git-ref", self.git_ref.is_some(), NO_SOURCE),
            ("--dir", self.dir.is_some(), NO_SOURCE),
            ("--include-git", self.include_git, NO_SOURCE),
            ("--exclude", !self.excludes.is_empty(), NO_SOURCE),
            ("--no-default-excludes", self.no_default_excludes, NO_SOURCE),
            ("--deliver", self.deliver.is_some(), NO_DELIVERY),
            ("--attempts", self.attempts.is_some(), NO_ATTEMPTS),
            ("--pick", self.pick.is_some(), NO_ATTEMPTS),
            (
                "--attempt-model",
                !self.attempt_models.is_empty(),
                NO_ATTEMPTS,
            ),
            (
                "--attempt-temperature",
                self.attempt_temperature.is_some(),
                NO_ATTEMPTS,
            ),
            (
                "--escalate-model",
                !self.escalate_models.is_empty(),
                NO_ATTEMPTS,
            ),
        ]
        .into_iter()
        .filter(|(_, given, _)| *given)
        .map(|(flag, _, why)| (flag, why))
        .collect()
    }
}

#[derive(Subcommand)]
pub enum WorkerCmd {
    /// Revoke a worker: its session is cut at once and its certificate refused from then on
    Revoke {
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
