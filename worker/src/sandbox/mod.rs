//! Confinement of every command the worker runs: Landlock (write only the workspace and the
//! call's temp dir; read the system but not the worker's state dir nor the home directory's
//! secrets), rlimits and `no_new_privs`, a new session, a cgroup with memory, pids and CPU
//! limits, a mount namespace of its own in which the workspace is at [`WORKSPACE_PATH`] and
//! its temp dir at `/tmp` while the worker's state is hidden, a fresh network namespace when
//! the network is off, a user of its own per task when the worker runs as root (`users`), a
//! `/proc` that
//! shows that user only its own processes, and a seccomp filter, installed last, that refuses
//! the kernel interfaces commands have no use for (`seccomp`).
//! [`Sandbox::probe`] finds out what this host can enforce and [`Report`] says so plainly
//! (`worker doctor`, and the worker's hello); [`Sandbox::check_workspaces`] proves that the
//! command user can reach its workspace, and the worker refuses to start when it cannot.
//! [`Guard::limit_hit`] says in words which limit ended a command.
//!
//! Commands are started by a pre-confined spawner per workspace ([`Sandbox::lease`]; the
//! spawner's side is `spawnd`, the worker's `spawner`) where one can be had, and otherwise
//! forked and confined one by one ([`Sandbox::confine`], which also confines the spawners).
//!
//! What stands alone is in files of its own: cgroups, mounts and the start-up reach check,
//! rlimits, the Landlock rules, the guard, the report, and both sides of the spawner.

mod cgroup;
#[cfg(test)]
mod cgroup_real_tests;
mod cgroup_v2;
mod guard;
mod mount;
mod net;
mod probe;
mod proc;
mod report;
mod rlimits;
mod rules;
mod seccomp;
pub mod spawnd;
mod spawner;
mod sys;
mod users;

use shared::locks::Lock;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

pub(crate) use cgroup::v1_path as cgroup_v1_path;
use cgroup::{Cgroups, Leaves, Version, empty_cgroup, probe_cgroup};
pub(crate) use cgroup_v2::{Hierarchy as CgroupHierarchy, own_path as cgroup_v2_path};
pub use guard::Guard;
use mount::{MountPlan, check_reach, probe_mountns};
pub use mount::{TMP_PATH, WORKSPACE_PATH};
pub use proc::isolate;
use proc::probe_proc;
pub use report::{Mechanism, Report};
use rlimits::Rlimits;
use rules::{Rules, landlock_abi};
pub use spawner::{Lease, StartError, Started};
use sys::{kernel, write_pid};
pub use users::TaskUids;

/// Secrets under the home directory that commands may not read (besides `--deny-read`).
const HOME_SECRETS: &[&str] = &[
    ".ssh",
    ".aws",
    ".config/gcloud",
    ".azure",
    ".gnupg",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".config/gh",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials.toml",
];

/// Why the worker cannot hand out workspaces.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The state dir cannot be made (its caller words why).
    #[error("{0}")]
    Workspace(String),
    #[error("cannot create {0}: {1}")]
    Create(PathBuf, #[source] std::io::Error),
    #[error(transparent)]
    Reach(#[from] mount::Error),
    #[error(
        "cannot create the commands' mount point {WORKSPACE_PATH} ({0}), and this worker does not run commands without the mount namespace it found possible: create {WORKSPACE_PATH} as an empty directory, or start the worker with TETHER_WORKER_MOUNTNS=off to run commands at their workspace's real path"
    )]
    MountPoint(#[source] std::io::Error),
    #[error("--import-root {}: {why}", .root.display())]
    ImportRoot { root: PathBuf, why: String },
}

/// Makes `path` an empty directory (mode 0755) unless it is one already. Workers that start
/// at once on a fresh host race to make it; the one that finds it made by another has it
/// too, so that is no error.
fn make_mount_point(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o755).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if std::fs::symlink_metadata(path)?.is_dir() {
                Ok(())
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "it exists and is not a directory: remove it",
                ))
            }
        }
        Err(e) => Err(e),
    }
}

