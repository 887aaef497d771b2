//! The task store: every task's state in memory (a cache of its log), and the only writer of
//! task events. An append is durable first, then applied, then shown to watchers; a snapshot
//! is stored every `snapshot_every` events. Call ids are minted here, by the store that logs
//! them, so a call id in the log is one this brain handed out.

use shared::locks::Lock;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::error::Error;
use super::log::EventLog;
use crate::model::event::{Event, Outcome, Purpose, Record, TaskId, ToolCall};
use crate::model::ids::CallIds;
use crate::model::state::{TaskState, apply};

/// Live events of one task for watchers. Bounded: a watcher that falls behind is told it
/// lagged and re-reads the log.
const WATCH_QUEUE: usize = 1024;
/// Call ids minted by this process that a task remembers (for "was this call issued before
/// the brain restarted?"); older ones count as not minted here.
const MINTED_KEPT: usize = 64;

/// What watchers see that is not in the log: a running call's output, and file changes the
/// worker's watcher saw. A watcher that falls behind may miss some.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveOutput {
    /// `live_output` or `fs_change`.
    pub kind: &'static str,
    pub call_id: u64,
    /// `stdout`/`stderr`, or `changed`/`removed`.
    pub stream: &'static str,
    pub text: String,
}

/// A record as its watchers get it: shared by all of them, its JSON made once, by the first
/// that needs it (a thousand watchers of one task cost one serialisation per record).
#[derive(Debug)]
pub struct Shown {
    pub record: Record,
    json: std::sync::OnceLock<String>,
}

impl Shown {
    pub fn new(record: Record) -> Arc<Self> {
        Arc::new(Self {
            record,
            json: std::sync::OnceLock::new(),
        })
    }

    /// The record's JSON as `show` writes it (the wire's form, which the API layer knows),
    /// made once for all its watchers.
    pub fn json_with(&self, show: impl FnOnce(&Record) -> String) -> &str {
        self.json.get_or_init(|| show(&self.record))
    }
}

impl std::ops::Deref for Shown {
    type Target = Record;
    fn deref(&self) -> &Record {
        &self.record
    }
}

/// A task's broadcast to its watchers, made on the first watcher: a task nobody watches
/// (most of thousands) holds no ring of its own. Cheap to clone; clones share the channel.
pub struct Broadcast<T>(Arc<std::sync::OnceLock<broadcast::Sender<T>>>);

impl<T> Clone for Broadcast<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T: Clone> Broadcast<T> {
    fn new() -> Self {
        Self(Arc::default())
    }

