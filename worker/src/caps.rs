//! What this machine offers, reported in the worker's hello.

use std::path::Path;

/// Reads this host's capabilities. `disk_path` is where workspaces live; `sandbox` names the
/// confinement mechanisms active here.
pub fn probe(disk_path: &Path, sandbox: Vec<String>, max_tasks: u32) -> proto::Capabilities {
    proto::Capabilities {
        cpus: cpus(),
        max_tasks,
        memory_bytes: memory(),
        disk_free_bytes: disk_free(disk_path).unwrap_or(0),
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        hostname: hostname(),
        sandbox,
    }
}

/// The CPUs this worker may use: Rust's `available_parallelism` reads the affinity mask and
/// cgroup CPU quotas (v2 `cpu.max`, v1 `cpu.cfs_quota_us`), so a container limited to one
/// CPU says one.
pub fn cpus() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

/// Tasks a worker takes at once unless told (`worker run --max-tasks`): two per CPU it may
/// use (an agent's task waits on its model most of the time).
pub fn default_max_tasks() -> u32 {
    cpus().max(1) * 2
}

/// Memory this worker may still use: the host's available memory, or less where its cgroup's
/// limit leaves less (the limit less what the cgroup uses).
pub fn memory_free() -> u64 {
    let host = meminfo("MemAvailable:").unwrap_or(0);
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let root = Path::new("/sys/fs/cgroup");
    let in_cgroup = cgroup_memory_limit(root, &own)
        .map(|limit| limit.saturating_sub(cgroup_memory_used(root, &own).unwrap_or(0)));
    match in_cgroup {
        Some(free) if host == 0 || free < host => free,
        _ => host,
    }
}

/// What the cgroup named in `own` uses now: v2's `memory.current`, v1's
/// `memory.usage_in_bytes`.
fn cgroup_memory_used(root: &Path, own: &str) -> Option<u64> {
    use crate::sandbox::{CgroupHierarchy, cgroup_v1_path, cgroup_v2_path};
    let read = |p: std::path::PathBuf| -> Option<u64> {
        std::fs::read_to_string(p).ok()?.trim().parse().ok()
    };
    if let Some(path) = cgroup_v1_path(own, "memory") {
        return read(
            root.join("memory")
                .join(path.trim_start_matches('/'))
                .join("memory.usage_in_bytes"),
        );
    }
    let path = cgroup_v2_path(own)?;
    let base = match CgroupHierarchy::of(root) {
        CgroupHierarchy::V2 => root.to_path_buf(),
        _ => root.join("unified"),
    };
    read(
        base.join(path.trim_start_matches('/'))
            .join("memory.current"),
    )
}

/// The host's CPU time so far, (busy, total), in clock ticks, from `/proc/stat`.
pub fn cpu_times() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    // idle + iowait
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// The host name, or `worker` if it cannot be read.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "worker".into())
}

/// The memory this worker may use: the host's, or less where its cgroup (a container's, a
/// systemd unit's) sets a limit. (The CPU count needs nothing of the kind: Rust's
/// `available_parallelism` already reads cgroup quotas and the affinity mask.)
fn memory() -> u64 {
    let host = mem_total().unwrap_or(0);
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    match cgroup_memory_limit(Path::new("/sys/fs/cgroup"), &own) {
        Some(limit) if host == 0 || limit < host => limit,
        _ => host,
    }
}

