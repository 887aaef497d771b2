//! Replicas on one PostgreSQL store, talking through it (`storage::traffic`):
//! - **Views.** Each replica shows every task: the ones it drives from its own appends, the
//!   others (views) from the records the driving replica stores, read when the database says
//!   a task grew (`tether_log`), and again after a missed notification could have been lost.
//!   So `brain tasks`, a task's log and a watcher work on any replica.
//! - **Changes handed over.** A person's change to a view (approve, cancel, move, resume,
//!   deliver) becomes a request row that the replica driving the task takes, does, and
//!   answers ([`Link`], the engine's `Peers` port; [`answer_requests`]).
//! - **Live output.** A replica showing a task to a watcher says so (`watches`); the replica
//!   driving it then sends the task's live output (not logged) on `tether_live`, in batches.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::engine::handoff::{Answer, Change};
use crate::engine::ports::{Peers, PortError};
use crate::engine::{Engine, LiveOutput};
use crate::model::event::TaskId;
use crate::storage::postgres::Db;
use crate::storage::traffic::{self, Note};

/// The protocol this brain speaks to the other replicas (the requests, answers and
/// notifications here); raised when what crosses changes so that an older replica cannot
/// read it.
pub const PROTOCOL: i32 = 1;
/// The oldest protocol of another replica this brain still understands.
pub const OLDEST_PROTOCOL: i32 = 1;
/// A replica that said it was alive within this long counts as live.
const ALIVE_WITHIN: Duration = Duration::from_secs(30);

/// Two replicas that could not talk: which one to upgrade.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error(
        "replica {peer} (brain {version}) speaks the replicas' protocol {protocol}, older than this brain still understands ({oldest}): upgrade {peer} before starting this brain beside it"
    )]
    PeerTooOld {
        peer: String,
        version: String,
        protocol: i32,
        oldest: i32,
    },
    #[error(
        "replica {peer} (brain {version}) no longer understands the replicas' protocol {protocol} this brain speaks (it needs {oldest} or later): upgrade this brain to {version} or later"
    )]
    ThisTooOld {
        peer: String,
        version: String,
        protocol: i32,
        oldest: i32,
    },
    #[error("cannot read or write the replicas on the store: {0}")]
    Store(#[from] crate::storage::postgres::Error),
}

/// Whether this brain and `peer` can talk.
fn compatible(peer: &traffic::Peer) -> Result<(), ProtocolError> {
    if peer.protocol < OLDEST_PROTOCOL {
        return Err(ProtocolError::PeerTooOld {
            peer: peer.name.clone(),
            version: peer.version.clone(),
            protocol: peer.protocol,
            oldest: OLDEST_PROTOCOL,
        });
    }
    if PROTOCOL < peer.oldest {
        return Err(ProtocolError::ThisTooOld {
            peer: peer.name.clone(),
            version: peer.version.clone(),
            protocol: PROTOCOL,
            oldest: peer.oldest,
        });
    }
    Ok(())
}

/// Checks that this brain can talk with every live replica on the store, then says it is
/// one of them. Call at start, before anything is served.
pub async fn join(db: &Db) -> Result<(), ProtocolError> {
    for peer in db.peers(ALIVE_WITHIN).await? {
        compatible(&peer)?;
    }
    db.announce(PROTOCOL, OLDEST_PROTOCOL, env!("CARGO_PKG_VERSION"))
        .await?;
    Ok(())
}

/// Says this replica is still alive, and warns (once per replica) of a live one it cannot
/// talk with (started against the advice of its own check, say, by an older brain).
async fn keep_announcing(db: Db, stop: CancellationToken) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned = HashSet::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        if let Err(e) = db
            .announce(PROTOCOL, OLDEST_PROTOCOL, env!("CARGO_PKG_VERSION"))
            .await
        {
            tracing::debug!(error = %e, "cannot say this replica is alive");
        }
        for peer in db.peers(ALIVE_WITHIN).await.unwrap_or_default() {
            if let Err(e) = compatible(&peer)
                && warned.insert(peer.name.clone())
            {
                tracing::error!(error = %e, "a replica this brain cannot talk with is on the store");
            }
        }
    }
}

