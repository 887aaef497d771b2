//! The `local` provider: worker processes on the brain's own machine, each with its state in
//! `<data>/machines/<id>/`. That directory, on the worker's command line as `--state`, is the
//! marker: [`Local::list`] finds this brain's workers by reading `/proc/*/cmdline`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::error::ProviderError;
use super::provider::{Created, Join, Provisioner, Seen, no_params};
use super::records::{Machine, Spec};

/// `[provision.local]` in the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalConfig {
    /// The worker program (default: `worker` beside the brain's binary, or `tether worker`).
    pub worker: Option<PathBuf>,
    /// Extra arguments for `worker join`, e.g. `["--no-sandbox"]`.
    pub args: Vec<String>,
    /// More names of the brain's environment variables its workers keep, besides
    /// [`WORKER_ENV`] (e.g. `["HTTPS_PROXY"]`). The rest (LLM and cloud keys among them) they
    /// never see.
    pub env: Vec<String>,
}

/// What a worker this brain starts keeps of the brain's environment: the names, and the
/// prefixes, of what a program and the worker's own settings need. Nothing else: the brain's
/// environment holds LLM and cloud keys, and a worker's commands run as its user.
pub const WORKER_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "TERM",
    "NO_COLOR",
    "RUST_LOG",
    "RUST_BACKTRACE",
    "TETHER_MATERIALISE_MEMORY",
    "TETHER_REQUIRE_PEERS",
];
const WORKER_ENV_PREFIXES: &[&str] = &["LC_", "TETHER_WORKER_"];

/// The brain's environment as a worker it starts gets it: [`WORKER_ENV`] and `extra`.
pub fn worker_env(extra: &[String]) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    std::env::vars_os()
        .filter(|(k, _)| {
            k.to_str().is_some_and(|k| {
                WORKER_ENV.contains(&k)
                    || WORKER_ENV_PREFIXES.iter().any(|p| k.starts_with(p))
                    || extra.iter().any(|e| e == k)
            })
        })
        .collect()
}

/// Why no worker program came with this one.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot locate this program: {0}")]
    Locate(#[source] std::io::Error),
    #[error(
        "no `worker` program beside {0}: build the workspace (`cargo build --release`), install it there, or set provision.local.worker"
    )]
    NotBeside(PathBuf),
}

/// How to start a worker: `program prefix... join ...`.
#[derive(Debug, Clone)]
pub struct WorkerProgram {
    pub program: PathBuf,
    pub prefix: Vec<String>,
}

impl WorkerProgram {
    /// The worker that came with this program, the one place that finds it: the `tether`
    /// launcher's own `worker` subcommand (same build), or the `worker` binary beside
    /// `brain`.
    pub fn beside_this_program() -> Result<Self, Error> {
        let exe = std::env::current_exe().map_err(Error::Locate)?;
        if exe.file_stem().is_some_and(|n| n == "tether") {
            return Ok(Self {
                program: exe,
                prefix: vec!["worker".into()],
            });
        }
        let sibling = exe.with_file_name("worker");
        if sibling.is_file() {
            return Ok(Self {
                program: sibling,
                prefix: vec![],
            });
        }
        Err(Error::NotBeside(exe))
    }

    /// `program prefix...` with the environment of [`worker_env`], ready for the worker's
    /// own arguments.
    pub fn command(&self) -> std::process::Command {
        let mut c = std::process::Command::new(&self.program);
        c.args(&self.prefix).env_clear().envs(worker_env(&[]));
        c
    }
}

/// Worker processes on this machine.
pub struct Local {
    dir: PathBuf,
    worker: Result<WorkerProgram, Error>,
    args: Vec<String>,
    env: Vec<String>,
    deny_read: Vec<PathBuf>,
}

impl Local {
    /// Machines live under `dir` (`<data>/machines`); their commands may read nothing under
    /// `deny_read` (the brain's data dir and config file: keys, the store, the CA).
    pub fn new(dir: PathBuf, cfg: &LocalConfig, deny_read: Vec<PathBuf>) -> Self {
        let worker = match &cfg.worker {
            Some(p) => Ok(WorkerProgram {
                program: p.clone(),
                prefix: vec![],
            }),
            None => WorkerProgram::beside_this_program(),
        };
        Self {
            dir,
            worker,
            args: cfg.args.clone(),
            env: cfg.env.clone(),
            deny_read,
        }
    }

    fn state_dir(&self, id: &str) -> Result<PathBuf, ProviderError> {
        let ok = id.starts_with("m-")
            && id.len() <= 64
            && id[2..].chars().all(|c| c.is_ascii_alphanumeric());
        if !ok {
            return Err(ProviderError::new(format!("invalid machine id {id:?}")));
        }
        Ok(self.dir.join(id))
    }
}

