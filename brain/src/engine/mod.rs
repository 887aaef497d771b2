//! The task engine: the durable log, the store that appends and applies, the supervisor that
//! runs one driver per task, the drivers (scripted plans, the agent) and the effects they
//! have. It acts on workers and machines only through its [`ports`]; it never sees wire
//! types, and knows nothing of sessions, providers or the mirror's files.
//!
//! [`Engine`] is the handle the API and the composition root use: create a task, decide an
//! approval, move, resume, cancel, follow a task's log.

pub mod agent;
mod attempts;
pub mod core;
mod deliver;
pub mod driver;
pub(crate) mod effects;
mod error;
mod follow;
pub mod handoff;
mod sent;

pub use deliver::commit_message;
pub mod log;
pub mod plan;
pub mod ports;
pub mod redact;
pub mod store;
pub(crate) mod supervisor;

use shared::locks::Lock;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::core::Core;
pub use self::core::Options;
use crate::model::agent::{AgentSpec, Budget, CHECK_FILE, Check, check_from_file};
use crate::model::delivery::{Delivery, Mode};
use crate::model::egress::EgressSpec;
use crate::model::event::{Event, Plan, SyncRules, TaskId};
use crate::model::ops::{FsChange, SyncOp};
use crate::model::state::{Status, TaskState};
pub use error::Error;
pub use follow::{Followed, Follower, Linger};
use handoff::{Answer, Change};
use ports::{Labels, Picked, Ports};
pub use sent::{Sent, Turn};
pub use store::{LiveOutput, Shown, Store, Task};

/// What a new task runs.
#[derive(Debug, Clone)]
pub enum Kind {
    /// A scripted plan, and the egress policy its commands run under (`None`: no proxy).
    Plan {
        plan: Plan,
        egress: Option<EgressSpec>,
    },
    Agent(Box<AgentSpec>),
}

/// Where a new task's workspace comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Source {
    /// An empty workspace.
    #[default]
    Empty,
    /// A directory of the chosen worker's own, copied into the mirror.
    Dir(String),
    /// A git repository the brain clones.
    Git { url: String, git_ref: String },
}

/// A task to create; checked already (the API rejects bad input before it gets here).
#[derive(Debug, Clone)]
pub struct NewTask {
    pub goal: String,
    pub kind: Kind,
    /// Worker id or name; empty: any that qualifies.
    pub worker: String,
    pub labels: Labels,
    pub rules: SyncRules,
    pub source: Source,
    /// How a `--git` task's result is delivered; `None`: the config's default.
    pub deliver: Option<Mode>,
    /// Run as attempts (an agent task only), each a task of its own.
    pub attempts: Option<crate::model::attempts::AttemptsSpec>,
}

/// How long an import of a worker's directory may take.
const IMPORT_TIMEOUT: Duration = Duration::from_secs(1800);
/// A result a worker replays that no task claims within this long is acknowledged (a task
/// resuming after a restart may be about to ask for it).
const ORPHAN_GRACE: Duration = Duration::from_secs(2);

/// The engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    /// What the drivers share.
    core: Arc<Core>,
    /// Every task the engine spawns (drivers, followers, orphan checks): shutdown cancels
    /// `shutdown` and waits for them. Drivers stop at once (the log says where they were).
    tracker: TaskTracker,
    shutdown: CancellationToken,
    /// Set once every task has been loaded: until then a replayed result may be one a task
    /// is about to ask for.
    loaded: tokio::sync::watch::Sender<bool>,
    /// Results replayed before the tasks were loaded.
    early_orphans: Mutex<Vec<(String, u64)>>,
    /// The other brains sharing the log, where there are any: a change to a task one of
    /// them drives is handed to it.
    peers: std::sync::OnceLock<Arc<dyn ports::Peers>>,
    /// Refused egress connections logged per task since start (bounded: a command that
    /// retries in a loop must not flood the log).
    egress_refusals: Mutex<std::collections::HashMap<TaskId, u32>>,
}

/// Refused egress connections logged per task (per brain start); later ones are counted in
/// the brain's log only.
const EGRESS_REFUSALS_LOGGED: u32 = 64;

