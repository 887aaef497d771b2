//! The brain's mirror of every task's workspace: content-addressed blobs (deduplicated across
//! tasks and versions, zstd-compressed at rest and on the wire), each durable before any
//! manifest names it, and manifests addressed by their root hash in the tree `manifests`;
//! on sled and a local directory, or on PostgreSQL shared by replicas (see [`backing`]). A barrier's manifest is stored as the delta from the one before it, with a
//! whole manifest every [`MAX_CHAIN`] versions, so a barrier costs what changed rather than
//! the size of the tree. Garbage collection keeps what the given manifests reference.

mod backing;
mod error;

pub use error::Error;

use shared::locks::Lock;
use std::collections::HashSet;
use std::path::Path;

use backing::Backing;

use shared::manifest::{self, Delta, Kind, Manifest, compress, decompress};

/// Most deltas between a stored manifest and the whole one it is built on.
pub const MAX_CHAIN: u16 = 32;

/// A stored manifest's value: the time it was stored (ms, big-endian, for the collector's
/// grace), then either a whole manifest (zstd JSON) or [`DELTA`], the chain depth (u16,
/// big-endian), the base's root hash (64 hex digits) and the delta (zstd JSON).
const DELTA: u8 = b'D';

struct Stored<'a> {
    at_ms: u64,
    /// For a delta: its depth and the base's root hash.
    delta_of: Option<(u16, &'a str)>,
    data: &'a [u8],
}

fn parse_stored(v: &[u8]) -> Option<Stored<'_>> {
    let at_ms = u64::from_be_bytes(v.get(..8)?.try_into().ok()?);
    if v.get(8) != Some(&DELTA) {
        return Some(Stored {
            at_ms,
            delta_of: None,
            data: &v[8..],
        });
    }
    let depth = u16::from_be_bytes(v.get(9..11)?.try_into().ok()?);
    let base = std::str::from_utf8(v.get(11..75)?).ok()?;
    Some(Stored {
        at_ms,
        delta_of: Some((depth, base)),
        data: &v[75..],
    })
}

/// The mirror. Cheap to clone.
#[derive(Clone)]
pub struct Mirror {
    backing: Backing,
    /// The latest manifests used, so a barrier does not decode its base again.
    recent: Recent,
    /// Chain depth of manifests stored or read by this process, so a barrier does not read
    /// its base's record (possibly a whole manifest) to learn it.
    depths: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u16>>>,
}

/// The latest manifests used, by root hash, most recent first.
type Recent = std::sync::Arc<
    std::sync::Mutex<std::collections::VecDeque<(String, std::sync::Arc<Manifest>)>>,
>;

/// Manifests kept decoded.
const RECENT: usize = 16;

/// What a garbage collection removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Collected {
    pub blobs: u64,
    pub bytes: u64,
    pub manifests: u64,
}

impl Mirror {
    /// Blobs in the directory `dir`, manifests in `db`.
    pub fn open(db: &sled::Db, dir: &Path) -> Result<Self, Error> {
        Ok(Self::with(Backing::local(db, dir)?))
    }

    /// Blobs and manifests in PostgreSQL, shared by every replica on it. Must be opened on a
    /// multi-threaded runtime, which its calls then wait on.
    pub fn shared(db: &crate::storage::postgres::Db) -> Result<Self, Error> {
        Ok(Self::with(Backing::shared(db)?))
    }

    fn with(backing: Backing) -> Self {
        Self {
            backing,
            recent: Default::default(),
            depths: Default::default(),
        }
    }

    /// Whether the blob is stored (a store that cannot be read answers no).
    pub fn has(&self, hash: &str) -> bool {
        self.backing.has(hash).unwrap_or(false)
    }

    /// Those of `hashes` not stored, in their order.
    pub fn missing(&self, hashes: &[String]) -> Result<Vec<String>, Error> {
        self.backing.missing(hashes)
    }

    /// Stores a blob given compressed; checks that it decompresses to content with this
    /// hash (bounded by `max_bytes`) before it is kept. Returns whether it was new. Not
    /// synced on its own: call [`Mirror::sync`] before a manifest names it.
    pub fn put_compressed(
        &self,
        hash: &str,
        compressed: &[u8],
        max_bytes: u64,
    ) -> Result<bool, Error> {
        if self.backing.has(hash)? {
            return Ok(false);
        }
        let content = decompress(compressed, max_bytes).map_err(|_| Error::Corrupt(hash.into()))?;
        if manifest::hash(&content) != hash {
            return Err(Error::Corrupt(hash.into()));
        }
        // Synced later, in one go, by `sync` or `sync_blobs`.
        self.backing.put(hash, compressed)
    }

