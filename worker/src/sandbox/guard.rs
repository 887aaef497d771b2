//! A confined call's cgroup leaves and temp dir, held while the command runs: kills what is
//! left in the cgroup, says which limit ended the command, and gives the leaves back.

use shared::locks::Lock;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::cgroup::{Leaves, POOL_MAX, empty_cgroup};

/// A confined call's cgroup and temp dir.
pub struct Guard {
    pub(super) tmp: Option<PathBuf>,
    pub(super) leaves: Option<Leaves>,
    /// The memory leaf's OOM-kill count and the pids leaf's refused forks before the call
    /// (leaves are reused).
    pub(super) oom_before: u64,
    pub(super) pids_before: u64,
    /// The limits the call ran under (0: none).
    pub(super) memory_limit: u64,
    pub(super) pids_limit: u32,
    pub(super) file_size: u64,
    pub(super) cpu_seconds: u64,
    pub(super) pool: std::sync::Arc<std::sync::Mutex<Vec<Leaves>>>,
    /// A process [`Guard::kill_all`] leaves alive: the spawner whose leaves these are.
    pub(super) spare: Option<i32>,
    /// Whether the last [`Guard::kill_all`] found the leaves empty (but for the spawner):
    /// until a spawner starts another command nothing can enter them, so a spawner given
    /// back need not be checked again.
    pub(super) emptied: AtomicBool,
    /// The leaves' counters (OOM kills, refused forks) as read by [`Guard::limit_hit`] once
    /// they were emptied: the next call's counters before it, without reading them again.
    pub(super) counters_after: OnceLock<(u64, u64)>,
}

impl Guard {
    /// Kills every process in the call's cgroup (catches children that left the session).
    /// Returns whether the cgroup is empty now.
    pub fn kill_all(&self) -> bool {
        let empty = match &self.leaves {
            None => true,
            Some(leaves) => leaves.all().all(|leaf| empty_cgroup(leaf, self.spare)),
        };
        self.emptied.store(empty, Ordering::Release);
        empty
    }

    /// Whether the last [`Guard::kill_all`] left the leaves empty.
    pub(super) fn was_emptied(&self) -> bool {
        self.emptied.load(Ordering::Acquire)
    }

    /// A guard over `leaves` (none: no cgroup) and the call's temp dir.
    pub(super) fn new(
        tmp: Option<PathBuf>,
        leaves: Option<Leaves>,
        pool: std::sync::Arc<std::sync::Mutex<Vec<Leaves>>>,
    ) -> Self {
        Self {
            tmp,
            leaves,
            oom_before: 0,
            pids_before: 0,
            memory_limit: 0,
            pids_limit: 0,
            file_size: 0,
            cpu_seconds: 0,
            pool,
            spare: None,
            emptied: AtomicBool::new(false),
            counters_after: OnceLock::new(),
        }
    }

    /// The leaves' OOM kills and refused forks now; kept for the next call when the leaves
    /// are empty.
    fn counters(&self) -> Option<(u64, u64)> {
        let leaves = self.leaves.as_ref()?;
        let now = (leaves.oom_kills(), leaves.pids_refused());
        if self.was_emptied() {
            let _ = self.counters_after.set(now);
        }
        Some(now)
    }

    /// Which limit ended or hampered the command, in words, from how it ended (`code`,
    /// `signal`), whether its output reported a write that was too large (`efbig`: commands
    /// ignore SIGXFSZ, so such writes fail with "File too large"), and the cgroup's counters.
    /// A shell reports a child killed by signal N as exit code 128 + N, so those codes count
    /// too.
    pub fn limit_hit(&self, code: Option<i32>, signal: Option<i32>, efbig: bool) -> Option<String> {
        let by = |sig: i32| signal == Some(sig) || code == Some(128 + sig);
        let how = |sig: i32| {
            if signal == Some(sig) {
                String::new()
            } else {
                format!(
                    " (a process it ran died of signal {sig}; exit code {})",
                    128 + sig
                )
            }
        };
        let (oom_kills, pids_refused) = self.counters().unwrap_or_default();
        if oom_kills > self.oom_before {
            let limit = self.memory_limit;
            return Some(format!(
                "killed: memory limit of {} exceeded",
                shared::human_bytes(limit)
            ));
        }
        if self.file_size > 0 && efbig {
            return Some(format!(
                "file size limit of {} exceeded: a write or truncate past it failed (\"File too large\"); no file may grow past it",
                shared::human_bytes(self.file_size)
            ));
        }
        if self.file_size > 0 && by(libc::SIGXFSZ) {
            return Some(format!(
                "killed: file size limit of {} exceeded{}; no file may grow past it",
                shared::human_bytes(self.file_size),
                how(libc::SIGXFSZ)
            ));
        }
        if self.cpu_seconds > 0 && by(libc::SIGXCPU) {
            return Some(format!(
                "killed: CPU time limit of {} exceeded{}",
                humantime::format_duration(std::time::Duration::from_secs(self.cpu_seconds)),
                how(libc::SIGXCPU)
            ));
        }
        let refused = pids_refused.saturating_sub(self.pids_before);
        if refused > 0 {
            return Some(format!(
                "process limit of {} reached: {refused} attempt(s) to start a process failed",
                self.pids_limit
            ));
        }
        None
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.spare = None;
        let empty = self.kill_all();
        if let Some(leaves) = self.leaves.take() {
            let mut pool = self.pool.locked();
            if empty && pool.len() < POOL_MAX {
                pool.push(leaves);
            } else {
                drop(pool);
                for leaf in leaves.all() {
                    let _ = std::fs::remove_dir(leaf);
                }
            }
        }
        if let Some(t) = self.tmp.take() {
            let _ = std::fs::remove_dir_all(t);
        }
    }
}
