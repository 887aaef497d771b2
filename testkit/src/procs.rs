//! Processes and files as the host sees them: which processes a path started, whether one is
//! gone, and handing a tree to another user.

/// `chown -R uid:uid path` (symlinks themselves, not what they point at).
pub fn chown_tree(path: &std::path::Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))
        .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        for e in std::fs::read_dir(path).expect("read dir").flatten() {
            chown_tree(&e.path(), uid);
        }
    }
}

/// Pids of processes whose command line mentions `path`.
pub fn pids_mentioning(path: &std::path::Path) -> Vec<u32> {
    let needle = path.to_string_lossy().into_owned();
    let me = std::process::id();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    procs
        .flatten()
        .filter_map(|p| p.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me && !process_gone(*pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(&needle)
                })
                .unwrap_or(false)
        })
        .collect()
}

/// The processes started with `path` in their command line, not counting their own children
/// that still carry it (a forked check between fork and exec has its parent's command line):
/// how many programs were started, whatever they are doing this instant. A process gone by
/// the time its parent is looked up (such a forked check, exiting) is not counted: it was
/// listed, but it no longer runs, and whose child it was cannot be told any more.
pub fn processes_started_in(path: &std::path::Path) -> Vec<u32> {
    let all = pids_mentioning(path);
    all.iter()
        .copied()
        .filter(|pid| parent_of(*pid).is_some_and(|p| !all.contains(&p)))
        .collect()
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether a process is gone (or a zombie nobody reaped yet: it no longer runs).
pub fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
    }
}

/// A process's resident memory at its peak since it started or the last [`reset_peak`], in
/// bytes (`VmHWM`).
pub fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read its status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kb * 1024
}

/// Starts [`peak_rss`] again from the memory the process has now.
pub fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak (clear_refs)");
}
