//! What this machine offers, reported in the worker's hello.

use std::path::Path;

/// Reads this host's capabilities. `disk_path` is where workspaces live; `sandbox` names the
/// confinement mechanisms active here.
pub fn probe(disk_path: &Path, sandbox: Vec<String>) -> proto::Capabilities {
    proto::Capabilities {
        cpus: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        memory_bytes: mem_total().unwrap_or(0),
        disk_free_bytes: disk_free(disk_path).unwrap_or(0),
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        hostname: hostname(),
        sandbox,
    }
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

fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn disk_free(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn probe_reports_this_host() {
        let c = super::probe(std::path::Path::new("/"), vec!["rlimits".into()]);
        assert!(c.cpus >= 1);
        assert!(c.memory_bytes > 0);
        assert!(c.disk_free_bytes > 0);
        assert_eq!(c.os, std::env::consts::OS);
    }
}
