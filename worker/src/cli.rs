//! The `worker` command line: `join` a brain once, then `run` (reconnecting for ever).

use std::path::PathBuf;

use crate::giveup::GiveUp;
use crate::session::{self, Backoff, JoinOptions};
use crate::state::{self, StateDir};
use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "worker",
    version,
    about = "Tether worker: dials out to a brain over mutual TLS and runs its calls in confined workspaces",
    long_about = "Tether worker: dials out to a brain over mutual TLS and runs its calls in confined workspaces.\n\nFirst `worker join` with the line `brain token create` printed; afterwards `worker run` reconnects with the stored identity. State (identity, workspaces) lives in --state, default $TETHER_WORKER_STATE or ~/.local/share/tether-worker."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Enrol with a brain using a one-time token, then run
    Join {
        /// The brain's URL, e.g. https://brain.example:7443. Repeatable (or comma-separated
        /// in $TETHER_BRAIN) for brains that share one store: the worker joins through the
        /// first and, when a session is lost, reconnects to the next
        #[arg(
            long = "brain",
            env = "TETHER_BRAIN",
            value_delimiter = ',',
            required = true
        )]
        brain: Vec<String>,
        /// One-time join token from `brain token create` (or $TETHER_JOIN_TOKEN, which keeps it
        /// out of the process list)
        #[arg(
            long,
            env = "TETHER_JOIN_TOKEN",
            hide_env_values = true,
            required_unless_present = "token_file"
        )]
        token: Option<String>,
        /// Read the token from this file and delete the file (how provisioners pass it)
        #[arg(long, conflicts_with = "token")]
        token_file: Option<PathBuf>,
        /// Pin of the brain's CA: sha256:<hex>, as printed by `brain token create`
        #[arg(long)]
        ca_hash: String,
        /// Name shown in `brain workers` (default: host name)
        #[arg(long)]
        name: Option<String>,
        /// Label key=value, repeatable (used for placement)
        #[arg(long = "label", value_parser = shared::parse_label)]
        labels: Vec<(String, String)>,
        #[arg(long, env = "TETHER_WORKER_STATE")]
        state: Option<PathBuf>,
        /// Enrol again even if this state dir already holds an identity
        #[arg(long)]
        force: bool,
        /// Only enrol; do not start running
        #[arg(long)]
        no_run: bool,
        /// Tasks this worker takes at once (default: two per CPU it may use; the brain may cap
        /// it with `[placement] max_tasks_per_worker`)
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000), conflicts_with = "no_run")]
        max_tasks: Option<u32>,
        #[command(flatten)]
        serve: Serve,
    },
    /// Connect to the brain with the stored identity and serve its calls until stopped
    Run {
        #[arg(long, env = "TETHER_WORKER_STATE")]
        state: Option<PathBuf>,
        /// Override the brain URLs stored at join time; repeatable: the worker tries them
        /// in turn, moving to the next when a session is lost
        #[arg(long = "brain")]
        brain: Vec<String>,
        /// Tasks this worker takes at once (default: two per CPU it may use; the brain may cap
        /// it with `[placement] max_tasks_per_worker`)
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        max_tasks: Option<u32>,
        #[command(flatten)]
        serve: Serve,
    },
    /// Show which confinement mechanisms work on this host, and why any does not
    Doctor {
        #[arg(long, env = "TETHER_WORKER_STATE")]
        state: Option<PathBuf>,
        /// On a root worker, the uids tasks' commands run as, one per task: FIRST-LAST
        #[arg(long, env = "TETHER_WORKER_TASK_UIDS", default_value_t = crate::sandbox::TaskUids::default())]
        task_uids: crate::sandbox::TaskUids,
        /// The import roots `worker run` would be given, to say what it would allow
        #[arg(
            long = "import-root",
            env = "TETHER_WORKER_IMPORT_ROOTS",
            value_delimiter = ':'
        )]
        import_roots: Vec<PathBuf>,
    },
}

