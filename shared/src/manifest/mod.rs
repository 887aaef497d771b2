//! The workspace model both sides agree on: a manifest (workspace-relative path → kind, exec
//! bit, size, BLAKE3 hash) with a root hash, deltas between manifests, the scan that builds a
//! manifest from a directory (re-hashing only what changed, as git's index does), and the
//! checks every manifest or delta from the wire must pass before anything is written.
//!
//! A manifest is a tree: every entry's parent directory is itself an entry, so no path can
//! run through a symlink. Symlinks are data: their target is carried as the link holds it,
//! wherever it points (`venv/bin/python -> /usr/bin/python3`), and neither side ever follows
//! one: the tree rule keeps every write under real directories, and links are created, never
//! written through. Modes carry only the exec bit (no setuid); special files are not part of
//! a workspace.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::paths;

/// Largest file a workspace may hold, by default.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 256 * 1024 * 1024;
/// Most entries a workspace may hold, by default.
pub const DEFAULT_MAX_ENTRIES: usize = 200_000;

/// What kind of entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// One entry of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub kind: Kind,
    /// Files: executable by its owner.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exec: bool,
    /// Files: bytes; symlinks: length of the target.
    #[serde(default)]
    pub size: u64,
    /// Files: BLAKE3 of the content, hex. Empty for directories and symlinks.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hash: String,
    /// Symlinks: the target as the link holds it (relative or absolute, inside the workspace
    /// or not: it is never followed).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target: String,
}

impl Entry {
    pub fn dir() -> Self {
        Self {
            kind: Kind::Dir,
            exec: false,
            size: 0,
            hash: String::new(),
            target: String::new(),
        }
    }

    pub fn file(content: &[u8], exec: bool) -> Self {
        Self {
            kind: Kind::File,
            exec,
            size: content.len() as u64,
            hash: hash(content),
            target: String::new(),
        }
    }

    pub fn symlink(target: &str) -> Self {
        Self {
            kind: Kind::Symlink,
            exec: false,
            size: target.len() as u64,
            hash: String::new(),
            target: target.to_string(),
        }
    }
}

/// An entry of a workspace left out of its mirror, and why (what a worker's scan could not
/// carry: see [`crate::scan`]). For people: the path is as shown, not a wire path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftOut {
    pub path: String,
    pub reason: String,
}

/// Most left-out entries one barrier names (the rest are counted).
pub const MAX_LEFT_OUT: usize = 32;

impl LeftOut {
    /// Bounds what a worker reported: at most [`MAX_LEFT_OUT`] entries, each path and reason
    /// cut to a printable length with control characters escaped; returns them and how many
    /// more there are.
    pub fn from_wire(list: &[proto::LeftOut], more: u64) -> (Vec<LeftOut>, u64) {
        fn clean(s: &str, max: usize) -> String {
            let mut out: String = s
                .chars()
                .take(max)
                .flat_map(|c| {
                    let esc: Vec<char> = if c.is_control() {
                        c.escape_default().collect()
                    } else {
                        vec![c]
                    };
                    esc
                })
                .collect();
            if s.chars().count() > max {
                out.push('…');
            }
            out
        }
        let kept: Vec<LeftOut> = list
            .iter()
            .take(MAX_LEFT_OUT)
            .map(|l| LeftOut {
                path: clean(&l.path, 512),
                reason: clean(&l.reason, 256),
            })
            .collect();
        let extra = (list.len() - kept.len()) as u64;
        (kept, more.saturating_add(extra))
    }
}

