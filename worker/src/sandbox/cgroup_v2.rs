//! Finding and preparing a cgroup v2 subtree for per-call leaves.
//!
//! The unified hierarchy's rule is that a cgroup with processes in it hands no controllers
//! to its children (the root excepted). So the worker works in its own cgroup — the subtree
//! systemd hands a unit with `Delegate=yes` (the units in `deploy/` set it), or the one root
//! is in — moves itself into a leaf `worker` there, enables the memory, pids and (where
//! delegated) cpu controllers for the children, and makes each call's leaf beside it. When
//! the worker's cgroup is the root of the hierarchy (a root shell on a host without
//! systemd), it makes a `tether` child there instead and leaves itself where it is. The root
//! of a container's cgroup namespace looks like `/` from inside but is an ordinary cgroup:
//! there the worker moves into its leaf as in a unit's subtree.

use std::path::{Path, PathBuf};

use super::sys::read;

/// Why no cgroup v2 subtree can hold per-call leaves.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read this process's cgroup from /proc/self/cgroup")]
    OwnUnknown,
    #[error("cannot read {cgroup}/cgroup.controllers")]
    NoControllersFile { cgroup: PathBuf },
    #[error(
        "cgroup v2: {cgroup} has no memory and pids controllers to hand out (it has: {has:?}); run the worker as the systemd unit in deploy/ (Delegate=yes) or as root"
    )]
    NoControllers { cgroup: PathBuf, has: String },
    #[error(
        "cgroup v2: {others} other process(es) share the worker's cgroup {cgroup}, so it cannot hand controllers to per-call leaves; run the worker as the systemd unit in deploy/ (Delegate=yes gives it a cgroup of its own)"
    )]
    Shared { cgroup: PathBuf, others: usize },
    #[error("cannot write {value:?} to {path}: {source}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Which cgroup hierarchies a host has mounted at `/sys/fs/cgroup`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hierarchy {
    /// Only v1 controllers.
    V1,
    /// v1 controllers, and an (often empty) unified hierarchy beside them.
    Hybrid,
    /// Only the unified hierarchy.
    V2,
}

impl Hierarchy {
    pub(crate) fn of(mount: &Path) -> Self {
        if mount.join("cgroup.controllers").exists() {
            Hierarchy::V2
        } else if mount.join("unified/cgroup.controllers").exists() {
            Hierarchy::Hybrid
        } else {
            Hierarchy::V1
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Hierarchy::V1 => "v1",
            Hierarchy::Hybrid => "hybrid (v1 controllers, v2 unified hierarchy beside them)",
            Hierarchy::V2 => "v2",
        }
    }
}

/// A subtree ready for leaves: each new directory under `base` has the controllers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Subtree {
    pub(super) base: PathBuf,
    pub(super) cpu: bool,
}

/// The process's cgroup in the unified hierarchy (the `0::` line of `/proc/self/cgroup`).
pub(crate) fn own_path(proc_self_cgroup: &str) -> Option<&str> {
    proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::trim)
}

