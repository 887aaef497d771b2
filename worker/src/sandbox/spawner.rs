//! The worker's side of the pre-confined spawners: one process per workspace (and per set of
//! limits that must be fixed at confinement: network, rlimits, whether the CPU is capped)
//! confined once like a command, which then starts that workspace's commands with
//! `posix_spawn` and nothing to do between fork and exec (`spawnd` is its side).
//!
//! A spawner serves one call at a time, so its cgroup leaves are that call's alone: the
//! call's memory, pids and CPU limits are written there before it starts, its counters read
//! around it, and everything in the leaves but the spawner is killed when it ends. A call that
//! finds no idle spawner runs the ordinary way (fork, confine, exec) while one is made for the
//! next call. A spawner is retired after [`SPAWNER_TTL`] (its Landlock rules were carved from
//! the tree as it was then), when its workspace or temp dir is replaced, or when it misbehaves.

use shared::locks::Lock;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, Interest};
use tokio::net::unix::pipe;

use super::guard::Guard;
#[cfg(doc)]
use super::spawnd::Request;
use super::spawnd::{self, EXITED, FAILED, STARTED};

/// How long a spawner serves before it is replaced.
pub const SPAWNER_TTL: Duration = Duration::from_secs(60);
/// Most idle spawners kept.
const IDLE_MAX: usize = 8;
/// How long to wait for a spawner's answer to a request.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// What a spawner's confinement fixes: calls that differ in any of it need another spawner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Key {
    pub(super) workspace: PathBuf,
    pub(super) network_off: bool,
    pub(super) cpu_capped: bool,
    /// CPU seconds, address space, file size, processes.
    pub(super) rlimits: (Option<u64>, Option<u64>, u64, Option<u64>),
    /// The workspace's and temp dir's (device, inode): its mounts and Landlock rules hold
    /// those directories, not their names.
    pub(super) ids: [(u64, u64); 2],
}

/// A running spawner.
pub struct Spawner {
    /// The spawner process (killed when dropped).
    child: tokio::process::Child,
    sock: tokio::net::UnixStream,
    pid: i32,
    /// The user its commands run as.
    uid: u32,
    /// Its cgroup leaves (sparing it when emptied) and the current call's limits.
    pub(super) guard: Guard,
    born: Instant,
    pub(super) key: Key,
    /// A reply read in part.
    reply: [u8; 8],
    filled: usize,
    /// Serves no more calls: it died, answered out of turn, or a call was left unfinished.
    broken: bool,
}