impl Engine {
    /// An engine over `store` (loaded or not: [`Engine::resume_all`] loads it) acting
    /// through `ports`. `shutdown` stops its tasks; `tracker` is where they are spawned.
    pub fn new(
        store: Store,
        ports: Ports,
        opts: Options,
        tracker: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        let (loaded, _) = tokio::sync::watch::channel(false);
        Self {
            inner: Arc::new(Inner {
                core: Arc::new(Core {
                    redact: Arc::new(redact::Redactor::new(&opts.llm, &opts.secrets)),
                    llm: shared::locks::Live::new(opts.llm.clone()),
                    together: Arc::default(),
                    store,
                    ports,
                    opts,
                }),
                tracker,
                shutdown,
                loaded,
                early_orphans: Mutex::default(),
                peers: std::sync::OnceLock::new(),
                egress_refusals: Mutex::default(),
            }),
        }
    }

    /// `text` with every secret the brain knows masked.
    pub fn redact(&self, text: &str) -> String {
        self.inner.core.redact.apply(text)
    }

    /// Masks `value` too from now on, everywhere (a secret set while the brain runs).
    pub fn learn_secret(&self, value: String) {
        self.inner.core.redact.learn([value]);
    }

    pub fn store(&self) -> &Store {
        &self.inner.core.store
    }

    pub fn opts(&self) -> &Options {
        &self.inner.core.opts
    }

    /// Every task's state, oldest first.
    pub fn list(&self) -> Vec<TaskState> {
        self.inner.core.store.list()
    }

    pub fn find(&self, text: &str) -> Result<Arc<Task>, Error> {
        self.inner.core.store.find(text)
    }

    /// Spawns `f` on the engine's tracker, stopped at shutdown.
    fn spawn(&self, f: impl Future<Output = ()> + Send + 'static) {
        let stop = self.inner.shutdown.clone();
        self.inner.tracker.spawn(async move {
            tokio::select! {
                _ = f => {}
                _ = stop.cancelled() => {}
            }
        });
    }

    fn spawn_driver(&self, task: Arc<Task>) {
        let core = self.inner.core.clone();
        let engine = self.clone();
        let stop = task.new_driver();
        self.spawn(async move {
            let drive = async {
                if task.state().attempts.is_some() {
                    attempts::run(engine, task.clone()).await;
                } else {
                    supervisor::run(core.clone(), task.clone()).await;
                }
                deliver::owed_delivery(&core, &task).await;
            };
            // Stopped where it waits, as if its process had died: the log says where it was.
            tokio::select! {
                () = drive => {}
                () = stop.cancelled() => {
                    tracing::debug!(task = %task.id, "a driver of a task this brain let go stopped");
                }
            }
        });
    }

    /// Delivers a task's last barrier as a branch (`Mode::Pr`: and a pull request): one that
    /// finished as `<prefix><id>`, any other as `<prefix><id>-wip`. Delivering the same
    /// workspace again changes nothing.
    pub async fn deliver(&self, text: &str, mode: Mode) -> Result<Delivery, Error> {
        let task = self.find(text)?;
        match self.elsewhere(&task, Change::Deliver { mode }).await? {
            None => deliver::run(&self.inner.core, &task, mode).await,
            Some(Answer::Delivered { delivery }) => Ok(delivery),
            Some(other) => Err(other.into_error(task.id)),
        }
    }

    /// Sets the other brains sharing the log (once; later calls change nothing).
    pub fn set_peers(&self, peers: Arc<dyn ports::Peers>) {
        let _ = self.inner.peers.set(peers);
    }

    /// Hands `change` to the brain driving `task` when that is another brain (`task` is a
    /// view here); `None` when it is this brain's to do.
    async fn elsewhere(&self, task: &Task, change: Change) -> Result<Option<Answer>, Error> {
        if !self.inner.core.store.is_view(task.id) {
            return Ok(None);
        }
        let Some(peers) = self.inner.peers.get() else {
            return Ok(None);
        };
        tracing::info!(task = %task.id, ?change, "handing a change to the brain driving the task");
        peers
            .hand_off(task.id, &change)
            .await
            .map(Some)
            .map_err(Error::Peer)
    }