/// Prepares the subtree under `mount` (the unified hierarchy) for a process whose cgroup is
/// `own` (as `/proc/self/cgroup` names it) and whose pid is `pid`. With `commit` false
/// (`worker doctor`) nothing is moved or written: only whether it would work is said.
pub(super) fn prepare(mount: &Path, own: &str, pid: u32, commit: bool) -> Result<Subtree, Error> {
    let here = mount.join(own.trim_start_matches('/'));
    let controllers =
        read(here.join("cgroup.controllers")).ok_or_else(|| Error::NoControllersFile {
            cgroup: here.clone(),
        })?;
    let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
    if !has("memory") || !has("pids") {
        return Err(Error::NoControllers {
            cgroup: here,
            has: controllers.trim().to_string(),
        });
    }
    let cpu = has("cpu");
    let enable = if cpu {
        "+memory +pids +cpu"
    } else {
        "+memory +pids"
    };
    // The hierarchy's real root has no `cgroup.type`; the root of a container's cgroup
    // namespace (also `/` from inside) is an ordinary cgroup, bound by the rule above.
    let at_root = own.trim_matches('/').is_empty() && !here.join("cgroup.type").exists();
    let base = if at_root {
        here.join("tether")
    } else {
        here.clone()
    };
    if !commit {
        if !at_root {
            let others: Vec<u32> = read(here.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .filter(|p| *p != pid)
                .collect();
            if !others.is_empty() {
                return Err(Error::Shared {
                    cgroup: here,
                    others: others.len(),
                });
            }
        }
        return Ok(Subtree { base, cpu });
    }
    let write = |path: PathBuf, v: &str| {
        std::fs::write(&path, v).map_err(|source| Error::Write {
            path,
            value: v.to_string(),
            source,
        })
    };
    let create = |path: &Path| {
        std::fs::create_dir_all(path).map_err(|source| Error::Create {
            path: path.to_path_buf(),
            source,
        })
    };
    if at_root {
        // The root may hold processes and still hand controllers down.
        write(here.join("cgroup.subtree_control"), enable)?;
        create(&base)?;
    } else {
        let me = here.join("worker");
        create(&me)?;
        write(me.join("cgroup.procs"), &pid.to_string())?;
        let others = read(here.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count();
        if others > 0 {
            return Err(Error::Shared {
                cgroup: here,
                others,
            });
        }
    }
    write(base.join("cgroup.subtree_control"), enable)?;
    Ok(Subtree { base, cpu })
}

/// The limits of one call, as the files of a v2 leaf hold them: `memory.max`,
/// `memory.swap.max` (0: a command that runs out of memory is killed, not swapped),
/// `pids.max` and `cpu.max` (`quota period` in µs, or `max`).
pub(super) fn limit_files(memory: u64, pids: u32, cpu_quota: i64) -> [(&'static str, String); 4] {
    [
        ("memory.max", memory.to_string()),
        ("memory.swap.max", "0".into()),
        ("pids.max", pids.to_string()),
        (
            "cpu.max",
            if cpu_quota > 0 {
                format!("{cpu_quota} 100000")
            } else {
                "max 100000".into()
            },
        ),
    ]
}

/// A counter of a cgroup's flat-keyed file (`memory.events`, `pids.events`,
/// `memory.oom_control`: lines of `key value`), 0 where it is missing.
pub(super) fn counter(file: &Path, key: &str) -> u64 {
    read(file)
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Kills a v2 leaf's processes at once with `cgroup.kill` (Linux 5.14); false where the
/// kernel has no such file.
pub(super) fn kill(leaf: &Path) -> bool {
    let f = leaf.join("cgroup.kill");
    f.exists() && std::fs::write(f, "1").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(controllers: &str, procs: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let unit = d.path().join("system.slice/tether-worker.service");
        std::fs::create_dir_all(&unit).unwrap();
        std::fs::write(unit.join("cgroup.controllers"), controllers).unwrap();
        std::fs::write(unit.join("cgroup.procs"), procs).unwrap();
        std::fs::write(unit.join("cgroup.subtree_control"), "").unwrap();
        d
    }

    #[test]
    fn the_worker_moves_into_a_leaf_and_hands_the_controllers_down() {
        let d = fake("cpuset cpu io memory pids\n", "");
        let own = "/system.slice/tether-worker.service";
        let unit = d.path().join("system.slice/tether-worker.service");
        let s = prepare(d.path(), own, 4242, true).unwrap();
        assert_eq!(
            s,
            Subtree {
                base: unit.clone(),
                cpu: true
            }
        );
        assert_eq!(
            std::fs::read_to_string(unit.join("worker/cgroup.procs")).unwrap(),
            "4242"
        );
        assert_eq!(
            std::fs::read_to_string(unit.join("cgroup.subtree_control")).unwrap(),
            "+memory +pids +cpu"
        );
    }

    #[test]
    fn at_the_root_a_tether_child_holds_the_leaves() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("cgroup.controllers"), "memory pids\n").unwrap();
        let s = prepare(d.path(), "/", 1, true).unwrap();
        assert_eq!(s.base, d.path().join("tether"));
        assert!(!s.cpu);
        assert_eq!(
            std::fs::read_to_string(d.path().join("cgroup.subtree_control")).unwrap(),
            "+memory +pids"
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("tether/cgroup.subtree_control")).unwrap(),
            "+memory +pids"
        );
    }

    #[test]
    fn the_root_of_a_containers_cgroup_namespace_is_treated_as_a_cgroup_of_its_own() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("cgroup.controllers"), "memory pids\n").unwrap();
        std::fs::write(d.path().join("cgroup.type"), "domain\n").unwrap();
        std::fs::write(d.path().join("cgroup.procs"), "").unwrap();
        let s = prepare(d.path(), "/", 9, true).unwrap();
        assert_eq!(s.base, d.path());
        assert_eq!(
            std::fs::read_to_string(d.path().join("worker/cgroup.procs")).unwrap(),
            "9"
        );
        assert!(!d.path().join("tether").exists());
    }

    #[test]
    fn missing_controllers_and_a_shared_cgroup_are_said_and_nothing_is_written() {
        let d = fake("cpu io\n", "");
        let own = "/system.slice/tether-worker.service";
        let e = prepare(d.path(), own, 1, true).unwrap_err().to_string();
        assert!(
            e.contains("no memory and pids") && e.contains("Delegate=yes"),
            "{e}"
        );
        let d = fake("memory pids\n", "1\n77\n");
        let e = prepare(d.path(), own, 1, false).unwrap_err().to_string();
        assert!(e.contains("1 other process(es)"), "{e}");
        assert!(
            !d.path()
                .join("system.slice/tether-worker.service/worker")
                .exists()
        );
        // Alone there, doctor says it would work, and moves nothing.
        let d = fake("memory pids\n", "1\n");
        assert!(prepare(d.path(), own, 1, false).is_ok());
        assert!(
            !d.path()
                .join("system.slice/tether-worker.service/worker")
                .exists()
        );
    }

    #[test]
    fn limits_are_written_as_v2_spells_them() {
        let files = limit_files(256 << 20, 64, 50_000);
        assert_eq!(
            files.map(|(f, v)| format!("{f}={v}")),
            [
                "memory.max=268435456",
                "memory.swap.max=0",
                "pids.max=64",
                "cpu.max=50000 100000"
            ]
        );
        assert_eq!(limit_files(1, 1, -1)[3].1, "max 100000");
    }

    #[test]
    fn counters_are_read_by_their_whole_key() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("memory.oom_control");
        std::fs::write(&f, "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n").unwrap();
        assert_eq!(counter(&f, "oom_kill"), 2);
        let f = d.path().join("pids.events");
        std::fs::write(&f, "max 7\n").unwrap();
        assert_eq!(counter(&f, "max"), 7);
        assert_eq!(counter(&d.path().join("missing"), "max"), 0);
    }

    #[test]
    fn own_cgroup_from_proc_self_cgroup() {
        let text = "12:pids:/x\n0::/system.slice/tether-worker.service\n";
        assert_eq!(own_path(text), Some("/system.slice/tether-worker.service"));
        assert_eq!(own_path("4:memory:/\n"), None);
    }
}
