//! The `brain` command line: `init` and `serve` act on the data dir; every other command is
//! an admin client that talks to the running brain over mutual TLS.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use proto::{FileCall, exec_event, file_call, file_response};
use shared::exit::ExitCode;
use shared::pki::{self, IdentityFiles};
use tokio_util::sync::CancellationToken;

use crate::ca::{self, DataDir};
use crate::client::Target;

/// Exit statuses of `brain exec` beside the command's own.
const EXIT_TIMEOUT: i32 = ExitCode::TimedOut.code();
const EXIT_TETHER_ERROR: i32 = ExitCode::Tether.code();
const EXIT_WORKER_LOST: i32 = ExitCode::WorkerLost.code();

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
    data: Option<PathBuf>,
    /// Brain to talk to for admin commands (default: the address `brain serve` wrote in the data dir)
    #[arg(long, global = true, env = "TETHER_BRAIN")]
    brain: Option<String>,
    /// Admin identity dir (ca.pem, cert.pem, key.pem; default: the data dir's admin identity)
    #[arg(long, global = true, env = "TETHER_IDENTITY")]
    identity: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
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
        /// Confinement a worker must have before a task is placed on it, comma-separated
        /// (landlock, cgroup, netns, rlimits, user); see `worker doctor`
        #[arg(long, value_delimiter = ',')]
        require_sandbox: Vec<String>,
        /// The config file: LLM providers, models, prices and agent defaults (TOML; see
        /// ARCHITECTURE.md). Default: config.toml in the data dir; a missing file means
        /// every default
        #[arg(long)]
        config: Option<PathBuf>,
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
    /// List tasks
    Tasks,
    /// Act on one task
    #[command(subcommand)]
    Task(TaskCmd),
    /// Follow a task's events live until it ends (Ctrl-C detaches; it never cancels)
    Watch { task: String },
    /// Write a backup of the running brain's whole store to FILE (JSON lines)
    Backup { file: PathBuf },
    /// Restore the store from a backup FILE; the brain must be stopped. The current store is
    /// moved aside, not deleted
    Restore { file: PathBuf },
    /// Join tokens
    #[command(subcommand)]
    Token(TokenCmd),
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
    /// Admin identities
    #[command(subcommand)]
    Admin(AdminCmd),
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
enum MachinesCmd {
    /// Destroy a machine and revoke its worker
    Release { id: String },
}

#[derive(clap::Args)]
struct ProvisionOpts {
    /// Label key=value for the machine's worker (repeatable; used for placement)
    #[arg(long = "label", value_parser = shared::parse_label)]
    labels: Vec<(String, String)>,
    /// Worker name (default: the machine id)
    #[arg(long)]
    name: Option<String>,
    /// How long to wait for the worker to join ("0s": do not wait)
    #[arg(long, default_value = "2m", value_parser = shared::parse_duration)]
    wait: Duration,
    /// The URL the machine dials to reach this brain (default: provision.brain_url in the
    /// config, else this brain's listen address)
    #[arg(long)]
    brain_url: Option<String>,
    /// CPUs (docker: the container's limit; 0: the provider's default)
    #[arg(long, default_value_t = 0)]
    cpu: u32,
    /// Memory in GiB (docker: the container's limit, without swap; 0: the provider's default)
    #[arg(long, default_value_t = 0)]
    memory_gb: u32,
    /// Disk in GB (recorded with the machine)
    #[arg(long, default_value_t = 0)]
    disk_gb: u32,
}

