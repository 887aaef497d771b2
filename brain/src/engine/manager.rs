//! The task manager: creates tasks, rebuilds every task from its snapshot and log tail on
//! start, resumes the unfinished ones, and is the only writer of task events (append, then
//! apply, then tell watchers).

use shared::locks::Lock;
use shared::locks::RwLockExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::log::{self, EventLog};
use crate::fleet::hub::Hub;
use crate::model::event::{Event, Outcome, Plan, Record, TaskId};
use crate::model::state::{TaskState, apply};

/// Errors of the task manager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Log(#[from] log::Error),
    #[error("no task {0}: see `brain tasks`")]
    NoSuchTask(String),
    #[error("task {0} has already ended")]
    Ended(TaskId),
    #[error("task {task}: {reason}")]
    Refused { task: TaskId, reason: String },
}

/// Tunables.
#[derive(Debug, Clone)]
pub struct Options {
    /// Store a snapshot after this many events.
    pub snapshot_every: u64,
    /// How long a call waits for its worker to come back before it counts as interrupted.
    pub worker_wait: Duration,
    /// Resource limits for every command a task runs (the brain's policy).
    pub limits: proto::Limits,
    /// LLM providers, models and prices (the brain's config file).
    pub llm: Arc<crate::llm::LlmConfig>,
    /// How long a task's worker may be gone before the task fails over to another.
    pub failover_after: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            snapshot_every: 100,
            worker_wait: Duration::from_secs(600),
            limits: proto::Limits::default(),
            llm: Arc::default(),
            failover_after: Duration::from_secs(30),
        }
    }
}

/// Live events of one task for watchers. Bounded: a watcher that falls behind is told it
/// lagged and can re-read the log.
const WATCH_QUEUE: usize = 1024;

/// A chunk of a running call's output.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LiveOutput {
    pub kind: &'static str,
    pub call_id: u64,
    pub stream: &'static str,
    pub text: String,
}

/// One task in memory: its state (a cache of the log) and its watchers.
pub struct Task {
    pub id: TaskId,
    /// The state as of the last appended record. A std mutex: never held across an await.
    state: Mutex<TaskState>,
    pub events: broadcast::Sender<Record>,
    /// Output of the running call as it is produced, for watchers. Not logged (the call's
    /// captured output is, when it ends); a watcher that falls behind loses chunks.
    pub live: broadcast::Sender<LiveOutput>,
    pub cancel: CancellationToken,
    /// Woken when a person decides an approval the task waits for.
    pub wake: tokio::sync::Notify,
    /// Held by a person's command (decide, resume) from its check to its append, so two at
    /// once cannot both pass the check (and, say, start two runners).
    control: tokio::sync::Mutex<()>,
    /// A move a person asked for, taken by the runner at the next tool-call boundary.
    move_request: Mutex<Option<String>>,
    /// One appender at a time per task, so state and log stay in the same order.
    append_lock: tokio::sync::Mutex<()>,
}

impl Task {
    pub fn state(&self) -> TaskState {
        self.state.locked().clone()
    }

    pub(crate) fn set_move_request(&self, to: &str) {
        *self.move_request.locked() = Some(to.to_string());
    }

    pub(crate) fn take_move_request(&self) -> Option<String> {
        self.move_request.locked().take()
    }
}

/// The labels a worker must have.
pub type Labels = std::collections::BTreeMap<String, String>;

/// Picks a worker to fail over to, other than the one given: connected, allowed by policy,
/// with the labels given.
pub type Placer = Arc<dyn Fn(&str, &Labels) -> Option<String> + Send + Sync>;

/// Where `request_environment` gets machines: idle workers that fit, or new ones from the
/// provisioners (implemented by `provision::Machines`).
#[async_trait::async_trait]
pub trait Environments: Send + Sync {
    /// The hourly price of what `req` would get, and whether that needs a person's approval.
    fn quote(&self, task: &str, current: &str, req: &EnvRequest) -> Quote;
    /// A connected worker that fits `req` (not `current`), provisioned for `task` if need
    /// be; `budget_left` (USD, `None`: no money limit) bounds what it may cost.
    async fn obtain(
        &self,
        task: &str,
        current: &str,
        req: &EnvRequest,
        budget_left: Option<f64>,
    ) -> Result<Grant, String>;
    /// Releases the machine `worker` runs on if the brain created it and no other task uses
    /// it; says what it did.
    async fn release_if_ours(&self, worker: &str, task: &str) -> Option<String>;
    /// What the machines created for `task` have cost so far (USD).
    fn task_cost(&self, task: &str) -> f64;
}

pub use crate::model::tools::EnvRequest;

/// What an environment would cost.
#[derive(Debug, Clone, Default)]
pub struct Quote {
    /// An existing worker fits: nothing new is bought.
    pub reuse: bool,
    pub usd_per_hour: f64,
    pub needs_approval: bool,
}

