//! `brain store copy`: a stopped brain's sled store into an empty PostgreSQL database
//! (`--to`), or a PostgreSQL store into a data dir that has no store yet (`--from`). Task
//! records go as they were stored (their numbers and times), the key-value trees (registry,
//! web credentials, sealed secrets, machines, manifests) entry by entry, the mirror's blobs
//! compressed as stored, each checked against its hash on the way in. Then everything is read
//! back from the target and compared with the source, record by record; a difference fails the
//! copy. The source is never changed. Snapshots are not copied: the target replays each log
//! from its start once, and takes new ones as it goes.
//!
//! The CA goes with the store: into PostgreSQL sealed under the data dir's secrets key (as
//! the first replica would put it), and out of it into the data dir's trust files (as a
//! replica adopts it), so enrolled workers keep trusting the brain.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::engine::log::{EventLog, SledLog};
use crate::mirror::Mirror;
use crate::model::event::{Record, TaskId};
use crate::storage::kv;
use crate::storage::postgres::{Db, EventRow};
use crate::trust::ca::DataDir;

/// Errors of a copy.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error(
        "the target database already holds a store ({records} task records, {entries} key-value entries, {blobs} blobs): copy into an empty database"
    )]
    TargetNotEmpty {
        records: i64,
        entries: i64,
        blobs: i64,
    },
    #[error(
        "{0} already holds a store: copy into a data dir without one (`brain --data NEW store copy --from URL`)"
    )]
    DataDirNotEmpty(String),
    #[error(
        "copying out of PostgreSQL needs the store's secrets key (the one its replicas use): put it in {0} (mode 600) or set TETHER_SECRET_KEY"
    )]
    KeyNeeded(String),
    #[error("cannot write {0}: {1}")]
    Write(String, #[source] std::io::Error),
    #[error("{0} holds no store to copy")]
    NoSource(String),
    #[error("task {task} record {seq} cannot be read ({reason}): nothing was copied past it")]
    Unreadable { task: u64, seq: u64, reason: String },
    #[error(
        "the copy differs from its source at {0}: the target is incomplete; drop it and copy again"
    )]
    Differs(String),
    #[error(transparent)]
    Sled(#[from] crate::storage::OpenError),
    #[error("store: {0}")]
    SledTree(#[from] sled::Error),
    #[error(transparent)]
    Postgres(#[from] crate::storage::postgres::Error),
    #[error(transparent)]
    Tree(#[from] kv::Error),
    #[error(transparent)]
    Log(#[from] crate::engine::log::Error),
    #[error(transparent)]
    Mirror(#[from] crate::mirror::Error),
    #[error(transparent)]
    Secrets(#[from] crate::trust::secrets::Error),
    #[error(transparent)]
    Ca(#[from] crate::trust::shared_ca::SharedCaError),
}

/// What a copy moved.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Copied {
    pub tasks: usize,
    pub records: usize,
    pub trees: usize,
    pub entries: usize,
    pub blobs: usize,
}

/// Key-value entries by (tree, key).
type Entries = BTreeMap<(String, Vec<u8>), Vec<u8>>;

/// The sled trees that are not key-value trees of the brain's.
const NOT_KV: &[&[u8]] = &[b"events", b"snapshots", b"__sled__default"];

/// The replica name the copy works under (it holds no lease).
const COPY_REPLICA: &str = "store-copy";

/// Says how far a long copy is, at most every few seconds.
struct Progress(Instant);

impl Progress {
    fn tick(&mut self, what: &str, done: usize, of: usize) {
        if self.0.elapsed() >= Duration::from_secs(3) {
            self.0 = Instant::now();
            eprintln!("{what}: {done} of {of}");
        }
    }
}

/// One task's records as the sled log stores them, and as PostgreSQL rows.
fn rows(records: &[Record]) -> Vec<EventRow> {
    records
        .iter()
        .map(|r| EventRow {
            seq: r.seq as i64,
            v: r.v as i32,
            at_ms: r.at_ms,
            event: serde_json::to_vec(&r.event).expect("events serialise"),
        })
        .collect()
}

/// Every record of `task` in `log`, or where one cannot be read.
async fn read_all(log: &dyn EventLog, task: TaskId) -> Result<Vec<Record>, CopyError> {
    let mut out = Vec::new();
    for r in log.read(task, 0).await? {
        out.push(r.map_err(|e| CopyError::Unreadable {
            task: task.0,
            seq: out.len() as u64 + 1,
            reason: e.to_string(),
        })?);
    }
    Ok(out)
}

/// Every (tree, key, value) of the brain's key-value trees in a sled store.
fn sled_entries(db: &sled::Db) -> Result<Entries, CopyError> {
    let mut out = BTreeMap::new();
    for name in db.tree_names() {
        if NOT_KV.contains(&name.as_ref()) {
            continue;
        }
        let tree = db.open_tree(&name)?;
        let name = String::from_utf8_lossy(&name).into_owned();
        for kv in tree.iter() {
            let (k, v) = kv?;
            out.insert((name.clone(), k.to_vec()), v.to_vec());
        }
    }
    Ok(out)
}

async fn pg_entries(db: &Db) -> Result<Entries, CopyError> {
    Ok(db
        .all_kv()
        .await?
        .into_iter()
        .map(|(t, k, v)| ((t, k), v))
        .collect())
}

/// Copies the blobs `from` has into `to` (each checked against its hash), then checks that
/// `to` holds each as `from` does.
fn copy_blobs(from: &Mirror, to: &Mirror, progress: &mut Progress) -> Result<usize, CopyError> {
    let hashes = from.blob_hashes()?;
    for (i, h) in hashes.iter().enumerate() {
        to.put_compressed(h, &from.get_compressed(h)?, u64::MAX)?;
        progress.tick("blobs", i + 1, hashes.len());
    }
    to.sync()?;
    for h in &hashes {
        if to.get(h)? != from.get(h)? {
            return Err(CopyError::Differs(format!("blob {h}")));
        }
    }
    Ok(hashes.len())
}

/// Checks that the two key-value stores hold the same entries.
fn same_entries(source: &Entries, target: &Entries) -> Result<(), CopyError> {
    for ((tree, key), v) in source {
        if target.get(&(tree.clone(), key.clone())) != Some(v) {
            return Err(CopyError::Differs(format!(
                "tree {tree} key {}",
                hex::encode(key)
            )));
        }
    }
    Ok(())
}

/// `brain store copy --to URL`: the data dir's sled store into an empty PostgreSQL database.
pub async fn to_postgres(data: &DataDir, url: &str) -> Result<Copied, CopyError> {
    if !data.db().exists() {
        return Err(CopyError::NoSource(data.db().display().to_string()));
    }
    let sled = crate::storage::open_db(&data.db())?;
    let pg = Db::open(url, COPY_REPLICA).await?;
    let (records, entries, blobs) = pg.held().await?;
    if records + entries + blobs > 0 {
        return Err(CopyError::TargetNotEmpty {
            records,
            entries,
            blobs,
        });
    }
    let mut progress = Progress(Instant::now());
    let mut copied = Copied::default();
    // The log, record by record as stored.
    let log = SledLog::open(sled.clone(), data.db())?;
    let tasks = log.tasks().await?;
    for (i, t) in tasks.iter().enumerate() {
        let recs = read_all(&log, *t).await?;
        let id = i64::try_from(t.0).map_err(|_| CopyError::Unreadable {
            task: t.0,
            seq: 0,
            reason: "a task id beyond PostgreSQL's bigint".into(),
        })?;
        pg.import_records(id, &rows(&recs)).await?;
        copied.records += recs.len();
        progress.tick("tasks", i + 1, tasks.len());
    }
    copied.tasks = tasks.len();
    // The key-value trees.
    let source = sled_entries(&sled)?;
    let store = kv::Store::Postgres(pg.clone());
    let mut trees = std::collections::HashSet::new();
    for ((tree, key), value) in &source {
        store.tree(tree)?.insert(key, value).await?;
        trees.insert(tree.clone());
    }
    copied.entries = source.len();
    copied.trees = trees.len();
    // The blobs.
    let from = Mirror::open(&sled, &data.path().join("blobs"))?;
    copied.blobs = copy_blobs(&from, &Mirror::shared(&pg)?, &mut progress)?;
    // The CA, sealed as a first replica would seal it.
    let secrets =
        crate::trust::secrets::Secrets::in_store(&store, &data.path().join("secrets.key")).await?;
    crate::trust::shared_ca::in_store(&store, &secrets, data, COPY_REPLICA).await?;
    // Read back and compared.
    let target = crate::engine::log::postgres::PgLog::open(pg.clone(), Default::default());
    for t in &tasks {
        if read_all(&target, *t).await? != read_all(&log, *t).await? {
            return Err(CopyError::Differs(format!("the log of task {t}")));
        }
    }
    same_entries(&source, &pg_entries(&pg).await?)?;
    Ok(copied)
}

/// `brain store copy --from URL`: a PostgreSQL store into the data dir, which must have no
/// store yet.
pub async fn from_postgres(data: &DataDir, url: &str) -> Result<Copied, CopyError> {
    if data.db().exists() {
        return Err(CopyError::DataDirNotEmpty(
            data.path().display().to_string(),
        ));
    }
    let key_file = data.path().join("secrets.key");
    if std::env::var_os("TETHER_SECRET_KEY").is_none() && !key_file.exists() {
        return Err(CopyError::KeyNeeded(key_file.display().to_string()));
    }
    let pg = Db::open(url, COPY_REPLICA).await?;
    let (records, entries, blobs) = pg.held().await?;
    if records + entries + blobs == 0 {
        return Err(CopyError::NoSource(
            "the database (no task records, entries or blobs)".into(),
        ));
    }
    // The key must open the store's CA before anything is written; the store's CA then
    // becomes the data dir's (the data dir's own, if any, moved aside).
    let pg_store = kv::Store::Postgres(pg.clone());
    let secrets = crate::trust::secrets::Secrets::in_store(&pg_store, &key_file).await?;
    let ca = crate::trust::shared_ca::in_store(&pg_store, &secrets, data, "sled").await?;
    // On sled the CA key is the data dir's (a replica keeps it in the store only).
    shared::fsio::write_atomic(
        &data.ca_key(),
        ca.key_pem().as_bytes(),
        0o600,
        shared::fsio::Durability::Full,
    )
    .map_err(|e| CopyError::Write(data.ca_key().display().to_string(), e))?;
    let sled = crate::storage::open_db(&data.db())?;
    let mut progress = Progress(Instant::now());
    let mut copied = Copied::default();
    let source_log = crate::engine::log::postgres::PgLog::open(pg.clone(), Default::default());
    let events = sled.open_tree("events")?;
    let tasks = source_log.tasks().await?;
    for (i, t) in tasks.iter().enumerate() {
        let recs = read_all(&source_log, *t).await?;
        for r in &recs {
            let value = serde_json::to_vec(r).expect("records serialise");
            events.insert(crate::engine::log::sled_key(*t, r.seq), value)?;
        }
        copied.records += recs.len();
        progress.tick("tasks", i + 1, tasks.len());
    }
    copied.tasks = tasks.len();
    let source = pg_entries(&pg).await?;
    let mut trees = std::collections::HashSet::new();
    for ((tree, key), value) in &source {
        sled.open_tree(tree.as_bytes())?
            .insert(key.as_slice(), value.as_slice())?;
        trees.insert(tree.clone());
    }
    copied.entries = source.len();
    copied.trees = trees.len();
    let to = Mirror::open(&sled, &data.path().join("blobs"))?;
    copied.blobs = copy_blobs(&Mirror::shared(&pg)?, &to, &mut progress)?;
    crate::storage::flush(&sled).await?;
    // Read back and compared.
    let target = SledLog::open(sled.clone(), data.db())?;
    for t in &tasks {
        if read_all(&target, *t).await? != read_all(&source_log, *t).await? {
            return Err(CopyError::Differs(format!("the log of task {t}")));
        }
    }
    same_entries(&source, &sled_entries(&sled)?)?;
    Ok(copied)
}