#[derive(Subcommand)]
enum ProvisionCmd {
    /// A worker process on the brain's own machine
    Local(ProvisionOpts),
    /// A worker container on the local Docker engine ([provision.docker] names the image and
    /// network), with CPU, memory and pids limits, a read-only root and no capabilities
    Docker(ProvisionOpts),
    /// An EC2 instance ([provision.ec2]: ami, instance types, worker_url and its sha256) whose
    /// cloud-init installs the worker and joins; AWS credentials stay with the brain
    Ec2(ProvisionOpts),
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
enum TokenCmd {
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
enum TaskCmd {
    /// A task's state
    Show { task: String },
    /// A task's event log (`--json`: one JSON object per line, stable field names)
    Log {
        task: String,
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
    },
    /// Continue a task stopped for budget, with more (added to what it has spent)
    Resume {
        task: String,
        #[command(flatten)]
        budget: BudgetArgs,
    },
}

/// Budgets of an agent task (unset: the config file's defaults).
#[derive(Args, Clone, Default)]
struct BudgetArgs {
    /// Money budget in USD
    #[arg(long)]
    budget_usd: Option<f64>,
    /// Token budget (prompt + completion)
    #[arg(long)]
    max_tokens: Option<u64>,
    /// Most LLM calls
    #[arg(long)]
    max_steps: Option<u32>,
    /// Wall time, e.g. 30m
    #[arg(long, value_parser = shared::parse_duration)]
    max_wall: Option<Duration>,
}

impl BudgetArgs {
    fn to_proto(&self) -> anyhow::Result<proto::Budget> {
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
struct RunArgs {
    /// What the agent should achieve
    goal: Option<String>,
    /// Worker id or unique name (default: any connected worker)
    #[arg(long)]
    worker: Option<String>,
    /// The model: openai:gpt-4.1, anthropic:claude-sonnet-4-5, ollama:qwen2.5-coder, or
    /// replay:FILE to replay a recorded transcript without an API key (default: the config's)
    #[arg(long)]
    model: Option<String>,
    /// read-only, ask (every change waits for `brain approve`), auto (the config's
    /// allow-lists run, the rest asks) or full (default: the config's)
    #[arg(long)]
    permission: Option<String>,
    #[command(flatten)]
    budget: BudgetArgs,
    /// Write the model's answers to FILE as a transcript that `--model replay:FILE` replays
    #[arg(long)]
    record: Option<PathBuf>,
    /// Print the task id and return instead of following the task
    #[arg(long)]
    detach: bool,
    /// Start from this git repository: the brain clones it (shallow) with its own
    /// credentials and the worker gets the files, never the credentials
    #[arg(long)]
    git: Option<String>,
    /// Branch or tag of --git
    #[arg(long, requires = "git")]
    git_ref: Option<String>,
    /// Start from a copy of this directory on the task's worker (the laptop case; a relative
    /// path is taken from here, for a worker on this machine). Only what the brain lacks is
    /// sent; the agent works on the copy
    #[arg(long, conflicts_with = "git")]
    dir: Option<PathBuf>,
    /// Sync the workspace's .git/ too (left out by default)
    #[arg(long)]
    include_git: bool,
    /// Also leave this file or directory name out of the workspace's sync, wherever it is
    /// (besides .gitignore and the defaults target, node_modules, .venv, __pycache__)
    #[arg(long = "exclude", value_name = "NAME")]
    excludes: Vec<String>,
    /// Do not leave out the default build outputs (target, node_modules, .venv, __pycache__)
    #[arg(long)]
    no_default_excludes: bool,
    /// A label (k=v) the task's worker must have, now and when the task moves or fails over;
    /// repeatable
    #[arg(long = "require-label", value_name = "K=V", value_parser = shared::parse_label)]
    require_labels: Vec<(String, String)>,
    /// Run a scripted plan from this JSON file instead of the agent
    #[arg(long)]
    plan: Option<PathBuf>,
    /// The goal (same as GOAL; for scripted plans, shown in `brain tasks`)
    #[arg(long = "goal", hide = true)]
    goal_flag: Option<String>,
}

#[derive(Subcommand)]
enum WorkerCmd {
    /// Revoke a worker: its session is cut at once and its certificate refused from then on
    Revoke {
        /// Worker id or unique name
        worker: String,
    },
}

/// Resource limits for commands (0 or unset: the worker's defaults).
#[derive(Args, Clone, Default)]
struct LimitArgs {
    /// Memory limit per command, e.g. 2GiB
    #[arg(long, value_parser = shared::parse_bytes)]
    memory: Option<u64>,
    /// Most processes per command
    #[arg(long)]
    pids: Option<u32>,
    /// CPU share per command, in cores (e.g. 1.5)
    #[arg(long)]
    cpus: Option<f64>,
    /// CPU time per command, e.g. 10m
    #[arg(long, value_parser = shared::parse_duration)]
    cpu_time: Option<Duration>,
    /// Largest file a command may write, e.g. 1GiB
    #[arg(long, value_parser = shared::parse_bytes)]
    file_size: Option<u64>,
}

impl LimitArgs {
    fn to_proto(&self, network_off: bool) -> proto::Limits {
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
struct ExecArgs {
    /// Worker id or unique name
    worker: String,
    /// Working directory, relative to the workspace root
    #[arg(long, default_value = "")]
    cwd: String,
    /// Kill the command's whole process group after this long
    #[arg(long, default_value = "10m", value_parser = shared::parse_duration)]
    timeout: Duration,
    /// Workspace name on the worker
    #[arg(long, default_value = "default")]
    workspace: String,
    /// Cap on combined output bytes; the rest is dropped and counted
    #[arg(long, default_value_t = shared::limits::DEFAULT_OUTPUT_CAP_BYTES)]
    output_cap: u64,
    #[command(flatten)]
    limits: LimitArgs,
    /// Run without network (a fresh network namespace)
    #[arg(long)]
    network_off: bool,
    /// The command and its arguments (after `--`)
    #[arg(last = true, required = true)]
    argv: Vec<String>,
}

#[derive(Subcommand)]
enum FileCmd {
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
enum AdminCmd {
    /// Issue another admin identity into DIR (for driving this brain from another machine)
    Issue {
        name: String,
        #[arg(long)]
        out: PathBuf,
    },
    /// Withdraw an admin identity
    Revoke { name: String },
}

/// The brain's async runtime (two threads); says why on stderr if it cannot start.
fn runtime() -> Option<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| eprintln!("error: cannot start the async runtime: {e}"))
        .ok()
}

/// Parses `args` (including the program name), runs the command and returns the exit status.
pub fn main_with<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    shared::telemetry::init("info");
    let cli = Cli::parse_from(args);
    let Some(rt) = runtime() else {
        return 1;
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit_code(&e)
        }
    }
}

/// The exit status for an error that reached the top: [`ExitCode::Config`] (78) for a
/// configuration problem that running again will not fix (an unreadable or invalid config
/// file, no CA in the data dir, missing or malformed key material or admin identity, a
/// malformed brain URL), 1 otherwise. The systemd units in deploy/ do not restart the brain
/// on 78.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    use shared::exit::{by, classify};
    classify(
        e,
        &[
            by::<crate::config::Error>,
            by::<ca::Error>,
            by::<crate::serve::Error>,
            by::<crate::client::Error>,
        ],
    )
    .code()
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let data = DataDir(
        cli.data
            .clone()
            .unwrap_or_else(|| shared::dirs::data_dir("tether", "TETHER_DATA")),
    );
    let target = Target::resolve(&data, cli.brain.clone(), cli.identity.clone());
    match cli.cmd {
        Cmd::Init { hosts, force } => {
            let out = ca::init(&data, &hosts, force)?;
            println!("initialised {}", data.path().display());
            println!("CA hash: {}", out.ca_hash);
            println!("next: brain serve --data {}", data.path().display());
            Ok(0)
        }
        Cmd::Serve {
            listen,
            lost_after,
            snapshot_every,
            worker_wait,
            failover_after,
            limits,
            network_off,
            require_sandbox,
            config,
        } => {
            let config_path = config.unwrap_or_else(|| data.path().join("config.toml"));
            let config = std::sync::Arc::new(crate::config::Config::load(&config_path)?);
            let ready = crate::serve::prepare(crate::serve::Options {
                data: data.clone(),
                listen,
                lost_after,
                tasks: crate::tasks::manager::Options {
                    snapshot_every: snapshot_every.max(1),
                    worker_wait,
                    limits: limits.to_proto(network_off),
                    llm: std::sync::Arc::new(config.llm.clone()),
                    failover_after,
                },
                require_sandbox,
                config,
            })
            .await?;
            tracing::info!(addr = %ready.addr, data = %data.path().display(), "brain listening on {}", ready.addr);
            let stop = CancellationToken::new();
            spawn_signal_handler(stop.clone());
            ready.run(stop.cancelled_owned()).await?;
            tracing::info!("brain stopped");
            Ok(0)
        }
        Cmd::Token(TokenCmd::Create { ttl, labels }) => {
            let mut c = target.connect().await?;
            let resp = c
                .create_token(proto::CreateTokenRequest {
                    ttl_seconds: ttl.as_secs().max(1),
                    labels: labels.into_iter().collect(),
                })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            println!("{}", resp.token);
            eprintln!(
                "one-time token, valid for {}; on the worker machine run:",
                humantime::format_duration(ttl)
            );
            eprintln!(
                "  worker join --brain {} --token {} --ca-hash {}",
                target.url, resp.token, resp.ca_hash
            );
            Ok(0)
        }
        Cmd::Workers { json } => {
            let mut c = target.connect().await?;
            let list = c
                .list_workers(proto::ListWorkersRequest {})
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            print_workers(&list.workers, json);
            Ok(0)
        }
        Cmd::Machines {
            cmd: Some(MachinesCmd::Release { id }),
            ..
        } => {
            let mut c = target.connect().await?;
            let m = c
                .release_machine(proto::ReleaseMachineRequest { id })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner()
                .machine
                .unwrap_or_default();
            println!(
                "released {} ({}, cost ${:.4}); its worker {} is revoked",
                m.id,
                m.provider,
                m.cost_usd,
                if m.worker_id.is_empty() {
                    "(none joined)"
                } else {
                    &m.worker_id
                }
            );
            Ok(0)
        }
        Cmd::Machines {
            cmd: None,
            json,
            all,
        } => {
            let mut c = target.connect().await?;
            let list = c
                .list_machines(proto::ListMachinesRequest { all })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            print_machines(&list.machines, json);
            Ok(0)
        }
        Cmd::Provision(p) => provision(&target, p).await,
        Cmd::Worker(WorkerCmd::Revoke { worker }) => {
            let mut c = target.connect().await?;
            let r = c
                .revoke_worker(proto::RevokeWorkerRequest { worker })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            println!(
                "revoked {}{}",
                r.worker_id,
                if r.session_closed {
                    " (open session closed)"
                } else {
                    ""
                }
            );
            Ok(0)
        }
        Cmd::Exec(args) => Ok(exec(&target, args).await),
        Cmd::Run(args) => run_task(&target, args).await,
        Cmd::Approve { task } => decide(&target, &task, true, String::new()).await,
        Cmd::Deny { task, reason } => decide(&target, &task, false, reason).await,
        Cmd::Task(TaskCmd::Move { task, to }) => {
            let mut c = target.connect().await?;
            let r = c
                .move_task(proto::MoveTaskRequest {
                    task_id: task.clone(),
                    to,
                })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            println!(
                "{task} will move to {} at its next tool-call boundary (brain watch {task} shows it)",
                r.to
            );
            Ok(0)
        }
        Cmd::Task(TaskCmd::Resume { task, budget }) => {
            let budget = budget.to_proto()?;
            if budget == proto::Budget::default() {
                bail!("say how much more: --budget-usd, --max-tokens, --max-steps or --max-wall");
            }
            let mut c = target.connect().await?;
            c.resume_task(proto::ResumeTaskRequest {
                task_id: task.clone(),
                budget: Some(budget),
            })
            .await
            .map_err(|s| status(s, &target.url))?;
            eprintln!("{task} resumed; following it (Ctrl-C detaches)");
            follow(&target, &task, true, false).await?;
            Ok(0)
        }
        Cmd::Tasks => {
            let mut c = target.connect().await?;
            let list = c
                .list_tasks(proto::ListTasksRequest {})
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            println!(
                "{:<10} {:<10} {:>9}  {:<16} {:<30} REASON",
                "ID", "STATUS", "STEPS", "WORKER", "GOAL"
            );
            for t in list.tasks {
                println!(
                    "{:<10} {:<10} {:>4}/{:<4}  {:<16} {:<30} {}",
                    t.id,
                    t.status,
                    t.steps_done,
                    t.steps_total,
                    t.worker,
                    t.goal.chars().take(30).collect::<String>(),
                    t.reason
                );
            }
            Ok(0)
        }
        Cmd::Task(TaskCmd::Show { task }) => {
            let mut c = target.connect().await?;
            let list = c
                .list_tasks(proto::ListTasksRequest {})
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            let id: crate::tasks::TaskId = task.parse().map_err(|e: String| anyhow::anyhow!(e))?;
            let t = list
                .tasks
                .into_iter()
                .find(|t| t.id == id.to_string())
                .ok_or_else(|| anyhow::anyhow!("no task {task}: see `brain tasks`"))?;
            println!(
                "id:      {}\nstatus:  {}\ngoal:    {}\nworker:  {}\nsteps:   {}/{}\nreason:  {}",
                t.id, t.status, t.goal, t.worker, t.steps_done, t.steps_total, t.reason
            );
            if !t.model.is_empty() {
                let l = t.limits.unwrap_or_default();
                let limit = |v: String, set: bool| if set { v } else { "no limit".into() };
                println!(
                    "model:   {} (permission {})\ntokens:  {} of {}\ncost:    ${:.4} of {}\nwall:    {}",
                    t.model,
                    t.permission,
                    t.tokens,
                    limit(l.tokens.to_string(), l.tokens > 0),
                    t.spent_usd,
                    limit(format!("${:.4}", l.usd), l.usd > 0.0),
                    limit(
                        humantime::format_duration(Duration::from_millis(l.wall_ms)).to_string(),
                        l.wall_ms > 0
                    ),
                );
            }
            Ok(0)
        }
        Cmd::Task(TaskCmd::Log { task, json }) => {
            follow(&target, &task, false, json).await?;
            Ok(0)
        }
        Cmd::Watch { task } => {
            follow(&target, &task, true, false).await?;
            Ok(0)
        }
        Cmd::Task(TaskCmd::Cancel { task }) => {
            let mut c = target.connect().await?;
            c.cancel_task(proto::CancelTaskRequest {
                task_id: task.clone(),
            })
            .await
            .map_err(|s| status(s, &target.url))?;
            println!("cancel requested for {task}");
            Ok(0)
        }
        Cmd::Backup { file } => {
            let mut c = target.connect().await?;
            let mut stream = c
                .backup(proto::BackupRequest {})
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            let mut chunks = Vec::new();
            while let Some(chunk) = stream.message().await.map_err(|s| status(s, &target.url))? {
                chunks.push(chunk.data);
            }
            crate::backup::save(&file, &chunks)
                .with_context(|| format!("writing {}", file.display()))?;
            let lines: usize = chunks
                .iter()
                .map(|c| c.iter().filter(|b| **b == b'\n').count())
                .sum();
            println!("backup of {lines} records written to {}", file.display());
            Ok(0)
        }
        Cmd::Restore { file } => {
            let (n, moved) = crate::backup::restore(&file, &data.db())?;
            println!("restored {n} records into {}", data.db().display());
            if let Some(m) = moved {
                println!("the previous store was moved to {}", m.display());
            }
            Ok(0)
        }
        Cmd::Demo { keep, model } => {
            // `brain demo` was parsed after logging started at info; the narration is enough.
            let program = std::env::current_exe()
                .context("locating this program")?
                .with_file_name("worker");
            if !program.exists() {
                bail!(
                    "the demo needs the `worker` binary next to `brain` ({}): build the workspace, or run `cargo run --release -- demo`",
                    program.display()
                );
            }
            crate::demo::run(
                crate::demo::Launcher {
                    program,
                    prefix: vec![],
                },
                keep,
                model,
            )
            .await?;
            Ok(0)
        }
        Cmd::File(cmd) => file(&target, cmd).await,
        Cmd::Admin(AdminCmd::Issue { name, out }) => {
            let mut c = target.connect().await?;
            let (key, csr) = pki::new_key_and_csr(&name)?;
            let resp = c
                .issue_admin(proto::IssueAdminRequest {
                    name: name.clone(),
                    csr_der: csr,
                })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            IdentityFiles {
                ca_pem: resp.ca_pem,
                cert_pem: resp.cert_pem,
                key_pem: key.serialize_pem(),
            }
            .save(&out)?;
            println!(
                "admin identity {name} written to {}; use it with --identity {} --brain {}",
                out.display(),
                out.display(),
                target.url
            );
            Ok(0)
        }
        Cmd::Admin(AdminCmd::Revoke { name }) => {
            let mut c = target.connect().await?;
            c.revoke_admin(proto::RevokeAdminRequest { name: name.clone() })
                .await
                .map_err(|s| status(s, &target.url))?;
            println!("admin identity {name} revoked");
            Ok(0)
        }
    }
}

fn status(s: tonic::Status, url: &str) -> anyhow::Error {
    anyhow::anyhow!(shared::tls::explain_status(&s, url))
}

async fn exec(target: &Target, args: ExecArgs) -> i32 {
    let fail = |code: i32, msg: String| {
        eprintln!("brain exec: {msg}");
        code
    };
    let mut c = match target.connect().await {
        Ok(c) => c,
        Err(e) => return fail(EXIT_TETHER_ERROR, e.to_string()),
    };
    let req = proto::AdminExecRequest {
        worker: args.worker.clone(),
        workspace: args.workspace,
        argv: args.argv,
        cwd: args.cwd,
        timeout_ms: args.timeout.as_millis() as u64,
        output_cap_bytes: args.output_cap,
        limits: Some(args.limits.to_proto(args.network_off)),
    };
    let mut stream = match c.exec(req).await {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == tonic::Code::FailedPrecondition => {
            return fail(EXIT_WORKER_LOST, s.message().to_string());
        }
        Err(s) => {
            return fail(
                EXIT_TETHER_ERROR,
                shared::tls::explain_status(&s, &target.url),
            );
        }
    };
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    loop {
        let ev = match stream.message().await {
            Ok(Some(ev)) => ev,
            Ok(None) => {
                return fail(
                    EXIT_WORKER_LOST,
                    "the brain ended the stream before the command finished".into(),
                );
            }
            Err(s) => {
                return fail(
                    EXIT_WORKER_LOST,
                    format!("lost contact during the command: {}", s.message()),
                );
            }
        };
        match ev.event {
            Some(exec_event::Event::Output(o)) => {
                let res = if o.stream == proto::OutputStream::Stderr as i32 {
                    stderr.write_all(&o.data).and_then(|_| stderr.flush())
                } else {
                    stdout.write_all(&o.data).and_then(|_| stdout.flush())
                };
                if res.is_err() {
                    return EXIT_TETHER_ERROR; // our stdout is gone; dropping the stream cancels
                }
            }
            Some(exec_event::Event::Exit(x)) => {
                if x.dropped_bytes > 0 {
                    eprintln!(
                        "[tether: {} bytes of output dropped past the {}-byte cap]",
                        x.dropped_bytes, args.output_cap
                    );
                }
                if x.worker_lost {
                    return fail(
                        EXIT_WORKER_LOST,
                        format!(
                            "worker {} was lost before the command finished",
                            args.worker
                        ),
                    );
                }
                if x.timed_out {
                    return fail(
                        EXIT_TIMEOUT,
                        format!(
                            "timed out after {}; the command's process group was killed",
                            humantime::format_duration(args.timeout)
                        ),
                    );
                }
                if !x.error.is_empty() {
                    eprintln!("brain exec: {}", x.error);
                }
                if !x.limit.is_empty() {
                    eprintln!("brain exec: {}", x.limit);
                }
                if let Some(code) = x.code {
                    return code;
                }
                if let Some(sig) = x.signal {
                    eprintln!("brain exec: killed by signal {sig}");
                    return 128 + sig;
                }
                return EXIT_TETHER_ERROR;
            }
            None => {}
        }
    }
}

async fn file(target: &Target, cmd: FileCmd) -> anyhow::Result<i32> {
    let (worker, workspace, op) = match cmd {
        FileCmd::Read {
            worker,
            path,
            offset,
            length,
            workspace,
        } => (
            worker,
            workspace,
            file_call::Op::Read(proto::ReadFile {
                path,
                offset,
                length,
            }),
        ),
        FileCmd::Write {
            worker,
            path,
            from,
            mode,
            parents,
            workspace,
        } => {
            let data = match from {
                Some(p) => std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?,
                None => {
                    let mut buf = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
                        .context("reading stdin")?;
                    buf
                }
            };
            let mode = u32::from_str_radix(&mode, 8)
                .with_context(|| format!("invalid --mode {mode:?}: expected octal like 644"))?;
            (
                worker,
                workspace,
                file_call::Op::Write(proto::WriteFile {
                    path,
                    data,
                    mode,
                    create_dirs: parents,
                }),
            )
        }
        FileCmd::Ls {
            worker,
            path,
            workspace,
        } => (
            worker,
            workspace,
            file_call::Op::List(proto::ListDir { path }),
        ),
        FileCmd::Stat {
            worker,
            path,
            workspace,
        } => (
            worker,
            workspace,
            file_call::Op::Stat(proto::StatPath { path }),
        ),
        FileCmd::Find {
            worker,
            glob,
            workspace,
        } => (
            worker,
            workspace,
            file_call::Op::Find(proto::FindFiles {
                glob,
                max_results: 0,
            }),
        ),
        FileCmd::Search {
            worker,
            pattern,
            glob,
            workspace,
        } => (
            worker,
            workspace,
            file_call::Op::Search(proto::SearchFiles {
                pattern,
                glob,
                max_matches: 0,
            }),
        ),
        FileCmd::Rm {
            worker,
            path,
            recursive,
            workspace,
        } => (
            worker,
            workspace,
            file_call::Op::Remove(proto::RemovePath { path, recursive }),
        ),
    };
    let mut c = target.connect().await?;
    let resp = c
        .file(proto::AdminFileRequest {
            worker,
            call: Some(FileCall {
                call_id: 0,
                workspace,
                op: Some(op),
            }),
        })
        .await
        .map_err(|s| status(s, &target.url))?
        .into_inner();
    match resp.result {
        Some(file_response::Result::Data(d)) => {
            std::io::stdout().write_all(&d.data)?;
        }
        Some(file_response::Result::Done(_)) => {}
        Some(file_response::Result::Listing(l)) => {
            for e in l.entries {
                println!("{}", format_stat(&e));
            }
        }
        Some(file_response::Result::Stat(s)) => println!("{}", format_stat(&s)),
        Some(file_response::Result::Paths(p)) => {
            for path in &p.paths {
                println!("{path}");
            }
            if p.truncated {
                eprintln!("(more matched; only the first {} are shown)", p.paths.len());
            }
        }
        Some(file_response::Result::Matches(x)) => {
            for h in &x.matches {
                println!("{}:{}: {}", h.path, h.line, h.text);
            }
            if x.truncated {
                eprintln!(
                    "(more matched; only the first {} are shown)",
                    x.matches.len()
                );
            }
        }
        Some(file_response::Result::Error(e)) => bail!("{}", e.message),
        None => bail!("the worker sent an empty answer"),
    }
    Ok(0)
}

fn format_stat(s: &proto::FileStat) -> String {
    let kind = match proto::FileKind::try_from(s.kind).unwrap_or(proto::FileKind::Unspecified) {
        proto::FileKind::Dir => 'd',
        proto::FileKind::Symlink => 'l',
        proto::FileKind::File => '-',
        _ => '?',
    };
    format!("{kind} {:04o} {:>10} {}", s.mode & 0o7777, s.size, s.path)
}

async fn provision(target: &Target, cmd: ProvisionCmd) -> anyhow::Result<i32> {
    let (provider, ssh, opts) = match cmd {
        ProvisionCmd::Local(opts) => ("local", None, opts),
        ProvisionCmd::Docker(opts) => ("docker", None, opts),
        ProvisionCmd::Ec2(opts) => ("ec2", None, opts),
        ProvisionCmd::Ssh {
            destination,
            port,
            identity,
            opts,
        } => (
            "ssh",
            Some(proto::SshTarget {
                destination,
                port: port.map(u32::from).unwrap_or(0),
                identity_file: identity.unwrap_or_default(),
            }),
            opts,
        ),
    };
    let mut c = target.connect().await?;
    let wait = opts.wait.as_secs().min(3600) as u32;
    if wait > 0 {
        eprintln!(
            "provisioning a {provider} machine and waiting up to {wait}s for its worker to join…"
        );
    }
    let m = c
        .provision(proto::ProvisionRequest {
            provider: provider.into(),
            spec: Some(proto::MachineSpec {
                cpu: opts.cpu,
                memory_gb: opts.memory_gb,
                disk_gb: opts.disk_gb,
                gpu: 0,
            }),
            labels: opts.labels.into_iter().collect(),
            name: opts.name.unwrap_or_default(),
            ssh,
            wait_seconds: wait,
            brain_url: opts.brain_url.unwrap_or_default(),
        })
        .await
        .map_err(|s| status(s, &target.url))?
        .into_inner()
        .machine
        .unwrap_or_default();
    match m.state.as_str() {
        "ready" => {
            println!(
                "{} is ready: worker {} at {} ({})",
                m.id, m.worker_id, m.address, m.handle
            );
            Ok(0)
        }
        "joining" if wait == 0 => {
            println!(
                "{} created at {}; its worker is joining (see `brain machines`)",
                m.id, m.address
            );
            Ok(0)
        }
        state => {
            eprintln!(
                "error: {} is {state}{}; see `brain machines --all`",
                m.id,
                if m.note.is_empty() {
                    String::new()
                } else {
                    format!(": {}", m.note)
                }
            );
            Ok(1)
        }
    }
}

/// `brain machines`: a table, or JSON.
pub fn print_machines(machines: &[proto::MachineInfo], json: bool) {
    let now = shared::now_unix_ms();
    if json {
        let items: Vec<serde_json::Value> = machines
            .iter()
            .map(|m| {
                let s = m.spec.unwrap_or_default();
                serde_json::json!({
                    "id": m.id, "provider": m.provider, "state": m.state,
                    "handle": m.handle, "address": m.address,
                    "spec": {"cpu": s.cpu, "memory_gb": s.memory_gb, "disk_gb": s.disk_gb, "gpu": s.gpu},
                    "worker_id": m.worker_id, "connected": m.connected, "task_id": m.task_id,
                    "created_unix_ms": m.created_unix_ms, "ended_unix_ms": m.ended_unix_ms,
                    "age_seconds": (now - m.created_unix_ms).max(0) / 1000,
                    "usd_per_hour": m.usd_per_hour, "cost_usd": m.cost_usd,
                    "note": m.note, "labels": m.labels,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(items));
        return;
    }
    if machines.is_empty() {
        println!(
            "no machines (`brain provision local|ssh …` creates one; --all shows released ones)"
        );
        return;
    }
    println!(
        "{:<16} {:<8} {:<10} {:<16} {:<14} {:<10} {:>10} {:>9}  ADDRESS / NOTE",
        "ID", "PROVIDER", "STATE", "WORKER", "SPEC", "TASK", "AGE", "COST"
    );
    for m in machines {
        let s = m.spec.unwrap_or_default();
        let spec = if s == proto::MachineSpec::default() {
            "-".to_string()
        } else {
            format!("{}c/{}G/{}G", s.cpu, s.memory_gb, s.disk_gb)
        };
        let end = if m.ended_unix_ms > 0 {
            m.ended_unix_ms
        } else {
            now
        };
        let age = humantime::format_duration(Duration::from_secs(
            ((end - m.created_unix_ms).max(0) / 1000) as u64,
        ))
        .to_string();
        let state = if m.state == "ready" && !m.connected {
            "ready/lost".to_string()
        } else {
            m.state.clone()
        };
        let mut tail = m.address.clone();
        if !m.note.is_empty() {
            tail = format!("{tail} — {}", m.note);
        }
        println!(
            "{:<16} {:<8} {:<10} {:<16} {:<14} {:<10} {:>10} {:>8.4}$  {}",
            m.id,
            m.provider,
            state,
            if m.worker_id.is_empty() {
                "-"
            } else {
                &m.worker_id
            },
            spec,
            if m.task_id.is_empty() {
                "-"
            } else {
                &m.task_id
            },
            age,
            m.cost_usd,
            tail
        );
    }
}

pub fn print_workers(workers: &[proto::WorkerInfo], json: bool) {
    let state_name = |s: i32| match proto::WorkerState::try_from(s) {
        Ok(proto::WorkerState::Connected) => "connected",
        Ok(proto::WorkerState::Lost) => "lost",
        Ok(proto::WorkerState::Revoked) => "revoked",
        Ok(proto::WorkerState::Enrolled) => "enrolled",
        _ => "unknown",
    };
    let now = shared::now_unix_ms();
    let ago = |ms: i64| {
        if ms <= 0 {
            "never".to_string()
        } else {
            let secs = ((now - ms).max(0) / 1000) as u64;
            format!(
                "{} ago",
                humantime::format_duration(Duration::from_secs(secs))
            )
        }
    };
    if json {
        let items: Vec<serde_json::Value> = workers
            .iter()
            .map(|w| {
                let c = w.capabilities.clone().unwrap_or_default();
                serde_json::json!({
                    "id": w.id, "name": w.name, "labels": w.labels,
                    "state": state_name(w.state),
                    "os": c.os, "arch": c.arch, "cpus": c.cpus,
                    "memory_bytes": c.memory_bytes, "disk_free_bytes": c.disk_free_bytes,
                    "version": c.version, "hostname": c.hostname,
                    "last_seen_unix_ms": w.last_seen_unix_ms,
                    "enrolled_unix_ms": w.enrolled_unix_ms,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(items));
        return;
    }
    println!(
        "{:<16} {:<20} {:<10} {:<14} {:>4} {:>8}  {:<16} LABELS",
        "ID", "NAME", "STATE", "OS/ARCH", "CPUS", "MEMORY", "LAST SEEN"
    );
    for w in workers {
        let c = w.capabilities.clone().unwrap_or_default();
        let mut labels: Vec<String> = w.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        println!(
            "{:<16} {:<20} {:<10} {:<14} {:>4} {:>7.1}G  {:<16} {}",
            w.id,
            w.name,
            state_name(w.state),
            if c.os.is_empty() {
                "-".to_string()
            } else {
                format!("{}/{}", c.os, c.arch)
            },
            c.cpus,
            c.memory_bytes as f64 / (1u64 << 30) as f64,
            ago(w.last_seen_unix_ms),
            labels.join(",")
        );
    }
}

fn spawn_signal_handler(stop: CancellationToken) {
    tokio::spawn(async move {
        shared::signals::terminated().await;
        stop.cancel();
    });
}

/// `tether demo`: runs the demo with workers started as `<this program> worker ...`.
pub fn run_demo(keep: bool, model: Option<String>) -> i32 {
    // The demo narrates on stdout; the brain's own log would only interleave with it.
    shared::telemetry::init("error");
    let program = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: cannot locate this program: {e}");
            return 1;
        }
    };
    let Some(rt) = runtime() else {
        return 1;
    };
    let launcher = crate::demo::Launcher {
        program,
        prefix: vec!["worker".into()],
    };
    match rt.block_on(crate::demo::run(launcher, keep, model)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

/// `brain run`: starts an agent task (or a scripted plan) and follows it.
async fn run_task(target: &Target, args: RunArgs) -> anyhow::Result<i32> {
    let goal = args.goal.or(args.goal_flag).unwrap_or_default();
    let mut c = target.connect().await?;
    let task_id = if let Some(plan) = &args.plan {
        let plan_json = std::fs::read_to_string(plan)
            .with_context(|| format!("reading the plan {}", plan.display()))?;
        crate::tasks::Plan::parse(&plan_json)
            .map_err(|e| anyhow::anyhow!("{}: {e}", plan.display()))?;
        let worker = args.worker.clone().unwrap_or_default();
        let r = c
            .run_plan(proto::RunPlanRequest {
                plan_json,
                worker,
                goal,
                require_labels: args.require_labels.iter().cloned().collect(),
            })
            .await
            .map_err(|s| status(s, &target.url))?
            .into_inner();
        println!("{}", r.task_id);
        eprintln!("follow it with: brain watch {}", r.task_id);
        return Ok(0);
    } else {
        if goal.trim().is_empty() {
            bail!("say what the agent should do: brain run \"GOAL\" (see --help)");
        }
        let mut model = args.model.clone().unwrap_or_default();
        let mut transcript = String::new();
        if let Some(file) = model.strip_prefix("replay:") {
            transcript = std::fs::read_to_string(file)
                .with_context(|| format!("reading the transcript {file}"))?;
            crate::llm::Replay::parse(&transcript).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
            let name = Path::new(file)
                .file_name()
                .map_or_else(|| file.to_string(), |n| n.to_string_lossy().into_owned());
            model = format!("replay:{name}");
        }
        let r = c
            .run_agent(proto::RunAgentRequest {
                goal,
                worker: args.worker.clone().unwrap_or_default(),
                model,
                permission: args.permission.clone().unwrap_or_default(),
                budget: Some(args.budget.to_proto()?),
                transcript,
                git_url: args.git.clone().unwrap_or_default(),
                git_ref: args.git_ref.clone().unwrap_or_default(),
                require_labels: args.require_labels.iter().cloned().collect(),
                include_git: args.include_git,
                extra_excludes: args.excludes.clone(),
                no_default_excludes: args.no_default_excludes,
                dir: match &args.dir {
                    Some(d) if d.is_relative() => std::env::current_dir()
                        .context("resolving --dir")?
                        .join(d)
                        .display()
                        .to_string(),
                    Some(d) => d.display().to_string(),
                    None => String::new(),
                },
            })
            .await
            .map_err(|s| status(s, &target.url))?
            .into_inner();
        r.task_id
    };
    println!("{task_id}");
    if args.detach {
        eprintln!("follow it with: brain watch {task_id}");
        return Ok(0);
    }
    eprintln!("following {task_id} (Ctrl-C detaches; the task goes on)");
    let recorder = args.record.as_deref();
    let outcome = follow_agent(target, &task_id, recorder).await?;
    Ok(match outcome.as_str() {
        "finished" => 0,
        _ => 1,
    })
}

/// `brain approve` / `brain deny`.
async fn decide(target: &Target, task: &str, approve: bool, reason: String) -> anyhow::Result<i32> {
    let mut c = target.connect().await?;
    let r = c
        .decide(proto::DecideRequest {
            task_id: task.to_string(),
            approve,
            reason,
        })
        .await
        .map_err(|s| status(s, &target.url))?
        .into_inner();
    println!(
        "{} {task}: {}",
        if approve { "approved" } else { "denied" },
        r.what
    );
    Ok(0)
}

/// A task's log records as a stream; with `live`, it stays open until the task ends.
async fn task_log(
    target: &Target,
    task: &str,
    live: bool,
) -> anyhow::Result<tonic::Streaming<proto::TaskRecord>> {
    let mut c = target.connect().await?;
    Ok(c.task_log(proto::TaskLogRequest {
        task_id: task.to_string(),
        follow: live,
    })
    .await
    .map_err(|s| status(s, &target.url))?
    .into_inner())
}

/// Follows an agent task until it ends or stops for budget, printing its events, with a
/// running total of tokens and cost; with `record`, writes the model's answers as a
/// transcript. Returns the final status.
async fn follow_agent(
    target: &Target,
    task: &str,
    record: Option<&Path>,
) -> anyhow::Result<String> {
    let mut stream = task_log(target, task, true).await?;
    let mut answers = Vec::new();
    let (mut tokens, mut usd) = (0u64, 0f64);
    let mut out = std::io::stdout();
    let mut end = String::from("detached");
    while let Some(r) = stream.message().await.map_err(|s| status(s, &target.url))? {
        let text = match serde_json::from_str::<crate::tasks::Record>(&r.json) {
            Ok(rec) => {
                let mut text = describe_record(&rec);
                match &rec.event {
                    crate::tasks::Event::LlmResponse {
                        prompt_tokens,
                        completion_tokens,
                        cost_usd,
                        response,
                        ..
                    } => {
                        tokens += prompt_tokens + completion_tokens;
                        usd += cost_usd;
                        text.push_str(&format!("\n    (so far: {tokens} tokens, ${usd:.4})"));
                        if let Some(r) = response {
                            answers.push((**r).clone());
                        }
                    }
                    crate::tasks::Event::Finished { outcome, .. } => {
                        end = serde_json::to_value(outcome)
                            .ok()
                            .and_then(|v| v.as_str().map(String::from))
                            .unwrap_or_default();
                    }
                    crate::tasks::Event::StatusChanged { status, .. }
                        if status == "budget_exhausted" =>
                    {
                        end = status.clone();
                    }
                    _ => {}
                }
                format!("{text}\n")
            }
            Err(_) => describe_live(&r.json),
        };
        if out
            .write_all(text.as_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            break;
        }
        if end == "budget_exhausted" {
            break;
        }
    }
    if let Some(file) = record {
        std::fs::write(file, crate::llm::to_transcript(&answers))
            .with_context(|| format!("writing the transcript {}", file.display()))?;
        eprintln!(
            "recorded {} model answers to {} (replay with --model replay:{})",
            answers.len(),
            file.display(),
            file.display()
        );
    }
    eprintln!("{task}: {end}");
    Ok(end)
}

/// Prints a task's log; with `live`, keeps following until the task ends. A closed stdout
/// (`brain watch ID | head`) ends it quietly.
async fn follow(target: &Target, task: &str, live: bool, json: bool) -> anyhow::Result<()> {
    let mut stream = task_log(target, task, live).await?;
    let mut out = std::io::stdout();
    while let Some(r) = stream.message().await.map_err(|s| status(s, &target.url))? {
        let text = if json {
            format!("{}\n", r.json)
        } else {
            match serde_json::from_str::<crate::tasks::Record>(&r.json) {
                Ok(rec) => format!("{}\n", describe_record(&rec)),
                // Live output of the running call and file changes, as they come.
                Err(_) => describe_live(&r.json),
            }
        };
        if out
            .write_all(text.as_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            return Ok(());
        }
    }
    Ok(())
}

/// A live record that is not in the log (output of a running call, file changes), for
/// people.
fn describe_live(json: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let mark = match (v["kind"].as_str(), v["stream"].as_str()) {
        (Some("fs_change"), Some("removed")) => '-',
        (Some("fs_change"), _) => '~',
        (Some("live_output"), Some("stderr")) => '!',
        (Some("live_output"), _) => '|',
        _ => return format!("{json}\n"),
    };
    v["text"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .map(|l| format!("    {mark} {l}\n"))
        .collect()
}

/// One log record in words, for people.
pub fn describe_record(r: &crate::tasks::Record) -> String {
    use crate::tasks::Event as E;
    let what = match &r.event {
        E::Created { goal, .. } => format!("created: {goal}"),
        E::StatusChanged { status, reason } => format!("{status} {reason}"),
        E::ToolCallIssued {
            call_id,
            step,
            purpose,
            worker,
            call,
        } => {
            let c = match call {
                crate::tasks::ToolCall::RunCommand { argv, .. } => match argv.as_slice() {
                    [sh, c, cmd] if sh == "sh" && c == "-c" => cmd.clone(),
                    _ => argv.join(" "),
                },
                crate::tasks::ToolCall::WriteFile { path, .. } => format!("write {path}"),
                crate::tasks::ToolCall::ReadFile { path, .. } => format!("read {path}"),
                crate::tasks::ToolCall::EditFile { path, .. } => format!("edit {path}"),
                crate::tasks::ToolCall::ListFiles { glob } => format!("list files {glob}"),
                crate::tasks::ToolCall::Search { pattern, .. } => format!("search {pattern:?}"),
            };
            format!("issued   #{call_id} step {step} ({purpose:?}) on {worker}: {c}")
        }
        E::ToolOutput {
            call_id,
            stdout,
            stderr,
        } => {
            let mut s = format!("output   #{call_id}");
            for l in stdout.lines().take(20) {
                s.push_str(&format!("\n    | {l}"));
            }
            for l in stderr.lines().take(20) {
                s.push_str(&format!("\n    ! {l}"));
            }
            s
        }
        E::ToolCallCompleted { call_id, result } => {
            format!(
                "done     #{call_id}: {}",
                crate::tasks::state::describe(result)
            )
        }
        E::ToolCallInterrupted { call_id, reason } => format!("interrupted #{call_id}: {reason}"),
        E::Finished { outcome, reason } => format!("{outcome:?}: {reason}").to_lowercase(),
        E::WorkerAssigned { worker } => format!("assigned to worker {worker}"),
        E::Snapshot { upto } => format!("snapshot of the state up to {upto}"),
        E::LlmRequest { model, messages } => format!("thinking ({model}, {messages} messages)"),
        E::LlmResponse {
            prompt_tokens,
            completion_tokens,
            cost_usd,
            response,
            ..
        } => {
            let mut s =
                format!("model    {prompt_tokens}+{completion_tokens} tokens, ${cost_usd:.4}");
            if let Some(r) = response {
                for l in r
                    .message
                    .content
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .take(10)
                {
                    s.push_str(&format!("\n    > {l}"));
                }
                for c in &r.message.tool_calls {
                    let args: String = c.arguments.chars().take(200).collect();
                    s.push_str(&format!("\n    → {} {args}", c.name));
                }
            }
            s
        }
        E::Observation { text, failed, .. } => {
            let mut s = format!("observed{}", if *failed { " (failed)" } else { "" });
            let lines: Vec<&str> = text.lines().collect();
            for l in lines.iter().take(12) {
                s.push_str(&format!("\n    < {l}"));
            }
            if lines.len() > 12 {
                s.push_str(&format!("\n    < … {} more lines", lines.len() - 12));
            }
            s
        }
        E::ApprovalRequested {
            approval_id, what, ..
        } => {
            format!(
                "APPROVAL #{approval_id} needed: {what}\n    → brain approve {t}   or   brain deny {t} --reason TEXT",
                t = r.task
            )
        }
        E::ApprovalDecided {
            approval_id,
            approved,
            by,
            reason,
        } => format!(
            "approval #{approval_id} {} by {by}{}",
            if *approved { "granted" } else { "denied" },
            if reason.is_empty() {
                String::new()
            } else {
                format!(": {reason}")
            }
        ),
        E::ContextElided { upto, bytes_saved } => {
            format!(
                "elided old tool outputs in the first {upto} messages ({bytes_saved} bytes) to fit the context window"
            )
        }
        E::Barrier {
            version,
            root_hash,
            files,
            bytes,
            wire_bytes,
        } => format!(
            "barrier  v{version}: {files} files, {bytes} bytes, root {}…; {wire_bytes} bytes sent",
            &root_hash[..root_hash.len().min(12)]
        ),
        E::MoveStarted { from, to } => format!("MOVE     from {from} to {to}"),
        E::WorkspaceSeeded {
            source,
            files,
            bytes,
            ..
        } => format!("workspace from {source}: {files} files, {bytes} bytes"),
        E::MoveCompleted {
            to,
            files,
            wire_bytes,
        } => format!("moved    now on {to} ({files} files written there, {wire_bytes} bytes sent)"),
        E::MoveAborted { to, reason } => format!("move to {to} aborted: {reason}"),
        E::LeftOut {
            worker,
            entries,
            more,
        } => {
            let mut s = format!("left out of the mirror on {worker} (not synced, not moved):");
            for e in entries {
                s.push_str(&format!("\n    ! {}: {}", e.path, e.reason));
            }
            if *more > 0 {
                s.push_str(&format!("\n    ! … and {more} more"));
            }
            s
        }
        E::BudgetRaised { limits } => format!(
            "budget raised to ${:.4}, {} tokens, {} steps, {} ms wall (0 = no limit)",
            limits.usd, limits.tokens, limits.steps, limits.wall_ms
        ),
        other => serde_json::to_string(other).unwrap_or_default(),
    };
    format!("{:>5}  {what}", r.seq)
}