    /// Sends to the watchers, if there are any (nothing is kept for later ones).
    pub fn send(&self, v: T) {
        if let Some(tx) = self.0.get() {
            let _ = tx.send(v);
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<T> {
        self.0
            .get_or_init(|| broadcast::channel(WATCH_QUEUE).0)
            .subscribe()
    }

    pub fn receiver_count(&self) -> usize {
        self.0.get().map_or(0, |tx| tx.receiver_count())
    }
}

/// Most directories a task remembers having looked in for instructions for agents.
const MAX_LOOKED: usize = 4096;

/// One task in memory.
pub struct Task {
    pub id: TaskId,
    /// The state as of the last appended record. A std mutex: never held across an await.
    state: Mutex<TaskState>,
    /// Every appended record, for watchers.
    pub events: Broadcast<Arc<Shown>>,
    /// Output of the running call as it is produced, and file-change hints.
    pub live: Broadcast<LiveOutput>,
    /// Cancelled when a person cancels the task; the driver logs the end.
    pub cancel: CancellationToken,
    /// Why, when the brain itself stopped the task (a parent whose other attempt won).
    cancel_reason: Mutex<Option<String>>,
    /// Woken when a person decides an approval the task waits for, or asks for a move.
    pub wake: tokio::sync::Notify,
    /// Held by a person's command (decide, resume, move) from its check to its append, so
    /// two at once cannot both pass the check (and, say, start two drivers).
    pub(crate) control: tokio::sync::Mutex<()>,
    /// Held while the task's result is delivered: one delivery at a time.
    pub(crate) delivering: tokio::sync::Mutex<()>,
    /// A move a person asked for (or failover chose), taken at the next tool-call boundary.
    move_request: Mutex<Option<String>>,
    /// Call ids this process minted for the task, newest last (bounded).
    minted: Mutex<VecDeque<u64>>,
    /// Directories of the workspace looked in for instructions for agents (bounded).
    looked_for_instructions: Mutex<std::collections::HashSet<String>>,
    /// One appender at a time per task, so state and log stay in the same order.
    append_lock: tokio::sync::Mutex<()>,
    /// The running driver's stop: cancelled when this brain lets the task go (its lease
    /// moved), and when another driver starts, so one process never drives a task twice at
    /// once (the database fences other replicas, not two drivers of one).
    driving: Mutex<CancellationToken>,
}

impl Task {
    pub fn state(&self) -> TaskState {
        self.state.locked().clone()
    }

    /// Whether the task's agent runs with `assist` (a plan, or a task from before assists
    /// could be switched, counts as on), read without copying the state.
    pub fn assisted(&self, assist: crate::model::agent::Assist) -> bool {
        self.state
            .locked()
            .agent
            .as_ref()
            .is_none_or(|a| a.spec.assisted(assist))
    }

    /// Stops the task for `why` (the first reason given stands).
    pub(crate) fn cancel_for(&self, why: &str) {
        self.cancel_reason
            .locked()
            .get_or_insert_with(|| why.to_string());
        self.cancel.cancel();
    }

    /// Why the task was cancelled, when it was.
    pub(crate) fn cancelled_why(&self) -> Option<String> {
        self.cancel.is_cancelled().then(|| {
            self.cancel_reason
                .locked()
                .clone()
                .unwrap_or_else(|| "cancelled by an admin".to_string())
        })
    }

    /// Asks for a move to `to` at the next boundary (replacing any earlier request).
    pub(crate) fn set_move_request(&self, to: &str) {
        *self.move_request.locked() = Some(to.to_string());
        self.wake.notify_one();
    }

    pub(crate) fn move_request(&self) -> Option<String> {
        self.move_request.locked().clone()
    }

    /// Takes the move request if it asks for `to`.
    pub(crate) fn take_move_request(&self, to: &str) {
        let mut r = self.move_request.locked();
        if r.as_deref() == Some(to) {
            *r = None;
        }
    }

    /// A stop for a new driver of the task; any driver still running is stopped.
    pub(crate) fn new_driver(&self) -> CancellationToken {
        let fresh = CancellationToken::new();
        std::mem::replace(&mut *self.driving.locked(), fresh.clone()).cancel();
        fresh
    }

    /// Stops the task's driver, if one runs.
    fn stop_driver(&self) {
        self.driving.locked().cancel();
    }

    /// Whether `dir` of the workspace is to be looked in for instructions for agents: the
    /// first time it is asked in this process. At most [`MAX_LOOKED`] are remembered.
    pub(crate) fn first_look_for_instructions(&self, dir: &str) -> bool {
        let mut seen = self.looked_for_instructions.locked();
        if seen.len() >= MAX_LOOKED {
            seen.clear();
        }
        seen.insert(dir.to_string())
    }

    /// Whether this process minted `call_id` (it was issued since the brain started).
    pub fn minted_here(&self, call_id: u64) -> bool {
        self.minted.locked().contains(&call_id)
    }
}

/// The store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    log: Arc<dyn EventLog>,
    tasks: Arc<Mutex<HashMap<TaskId, Arc<Task>>>>,
    /// On a shared log: tasks another brain drives, shown here (to watchers, lists and
    /// reads) from the records it stores. Never driven or appended to here; a view becomes
    /// one of `tasks` (the same `Arc`, so its watchers go on) when this brain takes it over,
    /// and a task this brain loses becomes a view.
    views: Arc<Mutex<HashMap<TaskId, Arc<Task>>>>,
    snapshot_every: u64,
    call_ids: CallIds,
    /// The id of every task something was appended to, for lists that follow all tasks.
    /// Bounded: a listener that falls behind is told it lagged and reads the list again.
    changes: broadcast::Sender<TaskId>,
}

impl Store {
    pub fn new(log: Arc<dyn EventLog>, snapshot_every: u64, call_ids: CallIds) -> Self {
        Self {
            log,
            tasks: Arc::default(),
            views: Arc::default(),
            snapshot_every: snapshot_every.max(1),
            call_ids,
            changes: broadcast::channel(WATCH_QUEUE).0,
        }
    }

