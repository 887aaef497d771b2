//! Where the mirror keeps its bytes. `Local`: blobs as files in a directory sharded by hash
//! prefix (each written to a temp name and renamed; made durable in one go by `sync`) and
//! manifests in a sled tree. `Shared`: blobs in PostgreSQL's table `blobs` and manifests in
//! its tree `manifests`, seen by every replica, each row durable when its statement returns.
//!
//! The mirror's API is synchronous (hashing and decoding run on blocking threads); the
//! shared backing waits for its statements on the runtime it was opened on, from a blocking
//! thread or, via `block_in_place`, from a worker thread of the multi-threaded runtime.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::Error;
use crate::storage::{kv, postgres::Db};

#[derive(Clone)]
pub(super) enum Backing {
    Local {
        dir: PathBuf,
        manifests: sled::Tree,
    },
    Shared {
        db: Db,
        manifests: Arc<dyn kv::Tree>,
        rt: tokio::runtime::Handle,
    },
}

/// `f`'s output, waited for on `rt` from synchronous code.
fn wait<T>(rt: &tokio::runtime::Handle, f: impl std::future::Future<Output = T>) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => tokio::task::block_in_place(|| rt.block_on(f)),
        Err(_) => rt.block_on(f),
    }
}

fn io(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Checks that `hash` is a blob hash (64 lowercase hex digits): it names a file.
pub(super) fn check_hash(hash: &str) -> Result<(), Error> {
    if hash.len() != 64 || !hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(Error::BadHash(hash.into()));
    }
    Ok(())
}