/// An environment obtained.
#[derive(Debug, Clone)]
pub struct Grant {
    pub worker: String,
    /// For the model and people: what it is.
    pub describe: String,
    /// The machine created for it, if one was.
    pub machine: Option<String>,
}

/// The manager. Cheap to clone.
#[derive(Clone)]
pub struct Manager {
    pub log: Arc<dyn EventLog>,
    pub hub: Hub,
    pub opts: Options,
    tasks: Arc<Mutex<HashMap<TaskId, Arc<Task>>>>,
    /// Notified once every task has been loaded.
    loaded: Arc<tokio::sync::Notify>,
    placer: Arc<std::sync::RwLock<Option<Placer>>>,
    environments: Arc<std::sync::RwLock<Option<Arc<dyn Environments>>>>,
}

impl Manager {
    pub fn new(log: Arc<dyn EventLog>, hub: Hub, opts: Options) -> Self {
        let m = Self {
            log,
            hub,
            opts,
            tasks: Arc::default(),
            loaded: Arc::default(),
            placer: Arc::default(),
            environments: Arc::default(),
        };
        // Live file changes go to the watchers of the task whose workspace and worker they
        // name.
        let weak = m.clone();
        m.hub
            .set_fs_sink(Arc::new(move |worker: &str, f: proto::FsChanged| {
                let Some(task) = f
                    .workspace
                    .strip_prefix("task-")
                    .and_then(|n| n.parse().ok())
                    .and_then(|n| weak.task(TaskId(n)))
                else {
                    return;
                };
                if task.state().worker.as_deref() != Some(worker) {
                    return;
                }
                for (stream, paths) in [("changed", f.changed), ("removed", f.removed)] {
                    if !paths.is_empty() {
                        let _ = task.live.send(LiveOutput {
                            kind: "fs_change",
                            call_id: 0,
                            stream,
                            text: paths.join("\n"),
                        });
                    }
                }
            }));
        // Results a worker replays after they were logged (the brain died before its
        // acknowledgement got out) are acknowledged here.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, u64)>();
        m.hub.set_orphan_sink(tx);
        let weak = m.clone();
        tokio::spawn(async move {
            // Not before every task is loaded: until then a result may be one a task is
            // about to ask for.
            weak.loaded.notified().await;
            while let Some((worker, call_id)) = rx.recv().await {
                let m = weak.clone();
                tokio::spawn(async move {
                    // Give a resuming task a moment to claim it.
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    let wanted = m
                        .all()
                        .iter()
                        .any(|t| t.state().pending.is_some_and(|p| p.call_id == call_id));
                    if !wanted {
                        // Settled already (or nobody's): the worker may forget it.
                        m.hub.ack(&worker, call_id);
                    }
                });
            }
        });
        m
    }

    /// Sets how failover picks a new worker (without one, tasks wait for their worker).
    pub fn set_placer(&self, p: Placer) {
        *self.placer.write_locked() = Some(p);
    }

    /// Sets where `request_environment` gets machines (without it, the tool is refused).
    pub fn set_environments(&self, e: Arc<dyn Environments>) {
        *self.environments.write_locked() = Some(e);
    }

    pub fn environments(&self) -> Option<Arc<dyn Environments>> {
        self.environments.read_locked().clone()
    }

    /// A worker with these labels to fail over to from `lost`, if any.
    pub fn place(&self, lost: &str, labels: &Labels) -> Option<String> {
        let p = self.placer.read_locked().clone();
        p.and_then(|p| p(lost, labels))
    }

    fn all(&self) -> Vec<Arc<Task>> {
        self.tasks.locked().values().cloned().collect()
    }

    pub fn task(&self, id: TaskId) -> Option<Arc<Task>> {
        self.tasks.locked().get(&id).cloned()
    }

    /// Finds a task by `t-N` or `N`.
    pub fn find(&self, text: &str) -> Result<Arc<Task>, Error> {
        let id: TaskId = text
            .parse()
            .map_err(|_| Error::NoSuchTask(text.to_string()))?;
        self.task(id)
            .ok_or_else(|| Error::NoSuchTask(text.to_string()))
    }

    /// Every task's state, oldest first.
    pub fn list(&self) -> Vec<TaskState> {
        let mut v: Vec<TaskState> = self.all().iter().map(|t| t.state()).collect();
        v.sort_by_key(|s| s.id);
        v
    }