/// The tightest memory limit on the cgroup named in `own` (`/proc/self/cgroup`'s text) and
/// its ancestors, under the cgroup mount `root`: v2's `memory.max` (at `root`, or at
/// `root/unified` on a hybrid host), else v1's `memory/…/memory.limit_in_bytes`. None when
/// nothing limits it.
fn cgroup_memory_limit(root: &Path, own: &str) -> Option<u64> {
    // v1 writes "no limit" as the largest page-aligned i64.
    const V1_UNLIMITED: u64 = 1 << 62;
    let tightest = |base: &Path, rel: &str, file: &str| -> Option<u64> {
        let mut dir = base.join(rel.trim_start_matches('/'));
        let mut best: Option<u64> = None;
        loop {
            if let Some(v) = std::fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                .filter(|v| *v < V1_UNLIMITED)
            {
                best = Some(best.map_or(v, |b| b.min(v)));
            }
            if dir == base || !dir.pop() || !dir.starts_with(base) {
                return best;
            }
        }
    };
    use crate::sandbox::{CgroupHierarchy, cgroup_v1_path, cgroup_v2_path};
    if let Some(path) = cgroup_v1_path(own, "memory") {
        return tightest(&root.join("memory"), path, "memory.limit_in_bytes");
    }
    let path = cgroup_v2_path(own)?;
    let base = match CgroupHierarchy::of(root) {
        CgroupHierarchy::V2 => root.to_path_buf(),
        _ => root.join("unified"),
    };
    tightest(&base, path, "memory.max")
}

fn mem_total() -> Option<u64> {
    meminfo("MemTotal:")
}

fn meminfo(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn disk_free(path: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(path).ok()?;
    Some(st.f_bavail * st.f_frsize)
}

#[cfg(test)]
mod tests {
    use super::{cgroup_memory_limit, cgroup_memory_used};

    fn write(root: &std::path::Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn a_v2_limit_is_the_tightest_on_the_way_up() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        write(r, "cgroup.controllers", "memory pids\n");
        write(r, "system.slice/memory.max", "2147483648\n");
        write(r, "system.slice/w.service/memory.max", "max\n");
        assert_eq!(
            cgroup_memory_limit(r, "0::/system.slice/w.service\n"),
            Some(2 << 30)
        );
        write(r, "system.slice/w.service/memory.max", "536870912\n");
        assert_eq!(
            cgroup_memory_limit(r, "0::/system.slice/w.service\n"),
            Some(512 << 20)
        );
        // A container with its own cgroup namespace sees itself at "/".
        write(r, "memory.max", "1073741824\n");
        assert_eq!(cgroup_memory_limit(r, "0::/\n"), Some(1 << 30));
        assert_eq!(cgroup_memory_limit(r, ""), None);
    }

    #[test]
    fn what_the_cgroup_uses_v2_and_v1() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        write(r, "cgroup.controllers", "memory pids\n");
        write(r, "w.service/memory.current", "1048576\n");
        assert_eq!(cgroup_memory_used(r, "0::/w.service\n"), Some(1 << 20));
        let v1 = tempfile::tempdir().unwrap();
        let r = v1.path();
        write(r, "memory/docker/abc/memory.usage_in_bytes", "4096\n");
        assert_eq!(cgroup_memory_used(r, "4:memory:/docker/abc\n"), Some(4096));
    }

    #[test]
    fn a_v1_limit_and_its_unlimited_value() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        let own = "12:pids:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n";
        write(
            r,
            "memory/docker/abc/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(r, "memory/memory.limit_in_bytes", "9223372036854771712\n");
        assert_eq!(cgroup_memory_limit(r, own), None);
        write(r, "memory/docker/abc/memory.limit_in_bytes", "1073741824\n");
        assert_eq!(cgroup_memory_limit(r, own), Some(1 << 30));
        // Hybrid: v1 memory wins over the unified hierarchy's empty entry.
        let hybrid = format!("{own}0::/docker/abc\n");
        assert_eq!(cgroup_memory_limit(r, &hybrid), Some(1 << 30));
    }

    #[test]
    fn probe_reports_this_host() {
        let c = super::probe(std::path::Path::new("/"), vec!["rlimits".into()], 4);
        assert!(c.cpus >= 1);
        assert!(c.memory_bytes > 0);
        assert!(c.disk_free_bytes > 0);
        assert_eq!(c.os, std::env::consts::OS);
    }
}
