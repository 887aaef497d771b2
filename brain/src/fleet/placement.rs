//! Where tasks may run: the brain's policy for workers (required confinement, limits for
//! every command) and the one placement rule — connected, not revoked, allowed by the
//! policy, with the labels the task requires — used when a task is created, moved by a
//! person, failed over, and when the agent asks for an environment.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::hub::Hub;
use crate::model::ops::Limits;
use crate::trust::registry::{Registry, WorkerRecord};

/// The labels a worker must have.
pub type Labels = BTreeMap<String, String>;

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

    /// Why `worker` may not take a task, if it may not.
    pub fn refuse(&self, worker: &WorkerRecord) -> Option<String> {
        let have = worker
            .caps
            .as_ref()
            .map(|c| c.sandbox.clone())
            .unwrap_or_default();
        let missing: Vec<&str> = self
            .require_sandbox
            .iter()
            .filter(|m| !have.contains(m))
            .map(String::as_str)
            .collect();
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

/// The placement rule over the registry and the live sessions. Cheap to clone.
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

    /// Workers a task with `labels` may go to now, in enrolment order: connected, not
    /// revoked, allowed by the policy, with the labels.
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

    /// The worker named (id or name: it need not be connected, the task waits for it), or
    /// with `named` empty the first candidate. The error says why none will do.
    pub fn pick(&self, named: &str, labels: &Labels) -> Result<WorkerRecord, String> {
        if !named.is_empty() {
            let w = self
                .registry
                .resolve_worker(named)
                .map_err(|e| e.to_string())?;
            if w.revoked {
                return Err(format!("worker {} ({}) is revoked", w.id, w.name));
            }
            if !has_labels(&w, labels) {
                let want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                return Err(format!(
                    "worker {} ({}) does not have the labels the task requires: {}",
                    w.id,
                    w.name,
                    want.join(", ")
                ));
            }
            if let Some(why) = self.policy.refuse(&w) {
                return Err(why);
            }
            return Ok(w);
        }
        if let Some(w) = self.candidates(labels).into_iter().next() {
            return Ok(w);
        }
        // Say why: a connected worker the policy refuses, or none at all.
        let connected: Vec<WorkerRecord> = self
            .registry
            .workers()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|w| !w.revoked && self.hub.is_connected(&w.id) && has_labels(w, labels))
            .collect();
        Err(match connected.first() {
            Some(w) => self.policy.refuse(w).unwrap_or_default(),
            None if labels.is_empty() => {
                "no worker is connected: start one (`worker join ...`) or name one with --worker"
                    .into()
            }
            None => "no connected worker has the labels the task requires".into(),
        })
    }

    /// A candidate other than `lost`, for a task whose worker is gone.
    pub fn failover(&self, lost: &str, labels: &Labels) -> Option<String> {
        self.candidates(labels)
            .into_iter()
            .find(|w| w.id != lost)
            .map(|w| w.id)
    }
}
