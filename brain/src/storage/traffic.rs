//! What replicas tell each other through PostgreSQL: notifications (LISTEN/NOTIFY) on one
//! connection of each replica's own, the requests a replica hands to the one driving a task
//! (a person's change) and their answers, and the tasks a replica shows to watchers while
//! another drives them.
//!
//! Why the database and not a replica-to-replica stream: every replica already reaches it,
//! so no replica needs another's address, certificate or port, and a replica that restarts
//! or is replaced is found by nobody. A notification is only a hint (it is lost while a
//! listener reconnects); what it points at is in the tables, which each reader re-reads after
//! a reconnect ([`Note::Resync`]).

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::postgres::{Db, Error};

/// Records were stored: payload `task:seq` (the last seq stored by one statement).
pub const LOG: &str = "tether_log";
/// A request was asked for a task: payload the task id.
pub const REQUESTS: &str = "tether_requests";
/// A request was answered: payload its id.
pub const ANSWERS: &str = "tether_answers";
/// Live output of a watched task: payload JSON (see the replicas' relay).
pub const LIVE: &str = "tether_live";

/// The payload PostgreSQL takes at most in one notification is 8000 bytes; what is sent
/// stays well below.
pub const PAYLOAD_MAX: usize = 7000;

/// What the listener passes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// A notification on `channel`.
    Heard { channel: String, payload: String },
    /// The listener (re)connected: notifications may have been missed; read the tables.
    Resync,
}

/// Notes queued per subscriber; one that falls behind is told it lagged (and resyncs).
const NOTES_QUEUE: usize = 4096;
/// How long the listener waits between tries to connect, at most.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Listens on `channels` on a connection of its own until `stop`, reconnecting when it is
/// lost, and passes what it hears to its subscribers.
pub fn listen(db: &Db, channels: &[&str], stop: CancellationToken) -> broadcast::Sender<Note> {
    let (tx, _) = broadcast::channel(NOTES_QUEUE);
    let (db, out) = (db.clone(), tx.clone());
    let channels: Vec<String> = channels.iter().map(|c| (*c).to_string()).collect();
    tokio::spawn(async move {
        let mut pause = Duration::from_millis(100);
        loop {
            let run = listen_once(&db, &channels, &out);
            let err = tokio::select! {
                _ = stop.cancelled() => return,
                e = run => e,
            };
            tracing::warn!(error = %err, retry_in = ?pause, "the store's notifications stopped; listening again");
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(RECONNECT_MAX);
        }
    });
    tx
}

/// One connection's listening: returns why it ended.
async fn listen_once(db: &Db, channels: &[String], out: &broadcast::Sender<Note>) -> Error {
    let (config, tls) = &*db.direct;
    let connected = tokio::time::timeout(Duration::from_secs(10), config.connect(tls.clone()));
    let (client, mut conn) = match connected.await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Error::Query(e),
        Err(_) => {
            return Error::Timeout {
                target: db.target.clone(),
                after: Duration::from_secs(10),
            };
        }
    };
    let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
    let sql: String = channels.iter().map(|c| format!("LISTEN {c};")).collect();
    // The LISTEN is answered through the connection, which the stream below drives.
    let subscribe = client.batch_execute(&sql);
    tokio::pin!(subscribe);
    let mut subscribed = false;
    loop {
        tokio::select! {
            r = &mut subscribe, if !subscribed => {
                if let Err(e) = r {
                    return Error::Query(e);
                }
                subscribed = true;
                let _ = out.send(Note::Resync);
            }
            m = messages.next() => match m {
                Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                    let _ = out.send(Note::Heard {
                        channel: n.channel().to_string(),
                        payload: n.payload().to_string(),
                    });
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Error::Query(e),
                None => {
                    return Error::Connect {
                        target: db.target.clone(),
                        reason: "the listening connection closed".into(),
                    };
                }
            },
        }
    }
}

/// One request taken to answer.
#[derive(Debug, Clone)]
pub struct Taken {
    pub id: i64,
    pub task: i64,
    pub body: Vec<u8>,
}

/// A taken request that has not been answered within this long may be taken by another
/// replica (the one that took it died).
const TAKEN_GRACE_MS: i64 = 30_000;

impl Db {
    /// Sends `payload` on `channel` to every replica listening (after nothing: no
    /// transaction).
    pub async fn notify(&self, channel: &str, payload: &str) -> Result<(), Error> {
        self.execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
            .await
            .map(drop)
    }

