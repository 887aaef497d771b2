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

use std::collections::BTreeMap;
use std::io::Read;

use std::sync::Mutex;

use crate::locks::Lock;

use serde::{Deserialize, Serialize};

use crate::paths;

mod tree;
pub mod write;

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
    /// The caller could not give the blob: not sent, not on this machine, unreadable.
    #[error("blob {hash} for {path:?} is missing: {source}")]
    MissingBlob {
        path: String,
        hash: String,
        #[source]
        source: std::io::Error,
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
/// Its root hash is that of a hash tree over its directories (see `tree.rs`), kept up to date as
/// entries change, so it costs what changed rather than the size of the tree; so do the
/// counts of files and bytes.
#[derive(Default)]
pub struct Manifest {
    entries: BTreeMap<String, Entry>,
    /// Files and their bytes, kept as entries change.
    files: u64,
    bytes: u64,
    /// The directories' hashes. A lock because they are computed when asked for, on a
    /// manifest that may be shared (the mirror's cache hands out `Arc`s).
    tree: Mutex<tree::Hashes>,
}

impl Clone for Manifest {
    fn clone(&self) -> Self {
        Self {
            entries: self.entries.clone(),
            files: self.files,
            bytes: self.bytes,
            tree: Mutex::new(self.tree.locked().clone()),
        }
    }
}

impl PartialEq for Manifest {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
    }
}

impl Eq for Manifest {}

impl std::fmt::Debug for Manifest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manifest")
            .field("entries", &self.entries)
            .finish()
    }
}

/// A manifest as it is written: its entries.
#[derive(Serialize, Deserialize)]
struct Wire<E> {
    entries: E,
}

impl Serialize for Manifest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Wire {
            entries: &self.entries,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Manifest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Wire::<BTreeMap<String, Entry>>::deserialize(d).map(|w| Manifest::from(w.entries))
    }
}

impl From<BTreeMap<String, Entry>> for Manifest {
    fn from(entries: BTreeMap<String, Entry>) -> Self {
        let files = entries.values().filter(|e| e.kind == Kind::File);
        let (files, bytes) = files.fold((0, 0), |(n, b), e| (n + 1, b + e.size));
        Self {
            entries,
            files,
            bytes,
            tree: Default::default(),
        }
    }
}

impl FromIterator<(String, Entry)> for Manifest {
    fn from_iter<I: IntoIterator<Item = (String, Entry)>>(iter: I) -> Self {
        Manifest::from(iter.into_iter().collect::<BTreeMap<_, _>>())
    }
}