/// How `join` and `run` serve the brain: the confinement and when to give up.
#[derive(clap::Args)]
struct Serve {
    /// On a root worker, the uids tasks' commands run as, one per task: FIRST-LAST
    #[arg(long, env = "TETHER_WORKER_TASK_UIDS", default_value_t = crate::sandbox::TaskUids::default())]
    task_uids: crate::sandbox::TaskUids,
    /// A path commands may not read, besides the state dir and ~/.ssh, ~/.aws, … (repeatable)
    #[arg(long = "deny-read")]
    deny_read: Vec<PathBuf>,
    /// Let the brain copy directories below DIR into a task's workspace (`brain run --dir`);
    /// repeatable, or ':'-separated in the variable. Without one, imports are refused: the
    /// worker reads what it imports with its own rights, more than its tasks' commands have
    #[arg(
        long = "import-root",
        env = "TETHER_WORKER_IMPORT_ROOTS",
        value_delimiter = ':'
    )]
    import_roots: Vec<PathBuf>,
    /// Run commands unconfined (benchmarks, trusted code). The brain sees no sandbox and
    /// refuses this worker where its policy requires one
    #[arg(long)]
    no_sandbox: bool,
    /// Exit (with an error) once the brain has been unreachable this long, e.g. "10m"; for
    /// workers a provisioner started, so an orphaned machine does not run for ever
    #[arg(long, value_parser = shared::parse_duration)]
    exit_after_unreachable: Option<std::time::Duration>,
    /// On giving up (--exit-after-unreachable), delete this directory (repeatable): what
    /// was installed for a provisioned machine
    #[arg(long = "remove-on-give-up", requires = "exit_after_unreachable")]
    remove_on_give_up: Vec<PathBuf>,
    /// On giving up (--exit-after-unreachable), power the machine off (an EC2 instance
    /// launched with shutdown-means-terminate is then terminated)
    #[arg(long, requires = "exit_after_unreachable")]
    poweroff_on_give_up: bool,
}

impl Serve {
    fn give_up(&self) -> anyhow::Result<GiveUp> {
        let give_up = GiveUp {
            remove: self.remove_on_give_up.clone(),
            poweroff: self.poweroff_on_give_up,
        };
        give_up.check().map_err(anyhow::Error::msg)?;
        Ok(give_up)
    }

    fn sandbox(&self, dir: &StateDir) -> anyhow::Result<crate::sandbox::Sandbox> {
        let mut s = make_sandbox(dir, &self.deny_read, self.task_uids, self.no_sandbox)?;
        s.allow_imports(&self.import_roots)?;
        tracing::info!("{}", s.imports().doctor_line());
        Ok(s)
    }

    fn backoff(&self) -> Backoff {
        Backoff {
            give_up_after: self.exit_after_unreachable,
            ..Backoff::default()
        }
    }
}

