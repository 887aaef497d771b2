//! Wire paths resolved beneath a root by the kernel, in the same step that opens them.
//!
//! [`crate::paths::confine`] checks a path and then the caller opens it: a process that swaps
//! a directory of the workspace for a symlink between the two could make the open land
//! outside. Where the kernel has `openat2(2)` (Linux 5.6), [`Beneath`] opens the root once and
//! resolves every wire path from that descriptor with `RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS`: a `..`, an absolute symlink or a symlink that leaves the root fails
//! the call itself (`EXDEV`), and `/proc` magic links are never followed, whatever happens
//! to the tree meanwhile. Symlinks that stay inside are followed, as `confine` follows them.
//!
//! Operations on an entry itself (write, replace, remove, stat, chown) get its parent
//! directory as a [`Dir`]: an open descriptor, named for the standard library's path calls
//! as `/proc/self/fd/N`. The kernel resolves that name to the open directory, not to a path,
//! so what happens to the tree above it no longer matters; the final name is handled by the
//! caller without following it (`O_NOFOLLOW`, `lstat`, `unlink`, `rename`).
//!
//! Where `openat2` is missing (an older kernel, or a seccomp filter that refuses it) or
//! `/proc/self/fd` cannot be used, the same calls fall back to `confine`'s check-then-open,
//! and [`support`] says so (the worker's `doctor` shows it).

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::paths::{self, Error};

/// How wire paths are resolved on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`, and `/proc/self/fd`.
    Openat2,
    /// Check, then open (`paths::confine`), for the reason given.
    Fallback(String),
}

/// How this host resolves wire paths (probed once).
pub fn support() -> &'static Support {
    static SUPPORT: OnceLock<Support> = OnceLock::new();
    SUPPORT.get_or_init(probe)
}

fn probe() -> Support {
    let root = match rustix::fs::open(
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => return Support::Fallback(format!("cannot open /: {e}")),
    };
    match rustix::fs::openat2(
        &root,
        ".",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        resolve(),
    ) {
        Ok(_) => {}
        Err(rustix::io::Errno::NOSYS) => {
            return Support::Fallback(
                "the kernel has no openat2 (Linux 5.6 or later has it)".into(),
            );
        }
        Err(e) => return Support::Fallback(format!("openat2 is refused here: {e}")),
    }
    if std::fs::symlink_metadata(fd_path(&root)).is_err() {
        return Support::Fallback("/proc/self/fd is not mounted".into());
    }
    Support::Openat2
}

fn resolve() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// A root under which wire paths are opened; see the module's documentation.
pub struct Beneath {
    root: PathBuf,
    /// The root, open (`None`: the fallback).
    fd: Option<OwnedFd>,
}

/// A directory beneath the root, open while this lives.
pub struct Dir {
    /// Holds the directory open: `path` names it through this descriptor.
    _fd: Option<OwnedFd>,
    path: PathBuf,
}

impl Dir {
    /// A name that reaches this very directory (for the standard library's path calls).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` inside this directory (one component, not resolved here).
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Beneath {
    /// Opens `root`.
    pub fn new(root: &Path) -> Result<Self, Error> {
        let root_err = |source| Error::Root {
            root: root.to_path_buf(),
            source,
        };
        let fd = match support() {
            Support::Openat2 => Some(
                rustix::fs::open(
                    root,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| root_err(e.into()))?,
            ),
            Support::Fallback(_) => None,
        };
        Ok(Self {
            root: root.to_path_buf(),
            fd,
        })
    }

    /// Opens the existing regular file at `path` for reading; `None` if it is something else
    /// (a directory, a FIFO, a device: looked at before anything is opened, so opening has no
    /// side effect). In the kernel's path the look and the open are of the same inode.
    pub fn open_read(&self, path: &str) -> Result<Option<File>, Error> {
        use std::os::unix::fs::OpenOptionsExt;
        let io = |source| Error::Io {
            path: path.to_string(),
            source,
        };
        let mut opts = std::fs::OpenOptions::new();
        opts.read(true);
        let (full, meta, _held) = match &self.fd {
            Some(root) => {
                let rel = relative(path)?;
                let fd = rustix::fs::openat2(
                    root,
                    rel.as_str(),
                    OFlags::PATH | OFlags::CLOEXEC,
                    Mode::empty(),
                    resolve(),
                )
                .map_err(|e| self.error(path, e))?;
                // `/proc/self/fd/N` is the O_PATH descriptor's own link: looking at it and
                // opening it reach that very inode.
                let full = fd_path(&fd);
                let meta = std::fs::metadata(&full).map_err(io)?;
                opts.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
                (full, meta, Some(fd))
            }
            None => {
                let full = paths::confine(&self.root, path)?;
                let meta = std::fs::symlink_metadata(&full).map_err(io)?;
                opts.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY);
                (full, meta, None)
            }
        };
        if !meta.is_file() {
            return Ok(None);
        }
        let f = opts.open(&full).map_err(io)?;
        // Checked again on the open file, in case it was swapped since the look.
        Ok(f.metadata().map_err(io)?.is_file().then_some(f))
    }