    /// Does `change`, handed over by another brain, to `task`, which this brain drives.
    pub async fn answer(&self, task: TaskId, change: Change) -> Answer {
        if self.inner.core.store.task(task).is_none() {
            return Answer::refused(&Error::Peer(ports::PortError::Peer(format!(
                "task {task} moved to another brain while the change was on its way: ask again"
            ))));
        }
        let text = task.to_string();
        let done = match change {
            Change::Decide {
                approved,
                by,
                reason,
                always,
            } => self
                .decide(&text, approved, &by, &reason, always)
                .await
                .map(|what| Answer::Decided { what }),
            Change::Move { to } => self
                .request_move(&text, &to)
                .await
                .map(|(_, to)| Answer::Moving { to }),
            Change::Resume { extra } => self.resume(&text, extra).await.map(|_| Answer::Resumed),
            Change::Cancel => self.cancel(&text).await.map(|_| Answer::Cancelled),
            Change::Deliver { mode } => self
                .deliver(&text, mode)
                .await
                .map(|delivery| Answer::Delivered { delivery }),
        };
        done.unwrap_or_else(|e| Answer::refused(&e))
    }

    /// Loads every task from the log and starts a driver for each that has not ended (or
    /// stopped for budget). Call once every port works: a resumed task may fail over or ask
    /// for a machine at once. Returns (loaded, resumed).
    pub async fn resume_all(&self) -> Result<(usize, usize), Error> {
        let tasks = self.inner.core.store.load_all().await?;
        let mut resumed = 0;
        for task in &tasks {
            let status = task.state().status;
            if !status.is_terminal() && status != Status::BudgetExhausted {
                resumed += 1;
                tracing::info!(task = %task.id, "resuming task");
                self.spawn_driver(task.clone());
            } else if deliver::owed(&task.state()).is_some() {
                let (core, task) = (self.inner.core.clone(), task.clone());
                self.spawn(async move { deliver::owed_delivery(&core, &task).await });
            }
        }
        self.inner.loaded.send_replace(true);
        let early = std::mem::take(&mut *self.inner.early_orphans.locked());
        for (worker, call_id) in early {
            self.orphan_result(&worker, call_id);
        }
        Ok((tasks.len(), resumed))
    }

    /// Takes on the tasks other brains sharing the log drove until their leases lapsed (a
    /// brain that died or was cut off), and starts a driver for each. How many.
    pub async fn adopt(&self) -> Result<usize, Error> {
        // Until [`Self::resume_all`] has loaded the log, the tasks are its to start.
        if !*self.inner.loaded.borrow() {
            return Ok(0);
        }
        let mut adopted = 0;
        // A task whose worker is connected to another replica is that replica's to take.
        let peers = self.inner.peers.get().cloned();
        let leave = move |st: &TaskState| {
            let (Some(p), Some(w)) = (peers.as_ref(), st.worker.as_deref()) else {
                return false;
            };
            p.worker_elsewhere(w).is_some()
        };
        for task in self.inner.core.store.load_new(&leave).await? {
            let status = task.state().status;
            if !status.is_terminal() && status != Status::BudgetExhausted {
                adopted += 1;
                tracing::info!(task = %task.id, "taking over a task whose brain's lease lapsed");
                self.spawn_driver(task);
            }
        }
        Ok(adopted)
    }

    /// The replica sharing the store that `worker`'s session is on, when that is another live
    /// one (none without replicas).
    pub fn worker_elsewhere(&self, worker: &str) -> Option<String> {
        self.inner.peers.get()?.worker_elsewhere(worker)
    }

    /// Lets go of the tasks this brain drives whose worker is connected to another replica
    /// now, and not here: that replica takes them over (a task follows its worker). Their
    /// drivers here are fenced at their next append. How many.
    pub async fn follow_workers(&self) -> Result<usize, Error> {
        let Some(peers) = self.inner.peers.get() else {
            return Ok(0);
        };
        let core = &self.inner.core;
        let mut let_go = 0;
        for task in core.store.all() {
            let st = task.state();
            if st.status.is_terminal() || st.status == Status::BudgetExhausted {
                continue;
            }
            let Some(worker) = st.worker.as_deref() else {
                continue;
            };
            if core.ports.workers.is_connected(worker) {
                continue;
            }
            let Some(there) = peers.worker_elsewhere(worker) else {
                continue;
            };
            if core.store.log().release(task.id).await? {
                tracing::info!(task = %task.id, %worker, replica = %there, "the task's worker is connected to another replica: letting the task go there");
                core.store.forget(task.id);
                core.ports.placement.occupy(task.id.0, None);
                let_go += 1;
            }
        }
        Ok(let_go)
    }