/// Joins; with `retry_for`, a brain that cannot be reached yet is tried again (with backoff)
/// until that much time has passed: a machine may boot before its network or its brain.
async fn join_retrying(
    dir: &StateDir,
    opts: JoinOptions,
    retry_for: Option<std::time::Duration>,
    shutdown: &CancellationToken,
) -> anyhow::Result<state::Membership> {
    let started = std::time::Instant::now();
    let mut delay = std::time::Duration::from_millis(200);
    loop {
        match session::join(dir, opts.clone()).await {
            Err(session::Error::Tls(e @ shared::tls::Error::Connect(_)))
                if retry_for.is_some_and(|limit| started.elapsed() < limit) =>
            {
                tracing::warn!(error = %e, retry_in = ?delay, "cannot reach the brain to join; will retry");
                tokio::select! {
                    _ = shutdown.cancelled() => anyhow::bail!("stopped before joining"),
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(std::time::Duration::from_secs(10));
            }
            Err(session::Error::Tls(shared::tls::Error::Connect(e))) if retry_for.is_some() => {
                tracing::error!(error = %e, "the brain stayed unreachable while joining; the worker exits");
                return Err(session::Error::Unreachable {
                    url: opts.brain.clone(),
                    after: retry_for.unwrap_or_default(),
                }
                .into());
            }
            r => return Ok(r?),
        }
    }
}

/// Parses `args` (including the program name) and runs the command.
pub fn main_with<I, T>(args: I) -> anyhow::Result<()>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    // A workspace's pre-confined spawner, started by a worker from its own executable with
    // the same leading arguments (`tether worker __spawner`, `worker __spawner`): nothing
    // else runs in that process.
    if args
        .get(1)
        .is_some_and(|a| a == crate::sandbox::spawnd::ARG)
    {
        std::process::exit(crate::sandbox::spawnd::serve());
    }
    // What comes before these arguments on our own command line (`worker` for `tether
    // worker ...`), for starting spawners the same way.
    let own: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let prefix = own.len().saturating_sub(args.len().saturating_sub(1));
    crate::sandbox::spawnd::set_prefix(own[..prefix].to_vec());
    shared::telemetry::init("info");
    let cli = Cli::parse_from(args);
    // Before the runtime and its threads: a mount namespace is per thread.
    let confined = match &cli.cmd {
        Cmd::Join { no_run, serve, .. } => !no_run && !serve.no_sandbox,
        Cmd::Run { serve, .. } => !serve.no_sandbox,
        Cmd::Doctor { .. } => true,
    };
    if confined {
        crate::sandbox::isolate();
    }
    if !matches!(cli.cmd, Cmd::Doctor { .. }) {
        // The worker's key and the join token are in its memory: commands that run as its
        // user must not read them through /proc/PID/mem or environ.
        if let Err(e) = shared::close_memory_to_same_user() {
            tracing::warn!(error = %e, "cannot close the worker's memory to its user's other processes");
        }
    }
    // One thread: the worker's work is I/O and child processes, and a single-threaded
    // runtime wakes on a child's exit or a message without a cross-thread hand-off (measured:
    // about 0.15 ms less per exec than two threads). Blocking file I/O goes to the blocking pool.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async_main(cli))
}