    /// Ids of tasks as records are appended to them (one per append).
    pub fn changes(&self) -> broadcast::Receiver<TaskId> {
        self.changes.subscribe()
    }

    pub fn log(&self) -> &Arc<dyn EventLog> {
        &self.log
    }

    pub fn task(&self, id: TaskId) -> Option<Arc<Task>> {
        self.tasks.locked().get(&id).cloned()
    }

    /// Finds a task by `t-N` or `N`: one of this brain's, or a view of one another brain
    /// drives.
    pub fn find(&self, text: &str) -> Result<Arc<Task>, Error> {
        let id: TaskId = text
            .parse()
            .map_err(|_| Error::NoSuchTask(text.to_string()))?;
        self.task(id)
            .or_else(|| self.view(id))
            .ok_or_else(|| Error::NoSuchTask(text.to_string()))
    }

    pub(crate) fn all(&self) -> Vec<Arc<Task>> {
        self.tasks.locked().values().cloned().collect()
    }

    /// Every task's state, this brain's and the views', oldest first.
    pub fn list(&self) -> Vec<TaskState> {
        let mut v: Vec<TaskState> = self.all().iter().map(|t| t.state()).collect();
        let held: HashSet<TaskId> = v.iter().map(|s| s.id).collect();
        v.extend(
            self.views()
                .iter()
                .filter(|t| !held.contains(&t.id))
                .map(|t| t.state()),
        );
        v.sort_by_key(|s| s.id);
        v
    }

    /// The view of task `id`, if another brain drives it.
    pub fn view(&self, id: TaskId) -> Option<Arc<Task>> {
        self.views.locked().get(&id).cloned()
    }

    /// Whether `id` is shown here but driven by another brain.
    pub fn is_view(&self, id: TaskId) -> bool {
        !self.tasks.locked().contains_key(&id) && self.views.locked().contains_key(&id)
    }

    /// Every view.
    pub fn views(&self) -> Vec<Arc<Task>> {
        self.views.locked().values().cloned().collect()
    }

    /// Brings the view of `id` up to `upto` (its last stored record) from the log, showing
    /// each new record to its watchers; a task not known here is loaded as a view. Tasks
    /// this brain holds are left alone (their records are appended here).
    pub async fn show_stored(&self, id: TaskId, upto: u64) -> Result<(), Error> {
        if self.task(id).is_some() {
            return Ok(());
        }
        let Some(view) = self.view(id) else {
            let (state, broken) = self.load(id).await?;
            if let Some(reason) = broken {
                tracing::warn!(task = %id, %reason, "a record of a task another brain drives cannot be read");
            }
            if self.task(id).is_none() {
                let view = self.detached(state);
                self.views.locked().entry(id).or_insert(view);
                let _ = self.changes.send(id);
            }
            return Ok(());
        };
        if view.state().last_seq >= upto {
            return Ok(());
        }
        self.catch_up(&view).await
    }

    /// Applies and shows the records of `task` stored after its state's.
    async fn catch_up(&self, task: &Task) -> Result<(), Error> {
        let _g = task.append_lock.lock().await;
        let after = task.state().last_seq;
        let mut shown = Vec::new();
        for r in self.log.read(task.id, after).await? {
            let Ok(r) = r else { break };
            apply(&mut task.state.locked(), &r);
            shown.push(r);
        }
        if shown.is_empty() {
            return Ok(());
        }
        for r in shown {
            task.events.send(Shown::new(r));
        }
        let _ = self.changes.send(task.id);
        Ok(())
    }