    /// Makes every blob stored so far durable.
    pub fn sync(&self) -> Result<(), Error> {
        self.backing.sync()
    }

    /// Makes these newly stored blobs durable (on a local disk, each file and its directory
    /// when they are few, one `syncfs` when many).
    pub fn sync_blobs(&self, hashes: &[String]) -> Result<(), Error> {
        self.backing.sync_blobs(hashes)
    }

    /// Stores content, compressing it.
    pub fn put(&self, content: &[u8]) -> Result<String, Error> {
        let hash = manifest::hash(content);
        let c = compress(content);
        self.put_compressed(&hash, &c, u64::MAX)?;
        Ok(hash)
    }

    /// Every stored blob's hash, in order.
    pub fn blob_hashes(&self) -> Result<Vec<String>, Error> {
        self.backing.blob_hashes()
    }

    /// A blob as stored (compressed).
    pub fn get_compressed(&self, hash: &str) -> Result<Vec<u8>, Error> {
        self.backing.get(hash)
    }

    /// A blob's content.
    pub fn get(&self, hash: &str) -> Result<Vec<u8>, Error> {
        let c = self.get_compressed(hash)?;
        decompress(&c, u64::MAX).map_err(|_| Error::Corrupt(hash.into()))
    }

    /// Stores a manifest (by its root hash) once every blob it names is stored.
    pub fn put_manifest(&self, m: &Manifest) -> Result<String, Error> {
        let root = m.root_hash();
        let blobs: Vec<String> = m
            .blobs()
            .map(String::from)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        if let Some(h) = self.backing.missing(&blobs)?.first() {
            let path = m
                .entries()
                .iter()
                .find(|(_, e)| &e.hash == h)
                .map(|(p, _)| p.as_str())
                .unwrap_or_default();
            return Err(Error::BadManifest {
                root,
                reason: format!("the content of {path:?} (blob {h}) was never uploaded"),
            });
        }
        self.store_whole(&root, m)?;
        self.remember(&root, std::sync::Arc::new(m.clone()));
        Ok(root)
    }

    fn store_whole(&self, root: &str, m: &Manifest) -> Result<(), Error> {
        let json = serde_json::to_vec(m).expect("manifests serialise");
        let mut v = (shared::now_unix_ms() as u64).to_be_bytes().to_vec();
        v.extend_from_slice(&compress(&json));
        self.backing.put_manifest(root, v)
    }

    /// Stores `m`, made from the stored manifest `base_root` by `delta`, as that delta (or
    /// whole, when the chain behind `base_root` is long). Every blob the delta adds must be
    /// stored.
    /// `root` is `m`'s root hash, which the caller has computed to check it.
    pub fn put_manifest_delta(
        &self,
        m: Manifest,
        root: &str,
        base_root: &str,
        delta: &Delta,
    ) -> Result<String, Error> {
        let root = root.to_string();
        let depth = match self.depth(base_root) {
            Some(d) => d,
            None => match self.backing.manifest(base_root)? {
                Some(v) if !base_root.is_empty() => parse_stored(&v)
                    .map(|s| s.delta_of.map_or(0, |(d, _)| d))
                    .unwrap_or(MAX_CHAIN),
                _ => MAX_CHAIN,
            },
        };
        if let Some(mut v) = self.backing.manifest(&root)? {
            // Stored already (a barrier that changed nothing, or back to an earlier
            // version): only its time is renewed, for the collector's grace.
            if v.len() >= 8 {
                v[..8].copy_from_slice(&(shared::now_unix_ms() as u64).to_be_bytes());
                self.backing.put_manifest(&root, v)?;
            }
            return Ok(root);
        }
        let added: Vec<String> = delta
            .upserts
            .values()
            .filter(|e| e.kind == Kind::File)
            .map(|e| e.hash.clone())
            .collect();
        let missing: HashSet<String> = self.backing.missing(&added)?.into_iter().collect();
        if let Some((path, e)) = delta
            .upserts
            .iter()
            .find(|(_, e)| e.kind == Kind::File && missing.contains(&e.hash))
        {
            return Err(Error::BadManifest {
                root,
                reason: format!(
                    "the content of {path:?} (blob {}) was never uploaded",
                    e.hash
                ),
            });
        }
        if depth + 1 >= MAX_CHAIN {
            // Whole again. Only the delta's blobs need checking: the base's were.
            self.store_whole(&root, &m)?;
            self.set_depth(&root, 0);
            self.remember(&root, std::sync::Arc::new(m));
            return Ok(root);
        }
        let json = serde_json::to_vec(delta).expect("deltas serialise");
        let mut v = (shared::now_unix_ms() as u64).to_be_bytes().to_vec();
        v.push(DELTA);
        v.extend_from_slice(&(depth + 1).to_be_bytes());
        v.extend_from_slice(base_root.as_bytes());
        v.extend_from_slice(&compress(&json));
        self.backing.put_manifest(&root, v)?;
        self.set_depth(&root, depth + 1);
        self.remember(&root, std::sync::Arc::new(m));
        Ok(root)
    }