    /// The directory at `path` (the root for `""` or `.`); with `create`, missing
    /// directories on the way are made (0755), each beneath the one before.
    pub fn dir(&self, path: &str, create: bool) -> Result<Dir, Error> {
        let Some(root) = &self.fd else {
            let full = paths::confine(&self.root, path)?;
            if create {
                std::fs::create_dir_all(&full).map_err(|source| Error::Io {
                    path: path.to_string(),
                    source,
                })?;
                // Made: confined again, as the tree may have changed meanwhile.
                return Ok(Dir {
                    _fd: None,
                    path: paths::confine(&self.root, path)?,
                });
            }
            return Ok(Dir {
                _fd: None,
                path: full,
            });
        };
        let parts = paths::check_relative(path)?;
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let open = |at: &OwnedFd, name: &str| {
            rustix::fs::openat2(at, name, flags, Mode::empty(), resolve())
        };
        // One call for a directory that exists (as `confine` would, in-tree symlinks are
        // followed); component by component only to make what is missing.
        match open(root, relative(path)?.as_str()) {
            Ok(fd) => {
                return Ok(Dir {
                    path: fd_path(&fd),
                    _fd: Some(fd),
                });
            }
            Err(rustix::io::Errno::NOENT) if create => {}
            Err(e) => return Err(self.error(path, e)),
        }
        let mut cur = open(root, ".").map_err(|e| self.error(path, e))?;
        for part in parts {
            let next = match open(&cur, part) {
                Err(rustix::io::Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&cur, part, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(self.error(path, e)),
                    }
                    open(&cur, part)
                }
                other => other,
            };
            cur = next.map_err(|e| self.error(path, e))?;
        }
        Ok(Dir {
            path: fd_path(&cur),
            _fd: Some(cur),
        })
    }

    /// The parent directory of `path` and its final name, which is not resolved (a symlink
    /// there is the entry itself). The root has no parent and is refused.
    pub fn parent(&self, path: &str, create: bool) -> Result<(Dir, String), Error> {
        let parts = paths::check_relative(path)?;
        let Some((name, parent)) = parts.split_last() else {
            return Err(Error::Rejected {
                path: path.to_string(),
                reason: "this operation needs a path inside the workspace, not its root",
            });
        };
        let dir = self.dir(&parent.join("/"), create).map_err(|e| match e {
            Error::Rejected { reason, .. } => Error::Rejected {
                path: path.to_string(),
                reason,
            },
            Error::SymlinkEscape { link, .. } => Error::SymlinkEscape {
                path: path.to_string(),
                link,
            },
            Error::Io { source, .. } => Error::Io {
                path: path.to_string(),
                source,
            },
            other => other,
        })?;
        Ok((dir, (*name).to_string()))
    }

    /// An error of `openat2` on `path`, in `confine`'s words.
    fn error(&self, path: &str, e: rustix::io::Errno) -> Error {
        match e {
            // A `..` or a symlink that leaves the root: name the link as `confine` would
            // (it may already be gone; then the whole path is named).
            rustix::io::Errno::XDEV => match paths::confine(&self.root, path) {
                Err(e @ Error::SymlinkEscape { .. }) => e,
                _ => Error::SymlinkEscape {
                    path: path.to_string(),
                    link: path.to_string(),
                },
            },
            e => Error::Io {
                path: path.to_string(),
                source: e.into(),
            },
        }
    }
}