    /// Takes a reloaded LLM config: tasks that start (or restart) from now on use it, and
    /// its keys are masked from now on.
    pub fn reload_llm(&self, llm: crate::llm::LlmConfig) {
        let core = &self.inner.core;
        core.redact.learn_llm(&llm);
        core.llm.set(Arc::new(llm));
    }

    /// Creates a task: picks its worker, fetches its starting workspace, logs its first
    /// records and starts its driver.
    pub async fn create(&self, mut new: NewTask) -> Result<TaskId, Error> {
        let ports = &self.inner.core.ports;
        // A model that cannot be asked (no key, a config that names it wrongly) is said now:
        // no task is made (nor a workspace imported) for a request that cannot start.
        if let Kind::Agent(a) = &new.kind {
            let core = &self.inner.core;
            agent::provider(a, &core.llm.get(), &core.together)
                .map_err(|e| Error::Invalid(format!("the task's model cannot be used: {e}")))?;
        }
        let git = matches!(new.source, Source::Git { .. });
        let deliver = match new.deliver {
            Some(Mode::None) => Mode::None,
            Some(m) if !git => {
                return Err(Error::Invalid(format!(
                    "delivery as a {m} needs a task that starts from a git repository; a patch or an export of the workspace gives any task's result"
                )));
            }
            Some(m) => m,
            None if git => ports.delivery.default_mode(),
            None => Mode::None,
        };
        // A git task's workspace holds the repository's (cleaned) `.git/`.
        new.rules.include_git |= git;
        // A worker named is assigned now; otherwise the driver places the task (at once if
        // a worker has room, else in the queue), once it is sure some worker could take it.
        let named = if new.worker.is_empty() {
            ports
                .placement
                .check(&new.labels)
                .map_err(Error::Unplaceable)?;
            None
        } else {
            Some(
                ports
                    .placement
                    .named(&new.worker, &new.labels)
                    .map_err(Error::Unplaceable)?,
            )
        };
        let seed = self.seed(&new, named.as_ref()).await?;
        let (plan, agent, plan_egress) = match new.kind {
            Kind::Plan { .. } if new.attempts.is_some() => {
                return Err(Error::Invalid(
                    "attempts run an agent task several times: a scripted plan runs once".into(),
                ));
            }
            Kind::Plan { plan, egress } => (Some(plan), None, egress),
            Kind::Agent(mut a) => {
                self.repository_check(&mut a, seed.as_ref()).await?;
                (None, Some(a), None)
            }
        };
        // A task run as attempts holds no worker: each attempt is placed (on the one named,
        // if one was).
        let attempts = new.attempts.map(|mut spec| {
            spec.worker = named.as_ref().map(|w| w.id.clone()).unwrap_or_default();
            spec
        });
        let named = named.filter(|_| attempts.is_none());
        let task = self
            .inner
            .core
            .store
            .create(|id| {
                let mut events = vec![Event::Created {
                    goal: new.goal,
                    workspace: id.workspace(),
                    plan,
                    agent,
                    egress: plan_egress,
                    attempts,
                    attempt_of: None,
                }];
                if let Some(w) = named {
                    events.push(Event::WorkerAssigned { worker: w.id });
                }
                if !new.labels.is_empty() {
                    events.push(Event::Placement {
                        require_labels: new.labels,
                    });
                }
                if !new.rules.is_default() {
                    events.push(Event::WorkspaceRules { rules: new.rules });
                }
                if deliver != Mode::None {
                    events.push(Event::DeliveryPlanned { mode: deliver });
                }
                events.extend(seed);
                events
            })
            .await?;
        self.spawn_driver(task.clone());
        Ok(task.id)
    }

