//! Building a manifest from a directory: a full walk, or — when a file watcher says which
//! paths changed since the last scan — only the directories those changes are in.
//!
//! Both walks decide what belongs to the workspace with the same rules: `.git/` only on
//! opt-in, the configured excluded directory names, and `.gitignore` / `.ignore` files (and
//! `.git/info/exclude`) with git's precedence, the deepest directory's file first and, within
//! one directory, the last matching pattern. Files are re-hashed only when their size, mtime,
//! ctime or inode changed, or when their mtime or ctime is too close to the previous scan to
//! trust (the "racy" case: a same-size rewrite within one timestamp tick looks unchanged; git
//! re-hashes those too). The ctime catches a rewrite whose old mtime was put back, as
//! `cp -p`, `tar x` and `rsync -t` do.
//!
//! A scan never fails because of one entry in the tree: what the receiving side would refuse
//! or cannot hold — a name that is not UTF-8 or has a control character, a FIFO, socket or
//! device, a file over the size limit, an entry that cannot be read, a file that keeps
//! changing while it is hashed (tried [`READ_TRIES`] times) — is left out and listed in
//! [`Scanner::left_out`] with the reason. An entry that vanishes during the scan is simply
//! gone. Symlinks are read, never followed.
//!
//! The full walk and the partial scan apply the same rules (ignores, left-out
//! entries, git-index hashing) through private helpers they share; the tests are in `tests.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::FileType;
use std::io::Read;
use std::os::unix::fs::{DirEntryExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::manifest::{Entry, Error, Kind, Manifest, Rules, io};

/// What a scan remembers of a file to skip re-hashing it: size, mtime, ctime and inode, as
/// git's index does. The ctime matters where the mtime was put back: `cp -p`, `tar x` and
/// `rsync -t` restore a file's old mtime after rewriting it, but none can set its ctime,
/// which the kernel moves on every write and every change of metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    ino: u64,
}

/// How close to the previous scan an mtime must be to be re-hashed anyway: a few ticks of
/// the kernel's coarse clock, which file timestamps come from.
pub(crate) const RACY: Duration = Duration::from_millis(100);

/// How many times a file that changes while it is hashed is read again before it is left out.
pub const READ_TRIES: usize = 3;

/// Names of the files whose patterns decide what is ignored, in order of precedence (last
/// wins).
const IGNORE_FILES: [&str; 2] = [".gitignore", ".ignore"];

/// Builds manifests of one directory; see the module's documentation.
pub struct Scanner {
    root: PathBuf,
    rules: Rules,
    /// Files: stamp and hash, by path, and whether the hash is known without the racy check
    /// (see [`Scanner::prime`]). May hold paths that are gone (checked by stamp).
    cache: HashMap<String, (Stamp, String, bool)>,
    /// Directories: inode, by path ("" is the root), to tell a directory replaced by another.
    dirs: HashMap<String, u64>,
    /// Compiled ignore files by directory (`None`: the directory has none).
    ignores: HashMap<String, Option<Arc<Gitignore>>>,
    /// `.git/info/exclude` as the last full scan saw it (mtime, size).
    exclude_stamp: Option<(i128, u64)>,
    /// The last scan's result, the base of the next partial scan.
    last: Option<Manifest>,
    /// Paths whose entries changed since [`Scanner::mark`] (`None`: unknown, as after a
    /// failed scan), and whether scans are recording into it (partial ones do; full ones
    /// compare with the last manifest instead).
    touched: Option<BTreeSet<String>>,
    recording: bool,
    /// The root hash [`Scanner::mark`] was given, and the scan it was for.
    mark: Option<(String, u64)>,
    /// Entries left out of the manifest as of the last scan, by the path they are shown as
    /// (not-UTF-8 bytes as `\xNN`), with why.
    left_out: BTreeMap<String, String>,
    /// The root, open, for reading files beneath it (`None`: by path, see
    /// [`crate::beneath`]).
    root_fd: Option<std::os::fd::OwnedFd>,
    /// Counts scans.
    generation: u64,
    last_scan: Option<SystemTime>,
    /// Files hashed by the last scan (for figures).
    pub hashed: u64,
    /// Bytes hashed by the last scan.
    pub hashed_bytes: u64,
    /// Directories listed by the last scan.
    pub listed: u64,
    /// Whether the last scan walked the whole tree.
    pub was_full: bool,
}