    /// Appends events to a task: durable first, then applied and shown to watchers.
    pub async fn append(&self, task: &Task, events: Vec<Event>) -> Result<(), Error> {
        let _g = task.append_lock.lock().await;
        let recs = self.log.append(task.id, events).await?;
        let (snapshot_due, parent) = {
            let mut st = task.state.locked();
            for r in &recs {
                apply(&mut st, r);
            }
            // `Finished` stays a task's last record; an ended task's replay is bounded by
            // `snapshot_every` anyway.
            (
                !st.status.is_terminal() && st.last_seq - st.snapshot_seq >= self.snapshot_every,
                st.attempt_of.map(|a| a.parent),
            )
        };
        for r in recs {
            task.events.send(Shown::new(r));
        }
        let _ = self.changes.send(task.id);
        // An attempt's parent decides on what its attempts do.
        if let Some(p) = parent.and_then(|p| self.task(p)) {
            p.wake.notify_one();
        }
        if snapshot_due {
            let (upto, bytes) = {
                let st = task.state.locked();
                (
                    st.last_seq,
                    serde_json::to_vec(&*st).expect("state serialises"),
                )
            };
            self.log.put_snapshot(task.id, upto, bytes).await?;
            let recs = self
                .log
                .append(task.id, vec![Event::Snapshot { upto }])
                .await?;
            {
                let mut st = task.state.locked();
                for r in &recs {
                    apply(&mut st, r);
                }
            }
            // Watchers see the marker too: what they are shown is the log, record for record.
            for r in recs {
                task.events.send(Shown::new(r));
            }
        }
        Ok(())
    }

    /// Mints a call id and logs the call as issued (durable) before anyone sends it.
    pub async fn issue(
        &self,
        task: &Task,
        worker: &str,
        step: u32,
        purpose: Purpose,
        call: ToolCall,
    ) -> Result<u64, Error> {
        let call_id = self.call_ids.next();
        {
            let mut m = task.minted.locked();
            m.push_back(call_id);
            while m.len() > MINTED_KEPT {
                m.pop_front();
            }
        }
        self.append(
            task,
            vec![Event::ToolCallIssued {
                call_id,
                step,
                purpose,
                worker: worker.to_string(),
                call,
            }],
        )
        .await?;
        Ok(call_id)
    }

    /// Logs a new task's first records and keeps it in memory.
    pub async fn create(
        &self,
        events: impl FnOnce(TaskId) -> Vec<Event>,
    ) -> Result<Arc<Task>, Error> {
        let id = self.log.new_task_id().await?;
        let task = self.insert(TaskState::new(id));
        self.append(&task, events(id)).await?;
        Ok(task)
    }

    /// Lets go of a task another brain drives now: it is not this store's to act on, and is
    /// shown here as a view (its watchers go on). Not cancelled: a cancellation would stop
    /// the command the new holder waits for.
    pub fn forget(&self, id: TaskId) {
        if let Some(t) = self.tasks.locked().remove(&id) {
            // What it would still do here is fenced anyway; it must not go on if the task
            // comes back to this brain under a new lease while it waits.
            t.stop_driver();
            self.views.locked().insert(id, t);
        }
    }

    /// Makes the view of `id` one of this brain's tasks, its state brought up to the log's
    /// end first (call once its lease is this brain's, or it has ended).
    async fn promote(&self, view: Arc<Task>) -> Result<Arc<Task>, Error> {
        self.catch_up(&view).await?;
        let id = view.id;
        let task = self.tasks.locked().entry(id).or_insert(view).clone();
        self.views.locked().remove(&id);
        Ok(task)
    }

    pub(crate) fn insert(&self, state: TaskState) -> Arc<Task> {
        let task = self.detached(state);
        self.tasks.locked().insert(task.id, task.clone());
        self.views.locked().remove(&task.id);
        task
    }

