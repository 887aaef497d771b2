//! Small system helpers the sandbox shares: reading a file, running a check in a forked child,
//! errno in words, and writes safe between fork and exec (no allocation).

use std::path::{Path, PathBuf};

/// Why a value could not be written to a system file (a cgroup's limit).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot write {value} to {path}: {source}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
}

/// Reads a small system file (a cgroup's or /proc's) whole: straight into a page-sized buffer,
/// without the size probe and the growing reads `std::fs::read_to_string` makes of files that
/// report no size (several per call on the path of every command).
pub(super) fn read(p: impl AsRef<Path>) -> Option<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(p).ok()?;
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match f.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// Runs `f` in a forked child and returns its verdict: `Err(errno)` when it failed. The child
/// makes plain syscalls on values prepared beforehand and exits: nothing in it allocates or
/// takes a lock another thread may hold.
pub(super) fn in_child(f: &dyn Fn() -> Result<(), i32>) -> Result<(), i32> {
    // fork and _exit stay on libc: rustix has no fork of its own (only its runtime's, for
    // programs without libc), and libc's runs the atfork handlers the rest of it relies on.
    // SAFETY: the child only runs `f` (syscalls, no allocation) and `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(-1));
    }
    if pid == 0 {
        let code = match f() {
            Ok(()) => 0,
            Err(e) => e.clamp(1, 255),
        };
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) }
    }
    let Some(pid) = rustix::process::Pid::from_raw(pid) else {
        return Err(-1);
    };
    let status = loop {
        match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()) {
            Ok(Some((p, status))) if p == pid => break status,
            Err(rustix::io::Errno::INTR) => {}
            _ => return Err(-1),
        }
    };
    match status.exit_status() {
        Some(0) => Ok(()),
        Some(code) => Err(code),
        None => Err(-1),
    }
}

pub(super) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
}

/// Moves the calling thread into a mount namespace of its own (`unshare(CLONE_NEWNS)`).
pub(super) fn unshare_mount_namespace() -> rustix::io::Result<()> {
    // SAFETY: of unshare's flags only CLONE_FILES can leave threads with descriptor tables
    // of their own; CLONE_NEWNS touches no descriptor.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }
}

/// A rustix error as the errno [`in_child`]'s checks return.
pub(super) fn errno_of(e: rustix::io::Errno) -> i32 {
    e.raw_os_error()
}

pub(super) fn describe_errno(e: i32) -> String {
    if e > 0 {
        std::io::Error::from_raw_os_error(e).to_string()
    } else {
        "the check did not finish".into()
    }
}

pub(super) fn kernel() -> String {
    read("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

pub(super) fn write(path: &Path, value: &str) -> Result<(), Error> {
    std::fs::write(path, value).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    })
}

/// Writes the calling process's pid to `fd` without allocating (child side of fork).
pub(super) fn write_pid(fd: impl std::os::fd::AsFd) -> std::io::Result<()> {
    let mut n = rustix::process::getpid().as_raw_nonzero().get() as u64;
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    rustix::io::write(fd, &buf[i..])?;
    Ok(())
}