/// A stamp from a file's metadata.
fn stamp_of(meta: &std::fs::Metadata) -> Stamp {
    Stamp {
        size: meta.len(),
        mtime_ns: mtime_ns(meta),
        ctime_ns: meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128,
        ino: meta.ino(),
    }
}

fn file_entry(meta: &std::fs::Metadata, hash: String) -> Entry {
    Entry {
        kind: Kind::File,
        exec: meta.permissions().mode() & 0o100 != 0,
        size: meta.len(),
        hash,
        target: String::new(),
    }
}

/// What a special file is, for the reason it is left out (`None` for files, directories and
/// symlinks).
fn special(ft: FileType) -> Option<&'static str> {
    if ft.is_fifo() {
        Some("a FIFO (named pipe): special files are not part of a workspace")
    } else if ft.is_socket() {
        Some("a socket: special files are not part of a workspace")
    } else if ft.is_block_device() || ft.is_char_device() {
        Some("a device: special files are not part of a workspace")
    } else {
        None
    }
}

fn over_limit(size: u64, max: u64) -> String {
    format!(
        "{} is over the {} file size limit of the workspace mirror",
        crate::human_bytes(size),
        crate::human_bytes(max)
    )
}

/// BLAKE3 of the regular file at `rel` under `root`, opened beneath it without following any
/// symlink on the way ([`crate::beneath::open_no_symlinks`]: a directory swapped for a link
/// to elsewhere since the walk listed it cannot make the scan read outside), and its metadata
/// from the open file; `None` if it changed while it was read (size, mtime, ctime or inode),
/// is no longer a regular file, or its path now goes through a symlink.
fn hash_stable(
    root_fd: Option<&std::os::fd::OwnedFd>,
    root: &Path,
    rel: &str,
) -> std::io::Result<Option<(String, std::fs::Metadata)>> {
    let Some((mut f, before)) = crate::beneath::open_no_symlinks(root_fd, root, rel)? else {
        return Ok(None);
    };
    let mut h = blake3::Hasher::new();
    // Sized to the file (most are small: a 256 KiB buffer zeroed per file cost more than
    // hashing them), one byte over so a file that grew is still read to its end.
    let cap = usize::try_from(before.len())
        .unwrap_or(usize::MAX)
        .saturating_add(1)
        .min(256 * 1024);
    let mut buf = vec![0u8; cap];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let after = f.metadata()?;
    if stamp_of(&before) != stamp_of(&after) {
        return Ok(None);
    }
    Ok(Some((h.finalize().to_hex().to_string(), after)))
}

/// Why an entry named `name` in `dir` cannot cross the wire (the checks of
/// [`crate::manifest::check_path`], for one more component of a path that passed them).
pub(crate) fn name_problem(dir: &str, name: &std::ffi::OsStr) -> Option<String> {
    let Some(name) = name.to_str() else {
        return Some("its name is not UTF-8".into());
    };
    if name.chars().any(char::is_control) {
        return Some("its name has a control character".into());
    }
    if name.len() > 255 {
        return Some("its name is longer than 255 bytes".into());
    }
    if dir.is_empty() && name.starts_with('\\') {
        return Some(
            "its name starts with a backslash, which the wire takes for an absolute path".into(),
        );
    }
    if dir.len() + 1 + name.len() > crate::paths::MAX_PATH_BYTES {
        return Some("its path is longer than 4096 bytes".into());
    }
    None
}

