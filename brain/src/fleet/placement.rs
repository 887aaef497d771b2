//! Where tasks may run: the brain's policy for workers (required confinement, limits for
//! every command) and the one placement rule — connected, not revoked, allowed by the
//! policy, with the labels the task requires, with room; the least loaded of those — used
//! when a task is placed, moved by a person, failed over, and when the agent asks for an
//! environment. What it chooses from is the hub's in-memory [`Board`].

use std::sync::Arc;

use tokio::sync::oneshot;

use super::board::{Board, NoRoom, Occupancy, Want};
use super::hub::Hub;
use crate::model::ops::Limits;
use crate::trust::registry::{self, Registry, WorkerRecord};

pub use super::choice::Labels;

/// Why a task cannot go to the worker named, or to any worker as the fleet stands (each
/// message says what to do).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The worker named is not enrolled, or the registry could not be read.
    #[error(transparent)]
    Registry(#[from] registry::Error),
    #[error("worker {id} ({name}) is revoked")]
    Revoked { id: String, name: String },
    #[error("worker {id} ({name}) does not have the labels the task requires: {}", .want.join(", "))]
    LacksLabels {
        id: String,
        name: String,
        want: Vec<String>,
    },
    /// The worker lacks a confinement the brain's policy requires ([`Policy::refuse`]).
    #[error("{0}")]
    Policy(String),
    #[error("{0}")]
    NoRoom(NoRoom),
}

/// What the brain demands of where and how commands run.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Limits for every command (a call may ask for tighter ones).
    pub limits: Limits,
    /// Confinement mechanisms a worker must have before a task is placed on it.
    pub require_sandbox: Vec<String>,
}

impl Policy {
    /// The tighter of the policy's limits and a request's.
    pub fn merge(&self, req: &Limits) -> Limits {
        self.limits.tighten(req)
    }

    /// The mechanisms the policy requires that `have` lacks.
    pub fn lacks(&self, have: &[String]) -> Vec<&str> {
        self.require_sandbox
            .iter()
            .filter(|m| !have.contains(m))
            .map(String::as_str)
            .collect()
    }

    /// Why `worker` may not take a task, if it may not.
    pub fn refuse(&self, worker: &WorkerRecord) -> Option<String> {
        let have = worker
            .caps
            .as_ref()
            .map(|c| c.sandbox.clone())
            .unwrap_or_default();
        let missing = self.lacks(&have);
        (!missing.is_empty()).then(|| {
            format!(
                "the brain's policy requires {} on the task's worker, and worker {} ({}) lacks {}: see `worker doctor` on it",
                self.require_sandbox.join(", "),
                worker.id,
                worker.name,
                missing.join(", ")
            )
        })
    }
}

/// Whether `w` carries every label of `labels`.
pub fn has_labels(w: &WorkerRecord, labels: &Labels) -> bool {
    labels.iter().all(|(k, v)| w.labels.get(k) == Some(v))
}

/// The placement rule over the live sessions (the hub's [`Board`], in memory) and, for a
/// worker named by a person, the registry. Cheap to clone.
#[derive(Clone)]
pub struct Placement {
    registry: Registry,
    hub: Hub,
    policy: Arc<Policy>,
}

impl Placement {
    pub fn new(registry: Registry, hub: Hub, policy: Policy) -> Self {
        Self {
            registry,
            hub,
            policy: Arc::new(policy),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    fn board(&self) -> &Board {
        self.hub.board()
    }

    /// What a task with `labels` needs of a worker under the brain's policy.
    pub fn want(&self, labels: &Labels) -> Want {
        Want {
            labels: labels.clone(),
            require_sandbox: self.policy.require_sandbox.clone(),
            memory_bytes: self.policy.limits.memory_bytes,
            ..Default::default()
        }
    }

    /// Workers a task with `labels` may go to now, in enrolment order: connected, not
    /// revoked, allowed by the policy, with the labels. (For provisioning, which looks at
    /// what the workers are; tasks are placed through [`Placement::place`].)
    pub fn candidates(&self, labels: &Labels) -> Vec<WorkerRecord> {
        let Ok(workers) = self.registry.workers() else {
            return vec![];
        };
        workers
            .into_iter()
            .filter(|w| !w.revoked && self.hub.is_connected(&w.id) && has_labels(w, labels))
            .filter(|w| self.policy.refuse(w).is_none())
            .collect()
    }

    /// Whether a worker other than `current` that the policy allows is connected (from the
    /// board: asked at every step of an agent task).
    pub fn another_connected(&self, current: &str) -> bool {
        self.board()
            .any_member(|m| &*m.id != current && self.policy.lacks(&m.sandbox).is_empty())
    }

    /// The worker named (id or name: it need not be connected, the task waits for it; a
    /// person's choice is not held to the worker's capacity). The error says why it will
    /// not do.
    pub fn named(&self, named: &str, labels: &Labels) -> Result<WorkerRecord, Error> {
        let w = self.registry.resolve_worker(named)?;
        if w.revoked {
            return Err(Error::Revoked {
                id: w.id,
                name: w.name,
            });
        }
        if !has_labels(&w, labels) {
            return Err(Error::LacksLabels {
                id: w.id,
                name: w.name,
                want: labels.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            });
        }
        if let Some(why) = self.policy.refuse(&w) {
            return Err(Error::Policy(why));
        }
        Ok(w)
    }

    /// Whether a task with `labels` can ever be placed as the fleet stands: some connected
    /// worker has the labels and what the policy requires (it may be busy now: the task
    /// queues). The error says why not.
    pub fn check(&self, labels: &Labels) -> Result<(), Error> {
        match self.board().why_not(&self.want(labels)) {
            Some(no) if !no.transient() => Err(Error::NoRoom(no)),
            _ => Ok(()),
        }
    }

    /// The least loaded worker for `task` now, its room reserved; or why none has room.
    pub fn place(&self, task: u64, labels: &Labels) -> Result<String, NoRoom> {
        self.board().place(task, &self.want(labels))
    }

    /// [`Placement::place`], on a worker holding fewer of `apart` first (one entry per
    /// sibling task there).
    pub fn place_apart(
        &self,
        task: u64,
        labels: &Labels,
        apart: &[String],
    ) -> Result<String, NoRoom> {
        let mut want = self.want(labels);
        want.apart = apart.to_vec();
        self.board().place(task, &want)
    }

    /// Waits in the placement queue for room for `task`.
    pub fn enqueue(&self, task: u64, labels: &Labels) -> oneshot::Receiver<String> {
        self.board().enqueue(task, self.want(labels))
    }

    /// A worker other than `current` for a move a person asked for without naming one:
    /// least loaded with room, within the bound on moves into one worker; reserved.
    pub fn move_target(&self, task: u64, current: &str, labels: &Labels) -> Result<String, NoRoom> {
        let mut want = self.want(labels);
        want.exclude = Some(current.to_string());
        want.moving = true;
        want.moves_per_worker = self.board().options().moves_per_worker;
        self.board().place(task, &want)
    }

    /// A worker other than `lost`, for a task whose worker is gone: the same choice, at most
    /// `moves_per_worker` moves into one target at once, and not again at once for a task
    /// that failed over lately.
    pub fn failover(&self, task: u64, lost: &str, labels: &Labels) -> Option<String> {
        self.board().failover(task, lost, &self.want(labels))
    }

    /// Where `task` is now (`None`: it ended or stopped).
    pub fn occupy(&self, task: u64, now: Option<Occupancy>) {
        self.board().occupy(task, now)
    }
}
