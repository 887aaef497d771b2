//! Live worker sessions by worker id, and the brain-side API for acting on a worker.
//!
//! Callers (the admin API, the engine's `Workers` port) use [`Hub::exec`], [`Hub::file`],
//! [`Hub::echo`], [`Hub::durable_exec`] and [`Hub::sync`]; they never see the stream
//! underneath. Every call gets an id, many run at once on one session, and a call whose
//! session ends is answered as `worker lost` rather than left hanging.

use shared::locks::Lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::{FileCall, FileResponse, brain_message};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::board::{Board, Member};
use super::session::{CallGuard, EXEC_EVENT_QUEUE, EXEC_GRACE, OUTBOUND_QUEUE, Pending};
pub use super::session::{Error, ExecCall, Session, SessionStream};
use crate::model::ids::CallIds;

/// What to run.
#[derive(Debug, Clone)]
pub struct ExecSpec {
    pub workspace: String,
    pub argv: Vec<String>,
    pub cwd: String,
    pub timeout: Duration,
    pub output_cap_bytes: u64,
    pub limits: proto::Limits,
}

/// Live sessions by worker id. Cheap to clone.
#[derive(Clone)]
pub struct Hub {
    sessions: Arc<Mutex<HashMap<String, Arc<Session>>>>,
    /// Every call id this brain hands out (shared with the task store).
    call_ids: CallIds,
    next_session: Arc<AtomicU64>,
    /// Woken whenever a session registers, for callers waiting for a worker to come back.
    registered: Arc<tokio::sync::Notify>,
    /// Durable calls awaiting their result, by call id, with the worker they were issued to.
    durable: Arc<Mutex<HashMap<u64, DurableWaiter>>>,
    /// Durable results nobody was waiting for yet (a worker replays them on reconnect,
    /// possibly before the task that wants them has resumed). Bounded.
    stash: Arc<Mutex<HashMap<u64, (String, proto::CallResult)>>>,
    /// Told about stashed results, so the engine can acknowledge ones it already has.
    orphans: mpsc::Sender<(String, u64)>,
    /// Where the live output of durable calls goes (a task's watchers), by call id.
    live: Arc<Mutex<HashMap<u64, LiveSink>>>,
    /// Sync requests awaiting their report, by id.
    syncs: SyncWaiters,
    /// Where live file changes go (the engine), with the worker they came from. Best effort:
    /// a full queue drops hints, never blocks the session.
    fs: mpsc::Sender<(String, proto::FsChanged)>,
    /// The connected workers and their load, for placement.
    board: Board,
}

/// What the hub hears that belongs to someone else: read these, or they are dropped.
pub struct HubEvents {
    /// Live file changes: (worker, changes).
    pub fs: mpsc::Receiver<(String, proto::FsChanged)>,
    /// Durable results that arrived with nobody waiting: (worker, call id).
    pub orphans: mpsc::Receiver<(String, u64)>,
}

/// File-change hints queued for the engine before new ones are dropped.
const FS_QUEUE: usize = 1024;

/// What a sync request asked of which worker; the Sync service checks uploads against it.
#[derive(Debug, Clone)]
pub struct SyncPending {
    pub worker: String,
    pub workspace: String,
    /// Barriers: the root the delta must apply to ("" for none).
    pub base: String,
    /// Materialisations: the root to send.
    pub materialise: String,
    pub include_git: bool,
}

/// Sync requests awaiting their report, by id.
type SyncWaiters = Arc<Mutex<HashMap<u64, (SyncPending, oneshot::Sender<proto::SyncReport>)>>>;

/// Removes a sync waiter when the wait ends, however it ends.
struct SyncGuard(SyncWaiters, u64);

impl Drop for SyncGuard {
    fn drop(&mut self) {
        self.0.locked().remove(&self.1);
    }
}

/// Receives the live output chunks of a durable call.
pub type LiveSink = Arc<dyn Fn(proto::ExecOutput) + Send + Sync>;