impl shared::exit::Classify for Error {
    /// Running again will not fix it: the state dir or the host must change.
    fn exit_code(&self) -> Option<shared::exit::ExitCode> {
        Some(shared::exit::ExitCode::Config)
    }
}

/// Why a command cannot be confined (and so is not started).
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("{}", EGRESS_UNAVAILABLE)]
    EgressUnavailable,
    #[error(
        "the brain's policy turns the network off for this call, but this worker cannot create network namespaces (see `worker doctor`)"
    )]
    NetworkOff,
    #[error(transparent)]
    User(#[from] users::Error),
    #[error(transparent)]
    Mount(#[from] mount::Error),
    #[error("cannot create the workspace's temp dir {0}: {1}")]
    TempDir(PathBuf, #[source] std::io::Error),
    #[error("cannot make the temp dir {0} private: {1}")]
    TempPrivate(PathBuf, #[source] std::io::Error),
    #[error("cannot create cgroup {0}: {1}")]
    Cgroup(PathBuf, #[source] std::io::Error),
    #[error(transparent)]
    Limits(#[from] sys::Error),
    #[error("cannot open {0}/cgroup.procs: {1}")]
    Join(PathBuf, #[source] std::io::Error),
    /// The Landlock ruleset cannot be had.
    #[error(transparent)]
    Landlock(#[from] rules::Error),
    #[error("cannot start a spawner: {0}")]
    Spawner(#[source] std::io::Error),
    #[error("cannot write {0}: {1}")]
    CallFile(PathBuf, #[source] std::io::Error),
}

/// Defaults when the brain's policy gives none.
pub const DEFAULT_MEMORY: u64 = 4 << 30;
pub const DEFAULT_PIDS: u32 = 512;
pub const DEFAULT_FILE_SIZE: u64 = 8 << 30;

/// The host's confinement mechanisms, probed once at start.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub report: Report,
    landlock: bool,
    cgroup: Option<Cgroups>,
    netns: bool,
    /// Each command gets a mount namespace with its workspace at [`WORKSPACE_PATH`].
    mountns: bool,
    /// The uids tasks' commands run as, one per workspace, when the worker is root.
    users: Option<TaskUids>,
    /// Serialises the allocation of task uids.
    allocating: std::sync::Arc<std::sync::Mutex<()>>,
    /// The seccomp filters every command is started under, when the host can install them.
    seccomp: Option<std::sync::Arc<seccomp::Filters>>,
    /// Paths commands may not read.
    denied: Vec<PathBuf>,
    /// The directories (resolved) below which the brain may import (`--import-root`).
    import_roots: Vec<PathBuf>,
    state_dir: PathBuf,
    /// Landlock rulesets by workspace, and the carved read roots they are built from.
    rules: Rules,
    /// Idle cgroup leaves from finished calls, reused to save a mkdir and rmdir per call.
    pool: std::sync::Arc<std::sync::Mutex<Vec<Leaves>>>,
    next_leaf: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Pre-confined spawners by workspace (none when `TETHER_WORKER_SPAWNER=off`).
    spawners: Option<std::sync::Arc<std::sync::Mutex<spawner::Pool>>>,
}

/// Why a call behind the egress proxy cannot run on this worker.
pub const EGRESS_UNAVAILABLE: &str = "this call's task reaches the network only through the egress proxy, and this worker cannot enforce it: it needs root for network namespaces and its sandbox on (see `worker doctor`)";

/// Whether commands are started by pre-confined spawners (`TETHER_WORKER_SPAWNER=off` starts
/// each one with its own fork and confinement, as a baseline or a way out).
fn spawners_wanted() -> bool {
    !std::env::var("TETHER_WORKER_SPAWNER").is_ok_and(|v| v == "off" || v == "0")
}

impl Sandbox {
    /// Finds out what this host can enforce. `deny_read` adds paths commands may not read.
    /// A root worker runs each task's commands as a uid of its own from `task_uids`.
    pub fn probe(state_dir: &Path, deny_read: &[PathBuf], task_uids: TaskUids) -> Self {
        Self::probe_as(state_dir, deny_read, task_uids, true)
    }

    /// What [`Sandbox::probe`] would find, changing nothing on the host (for `worker
    /// doctor`: a cgroup v2 worker does not move itself into its leaf).
    pub fn look(state_dir: &Path, deny_read: &[PathBuf], task_uids: TaskUids) -> Self {
        Self::probe_as(state_dir, deny_read, task_uids, false)
    }

    /// A set of cgroup leaves for a call: an idle one, or new ones.
    fn leaves(&self, cg: &Cgroups) -> Result<Leaves, ConfineError> {
        if let Some(l) = self.pool.locked().pop() {
            return Ok(l);
        }
        let n = self
            .next_leaf
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("tether-{}-{n}", std::process::id());
        let mk = |base: &Path| -> Result<PathBuf, ConfineError> {
            let path = base.join(&name);
            match std::fs::create_dir_all(&path) {
                Ok(()) => Ok(path),
                Err(e) => Err(ConfineError::Cgroup(path, e)),
            }
        };
        Ok(match cg.version {
            Version::V1 => Leaves {
                version: Version::V1,
                memory: mk(&cg.memory)?,
                pids: mk(&cg.pids)?,
                cpu: cg.cpu.as_ref().map(|c| mk(c)).transpose()?,
                written: (0, 0, -1),
            },
            Version::V2 => {
                let leaf = mk(&cg.memory)?;
                Leaves {
                    version: Version::V2,
                    pids: leaf.clone(),
                    cpu: cg.cpu.as_ref().map(|_| leaf.clone()),
                    memory: leaf,
                    // Unknown: every limit is written the first time.
                    written: (0, 0, 0),
                }
            }
        })
    }

    /// No confinement at all (`--no-sandbox`): commands run like any child of the worker.
    /// The hello then names no mechanism, so a brain that requires one refuses this worker.
    pub fn disabled(state_dir: &Path) -> Self {
        let names = [
            "landlock", "rlimits", "cgroup", "mountns", "proc", "netns", "egress", "user",
            "seccomp",
        ];
        Self {
            report: Report {
                mechanisms: names
                    .iter()
                    .map(|n| Mechanism {
                        name: n,
                        active: false,
                        detail: "off: the worker was started with --no-sandbox".into(),
                    })
                    .collect(),
            },
            landlock: false,
            cgroup: None,
            netns: false,
            mountns: false,
            users: None,
            allocating: Default::default(),
            seccomp: None,
            denied: Vec::new(),
            import_roots: Vec::new(),
            state_dir: state_dir.to_path_buf(),
            rules: Default::default(),
            pool: Default::default(),
            next_leaf: Default::default(),
            spawners: None,
        }
    }

    /// Clears what an earlier run of a worker on this state dir left behind when it died:
    /// per-call temp dirs, and cgroup leaves of worker processes that no longer exist
    /// (killing anything still inside). Call once at start, never from `worker doctor`.
    pub fn sweep(&self) {
        if let Ok(entries) = std::fs::read_dir(self.state_dir.join("tmp")) {
            for e in entries.flatten() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let Some(cg) = &self.cgroup else {
            return;
        };
        let me = std::process::id();
        for base in cg.bases() {
            let Ok(entries) = std::fs::read_dir(base) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(pid) = name
                    .strip_prefix("tether-")
                    .and_then(|r| r.split('-').next())
                    .and_then(|p| p.parse::<u32>().ok())
                else {
                    continue;
                };
                if pid == me || Path::new(&format!("/proc/{pid}")).exists() {
                    continue;
                }
                let leaf = e.path();
                empty_cgroup(&leaf, None);
                let _ = std::fs::remove_dir(&leaf);
            }
        }
    }

    /// Whether commands are confined at all.
    pub fn enabled(&self) -> bool {
        self.report.mechanisms.iter().any(|m| m.active)
    }

    /// Paths commands may not read (the worker's state, the home directory's secrets, and
    /// `--deny-read`).
    pub fn denied(&self) -> &[PathBuf] {
        &self.denied
    }

    /// Lets the brain import directories below `roots` (`--import-root`), each resolved now:
    /// one that is not an existing directory is refused, naming it.
    pub fn allow_imports(&mut self, roots: &[PathBuf]) -> Result<(), Error> {
        self.import_roots = roots
            .iter()
            .map(|r| match r.canonicalize() {
                Ok(real) if real.is_dir() => Ok(real),
                Ok(_) => Err(Error::ImportRoot {
                    root: r.clone(),
                    why: "not a directory".into(),
                }),
                Err(e) => Err(Error::ImportRoot {
                    root: r.clone(),
                    why: e.to_string(),
                }),
            })
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    /// Where the brain may import from: below the roots, never the state dir nor a path
    /// commands may not read (the state dir is named even when commands run unconfined).
    pub fn imports(&self) -> crate::sync::Imports {
        let mut denied = self.denied.clone();
        if !denied.contains(&self.state_dir) {
            denied.push(self.state_dir.clone());
        }
        if let Ok(real) = self.state_dir.canonicalize()
            && !denied.contains(&real)
        {
            denied.push(real);
        }
        crate::sync::Imports {
            roots: self.import_roots.clone(),
            denied,
        }
    }

    /// The uid/gid the commands of the workspace `ws` (an existing directory) run as, if
    /// different from the worker's: its task's own, allocated now if it has none.
    pub fn run_as_in(&self, ws: &Path) -> Result<Option<(u32, u32)>, ConfineError> {
        match &self.users {
            None => Ok(None),
            Some(users) => users
                .owner(ws, &self.allocating)
                .map(|uid| Some((uid, uid)))
                .map_err(ConfineError::User),
        }
    }

    /// [`Sandbox::run_as_in`] for the workspace `name` under `workspaces` (made if missing),
    /// for the worker's own writes there; `None` (files stay the worker's) when the name is
    /// not a workspace's or no user can be had, which the call itself then reports.
    pub fn owner(&self, workspaces: &Path, name: &str) -> Option<(u32, u32)> {
        self.users.as_ref()?;
        let ws = crate::state::workspace(workspaces, name).ok()?;
        self.run_as_in(&ws)
            .inspect_err(|e| tracing::warn!(error = %e, "no task user for a workspace"))
            .ok()
            .flatten()
    }

    /// Whether commands run as a user per task (a root worker), so that the worker's own
    /// writes in a workspace must be given to that user.
    pub fn has_task_users(&self) -> bool {
        self.users.is_some()
    }

    /// Gives a workspace to its task's user (allocated on first use).
    pub fn hand_over(&self, ws: &Path) {
        if let Err(e) = self.run_as_in(ws) {
            tracing::warn!(error = %e, "no task user for a workspace");
        }
    }

    /// Gives `path` itself to `owner` (a symlink is not followed).
    fn give(path: &Path, owner: Option<(u32, u32)>) {
        if let Some((uid, gid)) = owner {
            // As lchown: a symlink is changed itself, not followed.
            let _ = rustix::fs::chownat(
                rustix::fs::CWD,
                path,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            );
        }
    }

    /// Whether commands get a mount namespace with their workspace at [`WORKSPACE_PATH`].
    pub fn mountns(&self) -> bool {
        self.mountns
    }

    /// Makes the mount point [`WORKSPACE_PATH`] when it is missing (an empty directory owned
    /// by root; nothing is ever written in it on the host). A worker whose probe found mount
    /// namespaces possible and that cannot make it fails closed: it does not run commands
    /// without the namespace it reported.
    pub fn prepare(&mut self) -> Result<(), Error> {
        if !self.mountns {
            return Ok(());
        }
        make_mount_point(Path::new(WORKSPACE_PATH)).map_err(|e| {
            if let Some(m) = self
                .report
                .mechanisms
                .iter_mut()
                .find(|m| m.name == "mountns")
            {
                m.active = false;
                m.detail = format!("cannot create the mount point {WORKSPACE_PATH}: {e}");
            }
            Error::MountPoint(e)
        })
    }

    /// Proves that the command user can reach a workspace under `workspaces` (and its temp
    /// dir) as commands will see it: a child sets itself up as a command would (mount
    /// namespace, user) and checks it can enter, read and write there. `Ok` says where
    /// commands see their workspace; `Err` says what keeps them out and how to fix it.
    pub fn check_workspaces(&self, workspaces: &Path) -> Result<String, Error> {
        let name = format!(".check-{}", std::process::id());
        let ws = workspaces.join(&name);
        let tmp = self.state_dir.join("tmp").join(&name);
        let made = [&ws, &tmp].iter().try_for_each(|d| {
            std::fs::create_dir_all(d).map_err(|e| Error::Create(d.to_path_buf(), e))
        });
        // Any task uid reaches its workspace as any other does: the first one is tried.
        let probe_as = self.users.map(|u| (u.first, u.first));
        let who = match &self.users {
            Some(u) => format!("a user of their own per task (uids {u}, tried with the first)"),
            None => "the worker's own user".to_string(),
        };
        let r = made.and_then(|()| {
            Self::give(&ws, probe_as);
            Self::give(&tmp, probe_as);
            check_reach(&ws, &tmp, &self.state_dir, self.mountns, probe_as, &who)
                .map_err(Error::Reach)
        });
        let _ = std::fs::remove_dir(&ws);
        let _ = std::fs::remove_dir(&tmp);
        r
    }

    /// The workspace's temp dir (one per workspace, cleared when the worker starts, so the
    /// Landlock ruleset and a spawner, which name it, can be reused from call to call).
    fn workspace_tmp(
        &self,
        workspace: &Path,
        owner: Option<(u32, u32)>,
    ) -> Result<PathBuf, ConfineError> {
        let ws_name = workspace
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "default".into());
        let tmp = self.state_dir.join("tmp").join(&ws_name);
        // One left by an earlier task of that name, under another user, is not this one's.
        if let (Some((uid, _)), Ok(m)) = (owner, std::fs::symlink_metadata(&tmp))
            && std::os::unix::fs::MetadataExt::uid(&m) != uid
        {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        if !tmp.is_dir() {
            std::fs::create_dir_all(&tmp).map_err(|e| ConfineError::TempDir(tmp.clone(), e))?;
            // The mode first, while the worker still owns it.
            if owner.is_some() {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700))
                    .map_err(|e| ConfineError::TempPrivate(tmp.clone(), e))?;
            }
            Self::give(&tmp, owner);
        }
        Ok(tmp)
    }

    /// The call's memory, pids and CPU quota (µs per 100 ms, -1 for none), defaults filled in.
    fn cgroup_limits(limits: &proto::Limits) -> (u64, u32, i64) {
        let memory = if limits.memory_bytes == 0 {
            DEFAULT_MEMORY
        } else {
            limits.memory_bytes
        };
        let pids = if limits.pids == 0 {
            DEFAULT_PIDS
        } else {
            limits.pids
        };
        let quota: i64 = if limits.cpus > 0.0 {
            ((limits.cpus * 100_000.0) as i64).max(1000)
        } else {
            -1
        };
        (memory, pids, quota)
    }

    fn rlimits(&self, limits: &proto::Limits) -> Rlimits {
        let (memory, pids, _) = Self::cgroup_limits(limits);
        Rlimits {
            cpu: if limits.cpu_seconds == 0 {
                None
            } else {
                Some(limits.cpu_seconds)
            },
            // Address space: generous (runtimes reserve far more than they touch); memory is
            // bounded by the cgroup where there is one.
            address_space: if self.cgroup.is_some() {
                None
            } else {
                Some(memory.saturating_mul(4))
            },
            file_size: if limits.file_size_bytes == 0 {
                DEFAULT_FILE_SIZE
            } else {
                limits.file_size_bytes
            },
            // RLIMIT_NPROC counts every process of the user; only meaningful for a dedicated one.
            nproc: if self.users.is_some() && self.cgroup.is_none() {
                Some(pids as u64)
            } else {
                None
            },
        }
    }

    /// The environment the sandbox gives a command on top of the worker's: its temp dir,
    /// and a home and user name when it runs as a user of its own.
    fn command_env(&self, seen_tmp: &Path) -> Vec<(&'static str, std::ffi::OsString)> {
        let mut env = vec![("TMPDIR", seen_tmp.as_os_str().to_owned())];
        if self.users.is_some() {
            // The worker's home is not the command user's: give it one it can write. The
            // task's user has no entry in /etc/passwd; programs that ask the environment
            // (Python's getpass, pip) find this name.
            env.push(("HOME", seen_tmp.as_os_str().to_owned()));
            env.push(("USER", "tether-task".into()));
            env.push(("LOGNAME", "tether-task".into()));
        }
        env
    }

    /// Where a command sees `cwd` (a directory of `workspace`) and its temp dir `tmp`.
    fn seen(&self, workspace: &Path, cwd: &Path, tmp: &Path) -> (PathBuf, PathBuf) {
        if !self.mountns {
            return (cwd.to_path_buf(), tmp.to_path_buf());
        }
        let canon = workspace
            .canonicalize()
            .unwrap_or_else(|_| workspace.to_path_buf());
        let rel = cwd.strip_prefix(&canon).unwrap_or(Path::new(""));
        (Path::new(WORKSPACE_PATH).join(rel), PathBuf::from(TMP_PATH))
    }

    /// Sets a command up to run confined. The returned guard owns the call's cgroup and temp
    /// dir; keep it until the command and everything it started are gone. With `net` (a
    /// network namespace, see `crate::egress::Net`) the command joins that namespace instead
    /// of getting an empty one of its own.
    pub fn confine(
        &self,
        workspace: &Path,
        cwd: &Path,
        limits: &proto::Limits,
        net: Option<std::os::fd::RawFd>,
        cmd: &mut tokio::process::Command,
    ) -> Result<Guard, ConfineError> {
        if net.is_some() && !self.netns {
            return Err(ConfineError::EgressUnavailable);
        }
        if limits.network_off && !self.netns {
            return Err(ConfineError::NetworkOff);
        }
        let run_as = self.run_as_in(workspace)?;
        let tmp = self.workspace_tmp(workspace, run_as)?;
        let plan = if self.mountns {
            let canon = workspace
                .canonicalize()
                .unwrap_or_else(|_| workspace.to_path_buf());
            let rel = cwd.strip_prefix(&canon).unwrap_or(Path::new(""));
            Some(MountPlan::new(workspace, &tmp, &self.state_dir, rel)?)
        } else {
            None
        };
        let (_, seen_tmp) = self.seen(workspace, cwd, &tmp);
        for (k, v) in self.command_env(&seen_tmp) {
            cmd.env(k, v);
        }
        let mut guard = Guard::new(None, None, self.pool.clone());
        let (memory, pids, quota) = Self::cgroup_limits(limits);
        let mut procs: Vec<OwnedFd> = Vec::new();
        if let Some(cg) = &self.cgroup {
            let mut leaves = self.leaves(cg)?;
            leaves.set_limits(memory, pids, quota)?;
            for d in leaves.to_join(quota > 0) {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("cgroup.procs"))
                    .map_err(|e| ConfineError::Join(d.to_path_buf(), e))?;
                procs.push(f.into());
            }
            guard.oom_before = leaves.oom_kills();
            guard.pids_before = leaves.pids_refused();
            guard.memory_limit = memory;
            guard.pids_limit = pids;
            guard.leaves = Some(leaves);
        }
        let ruleset = if self.landlock {
            Some(
                self.rules
                    .ruleset_fd(&self.denied, workspace, &tmp)
                    .map_err(ConfineError::Landlock)?,
            )
        } else {
            None
        };
        let rl = self.rlimits(limits);
        guard.file_size = rl.file_size;
        guard.cpu_seconds = rl.cpu.unwrap_or(0);
        let netns = limits.network_off && net.is_none();
        let unshare = {
            use rustix::thread::UnshareFlags;
            let mut flags = UnshareFlags::empty();
            flags.set(UnshareFlags::NEWNET, netns);
            flags.set(UnshareFlags::NEWNS, plan.is_some());
            flags
        };
        let seccomp = self.seccomp.clone();
        // SAFETY: the closure runs in the child between fork and exec. It makes plain
        // syscalls on values prepared above (no locks held by other threads are taken: the
        // mutex is ours alone; the paths it passes are `&CStr`, so rustix allocates nothing),
        // and the Landlock call only issues prctl and a syscall. `net` stays open in the
        // caller until the command is spawned. Of the unshare flags only CLONE_FILES could
        // take descriptors from other threads, and there are none in the child.
        unsafe {
            cmd.pre_exec(move || {
                rustix::process::setsid()?;
                for fd in &procs {
                    write_pid(fd)?;
                }
                rl.apply()?;
                // A write past the file size limit fails with EFBIG ("File too large", which
                // the program reports) instead of killing the program silently, as Python
                // does for itself; the ignored disposition is kept across exec. (libc: rustix
                // sets dispositions only in its runtime module, for programs without libc.)
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                if let Some(fd) = net {
                    rustix::thread::move_into_link_name_space(
                        std::os::fd::BorrowedFd::borrow_raw(fd),
                        Some(rustix::thread::LinkNameSpaceType::Network),
                    )?;
                }
                if !unshare.is_empty() {
                    rustix::thread::unshare_unsafe(unshare)?;
                }
                // Mounts first: a Landlock-restricted process may not mount.
                if let Some(p) = &plan {
                    p.enter()?;
                }
                rustix::thread::set_no_new_privs(true)?;
                if let Some(fd) = &ruleset
                    && libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                // libc, not rustix: libc's setuid and setgid change every thread of the
                // process, rustix's set_thread_* only the calling one.
                if let Some((uid, gid)) = run_as
                    && (libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(gid) != 0
                        || libc::setuid(uid) != 0)
                {
                    return Err(std::io::Error::last_os_error());
                }
                // Last: the steps above need calls the filter refuses (setns, unshare, mount).
                if let Some(f) = &seccomp {
                    f.install()?;
                }
                Ok(())
            });
        }
        Ok(guard)
    }

    /// A pre-confined spawner for a call in `workspace` (a directory of it is `cwd`), with
    /// the call's limits written to its cgroup, and the request that starts `argv` with `env`
    /// there, encoded: an idle one, or one made now. `None` (the call runs the ordinary way) when
    /// spawners are off, when the workspace's spawner is busy with another call, when one
    /// could not be made lately, or when the request is too large for one.
    pub fn lease(
        &self,
        workspace: &Path,
        cwd: &Path,
        limits: &proto::Limits,
        argv: &[String],
        env: &[(std::ffi::OsString, std::ffi::OsString)],
    ) -> Option<(Lease, Vec<u8>)> {
        let pool = self.spawners.as_ref()?;
        if limits.network_off && !self.netns {
            return None;
        }
        let run_as = self.run_as_in(workspace).ok()?;
        let tmp = self.workspace_tmp(workspace, run_as).ok()?;
        let (seen_cwd, seen_tmp) = self.seen(workspace, cwd, &tmp);
        let mut env = env.to_vec();
        for (k, v) in self.command_env(&seen_tmp) {
            env.retain(|(k2, _)| k2 != k);
            env.push((k.into(), v));
        }
        let req = spawnd::Request {
            argv: argv.iter().map(Into::into).collect(),
            env,
            cwd: seen_cwd,
        };
        let payload = req.encode()?;
        let (memory, pids, quota) = Self::cgroup_limits(limits);
        let rl = self.rlimits(limits);
        let key = spawner::Key {
            workspace: workspace.to_path_buf(),
            network_off: limits.network_off,
            cpu_capped: quota > 0,
            rlimits: (rl.cpu, rl.address_space, rl.file_size, rl.nproc),
            ids: [spawner::dir_id(workspace), spawner::dir_id(&tmp)],
        };
        let (found, stale) = pool.locked().take(&key);
        if !stale.is_empty() {
            tokio::task::spawn_blocking(move || drop(stale));
        }
        let mut sp = match found {
            Some(sp) => sp,
            None => {
                // The spawner for this workspace is busy with another call (which keeps its
                // leaves to itself), or is being made: this call runs the ordinary way.
                if !pool.locked().begin(&key) {
                    return None;
                }
                let made = self.start_spawner(key.clone(), workspace, limits);
                let mut p = pool.locked();
                p.end(&key, made.is_ok());
                drop(p);
                match made {
                    Ok(sp) => sp,
                    Err(e) => {
                        tracing::warn!(error = %e, workspace = %workspace.display(), "cannot start a spawner; commands start the ordinary way for a while");
                        return None;
                    }
                }
            }
        };
        let g = &mut sp.guard;
        if let Some(leaves) = g.leaves.as_mut() {
            // The spawner itself is one of the leaf's processes.
            if leaves.set_limits(memory, pids + 1, quota).is_err() {
                pool.locked().release(&sp.key);
                tokio::task::spawn_blocking(move || drop(sp));
                return None;
            }
            // The counters as the last call left them, or read now.
            (g.oom_before, g.pids_before) = g
                .counters_after
                .take()
                .unwrap_or_else(|| (leaves.oom_kills(), leaves.pids_refused()));
            g.memory_limit = memory;
            // Nothing is known of this call's leftovers until its end is checked.
            *g.emptied.get_mut() = false;
            g.pids_limit = pids;
        }
        g.file_size = rl.file_size;
        g.cpu_seconds = rl.cpu.unwrap_or(0);
        Some((Lease::new(sp, pool.clone()), payload))
    }

    fn start_spawner(
        &self,
        key: spawner::Key,
        workspace: &Path,
        limits: &proto::Limits,
    ) -> Result<spawner::Spawner, ConfineError> {
        let mut cmd = tokio::process::Command::new("/proc/self/exe");
        // Named for `ps`, where "/proc/self/exe" would say nothing.
        cmd.arg0("tether-spawner")
            .args(spawnd::args())
            .env_clear()
            .current_dir(workspace)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true);
        let guard = self.confine(workspace, workspace, limits, None, &mut cmd)?;
        // SAFETY: plain getter.
        let uid = self
            .run_as_in(workspace)?
            .map_or_else(|| rustix::process::geteuid().as_raw(), |(u, _)| u);
        spawner::Spawner::start(cmd, guard, key, uid).map_err(ConfineError::Spawner)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Only the last clone tidies up: the idle spawners (their leaves go back to the
        // pool), then the idle leaves.
        if let Some(sp) = &self.spawners
            && std::sync::Arc::strong_count(sp) == 1
        {
            let idle = sp.locked().drain();
            drop(idle);
        }
        if std::sync::Arc::strong_count(&self.pool) == 1 {
            for leaves in self.pool.locked().drain(..) {
                for leaf in leaves.all() {
                    let _ = std::fs::remove_dir(leaf);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_reports_every_mechanism() {
        let d = tempfile::tempdir().unwrap();
        let s = Sandbox::look(d.path(), &[], TaskUids::default());
        let names: Vec<&str> = s.report.mechanisms.iter().map(|m| m.name).collect();
        for n in [
            "landlock", "rlimits", "cgroup", "mountns", "proc", "netns", "user", "seccomp",
        ] {
            assert!(names.contains(&n), "{names:?}");
        }
        assert!(s.report.render().lines().count() >= 5);
    }

    /// Workers started at once on a fresh host all make the mount point: each must find it
    /// made (by itself or another), none may take the other's mkdir for "no mount namespace".
    #[test]
    fn workers_racing_to_make_the_mount_point_all_have_it() {
        for round in 0..20 {
            let d = tempfile::tempdir().unwrap();
            let point = d.path().join("workspace");
            let go = std::sync::Barrier::new(8);
            let results: Vec<std::io::Result<()>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..8)
                    .map(|_| {
                        s.spawn(|| {
                            go.wait();
                            make_mount_point(&point)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for r in &results {
                assert!(r.is_ok(), "round {round}: {results:?}");
            }
            assert!(point.is_dir());
        }
        // A file where the mount point must be is refused, saying so.
        let d = tempfile::tempdir().unwrap();
        let point = d.path().join("workspace");
        std::fs::write(&point, "x").unwrap();
        let e = make_mount_point(&point).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
    }
}
