//! The cgroup code against the kernel's own unified hierarchy, where this host has one the
//! tests may write to (`cgroup2` in `TETHER_REQUIRE_PEERS` makes its absence a failure):
//! a leaf killed as a whole with `cgroup.kill`, and — where the hierarchy hands out the
//! memory and pids controllers, which a hybrid host binds to v1 instead — the limits
//! enforced and counted.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::cgroup::{Leaves, Version, empty_cgroup};
use super::cgroup_v2::Hierarchy;
use super::sys::read;
/// The unified hierarchy's mount point, or why there is none to test against (a peer
/// `.ci/run` requires, as `cgroup2`, where the host has one and the tests run as root).
fn unified() -> Result<PathBuf, String> {
    let root = Path::new("/sys/fs/cgroup");
    let mount = match Hierarchy::of(root) {
        Hierarchy::V2 => root.to_path_buf(),
        Hierarchy::Hybrid => root.join("unified"),
        Hierarchy::V1 => return Err("this host mounts no cgroup v2 hierarchy".into()),
    };
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = mount.join(format!("tether-probe-{}-{n}", std::process::id()));
    std::fs::create_dir(&probe)
        .map_err(|e| format!("cannot create a cgroup under {}: {e}", mount.display()))?;
    let _ = std::fs::remove_dir(&probe);
    Ok(mount)
}

fn skip(peer: &str, why: &str) {
    let required = std::env::var("TETHER_REQUIRE_PEERS")
        .unwrap_or_default()
        .split(',')
        .any(|p| p.trim() == peer || p.trim() == "all");
    assert!(
        !required,
        "{peer} is required here (TETHER_REQUIRE_PEERS) but: {why}"
    );
    eprintln!("SKIPPED: no {peer} here: {why}");
}

/// A command (and what it forks) started inside `leaf`, as the worker's pre-exec step
/// puts it there.
fn spawn_in(leaf: &Path, script: &str) -> std::process::Child {
    let procs = std::fs::OpenOptions::new()
        .write(true)
        .open(leaf.join("cgroup.procs"))
        .unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&procs);
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", script]);
    // SAFETY: a plain write of a static buffer between fork and exec, to `procs`, which
    // stays open until the command is spawned.
    unsafe {
        cmd.pre_exec(move || {
            let fd = std::os::fd::BorrowedFd::borrow_raw(fd);
            if rustix::io::write(fd, b"0")? != 1 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    drop(procs);
    child
}

fn procs(leaf: &Path) -> usize {
    read(leaf.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .count()
}

#[test]
fn a_real_v2_leaf_is_killed_as_a_whole() {
    let mount = match unified() {
        Ok(m) => m,
        Err(why) => return skip("cgroup2", &why),
    };
    let leaf = mount.join(format!("tether-test-kill-{}", std::process::id()));
    std::fs::create_dir(&leaf).unwrap();
    let mut child = spawn_in(&leaf, "sleep 60 & sleep 60 & (sleep 60 &) ; wait");
    let deadline = Instant::now() + Duration::from_secs(10);
    while procs(&leaf) < 4 {
        assert!(
            Instant::now() < deadline,
            "the processes did not start in the leaf"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        leaf.join("cgroup.kill").exists(),
        "cgroup.kill (Linux 5.14)"
    );
    // How `cgroup_v2::prepare` tells the hierarchy's real root from a cgroup namespace's.
    assert!(!mount.join("cgroup.type").exists() && leaf.join("cgroup.type").exists());
    assert!(empty_cgroup(&leaf, None), "the leaf did not empty");
    let status = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    assert_eq!(procs(&leaf), 0);
    // Even the one that left its parent (a daemon) is gone: an empty leaf can go.
    std::fs::remove_dir(&leaf).unwrap();
}

#[test]
fn a_real_v2_leaf_enforces_memory_and_pids_and_counts_the_oom_kill() {
    let mount = match unified() {
        Ok(m) => m,
        Err(why) => return skip("cgroup2", &why),
    };
    let controllers = read(mount.join("cgroup.controllers")).unwrap_or_default();
    let mut subtree = read(mount.join("cgroup.subtree_control")).unwrap_or_default();
    let has = |subtree: &str, c: &str| subtree.split_whitespace().any(|x| x == c);
    let hybrid = Hierarchy::of(Path::new("/sys/fs/cgroup")) == Hierarchy::Hybrid;
    if !hybrid && (!has(&subtree, "memory") || !has(&subtree, "pids")) {
        // A unified host hands them out: enable them for the test's leaf, as the worker's
        // own setup does. One that will not is the required peer missing.
        let _ = std::fs::write(mount.join("cgroup.subtree_control"), "+memory +pids");
        subtree = read(mount.join("cgroup.subtree_control")).unwrap_or_default();
        if !has(&subtree, "memory") || !has(&subtree, "pids") {
            return skip(
                "cgroup2",
                &format!(
                    "the unified hierarchy at {} does not enable the memory and pids controllers (available: {:?}, enabled: {:?})",
                    mount.display(),
                    controllers.trim(),
                    subtree.trim()
                ),
            );
        }
    }
    if !has(&subtree, "memory") || !has(&subtree, "pids") {
        // Not the required peer: a hybrid host binds these controllers to v1.
        eprintln!(
            "SKIPPED: the unified hierarchy at {} hands out no memory and pids controllers here (available: {:?}, enabled: {:?}; on a hybrid host they are bound to the v1 hierarchies), so v2 limits cannot be tried on this host; what is written where is tested in cgroup_v2's tests",
            mount.display(),
            controllers.trim(),
            subtree.trim()
        );
        return;
    }
    let leaf = mount.join(format!("tether-test-limits-{}", std::process::id()));
    std::fs::create_dir(&leaf).unwrap();
    let cpu = has(&subtree, "cpu");
    let mut leaves = Leaves {
        version: Version::V2,
        memory: leaf.clone(),
        pids: leaf.clone(),
        cpu: cpu.then(|| leaf.clone()),
        written: (0, 0, 0),
    };
    leaves.set_limits(64 << 20, 8, 50_000).unwrap();
    assert_eq!(read(leaf.join("memory.max")).unwrap().trim(), "67108864");
    assert_eq!(read(leaf.join("pids.max")).unwrap().trim(), "8");
    let status = spawn_in(&leaf, "head -c 200000000 /dev/zero | tail > /dev/null")
        .wait()
        .unwrap();
    assert!(!status.success());
    assert!(leaves.oom_kills() >= 1, "no OOM kill counted");
    let forks = spawn_in(
        &leaf,
        "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 5 & done; wait",
    );
    let _ = forks.wait_with_output();
    assert!(leaves.pids_refused() >= 1, "no fork refused");
    empty_cgroup(&leaf, None);
    std::fs::remove_dir(&leaf).unwrap();
}