/// How long a change handed to another replica may take to be answered.
const HANDOFF_TIMEOUT: Duration = Duration::from_secs(30);
/// How often views are checked against the log whatever was heard (a notification is lost
/// while the listener reconnects), and requests looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// How often a replica renews the watches of its watched views, and reads which of its own
/// tasks others watch.
const WATCH_EVERY: Duration = Duration::from_secs(2);
/// How long a watch lasts unless renewed.
const WATCH_TTL: Duration = Duration::from_secs(10);
/// Live output is gathered this long before it is sent as one notification.
const LIVE_BATCH: Duration = Duration::from_millis(50);
/// Requests taken at once.
const TAKE_AT_ONCE: i64 = 32;

/// The engine's `Peers` port over the store.
pub struct Link {
    db: Db,
    notes: broadcast::Sender<Note>,
    /// Workers whose sessions are on another live replica, and which (read each
    /// [`SESSIONS_EVERY`]).
    elsewhere: Arc<std::sync::Mutex<HashMap<String, String>>>,
}

/// How often a replica writes which workers are connected to it and reads where the others
/// are.
const SESSIONS_EVERY: Duration = Duration::from_secs(1);

#[async_trait::async_trait]
impl Peers for Link {
    fn worker_elsewhere(&self, worker: &str) -> Option<String> {
        use shared::locks::Lock;
        self.elsewhere.locked().get(worker).cloned()
    }