/// The directory `root`, open for [`open_no_symlinks`] (`None` where the kernel resolves no
/// paths beneath: the caller opens by path then).
pub fn open_root(root: &Path) -> Option<OwnedFd> {
    match support() {
        Support::Openat2 => rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok(),
        Support::Fallback(_) => None,
    }
}

/// Opens the regular file `rel` (a relative path the caller built from its own walk) under
/// `root` for reading, refusing any symlink on the way, the last component included, and
/// anything that leaves `root`: for walkers that never follow links, so that a directory
/// swapped for a symlink between the listing and the open cannot make them read outside.
/// Such a swap is `Ok(None)`, as is a FIFO (opened without blocking) or anything that is
/// not a regular file; otherwise the file and its metadata (from the open file). `root_fd` from [`open_root`]; without it, `root.join(rel)` is opened
/// with `O_NOFOLLOW` (the last component only).
pub fn open_no_symlinks(
    root_fd: Option<&OwnedFd>,
    root: &Path,
    rel: &str,
) -> std::io::Result<Option<(File, std::fs::Metadata)>> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let opened = match root_fd {
        Some(fd) => rustix::fs::openat2(
            fd,
            rel,
            flags,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map(File::from)
        .map_err(std::io::Error::from),
        None => rustix::fs::open(root.join(rel), flags, Mode::empty())
            .map(File::from)
            .map_err(std::io::Error::from),
    };
    match opened {
        Ok(f) => {
            let meta = f.metadata()?;
            Ok(meta.is_file().then_some((f, meta)))
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ELOOP | libc::EXDEV | libc::ENOTDIR)
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Entries of a tree a writer makes match a manifest (a move's target), each named through
/// its parent directory held open: the parent is resolved beneath the root with no symlink
/// on the way (a manifest's directories are directories), so nothing a racing process does
/// to the tree above can make a write or a removal land outside. The last parent is kept
/// open, so entries of one directory in a row cost one `openat2`.
pub struct Parents {
    root: PathBuf,
    fd: Option<OwnedFd>,
    last: Option<(String, OwnedFd)>,
}

/// Why [`Parents::entry`] has no name for an entry.
#[derive(Debug)]
pub enum NoEntry {
    /// The parent does not exist (nothing there to remove).
    Missing,
    /// The parent is not a directory on disk, or its path goes through a symlink.
    NotADirectory,
    Io(std::io::Error),
}

impl Parents {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            fd: open_root(root),
            last: None,
        }
    }

    /// A name for the entry `rel` (a manifest path: checked, relative, `/`-separated) that
    /// reaches it through its parent held open. Where the kernel resolves nothing beneath,
    /// every ancestor is looked at instead (none may be a symlink or a non-directory), then
    /// `root/rel`.
    pub fn entry(&mut self, rel: &str) -> Result<PathBuf, NoEntry> {
        let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let Some(root) = &self.fd else {
            return self.checked_path(rel);
        };
        if self.last.as_ref().is_none_or(|(p, _)| p != parent) {
            let fd = rustix::fs::openat2(
                root,
                if parent.is_empty() { "." } else { parent },
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
            )
            .map_err(|e| match e {
                rustix::io::Errno::NOENT => NoEntry::Missing,
                rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR | rustix::io::Errno::XDEV => {
                    NoEntry::NotADirectory
                }
                e => NoEntry::Io(e.into()),
            })?;
            self.last = Some((parent.to_string(), fd));
        }
        let (_, fd) = self.last.as_ref().expect("set above");
        Ok(fd_path(fd).join(name))
    }

    fn checked_path(&self, rel: &str) -> Result<PathBuf, NoEntry> {
        let mut full = self.root.clone();
        let parts: Vec<&str> = rel.split('/').collect();
        for (i, part) in parts.iter().enumerate() {
            full.push(part);
            if i + 1 < parts.len() {
                match std::fs::symlink_metadata(&full) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => return Err(NoEntry::NotADirectory),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Err(NoEntry::Missing);
                    }
                    Err(e) => return Err(NoEntry::Io(e)),
                }
            }
        }
        Ok(full)
    }
}

