//! The event log on PostgreSQL ([`PgLog`]): the same [`EventLog`] contract as the sled log,
//! for brains that share one database. Each task's records are appended under its lease
//! (`storage::postgres`): the replica that holds it at an epoch numbers the records itself
//! (it is the only writer while it holds the lease) and the database refuses them, in the
//! same statement, once the lease is not that replica's at that epoch or has lapsed.
//!
//! A lease this replica held that lapsed while nobody took it (the database was away longer
//! than the lease, say) is taken back at the next append: no other replica wrote in between,
//! since taking it would have raised its epoch. A lease that moved is lost for good here: the
//! task's appends are refused with [`Error::Fenced`] and the log says so once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use shared::locks::Lock;

use super::{Error, EventLog};
use crate::model::event::{Event, RECORD_VERSION, Record, TaskId};
use crate::storage::postgres::{Appended, Db, EventRow, LeaseRow};

/// How long a lease lasts unless renewed, and how long an append keeps retrying while the
/// database is away.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub lease_ttl: Duration,
    pub patience: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(10),
            patience: Duration::from_secs(120),
        }
    }
}

/// A task this replica holds: the lease's epoch and the last record's number.
struct Held {
    epoch: i64,
    last_seq: i64,
}

struct Inner {
    db: Db,
    timing: Timing,
    /// Held tasks; each one's appends take its lock in turn (they number records).
    held: Mutex<HashMap<TaskId, Arc<tokio::sync::Mutex<Held>>>>,
    /// Tasks whose lease moved to another replica while this one held it.
    lost: Mutex<HashSet<TaskId>>,
}

/// The PostgreSQL event log of one replica. Cheap to clone.
#[derive(Clone)]
pub struct PgLog {
    inner: Arc<Inner>,
}

fn db_id(task: TaskId) -> Result<i64, Error> {
    i64::try_from(task.0).map_err(|_| Error::IdRange(task.0))
}

fn describe(lease: Option<&LeaseRow>) -> String {
    match lease {
        None => "it has no lease".into(),
        Some(l) if l.lapsed => format!(
            "its lease (replica {}, epoch {}) has lapsed",
            l.holder, l.epoch
        ),
        Some(l) => format!("replica {} holds it at epoch {}", l.holder, l.epoch),
    }
}

impl PgLog {
    /// The log on `db`; renews this replica's leases in the background while it lives.
    pub fn open(db: Db, timing: Timing) -> Self {
        let inner = Arc::new(Inner {
            db,
            timing,
            held: Mutex::new(HashMap::new()),
            lost: Mutex::new(HashSet::new()),
        });
        tokio::spawn(renew(Arc::downgrade(&inner)));
        Self { inner }
    }

    /// The database under the log.
    pub fn db(&self) -> &Db {
        &self.inner.db
    }

    /// The task's entry, taking its lease if this replica never held it.
    async fn held(&self, task: TaskId) -> Result<Arc<tokio::sync::Mutex<Held>>, Error> {
        if let Some(h) = self.inner.held.locked().get(&task) {
            return Ok(h.clone());
        }
        let id = db_id(task)?;
        if self.inner.lost.locked().contains(&task) {
            let now = self.inner.db.lease(id).await?;
            return Err(Error::Fenced {
                task,
                now: describe(now.as_ref()),
            });
        }
        let Some(epoch) = self.inner.db.claim(id, self.inner.timing.lease_ttl).await? else {
            let now = self.inner.db.lease(id).await?;
            return Err(Error::Fenced {
                task,
                now: describe(now.as_ref()),
            });
        };
        let last_seq = self.inner.db.last_seq(id).await?;
        let entry = Arc::new(tokio::sync::Mutex::new(Held { epoch, last_seq }));
        Ok(self
            .inner
            .held
            .locked()
            .entry(task)
            .or_insert(entry)
            .clone())
    }
}