    async fn hand_off(&self, task: TaskId, change: &Change) -> Result<Answer, PortError> {
        let id = i64::try_from(task.0).map_err(|_| PortError::Peer(format!("no task {task}")))?;
        let body = serde_json::to_vec(change).expect("changes serialise");
        let failed = |what: &str, e: crate::storage::postgres::Error| {
            PortError::Peer(format!("cannot {what} for task {task} in the store: {e}"))
        };
        // Subscribed first: an answer heard before the wait starts is not missed.
        let mut notes = self.notes.subscribe();
        let request = self
            .db
            .ask(id, &body)
            .await
            .map_err(|e| failed("hand the change to the replica driving it", e))?;
        let deadline = tokio::time::Instant::now() + HANDOFF_TIMEOUT;
        loop {
            if let Some(answer) = self
                .db
                .answer_of(request)
                .await
                .map_err(|e| failed("read the answer", e))?
            {
                let _ = self.db.withdraw(request).await;
                return serde_json::from_slice(&answer).map_err(|e| {
                    PortError::Peer(format!(
                        "the answer about task {task} cannot be read ({e}): are the replicas of one version?"
                    ))
                });
            }
            let heard = async {
                loop {
                    match notes.recv().await {
                        Ok(Note::Heard { channel, payload })
                            if channel == traffic::ANSWERS && payload == request.to_string() =>
                        {
                            return;
                        }
                        Ok(Note::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => return,
                        Ok(_) => {}
                        Err(broadcast::error::RecvError::Closed) => {
                            std::future::pending::<()>().await;
                        }
                    }
                }
            };
            let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
            if wait.is_zero() {
                break;
            }
            // Heard, or a second gone: read the row again either way.
            let _ = tokio::time::timeout(wait.min(Duration::from_secs(1)), heard).await;
        }
        let withdrawn = self.db.withdraw(request).await.unwrap_or(false);
        Err(PortError::Peer(if withdrawn {
            format!(
                "no replica took the change to task {task} within {HANDOFF_TIMEOUT:?} (the replica driving it may be down; it is taken over once its lease lapses): ask again"
            )
        } else {
            format!(
                "the replica driving task {task} took the change but did not answer within {HANDOFF_TIMEOUT:?}; it may still be done: see the task's log"
            )
        }))
    }
}

/// Starts the traffic: listening, views, requests and live output. Call before the tasks
/// are loaded; sets the engine's peers.
pub fn spawn(
    tracker: &TaskTracker,
    root: &CancellationToken,
    engine: &Engine,
    db: &Db,
    hub: &crate::fleet::hub::Hub,
) {
    let notes = traffic::listen(
        db,
        &[
            traffic::LOG,
            traffic::REQUESTS,
            traffic::ANSWERS,
            traffic::LIVE,
        ],
        root.clone(),
    );
    let elsewhere = Arc::default();
    engine.set_peers(Arc::new(Link {
        db: db.clone(),
        notes: notes.clone(),
        elsewhere: Arc::clone(&elsewhere),
    }));
    let (d, h, stop) = (db.clone(), hub.clone(), root.clone());
    tracker.spawn(async move { keep_sessions(d, h, elsewhere, stop).await });
    let (e, d, rx, stop) = (engine.clone(), db.clone(), notes.subscribe(), root.clone());
    tracker.spawn(async move { keep_views(e, d, rx, stop).await });
    let (e, d, rx, stop) = (engine.clone(), db.clone(), notes.subscribe(), root.clone());
    let t = tracker.clone();
    tracker.spawn(async move { answer_requests(e, d, rx, stop, t).await });
    let (e, d, stop) = (engine.clone(), db.clone(), root.clone());
    let t = tracker.clone();
    tracker.spawn(async move { keep_watches(e, d, stop, t).await });
    let (d, stop) = (db.clone(), root.clone());
    tracker.spawn(async move { keep_announcing(d, stop).await });
}

/// Writes which workers are connected here, and reads where the others are, each
/// [`SESSIONS_EVERY`].
async fn keep_sessions(
    db: Db,
    hub: crate::fleet::hub::Hub,
    elsewhere: Arc<std::sync::Mutex<HashMap<String, String>>>,
    stop: CancellationToken,
) {
    use shared::locks::Lock;
    let mut every = tokio::time::interval(SESSIONS_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        if let Err(e) = db.put_sessions(&hub.connected()).await {
            tracing::debug!(error = %e, "cannot write which workers are connected here");
        }
        match db.sessions_elsewhere(ALIVE_WITHIN).await {
            Ok(rows) => *elsewhere.locked() = rows.into_iter().collect(),
            Err(e) => tracing::debug!(error = %e, "cannot read where the workers are connected"),
        }
    }
}

/// Parses `task:seq`.
fn appended(payload: &str) -> Option<(TaskId, u64)> {
    let (t, s) = payload.split_once(':')?;
    Some((TaskId(t.parse().ok()?), s.parse().ok()?))
}

/// Keeps the views up with the log: on each notification of a task that grew, and a full
/// sweep after a reconnect and every [`SWEEP_EVERY`].
async fn keep_views(
    engine: Engine,
    db: Db,
    mut notes: broadcast::Receiver<Note>,
    stop: CancellationToken,
) {
    let store = engine.store().clone();
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let full = tokio::select! {
            _ = stop.cancelled() => return,
            _ = sweep.tick() => true,
            n = notes.recv() => match n {
                Ok(Note::Heard { channel, payload }) if channel == traffic::LOG => {
                    if let Some((task, upto)) = appended(&payload)
                        && let Err(e) = store.show_stored(task, upto).await
                    {
                        tracing::warn!(task = %task, error = %e, "cannot read the records another replica stored");
                    }
                    false
                }
                Ok(Note::Heard { channel, payload }) if channel == traffic::LIVE => {
                    show_live(&engine, &payload);
                    false
                }
                Ok(Note::Heard { .. }) => false,
                Ok(Note::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => true,
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        if full && let Err(e) = sweep_views(&engine, &db).await {
            tracing::warn!(error = %e, "cannot bring the views of other replicas' tasks up to date");
        }
    }
}

/// Brings every task this replica does not drive up to the log's end, in one query for
/// where each log ends.
async fn sweep_views(engine: &Engine, db: &Db) -> Result<(), crate::engine::Error> {
    let store = engine.store();
    let ids: Vec<i64> = store
        .log()
        .tasks()
        .await?
        .into_iter()
        .filter(|t| store.task(*t).is_none())
        .filter_map(|t| i64::try_from(t.0).ok())
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    let ends = db.last_seqs(&ids).await.map_err(|e| {
        crate::engine::Error::Peer(PortError::Peer(format!("cannot read the logs' ends: {e}")))
    })?;
    for (task, upto) in ends {
        let (Ok(task), Ok(upto)) = (u64::try_from(task), u64::try_from(upto)) else {
            continue;
        };
        store.show_stored(TaskId(task), upto).await?;
    }
    Ok(())
}

/// Takes and answers the requests other replicas hand over for the tasks this replica
/// drives: when one is asked, and every [`SWEEP_EVERY`] (one taken by a replica that died
/// is taken again after the grace).
async fn answer_requests(
    engine: Engine,
    db: Db,
    mut notes: broadcast::Receiver<Note>,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pruned = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = sweep.tick() => {}
            n = notes.recv() => match n {
                Ok(Note::Heard { channel, .. }) if channel == traffic::REQUESTS => {}
                Ok(Note::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
        let mine: Vec<i64> = engine
            .store()
            .all()
            .iter()
            .filter_map(|t| i64::try_from(t.id.0).ok())
            .collect();
        let taken = match db.take_requests(&mine, TAKE_AT_ONCE).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "cannot take the changes other replicas handed over");
                continue;
            }
        };
        for r in taken {
            let (engine, db) = (engine.clone(), db.clone());
            tracker.spawn(async move {
                let task = TaskId(u64::try_from(r.task).unwrap_or_default());
                let answer = match serde_json::from_slice::<Change>(&r.body) {
                    Ok(change) => {
                        tracing::info!(task = %task, ?change, "doing a change another replica handed over");
                        engine.answer(task, change).await
                    }
                    Err(e) => Answer::refused(&crate::engine::Error::Invalid(format!(
                        "the change cannot be read ({e}): are the replicas of one version?"
                    ))),
                };
                let body = serde_json::to_vec(&answer).expect("answers serialise");
                if let Err(e) = db.answer(r.id, &body).await {
                    tracing::warn!(task = %task, error = %e, "cannot answer a change another replica handed over");
                }
            });
        }
        if pruned.elapsed() > Duration::from_secs(60) {
            pruned = tokio::time::Instant::now();
            if let Err(e) = db.prune_requests(Duration::from_secs(600)).await {
                tracing::debug!(error = %e, "cannot prune answered requests");
            }
        }
    }
}

/// The live output another replica sent for a task shown here.
#[derive(serde::Serialize, serde::Deserialize)]
struct LiveBatch {
    task: u64,
    items: Vec<LiveItem>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct LiveItem {
    kind: String,
    call_id: u64,
    stream: String,
    text: String,
}

/// The names a live item may carry (the engine's are static).
fn known(name: &str) -> Option<&'static str> {
    [
        "live_output",
        "fs_change",
        "stdout",
        "stderr",
        "changed",
        "removed",
    ]
    .into_iter()
    .find(|k| *k == name)
}

/// Shows a batch of live output to the watchers of a view.
fn show_live(engine: &Engine, payload: &str) {
    let Ok(batch) = serde_json::from_str::<LiveBatch>(payload) else {
        tracing::debug!("a live batch that cannot be read");
        return;
    };
    let task = TaskId(batch.task);
    if engine.store().task(task).is_some() {
        return;
    }
    let Some(view) = engine.store().view(task) else {
        return;
    };
    for i in batch.items {
        if let (Some(kind), Some(stream)) = (known(&i.kind), known(&i.stream)) {
            view.live.send(LiveOutput {
                kind,
                call_id: i.call_id,
                stream,
                text: i.text,
            });
        }
    }
}

/// Says which views have watchers here, and sends the live output of this replica's tasks
/// that other replicas watch (a relay per watched task, stopped when the watch lapses).
async fn keep_watches(engine: Engine, db: Db, stop: CancellationToken, tracker: TaskTracker) {
    let mut every = tokio::time::interval(WATCH_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut relays: HashMap<TaskId, CancellationToken> = HashMap::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let store = engine.store();
        let mine: Vec<i64> = store
            .views()
            .iter()
            .filter(|v| v.events.receiver_count() > 0 && !v.state().status.is_terminal())
            .filter_map(|v| i64::try_from(v.id.0).ok())
            .collect();
        if !mine.is_empty()
            && let Err(e) = db.watch(&mine, WATCH_TTL).await
        {
            tracing::debug!(error = %e, "cannot renew this replica's watches");
        }
        let now: HashSet<TaskId> = match db.watched().await {
            Ok(w) => w
                .into_iter()
                .filter_map(|t| u64::try_from(t).ok().map(TaskId))
                .filter(|t| store.task(*t).is_some())
                .collect(),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read which tasks other replicas watch");
                continue;
            }
        };
        relays.retain(|t, stop| {
            let keep = now.contains(t) && !stop.is_cancelled();
            if !keep {
                stop.cancel();
            }
            keep
        });
        for t in now {
            if relays.contains_key(&t) {
                continue;
            }
            let Some(task) = store.task(t) else { continue };
            tracing::info!(task = %t, "another replica watches task {t}: sending its live output there");
            let relay_stop = stop.child_token();
            relays.insert(t, relay_stop.clone());
            let (db, rx) = (db.clone(), task.live.subscribe());
            tracker.spawn(async move { relay_live(t, rx, db, relay_stop).await });
        }
    }
}