impl Backing {
    pub(super) fn local(db: &sled::Db, dir: &Path) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        Ok(Self::Local {
            dir: dir.to_path_buf(),
            manifests: db.open_tree("manifests")?,
        })
    }

    /// On PostgreSQL; waits on the current runtime (which must be multi-threaded).
    pub(super) fn shared(db: &Db) -> Result<Self, Error> {
        let store = kv::Store::Postgres(db.clone());
        Ok(Self::Shared {
            db: db.clone(),
            manifests: store.tree("manifests")?,
            rt: tokio::runtime::Handle::current(),
        })
    }

    fn blob_path(dir: &Path, hash: &str) -> Result<PathBuf, Error> {
        check_hash(hash)?;
        Ok(dir.join(&hash[..2]).join(&hash[2..]))
    }

    pub(super) fn has(&self, hash: &str) -> Result<bool, Error> {
        match self {
            Self::Local { dir, .. } => Ok(Self::blob_path(dir, hash)?.exists()),
            Self::Shared { db, rt, .. } => {
                check_hash(hash)?;
                Ok(wait(rt, db.has_blob(hash))?)
            }
        }
    }

    /// Those of `hashes` not stored.
    pub(super) fn missing(&self, hashes: &[String]) -> Result<Vec<String>, Error> {
        for h in hashes {
            check_hash(h)?;
        }
        match self {
            Self::Local { .. } => {
                let mut out = Vec::new();
                for h in hashes {
                    if !self.has(h)? {
                        out.push(h.clone());
                    }
                }
                Ok(out)
            }
            Self::Shared { db, rt, .. } => {
                let mut out = Vec::new();
                // A bounded statement per batch.
                for batch in hashes.chunks(10_000) {
                    out.extend(wait(rt, db.missing_blobs(batch))?);
                }
                Ok(out)
            }
        }
    }

    /// Stores a checked blob as given; whether it was new. Locally it is not synced.
    pub(super) fn put(&self, hash: &str, compressed: &[u8]) -> Result<bool, Error> {
        match self {
            Self::Local { dir, .. } => {
                let path = Self::blob_path(dir, hash)?;
                if path.exists() {
                    return Ok(false);
                }
                let parent = path.parent().expect("sharded path");
                std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
                shared::fsio::write_atomic(
                    &path,
                    compressed,
                    0o644,
                    shared::fsio::Durability::Deferred,
                )
                .map_err(|e| io(&path, e))?;
                Ok(true)
            }
            Self::Shared { db, rt, .. } => {
                check_hash(hash)?;
                Ok(wait(rt, db.put_blob(hash, compressed))?)
            }
        }
    }

    pub(super) fn get(&self, hash: &str) -> Result<Vec<u8>, Error> {
        match self {
            Self::Local { dir, .. } => {
                let p = Self::blob_path(dir, hash)?;
                std::fs::read(&p).map_err(|e| io(&p, e))
            }
            Self::Shared { db, rt, .. } => {
                check_hash(hash)?;
                wait(rt, db.blob(hash))?.ok_or_else(|| Error::NoBlob(hash.into()))
            }
        }
    }

    /// Makes every blob stored so far durable (locally one `syncfs`).
    pub(super) fn sync(&self) -> Result<(), Error> {
        match self {
            Self::Local { dir, .. } => shared::fsio::syncfs(dir).map_err(|e| io(dir, e)),
            Self::Shared { .. } => Ok(()),
        }
    }

    /// Makes these newly stored blobs durable: each file and its directory flushed when they
    /// are few (a `syncfs` would also wait for everything else written to that filesystem,
    /// such as a worker's workspace on the same disk), one `sync` when many.
    pub(super) fn sync_blobs(&self, hashes: &[String]) -> Result<(), Error> {
        const FEW: usize = 64;
        let Self::Local { dir, .. } = self else {
            return hashes.iter().try_for_each(|h| check_hash(h));
        };
        if hashes.len() > FEW {
            return self.sync();
        }
        let flush = |p: &Path| {
            std::fs::File::open(p)
                .and_then(|f| f.sync_all())
                .map_err(|e| io(p, e))
        };
        let mut dirs: HashSet<PathBuf> = HashSet::new();
        for h in hashes {
            let p = Self::blob_path(dir, h)?;
            flush(&p)?;
            if let Some(d) = p.parent() {
                dirs.insert(d.to_path_buf());
            }
        }
        // The shard directories, and the store's own (a shard may be new).
        dirs.insert(dir.clone());
        for d in dirs {
            flush(&d)?;
        }
        Ok(())
    }

    pub(super) fn manifest(&self, root: &str) -> Result<Option<Vec<u8>>, Error> {
        match self {
            Self::Local { manifests, .. } => {
                Ok(manifests.get(root.as_bytes())?.map(|v| v.to_vec()))
            }
            Self::Shared { manifests, rt, .. } => Ok(wait(rt, manifests.get(root.as_bytes()))?),
        }
    }

    pub(super) fn put_manifest(&self, root: &str, v: Vec<u8>) -> Result<(), Error> {
        match self {
            Self::Local { manifests, .. } => {
                manifests.insert(root.as_bytes(), v)?;
            }
            Self::Shared { manifests, rt, .. } => {
                wait(rt, manifests.insert(root.as_bytes(), &v))?;
            }
        }
        Ok(())
    }

    pub(super) fn remove_manifest(&self, root: &str) -> Result<(), Error> {
        match self {
            Self::Local { manifests, .. } => {
                manifests.remove(root.as_bytes())?;
            }
            Self::Shared { manifests, rt, .. } => {
                wait(rt, manifests.remove(root.as_bytes()))?;
            }
        }
        Ok(())
    }

    /// Every stored manifest: (root, record).
    pub(super) fn manifests(&self) -> Result<Vec<(String, Vec<u8>)>, Error> {
        let raw = match self {
            Self::Local { manifests, .. } => manifests
                .iter()
                .map(|i| i.map(|(k, v)| (k.to_vec(), v.to_vec())))
                .collect::<Result<Vec<_>, _>>()?,
            Self::Shared { manifests, rt, .. } => wait(rt, manifests.scan_prefix(b""))?,
        };
        Ok(raw
            .into_iter()
            .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v))
            .collect())
    }

    /// Every stored blob's hash, in order.
    pub(super) fn blob_hashes(&self) -> Result<Vec<String>, Error> {
        let dir = match self {
            Self::Local { dir, .. } => dir,
            Self::Shared { db, rt, .. } => return Ok(wait(rt, db.blob_hashes())?),
        };
        let mut out: Vec<String> = local_blobs(dir)?
            .into_iter()
            .map(|(hash, _)| hash)
            // Temp files of a write cut short are not blobs.
            .filter(|hash| check_hash(hash).is_ok())
            .collect();
        out.sort();
        Ok(out)
    }

    /// Removes the blobs older than `grace` that `live` does not name: (how many, bytes).
    pub(super) fn collect_blobs(
        &self,
        live: &HashSet<String>,
        grace: std::time::Duration,
    ) -> Result<(u64, u64), Error> {
        let dir = match self {
            Self::Local { dir, .. } => dir,
            Self::Shared { db, rt, .. } => {
                let live: Vec<String> = live.iter().cloned().collect();
                return Ok(wait(rt, db.collect_blobs(&live, grace))?);
            }
        };
        let now = shared::now_unix_ms() as u64;
        let young = |ms: u64| now.saturating_sub(ms) < grace.as_millis() as u64;
        let (mut n, mut bytes) = (0, 0);
        for (hash, f) in local_blobs(dir)? {
            let meta = f.metadata().ok();
            let modified = meta
                .as_ref()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(now, |d| d.as_millis() as u64);
            if !live.contains(&hash) && !young(modified) {
                bytes += meta.map_or(0, |m| m.len());
                std::fs::remove_file(f.path()).map_err(|e| io(&f.path(), e))?;
                n += 1;
            }
        }
        Ok((n, bytes))
    }
}

/// Every file under the blob directory's shards, with the hash its place names.
fn local_blobs(dir: &Path) -> Result<Vec<(String, std::fs::DirEntry)>, Error> {
    let mut out = Vec::new();
    for shard in std::fs::read_dir(dir).map_err(|e| io(dir, e))?.flatten() {
        let Ok(files) = std::fs::read_dir(shard.path()) else {
            continue;
        };
        for f in files.flatten() {
            let hash = format!(
                "{}{}",
                shard.file_name().to_string_lossy(),
                f.file_name().to_string_lossy()
            );
            out.push((hash, f));
        }
    }
    Ok(out)
}