/// The worker a durable call was issued to, and where its result goes.
type DurableWaiter = (String, oneshot::Sender<proto::CallResult>);

/// Removes a durable waiter when the wait ends, however it ends.
struct WaiterGuard(Arc<Mutex<HashMap<u64, DurableWaiter>>>, u64);

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        self.0.locked().remove(&self.1);
    }
}

/// Most stashed durable results kept.
const STASH_MAX: usize = 10_000;

/// How a durable call ended.
#[derive(Debug)]
pub enum Durable {
    Done(proto::CallResult),
    /// The worker did not come back within the wait.
    WorkerGone,
}

impl Hub {
    /// A hub whose calls take ids from `call_ids`, and the receivers of what it hears for
    /// others.
    pub fn new(call_ids: CallIds) -> (Self, HubEvents) {
        Self::with_board(call_ids, Board::new(Default::default()))
    }

    /// A hub whose sessions are placement's members on `board`.
    pub fn with_board(call_ids: CallIds, board: Board) -> (Self, HubEvents) {
        let (fs, fs_rx) = mpsc::channel(FS_QUEUE);
        let (orphans, orphans_rx) = mpsc::channel(STASH_MAX);
        let hub = Self {
            sessions: Arc::default(),
            call_ids,
            next_session: Arc::default(),
            registered: Arc::default(),
            durable: Arc::default(),
            stash: Arc::default(),
            orphans,
            live: Arc::default(),
            syncs: Arc::default(),
            fs,
            board,
        };
        (
            hub,
            HubEvents {
                fs: fs_rx,
                orphans: orphans_rx,
            },
        )
    }

    /// A call id never used before by this brain.
    pub fn new_call_id(&self) -> u64 {
        self.call_ids.next()
    }

    /// A durable result arrived from `worker`. Delivered to its waiter if the call was issued
    /// to that worker; a result from any other worker is stale and refused.
    pub fn deliver_result(&self, worker: &str, r: proto::CallResult) {
        let call_id = r.call_id;
        let mut waiters = self.durable.locked();
        if let Some((w, _)) = waiters.get(&call_id) {
            if w != worker {
                tracing::warn!(call_id, from = worker, issued_to = %w, "stale result refused: the call belongs to another worker");
                return;
            }
            if let Some((_, tx)) = waiters.remove(&call_id) {
                let _ = tx.send(r);
            }
            return;
        }
        drop(waiters);
        let mut stash = self.stash.locked();
        if stash.len() >= STASH_MAX
            && let Some(oldest) = stash.keys().min().copied()
        {
            stash.remove(&oldest);
        }
        stash.insert(call_id, (worker.to_string(), r));
        drop(stash);
        let _ = self.orphans.try_send((worker.to_string(), call_id));
    }

    /// Sends the live output of durable call `call_id` to `sink` until [`Hub::unwatch`].
    pub fn watch(&self, call_id: u64, sink: LiveSink) {
        self.live.locked().insert(call_id, sink);
    }

    pub fn unwatch(&self, call_id: u64) {
        self.live.locked().remove(&call_id);
    }

    /// Live output nobody's exec call wanted: a durable call's, for its watchers.
    pub fn deliver_live(&self, out: proto::ExecOutput) {
        let sink = self.live.locked().get(&out.call_id).cloned();
        if let Some(sink) = sink {
            sink(out);
        }
    }

    /// Tells the worker it may forget a durable call (its result is in the log).
    pub fn ack(&self, worker: &str, call_id: u64) {
        self.stash.locked().remove(&call_id);
        if let Some(s) = self.session(worker) {
            s.try_send(brain_message::Msg::Ack(proto::Ack { call_id }));
        }
    }