async fn async_main(cli: Cli) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    match cli.cmd {
        Cmd::Join {
            brain,
            token,
            token_file,
            ca_hash,
            name,
            labels,
            state,
            force,
            no_run,
            max_tasks,
            serve,
        } => {
            let give_up = serve.give_up()?;
            let dir = StateDir(state.unwrap_or_else(state::default_dir));
            let token = match (token, token_file) {
                (Some(t), _) => t,
                (None, Some(f)) => {
                    let t = std::fs::read_to_string(&f)
                        .with_context(|| format!("reading the join token from {}", f.display()))?;
                    // One use only: it is not left lying around.
                    let _ = std::fs::remove_file(&f);
                    t.trim().to_string()
                }
                (None, None) => anyhow::bail!("give --token or --token-file"),
            };
            let mut brains = brain.into_iter();
            let first = brains.next().context("give --brain")?;
            let opts = JoinOptions {
                brain: first,
                more_brains: brains.collect(),
                token,
                ca_hash,
                name: name.unwrap_or_else(crate::caps::hostname),
                labels,
                force,
            };
            // A worker that could not run commands refuses before it spends the token.
            let sandbox = if no_run {
                None
            } else {
                Some(serve.sandbox(&dir)?)
            };
            let m = match join_retrying(&dir, opts, serve.exit_after_unreachable, &shutdown).await {
                Ok(m) => m,
                Err(e) => return given_up(e, &give_up).await,
            };
            eprintln!(
                "joined as {} ({}); identity stored in {}",
                m.worker_id,
                m.name,
                dir.0.display()
            );
            let Some(sandbox) = sandbox else {
                return Ok(());
            };
            let backoff = serve.backoff();
            if let Err(e) = session::run(dir, vec![], backoff, sandbox, max_tasks, shutdown).await {
                return given_up(e.into(), &give_up).await;
            }
        }
        Cmd::Run {
            state,
            brain,
            max_tasks,
            serve,
        } => {
            let give_up = serve.give_up()?;
            let dir = StateDir(state.unwrap_or_else(state::default_dir));
            let sandbox = serve.sandbox(&dir)?;
            let backoff = serve.backoff();
            if let Err(e) = session::run(dir, brain, backoff, sandbox, max_tasks, shutdown).await {
                return given_up(e.into(), &give_up).await;
            }
        }
        Cmd::Doctor {
            state,
            task_uids,
            import_roots,
        } => {
            let dir = StateDir(state.unwrap_or_else(state::default_dir));
            let mut sandbox = crate::sandbox::Sandbox::look(&dir.0, &[], task_uids);
            sandbox.allow_imports(&import_roots)?;
            // The mount point is made here too (an empty directory), so the check below
            // says what a running worker would do.
            let prepared = sandbox.prepare();
            shared::outp!("{}", sandbox.report.render());
            let missing = sandbox
                .report
                .mechanisms
                .iter()
                .filter(|m| !m.active)
                .count();
            shared::outln!("{}", crate::watch::doctor_line());
            shared::outln!("{}", crate::files::doctor_line());
            shared::outln!("{}", sandbox.imports().doctor_line());
            shared::outln!(
                "disk quota: measured at every barrier (the workspace's manifest and its temp dir) for the brain's --disk-quota and --disk-files; no filesystem quota is set, so one call can write past it until it ends, each file bounded by the file size limit"
            );
            if missing == 0 {
                shared::outln!("every mechanism is active");
            } else {
                shared::outln!(
                    "{missing} mechanism(s) missing: the brain's policy may refuse to place some tasks here"
                );
            }
            // Whether commands can reach their workspace, as commands: a worker that could not
            // refuses to start.
            let reach = prepared
                .and_then(|()| {
                    dir.create()
                        .map_err(|e| crate::sandbox::Error::Workspace(e.to_string()))
                })
                .and_then(|()| sandbox.check_workspaces(&dir.workspaces()));
            match reach {
                Ok(line) => shared::outln!("workspace ok       {line}"),
                Err(e) => {
                    shared::outln!("workspace BROKEN   {e}");
                    return Err(e.into());
                }
            }
        }
    }
    Ok(())
}

/// The sandbox for commands; refuses (exit 78) when their user could not reach its
/// workspaces, with what to change.
fn make_sandbox(
    dir: &StateDir,
    deny_read: &[PathBuf],
    task_uids: crate::sandbox::TaskUids,
    off: bool,
) -> anyhow::Result<crate::sandbox::Sandbox> {
    if off {
        tracing::warn!("--no-sandbox: commands run unconfined, with this worker's user and access");
        return Ok(crate::sandbox::Sandbox::disabled(&dir.0));
    }
    let mut s = crate::sandbox::Sandbox::probe(&dir.0, deny_read, task_uids);
    s.sweep();
    s.prepare()?;
    dir.create()?;
    let line = s
        .check_workspaces(&dir.workspaces())
        .context("this worker would hand out workspaces its commands cannot use")?;
    tracing::info!("{line}");
    Ok(s)
}

/// A session's or a join's error: when it is the brain staying unreachable, the machine
/// releases itself first (the give-up steps); the error is returned either way.
async fn given_up(e: anyhow::Error, steps: &GiveUp) -> anyhow::Result<()> {
    let unreachable = e.chain().any(|c| {
        matches!(
            c.downcast_ref::<session::Error>(),
            Some(session::Error::Unreachable { .. })
        )
    });
    if unreachable {
        steps.run().await;
    }
    Err(e)
}

fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        shared::signals::terminated().await;
        shutdown.cancel();
    });
}