    /// A task in memory, in neither map.
    fn detached(&self, state: TaskState) -> Arc<Task> {
        Arc::new(Task {
            id: state.id,
            state: Mutex::new(state),
            events: Broadcast::new(),
            live: Broadcast::new(),
            cancel: CancellationToken::new(),
            cancel_reason: Mutex::new(None),
            wake: tokio::sync::Notify::new(),
            control: tokio::sync::Mutex::new(()),
            delivering: tokio::sync::Mutex::new(()),
            move_request: Mutex::new(None),
            minted: Mutex::new(VecDeque::new()),
            looked_for_instructions: Mutex::new(Default::default()),
            append_lock: tokio::sync::Mutex::new(()),
            driving: Mutex::new(CancellationToken::new()),
        })
    }

    /// Rebuilds every task from its latest snapshot and log tail. A task whose records cannot
    /// be decoded is failed (with the key and the reason, logged once) and the others go on.
    /// Where brains share the log, a task another brain drives is left to it. Returns the
    /// tasks, in id order.
    pub async fn load_all(&self) -> Result<Vec<Arc<Task>>, Error> {
        self.load_new(&|_| false).await
    }

    /// [`Store::load_all`] for the tasks this store does not hold yet: those another brain
    /// drove until its lease lapsed, on a shared log.
    /// A task `leave` says is another brain's to take (its worker is connected there) is
    /// left to it.
    pub async fn load_new(
        &self,
        leave: &(dyn Fn(&TaskState) -> bool + Sync),
    ) -> Result<Vec<Arc<Task>>, Error> {
        let mut out = Vec::new();
        // Not read at all: what another brain drives now (read only once its lease lapses).
        let elsewhere = self.log.held_elsewhere().await?;
        for id in self.log.tasks().await? {
            if self.task(id).is_some() || elsewhere.contains(&id) {
                continue;
            }
            if let Some(view) = self.view(id) {
                // Shown here already: taken over as it is (its watchers go on), once it has
                // ended or its lease is this brain's.
                let st = view.state();
                let ended = st.status.is_terminal()
                    || st.status == crate::model::state::Status::BudgetExhausted;
                if !ended && leave(&st) {
                    continue;
                }
                if ended || self.log.claim(id).await? {
                    out.push(self.promote(view).await?);
                }
                continue;
            }
            let (mut state, mut broken) = self.load(id).await?;
            let ended = state.status.is_terminal()
                || state.status == crate::model::state::Status::BudgetExhausted;
            if !ended {
                if leave(&state) {
                    continue;
                }
                if !self.log.claim(id).await? {
                    tracing::debug!(task = %id, "another brain drives this task");
                    continue;
                }
                // Claimed: what the last holder wrote after it was read counts. (A log only
                // this brain writes has nothing new: no second read.)
                if broken.is_none() && self.log.last_seq(id).await? != state.last_seq {
                    (state, broken) = self.load(id).await?;
                }
            }
            let task = self.insert(state);
            if let Some(reason) = broken {
                tracing::error!(task = %id, %reason, "task cannot be replayed; marking it failed");
                // Marked already on an earlier start? Then its last record says so.
                let last = self.log.last_seq(id).await?;
                let marked = self
                    .log
                    .read(id, last.saturating_sub(1))
                    .await?
                    .into_iter()
                    .any(|r| {
                        matches!(
                            r,
                            Ok(Record {
                                event: Event::Finished { .. },
                                ..
                            })
                        )
                    });
                if marked {
                    let mut st = task.state.locked();
                    st.status = crate::model::state::Status::Failed;
                    st.reason = reason;
                } else if !task.state().status.is_terminal() {
                    self.append(
                        &task,
                        vec![Event::Finished {
                            outcome: Outcome::Failed,
                            reason,
                            verified: None,
                        }],
                    )
                    .await?;
                }
            }
            out.push(task);
        }
        Ok(out)
    }

