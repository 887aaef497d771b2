//! The cgroup v1 side of confinement: where our controllers are, one call's leaves (memory,
//! pids, cpu), their counters (OOM kills, refused forks), and emptying a leaf.

use std::path::{Path, PathBuf};

use super::report::{Mechanism, Report};
use super::sys::read;

/// Where the cgroup v1 controllers we use live, and our own place in each.
#[derive(Debug, Clone)]
pub(super) struct CgroupV1 {
    pub(super) memory: PathBuf,
    pub(super) pids: PathBuf,
    pub(super) cpu: Option<PathBuf>,
}

/// Most idle cgroup leaves kept.
pub(super) const POOL_MAX: usize = 16;

/// One call's cgroup leaves (memory, pids, and cpu where mounted).
#[derive(Debug)]
pub(super) struct Leaves {
    pub(super) memory: PathBuf,
    pub(super) pids: PathBuf,
    pub(super) cpu: Option<PathBuf>,
    /// Limits last written here (memory, pids, cpu quota), to skip rewriting equal values.
    pub(super) written: (u64, u32, i64),
}

impl Leaves {
    pub(super) fn all(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.memory, &self.pids]
            .into_iter()
            .chain(self.cpu.as_ref())
    }
}

pub(super) fn oom_kills(memory_leaf: &Path) -> u64 {
    read(memory_leaf.join("memory.oom_control"))
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("oom_kill "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// How many forks the pids cgroup refused (`max` in `pids.events`).
pub(super) fn pids_refused(pids_leaf: &Path) -> u64 {
    read(pids_leaf.join("pids.events"))
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("max "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Our cgroup v1 path for a controller, from /proc/self/cgroup.
pub(super) fn own_cgroup(controller: &str) -> Option<PathBuf> {
    let text = read("/proc/self/cgroup")?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        if ctrls.split(',').any(|c| c == controller) {
            let base = Path::new("/sys/fs/cgroup").join(controller);
            return Some(base.join(path.trim_start_matches('/')));
        }
    }
    None
}

pub(super) fn probe_cgroup(report: &mut Report) -> Option<CgroupV1> {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        report.mechanisms.push(Mechanism {
            name: "cgroup",
            active: false,
            detail: "cgroup v2 host: this worker build manages v1 controllers only; memory, pids and CPU are bounded by rlimits alone".into(),
        });
        return None;
    }
    let memory = own_cgroup("memory");
    let pids = own_cgroup("pids");
    match (memory, pids) {
        (Some(memory), Some(pids)) => {
            // Can we make a child cgroup? (Root, or a delegated subtree.)
            let test = memory.join(format!("tether-probe-{}", std::process::id()));
            match std::fs::create_dir(&test) {
                Ok(()) => {
                    let _ = std::fs::remove_dir(&test);
                    let cpu = own_cgroup("cpu").filter(|c| c.join("cpu.cfs_quota_us").exists());
                    report.mechanisms.push(Mechanism {
                        name: "cgroup",
                        active: true,
                        detail: format!(
                            "v1 memory and pids{} controllers under {}",
                            if cpu.is_some() { ", cpu" } else { "" },
                            memory.display()
                        ),
                    });
                    Some(CgroupV1 { memory, pids, cpu })
                }
                Err(e) => {
                    report.mechanisms.push(Mechanism {
                        name: "cgroup",
                        active: false,
                        detail: format!("cannot create a cgroup under {} ({e}): run the worker as root or delegate a subtree", memory.display()),
                    });
                    None
                }
            }
        }
        _ => {
            report.mechanisms.push(Mechanism {
                name: "cgroup",
                active: false,
                detail: "no cgroup v1 memory and pids controllers are mounted".into(),
            });
            None
        }
    }
}

/// SIGKILLs everything in a cgroup until it is empty (new processes may appear while we
/// kill). Returns whether it emptied within about 100 ms.
pub(super) fn empty_cgroup(leaf: &Path) -> bool {
    for _ in 0..50 {
        let pids: Vec<i32> = read(leaf.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.is_empty() {
            return true;
        }
        for p in pids {
            // SAFETY: plain syscall.
            unsafe {
                libc::kill(p, libc::SIGKILL);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    false
}