/// BLAKE3 of some bytes, hex.
pub fn hash(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

/// Why a manifest, delta or blob was refused, or a scan failed. Every variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("workspace entry {path:?} rejected: {reason}")]
    Rejected { path: String, reason: String },
    #[error(
        "the workspace has more than {max} entries; raise the limit or exclude more (e.g. build outputs)"
    )]
    TooMany { max: usize },
    #[error("blob for {path:?} does not match its hash (expected {expected}, got {actual})")]
    HashMismatch {
        path: String,
        expected: String,
        actual: String,
    },
    #[error("blob {hash} for {path:?} is missing: {reason}")]
    MissingBlob {
        path: String,
        hash: String,
        reason: String,
    },
    #[error("{path:?}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub(crate) fn rejected(path: &str, reason: impl Into<String>) -> Error {
    Error::Rejected {
        path: path.to_string(),
        reason: reason.into(),
    }
}

pub(crate) fn io(path: &str, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_string(),
        source,
    }
}

/// Limits and options every check applies.
#[derive(Debug, Clone)]
pub struct Rules {
    pub max_file_bytes: u64,
    pub max_entries: usize,
    /// Whether `.git/` is part of the workspace (off by default).
    pub include_git: bool,
    /// Directory or file names excluded wherever they are, besides `.gitignore`.
    pub excludes: Vec<String>,
}

impl Rules {
    /// Adds excluded names, keeping only plain names (no `/`).
    pub fn extend_excludes(&mut self, names: &[String]) {
        self.excludes.extend(
            names
                .iter()
                .filter(|n| !n.is_empty() && !n.contains('/') && *n != "." && *n != "..")
                .take(64)
                .cloned(),
        );
    }
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_entries: DEFAULT_MAX_ENTRIES,
            include_git: false,
            excludes: crate::workspace::DEFAULT_EXCLUDES
                .iter()
                .filter(|e| **e != ".git")
                .map(|s| s.to_string())
                .collect(),
        }
    }
}

/// A workspace's manifest: sorted by path, so iteration order and the root hash are stable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub entries: BTreeMap<String, Entry>,
}

impl Manifest {
    /// The hash of the whole tree: BLAKE3 over every entry in path order.
    pub fn root_hash(&self) -> String {
        // Hashed in large pieces: the same digest as entry by entry, without the per-call
        // cost that dominates on small entries.
        let mut h = blake3::Hasher::new();
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
        for (path, e) in &self.entries {
            buf.extend_from_slice(path.as_bytes());
            buf.extend_from_slice(&[0, e.kind as u8, e.exec as u8]);
            buf.extend_from_slice(&e.size.to_le_bytes());
            buf.extend_from_slice(e.hash.as_bytes());
            buf.push(0);
            buf.extend_from_slice(e.target.as_bytes());
            buf.push(0);
            if buf.len() >= 1 << 16 {
                h.update(&buf);
                buf.clear();
            }
        }
        h.update(&buf);
        h.finalize().to_hex().to_string()
    }

    /// Total bytes of the files.
    pub fn bytes(&self) -> u64 {
        self.entries
            .values()
            .filter(|e| e.kind == Kind::File)
            .map(|e| e.size)
            .sum()
    }

    /// Distinct file hashes.
    pub fn blobs(&self) -> impl Iterator<Item = &str> {
        let mut seen = std::collections::BTreeSet::new();
        for e in self.entries.values() {
            if e.kind == Kind::File {
                seen.insert(e.hash.as_str());
            }
        }
        seen.into_iter()
    }

    /// Checks a manifest from the wire: every path canonical and relative, a tree (every
    /// parent a directory entry, so nothing lies under a symlink), symlink targets
    /// well-formed, sizes and counts within the rules, hashes well-formed, `.git/` only when
    /// allowed.
    pub fn validate(&self, rules: &Rules) -> Result<(), Error> {
        if self.entries.len() > rules.max_entries {
            return Err(Error::TooMany {
                max: rules.max_entries,
            });
        }
        for (path, e) in &self.entries {
            check_entry(path, e, rules)?;
            self.check_parent(path)?;
        }
        Ok(())
    }