/// Sends `task`'s live output as notifications, gathered for [`LIVE_BATCH`] and cut to the
/// payload's bound, until `stop`.
async fn relay_live(
    task: TaskId,
    mut rx: broadcast::Receiver<LiveOutput>,
    db: Db,
    stop: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => return,
            o = rx.recv() => match o {
                Ok(o) => o,
                // Live output is lossy by contract: what a slow relay missed is gone.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        tokio::time::sleep(LIVE_BATCH).await;
        let mut items = vec![first];
        while let Ok(o) = rx.try_recv() {
            items.push(o);
        }
        for payload in batches(task, items) {
            if let Err(e) = db.notify(traffic::LIVE, &payload).await {
                tracing::debug!(task = %task, error = %e, "cannot send live output to the replicas watching");
            }
        }
    }
}

/// `items` as notification payloads each within [`traffic::PAYLOAD_MAX`] (a longer text is
/// cut: live output is a view, the log keeps the whole).
fn batches(task: TaskId, items: Vec<LiveOutput>) -> Vec<String> {
    const ROOM: usize = traffic::PAYLOAD_MAX - 200;
    let mut out = Vec::new();
    let mut batch = LiveBatch {
        task: task.0,
        items: Vec::new(),
    };
    let mut size = 0;
    for o in items {
        let mut text = o.text;
        // Measured as JSON writes it (an escape may take six bytes for one).
        let escaped = |t: &str| serde_json::to_string(t).map_or(usize::MAX, |j| j.len());
        while escaped(&text) > ROOM / 2 {
            let mut cut = text.len() / 2;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        let cost = escaped(&text) + 64;
        if size + cost > ROOM && !batch.items.is_empty() {
            out.push(serde_json::to_string(&batch).expect("batches serialise"));
            batch.items.clear();
            size = 0;
        }
        size += cost;
        batch.items.push(LiveItem {
            kind: o.kind.to_string(),
            call_id: o.call_id,
            stream: o.stream.to_string(),
            text,
        });
    }
    if !batch.items.is_empty() {
        out.push(serde_json::to_string(&batch).expect("batches serialise"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_that_cannot_talk_with_another_says_which_to_upgrade() {
        let peer = |protocol, oldest| traffic::Peer {
            name: "b".into(),
            version: "9.9.9".into(),
            protocol,
            oldest,
        };
        assert!(compatible(&peer(PROTOCOL, OLDEST_PROTOCOL)).is_ok());
        let e = compatible(&peer(OLDEST_PROTOCOL - 1, 0)).unwrap_err();
        assert!(e.to_string().contains("upgrade b before"), "{e}");
        let e = compatible(&peer(PROTOCOL + 1, PROTOCOL + 1)).unwrap_err();
        assert!(e.to_string().contains("upgrade this brain to 9.9.9"), "{e}");
    }

    #[test]
    fn live_output_goes_in_payloads_postgres_takes() {
        let item = |text: String| LiveOutput {
            kind: "live_output",
            call_id: 5,
            stream: "stdout",
            text,
        };
        let items = vec![
            item("a".repeat(100)),
            item("\u{1}".repeat(20_000)),
            item("é".repeat(9_000)),
            item("x".repeat(3_000)),
            item("y".repeat(3_000)),
            item("z".repeat(10)),
        ];
        let out = batches(TaskId(3), items);
        assert!(out.len() >= 2, "{}", out.len());
        let mut texts = Vec::new();
        for p in &out {
            assert!(p.len() <= traffic::PAYLOAD_MAX, "{}", p.len());
            let b: LiveBatch = serde_json::from_str(p).unwrap();
            assert_eq!(b.task, 3);
            texts.extend(b.items.into_iter().map(|i| i.text));
        }
        assert_eq!(texts.len(), 6, "every item goes, cut where it must be");
        assert_eq!(texts.first().map(String::len), Some(100));
        assert!(texts.iter().all(|t| !t.is_empty()));
        assert_eq!(texts.last().map(String::as_str), Some("zzzzzzzzzz"));
        assert_eq!(appended("12:40"), Some((TaskId(12), 40)));
        assert_eq!(appended("x:1"), None);
    }
}
