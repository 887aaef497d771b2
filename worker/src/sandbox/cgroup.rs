//! The cgroup side of confinement, v1 and v2: where our controllers are, one call's leaves
//! (memory, pids, cpu: one directory per controller in v1, one directory in v2), the limits
//! written there, their counters (OOM kills, refused forks), and emptying a leaf. Finding and
//! preparing a v2 subtree is `cgroup_v2`.

use std::path::{Path, PathBuf};

use super::cgroup_v2::{self, Hierarchy};
use super::report::{Mechanism, Report};
use super::sys::{self, read, write};

/// Which cgroup version the leaves are made in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    V1,
    V2,
}

/// Where the controllers we use live, and our own place in each (in v2 the three are one
/// directory, `cpu` there when the cpu controller was handed to us).
#[derive(Debug, Clone)]
pub(super) struct Cgroups {
    pub(super) version: Version,
    pub(super) memory: PathBuf,
    pub(super) pids: PathBuf,
    pub(super) cpu: Option<PathBuf>,
}

impl Cgroups {
    /// The directories leaves are made under, each once.
    pub(super) fn bases(&self) -> Vec<&PathBuf> {
        let mut v = vec![&self.memory];
        for b in [Some(&self.pids), self.cpu.as_ref()].into_iter().flatten() {
            if !v.contains(&b) {
                v.push(b);
            }
        }
        v
    }
}

/// Removes the leaves an earlier worker left behind under `base` (`tether-<pid>-<n>` of a pid
/// that is gone: a worker killed with SIGKILL cannot tidy up). A leaf still holding a process
/// is not empty and stays; so do this process's and a live one's. How many went.
pub(super) fn sweep_stale(base: &Path) -> usize {
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    let mut gone = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("tether-"))
            .and_then(|rest| rest.split_once('-'))
            .filter(|(_, n)| n.parse::<u64>().is_ok())
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == own || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) && std::fs::remove_dir(e.path()).is_ok() {
            gone += 1;
        }
    }
    gone
}

/// Most idle cgroup leaves kept.
pub(super) const POOL_MAX: usize = 16;

/// One call's cgroup leaves (memory, pids, and cpu where mounted).
#[derive(Debug)]
pub(super) struct Leaves {
    pub(super) version: Version,
    pub(super) memory: PathBuf,
    pub(super) pids: PathBuf,
    pub(super) cpu: Option<PathBuf>,
    /// Limits last written here (memory, pids, cpu quota), to skip rewriting equal values.
    pub(super) written: (u64, u32, i64),
}

impl Leaves {
    /// Each leaf directory once.
    pub(super) fn all(&self) -> impl Iterator<Item = &PathBuf> {
        let v1 = self.version == Version::V1;
        [
            Some(&self.memory),
            v1.then_some(&self.pids),
            self.cpu.as_ref().filter(|_| v1),
        ]
        .into_iter()
        .flatten()
    }

    /// The directories a command joins: in v1 the cpu leaf only when the CPU is capped
    /// (joining costs a little per controller); in v2 the one leaf.
    pub(super) fn to_join(&self, capped: bool) -> Vec<&PathBuf> {
        match self.version {
            Version::V1 if capped => self.all().collect(),
            Version::V1 => vec![&self.memory, &self.pids],
            Version::V2 => vec![&self.memory],
        }
    }

    /// Writes the limits that differ from the last ones written here (`cpu_quota`: µs per
    /// 100 ms period, or -1 for none).
    pub(super) fn set_limits(
        &mut self,
        memory: u64,
        pids: u32,
        cpu_quota: i64,
    ) -> Result<(), sys::Error> {
        let (m0, p0, c0) = self.written;
        match self.version {
            Version::V1 => {
                if m0 != memory {
                    // memory+swap may never be below memory: raise memsw first, lower it
                    // last. Without swap accounting that file is absent; the memory limit
                    // still holds.
                    let memsw = self.memory.join("memory.memsw.limit_in_bytes");
                    if memory > m0 {
                        let _ = std::fs::write(&memsw, memory.to_string());
                    }
                    write(
                        &self.memory.join("memory.limit_in_bytes"),
                        &memory.to_string(),
                    )?;
                    let _ = std::fs::write(&memsw, memory.to_string());
                }
                if p0 != pids {
                    write(&self.pids.join("pids.max"), &pids.to_string())?;
                }
                if let Some(cl) = &self.cpu
                    && c0 != cpu_quota
                {
                    write(&cl.join("cpu.cfs_period_us"), "100000")?;
                    write(&cl.join("cpu.cfs_quota_us"), &cpu_quota.to_string())?;
                }
            }
            Version::V2 => {
                let changed = [m0 != memory, m0 != memory, p0 != pids, c0 != cpu_quota];
                for ((file, value), changed) in cgroup_v2::limit_files(memory, pids, cpu_quota)
                    .into_iter()
                    .zip(changed)
                {
                    if !changed || (file == "cpu.max" && self.cpu.is_none()) {
                        continue;
                    }
                    match write(&self.memory.join(file), &value) {
                        // No swap controller (swap accounting off): there is no swap to use.
                        Err(_) if file == "memory.swap.max" => {}
                        r => r?,
                    }
                }
            }
        }
        self.written = (memory, pids, cpu_quota);
        Ok(())
    }