    fn depth(&self, root: &str) -> Option<u16> {
        let d = self.depths.locked();
        d.get(root).copied()
    }

    fn set_depth(&self, root: &str, depth: u16) {
        let mut d = self.depths.locked();
        if d.len() >= 100_000 {
            d.clear();
        }
        d.insert(root.to_string(), depth);
    }

    /// The manifest with this root hash, taken out of the cache of recent ones so that it
    /// can be changed without a copy (it is read back from the store when needed again).
    pub fn take_manifest(&self, root: &str) -> Result<Manifest, Error> {
        let cached = {
            let mut r = self.recent.locked();
            let i = r.iter().position(|(k, _)| k == root);
            i.and_then(|i| r.remove(i)).map(|(_, m)| m)
        };
        let m = match cached {
            Some(m) => m,
            None => {
                let m = self.manifest_shared(root)?;
                self.recent.locked().retain(|(k, _)| k != root);
                m
            }
        };
        Ok(std::sync::Arc::try_unwrap(m).unwrap_or_else(|m| (*m).clone()))
    }

    fn remember(&self, root: &str, m: std::sync::Arc<Manifest>) {
        let mut r = self.recent.locked();
        r.retain(|(k, _)| k != root);
        r.push_front((root.to_string(), m));
        r.truncate(RECENT);
    }

    /// The manifest with this root hash. The empty root is the empty manifest.
    pub fn manifest(&self, root: &str) -> Result<Manifest, Error> {
        self.manifest_shared(root).map(|m| (*m).clone())
    }

    /// The same, shared with the mirror's cache of recent manifests (no copy).
    pub fn manifest_shared(&self, root: &str) -> Result<std::sync::Arc<Manifest>, Error> {
        self.load(root, 0)
    }

    fn load(&self, root: &str, depth: u16) -> Result<std::sync::Arc<Manifest>, Error> {
        if root.is_empty() {
            return Ok(Default::default());
        }
        if let Some((_, m)) = self.recent.locked().iter().find(|(k, _)| k == root) {
            return Ok(m.clone());
        }
        let v = self
            .backing
            .manifest(root)?
            .ok_or_else(|| Error::NoManifest(root.into()))?;
        let bad = |reason: String| Error::BadManifest {
            root: root.into(),
            reason,
        };
        let stored = parse_stored(&v).ok_or_else(|| bad("unreadable record".into()))?;
        let json = decompress(stored.data, 1 << 30).map_err(|e| bad(e.to_string()))?;
        let m = match stored.delta_of {
            None => serde_json::from_slice(&json).map_err(|e| bad(e.to_string()))?,
            Some((_, base)) => {
                let delta: Delta = serde_json::from_slice(&json).map_err(|e| bad(e.to_string()))?;
                let rules = manifest::Rules {
                    include_git: true,
                    ..manifest::Rules::default()
                };
                if depth > MAX_CHAIN {
                    return Err(bad("its chain of deltas is too long or loops".into()));
                }
                let m = self
                    .load(base, depth + 1)?
                    .apply(&delta, &rules)
                    .map_err(|e| bad(e.to_string()))?;
                if !m.matches_root(root) {
                    return Err(bad("its delta does not give this root hash".into()));
                }
                m
            }
        };
        let m = std::sync::Arc::new(m);
        self.remember(root, m.clone());
        Ok(m)
    }

