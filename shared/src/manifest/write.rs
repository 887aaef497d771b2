//! Making a directory match a manifest: only the entries a delta names are touched, every
//! blob is checked against its hash before anything is written, writes are atomic per file
//! and never go through a symlink.

use std::collections::HashMap;
use std::path::Path;

use super::{Delta, Entry, Error, Kind, Manifest, Rules, hash, io, rejected};

/// What [`materialise`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    pub written: u64,
    pub written_bytes: u64,
    pub deleted: u64,
}

/// Makes the directory `root` (whose manifest is `current`) match `target`, fetching file
/// contents by hash from `blob`. `target` is validated first and every blob is checked
/// against its hash before it is written, so a bad manifest or blob writes nothing; writes
/// are atomic per file (temp file, rename) and never go through a symlink, and the whole
/// filesystem is synced once at the end (not once a file). Only what differs is touched:
/// see [`materialise_delta`].
pub fn materialise(
    root: &Path,
    current: &Manifest,
    target: &Manifest,
    rules: &Rules,
    blob: &mut dyn FnMut(&str) -> std::io::Result<Vec<u8>>,
) -> Result<Applied, Error> {
    target.validate(rules)?;
    let delta = current.diff(target);
    materialise_delta(root, current, &delta, target, blob)
}

/// [`materialise`] given the delta from `current` to `target` (`target` is
/// `current.apply(delta)`, which checked it): only the paths the delta names are touched,
/// so the cost is that of the change, not of the tree.
pub fn materialise_delta(
    root: &Path,
    current: &Manifest,
    delta: &Delta,
    target: &Manifest,
    blob: &mut dyn FnMut(&str) -> std::io::Result<Vec<u8>>,
) -> Result<Applied, Error> {
    let mut stats = Applied::default();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let changed = |path: &str| -> Option<&Entry> {
        target.get(path).filter(|e| current.get(path) != Some(*e))
    };
    // Fetch what is new, and check it (on every core) before changing anything.
    let mut fetched: Vec<(&str, &str, Vec<u8>)> = Vec::new();
    let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for path in delta.upserts.keys() {
        let Some(e) = changed(path).filter(|e| e.kind == Kind::File) else {
            continue;
        };
        if !seen.insert(e.hash.as_str()) {
            continue;
        }
        let data = blob(&e.hash).map_err(|source| Error::MissingBlob {
            path: path.clone(),
            hash: e.hash.clone(),
            source,
        })?;
        fetched.push((path.as_str(), e.hash.as_str(), data));
    }
    let per = fetched.len().div_ceil(threads).max(1);
    std::thread::scope(|sc| {
        let checks: Vec<_> = fetched
            .chunks(per)
            .map(|part| {
                sc.spawn(move || {
                    for (path, expected, data) in part {
                        let actual = hash(data);
                        if actual != *expected {
                            return Err(Error::HashMismatch {
                                path: path.to_string(),
                                expected: expected.to_string(),
                                actual,
                            });
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        checks
            .into_iter()
            .try_for_each(|h| h.join().expect("hash check panicked"))
    })?;
    let contents: HashMap<&str, Vec<u8>> = fetched.into_iter().map(|(_, h, d)| (h, d)).collect();
    // Remove what goes away or changes kind, deepest first.
    let mut gone: Vec<&str> = delta
        .deletes
        .iter()
        .map(String::as_str)
        .chain(delta.upserts.keys().map(String::as_str))
        .filter(|p| {
            current.get(p).is_some_and(|e| {
                !target.get(p).is_some_and(|t| {
                    t.kind == e.kind && (e.kind != Kind::Symlink || t.target == e.target)
                })
            })
        })
        .collect();
    gone.sort_unstable();
    gone.dedup();
    let mut parents = crate::beneath::Parents::new(root);
    for path in gone.into_iter().rev() {
        let Some(full) = entry(&mut parents, path)? else {
            // Its directory is gone already: so is it.
            stats.deleted += 1;
            continue;
        };
        let r = match std::fs::symlink_metadata(&full) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&full),
            Ok(_) => std::fs::remove_file(&full),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        };
        r.map_err(|e| io(path, e))?;
        stats.deleted += 1;
    }
    // Directories and symlinks in path order (parents before children), then the files on
    // every core.
    let mut files: Vec<(&str, &Entry)> = Vec::new();
    let mut parents = crate::beneath::Parents::new(root);
    for path in delta.upserts.keys() {
        let Some(e) = changed(path) else {
            continue;
        };
        let full = entry_in_place(&mut parents, path)?;
        match e.kind {
            Kind::Dir => match std::fs::symlink_metadata(&full) {
                Ok(m) if m.is_dir() => {}
                other => {
                    // Something the scan left out (a FIFO, a socket) may be in the way.
                    if other.is_ok() {
                        std::fs::remove_file(&full).map_err(|err| io(path, err))?;
                    }
                    std::fs::create_dir(&full).map_err(|err| io(path, err))?
                }
            },
            Kind::Symlink => {
                let there = std::fs::symlink_metadata(&full);
                let same = there.as_ref().is_ok_and(|m| m.is_symlink())
                    && std::fs::read_link(&full)
                        .is_ok_and(|t| t.as_os_str().as_encoded_bytes() == e.target.as_bytes());
                if !same {
                    if there.is_ok() {
                        std::fs::remove_file(&full).map_err(|err| io(path, err))?;
                    }
                    // Created, never followed: the target is data.
                    std::os::unix::fs::symlink(&e.target, &full).map_err(|err| io(path, err))?;
                    stats.written += 1;
                }
            }
            Kind::File => files.push((path, e)),
        }
    }
    let per = files.len().div_ceil(threads).max(1);
    let contents = &contents;
    let written = std::thread::scope(|sc| {
        let writers: Vec<_> = files
            .chunks(per)
            .map(|part| {
                sc.spawn(move || -> Result<(u64, u64), Error> {
                    let (mut n, mut bytes) = (0, 0);
                    let mut parents = crate::beneath::Parents::new(root);
                    for (path, e) in part {
                        let full = entry_in_place(&mut parents, path)?;
                        let mode = if e.exec { 0o755 } else { 0o644 };
                        if let Some(data) = contents.get(e.hash.as_str()) {
                            write_atomic(&full, data, mode).map_err(|err| io(path, err))?;
                            n += 1;
                            bytes += data.len() as u64;
                        } else {
                            // Same content as before, only the exec bit changed: on the
                            // file itself, never through a symlink.
                            set_mode_nofollow(&full, mode).map_err(|err| io(path, err))?;
                        }
                    }
                    Ok((n, bytes))
                })
            })
            .collect();
        writers
            .into_iter()
            .map(|h| h.join().expect("writer panicked"))
            .try_fold((0, 0), |(a, b), r| r.map(|(n, x)| (a + n, b + x)))
    })?;
    stats.written += written.0;
    stats.written_bytes += written.1;
    // One `syncfs` for the whole materialisation, instead of an fsync per file.
    crate::fsio::syncfs(root).map_err(|e| io("", e))?;
    Ok(stats)
}

/// A name for the entry `path` through its parent held open (see
/// [`crate::beneath::Parents`]); `None` when the parent does not exist.
fn entry(
    parents: &mut crate::beneath::Parents,
    path: &str,
) -> Result<Option<std::path::PathBuf>, Error> {
    use crate::beneath::NoEntry;
    match parents.entry(path) {
        Ok(p) => Ok(Some(p)),
        Err(NoEntry::Missing) => Ok(None),
        Err(NoEntry::NotADirectory) => Err(rejected(
            path,
            "a directory above it on disk is not a directory, or is a symlink".to_string(),
        )),
        Err(NoEntry::Io(e)) => Err(io(path, e)),
    }
}

/// [`entry`] for an entry whose parent must exist (made before it, in path order).
fn entry_in_place(
    parents: &mut crate::beneath::Parents,
    path: &str,
) -> Result<std::path::PathBuf, Error> {
    entry(parents, path)?.ok_or_else(|| {
        io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "its directory is missing"),
        )
    })
}

/// Sets the permission bits of the regular file at `full`, refusing a symlink or anything
/// else that is not a regular file.
fn set_mode_nofollow(full: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(full)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    f.set_permissions(std::fs::Permissions::from_mode(mode))
}

fn write_atomic(full: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    // A directory where the file goes (the manifest changed a directory into a file) is
    // removed first; the whole materialisation is synced once at the end.
    if std::fs::symlink_metadata(full).is_ok_and(|m| m.is_dir()) {
        std::fs::remove_dir_all(full)?;
    }
    crate::fsio::write_atomic(full, data, mode, crate::fsio::Durability::Deferred)
}