    /// A task's state from its snapshot and the records after it. The second value is set
    /// when a record cannot be decoded: the state is as of the record before it.
    pub async fn load(&self, id: TaskId) -> Result<(TaskState, Option<String>), Error> {
        let mut state = TaskState::new(id);
        if let Some((upto, bytes)) = self.log.snapshot(id).await? {
            match serde_json::from_slice::<TaskState>(&bytes) {
                // A snapshot must not run ahead of the log (a backup taken mid-snapshot).
                Ok(s) if s.last_seq == upto && upto <= self.log.last_seq(id).await? => state = s,
                // A snapshot we cannot read only costs a longer replay.
                _ => tracing::warn!(task = %id, "snapshot unreadable; replaying the whole log"),
            }
        }
        for r in self.log.read(id, state.last_seq).await? {
            match r {
                Ok(r) => apply(&mut state, &r),
                Err(e) => return Ok((state, Some(e.to_string()))),
            }
        }
        Ok((state, None))
    }

    /// Whether some running task waits for the result of `call_id`.
    /// Whether other brains share the log (see [`EventLog::shared`]).
    pub(crate) fn shared(&self) -> bool {
        self.log.shared()
    }

    pub(crate) fn wants_result(&self, call_id: u64) -> bool {
        self.all()
            .iter()
            .any(|t| t.state().pending.is_some_and(|p| p.call_id == call_id))
    }

    /// Whether a task that holds a worker (not ended, not stopped for budget: a stopped
    /// task's workspace is mirrored) runs on `worker`.
    pub fn worker_in_use(&self, worker: &str) -> bool {
        self.all().iter().any(|t| {
            let st = t.state();
            !st.status.is_terminal()
                && st.status != crate::model::state::Status::BudgetExhausted
                && st.worker.as_deref() == Some(worker)
        })
    }

    /// Ids of tasks this process has in memory, for tests.
    pub fn ids(&self) -> HashSet<TaskId> {
        self.tasks.locked().keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::log::MemLog;

    #[tokio::test]
    async fn finished_stays_the_last_record_even_when_a_snapshot_is_due() {
        let log = Arc::new(MemLog::default());
        let store = Store::new(log.clone(), 2, CallIds::starting_above(0, 1));
        let id = log.new_task_id().await.unwrap();
        let task = store.insert(TaskState::new(id));
        store
            .append(&task, vec![Event::WorkerAssigned { worker: "w".into() }])
            .await
            .unwrap();
        store
            .append(
                &task,
                vec![Event::Finished {
                    outcome: Outcome::Finished,
                    reason: String::new(),
                    verified: None,
                }],
            )
            .await
            .unwrap();
        let records: Vec<Record> = log
            .read(id, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(records.len(), 2, "{records:?}");
        assert!(matches!(records[1].event, Event::Finished { .. }));
        // A due snapshot is still taken while the task runs.
        let id2 = log.new_task_id().await.unwrap();
        let t2 = store.insert(TaskState::new(id2));
        for _ in 0..2 {
            store
                .append(&t2, vec![Event::WorkerAssigned { worker: "w".into() }])
                .await
                .unwrap();
        }
        assert_eq!(log.snapshot(id2).await.unwrap().map(|s| s.0), Some(2));
    }

    #[tokio::test]
    async fn issued_calls_get_fresh_ids_and_are_remembered_as_minted_here() {
        let log = Arc::new(MemLog::default());
        let store = Store::new(log.clone(), 100, CallIds::starting_above(0, 1));
        let task = store
            .create(|_| vec![Event::WorkerAssigned { worker: "w".into() }])
            .await
            .unwrap();
        let call = ToolCall::ListFiles {
            glob: String::new(),
        };
        let a = store
            .issue(&task, "w", 0, Purpose::Step, call.clone())
            .await
            .unwrap();
        assert!(task.minted_here(a));
        assert_eq!(task.state().pending.map(|p| p.call_id), Some(a));
        let b = store
            .issue(&task, "w", 1, Purpose::Step, call)
            .await
            .unwrap();
        assert!(b > a);
        assert!(!task.minted_here(a - 1));
    }
}