    /// The task's starting workspace: a worker's directory or a git repository brought
    /// into the mirror, as the record that says so; none for an empty one.
    async fn seed(&self, new: &NewTask, named: Option<&Picked>) -> Result<Option<Event>, Error> {
        let ports = &self.inner.core.ports;
        match &new.source {
            Source::Empty => Ok(None),
            Source::Dir(dir) => {
                let w = named.ok_or_else(|| {
                    Error::Invalid(format!(
                        "a task that starts from a directory ({dir}) needs a worker named: the worker whose directory it is"
                    ))
                })?;
                let op = SyncOp::ImportDir { dir: dir.clone() };
                let r = ports
                    .workers
                    .sync(&w.id, "import", op, &new.rules, false, IMPORT_TIMEOUT)
                    .await
                    .map_err(|e| Error::Import(format!("importing {dir} from {}: {e}", w.name)))?;
                if !r.error.is_empty() {
                    return Err(Error::Import(format!(
                        "importing {dir} from {}: {}",
                        w.name, r.error
                    )));
                }
                tracing::info!(%dir, worker = %w.id, files = r.files, bytes = r.bytes, wire_bytes = r.wire_bytes, "workspace imported");
                Ok(Some(Event::WorkspaceSeeded {
                    root_hash: r.root_hash,
                    source: format!("{}:{dir}", w.name),
                    files: r.files,
                    bytes: r.bytes,
                    commit: String::new(),
                    branch: String::new(),
                }))
            }
            Source::Git { url, git_ref } => {
                let i = ports
                    .workspaces
                    .import_git(url, git_ref, &new.rules)
                    .await
                    .map_err(|e| Error::Import(e.to_string()))?;
                tracing::info!(url = %i.url, commit = %i.commit, files = i.files, bytes = i.bytes, "workspace imported");
                Ok(Some(Event::WorkspaceSeeded {
                    root_hash: i.root_hash,
                    source: i.url,
                    files: i.files,
                    bytes: i.bytes,
                    commit: i.commit,
                    branch: i.branch,
                }))
            }
        }
    }

    /// The repository's own check (`.tether/check`) wins over the config's default; a
    /// request's own check wins over both. Protected files need some check.
    async fn repository_check(&self, a: &mut AgentSpec, seed: Option<&Event>) -> Result<(), Error> {
        let ports = &self.inner.core.ports;
        let from_request = a
            .check
            .as_ref()
            .is_some_and(|c| c.source == crate::model::check::CheckSource::Request);
        if !from_request
            && let Some(Event::WorkspaceSeeded { root_hash, .. }) = seed
            && let Some(text) = ports
                .workspaces
                .read_file(root_hash, CHECK_FILE, 16 * 1024)
                .await
            && let Some((command, protect)) = check_from_file(&String::from_utf8_lossy(&text))
        {
            let old = a.check.take().unwrap_or_else(|| Check {
                command: String::new(),
                timeout_ms: 0,
                source: Default::default(),
                protect: vec![],
            });
            let mut all = old.protect;
            all.extend(protect);
            a.check = Some(Check {
                command,
                timeout_ms: old.timeout_ms,
                source: crate::model::check::CheckSource::Repository,
                protect: all,
            });
        }
        if a.check
            .as_ref()
            .is_some_and(|c| c.command.trim().is_empty())
        {
            return Err(Error::Invalid(
                "protected files need an acceptance check: give the task one, or name one in the repository's .tether/check".into(),
            ));
        }
        Ok(())
    }

    /// Approves or denies the call a task waits on; returns what it was. `always`: approved
    /// for the same command (or file) for the rest of the task.
    pub async fn decide(
        &self,
        text: &str,
        approved: bool,
        by: &str,
        reason: &str,
        always: bool,
    ) -> Result<String, Error> {
        let task = self.find(text)?;
        let always = always && approved;
        let change = Change::Decide {
            approved,
            by: by.to_string(),
            reason: reason.to_string(),
            always,
        };
        match self.elsewhere(&task, change).await? {
            None => {}
            Some(Answer::Decided { what }) => return Ok(what),
            Some(other) => return Err(other.into_error(task.id)),
        }
        let _control = task.control.lock().await;
        let st = task.state();
        if st.status.is_terminal() {
            return Err(Error::Ended(task.id));
        }
        let ap = st
            .agent
            .as_ref()
            .and_then(|a| a.approval.clone())
            .filter(|ap| ap.decision.is_none())
            .ok_or_else(|| Error::Refused {
                task: task.id,
                reason: "it is not waiting for an approval".into(),
            })?;
        self.inner
            .core
            .store
            .append(
                &task,
                vec![Event::ApprovalDecided {
                    approval_id: ap.id,
                    approved,
                    by: by.to_string(),
                    reason: reason.chars().take(2000).collect(),
                    always,
                }],
            )
            .await?;
        task.wake.notify_one();
        Ok(ap.what)
    }