/// A name for people: bytes that are not UTF-8 as `\xNN`, control characters escaped.
pub fn shown(name: &std::ffi::OsStr) -> String {
    let mut out = String::new();
    for chunk in name.as_encoded_bytes().utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// A directory's included entries: name → (file type, inode).
type Listing = BTreeMap<String, (FileType, u64)>;

fn parent(rel: &str) -> &str {
    rel.rsplit_once('/').map_or("", |(p, _)| p)
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// A time as nanoseconds since the epoch, as the stamps hold them (before it: negative).
fn ns_since_epoch(t: SystemTime) -> i128 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

fn mtime_ns(meta: &std::fs::Metadata) -> i128 {
    meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128
}

impl Scanner {
    pub fn new(root: &Path, rules: Rules) -> Self {
        Self {
            root: root.to_path_buf(),
            rules,
            cache: HashMap::new(),
            dirs: HashMap::new(),
            ignores: HashMap::new(),
            exclude_stamp: None,
            last: None,
            touched: None,
            recording: false,
            mark: None,
            left_out: BTreeMap::new(),
            root_fd: None,
            generation: 0,
            last_scan: None,
            hashed: 0,
            hashed_bytes: 0,
            listed: 0,
            was_full: false,
        }
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// Forgets what earlier scans saw, so the next one walks and re-hashes everything.
    pub fn reset(&mut self) {
        self.cache.clear();
        self.dirs.clear();
        self.last = None;
        self.touched = None;
        self.last_scan = None;
    }

    /// Records that the file at `rel` was just written by us with content of this hash
    /// (checked before writing), so the next scan takes the hash as long as the file's stamp
    /// is unchanged, even inside the racy window. Only for files nothing else writes to
    /// meanwhile, such as those a materialisation writes before any command runs.
    pub fn prime(&mut self, rel: &str, hash: &str) {
        if let Ok(meta) = std::fs::symlink_metadata(self.root.join(rel))
            && meta.is_file()
        {
            let stamp = stamp_of(&meta);
            self.cache
                .insert(rel.to_string(), (stamp, hash.to_string(), true));
        }
    }

    /// Whether a partial scan has a base to start from.
    pub fn has_base(&self) -> bool {
        self.last.is_some()
    }

    /// Counts scans: what [`Scanner::mark`] is given.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Records that the manifest of scan `generation`, with root hash `root`, is what the
    /// other side now holds: [`Scanner::changes_since_mark`] starts from it. Ignored if
    /// another scan ran since.
    pub fn mark(&mut self, generation: u64, root: &str) {
        if generation == self.generation && self.last.is_some() {
            self.mark = Some((root.to_string(), generation));
            self.touched = Some(BTreeSet::new());
        }
    }

    /// The root hash last marked.
    pub fn marked_root(&self) -> Option<&str> {
        self.mark.as_ref().map(|(r, _)| r.as_str())
    }

    /// The delta from the marked manifest to the last scan's, when it is known.
    pub fn changes_since_mark(&self) -> Option<crate::manifest::Delta> {
        let (m, touched) = (self.last.as_ref()?, self.touched.as_ref()?);
        self.mark.as_ref()?;
        let mut d = crate::manifest::Delta::default();
        for p in touched {
            match m.entries().get(p) {
                Some(e) => {
                    d.upserts.insert(p.clone(), e.clone());
                }
                None => d.deletes.push(p.clone()),
            }
        }
        Some(d)
    }

    /// The last scan's manifest.
    pub fn last(&self) -> Option<&Manifest> {
        self.last.as_ref()
    }

    /// What the last scan left out of the manifest (see the module's documentation): shown
    /// path → reason.
    pub fn left_out(&self) -> &BTreeMap<String, String> {
        &self.left_out
    }

    /// The manifest of the directory as it is now, from a full walk. What cannot be part of
    /// it is left out ([`Scanner::left_out`]); too many entries, or a root that cannot be
    /// listed, is an error.
    pub fn scan(&mut self) -> Result<Manifest, Error> {
        self.scan_full(&mut |_| {}).cloned()
    }

    /// [`Scanner::scan`], calling `on_dir` with each directory just before it is listed (so
    /// a watcher can watch it before its entries are read).
    pub fn scan_full(&mut self, on_dir: &mut dyn FnMut(&Path)) -> Result<&Manifest, Error> {
        let started = SystemTime::now();
        self.recording = false;
        self.begin();
        self.was_full = true;
        self.ignores.clear();
        self.dirs.clear();
        self.left_out.clear();
        self.exclude_stamp = self.exclude_file_stamp();
        let mut m = Manifest::default();
        let root_ino = std::fs::symlink_metadata(&self.root)
            .map_err(|e| io("", e))?
            .ino();
        self.dirs.insert(String::new(), root_ino);
        let before = std::mem::take(&mut self.cache);
        let r = self.walk("", &mut m, &before, on_dir);
        if r.is_err() {
            self.cache = before;
            self.last = None;
            self.touched = None;
        }
        r?;
        // What changed since the mark: the difference from the last manifest.
        match (self.last.as_ref(), self.touched.as_mut()) {
            (Some(old), Some(t)) => {
                let d = old.diff(&m);
                t.extend(d.upserts.into_keys());
                t.extend(d.deletes);
            }
            _ => self.touched = None,
        }
        self.finish(m, started)
    }

    /// The manifest as it is now, given every path that may have changed since the last scan
    /// (from a file watcher): only their directories are listed again, and only new
    /// directories walked. Falls back to a full walk when there is no earlier scan or an
    /// ignore file changed. The caller must not leave out a change: anything not named is
    /// taken to be as the last scan saw it.
    pub fn scan_changes(
        &mut self,
        changed: &BTreeSet<String>,
        on_dir: &mut dyn FnMut(&Path),
    ) -> Result<&Manifest, Error> {
        let rules_changed = changed.iter().any(|p| {
            let name = p.rsplit('/').next().unwrap_or(p);
            IGNORE_FILES.contains(&name)
        }) || self.exclude_file_stamp() != self.exclude_stamp;
        if rules_changed || self.last.is_none() {
            return self.scan_full(on_dir);
        }
        let started = SystemTime::now();
        self.begin();
        self.was_full = false;
        self.recording = self.touched.is_some();
        let mut m = self.last.take().expect("checked above");
        // Shallow directories first, so a removed parent goes before its children.
        let mut dirs: Vec<&str> = changed.iter().map(|p| parent(p)).collect();
        dirs.sort_by(|a, b| (a.matches('/').count(), a).cmp(&(b.matches('/').count(), b)));
        dirs.dedup();
        let empty = HashMap::new();
        for d in dirs {
            if let Err(e) = self.relist(d, &mut m, changed, &empty, on_dir) {
                self.last = None;
                self.touched = None;
                return Err(e);
            }
        }
        if self.cache.len() > 2 * m.entries().len() + 1024 {
            self.cache.retain(|k, _| m.entries().contains_key(k));
        }
        self.finish(m, started)
    }

    fn begin(&mut self) {
        // Opened again each scan: the root may have been made or replaced since.
        self.root_fd = crate::beneath::open_root(&self.root);
        self.hashed = 0;
        self.hashed_bytes = 0;
        self.listed = 0;
    }

    fn finish(&mut self, m: Manifest, started: SystemTime) -> Result<&Manifest, Error> {
        self.generation += 1;
        self.recording = false;
        if m.entries().len() > self.rules.max_entries {
            self.last = None;
            self.touched = None;
            return Err(Error::TooMany {
                max: self.rules.max_entries,
            });
        }
        self.last_scan = Some(started);
        Ok(self.last.insert(m))
    }

    /// Notes that `rel`'s entry changed (during a partial scan).
    fn touch(&mut self, rel: &str) {
        if self.recording
            && let Some(t) = self.touched.as_mut()
        {
            t.insert(rel.to_string());
        }
    }

    /// Removes `rel` and everything under it, noting each.
    fn remove(&mut self, m: &mut Manifest, rel: &str) {
        // What was left out under it goes with it (`rel` itself is its directory's business).
        self.forget_left_out(rel, true);
        if self.recording && (m.entries().contains_key(rel) || m.under(rel).next().is_some()) {
            let gone: Vec<String> = std::iter::once(rel)
                .chain(m.under(rel))
                .map(String::from)
                .collect();
            for g in gone {
                self.touch(&g);
            }
        }
        m.remove_tree(rel);
    }

    fn exclude_file_stamp(&self) -> Option<(i128, u64)> {
        let meta = std::fs::metadata(self.root.join(".git/info/exclude")).ok()?;
        Some((mtime_ns(&meta), meta.len()))
    }

    /// The compiled ignore files of directory `dir`, read once per full scan.
    fn matcher(&mut self, dir: &str) -> Option<Arc<Gitignore>> {
        if let Some(g) = self.ignores.get(dir) {
            return g.clone();
        }
        let abs = self.root.join(dir);
        let mut b = GitignoreBuilder::new(&abs);
        let mut any = false;
        let mut files: Vec<PathBuf> = Vec::new();
        if dir.is_empty() {
            files.push(self.root.join(".git/info/exclude"));
        }
        files.extend(IGNORE_FILES.iter().map(|f| abs.join(f)));
        for f in files {
            if f.is_file() {
                // A bad line is skipped, as git does; the rest of the file still applies.
                let _ = b.add(&f);
                any = true;
            }
        }
        let g = any.then(|| b.build().ok().map(Arc::new)).flatten();
        self.ignores.insert(dir.to_string(), g.clone());
        g
    }

    /// Whether an entry named `name` at `rel` stays out of the workspace.
    fn skipped(&mut self, rel: &str, name: &str, is_dir: bool) -> bool {
        if name == ".git" && !self.rules.include_git {
            return true;
        }
        if is_dir && self.rules.excludes.iter().any(|x| x == name) {
            return true;
        }
        // The deepest directory's ignore files decide first.
        let mut dir = parent(rel);
        loop {
            if let Some(g) = self.matcher(dir) {
                let sub = if dir.is_empty() {
                    rel
                } else {
                    &rel[dir.len() + 1..]
                };
                match g.matched(Path::new(sub), is_dir) {
                    Match::Ignore(_) => return true,
                    Match::Whitelist(_) => return false,
                    Match::None => {}
                }
            }
            if dir.is_empty() {
                return false;
            }
            dir = parent(dir);
        }
    }

    /// Records that `rel` is left out, and why.
    fn leave_out(&mut self, rel: &str, why: impl Into<String>) {
        let why = why.into();
        tracing::debug!(path = rel, reason = %why, "left out of the workspace manifest");
        self.left_out.insert(rel.to_string(), why);
    }

    /// Forgets the left-out entries directly in `dir`, or (`deep`) anywhere under it.
    fn forget_left_out(&mut self, dir: &str, deep: bool) {
        if self.left_out.is_empty() {
            return;
        }
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let gone: Vec<String> = self
            .left_out
            .range::<str, _>((
                std::ops::Bound::Included(prefix.as_str()),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter(|(k, _)| deep || !k[prefix.len()..].contains('/'))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.left_out.remove(&k);
        }
    }

    /// The entry for a file or symlink at `rel`, hashing only when the stamp says so. `None`
    /// when it vanished or is left out.
    fn leaf(
        &mut self,
        rel: &str,
        _ft: FileType,
        before: &HashMap<String, (Stamp, String, bool)>,
    ) -> Result<Option<Entry>, Error> {
        let path = self.root.join(rel);
        for _ in 0..READ_TRIES {
            // What it is now (it may have changed since it was listed).
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => {
                    self.leave_out(rel, format!("cannot be read: {e}"));
                    return Ok(None);
                }
            };
            let ft = meta.file_type();
            if ft.is_symlink() {
                return Ok(self.symlink(rel, &path));
            }
            if !ft.is_file() {
                if let Some(what) = special(ft) {
                    self.leave_out(rel, what);
                }
                return Ok(None);
            }
            if meta.len() > self.rules.max_file_bytes {
                self.leave_out(rel, over_limit(meta.len(), self.rules.max_file_bytes));
                return Ok(None);
            }
            let stamp = stamp_of(&meta);
            let racy_after = self.last_scan.map(|t| t - RACY);
            // Racy: changed (mtime) or rewritten with its mtime put back (ctime) too close to
            // the previous scan for a timestamp tick to tell apart.
            let racy = racy_after.is_none_or(|t| {
                meta.modified().map_or(true, |m| m >= t) || stamp.ctime_ns >= ns_since_epoch(t)
            });
            let known = self.cache.get(rel).or_else(|| before.get(rel));
            if let Some((s, h, primed)) = known
                && *s == stamp
                && (!racy || *primed)
            {
                let h = h.clone();
                self.cache
                    .insert(rel.to_string(), (stamp, h.clone(), false));
                return Ok(Some(file_entry(&meta, h)));
            }
            match hash_stable(self.root_fd.as_ref(), &self.root, rel) {
                Ok(Some((h, meta))) => {
                    self.hashed += 1;
                    self.hashed_bytes += meta.len();
                    if meta.len() > self.rules.max_file_bytes {
                        self.leave_out(rel, over_limit(meta.len(), self.rules.max_file_bytes));
                        return Ok(None);
                    }
                    self.cache
                        .insert(rel.to_string(), (stamp_of(&meta), h.clone(), false));
                    return Ok(Some(file_entry(&meta, h)));
                }
                // Changed while it was read, or replaced: look again.
                Ok(None) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => {
                    self.leave_out(rel, format!("cannot be read: {e}"));
                    return Ok(None);
                }
            }
        }
        self.leave_out(
            rel,
            format!(
                "it kept changing while it was read ({READ_TRIES} tries); the next sync tries again"
            ),
        );
        Ok(None)
    }

    /// A symlink's entry: its target as it is, never followed. Left out when the target is
    /// not UTF-8 or too long to cross the wire.
    fn symlink(&mut self, rel: &str, path: &Path) -> Option<Entry> {
        let t = match std::fs::read_link(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                self.leave_out(rel, format!("cannot be read: {e}"));
                return None;
            }
        };
        match t.to_str() {
            Some(t) if !t.is_empty() && t.len() <= crate::paths::MAX_PATH_BYTES => {
                Some(Entry::symlink(t))
            }
            Some(_) => {
                self.leave_out(rel, "a symlink whose target is over 4096 bytes");
                None
            }
            None => {
                self.leave_out(
                    rel,
                    format!(
                        "a symlink whose target {} is not UTF-8",
                        shown(t.as_os_str())
                    ),
                );
                None
            }
        }
    }

    /// The included entries directly in `dir` (`None` if it is gone, or cannot be listed:
    /// then it is left out).
    fn list(&mut self, dir: &str) -> Result<Option<Listing>, Error> {
        let rd = match std::fs::read_dir(self.root.join(dir)) {
            Ok(rd) => rd,
            // Gone since its parent was listed: its parent's change covers it.
            Err(e)
                if !dir.is_empty()
                    && matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) =>
            {
                return Ok(None);
            }
            Err(e) if !dir.is_empty() => {
                self.leave_out(dir, format!("a directory that cannot be listed: {e}"));
                return Ok(None);
            }
            Err(e) => return Err(io(dir, e)),
        };
        self.listed += 1;
        let listed: Vec<std::io::Result<std::fs::DirEntry>> = rd.collect();
        // A directory whose listing holds no ignore file has none: its entries are matched
        // without looking for one (two `stat`s per directory saved on a walk).
        if !dir.is_empty() && !self.ignores.contains_key(dir) {
            let has = listed.iter().any(|d| {
                d.as_ref()
                    .is_ok_and(|d| IGNORE_FILES.iter().any(|f| d.file_name() == *f))
            });
            if !has {
                self.ignores.insert(dir.to_string(), None);
            }
        }
        let mut out = BTreeMap::new();
        for d in listed {
            let d = match d {
                Ok(d) => d,
                Err(e) if !dir.is_empty() => {
                    self.leave_out(dir, format!("a directory that cannot be listed: {e}"));
                    return Ok(None);
                }
                Err(e) => return Err(io(dir, e)),
            };
            let os_name = d.file_name();
            let Ok(ft) = d.file_type() else {
                continue; // vanished
            };
            let lossy = os_name.to_string_lossy();
            let rel = join(dir, &lossy);
            if self.skipped(&rel, &lossy, ft.is_dir()) {
                continue;
            }
            if let Some(why) = name_problem(dir, &os_name) {
                let shown = join(dir, &shown(&os_name));
                self.leave_out(&shown, why);
                continue;
            }
            if let Some(what) = special(ft) {
                self.leave_out(&rel, what);
                continue;
            }
            out.insert(lossy.into_owned(), (ft, d.ino()));
        }
        Ok(Some(out))
    }

    /// Adds `dir`'s whole included subtree (not `dir` itself) to `m`.
    fn walk(
        &mut self,
        dir: &str,
        m: &mut Manifest,
        before: &HashMap<String, (Stamp, String, bool)>,
        on_dir: &mut dyn FnMut(&Path),
    ) -> Result<(), Error> {
        let mut stack = vec![dir.to_string()];
        while let Some(d) = stack.pop() {
            self.ignores.remove(&d);
            on_dir(&self.root.join(&d));
            let Some(children) = self.list(&d)? else {
                // Gone, or left out: not an (empty) directory of the workspace.
                if !d.is_empty() {
                    m.remove(&d);
                    self.dirs.remove(&d);
                }
                continue;
            };
            for (name, (ft, ino)) in children {
                let rel = join(&d, &name);
                if ft.is_dir() {
                    self.touch(&rel);
                    m.insert(rel.clone(), Entry::dir());
                    self.dirs.insert(rel.clone(), ino);
                    stack.push(rel);
                } else if let Some(e) = self.leaf(&rel, ft, before)? {
                    self.touch(&rel);
                    m.insert(rel, e);
                }
                if m.entries().len() > self.rules.max_entries {
                    return Err(Error::TooMany {
                        max: self.rules.max_entries,
                    });
                }
            }
        }
        Ok(())
    }

    /// Brings `m`'s entries directly in `dir` up to date, walking directories that are new,
    /// were replaced, or are themselves named as changed (created, moved or deleted there:
    /// the inode check alone would miss a replacement that reused the old inode).
    fn relist(
        &mut self,
        dir: &str,
        m: &mut Manifest,
        changed: &BTreeSet<String>,
        before: &HashMap<String, (Stamp, String, bool)>,
        on_dir: &mut dyn FnMut(&Path),
    ) -> Result<(), Error> {
        if !dir.is_empty() && m.entries().get(dir).map(|e| e.kind) != Some(Kind::Dir) {
            return Ok(()); // not part of the workspace (gone, ignored, or under such)
        }
        self.forget_left_out(dir, false);
        let Some(now) = self.list(dir)? else {
            // Gone, or left out (then `list` said why).
            if !dir.is_empty() {
                self.remove(m, dir);
            }
            return Ok(());
        };
        // Its entries as the last scan saw them, without reading what lies deeper.
        let old: Vec<(String, Kind)> = m
            .children(dir)
            .map(|(name, e)| (name.to_string(), e.kind))
            .collect();
        for (name, kind) in &old {
            let gone = match now.get(name) {
                None => true,
                Some((ft, _)) => ft.is_dir() != (*kind == Kind::Dir),
            };
            if gone {
                self.remove(m, &join(dir, name));
            }
        }
        let old: HashMap<String, Kind> = old.into_iter().collect();
        for (name, (ft, ino)) in now {
            let rel = join(dir, &name);
            if ft.is_dir() {
                let same = old.get(&name) == Some(&Kind::Dir)
                    && self.dirs.get(&rel) == Some(&ino)
                    && !changed.contains(&rel);
                if same {
                    continue; // its own changes, if any, are named separately
                }
                self.remove(m, &rel);
                self.touch(&rel);
                m.insert(rel.clone(), Entry::dir());
                self.dirs.insert(rel.clone(), ino);
                self.walk(&rel, m, before, on_dir)?;
            } else {
                match self.leaf(&rel, ft, before)? {
                    Some(e) => {
                        if m.entries().get(&rel) != Some(&e) {
                            self.touch(&rel);
                            m.insert(rel, e);
                        }
                    }
                    None => self.remove(m, &rel),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