    /// OOM kills counted here so far.
    pub(super) fn oom_kills(&self) -> u64 {
        let file = match self.version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        };
        cgroup_v2::counter(&self.memory.join(file), "oom_kill")
    }

    /// Forks refused here so far (`max` in `pids.events`, in v1 and v2 alike).
    pub(super) fn pids_refused(&self) -> u64 {
        cgroup_v2::counter(&self.pids.join("pids.events"), "max")
    }
}

/// Our cgroup v1 path for a controller, from /proc/self/cgroup.
pub(super) fn own_cgroup(controller: &str) -> Option<PathBuf> {
    let text = read("/proc/self/cgroup")?;
    let path = v1_path(&text, controller)?;
    let base = Path::new("/sys/fs/cgroup").join(controller);
    Some(base.join(path.trim_start_matches('/')))
}

/// The cgroup v1 path of `controller` in `/proc/self/cgroup`'s text, if it has one.
pub(crate) fn v1_path<'a>(proc_self_cgroup: &'a str, controller: &str) -> Option<&'a str> {
    proc_self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        ctrls.split(',').any(|c| c == controller).then_some(path)
    })
}

/// Finds the controllers on this host and says what is enforced. `commit` (a worker that
/// will run commands, not `worker doctor`) lets a v2 worker move itself into its leaf.
pub(super) fn probe_cgroup(report: &mut Report, commit: bool) -> Option<Cgroups> {
    let mount = Path::new("/sys/fs/cgroup");
    let hierarchy = Hierarchy::of(mount);
    if hierarchy == Hierarchy::V2 {
        let own = read("/proc/self/cgroup");
        let prepared = own
            .as_deref()
            .and_then(cgroup_v2::own_path)
            .ok_or(cgroup_v2::Error::OwnUnknown)
            .and_then(|own| cgroup_v2::prepare(mount, own, std::process::id(), commit));
        return match prepared {
            Ok(sub) => {
                report.mechanisms.push(Mechanism {
                    name: "cgroup",
                    active: true,
                    detail: format!(
                        "v2: a leaf per call under {} with memory.max (no swap), pids.max{}; OOM kills from memory.events; the whole leaf killed with cgroup.kill",
                        sub.base.display(),
                        if sub.cpu { ", cpu.max" } else { " (no cpu controller delegated: CPU time by rlimit only)" }
                    ),
                });
                Some(Cgroups {
                    version: Version::V2,
                    memory: sub.base.clone(),
                    pids: sub.base.clone(),
                    cpu: sub.cpu.then_some(sub.base),
                })
            }
            Err(why) => {
                report.mechanisms.push(Mechanism {
                    name: "cgroup",
                    active: false,
                    detail: format!("{why}; memory, pids and CPU are bounded by rlimits alone"),
                });
                None
            }
        };
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
                            "{}: memory and pids{} controllers under {}",
                            hierarchy.name(),
                            if cpu.is_some() { ", cpu" } else { "" },
                            memory.display()
                        ),
                    });
                    Some(Cgroups {
                        version: Version::V1,
                        memory,
                        pids,
                        cpu,
                    })
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
                detail: format!(
                    "{}: no cgroup v1 memory and pids controllers are mounted",
                    hierarchy.name()
                ),
            });
            None
        }
    }
}

/// SIGKILLs everything in a cgroup but `spare` (a spawner that lives there) until nothing
/// else is left (new processes may appear while we kill): in v2 all at once with
/// `cgroup.kill` when nothing is spared, otherwise process by process. Returns whether it
/// emptied within about 100 ms.
pub(super) fn empty_cgroup(leaf: &Path, spare: Option<i32>) -> bool {
    let all_at_once = spare.is_none() && cgroup_v2::kill(leaf);
    for round in 0..50 {
        let pids: Vec<i32> = read(leaf.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .filter(|p| Some(*p) != spare)
            .collect();
        if pids.is_empty() {
            return true;
        }
        // After cgroup.kill, a few rounds for the killed to leave; then one by one too.
        for p in pids.into_iter().filter(|_| !all_at_once || round >= 5) {
            if let Some(p) = rustix::process::Pid::from_raw(p) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_removes_the_leaves_of_gone_workers_only() {
        let d = tempfile::tempdir().unwrap();
        let own = std::process::id();
        // Above any pid_max: never alive.
        let dead = 999_999_999u32;
        let keep = [
            format!("tether-{own}-0"),
            // pid 1 is always alive.
            "tether-1-0".to_string(),
            "tether-probe-1".to_string(),
            "other".to_string(),
            format!("tether-{dead}-x"),
        ];
        let gone = [format!("tether-{dead}-0"), format!("tether-{dead}-17")];
        for n in keep.iter().chain(&gone) {
            std::fs::create_dir(d.path().join(n)).unwrap();
        }
        // A leaf that is not empty (in cgroupfs: processes in it) stays.
        let busy = format!("tether-{}-3", dead - 1);
        std::fs::create_dir_all(d.path().join(&busy).join("child")).unwrap();
        assert_eq!(sweep_stale(d.path()), 2);
        for n in keep.iter().chain([&busy]) {
            assert!(d.path().join(n).is_dir(), "{n} was removed");
        }
        for n in &gone {
            assert!(!d.path().join(n).exists(), "{n} stayed");
        }
        assert_eq!(sweep_stale(d.path()), 0);
    }
}