    /// Asks for a task to move at its next tool-call boundary to worker `to` (id or name;
    /// empty: any that qualifies). Returns the worker chosen.
    pub async fn request_move(&self, text: &str, to: &str) -> Result<(TaskId, String), Error> {
        let task = self.find(text)?;
        let change = Change::Move { to: to.to_string() };
        match self.elsewhere(&task, change).await? {
            None => {}
            Some(Answer::Moving { to }) => return Ok((task.id, to)),
            Some(other) => return Err(other.into_error(task.id)),
        }
        let _control = task.control.lock().await;
        let st = task.state();
        let refused = |reason: String| Error::Refused {
            task: task.id,
            reason,
        };
        if st.status.is_terminal() {
            return Err(Error::Ended(task.id));
        }
        if st.attempts.is_some() {
            return Err(refused(
                "it runs as attempts, each on a worker of its own: move one of them (the task lists them)".into(),
            ));
        }
        if let Some(m) = st.moving_to.clone().or_else(|| task.move_request()) {
            return Err(refused(format!("it is already moving to {m}")));
        }
        let placement = &self.inner.core.ports.placement;
        let current = st.worker.clone().unwrap_or_default();
        let to = if to.is_empty() {
            placement
                .move_target(task.id.0, &current, &st.require_labels)
                .map_err(Error::Unplaceable)?
        } else {
            let w = placement
                .named(to, &st.require_labels)
                .map_err(Error::Unplaceable)?;
            if current == w.id {
                return Err(refused(format!("it already runs on {}", w.id)));
            }
            w.id
        };
        task.set_move_request(&to);
        Ok((task.id, to))
    }