    /// The delta that turns `self` into `to`.
    pub fn diff(&self, to: &Manifest) -> Delta {
        let mut d = Delta::default();
        for (p, e) in &to.entries {
            if self.entries.get(p) != Some(e) {
                d.upserts.insert(p.clone(), e.clone());
            }
        }
        for p in self.entries.keys() {
            if !to.entries.contains_key(p) {
                d.deletes.push(p.clone());
            }
        }
        d
    }

    /// Applies a delta from the wire to a manifest that is valid (one the mirror stored):
    /// the changed entries are checked as [`Manifest::validate`] would, so the result is
    /// valid too, at a cost that grows with the delta rather than the tree. A bad delta
    /// leaves the manifest as it was.
    pub fn apply(&self, delta: &Delta, rules: &Rules) -> Result<Manifest, Error> {
        for p in &delta.deletes {
            check_path(p, rules)?;
        }
        for (p, e) in &delta.upserts {
            check_entry(p, e, rules)?;
        }
        self.clone().apply_owned(delta, rules)
    }

    /// [`Manifest::apply`] without a copy: on an error the manifest is lost, so the caller
    /// must be able to do without it (the mirror reads it back from its store).
    pub fn apply_owned(mut self, delta: &Delta, rules: &Rules) -> Result<Manifest, Error> {
        for p in &delta.deletes {
            check_path(p, rules)?;
        }
        for (p, e) in &delta.upserts {
            check_entry(p, e, rules)?;
        }
        let m = &mut self;
        for p in &delta.deletes {
            // Deleting a directory deletes what is under it.
            m.remove_tree(p);
        }
        for (p, e) in &delta.upserts {
            m.entries.insert(p.clone(), e.clone());
        }
        if m.entries.len() > rules.max_entries {
            return Err(Error::TooMany {
                max: rules.max_entries,
            });
        }
        for (p, e) in &delta.upserts {
            m.check_parent(p)?;
            if e.kind != Kind::Dir
                && let Some(child) = m.under(p).next()
            {
                return Err(rejected(
                    child,
                    format!(
                        "its parent {p:?} is not a directory (a path through a symlink or a file)"
                    ),
                ));
            }
        }
        Ok(self)
    }

    /// The paths strictly under `dir`, in order.
    pub fn under<'a>(&'a self, dir: &str) -> impl Iterator<Item = &'a str> + 'a {
        let lo = format!("{dir}/");
        let hi = format!("{dir}0"); // '0' sorts right after '/'
        self.entries
            .range::<String, _>((std::ops::Bound::Included(lo), std::ops::Bound::Excluded(hi)))
            .map(|(k, _)| k.as_str())
    }

    /// Removes `path` and everything under it.
    pub fn remove_tree(&mut self, path: &str) {
        self.entries.remove(path);
        let under: Vec<String> = self.under(path).map(String::from).collect();
        for k in under {
            self.entries.remove(&k);
        }
    }

    fn check_parent(&self, path: &str) -> Result<(), Error> {
        let Some((parent, _)) = path.rsplit_once('/') else {
            return Ok(());
        };
        match self.entries.get(parent) {
            Some(p) if p.kind == Kind::Dir => Ok(()),
            Some(_) => Err(rejected(
                path,
                format!(
                    "its parent {parent:?} is not a directory (a path through a symlink or a file)"
                ),
            )),
            None => Err(rejected(
                path,
                format!("its parent {parent:?} is not in the manifest"),
            )),
        }
    }
}

/// The changes between two manifests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delta {
    pub upserts: BTreeMap<String, Entry>,
    pub deletes: Vec<String>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.deletes.is_empty()
    }
}

/// Checks a path's text: canonical (no `.`, empty components or trailing `/`), relative,
/// no `..`, NUL or control characters, and not under `.git/` unless allowed.
pub fn check_path(path: &str, rules: &Rules) -> Result<(), Error> {
    let parts = paths::check_relative(path).map_err(|e| rejected(path, e.to_string()))?;
    if parts.is_empty() || parts.join("/") != path {
        return Err(rejected(
            path,
            "not a canonical relative path (no '.', '//' or trailing '/')",
        ));
    }
    if !rules.include_git && parts[0] == ".git" {
        return Err(rejected(
            path,
            "paths under .git/ are not synced unless the task opts in",
        ));
    }
    if parts.iter().any(|p| p.len() > 255) {
        return Err(rejected(path, "a name is longer than 255 bytes"));
    }
    Ok(())
}