    /// The last stored sequence number of each of `tasks` (0 for a task with none), in one
    /// query.
    pub async fn last_seqs(&self, tasks: &[i64]) -> Result<Vec<(i64, i64)>, Error> {
        Ok(self
            .query(
                "SELECT t.task, COALESCE((SELECT max(seq) FROM events e WHERE e.task = t.task), 0)
                 FROM unnest($1::bigint[]) AS t(task)",
                &[&tasks],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }

    /// Asks whoever drives `task` for `body`; the request's id. Wakes the replicas.
    pub async fn ask(&self, task: i64, body: &[u8]) -> Result<i64, Error> {
        let id: i64 = self
            .query_one(
                "WITH asked AS (
                     INSERT INTO requests (task, body, asked_by) VALUES ($1, $2, $3) RETURNING id
                 )
                 SELECT id, pg_notify('tether_requests', $1::text) FROM asked",
                &[&task, &body, &self.replica()],
            )
            .await?
            .get(0);
        Ok(id)
    }

    /// Takes up to `limit` unanswered requests for `tasks` (those this replica drives) that
    /// nobody has taken, or whose taker has not answered within the grace.
    pub async fn take_requests(&self, tasks: &[i64], limit: i64) -> Result<Vec<Taken>, Error> {
        Ok(self
            .query(
                "UPDATE requests SET taken_by = $2, taken_at = now()
                 WHERE id IN (
                     SELECT id FROM requests
                     WHERE answer IS NULL AND task = ANY($1)
                       AND (taken_by IS NULL
                            OR taken_at < now() - $3::bigint * interval '1 millisecond')
                     ORDER BY id LIMIT $4
                     FOR UPDATE SKIP LOCKED)
                 RETURNING id, task, body",
                &[&tasks, &self.replica(), &TAKEN_GRACE_MS, &limit],
            )
            .await?
            .iter()
            .map(|r| Taken {
                id: r.get(0),
                task: r.get(1),
                body: r.get(2),
            })
            .collect())
    }

    /// Answers request `id` (once: a second answer is not stored). Wakes the asker.
    pub async fn answer(&self, id: i64, answer: &[u8]) -> Result<bool, Error> {
        let rows = self
            .query(
                "WITH answered AS (
                     UPDATE requests SET answer = $2, answered_at = now()
                     WHERE id = $1 AND answer IS NULL RETURNING id
                 )
                 SELECT pg_notify('tether_answers', id::text) FROM answered",
                &[&id, &answer],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    /// Request `id`'s answer, once it has one.
    pub async fn answer_of(&self, id: i64) -> Result<Option<Vec<u8>>, Error> {
        Ok(self
            .query_opt("SELECT answer FROM requests WHERE id = $1", &[&id])
            .await?
            .and_then(|r| r.get(0)))
    }

    /// Drops request `id` if nobody has taken it; whether it was dropped (if not, it may
    /// still be answered).
    pub async fn withdraw(&self, id: i64) -> Result<bool, Error> {
        Ok(self
            .execute(
                "DELETE FROM requests WHERE id = $1 AND (taken_by IS NULL OR answer IS NOT NULL)",
                &[&id],
            )
            .await?
            == 1)
    }

    /// Forgets answered requests older than `age`, and unanswered ones older than a day.
    pub async fn prune_requests(&self, age: Duration) -> Result<u64, Error> {
        let ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        self.execute(
            "DELETE FROM requests
             WHERE (answer IS NOT NULL AND answered_at < now() - $1::bigint * interval '1 millisecond')
                OR asked_at < now() - interval '1 day'",
            &[&ms],
        )
        .await
    }

    /// Says this replica shows `tasks` to watchers for `ttl` more.
    pub async fn watch(&self, tasks: &[i64], ttl: Duration) -> Result<(), Error> {
        let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        self.execute(
            "INSERT INTO watches (task, replica, until)
             SELECT t, $2, now() + $3::bigint * interval '1 millisecond' FROM unnest($1::bigint[]) AS t
             ON CONFLICT (task, replica) DO UPDATE SET until = excluded.until",
            &[&tasks, &self.replica(), &ms],
        )
        .await
        .map(drop)
    }

    /// The tasks some replica shows to watchers now.
    pub async fn watched(&self) -> Result<Vec<i64>, Error> {
        // Expired rows go as they are read past.
        self.execute(
            "DELETE FROM watches WHERE until < now() - interval '1 minute'",
            &[],
        )
        .await?;
        Ok(self
            .query("SELECT DISTINCT task FROM watches WHERE until > now()", &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }
}

impl Db {
    /// Says `workers` have their sessions on this replica now (and no others do).
    pub async fn put_sessions(&self, workers: &[String]) -> Result<(), Error> {
        self.execute(
            "WITH gone AS (
                 DELETE FROM sessions WHERE replica = $2 AND NOT (worker = ANY($1))
             )
             INSERT INTO sessions (worker, replica)
             SELECT w, $2 FROM unnest($1::text[]) AS w
             ON CONFLICT (worker) DO UPDATE SET replica = excluded.replica, since = now()
               WHERE sessions.replica <> excluded.replica",
            &[&workers, &self.replica()],
        )
        .await
        .map(drop)
    }

    /// The workers whose sessions are on another replica that said it was alive within
    /// `within`: (worker, replica).
    pub async fn sessions_elsewhere(
        &self,
        within: Duration,
    ) -> Result<Vec<(String, String)>, Error> {
        let ms = i64::try_from(within.as_millis()).unwrap_or(i64::MAX);
        Ok(self
            .query(
                "SELECT s.worker, s.replica FROM sessions s JOIN replicas r ON r.name = s.replica
                 WHERE s.replica <> $1 AND r.seen_at > now() - $2::bigint * interval '1 millisecond'",
                &[&self.replica(), &ms],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }
}

/// Another replica as it said it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub protocol: i32,
    pub oldest: i32,
    pub version: String,
}

impl Db {
    /// Says this replica is alive, speaks `protocol` and understands down to `oldest`.
    pub async fn announce(&self, protocol: i32, oldest: i32, version: &str) -> Result<(), Error> {
        self.execute(
            "INSERT INTO replicas (name, protocol, oldest, version, seen_at)
             VALUES ($1, $2, $3, $4, now())
             ON CONFLICT (name) DO UPDATE SET protocol = excluded.protocol,
                 oldest = excluded.oldest, version = excluded.version, seen_at = now()",
            &[&self.replica(), &protocol, &oldest, &version],
        )
        .await
        .map(drop)
    }

    /// The other replicas that said they were alive within `within`.
    pub async fn peers(&self, within: Duration) -> Result<Vec<Peer>, Error> {
        let ms = i64::try_from(within.as_millis()).unwrap_or(i64::MAX);
        Ok(self
            .query(
                "SELECT name, protocol, oldest, version FROM replicas
                 WHERE name <> $1 AND seen_at > now() - $2::bigint * interval '1 millisecond'
                 ORDER BY name",
                &[&self.replica(), &ms],
            )
            .await?
            .iter()
            .map(|r| Peer {
                name: r.get(0),
                protocol: r.get(1),
                oldest: r.get(2),
                version: r.get(3),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn db(pg: &testkit::postgres::Postgres, replica: &str) -> Db {
        Db::open(&pg.url(), replica).await.expect("open")
    }

    async fn heard(rx: &mut broadcast::Receiver<Note>, channel: &str) -> String {
        let wait = async {
            loop {
                match rx.recv().await {
                    Ok(Note::Heard {
                        channel: c,
                        payload,
                    }) if c == channel => return payload,
                    Ok(_) => {}
                    Err(e) => panic!("listener: {e}"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .unwrap_or_else(|_| panic!("nothing heard on {channel}"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_are_heard_and_requests_are_answered_once() {
        let Some(pg) = testkit::postgres::start_or_skip() else {
            return;
        };
        let (a, b) = (db(&pg, "a").await, db(&pg, "b").await);
        let stop = CancellationToken::new();
        let notes = listen(&b, &[LOG, REQUESTS, ANSWERS], stop.clone());
        let mut rx = notes.subscribe();
        // Subscribed: the listener says so before anything can be missed after it.
        let wait = tokio::time::timeout(Duration::from_secs(10), async {
            while rx.recv().await != Ok(Note::Resync) {}
        });
        wait.await.expect("the listener connects");

        let task = a.new_task(Duration::from_secs(10)).await.expect("task");
        let body = vec![b"{}".to_vec(), b"{}".to_vec()];
        a.append(task, 1, 1, 1, 0, &body, Duration::from_secs(5))
            .await
            .expect("append");
        assert_eq!(heard(&mut rx, LOG).await, format!("{task}:2"));
        assert_eq!(
            b.last_seqs(&[task, task + 1000]).await.expect("seqs"),
            vec![(task, 2), (task + 1000, 0)]
        );

        let id = b.ask(task, b"change").await.expect("ask");
        assert_eq!(heard(&mut rx, REQUESTS).await, task.to_string());
        let taken = a.take_requests(&[task], 10).await.expect("take");
        assert_eq!(taken.len(), 1);
        assert_eq!(
            (taken[0].id, taken[0].body.as_slice()),
            (id, &b"change"[..])
        );
        assert!(
            b.take_requests(&[task], 10).await.expect("take").is_empty(),
            "a taken request is not taken twice within the grace"
        );
        assert!(!b.withdraw(id).await.expect("withdraw"), "taken: it stays");
        assert!(a.answer(id, b"done").await.expect("answer"));
        assert!(
            !a.answer(id, b"again").await.expect("answer"),
            "answered once"
        );
        assert_eq!(heard(&mut rx, ANSWERS).await, id.to_string());
        assert_eq!(b.answer_of(id).await.expect("read"), Some(b"done".to_vec()));

        b.watch(&[task], Duration::from_secs(10))
            .await
            .expect("watch");
        assert_eq!(a.watched().await.expect("watched"), vec![task]);
        stop.cancel();
    }
}
