//! The event log: append-only, per task, durable before anyone acts on what it says.
//!
//! Three implementations pass the same conformance tests: [`MemLog`] (tests, demos),
//! [`SledLog`] (the brain's default) and [`postgres::PgLog`] (replicas sharing a database). `SledLog` commits in groups: one writer task takes every append
//! that is waiting, writes them in one sled batch, flushes once and acknowledges them all, so
//! one disk sync serves many tasks and durability does not serialise them.

pub mod postgres;

use shared::locks::Lock;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use crate::model::event::{Event, RECORD_VERSION, Record, TaskId};

/// Errors of the log.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("event log store: {0}")]
    Store(#[from] sled::Error),
    #[error("event log sync of {path}: {source}")]
    Sync {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the event log writer has stopped")]
    Closed,
    /// The writer's error for an append (one group's error goes to every append in it). The
    /// words are those the log has always given.
    #[error("event log store: Unsupported: {0}")]
    Commit(Arc<Error>),
    #[error("{0}")]
    Postgres(#[from] crate::storage::postgres::Error),
    /// The task's lease is not this replica's: what it appends does not land.
    #[error("task {task} is not this replica's to write any more ({now}); nothing was appended")]
    Fenced { task: TaskId, now: String },
    #[error("task or record number {0} is past what the store can hold (2^63 - 1)")]
    IdRange(u64),
    #[error("event {key} of task {task} cannot be decoded: {reason}")]
    Decode {
        task: TaskId,
        key: String,
        reason: String,
    },
}

/// The durability contract: when [`EventLog::append`] returns `Ok`, the records are written
/// so that they survive the brain process being killed (SIGKILL) at any instant after, and
/// every later `read` returns them. For [`SledLog`] they have also been synced with
/// `fdatasync`, so they survive power loss on filesystems and disks that honour it. Records of
/// one task get consecutive sequence numbers starting at 1, in append order.
#[async_trait::async_trait]
pub trait EventLog: Send + Sync + 'static {
    /// Appends events to a task's log, returning the records as stored.
    async fn append(&self, task: TaskId, events: Vec<Event>) -> Result<Vec<Record>, Error>;
    /// The task's records with `seq > after`, in order. A record that cannot be decoded is
    /// returned as an error in its place; nothing is skipped or deleted.
    async fn read(&self, task: TaskId, after: u64) -> Result<Vec<Result<Record, Error>>, Error>;
    /// Every task that has a log.
    async fn tasks(&self) -> Result<Vec<TaskId>, Error>;
    /// The sequence number of the task's last record (0 if none).
    async fn last_seq(&self, task: TaskId) -> Result<u64, Error>;
    /// A fresh task id, never handed out before.
    async fn new_task_id(&self) -> Result<TaskId, Error>;
    /// Stores a snapshot of a task's state covering records up to `upto`.
    async fn put_snapshot(&self, task: TaskId, upto: u64, state: Vec<u8>) -> Result<(), Error>;
    /// The latest snapshot: (upto, bytes).
    async fn snapshot(&self, task: TaskId) -> Result<Option<(u64, Vec<u8>)>, Error>;
    /// Takes `task` for this brain to drive. `false`: another brain sharing the log drives
    /// it now. A log only one brain writes always answers `true`.
    async fn claim(&self, task: TaskId) -> Result<bool, Error> {
        let _ = task;
        Ok(true)
    }
    /// The tasks another brain sharing the log drives now (none where only one writes it):
    /// what a brain looking for tasks to take over need not read.
    async fn held_elsewhere(&self) -> Result<std::collections::HashSet<TaskId>, Error> {
        Ok(Default::default())
    }

    /// Lets `task`'s lease go now, if this brain holds it, so another brain sharing the log
    /// may take the task at once; nothing more this brain appends to it lands. Whether it
    /// held it.
    async fn release(&self, _task: TaskId) -> Result<bool, Error> {
        Ok(false)
    }

    /// Whether other brains write this log too (their tasks' calls are not this brain's to
    /// settle).
    fn shared(&self) -> bool {
        false
    }
}

fn record(task: TaskId, seq: u64, event: Event) -> Record {
    Record {
        v: RECORD_VERSION,
        task,
        seq,
        at_ms: shared::now_unix_ms(),
        event,
    }
}

// ---------------------------------------------------------------------------- memory

/// In-memory log for tests and the demo. Durable only as long as the process lives.
#[derive(Default)]
pub struct MemLog {
    inner: Mutex<MemInner>,
}

#[derive(Default)]
struct MemInner {
    logs: HashMap<TaskId, Vec<Record>>,
    snapshots: HashMap<TaskId, (u64, Vec<u8>)>,
    next_id: u64,
}

#[async_trait::async_trait]
impl EventLog for MemLog {
    async fn append(&self, task: TaskId, events: Vec<Event>) -> Result<Vec<Record>, Error> {
        let mut g = self.inner.locked();
        let log = g.logs.entry(task).or_default();
        let mut out = Vec::with_capacity(events.len());
        for ev in events {
            let r = record(task, log.len() as u64 + 1, ev);
            log.push(r.clone());
            out.push(r);
        }
        Ok(out)
    }

    async fn read(&self, task: TaskId, after: u64) -> Result<Vec<Result<Record, Error>>, Error> {
        let g = self.inner.locked();
        Ok(g.logs
            .get(&task)
            .map(|l| {
                l.iter()
                    .filter(|r| r.seq > after)
                    .cloned()
                    .map(Ok)
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn tasks(&self) -> Result<Vec<TaskId>, Error> {
        let g = self.inner.locked();
        let mut v: Vec<TaskId> = g.logs.keys().copied().collect();
        v.sort();
        Ok(v)
    }

    async fn last_seq(&self, task: TaskId) -> Result<u64, Error> {
        let g = self.inner.locked();
        Ok(g.logs.get(&task).map_or(0, |l| l.len() as u64))
    }

    async fn new_task_id(&self) -> Result<TaskId, Error> {
        let mut g = self.inner.locked();
        g.next_id += 1;
        Ok(TaskId(g.next_id))
    }

    async fn put_snapshot(&self, task: TaskId, upto: u64, state: Vec<u8>) -> Result<(), Error> {
        let mut g = self.inner.locked();
        g.snapshots.insert(task, (upto, state));
        Ok(())
    }

    async fn snapshot(&self, task: TaskId) -> Result<Option<(u64, Vec<u8>)>, Error> {
        let g = self.inner.locked();
        Ok(g.snapshots.get(&task).cloned())
    }
}

// ---------------------------------------------------------------------------- sled

/// Appends waiting for the writer. Bounded: producers wait when the disk falls behind.
const WRITE_QUEUE: usize = 4096;
/// Most appends one group commit takes.
const MAX_BATCH: usize = 1024;

struct Append {
    task: TaskId,
    events: Vec<Event>,
    done: oneshot::Sender<Result<Vec<Record>, Arc<Error>>>,
}

/// The sled log: tree `events` keyed by task id ‖ seq (both big-endian), tree `snapshots`
/// keyed by task id. Cheap to clone.
#[derive(Clone)]
pub struct SledLog {
    db: sled::Db,
    events: sled::Tree,
    snapshots: sled::Tree,
    tx: mpsc::Sender<Append>,
    /// The id the next new task gets: above every task in the log (so also after a restore).
    id_floor: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// The sled log's key of record `seq` of `task` (for `brain store copy`).
pub fn sled_key(task: TaskId, seq: u64) -> [u8; 16] {
    key(task, seq)
}

fn key(task: TaskId, seq: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&task.0.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The sequence number of a task's last record in the tree (0 if none; a malformed key
/// counts as none rather than panicking).
fn last_stored_seq(events: &sled::Tree, task: TaskId) -> Result<u64, Error> {
    Ok(match events.scan_prefix(task.0.to_be_bytes()).next_back() {
        Some(kv) => kv?
            .0
            .get(8..16)
            .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
            .unwrap_or(0),
        None => 0,
    })
}

impl SledLog {
    /// Opens the log in `db` and starts its writer task. `db_dir` is the sled directory, whose
    /// data file the writer syncs after each group.
    pub fn open(db: sled::Db, db_dir: PathBuf) -> Result<Self, Error> {
        let events = db.open_tree("events")?;
        let snapshots = db.open_tree("snapshots")?;
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let highest = events
            .iter()
            .keys()
            .next_back()
            .transpose()?
            .and_then(|k| {
                k.get(..8)
                    .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
            })
            .unwrap_or(0);
        let log = Self {
            db,
            events,
            snapshots,
            tx,
            id_floor: std::sync::Arc::new(std::sync::atomic::AtomicU64::new(highest + 1)),
        };
        let writer = log.clone_for_writer();
        tokio::spawn(writer.run(rx, db_dir.join("db")));
        Ok(log)
    }

    fn clone_for_writer(&self) -> Writer {
        Writer {
            db: self.db.clone(),
            events: self.events.clone(),
            last_seq: HashMap::new(),
        }
    }
}

/// The single writer: owns sequence assignment, so no two appends race for a number.
struct Writer {
    db: sled::Db,
    events: sled::Tree,
    /// Last sequence number per task, loaded from the tree on first use.
    last_seq: HashMap<TaskId, u64>,
}

impl Writer {
    fn last(&mut self, task: TaskId) -> Result<u64, Error> {
        if let Some(s) = self.last_seq.get(&task) {
            return Ok(*s);
        }
        let last = last_stored_seq(&self.events, task)?;
        self.last_seq.insert(task, last);
        Ok(last)
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Append>, data_file: PathBuf) {
        let mut batch_in: Vec<Append> = Vec::new();
        while let Some(first) = rx.recv().await {
            batch_in.push(first);
            while batch_in.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(a) => batch_in.push(a),
                    Err(_) => break,
                }
            }
            let result = self.commit(&mut batch_in, &data_file).await;
            for (a, recs) in batch_in.drain(..).zip(result) {
                let _ = a.done.send(recs);
            }
        }
    }

    /// Writes one group and syncs it. Returns one result per append, in order.
    async fn commit(
        &mut self,
        appends: &mut [Append],
        data_file: &std::path::Path,
    ) -> Vec<Result<Vec<Record>, Arc<Error>>> {
        let mut batch = sled::Batch::default();
        let mut keys: Vec<[u8; 16]> = Vec::new();
        let mut out: Vec<Result<Vec<Record>, Arc<Error>>> = Vec::with_capacity(appends.len());
        let before = self.last_seq.clone();
        for a in appends.iter_mut() {
            let mut seq = match self.last(a.task) {
                Ok(s) => s,
                Err(e) => {
                    out.push(Err(Arc::new(e)));
                    continue;
                }
            };
            let mut recs = Vec::with_capacity(a.events.len());
            for ev in a.events.drain(..) {
                seq += 1;
                let r = record(a.task, seq, ev);
                let k = key(a.task, seq);
                batch.insert(&k, serde_json::to_vec(&r).expect("records serialise"));
                keys.push(k);
                recs.push(r);
            }
            self.last_seq.insert(a.task, seq);
            out.push(Ok(recs));
        }
        let synced = async {
            self.events.apply_batch(batch)?;
            crate::storage::flush(&self.db).await?;
            // sled syncs with sync_file_range, which does not flush the disk's cache or
            // metadata; fdatasync does.
            let f = std::fs::File::open(data_file).map_err(|source| Error::Sync {
                path: data_file.to_path_buf(),
                source,
            })?;
            f.sync_data().map_err(|source| Error::Sync {
                path: data_file.to_path_buf(),
                source,
            })?;
            Ok::<(), Error>(())
        }
        .await;
        if let Err(e) = synced {
            // Nothing in this group is acknowledged: take its records out again (best effort)
            // and forget the numbers it took.
            for k in &keys {
                let _ = self.events.remove(k);
            }
            self.last_seq = before;
            tracing::error!(error = %e, "event log commit failed");
            let e = Arc::new(e);
            return out.into_iter().map(|_| Err(e.clone())).collect();
        }
        out
    }
}

#[async_trait::async_trait]
impl EventLog for SledLog {
    async fn append(&self, task: TaskId, events: Vec<Event>) -> Result<Vec<Record>, Error> {
        let (done, rx) = oneshot::channel();
        self.tx
            .send(Append { task, events, done })
            .await
            .map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?.map_err(Error::Commit)
    }

    async fn read(&self, task: TaskId, after: u64) -> Result<Vec<Result<Record, Error>>, Error> {
        let mut out = Vec::new();
        for kv in self
            .events
            .range(key(task, after + 1)..=key(task, u64::MAX))
        {
            let (k, v) = kv?;
            out.push(
                serde_json::from_slice::<Record>(&v).map_err(|e| Error::Decode {
                    task,
                    key: format!("events/{}", hex::encode(&k)),
                    reason: e.to_string(),
                }),
            );
        }
        Ok(out)
    }

    async fn tasks(&self) -> Result<Vec<TaskId>, Error> {
        let mut out = Vec::new();
        let mut next: Option<[u8; 8]> = Some([0u8; 8]);
        // Skip from task to task instead of reading every record.
        while let Some(start) = next {
            let Some(kv) = self.events.range(start..).next() else {
                break;
            };
            let (k, _) = kv?;
            let Some(id) = k
                .get(..8)
                .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
            else {
                break;
            };
            out.push(TaskId(id));
            next = id.checked_add(1).map(u64::to_be_bytes);
        }
        Ok(out)
    }

    async fn last_seq(&self, task: TaskId) -> Result<u64, Error> {
        last_stored_seq(&self.events, task)
    }

    async fn new_task_id(&self) -> Result<TaskId, Error> {
        // The next above every task in the log: small and sequential across restarts
        // (`t-1`, `t-2`, ...), and, as no task is ever deleted, never one a task had. An id
        // handed out whose task never reached the log may be handed out again: nothing
        // outside the brain saw it.
        Ok(TaskId(
            self.id_floor
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel),
        ))
    }

    async fn put_snapshot(&self, task: TaskId, upto: u64, state: Vec<u8>) -> Result<(), Error> {
        let mut v = upto.to_be_bytes().to_vec();
        v.extend(state);
        self.snapshots.insert(task.0.to_be_bytes(), v)?;
        // Not synced on its own: a lost snapshot only means a longer replay.
        Ok(())
    }

    async fn snapshot(&self, task: TaskId) -> Result<Option<(u64, Vec<u8>)>, Error> {
        Ok(self.snapshots.get(task.0.to_be_bytes())?.and_then(|v| {
            (v.len() >= 8).then(|| {
                (
                    u64::from_be_bytes(v[..8].try_into().expect("8 bytes")),
                    v[8..].to_vec(),
                )
            })
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{Outcome, ToolResult};
    use std::sync::Arc;

    /// A small record for the log tests.
    pub(super) fn ev(i: u64) -> Event {
        Event::ToolCallCompleted {
            call_id: i,
            result: ToolResult::default(),
        }
    }

    /// The conformance suite both implementations must pass.
    async fn conformance(log: Arc<dyn EventLog>) {
        let a = log.new_task_id().await.unwrap();
        let b = log.new_task_id().await.unwrap();
        assert_ne!(a, b);
        let r = log.append(a, vec![ev(1), ev(2)]).await.unwrap();
        assert_eq!(r.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 2]);
        log.append(b, vec![ev(10)]).await.unwrap();
        let r = log.append(a, vec![ev(3)]).await.unwrap();
        assert_eq!(r[0].seq, 3);
        let all: Vec<Record> = log
            .read(a, 0)
            .await
            .unwrap()
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(all.len(), 3);
        assert!(all.windows(2).all(|w| w[0].seq + 1 == w[1].seq));
        assert_eq!(log.read(a, 2).await.unwrap().len(), 1);
        assert_eq!(log.read(b, 0).await.unwrap().len(), 1);
        let mut tasks = log.tasks().await.unwrap();
        tasks.sort();
        assert_eq!(tasks, {
            let mut t = vec![a, b];
            t.sort();
            t
        });

        // Many tasks appending at once: every append gets its own, gap-free numbers.
        let mut handles = Vec::new();
        for _ in 0..50 {
            let log = log.clone();
            let t = log.new_task_id().await.unwrap();
            handles.push(tokio::spawn(async move {
                for i in 0..20 {
                    let r = log.append(t, vec![ev(i)]).await.unwrap();
                    assert_eq!(r[0].seq, i + 1);
                }
                t
            }));
        }
        for h in handles {
            let t = h.await.unwrap();
            assert_eq!(log.read(t, 0).await.unwrap().len(), 20);
        }

        log.put_snapshot(a, 2, b"state".to_vec()).await.unwrap();
        assert_eq!(log.snapshot(a).await.unwrap(), Some((2, b"state".to_vec())));
        assert_eq!(log.snapshot(b).await.unwrap(), None);
        let fin = Event::Finished {
            outcome: Outcome::Finished,
            reason: String::new(),
            verified: None,
        };
        log.append(a, vec![fin.clone()]).await.unwrap();
        assert_eq!(
            log.read(a, 3).await.unwrap()[0].as_ref().unwrap().event,
            fin
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mem_log_conforms() {
        conformance(Arc::new(MemLog::default())).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pg_log_conforms_and_survives_reopen() {
        let Some(pg) = testkit::postgres::start_or_skip() else {
            return;
        };
        let timing = postgres::Timing::default();
        let db = crate::storage::postgres::Db::open(&pg.url(), "replica-a")
            .await
            .unwrap();
        let log = Arc::new(postgres::PgLog::open(db, timing));
        conformance(log.clone()).await;
        let task = log.new_task_id().await.unwrap();
        log.append(task, vec![ev(1), ev(2), ev(3)]).await.unwrap();
        drop(log);
        // The same replica started again finds its records and numbers on from them.
        let db = crate::storage::postgres::Db::open(&pg.url(), "replica-a")
            .await
            .unwrap();
        let log = postgres::PgLog::open(db, timing);
        assert_eq!(log.read(task, 0).await.unwrap().len(), 3);
        let r = log.append(task, vec![ev(4)]).await.unwrap();
        assert_eq!(r[0].seq, 4, "numbering continues after reopen");
        assert!(log.new_task_id().await.unwrap() > task);
        assert_eq!(
            pg.psql("SELECT max(version) FROM tether_schema"),
            crate::storage::postgres::schema_version_known().to_string(),
            "the migrations were applied once"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sled_log_conforms_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let task;
        {
            let db = sled::open(&path).unwrap();
            let log = Arc::new(SledLog::open(db, path.clone()).unwrap());
            conformance(log.clone()).await;
            task = log.new_task_id().await.unwrap();
            log.append(task, vec![ev(1), ev(2), ev(3)]).await.unwrap();
        }
        // The writer task drops its handle on the db as it ends: a bounded wait for that.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let db = loop {
            match sled::open(&path) {
                Ok(db) => break db,
                Err(e) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the log's writer still holds the db after 10 s: {e}"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
        };
        let log = SledLog::open(db, path).unwrap();
        assert_eq!(log.read(task, 0).await.unwrap().len(), 3);
        let r = log.append(task, vec![ev(4)]).await.unwrap();
        assert_eq!(r[0].seq, 4, "numbering continues after reopen");
        // Task ids go on from the last one, small and sequential (they once jumped by a
        // million at each start).
        assert_eq!(log.new_task_id().await.unwrap(), TaskId(task.0 + 1));
        assert_eq!(log.new_task_id().await.unwrap(), TaskId(task.0 + 2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_undecodable_record_is_reported_with_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let db = sled::open(&path).unwrap();
        let log = SledLog::open(db.clone(), path).unwrap();
        let t = log.new_task_id().await.unwrap();
        log.append(t, vec![ev(1), ev(2)]).await.unwrap();
        db.open_tree("events")
            .unwrap()
            .insert(key(t, 2), b"{not json".to_vec())
            .unwrap();
        let recs = log.read(t, 0).await.unwrap();
        assert!(recs[0].is_ok());
        let err = recs[1].as_ref().unwrap_err().to_string();
        assert!(
            err.contains(&format!("events/{}", hex::encode(key(t, 2)))),
            "{err}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_created_at_once_get_distinct_ids() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let db = sled::open(&path).unwrap();
        let log = Arc::new(SledLog::open(db, path).unwrap());
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut ids = Vec::with_capacity(2000);
                    for _ in 0..2000 {
                        ids.push(log.new_task_id().await.unwrap());
                    }
                    ids
                })
            })
            .collect();
        let mut all: Vec<TaskId> = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "an id was handed out twice");
    }
}