impl Spawner {
    /// Starts a spawner from `cmd`, already confined (its guard is `guard`), handing it the
    /// socket it reads requests from at descriptor 3.
    pub(super) fn start(
        mut cmd: tokio::process::Command,
        mut guard: Guard,
        key: Key,
        uid: u32,
    ) -> std::io::Result<Self> {
        let (mine, theirs) = std::os::unix::net::UnixStream::pair()?;
        let fd = theirs.as_raw_fd();
        // SAFETY: runs between fork and exec after the sandbox's own step; dup2 and fcntl
        // are async-signal-safe, and `fd` stays open until the spawner is spawned.
        unsafe {
            cmd.pre_exec(move || {
                if fd == spawnd::FD {
                    let fd = BorrowedFd::borrow_raw(fd);
                    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
                } else {
                    // dup2 stays on libc: rustix's wants the target as an OwnedFd, which
                    // descriptor 3 is not here.
                    if libc::dup2(fd, spawnd::FD) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        drop(theirs);
        let pid = child.id().unwrap_or(0) as i32;
        guard.spare = Some(pid);
        mine.set_nonblocking(true)?;
        Ok(Self {
            child,
            sock: tokio::net::UnixStream::from_std(mine)?,
            pid,
            uid,
            guard,
            born: Instant::now(),
            key,
            reply: [0; 8],
            filled: 0,
            broken: false,
        })
    }

    /// Whether this spawner may serve a call with `key` now.
    pub(super) fn fits(&self, key: &Key) -> bool {
        !self.broken && self.born.elapsed() < SPAWNER_TTL && self.key == *key
    }

    /// Reads one reply; cancel-safe (a partial reply is kept for the next call).
    async fn read_reply(&mut self) -> std::io::Result<(u32, i32)> {
        while self.filled < self.reply.len() {
            let n = self.sock.read(&mut self.reply[self.filled..]).await?;
            if n == 0 {
                self.broken = true;
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the spawner ended",
                ));
            }
            self.filled += n;
        }
        self.filled = 0;
        let kind = u32::from_le_bytes(self.reply[..4].try_into().unwrap_or_default());
        let value = i32::from_le_bytes(self.reply[4..].try_into().unwrap_or_default());
        Ok((kind, value))
    }

    async fn send(&mut self, frame: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        let mut sent = 0;
        while sent < frame.len() {
            self.sock.writable().await?;
            let attach = if sent == 0 { fds } else { &[] };
            match self.sock.try_io(Interest::WRITABLE, || {
                spawnd::send_with_fds(self.sock.as_fd(), &frame[sent..], attach)
            }) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        // The spawner goes with whatever is left in its leaves.
        let _ = self.child.start_kill();
        self.guard.spare = None;
    }
}

/// Idle spawners, the keys of those being made or lent, and when one last failed to start.
#[derive(Default)]
pub struct Pool {
    idle: Vec<Spawner>,
    busy: Vec<Key>,
    failed: Option<Instant>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("idle", &self.idle.len())
            .field("busy", &self.busy.len())
            .finish()
    }
}

impl Pool {
    /// An idle spawner for `key`, if there is one; drops the expired ones it passes (they
    /// are returned to be dropped outside the lock).
    pub(super) fn take(&mut self, key: &Key) -> (Option<Spawner>, Vec<Spawner>) {
        let (live, stale): (Vec<_>, Vec<_>) = std::mem::take(&mut self.idle)
            .into_iter()
            .partition(|s| !s.broken && s.born.elapsed() < SPAWNER_TTL);
        self.idle = live;
        let found = self
            .idle
            .iter()
            .position(|s| s.fits(key))
            .map(|i| self.idle.swap_remove(i));
        if found.is_some() {
            self.busy.push(key.clone());
        }
        (found, stale)
    }

    /// Marks a spawner for `key` as being made, unless one is made or lent already, or one
    /// failed to start less than [`SPAWNER_TTL`] ago.
    pub(super) fn begin(&mut self, key: &Key) -> bool {
        if self.busy.contains(key) || self.failed.is_some_and(|t| t.elapsed() < SPAWNER_TTL) {
            return false;
        }
        self.busy.push(key.clone());
        true
    }

    /// The spawner for `key` begun is made (and lent) or failed.
    pub(super) fn end(&mut self, key: &Key, made: bool) {
        if !made {
            self.release(key);
            self.failed = Some(Instant::now());
        }
    }

    /// A spawner for `key` is no longer made or lent.
    pub(super) fn release(&mut self, key: &Key) {
        if let Some(i) = self.busy.iter().position(|k| k == key) {
            self.busy.swap_remove(i);
        }
    }

    /// Keeps `s` for later; hands it back when there is no room.
    pub(super) fn keep(&mut self, s: Spawner) -> Option<Spawner> {
        if self.idle.len() >= IDLE_MAX {
            return Some(s);
        }
        self.idle.push(s);
        None
    }

    /// Every idle spawner, to be dropped.
    pub(super) fn drain(&mut self) -> Vec<Spawner> {
        std::mem::take(&mut self.idle)
    }
}

/// Why a spawner could not start a command.
#[derive(Debug)]
pub enum StartError {
    /// The command itself could not start (as a failed exec: not found, not executable).
    Refused(std::io::Error),
    /// The spawner is gone or misbehaved; the command was not started and may be started
    /// the ordinary way.
    Lost(String),
    /// The spawner ended or misbehaved after it had the request: the command may have run,
    /// so it is not started again; the call ends with this error.
    Unsure(String),
}

/// A spawner lent to one call; given back (or retired) when dropped. Dropping may wait a
/// little for leftovers in its cgroup to die: drop it off the async runtime.
pub struct Lease {
    spawner: Option<Box<Spawner>>,
    pool: Arc<Mutex<Pool>>,
    /// A command started and its exit not read yet.
    running: bool,
}

/// The command a spawner started: its pid (also its process group) and its output.
pub struct Started {
    pub pid: i32,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
}

fn pipe_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// The real uid of `pid` from /proc, while it can still be read.
fn owner_of(pid: i32) -> Option<u32> {
    let status = super::sys::read(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

impl Lease {
    pub(super) fn new(spawner: Spawner, pool: Arc<Mutex<Pool>>) -> Self {
        Self {
            spawner: Some(Box::new(spawner)),
            pool,
            running: false,
        }
    }

    /// The call's cgroup guard (the spawner's leaves, sparing the spawner).
    pub fn guard(&self) -> Option<&Guard> {
        self.spawner.as_ref().map(|s| &s.guard)
    }

    /// The spawner's pid.
    pub fn spawner_pid(&self) -> i32 {
        self.spawner.as_ref().map(|s| s.pid).unwrap_or(0)
    }

    /// Starts the command of an encoded request (its frame, see [`Request::encode`]).
    pub async fn start(&mut self, frame: &[u8]) -> Result<Started, StartError> {
        let lost = |why: &str| StartError::Lost(why.to_string());
        let sp = self.spawner.as_mut().ok_or_else(|| lost("no spawner"))?;
        let (out_r, out_w) = pipe_pair().map_err(StartError::Refused)?;
        let (err_r, err_w) = pipe_pair().map_err(StartError::Refused)?;
        // Until the request is handed over, the command has not started: a spawner found
        // dead, or one that cannot take the request, means it may be started another way.
        // After that it may have started (and, say, killed the spawner before it could say
        // so), so it is never started again.
        if !matches!(sp.child.try_wait(), Ok(None)) {
            sp.broken = true;
            return Err(lost("the spawner had ended"));
        }
        let sent = tokio::time::timeout(
            START_TIMEOUT,
            sp.send(frame, &[out_w.as_fd(), err_w.as_fd()]),
        )
        .await;
        drop((out_w, err_w));
        if !matches!(sent, Ok(Ok(()))) {
            sp.broken = true;
            return Err(lost("the spawner did not take the request"));
        }
        let unsure = |why: &str| {
            StartError::Unsure(format!(
                "the command's spawner {why} before it said whether the command started; it was not started again"
            ))
        };
        let (kind, value) = match tokio::time::timeout(START_TIMEOUT, sp.read_reply()).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => {
                sp.broken = true;
                return Err(unsure("ended"));
            }
            Err(_) => {
                sp.broken = true;
                return Err(unsure("did not answer in time"));
            }
        };
        match kind {
            FAILED => Err(StartError::Refused(std::io::Error::from_raw_os_error(
                value,
            ))),
            STARTED if value > 1 && value != sp.pid => {
                self.running = true;
                // A live process of another user is no command of ours: not one to signal.
                if owner_of(value).is_some_and(|u| u != sp.uid) {
                    sp.broken = true;
                    return Err(unsure("named a process that is not a command's"));
                }
                let rx =
                    |fd: OwnedFd| pipe::Receiver::from_owned_fd(fd).map_err(StartError::Refused);
                Ok(Started {
                    pid: value,
                    stdout: rx(out_r)?,
                    stderr: rx(err_r)?,
                })
            }
            _ => {
                sp.broken = true;
                Err(unsure("answered out of turn"))
            }
        }
    }

    /// Waits for the started command to exit; cancel-safe.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        let sp = self
            .spawner
            .as_mut()
            .ok_or_else(|| std::io::Error::other("no spawner"))?;
        let r = sp.read_reply().await;
        match r {
            Ok((EXITED, raw)) => {
                self.running = false;
                Ok(std::process::ExitStatus::from_raw(raw))
            }
            Ok(_) => {
                sp.broken = true;
                Err(std::io::Error::other("the spawner answered out of turn"))
            }
            Err(e) => {
                sp.broken = true;
                Err(std::io::Error::other(format!(
                    "the command's spawner ended before it reported the exit status ({e}); the command was killed"
                )))
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(mut sp) = self.spawner.take() else {
            return;
        };
        if self.running {
            sp.broken = true;
        }
        // Whatever the call left behind goes (unless the call's end found nothing left);
        // the spawner stays only if that worked.
        if !sp.guard.was_emptied() && !sp.guard.kill_all() {
            sp.broken = true;
        }
        let mut pool = self.pool.locked();
        pool.release(&sp.key);
        if sp.broken || sp.born.elapsed() >= SPAWNER_TTL {
            drop(pool);
            return;
        }
        let back = pool.keep(*sp);
        drop(pool);
        drop(back);
    }
}

/// The (device, inode) of a directory, or zeros when it cannot be read.
pub(super) fn dir_id(p: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p)
        .map(|m| (m.dev(), m.ino()))
        .unwrap_or((0, 0))
}