    /// Runs a durable call on `worker` and waits for its result, through reconnects: the call
    /// is (re)sent on every session until a result arrives; the worker's journal makes that
    /// safe (a call id runs at most once; a repeat gets the recorded result). Gives up only
    /// if the worker stays away for `worker_wait`.
    pub async fn durable_exec(
        &self,
        worker: &str,
        mut start: proto::ExecStart,
        worker_wait: Duration,
    ) -> Durable {
        start.durable = true;
        let call_id = start.call_id;
        loop {
            if let Some((w, r)) = self.stash.locked().remove(&call_id) {
                if w == worker {
                    return Durable::Done(r);
                }
                tracing::warn!(call_id, from = %w, issued_to = worker, "stale result refused: the call belongs to another worker");
            }
            let Some(session) = self.wait_connected(worker, worker_wait).await else {
                return Durable::WorkerGone;
            };
            let (tx, rx) = oneshot::channel();
            self.durable
                .locked()
                .insert(call_id, (worker.to_string(), tx));
            // If this future is dropped (the task was cancelled), a late result is stashed
            // rather than sent to nobody.
            let _waiter = WaiterGuard(self.durable.clone(), call_id);
            // A result may have been stashed between the check above and registering.
            if let Some((w, r)) = self.stash.locked().remove(&call_id)
                && w == worker
            {
                self.durable.locked().remove(&call_id);
                return Durable::Done(r);
            }
            if session
                .send(brain_message::Msg::Exec(start.clone()))
                .await
                .is_ok()
            {
                tokio::select! {
                    r = rx => if let Ok(r) = r { return Durable::Done(r) },
                    _ = session.closed.cancelled() => {}
                }
            }
            self.durable.locked().remove(&call_id);
            // The session ended: wait for the worker to come back and ask again.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Resolves when the next session registers (made before a look at the sessions, it
    /// misses none registered after the look).
    pub fn registered(&self) -> tokio::sync::futures::Notified<'_> {
        self.registered.notified()
    }

    /// The worker's session, waiting up to `wait` for it to (re)connect.
    pub async fn wait_connected(&self, worker: &str, wait: Duration) -> Option<Arc<Session>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.registered.notified();
            if let Some(s) = self.session(worker)
                && !s.closed.is_cancelled()
            {
                return Some(s);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.sessions.locked()
    }

    /// Registers a new session for a worker, closing any older one it replaces.
    pub fn register(&self, worker_id: &str) -> (Arc<Session>, SessionStream) {
        let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
        let session = Arc::new(Session {
            worker_id: worker_id.to_string(),
            session_no: self.next_session.fetch_add(1, Ordering::Relaxed),
            tx,
            pending: Mutex::new(HashMap::new()),
            closed: CancellationToken::new(),
            final_status: Mutex::new(None),
            last_seen_ms: std::sync::atomic::AtomicI64::new(shared::now_unix_ms()),
            last_pulse_ms: std::sync::atomic::AtomicI64::new(0),
        });
        let old = self.lock().insert(worker_id.to_string(), session.clone());
        if let Some(old) = old {
            old.close(Status::aborted(
                "replaced by a newer session of the same worker",
            ));
        }
        let stream = SessionStream {
            rx,
            closed: Box::pin(session.closed.clone().cancelled_owned()),
            session: session.clone(),
            done: false,
        };
        self.registered.notify_waiters();
        (session, stream)
    }

    /// Removes a session if it is still the current one for its worker.
    pub fn unregister(&self, session: &Session) {
        let mut map = self.lock();
        if map
            .get(&session.worker_id)
            .is_some_and(|s| s.session_no == session.session_no)
        {
            map.remove(&session.worker_id);
        }
        drop(map);
        self.board.leave(&session.worker_id, session.session_no);
    }

    /// What placement knows of the connected workers.
    pub fn board(&self) -> &Board {
        &self.board
    }

    /// Makes a registered session's worker a member placement may choose.
    pub fn join(&self, session: &Session, member: Member) {
        // Under the sessions lock, so an unregister cannot slip between the check and the
        // join and leave a member behind with no session.
        let map = self.lock();
        if map
            .get(&session.worker_id)
            .is_some_and(|s| s.session_no == session.session_no)
        {
            self.board.join(Member {
                session_no: session.session_no,
                ..member
            });
        }
    }

    pub fn session(&self, worker_id: &str) -> Option<Arc<Session>> {
        self.lock().get(worker_id).cloned()
    }

    /// The workers connected now.
    pub fn connected(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    pub fn is_connected(&self, worker_id: &str) -> bool {
        self.lock().contains_key(worker_id)
    }

    /// Closes a worker's session, if any, with the given status. Returns whether one was open.
    pub fn disconnect(&self, worker_id: &str, status: Status) -> bool {
        let removed = self.lock().remove(worker_id);
        match removed {
            Some(s) => {
                self.board.leave(worker_id, s.session_no);
                s.close(status);
                true
            }
            None => false,
        }
    }

    /// Closes every session (brain shutdown).
    pub fn close_all(&self) {
        for (_, s) in self.lock().drain() {
            s.close(Status::unavailable("brain shutting down"));
        }
    }

    fn start(&self, worker_id: &str, pending: Pending) -> Result<(Arc<Session>, u64), Error> {
        let session = self
            .session(worker_id)
            .ok_or_else(|| Error::NotConnected(worker_id.to_string()))?;
        let call_id = self.call_ids.next();
        session.lock_pending().insert(call_id, pending);
        Ok((session, call_id))
    }

    /// Starts a command on a worker. Output and the exit arrive on the returned call.
    pub async fn exec(&self, worker_id: &str, spec: ExecSpec) -> Result<ExecCall, Error> {
        let (tx, rx) = mpsc::channel(EXEC_EVENT_QUEUE);
        let overflow = Arc::new(AtomicBool::new(false));
        let (session, call_id) = self.start(worker_id, Pending::Exec(tx, overflow.clone()))?;
        let guard = CallGuard {
            session: session.clone(),
            call_id,
        };
        let deadline = tokio::time::Instant::now() + spec.timeout + EXEC_GRACE;
        session
            .send(brain_message::Msg::Exec(proto::ExecStart {
                call_id,
                workspace: spec.workspace,
                argv: spec.argv,
                cwd: spec.cwd,
                timeout_ms: spec.timeout.as_millis() as u64,
                output_cap_bytes: spec.output_cap_bytes,
                durable: false,
                limits: Some(spec.limits),
                ..Default::default()
            }))
            .await?;
        Ok(ExecCall {
            call_id,
            rx,
            overflow,
            deadline,
            finished: false,
            _guard: guard,
        })
    }

    /// Runs one file operation on a worker and waits for its answer.
    pub async fn file(
        &self,
        worker_id: &str,
        mut call: FileCall,
        timeout: Duration,
    ) -> Result<FileResponse, Error> {
        let (tx, rx) = oneshot::channel();
        let (session, call_id) = self.start(worker_id, Pending::File(tx))?;
        let _guard = CallGuard {
            session: session.clone(),
            call_id,
        };
        call.call_id = call_id;
        session.send(brain_message::Msg::File(call)).await?;
        wait(worker_id, rx, timeout).await
    }

    /// Sends bytes to a worker and waits for them to come back: a session round trip with no
    /// process involved.
    pub async fn echo(
        &self,
        worker_id: &str,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, Error> {
        let (tx, rx) = oneshot::channel();
        let (session, call_id) = self.start(worker_id, Pending::Echo(tx))?;
        let _guard = CallGuard {
            session: session.clone(),
            call_id,
        };
        session
            .send(brain_message::Msg::Echo(proto::Echo { call_id, payload }))
            .await?;
        wait(worker_id, rx, timeout).await
    }
}

impl Hub {
    /// Asks a worker for a barrier (`base` is the root the brain holds) or a
    /// materialisation, and waits for its report.
    pub async fn sync(
        &self,
        worker_id: &str,
        workspace: &str,
        op: proto::sync_request::Op,
        rules: &crate::model::event::SyncRules,
        full_scan: bool,
        timeout: Duration,
    ) -> Result<proto::SyncReport, Error> {
        let session = self
            .session(worker_id)
            .ok_or_else(|| Error::NotConnected(worker_id.to_string()))?;
        let id = self.new_call_id();
        let (base, materialise) = match &op {
            proto::sync_request::Op::BarrierBase(b) => (b.clone(), String::new()),
            proto::sync_request::Op::MaterialiseRoot(r) => (String::new(), r.clone()),
            proto::sync_request::Op::ImportDir(_) => (String::new(), String::new()),
        };
        let (tx, rx) = oneshot::channel();
        self.syncs.locked().insert(
            id,
            (
                SyncPending {
                    worker: worker_id.to_string(),
                    workspace: workspace.to_string(),
                    base,
                    materialise,
                    include_git: rules.include_git,
                },
                tx,
            ),
        );
        let _guard = SyncGuard(self.syncs.clone(), id);
        session
            .send(brain_message::Msg::Sync({
                let mut r = proto::SyncRequest {
                    id,
                    workspace: workspace.to_string(),
                    op: Some(op),
                    full_scan,
                    ..Default::default()
                };
                r.include_git = rules.include_git;
                r.extra_excludes = rules.extra_excludes.clone();
                r.no_default_excludes = rules.no_default_excludes;
                r
            }))
            .await?;
        // The report comes over another RPC: stop waiting when the session ends.
        let waiting = wait(worker_id, rx, timeout);
        tokio::pin!(waiting);
        loop {
            tokio::select! {
                r = &mut waiting => return r,
                _ = tokio::time::sleep(Duration::from_millis(250)) => {
                    let same = self.session(worker_id).is_some_and(|s| Arc::ptr_eq(&s, &session));
                    if !same {
                        return Err(Error::Lost(worker_id.to_string()));
                    }
                }
            }
        }
    }

    /// The sync request `id`, if `worker` was asked for it and it is still awaited.
    pub fn sync_pending(&self, id: u64, worker: &str) -> Option<SyncPending> {
        self.syncs
            .locked()
            .get(&id)
            .filter(|(p, _)| p.worker == worker)
            .map(|(p, _)| p.clone())
    }

    /// Live file changes from a worker, passed on to the engine (dropped if it lags).
    pub fn deliver_fs(&self, worker: &str, changes: proto::FsChanged) {
        let _ = self.fs.try_send((worker.to_string(), changes));
    }

    /// A worker's report of a sync request.
    pub fn deliver_sync(&self, worker: &str, report: proto::SyncReport) {
        let mut syncs = self.syncs.locked();
        if syncs
            .get(&report.id)
            .is_some_and(|(p, _)| p.worker == worker)
            && let Some((_, tx)) = syncs.remove(&report.id)
        {
            let _ = tx.send(report);
        }
    }
}

async fn wait<T>(worker: &str, rx: oneshot::Receiver<T>, timeout: Duration) -> Result<T, Error> {
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(_)) => Err(Error::Lost(worker.to_string())),
        Err(_) => Err(Error::Timeout {
            worker: worker.to_string(),
            timeout,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_durable_result_from_another_worker_is_refused() {
        let (hub, _events) = Hub::new(CallIds::starting_above(0, 1));
        let (_session, _stream) = hub.register("w-1");
        let call_id = hub.new_call_id();
        let start = proto::ExecStart {
            call_id,
            argv: vec!["true".into()],
            ..Default::default()
        };
        let h = hub.clone();
        let mut call =
            tokio::spawn(async move { h.durable_exec("w-1", start, Duration::from_secs(5)).await });
        // Wait until the call waits for its result.
        while !hub.durable.locked().contains_key(&call_id) {
            tokio::task::yield_now().await;
        }
        let result = |out: &[u8]| proto::CallResult {
            call_id,
            stdout: out.to_vec(),
            ..Default::default()
        };
        hub.deliver_result("w-2", result(b"stale"));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), &mut call)
                .await
                .is_err(),
            "a result from the wrong worker must not complete the call"
        );
        hub.deliver_result("w-1", result(b"fresh"));
        match call.await.unwrap() {
            Durable::Done(r) => assert_eq!(r.stdout, b"fresh"),
            other => panic!("{other:?}"),
        }
    }
}