    /// Appends events to a task: durable first, then applied and shown to watchers.
    pub async fn append(&self, task: &Task, events: Vec<Event>) -> Result<(), Error> {
        let _g = task.append_lock.lock().await;
        let recs = self.log.append(task.id, events).await?;
        let snapshot_due = {
            let mut st = task.state.locked();
            for r in &recs {
                apply(&mut st, r);
            }
            // `Finished` stays a task's last record; an ended task's replay is bounded by
            // `snapshot_every` anyway.
            !st.status.is_terminal() && st.last_seq - st.snapshot_seq >= self.opts.snapshot_every
        };
        for r in recs {
            let _ = task.events.send(r);
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
            let mut st = task.state.locked();
            for r in &recs {
                apply(&mut st, r);
            }
        }
        Ok(())
    }

    /// Creates a task that runs a scripted plan on a worker, and starts it.
    pub async fn create_plan(
        &self,
        goal: String,
        plan: Plan,
        worker: String,
        workspace: Vec<Event>,
    ) -> Result<TaskId, Error> {
        self.create(goal, Some(plan), None, worker, workspace).await
    }

    /// Creates an agent task on a worker, and starts it.
    pub async fn create_agent(
        &self,
        goal: String,
        spec: crate::model::agent::AgentSpec,
        worker: String,
        workspace: Vec<Event>,
    ) -> Result<TaskId, Error> {
        self.create(goal, None, Some(Box::new(spec)), worker, workspace)
            .await
    }

    /// Logs a new task (its first records, then `workspace`'s: placement, sync rules, seed)
    /// and starts its runner.
    async fn create(
        &self,
        goal: String,
        plan: Option<Plan>,
        agent: Option<Box<crate::model::agent::AgentSpec>>,
        worker: String,
        workspace: Vec<Event>,
    ) -> Result<TaskId, Error> {
        let id = self.log.new_task_id()?;
        let task = self.insert(TaskState::new(id));
        let mut events = vec![
            Event::Created {
                goal,
                workspace: format!("task-{}", id.0),
                plan,
                agent,
            },
            Event::WorkerAssigned { worker },
        ];
        events.extend(workspace);
        self.append(&task, events).await?;
        self.spawn_runner(task);
        Ok(id)
    }

    /// Approves or denies the call a task waits on; returns what it was.
    pub async fn decide(
        &self,
        text: &str,
        approved: bool,
        by: &str,
        reason: &str,
    ) -> Result<String, Error> {
        let task = self.find(text)?;
        let _control = task.control.lock().await;
        let refused = |reason: &str| Error::Refused {
            task: task.id,
            reason: reason.into(),
        };
        let st = task.state();
        if st.status.is_terminal() {
            return Err(Error::Ended(task.id));
        }
        let ap = st
            .agent
            .as_ref()
            .and_then(|a| a.approval.clone())
            .filter(|ap| ap.decision.is_none())
            .ok_or_else(|| refused("it is not waiting for an approval"))?;
        self.append(
            &task,
            vec![Event::ApprovalDecided {
                approval_id: ap.id,
                approved,
                by: by.to_string(),
                reason: reason.chars().take(2000).collect(),
            }],
        )
        .await?;
        task.wake.notify_one();
        Ok(ap.what)
    }

    /// Asks for a task to move to worker `to` at its next tool-call boundary.
    pub async fn request_move(&self, text: &str, to: &str) -> Result<TaskId, Error> {
        let task = self.find(text)?;
        let _control = task.control.lock().await;
        let st = task.state();
        let refused = |reason: String| Error::Refused {
            task: task.id,
            reason,
        };
        if st.status.is_terminal() {
            return Err(Error::Ended(task.id));
        }
        if st.worker.as_deref() == Some(to) {
            return Err(refused(format!("it already runs on {to}")));
        }
        if let Some(m) = &st.moving_to {
            return Err(refused(format!("it is already moving to {m}")));
        }
        *task.move_request.locked() = Some(to.to_string());
        task.wake.notify_one();
        Ok(task.id)
    }

    /// Gives a task stopped for budget more (added to what it spent) and starts it again.
    pub async fn resume(
        &self,
        text: &str,
        extra: crate::model::agent::Budget,
    ) -> Result<TaskId, Error> {
        let task = self.find(text)?;
        let _control = task.control.lock().await;
        let st = task.state();
        if st.status != crate::model::state::Status::BudgetExhausted {
            return Err(Error::Refused {
                task: task.id,
                reason: format!(
                    "it is {}, not stopped for budget; only a budget_exhausted task can be resumed",
                    st.status.as_str()
                ),
            });
        }
        let a = st.agent.as_ref().ok_or_else(|| Error::Refused {
            task: task.id,
            reason: "not an agent task".into(),
        })?;
        let limits = a.raised(extra).map_err(|reason| Error::Refused {
            task: task.id,
            reason,
        })?;
        self.append(
            &task,
            vec![
                Event::BudgetRaised { limits },
                Event::StatusChanged {
                    status: crate::model::state::Status::Running.as_str().into(),
                    reason: String::new(),
                },
            ],
        )
        .await?;
        self.spawn_runner(task.clone());
        Ok(task.id)
    }

