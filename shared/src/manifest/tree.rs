//! A manifest's hash tree: each directory's hash is BLAKE3 over its direct children (name,
//! kind, exec bit, size, content hash or symlink target, and a child directory's own hash),
//! and the root hash is the root directory's. A change re-hashes only the directories above
//! it, and two manifests are compared by descending only into directories whose hashes
//! differ, so a barrier, a delta and a warm move cost what changed times the depth, not the
//! size of the tree.
//!
//! The hashes are a cache beside the entries: kept for every directory once computed,
//! invalidated up to the root by each change, recomputed (deepest first) when asked for.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use super::{Entry, Kind};

/// A directory's hash.
pub(super) type Digest = [u8; 32];

/// Directory hashes, and which are out of date.
#[derive(Debug, Clone, Default)]
pub(super) struct Hashes {
    /// Whether every directory not in `dirty` has its hash in `dirs`. False until the first
    /// computation: changes before it are not tracked, the first computation does them all.
    complete: bool,
    /// Directory ("" is the root) → hash of its listing. May hold directories that are
    /// gone: a directory made again is new, and hashed again.
    dirs: HashMap<String, Digest>,
    /// Directories whose hash must be recomputed; with each, all its ancestors.
    dirty: BTreeSet<String>,
    /// Directories hashed so far (for tests of what a change costs).
    pub(super) hashed: u64,
}

/// The directory a path is in ("" for the root).
pub(super) fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

impl Hashes {
    /// Notes that the listing of `dir` changed (an entry in it was added, changed or
    /// removed), or that `dir` itself is new.
    pub(super) fn touch(&mut self, dir: &str) {
        if !self.complete {
            return;
        }
        let mut d = dir;
        loop {
            if !self.dirty.insert(d.to_string()) {
                // Its ancestors are dirty already.
                return;
            }
            if d.is_empty() {
                return;
            }
            d = parent(d);
        }
    }

    /// Forgets the hash of the directory `dir` (it is gone; what was under it is removed
    /// entry by entry, each forgetting its own).
    pub(super) fn forget(&mut self, dir: &str) {
        if !self.complete {
            return;
        }
        self.dirs.remove(dir);
        self.dirty.remove(dir);
    }

    /// Brings every hash up to date and returns the root's.
    pub(super) fn root(&mut self, entries: &BTreeMap<String, Entry>) -> Digest {
        if !self.complete {
            self.compute_all(entries);
        } else if !self.dirty.is_empty() {
            let mut dirty: Vec<String> = std::mem::take(&mut self.dirty).into_iter().collect();
            // Deepest first: a directory's children are hashed before it.
            dirty.sort_by_cached_key(|d| std::cmp::Reverse(depth(d)));
            for d in dirty {
                let h = hash_listing(children(entries, &d), &self.dirs);
                self.dirs.insert(d, h);
                self.hashed += 1;
            }
        }
        match self.dirs.get("") {
            Some(h) => *h,
            None => {
                self.compute_all(entries);
                self.dirs[""]
            }
        }
    }

    /// A directory's hash (after [`Hashes::root`]); `None` for a path that is not one.
    pub(super) fn dir(&self, dir: &str) -> Option<&Digest> {
        self.dirs.get(dir)
    }

    /// Hashes every directory, in one pass over the entries.
    fn compute_all(&mut self, entries: &BTreeMap<String, Entry>) {
        // Each directory's children in name order: entries are in path order, and paths
        // with the same parent sort as their names do.
        let mut listings: HashMap<&str, Vec<(&str, &str, &Entry)>> = HashMap::new();
        listings.insert("", Vec::new());
        for (path, e) in entries {
            let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
            listings.entry(dir).or_default().push((name, path, e));
            if e.kind == Kind::Dir {
                listings.entry(path).or_default();
            }
        }
        let mut dirs: Vec<(usize, &str)> = listings.keys().map(|d| (depth(d), *d)).collect();
        dirs.sort_unstable_by_key(|(depth, _)| std::cmp::Reverse(*depth));
        self.dirs.clear();
        self.dirs.reserve(dirs.len());
        self.dirty.clear();
        for (_, d) in dirs {
            let list = listings[d].iter().map(|(name, path, e)| Child {
                name,
                path,
                entry: e,
            });
            let h = hash_listing(list, &self.dirs);
            self.dirs.insert(d.to_string(), h);
            self.hashed += 1;
        }
        self.complete = true;
    }
}

fn depth(dir: &str) -> usize {
    if dir.is_empty() {
        0
    } else {
        1 + dir.matches('/').count()
    }
}

/// A direct child of a directory.
pub(super) struct Child<'a> {
    pub(super) name: &'a str,
    /// Its whole path.
    pub(super) path: &'a str,
    pub(super) entry: &'a Entry,
}

/// The hash of a listing, given in name order; child directories' hashes come from `dirs`.
fn hash_listing<'a>(
    children: impl Iterator<Item = Child<'a>>,
    dirs: &HashMap<String, Digest>,
) -> Digest {
    let mut buf: Vec<u8> = Vec::with_capacity(256);
    buf.extend_from_slice(b"tether-dir-v1\0");
    for c in children {
        let e = c.entry;
        buf.extend_from_slice(c.name.as_bytes());
        buf.extend_from_slice(&[0, e.kind as u8, e.exec as u8]);
        buf.extend_from_slice(&e.size.to_le_bytes());
        match e.kind {
            Kind::File => buf.extend_from_slice(e.hash.as_bytes()),
            Kind::Symlink => buf.extend_from_slice(e.target.as_bytes()),
            Kind::Dir => {
                // Hashed before its parent: deeper directories come first.
                let h = dirs.get(c.path).copied().unwrap_or_default();
                buf.extend_from_slice(&h);
            }
        }
        buf.push(0);
    }
    *blake3::hash(&buf).as_bytes()
}

/// The direct children of `dir` in name order, skipping over what lies deeper: one lookup per
/// child and per subdirectory, however large the subdirectories are.
pub(super) fn children<'a>(
    entries: &'a BTreeMap<String, Entry>,
    dir: &str,
) -> impl Iterator<Item = Child<'a>> + 'a {
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    let mut from: Bound<String> = Bound::Included(prefix.clone());
    std::iter::from_fn(move || {
        loop {
            let (path, e) = entries
                .range::<String, _>((from.clone(), Bound::Unbounded))
                .next()?;
            let rest = path.strip_prefix(prefix.as_str())?;
            match rest.split_once('/') {
                Some((name, _)) => {
                    // Inside the child directory `name`: jump past everything under it
                    // ('0' sorts right after '/').
                    from = Bound::Included(format!("{prefix}{name}0"));
                }
                None => {
                    from = Bound::Excluded(path.clone());
                    return Some(Child {
                        name: &path[prefix.len()..],
                        path: path.as_str(),
                        entry: e,
                    });
                }
            }
        }
    })
}