impl Manifest {
    /// The entries, by path.
    pub fn entries(&self) -> &BTreeMap<String, Entry> {
        &self.entries
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry at `path`.
    pub fn get(&self, path: &str) -> Option<&Entry> {
        self.entries.get(path)
    }

    /// Adds or replaces the entry at `path` (its parent is not checked: see
    /// [`Manifest::validate`]); returns the one it replaced.
    pub fn insert(&mut self, path: String, e: Entry) -> Option<Entry> {
        {
            let mut t = self.tree.locked();
            t.touch(tree::parent(&path));
            if e.kind == Kind::Dir {
                t.touch(&path);
            }
        }
        if e.kind == Kind::File {
            self.files += 1;
            self.bytes += e.size;
        }
        let old = self.entries.insert(path, e);
        if let Some(o) = &old {
            self.uncount(o);
        }
        old
    }

    /// Removes the entry at `path` only (what is under it stays: see
    /// [`Manifest::remove_tree`]).
    pub fn remove(&mut self, path: &str) -> Option<Entry> {
        let old = self.entries.remove(path)?;
        let mut t = self.tree.locked();
        t.touch(tree::parent(path));
        if old.kind == Kind::Dir {
            t.forget(path);
        }
        drop(t);
        self.uncount(&old);
        Some(old)
    }

    fn uncount(&mut self, e: &Entry) {
        if e.kind == Kind::File {
            self.files -= 1;
            self.bytes -= e.size;
        }
    }

    /// The hash of the whole tree: the root directory's hash in the tree of directory
    /// hashes, hex.
    pub fn root_hash(&self) -> String {
        hex::encode(self.tree.locked().root(&self.entries))
    }

    /// Whether this manifest has this root hash, or had it under the flat hash of earlier
    /// versions (BLAKE3 over every entry in path order), which manifests stored before the
    /// hash tree are named by.
    pub fn matches_root(&self, root: &str) -> bool {
        self.root_hash() == root || self.flat_root_hash() == root
    }

    /// The flat hash earlier versions named manifests by.
    fn flat_root_hash(&self) -> String {
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

    /// Directories hashed so far (what a change costs, for tests).
    #[cfg(test)]
    fn work(&self) -> u64 {
        self.tree.locked().hashed
    }

    /// Number of files.
    pub fn files(&self) -> u64 {
        self.files
    }

    /// Total bytes of the files.
    pub fn bytes(&self) -> u64 {
        self.bytes
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

    /// The delta that turns `self` into `to`, found by descending only into directories
    /// whose hashes differ: it costs what changed times the depth (once both manifests'
    /// hashes are computed, which they are after [`Manifest::root_hash`]).
    pub fn diff(&self, to: &Manifest) -> Delta {
        if std::ptr::eq(self, to) {
            return Delta::default();
        }
        // Two locks, taken in address order so that two diffs of the same pair cannot wait
        // on each other.
        let (first, second) = if (self as *const Self) < (to as *const Self) {
            (self, to)
        } else {
            (to, self)
        };
        let mut g1 = first.tree.locked();
        let mut g2 = second.tree.locked();
        g1.root(&first.entries);
        g2.root(&second.entries);
        let (a, b) = if std::ptr::eq(first, self) {
            (&*g1, &*g2)
        } else {
            (&*g2, &*g1)
        };
        let mut d = Delta::default();
        diff_dirs(&self.entries, a, &to.entries, b, &mut d);
        d.deletes.sort();
        d
    }

    /// Applies a delta from the wire to a manifest that is valid (one the mirror stored):
    /// the changed entries are checked as [`Manifest::validate`] would, so the result is
    /// valid too, at a cost that grows with the delta rather than the tree. A bad delta
    /// leaves the manifest as it was.
    pub fn apply(&self, delta: &Delta, rules: &Rules) -> Result<Manifest, Error> {
        // The copy takes the delta's checks (before it changes); `self` is left as it was.
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
            m.insert(p.clone(), e.clone());
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

    /// The entries directly in `dir` ("" for the root): name and entry, in name order, at a
    /// cost of one lookup per child (what lies deeper is skipped, not read).
    pub fn children<'a>(&'a self, dir: &str) -> impl Iterator<Item = (&'a str, &'a Entry)> + 'a {
        tree::children(&self.entries, dir).map(|c| (c.name, c.entry))
    }

    /// The paths strictly under `dir`, in order.
    pub fn under<'a>(&'a self, dir: &str) -> impl Iterator<Item = &'a str> + 'a {
        under(&self.entries, dir).map(|(k, _)| k.as_str())
    }

    /// Removes `path` and everything under it.
    pub fn remove_tree(&mut self, path: &str) {
        let under: Vec<String> = self.under(path).map(String::from).collect();
        for k in under.iter().rev() {
            self.remove(k);
        }
        self.remove(path);
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

/// The entries strictly under `dir`, in order.
fn under<'a>(
    entries: &'a BTreeMap<String, Entry>,
    dir: &str,
) -> impl Iterator<Item = (&'a String, &'a Entry)> + 'a {
    let lo = format!("{dir}/");
    let hi = format!("{dir}0"); // '0' sorts right after '/'
    entries.range::<String, _>((std::ops::Bound::Included(lo), std::ops::Bound::Excluded(hi)))
}

/// Adds to `d` what turns directory listings `a` into `b`, from the root down, skipping every
/// directory whose hash is the same on both sides.
fn diff_dirs(
    a: &BTreeMap<String, Entry>,
    ha: &tree::Hashes,
    b: &BTreeMap<String, Entry>,
    hb: &tree::Hashes,
    d: &mut Delta,
) {
    let mut todo: Vec<String> = vec![String::new()];
    while let Some(dir) = todo.pop() {
        if ha.dir(&dir) == hb.dir(&dir) {
            continue;
        }
        let mut xs = tree::children(a, &dir).peekable();
        let mut ys = tree::children(b, &dir).peekable();
        loop {
            let order = match (xs.peek(), ys.peek()) {
                (None, None) => break,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some(x), Some(y)) => x.name.cmp(y.name),
            };
            match order {
                std::cmp::Ordering::Less => {
                    let x = xs.next().expect("peeked");
                    let p = x.path.to_string();
                    d.deletes.extend(under(a, &p).map(|(k, _)| k.clone()));
                    d.deletes.push(p);
                }
                std::cmp::Ordering::Greater => {
                    let y = ys.next().expect("peeked");
                    let p = y.path.to_string();
                    d.upserts
                        .extend(under(b, &p).map(|(k, e)| (k.clone(), e.clone())));
                    d.upserts.insert(p, y.entry.clone());
                }
                std::cmp::Ordering::Equal => {
                    let (x, y) = (xs.next().expect("peeked"), ys.next().expect("peeked"));
                    let p = x.path.to_string();
                    match (x.entry.kind == Kind::Dir, y.entry.kind == Kind::Dir) {
                        (true, true) => todo.push(p),
                        (was_dir, is_dir) => {
                            if x.entry != y.entry {
                                d.upserts.insert(p.clone(), y.entry.clone());
                            }
                            if was_dir {
                                d.deletes.extend(under(a, &p).map(|(k, _)| k.clone()));
                            }
                            if is_dir {
                                d.upserts
                                    .extend(under(b, &p).map(|(k, e)| (k.clone(), e.clone())));
                            }
                        }
                    }
                }
            }
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

/// [`compress`] for many blobs in a row: one zstd context made once, not one per blob.
pub struct Compressor(zstd::bulk::Compressor<'static>);

impl Compressor {
    pub fn new() -> Self {
        Self(
            zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("zstd makes a context at its own level"),
        )
    }

    pub fn compress(&mut self, data: &[u8]) -> Vec<u8> {
        self.0.compress(data).expect("zstd compresses any input")
    }
}

impl Default for Compressor {
    fn default() -> Self {
        Self::new()
    }
}

/// Decompressed sizes up to this take the one-call path in [`decompress`]: the output is
/// allocated at the size the frame states before zstd checks it, so a lying header costs at
/// most this much memory.
const ONE_CALL_MAX: usize = 8 << 20;

thread_local! {
    /// A zstd context per thread for [`decompress`], made once (a blob store decompresses
    /// thousands of small blobs in a row; a context each was a tenth of the work).
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Decompresses at most `max` bytes; more is an error (a zip bomb is refused).
pub fn decompress(data: &[u8], max: u64) -> std::io::Result<Vec<u8>> {
    // A frame that says it is larger than allowed is refused before anything is inflated.
    if let Ok(Some(size)) = zstd::zstd_safe::get_frame_content_size(data)
        && size > max
    {
        return Err(std::io::Error::other(format!(
            "decompressed data is over the limit (the frame says {size} bytes, at most {max} are taken)"
        )));
    }
    // Frames that state their size (all of ours): one call, into an output of that size.
    if let Some(size) = zstd::bulk::Decompressor::upper_bound(data)
        && size <= ONE_CALL_MAX
        && size as u64 <= max
    {
        return DECOMPRESSOR.with(|d| {
            let mut d = d.borrow_mut();
            let d = match &mut *d {
                Some(d) => d,
                None => d.insert(zstd::bulk::Decompressor::new()?),
            };
            d.decompress(data, size)
        });
    }
    let mut out = Vec::new();
    let dec = zstd::stream::read::Decoder::new(data)?;
    dec.take(max.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(std::io::Error::other("decompressed data is over the limit"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