/// For race tests (here and in the worker): a thread that makes `a` and `b` trade places
/// atomically (`renameat2(RENAME_EXCHANGE)`), over and over, until stopped or until one of
/// them is gone — a hostile command swapping a directory and a symlink under a worker.
#[doc(hidden)]
pub struct Swapper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

#[doc(hidden)]
impl Swapper {
    pub fn start(a: &Path, b: &Path) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a, b) = (a.to_path_buf(), b.to_path_buf());
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut swaps = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed)
                && rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    &a,
                    rustix::fs::CWD,
                    &b,
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .is_ok()
            {
                swaps += 1;
            }
            swaps
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the thread; how many swaps it made.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap_or(0))
    }
}

/// `path` as `openat2` takes it: checked, its normal components joined (`.` for the root).
fn relative(path: &str) -> Result<String, Error> {
    let parts = paths::check_relative(path)?;
    Ok(if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> (tempfile::TempDir, tempfile::TempDir) {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("a/b")).unwrap();
        std::fs::write(root.path().join("a/b/f.txt"), "inside").unwrap();
        std::fs::write(outside.path().join("secret"), "outside").unwrap();
        std::os::unix::fs::symlink("b/f.txt", root.path().join("a/in")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("out")).unwrap();
        std::os::unix::fs::symlink("/proc/self/root", root.path().join("magic")).unwrap();
        (root, outside)
    }

    #[test]
    fn this_host_resolves_beneath_in_the_kernel() {
        // Where the kernel lacks openat2 the reason is printed and the other tests exercise
        // the fallback; where CI says the kernel has it (`.ci/run` names `openat2` in
        // TETHER_REQUIRE_PEERS on Linux 5.6 and later), the fallback is a failure.
        let required = std::env::var("TETHER_REQUIRE_PEERS")
            .unwrap_or_default()
            .split(',')
            .any(|p| p.trim() == "openat2");
        match support() {
            Support::Openat2 => {}
            Support::Fallback(why) if required => {
                panic!("openat2 is required here (TETHER_REQUIRE_PEERS) but: {why}")
            }
            Support::Fallback(why) => {
                eprintln!("skipped: paths are checked, then opened, on this host: {why}")
            }
        }
    }

    #[test]
    fn reads_follow_symlinks_only_while_they_stay_inside() {
        let (root, _outside) = tree();
        let b = Beneath::new(root.path()).unwrap();
        let read = |p: &str| {
            b.open_read(p)
                .map(|f| std::io::read_to_string(f.expect("a regular file")).unwrap())
        };
        assert_eq!(read("a/b/f.txt").unwrap(), "inside");
        assert_eq!(read("a/in").unwrap(), "inside");
        for p in ["out/secret", "../x", "/etc/passwd"] {
            assert!(
                matches!(
                    read(p),
                    Err(Error::SymlinkEscape { .. } | Error::Rejected { .. })
                ),
                "{p}"
            );
        }
        let e = read("out/secret").unwrap_err().to_string();
        assert!(e.contains("\"out\""), "{e}");
        assert!(read("magic/etc/passwd").is_err());
        assert!(b.open_read("a").unwrap().is_none(), "a directory");
        assert!(matches!(
            read("nope"),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound
        ));
    }

    #[test]
    fn directories_are_made_beneath_and_named_by_their_descriptor() {
        let (root, outside) = tree();
        let b = Beneath::new(root.path()).unwrap();
        let d = b.dir("x/y/z", true).unwrap();
        std::fs::write(d.join("f"), "made").unwrap();
        assert_eq!(
            std::fs::read_to_string(root.path().join("x/y/z/f")).unwrap(),
            "made"
        );
        assert!(b.dir("out/new", true).is_err());
        assert!(!outside.path().join("new").exists());
        let (parent, name) = b.parent("a/in", false).unwrap();
        assert_eq!(name, "in");
        assert!(
            std::fs::symlink_metadata(parent.join(&name))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(matches!(b.parent("", false), Err(Error::Rejected { .. })));
    }
}
