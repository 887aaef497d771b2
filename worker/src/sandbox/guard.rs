//! A confined call's cgroup leaves and temp dir, held while the command runs: kills what is
//! left in the cgroup, says which limit ended the command, and gives the leaves back.

use shared::locks::Lock;
use std::path::PathBuf;

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
}

impl Guard {
    /// Kills every process in the call's cgroup (catches children that left the session).
    /// Returns whether the cgroup is empty now.
    pub fn kill_all(&self) -> bool {
        let Some(leaves) = &self.leaves else {
            return true;
        };
        for leaf in leaves.all() {
            if !empty_cgroup(leaf, self.spare) {
                return false;
            }
        }
        true
    }

    /// Whether the kernel's OOM killer acted in this call's memory cgroup, with the limit.
    pub fn oom_killed(&self) -> Option<u64> {
        let leaves = self.leaves.as_ref()?;
        (leaves.oom_kills() > self.oom_before).then_some(self.memory_limit)
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
        if let Some(limit) = self.oom_killed() {
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
        let refused = self
            .leaves
            .as_ref()
            .map(|l| l.pids_refused().saturating_sub(self.pids_before))
            .unwrap_or(0);
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