/// Renews the replica's leases at a third of their time to live, for as long as the log lives.
async fn renew(inner: Weak<Inner>) {
    loop {
        let every = match inner.upgrade() {
            Some(i) => i.timing.lease_ttl / 3,
            None => return,
        };
        tokio::time::sleep(every).await;
        let Some(i) = inner.upgrade() else { return };
        match i.db.renew(i.timing.lease_ttl).await {
            Ok(renewed) => {
                let renewed: HashMap<i64, i64> = renewed.into_iter().collect();
                let held: Vec<(TaskId, Arc<tokio::sync::Mutex<Held>>)> = i
                    .held
                    .locked()
                    .iter()
                    .map(|(t, h)| (*t, h.clone()))
                    .collect();
                for (task, h) in held {
                    let Ok(id) = db_id(task) else { continue };
                    // An append in flight holds the entry; its own answer settles it.
                    let Ok(mut h) = h.try_lock() else { continue };
                    if renewed.get(&id) != Some(&h.epoch) {
                        settle_unrenewed(&i, task, id, &mut h).await;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot renew this replica's leases"),
        }
    }
}

/// A held lease the renewal missed: lapsed while nobody took it (the database was away, or
/// this replica paused), it is taken back under a new epoch; moved, the task is lost here.
async fn settle_unrenewed(i: &Inner, task: TaskId, id: i64, h: &mut Held) {
    let lease = match i.db.lease(id).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(task = %task, error = %e, "cannot read the lease of task {task}");
            return;
        }
    };
    let ours = lease
        .as_ref()
        .is_some_and(|l| l.holder == i.db.replica() && l.epoch == h.epoch);
    if ours {
        match i.db.claim(id, i.timing.lease_ttl).await {
            Ok(Some(epoch)) => {
                tracing::info!(task = %task, epoch, "took back the lapsed lease of task {task}");
                h.epoch = epoch;
                return;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(task = %task, error = %e, "cannot take back the lease of task {task}");
                return;
            }
        }
    }
    let now = describe(i.db.lease(id).await.ok().flatten().as_ref());
    lose(i, task, &now);
}

/// Forgets `task` as held: its lease moved. Said once.
fn lose(i: &Inner, task: TaskId, now: &str) {
    i.held.locked().remove(&task);
    i.lost.locked().insert(task);
    tracing::warn!(
        task = %task,
        "this replica no longer holds task {task} ({now}); nothing more it appends to the task lands"
    );
}

fn to_record(task: TaskId, row: EventRow) -> Result<Record, Error> {
    let bad = |reason: String| Error::Decode {
        task,
        key: format!("events/{}/{}", task.0, row.seq),
        reason,
    };
    let event = serde_json::from_slice::<Event>(&row.event).map_err(|e| bad(e.to_string()))?;
    Ok(Record {
        v: u32::try_from(row.v).map_err(|_| bad(format!("record version {}", row.v)))?,
        task,
        seq: u64::try_from(row.seq).map_err(|_| bad(format!("sequence number {}", row.seq)))?,
        at_ms: row.at_ms,
        event,
    })
}

#[async_trait::async_trait]
impl EventLog for PgLog {
    async fn append(&self, task: TaskId, events: Vec<Event>) -> Result<Vec<Record>, Error> {
        let id = db_id(task)?;
        let entry = self.held(task).await?;
        let mut held = entry.lock().await;
        let at_ms = shared::now_unix_ms();
        let bodies: Vec<Vec<u8>> = events
            .iter()
            .map(|e| serde_json::to_vec(e).expect("events serialise"))
            .collect();
        let v = i32::try_from(RECORD_VERSION).expect("a small version");
        let first = held.last_seq + 1;
        let patience = self.inner.timing.patience;
        let mut outcome = self
            .inner
            .db
            .append(id, held.epoch, first, v, at_ms, &bodies, patience)
            .await?;
        if let Appended::Fenced(Some(l)) = &outcome {
            // Still ours at our epoch but lapsed: nobody took it in between, so take it back.
            if l.lapsed
                && l.holder == self.inner.db.replica()
                && l.epoch == held.epoch
                && let Some(epoch) = self.inner.db.claim(id, self.inner.timing.lease_ttl).await?
            {
                tracing::info!(task = %task, epoch, "took back the lapsed lease of task {task}");
                held.epoch = epoch;
                outcome = self
                    .inner
                    .db
                    .append(id, epoch, first, v, at_ms, &bodies, patience)
                    .await?;
            }
        }
        match outcome {
            Appended::Landed => {
                held.last_seq += bodies.len() as i64;
                if events.iter().any(|e| matches!(e, Event::Finished { .. })) {
                    // Ended: nobody needs to drive it; a later append (a delivery) takes
                    // the lease again.
                    let epoch = held.epoch;
                    drop(held);
                    self.inner.held.locked().remove(&task);
                    if let Err(e) = self.inner.db.release(id, epoch).await {
                        tracing::warn!(task = %task, error = %e, "cannot release the lease of an ended task; it lapses by itself");
                    }
                }
                Ok(events
                    .into_iter()
                    .zip(first..)
                    .map(|(event, seq)| Record {
                        v: RECORD_VERSION,
                        task,
                        seq: seq as u64,
                        at_ms,
                        event,
                    })
                    .collect())
            }
            Appended::Fenced(now) => {
                let now = describe(now.as_ref());
                drop(held);
                lose(&self.inner, task, &now);
                Err(Error::Fenced { task, now })
            }
        }
    }

    async fn read(&self, task: TaskId, after: u64) -> Result<Vec<Result<Record, Error>>, Error> {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let rows = self.inner.db.read(db_id(task)?, after).await?;
        Ok(rows.into_iter().map(|r| to_record(task, r)).collect())
    }

    async fn tasks(&self) -> Result<Vec<TaskId>, Error> {
        Ok(self
            .inner
            .db
            .tasks()
            .await?
            .into_iter()
            .filter_map(|t| u64::try_from(t).ok().map(TaskId))
            .collect())
    }

    async fn last_seq(&self, task: TaskId) -> Result<u64, Error> {
        Ok(self.inner.db.last_seq(db_id(task)?).await?.max(0) as u64)
    }

    async fn new_task_id(&self) -> Result<TaskId, Error> {
        let id = self.inner.db.new_task(self.inner.timing.lease_ttl).await?;
        let task = TaskId(u64::try_from(id).map_err(|_| Error::IdRange(0))?);
        self.inner.held.locked().insert(
            task,
            Arc::new(tokio::sync::Mutex::new(Held {
                epoch: 1,
                last_seq: 0,
            })),
        );
        Ok(task)
    }

    async fn put_snapshot(&self, task: TaskId, upto: u64, state: Vec<u8>) -> Result<(), Error> {
        let Some(entry) = self.inner.held.locked().get(&task).cloned() else {
            return Ok(());
        };
        let epoch = entry.lock().await.epoch;
        let upto = i64::try_from(upto).map_err(|_| Error::IdRange(upto))?;
        // Not stored when the lease moved or a later one is there: it only costs a replay.
        self.inner
            .db
            .put_snapshot(db_id(task)?, epoch, upto, &state)
            .await?;
        Ok(())
    }

    async fn snapshot(&self, task: TaskId) -> Result<Option<(u64, Vec<u8>)>, Error> {
        Ok(self
            .inner
            .db
            .snapshot(db_id(task)?)
            .await?
            .and_then(|(upto, s)| u64::try_from(upto).ok().map(|u| (u, s))))
    }

    /// Takes `task`'s lease for this replica if it is free or lapsed (or held by this
    /// replica already). A task whose lease moved away from this replica is taken again
    /// only once it is free.
    fn shared(&self) -> bool {
        true
    }

    async fn held_elsewhere(&self) -> Result<HashSet<TaskId>, Error> {
        Ok(self
            .inner
            .db
            .held_elsewhere()
            .await?
            .into_iter()
            .filter_map(|t| u64::try_from(t).ok().map(TaskId))
            .collect())
    }

    async fn release(&self, task: TaskId) -> Result<bool, Error> {
        let Some(entry) = self.inner.held.locked().get(&task).cloned() else {
            return Ok(false);
        };
        // After any append in flight: its records land (or not) under the lease first.
        let held = entry.lock().await;
        let released = self.inner.db.release(db_id(task)?, held.epoch).await?;
        drop(held);
        lose(&self.inner, task, "it was let go");
        Ok(released)
    }

    async fn claim(&self, task: TaskId) -> Result<bool, Error> {
        self.inner.lost.locked().remove(&task);
        match self.held(task).await {
            Ok(_) => Ok(true),
            Err(Error::Fenced { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::ev;
    use super::*;
    use crate::storage::postgres::Error as DbError;

    const SHORT: Timing = Timing {
        lease_ttl: Duration::from_secs(2),
        patience: Duration::from_secs(60),
    };

    async fn replica(pg: &testkit::postgres::Postgres, name: &str, timing: Timing) -> PgLog {
        PgLog::open(Db::open(&pg.url(), name).await.unwrap(), timing)
    }

    fn seqs(pg: &testkit::postgres::Postgres, task: TaskId) -> String {
        pg.psql(&format!(
            "SELECT string_agg(seq::text, ',' ORDER BY seq) FROM events WHERE task = {}",
            task.0
        ))
    }

    /// The lease lapses under replica A as if A were frozen (its renewals stopped), B takes
    /// the task and writes; A wakes and tries to write: nothing of A's lands, now or later.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_whose_lease_moved_lands_nothing_more() {
        let Some(pg) = testkit::postgres::start_or_skip() else {
            return;
        };
        let a = replica(&pg, "replica-a", SHORT).await;
        let b = replica(&pg, "replica-b", SHORT).await;
        let task = a.new_task_id().await.unwrap();
        a.append(task, vec![ev(1), ev(2)]).await.unwrap();
        assert!(!b.claim(task).await.unwrap(), "B took a lease A holds");
        // A is frozen past its lease: the database's clock passes the expiry.
        pg.psql(&format!(
            "UPDATE leases SET expires_at = now() - interval '1 second' WHERE task = {}",
            task.0
        ));
        assert!(
            b.claim(task).await.unwrap(),
            "B could not take a lapsed lease"
        );
        // A wakes up and goes on as if nothing happened, before B has written anything: only
        // the lease's check in the database stands in its way.
        let err = a.append(task, vec![ev(99)]).await.unwrap_err();
        assert!(
            matches!(&err, Error::Fenced { now, .. } if now.contains("replica-b holds it at epoch 2")),
            "{err}"
        );
        let r = b.append(task, vec![ev(3)]).await.unwrap();
        assert_eq!(r[0].seq, 3, "B numbers on from A's records");
        let err = a.append(task, vec![ev(100)]).await.unwrap_err();
        assert!(matches!(err, Error::Fenced { .. }), "{err}");
        a.put_snapshot(task, 2, b"stale".to_vec()).await.unwrap();
        assert_eq!(seqs(&pg, task), "1,2,3");
        assert_eq!(
            pg.psql(&format!(
                "SELECT count(*) FROM events WHERE task = {} AND event LIKE '%99%'",
                task.0
            )),
            "0"
        );
        assert_eq!(a.snapshot(task).await.unwrap(), None, "A's snapshot landed");
        // B goes on.
        assert_eq!(b.append(task, vec![ev(4)]).await.unwrap()[0].seq, 4);
    }

    /// A lease that lapsed while nobody took it (the database was away longer than the
    /// lease) is taken back by its holder at its next append, under a new epoch.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lapsed_lease_nobody_took_is_taken_back() {
        let Some(pg) = testkit::postgres::start_or_skip() else {
            return;
        };
        let a = replica(&pg, "replica-a", SHORT).await;
        let task = a.new_task_id().await.unwrap();
        a.append(task, vec![ev(1)]).await.unwrap();
        pg.psql(&format!(
            "UPDATE leases SET expires_at = now() - interval '1 second' WHERE task = {}",
            task.0
        ));
        assert_eq!(a.append(task, vec![ev(2)]).await.unwrap()[0].seq, 2);
        assert_eq!(
            pg.psql(&format!(
                "SELECT holder || ' ' || epoch FROM leases WHERE task = {}",
                task.0
            )),
            "replica-a 2"
        );
    }

    /// A lease that lapsed under a live replica (it paused; nobody took the task) is taken
    /// back by its renewals, with no append needed; one that moved is given up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn renewals_take_back_a_lapsed_lease_and_give_up_a_moved_one() {
        let Some(pg) = testkit::postgres::start_or_skip() else {
            return;
        };
        let a = replica(&pg, "replica-a", SHORT).await;
        let t1 = a.new_task_id().await.unwrap();
        let t2 = a.new_task_id().await.unwrap();
        pg.psql("UPDATE leases SET expires_at = now() - interval '1 second'");
        let lease = |t: TaskId| {
            pg.psql(&format!(
                "SELECT holder || ' ' || epoch || ' ' || (expires_at > now()) FROM leases WHERE task = {}",
                t.0
            ))
        };
        // t2 moves to B before A's next renewal.
        let b = replica(&pg, "replica-b", SHORT).await;
        assert!(b.claim(t2).await.unwrap());
        assert!(
            testkit::wait_until(Duration::from_secs(10), || lease(t1) == "replica-a 2 true"),
            "not taken back: {}",
            lease(t1)
        );
        assert_eq!(a.append(t1, vec![ev(1)]).await.unwrap()[0].seq, 1);
        let err = a.append(t2, vec![ev(1)]).await.unwrap_err();
        assert!(matches!(err, Error::Fenced { .. }), "{err}");
        assert_eq!(lease(t2), "replica-b 2 true");
    }

    /// An append whose answer was lost is sent again: it is stored once; other contents
    /// at the same numbers are refused as a conflict.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_append_sent_twice_is_stored_once() {
        let Some(pg) = testkit::postgres::start_or_skip() else {
            return;
        };
        let db = Db::open(&pg.url(), "replica-a").await.unwrap();
        let task = db.new_task(Duration::from_secs(30)).await.unwrap();
        let bodies = vec![b"{\"a\":1}".to_vec(), b"{\"a\":2}".to_vec()];
        let patience = Duration::from_secs(5);
        for _ in 0..2 {
            assert_eq!(
                db.append(task, 1, 1, 1, 0, &bodies, patience)
                    .await
                    .unwrap(),
                Appended::Landed
            );
        }
        assert_eq!(
            pg.psql(&format!("SELECT count(*) FROM events WHERE task = {task}")),
            "2"
        );
        let other = vec![b"{\"b\":1}".to_vec(), b"{\"b\":2}".to_vec()];
        let err = db
            .append(task, 1, 1, 1, 0, &other, patience)
            .await
            .unwrap_err();
        assert!(matches!(err, DbError::Conflict { .. }), "{err}");
        // A wrong epoch is refused whatever the numbers.
        assert!(matches!(
            db.append(task, 7, 3, 1, 0, &other, patience).await.unwrap(),
            Appended::Fenced(Some(_))
        ));
    }

    /// PostgreSQL stops and starts again while a task appends: the appends wait, go on, and
    /// the log has every record once, in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_wait_out_a_database_restart_and_lose_nothing() {
        let Some(pg) = testkit::postgres::start_or_skip() else {
            return;
        };
        let pg = Arc::new(pg);
        let log = replica(&pg, "replica-a", Timing::default()).await;
        let task = log.new_task_id().await.unwrap();
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
        let done = Arc::new(AtomicU64::new(0));
        let restarted = Arc::new(AtomicBool::new(false));
        // Appends go on until 50 more have landed after the database came back.
        let writer = {
            let (log, done, restarted) = (log.clone(), done.clone(), restarted.clone());
            tokio::spawn(async move {
                let mut back_at = None;
                for i in 1u64.. {
                    let r = log.append(task, vec![ev(i)]).await.unwrap();
                    assert_eq!(r[0].seq, i);
                    done.store(i, SeqCst);
                    if restarted.load(SeqCst) {
                        let at = *back_at.get_or_insert(i);
                        if i >= at + 50 {
                            return i;
                        }
                    }
                }
                unreachable!()
            })
        };
        let stopped_at = {
            let (pg, done, restarted) = (pg.clone(), done.clone(), restarted.clone());
            tokio::task::spawn_blocking(move || {
                assert!(testkit::wait_until(Duration::from_secs(60), || done
                    .load(SeqCst)
                    >= 50));
                pg.stop();
                let stopped_at = done.load(SeqCst);
                pg.restart();
                restarted.store(true, SeqCst);
                stopped_at
            })
        };
        let stopped_at = stopped_at.await.unwrap();
        let total = writer.await.unwrap();
        assert!(
            stopped_at < total,
            "the database stopped after the last append"
        );
        let recs = log.read(task, 0).await.unwrap();
        assert_eq!(recs.len() as u64, total);
        for (i, r) in recs.iter().enumerate() {
            assert_eq!(r.as_ref().unwrap().seq, i as u64 + 1);
        }
        assert_eq!(
            pg.psql(&format!(
                "SELECT count(DISTINCT seq) FROM events WHERE task = {}",
                task.0
            )),
            total.to_string()
        );
    }

    /// Replicas starting at once apply each migration once; a database whose schema is newer
    /// than the brain is refused in words.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn migrations_run_once_and_a_newer_schema_is_refused() {
        let Some(pg) = testkit::postgres::start_or_skip() else {
            return;
        };
        let opens: Vec<_> = (0..4)
            .map(|i| {
                let url = pg.url();
                tokio::spawn(async move { Db::open(&url, &format!("r{i}")).await })
            })
            .collect();
        for o in opens {
            o.await.unwrap().unwrap();
        }
        let known = crate::storage::postgres::schema_version_known();
        assert_eq!(
            pg.psql("SELECT count(*) FROM tether_schema"),
            known.to_string(),
            "each migration applied once"
        );
        pg.psql("INSERT INTO tether_schema (version, name) VALUES (99, 'from-the-future')");
        let err = Db::open(&pg.url(), "r")
            .await
            .err()
            .expect("opened a newer schema");
        assert!(
            err.to_string().contains(&format!(
                "version 99, newer than this brain knows ({known})"
            )),
            "{err}"
        );
        let bad = Db::open("mysql://x@y/z", "r")
            .await
            .err()
            .expect("a mysql URL");
        assert!(bad.to_string().contains("postgres://"), "{bad}");
        let wrong = pg.url().replace("tether-test-password", "wrong");
        let err = Db::open(&wrong, "r").await.err().expect("a wrong password");
        assert!(err.to_string().contains("password"), "{err}");
    }
}