/// Processes whose command line has `--state DIR` with DIR directly under `root`, as
/// (machine id, pid).
fn processes_under(root: &Path) -> Vec<(String, i32)> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    let mut found = Vec::new();
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        for w in args.windows(2) {
            if w[0] != b"--state" {
                continue;
            }
            let dir = Path::new(std::ffi::OsStr::new(
                std::str::from_utf8(w[1]).unwrap_or_default(),
            ));
            if dir.parent() == Some(root)
                && let Some(id) = dir.file_name().and_then(|n| n.to_str())
            {
                found.push((id.to_string(), pid));
            }
        }
    }
    found
}

/// Sends `sig` to `pid`; one already gone is no error.
fn signal(pid: i32, sig: rustix::process::Signal) {
    if let Some(p) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(p, sig);
    }
}

fn alive(pid: i32) -> bool {
    rustix::process::Pid::from_raw(pid)
        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

#[async_trait::async_trait]
impl Provisioner for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    fn remote(&self, _params: &serde_json::Value) -> bool {
        false
    }

    fn check(&self, params: &serde_json::Value, _spec: &Spec) -> Result<(), ProviderError> {
        no_params("local", params, "")?;
        self.worker
            .as_ref()
            .map(drop)
            .map_err(|e| ProviderError::new(e.to_string()))
    }

    async fn create(&self, m: &Machine, join: &Join) -> Result<Created, ProviderError> {
        let worker = self
            .worker
            .as_ref()
            .cloned()
            .map_err(|e| ProviderError::new(e.to_string()))?;
        let dir = self.state_dir(&m.id)?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| ProviderError::new(format!("cannot create {}: {e}", dir.display())))?;
        let log = std::fs::File::create(dir.join("worker.log"))
            .map_err(|e| ProviderError::new(format!("cannot create the worker's log: {e}")))?;
        let log2 = log
            .try_clone()
            .map_err(|e| ProviderError::new(format!("cannot create the worker's log: {e}")))?;
        let mut cmd = tokio::process::Command::new(&worker.program);
        cmd.args(&worker.prefix).args(join.args()).args(&self.args);
        for p in &self.deny_read {
            cmd.arg("--deny-read").arg(p);
        }
        cmd.env_clear()
            .envs(worker_env(&self.env))
            .arg("--state")
            .arg(&dir)
            // Given up on the brain, it removes its own directory as it exits.
            .arg("--remove-on-give-up")
            .arg(&dir)
            // The token goes by environment, not argument: the process list shows arguments.
            .env("TETHER_JOIN_TOKEN", &join.token)
            .env_remove("TETHER_WORKER_STATE")
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2);
        // SAFETY: setsid is async-signal-safe; the worker leaves the brain's session so a
        // terminal's signals to the brain do not reach it.
        unsafe {
            cmd.pre_exec(|| {
                let _ = rustix::process::setsid();
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            ProviderError::new(format!("cannot start {}: {e}", worker.program.display()))
        })?;
        let pid = child.id().unwrap_or_default();
        // Not waited on here: tokio reaps it when it exits; release finds it by its state dir.
        drop(child);
        Ok(Created {
            handle: format!("pid {pid}"),
            address: dir.display().to_string(),
        })
    }

    async fn destroy(&self, m: &Machine) -> Result<(), ProviderError> {
        let dir = self.state_dir(&m.id)?;
        let root = self.dir.clone();
        let id = m.id.clone();
        let pids = move || -> Vec<i32> {
            processes_under(&root)
                .into_iter()
                .filter(|(m, _)| *m == id)
                .map(|(_, p)| p)
                .collect()
        };
        // Ask first (the worker stops its commands), then insist.
        for pid in pids() {
            signal(pid, rustix::process::Signal::TERM);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        // A worker usually stops within milliseconds: look soon, then less often.
        let mut pause = Duration::from_millis(2);
        loop {
            let left: Vec<i32> = pids().into_iter().filter(|p| alive(*p)).collect();
            if left.is_empty() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                for pid in left {
                    signal(pid, rustix::process::Signal::KILL);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                break;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ProviderError::new(format!(
                "cannot remove {}: {e}",
                dir.display()
            ))),
        }
    }

    async fn list(&self, _records: &[Machine]) -> Result<Vec<Seen>, ProviderError> {
        let root = self.dir.clone();
        let procs = tokio::task::spawn_blocking(move || processes_under(&root))
            .await
            .map_err(|e| ProviderError::new(e.to_string()))?;
        Ok(procs
            .into_iter()
            .map(|(machine, pid)| Seen {
                machine,
                handle: format!("pid {pid}"),
                failure: None,
            })
            .collect())
    }
}