    /// Removes manifests not in `keep` and blobs no kept manifest names. Anything younger
    /// than `grace` stays: a barrier in flight has stored blobs and a manifest that its
    /// task's log does not name yet.
    pub fn gc(
        &self,
        keep: &HashSet<String>,
        grace: std::time::Duration,
    ) -> Result<Collected, Error> {
        let mut out = Collected::default();
        let now = shared::now_unix_ms() as u64;
        let young = |ms: u64| now.saturating_sub(ms) < grace.as_millis() as u64;
        // Kept: what `keep` names, what is young, and the chains those are built on.
        let mut bases: std::collections::HashMap<String, String> = Default::default();
        let mut live_roots: Vec<String> = Vec::new();
        let mut all: Vec<String> = Vec::new();
        let stored = self.backing.manifests()?;
        for (root, v) in &stored {
            let root = root.clone();
            let s = parse_stored(v);
            if let Some((_, base)) = s.as_ref().and_then(|s| s.delta_of) {
                bases.insert(root.clone(), base.to_string());
            }
            if keep.contains(&root) || s.is_none_or(|s| young(s.at_ms)) {
                live_roots.push(root.clone());
            }
            all.push(root);
        }
        let mut kept: HashSet<String> = HashSet::new();
        for mut r in live_roots {
            while kept.insert(r.clone()) {
                match bases.get(&r) {
                    Some(b) => r = b.clone(),
                    None => break,
                }
            }
        }
        // Live blobs: those of each kept whole manifest and those each kept delta adds (a
        // superset of what the chain's manifests name, which is safe).
        let mut live: HashSet<String> = HashSet::new();
        for (root, v) in &stored {
            if !kept.contains(root) {
                self.backing.remove_manifest(root)?;
                self.recent.locked().retain(|(r, _)| r != root);
                out.manifests += 1;
                continue;
            }
            let Some(s) = parse_stored(v) else {
                continue;
            };
            let json = decompress(s.data, 1 << 30).map_err(|e| Error::BadManifest {
                root: root.clone(),
                reason: e.to_string(),
            })?;
            let bad = |e: serde_json::Error| Error::BadManifest {
                root: root.clone(),
                reason: e.to_string(),
            };
            if s.delta_of.is_some() {
                let d: Delta = serde_json::from_slice(&json).map_err(bad)?;
                live.extend(d.upserts.into_values().map(|e| e.hash));
            } else {
                let m: Manifest = serde_json::from_slice(&json).map_err(bad)?;
                live.extend(m.blobs().map(String::from));
            }
        }
        (out.blobs, out.bytes) = self.backing.collect_blobs(&live, grace)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::manifest::Entry;

    /// Runs `check` on a mirror on sled and a directory, given a way to open it again.
    fn on_sled(check: fn(&dyn Fn() -> Mirror)) {
        let d = tempfile::tempdir().unwrap();
        let db = sled::Config::new().temporary(true).open().unwrap();
        check(&|| Mirror::open(&db, &d.path().join("blobs")).unwrap());
    }

    /// The same on PostgreSQL.
    async fn on_postgres(check: fn(&dyn Fn() -> Mirror)) {
        let Some(pg) = testkit::postgres::start_or_skip() else {
            return;
        };
        let db = crate::storage::postgres::Db::open(&pg.url(), "r")
            .await
            .unwrap();
        check(&|| Mirror::shared(&db).unwrap());
    }

    #[test]
    fn blobs_dedupe_are_checked_and_collected() {
        on_sled(blobs);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn blobs_dedupe_are_checked_and_collected_on_postgres() {
        on_postgres(blobs).await;
    }

    #[test]
    fn barriers_are_stored_as_deltas_in_bounded_chains_and_collected_whole() {
        on_sled(barriers);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn barriers_are_stored_as_deltas_in_bounded_chains_and_collected_whole_on_postgres() {
        on_postgres(barriers).await;
    }

    fn blobs(open: &dyn Fn() -> Mirror) {
        let m = open();
        let a = m.put(b"alpha\n").unwrap();
        assert_eq!(m.put(b"alpha\n").unwrap(), a);
        m.sync_blobs(std::slice::from_ref(&a)).unwrap();
        assert!(
            m.sync_blobs(&["../x".to_string()]).is_err(),
            "only blob hashes"
        );
        assert_eq!(m.get(&a).unwrap(), b"alpha\n");
        assert_eq!(
            m.missing(&[manifest::hash(b"x"), a.clone()]).unwrap(),
            [manifest::hash(b"x")]
        );
        assert!(m.get(&manifest::hash(b"x")).is_err());
        // A blob that does not match its hash is refused and not kept.
        let bad = manifest::hash(b"other");
        assert!(matches!(
            m.put_compressed(&bad, &compress(b"alpha\n"), 100),
            Err(Error::Corrupt(_))
        ));
        assert!(!m.has(&bad));
        assert!(matches!(
            m.put_compressed("../../etc", b"", 1),
            Err(Error::BadHash(_))
        ));
        // Over the size limit after decompression: refused.
        let big = vec![0u8; 1 << 20];
        assert!(
            m.put_compressed(&manifest::hash(&big), &compress(&big), 1000)
                .is_err()
        );
        // A manifest needs its blobs.
        let mut man = Manifest::default();
        man.insert("a.txt".into(), Entry::file(b"alpha\n", false));
        let root = m.put_manifest(&man).unwrap();
        assert_eq!(m.manifest(&root).unwrap(), man);
        let mut orphan = Manifest::default();
        orphan.insert("b".into(), Entry::file(b"never sent", false));
        assert!(m.put_manifest(&orphan).is_err());
        let b = m.put(b"beta\n").unwrap();
        // Nothing is collected within the grace period.
        let none = m
            .gc(&HashSet::new(), std::time::Duration::from_secs(3600))
            .unwrap();
        assert_eq!(none, Collected::default());
        let kept = m
            .gc(&[root.clone()].into(), std::time::Duration::ZERO)
            .unwrap();
        assert_eq!((kept.blobs, kept.manifests), (1, 0));
        assert!(m.has(&a) && !m.has(&b));
        let gone = m.gc(&HashSet::new(), std::time::Duration::ZERO).unwrap();
        assert_eq!((gone.blobs, gone.manifests), (1, 1));
    }

    fn barriers(open: &dyn Fn() -> Mirror) {
        let m = open();
        let mut man = Manifest::default();
        for i in 0..100 {
            let c = format!("file {i}\n");
            m.put(c.as_bytes()).unwrap();
            man.insert(format!("f{i:03}"), Entry::file(c.as_bytes(), false));
        }
        let mut roots = vec![m.put_manifest(&man).unwrap()];
        let mut versions = vec![man.clone()];
        for v in 0..70 {
            let c = format!("version {v}\n");
            m.put(c.as_bytes()).unwrap();
            let mut next = versions.last().unwrap().clone();
            next.insert(format!("f{:03}", v % 100), Entry::file(c.as_bytes(), false));
            let delta = versions.last().unwrap().diff(&next);
            let root = m
                .put_manifest_delta(
                    next.clone(),
                    &next.root_hash(),
                    roots.last().unwrap(),
                    &delta,
                )
                .unwrap();
            assert_eq!(root, next.root_hash());
            roots.push(root);
            versions.push(next);
        }
        // A barrier that changed nothing stores nothing new (and no delta onto itself).
        let last = versions.last().unwrap().clone();
        let same = m
            .put_manifest_delta(
                last.clone(),
                &last.root_hash(),
                roots.last().unwrap(),
                &last.diff(&last),
            )
            .unwrap();
        assert_eq!(&same, roots.last().unwrap());
        // Most records are small deltas; a whole manifest every MAX_CHAIN versions.
        let whole = roots
            .iter()
            .filter(|r| {
                let v = m.backing.manifest(r).unwrap().unwrap();
                parse_stored(&v).unwrap().delta_of.is_none()
            })
            .count();
        assert_eq!(whole, 1 + 70 / MAX_CHAIN as usize);
        // Read back cold (no decoded cache), every version is what was stored.
        let cold = open();
        for (r, v) in roots.iter().zip(&versions) {
            assert_eq!(&cold.manifest(r).unwrap(), v);
        }
        // Keeping only the last version keeps its chain back to a whole manifest, and the
        // blobs it names.
        let last = roots.last().unwrap().clone();
        let g = cold
            .gc(&[last.clone()].into(), std::time::Duration::ZERO)
            .unwrap();
        assert!(g.manifests > 0);
        let again = open();
        let kept = again.manifest(&last).unwrap();
        assert_eq!(&kept, versions.last().unwrap());
        assert!(kept.blobs().all(|h| again.has(h)));
        // A delta whose blob was never uploaded is refused.
        let mut bad = kept.clone();
        bad.insert("new".into(), Entry::file(b"never uploaded", false));
        assert!(
            again
                .put_manifest_delta(bad.clone(), &bad.root_hash(), &last, &kept.diff(&bad))
                .is_err()
        );
    }
}
