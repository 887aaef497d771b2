//! The brain's store: the one sled database every component keeps its trees in (opened
//! here, once per process), and its backup and restore as JSON lines
//! (`{"tree":…,"key":hex,"value":hex}`, one record a line). A backup is taken from a running
//! brain; a restore goes into a stopped one and moves the old store aside (nothing is
//! deleted).

pub mod blobs;
pub mod copying;
pub mod kv;
pub mod leaders;
pub mod postgres;
pub mod traffic;

use std::io::BufRead;
use std::path::{Path, PathBuf};

/// Makes everything written to `db` durable, off the runtime. (sled 0.34's `flush_async`
/// can wait for ever when several are awaited at once — sled issue #1308 — which a fleet
/// of workers enrolling together did; its blocking `flush` is correct.)
pub async fn flush(db: &sled::Db) -> sled::Result<usize> {
    let db = db.clone();
    match tokio::task::spawn_blocking(move || db.flush()).await {
        Ok(r) => r,
        Err(e) => Err(sled::Error::Io(std::io::Error::other(format!(
            "the flush did not finish: {e}"
        )))),
    }
}

/// Errors of restore.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} line {line}: {reason}")]
    Bad {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("cannot move the current store {from} aside to {to}: {source}")]
    MoveAside {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("store: {0}")]
    Sled(#[from] sled::Error),
}

/// The store could not be opened.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot open the brain's store at {path}: {source} (is another `brain serve` using this data dir?)"
)]
pub struct OpenError {
    pub path: String,
    #[source]
    pub source: sled::Error,
}

/// Opens (or creates) the brain's store. Fails clearly if another process holds it.
pub fn open_db(path: &Path) -> Result<sled::Db, OpenError> {
    sled::Config::new()
        .path(path)
        .open()
        .map_err(|source| OpenError {
            path: path.display().to_string(),
            source,
        })
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Line {
    tree: String,
    key: String,
    value: String,
}

/// Appends one record as a JSON line.
pub fn write_line(buf: &mut Vec<u8>, tree: &[u8], key: &[u8], value: &[u8]) {
    let line = Line {
        tree: String::from_utf8_lossy(tree).into_owned(),
        key: hex::encode(key),
        value: hex::encode(value),
    };
    serde_json::to_writer(&mut *buf, &line).expect("lines serialise");
    buf.push(b'\n');
}

/// Restores `file` into the store at `db_dir` (the brain must be stopped). The whole file is
/// checked before anything is touched; the current store, if any, is renamed to
/// `db.before-restore-<unix-ms>`. Returns (records, where the old store went).
pub fn restore(file: &Path, db_dir: &Path) -> Result<(usize, Option<PathBuf>), Error> {
    let f = std::fs::File::open(file).map_err(|source| Error::Read {
        path: file.to_path_buf(),
        source,
    })?;
    let mut records = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|source| Error::Read {
            path: file.to_path_buf(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| Error::Bad {
            path: file.to_path_buf(),
            line: i + 1,
            reason,
        };
        let l: Line = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
        let k = hex::decode(&l.key).map_err(|e| bad(format!("key: {e}")))?;
        let v = hex::decode(&l.value).map_err(|e| bad(format!("value: {e}")))?;
        if l.tree == "events" && k.len() != 16 {
            return Err(bad(format!("events key of {} bytes; expected 16", k.len())));
        }
        records.push((l.tree, k, v));
    }
    // Fails here, touching nothing, if a brain holds the store.
    let moved = if db_dir.exists() {
        drop(open_db(db_dir)?);
        let to = db_dir.with_file_name(format!("db.before-restore-{}", shared::now_unix_ms()));
        std::fs::rename(db_dir, &to).map_err(|source| Error::MoveAside {
            from: db_dir.to_path_buf(),
            to: to.clone(),
            source,
        })?;
        Some(to)
    } else {
        None
    };
    let db = open_db(db_dir)?;
    for (tree, k, v) in &records {
        db.open_tree(tree.as_bytes())?
            .insert(k.as_slice(), v.as_slice())?;
    }
    db.flush()?;
    Ok((records.len(), moved))
}

/// Writes a backup stream to `file` atomically and durably (0600: it holds the whole store).
pub fn save(file: &Path, chunks: &[Vec<u8>]) -> std::io::Result<()> {
    shared::fsio::write_atomic(
        file,
        &chunks.concat(),
        0o600,
        shared::fsio::Durability::Full,
    )
}