fn check_entry(path: &str, e: &Entry, rules: &Rules) -> Result<(), Error> {
    check_path(path, rules)?;
    match e.kind {
        Kind::File => {
            if e.size > rules.max_file_bytes {
                return Err(rejected(
                    path,
                    format!(
                        "{} bytes is over the {}-byte file limit",
                        e.size, rules.max_file_bytes
                    ),
                ));
            }
            if e.hash.len() != 64 || !e.hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(rejected(path, "the hash is not a hex BLAKE3 digest"));
            }
            if !e.target.is_empty() {
                return Err(rejected(path, "a file has no link target"));
            }
        }
        Kind::Dir => {
            if e.exec || e.size != 0 || !e.hash.is_empty() || !e.target.is_empty() {
                return Err(rejected(
                    path,
                    "a directory has no size, hash, target or exec bit",
                ));
            }
        }
        Kind::Symlink => {
            // Any target is data; only its form is checked (it is never followed).
            let t = &e.target;
            if t.is_empty() || t.len() > paths::MAX_PATH_BYTES || t.contains('\0') {
                return Err(rejected(
                    path,
                    "invalid symlink target (empty, over 4096 bytes, or with a NUL)",
                ));
            }
            if e.exec || !e.hash.is_empty() || e.size != t.len() as u64 {
                return Err(rejected(
                    path,
                    "a symlink has no hash or exec bit, and its size is its target's length",
                ));
            }
        }
    }
    Ok(())
}

/// zstd level for blobs and manifests on the wire and at rest: fast, and still a good ratio
/// on source code.
pub const ZSTD_LEVEL: i32 = 3;

pub fn compress(data: &[u8]) -> Vec<u8> {
    zstd::bulk::compress(data, ZSTD_LEVEL).expect("zstd compresses any input")
}

/// Decompresses at most `max` bytes; more is an error (a zip bomb is refused).
pub fn decompress(data: &[u8], max: u64) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let dec = zstd::stream::read::Decoder::new(data)?;
    dec.take(max.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(std::io::Error::other("decompressed data is over the limit"));
    }
    Ok(out)
}

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
/// filesystem is synced once at the end (not once a file).
pub fn materialise(
    root: &Path,
    current: &Manifest,
    target: &Manifest,
    rules: &Rules,
    blob: &mut dyn FnMut(&str) -> Result<Vec<u8>, String>,
) -> Result<Applied, Error> {
    target.validate(rules)?;
    let mut stats = Applied::default();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    // Fetch what is new, and check it (on every core) before changing anything.
    let mut fetched: Vec<(&str, &str, Vec<u8>)> = Vec::new();
    let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (path, e) in &target.entries {
        if e.kind != Kind::File || current.entries.get(path) == Some(e) {
            continue;
        }
        if !seen.insert(e.hash.as_str()) {
            continue;
        }
        let data = blob(&e.hash).map_err(|reason| Error::MissingBlob {
            path: path.clone(),
            hash: e.hash.clone(),
            reason,
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
    let mut parents = crate::beneath::Parents::new(root);
    for (path, e) in current.entries.iter().rev() {
        let keep = target
            .entries
            .get(path)
            .is_some_and(|t| t.kind == e.kind && (e.kind != Kind::Symlink || t.target == e.target));
        if keep {
            continue;
        }
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
    for (path, e) in &target.entries {
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
            Kind::File => {
                if current.entries.get(path) != Some(e) {
                    files.push((path, e));
                }
            }
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

#[cfg(test)]
mod tests;