    fn insert(&self, state: TaskState) -> Arc<Task> {
        let (events, _) = broadcast::channel(WATCH_QUEUE);
        let (live, _) = broadcast::channel(WATCH_QUEUE);
        let task = Arc::new(Task {
            id: state.id,
            state: Mutex::new(state),
            events,
            live,
            cancel: CancellationToken::new(),
            wake: tokio::sync::Notify::new(),
            control: tokio::sync::Mutex::new(()),
            move_request: Mutex::new(None),
            append_lock: tokio::sync::Mutex::new(()),
        });
        self.tasks.locked().insert(task.id, task.clone());
        task
    }

    fn spawn_runner(&self, task: Arc<Task>) {
        let m = self.clone();
        tokio::spawn(async move {
            super::runner::run(m, task).await;
        });
    }

    /// Rebuilds every task from its latest snapshot and log tail and resumes the ones that
    /// have not ended. A task whose records cannot be decoded is failed (with the key and the
    /// reason) and the others go on. Returns (loaded, resumed).
    pub async fn resume_all(&self) -> Result<(usize, usize), Error> {
        let ids = self.log.tasks()?;
        let mut resumed = 0;
        for id in &ids {
            let (state, broken) = self.load(*id)?;
            let task = self.insert(state);
            if let Some(reason) = broken {
                tracing::error!(task = %id, %reason, "task cannot be replayed; marking it failed");
                // Marked already on an earlier start? Then its last record says so.
                let last = self.log.last_seq(*id)?;
                let marked = self
                    .log
                    .read(*id, last.saturating_sub(1))?
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
                    task.state.locked().status = crate::model::state::Status::Failed;
                    task.state.locked().reason = reason;
                } else if !task.state().status.is_terminal() {
                    self.append(
                        &task,
                        vec![Event::Finished {
                            outcome: Outcome::Failed,
                            reason,
                        }],
                    )
                    .await?;
                }
                continue;
            }
            let status = task.state().status;
            if !status.is_terminal() && status != crate::model::state::Status::BudgetExhausted {
                resumed += 1;
                tracing::info!(task = %id, "resuming task");
                self.spawn_runner(task);
            }
        }
        self.loaded.notify_one();
        Ok((ids.len(), resumed))
    }

    /// A task's state from its snapshot and the records after it. The second value is set
    /// when a record cannot be decoded: the state is as of the record before it.
    pub fn load(&self, id: TaskId) -> Result<(TaskState, Option<String>), Error> {
        let mut state = TaskState::new(id);
        if let Some((upto, bytes)) = self.log.snapshot(id)? {
            match serde_json::from_slice::<TaskState>(&bytes) {
                // A snapshot must not run ahead of the log (a backup taken mid-snapshot).
                Ok(s) if s.last_seq == upto && upto <= self.log.last_seq(id)? => state = s,
                // A snapshot we cannot read only costs a longer replay.
                _ => tracing::warn!(task = %id, "snapshot unreadable; replaying the whole log"),
            }
        }
        for r in self.log.read(id, state.last_seq)? {
            match r {
                Ok(r) => apply(&mut state, &r),
                Err(e) => return Ok((state, Some(e.to_string()))),
            }
        }
        Ok((state, None))
    }

    /// Asks a task to stop. The runner records the cancellation.
    pub async fn cancel(&self, text: &str) -> Result<TaskId, Error> {
        let task = self.find(text)?;
        if task.state().status.is_terminal() {
            return Err(Error::Ended(task.id));
        }
        task.cancel.cancel();
        Ok(task.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::log::MemLog;

    #[tokio::test]
    async fn finished_stays_the_last_record_even_when_a_snapshot_is_due() {
        let log = Arc::new(MemLog::default());
        let m = Manager::new(
            log.clone(),
            Hub::new(),
            Options {
                snapshot_every: 2,
                ..Default::default()
            },
        );
        let id = log.new_task_id().unwrap();
        let task = m.insert(TaskState::new(id));
        m.append(&task, vec![Event::WorkerAssigned { worker: "w".into() }])
            .await
            .unwrap();
        m.append(
            &task,
            vec![Event::Finished {
                outcome: Outcome::Finished,
                reason: String::new(),
            }],
        )
        .await
        .unwrap();
        let records: Vec<Record> = log
            .read(id, 0)
            .unwrap()
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(records.len(), 2, "{records:?}");
        assert!(matches!(records[1].event, Event::Finished { .. }));
        // A due snapshot is still taken while the task runs.
        let id2 = log.new_task_id().unwrap();
        let t2 = m.insert(TaskState::new(id2));
        for _ in 0..2 {
            m.append(&t2, vec![Event::WorkerAssigned { worker: "w".into() }])
                .await
                .unwrap();
        }
        assert_eq!(log.snapshot(id2).unwrap().map(|s| s.0), Some(2));
    }
}