    /// Gives a task stopped for budget more (added to what it spent) and starts it again.
    pub async fn resume(&self, text: &str, extra: Budget) -> Result<TaskId, Error> {
        let task = self.find(text)?;
        match self.elsewhere(&task, Change::Resume { extra }).await? {
            None => {}
            Some(Answer::Resumed) => return Ok(task.id),
            Some(other) => return Err(other.into_error(task.id)),
        }
        let _control = task.control.lock().await;
        let st = task.state();
        if st.status != Status::BudgetExhausted {
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
        let limits = a.raised(extra).map_err(|e| Error::Refused {
            task: task.id,
            reason: e.to_string(),
        })?;
        self.inner
            .core
            .store
            .append(
                &task,
                vec![
                    Event::BudgetRaised { limits },
                    Event::StatusChanged {
                        status: Status::Running,
                        reason: String::new(),
                    },
                ],
            )
            .await?;
        self.spawn_driver(task.clone());
        Ok(task.id)
    }

    /// Asks a task to stop. Its driver logs the cancellation.
    pub async fn cancel(&self, text: &str) -> Result<TaskId, Error> {
        let task = self.find(text)?;
        match self.elsewhere(&task, Change::Cancel).await? {
            None => {}
            Some(Answer::Cancelled) => return Ok(task.id),
            Some(other) => return Err(other.into_error(task.id)),
        }
        if task.state().status.is_terminal() {
            return Err(Error::Ended(task.id));
        }
        task.cancel.cancel();
        Ok(task.id)
    }

    /// A task's records after sequence number `after`, then (with `follow`) what is appended
    /// and the live output, until the task ends, the stream is dropped or the engine shuts
    /// down. No record is missed or repeated at the seam between history and live: a
    /// follower that falls behind re-reads from the log.
    pub fn follow(&self, text: &str, after: u64, follow: bool) -> Result<Follower, Error> {
        self.follow_with(text, after, follow, Linger::DEFAULT)
    }

    /// [`Self::follow`], lingering after each wake as `linger` says.
    pub fn follow_with(
        &self,
        text: &str,
        after: u64,
        follow: bool,
        linger: Linger,
    ) -> Result<Follower, Error> {
        let task = self.find(text)?;
        Ok(follow::follow(
            task,
            self.inner.core.store.log().clone(),
            after,
            follow,
            linger,
            self.inner.shutdown.clone(),
        ))
    }

    /// File changes a worker's watcher saw: shown to the watchers of the task whose
    /// workspace they are in, if that task runs on that worker.
    pub fn file_changes(&self, worker: &str, f: FsChange) {
        let Some(task) =
            TaskId::from_workspace(&f.workspace).and_then(|id| self.inner.core.store.task(id))
        else {
            return;
        };
        if task.state().worker.as_deref() != Some(worker) {
            return;
        }
        for (stream, paths) in [("changed", f.changed), ("removed", f.removed)] {
            if !paths.is_empty() {
                task.live.send(LiveOutput {
                    kind: "fs_change",
                    call_id: 0,
                    stream,
                    text: paths.join("\n"),
                });
            }
        }
        if f.incomplete {
            task.live.send(LiveOutput {
                kind: "fs_change",
                call_id: 0,
                stream: "more",
                text: "more files changed than are listed here; the next barrier has them all"
                    .into(),
            });
        }
    }

    /// The egress policy of task `task`'s calls, when the task exists, has not ended, runs
    /// on `worker` and puts its commands behind the egress proxy.
    pub fn egress_policy(&self, task: &str, worker: &str) -> Option<EgressSpec> {
        let id: TaskId = task.parse().ok()?;
        let st = self.inner.core.store.task(id)?.state();
        if st.status.is_terminal() || st.worker.as_deref() != Some(worker) {
            return None;
        }
        effects::egress_spec(&st).cloned()
    }

    /// Logs a connection of a task's command that the egress proxy refused.
    pub async fn egress_refused(&self, task: &str, host: &str, port: u16, reason: &str) {
        let Some(task) = task
            .parse::<TaskId>()
            .ok()
            .and_then(|id| self.inner.core.store.task(id))
        else {
            return;
        };
        let n = {
            let mut m = self.inner.egress_refusals.locked();
            let n = m.entry(task.id).or_default();
            *n += 1;
            *n
        };
        if n > EGRESS_REFUSALS_LOGGED {
            tracing::warn!(task = %task.id, host, port, reason, "egress refused (not logged in the task: too many)");
            return;
        }
        let e = Event::EgressRefused {
            host: host.to_string(),
            port,
            reason: self.redact(reason),
        };
        if let Err(err) = self.inner.core.store.append(&task, vec![e]).await {
            tracing::warn!(task = %task.id, error = %err, "cannot log a refused egress connection");
        }
    }

    /// A durable result arrived that no call waited for (a worker replays what it has not
    /// had acknowledged). Unless a task claims it soon, the worker is told it may forget it.
    pub fn orphan_result(&self, worker: &str, call_id: u64) {
        if !*self.inner.loaded.borrow() {
            let mut early = self.inner.early_orphans.locked();
            if early.len() < 10_000 {
                early.push((worker.to_string(), call_id));
            }
            return;
        }
        let (e, worker) = (self.clone(), worker.to_string());
        self.spawn(async move {
            tokio::time::sleep(ORPHAN_GRACE).await;
            let store = &e.inner.core.store;
            if store.wants_result(call_id) {
                return;
            }
            if store.shared() {
                // Perhaps a call of a task another replica drove until it stopped: the
                // replica that takes that task over asks for it again, and the worker must
                // still hold the result then, or the call would run twice. (The worker
                // keeps a bounded journal: what nobody asks for ages out.)
                tracing::debug!(%worker, call_id, "a result for a call this replica does not drive: left with the worker");
                return;
            }
            // Settled already (or nobody's): the worker may forget it.
            e.inner.core.ports.workers.ack(&worker, call_id);
        });
    }
}

#[cfg(test)]
mod tests;
