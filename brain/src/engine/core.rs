//! What drivers and effects act in: the store, the ports and the options (the engine's
//! [`Core`]), and one task ([`Cx`]).

use std::sync::Arc;
use std::time::Duration;

use super::ports::Ports;
use super::store::{Store, Task};
use crate::model::ops::Limits;

/// Tunables.
#[derive(Debug, Clone)]
pub struct Options {
    /// Store a snapshot after this many events.
    pub snapshot_every: u64,
    /// How long a call waits for its worker to come back before it counts as interrupted.
    pub worker_wait: Duration,
    /// Resource limits for every command a task runs (the brain's policy).
    pub limits: Limits,
    /// How much each task may keep on its worker's disk (the brain's policy).
    pub disk_quota: crate::model::ops::DiskQuota,
    /// LLM providers, models and prices (the brain's config file).
    pub llm: Arc<crate::llm::LlmConfig>,
    /// How long a task's worker may be gone before the task fails over to another.
    pub failover_after: Duration,
    /// Secrets besides the LLM keys to mask wherever text leaves the brain (the delivery's
    /// tokens).
    pub secrets: Vec<String>,
    /// What puts tasks' commands behind the egress proxy: placeholders and grants are
    /// keyed from the secrets store.
    pub egress: Option<EgressHandle>,
}

/// What the engine needs to send a call behind the egress proxy: placeholders and grants
/// keyed by the brain's secrets key (which the engine never holds), and the egress CA.
pub trait EgressKeys: Send + Sync {
    /// The placeholder task `task`'s commands hold for secret `secret`.
    fn placeholder(&self, task: &str, secret: &str) -> String;
    /// The grant of call `call_id` of `task`: what its worker shows to open a tunnel.
    fn grant(&self, task: &str, call_id: u64) -> String;
    /// The egress CA's certificate (public).
    fn ca_pem(&self) -> String;
    /// Names the operator pinned to addresses (`[egress.resolve]`).
    fn pinned(&self) -> Vec<(String, std::net::IpAddr)>;
}

/// A shared [`EgressKeys`].
#[derive(Clone)]
pub struct EgressHandle(pub Arc<dyn EgressKeys>);

impl std::fmt::Debug for EgressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EgressKeys")
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            snapshot_every: 100,
            worker_wait: Duration::from_secs(600),
            limits: Limits::default(),
            disk_quota: Default::default(),
            llm: Arc::default(),
            failover_after: Duration::from_secs(30),
            secrets: vec![],
            egress: None,
        }
    }
}

/// The parts of the engine its drivers use.
pub struct Core {
    pub store: Store,
    pub ports: Ports,
    pub opts: Options,
    /// Masks every secret the brain knows in text bound for the log, the model or a watcher.
    pub redact: Arc<super::redact::Redactor>,
    /// LLM providers, models and prices as now configured (`opts.llm` at start, replaced by
    /// a reload): a task's driver takes them when it starts.
    pub llm: shared::locks::Live<crate::llm::LlmConfig>,
    /// Where attempts that start together ask their first turn together.
    pub together: Arc<crate::llm::Together>,
}

/// One task and the engine around it.
pub struct Cx<'a> {
    pub core: &'a Core,
    pub task: &'a Arc<Task>,
}

impl Cx<'_> {
    pub fn store(&self) -> &Store {
        &self.core.store
    }
    pub fn ports(&self) -> &Ports {
        &self.core.ports
    }
    pub fn opts(&self) -> &Options {
        &self.core.opts
    }
    /// What the machines created for this task have cost so far.
    pub fn machines_cost(&self) -> f64 {
        self.core
            .ports
            .environments
            .task_cost(&self.task.id.to_string())
    }

    /// Whether the brain has somewhere else to run this task.
    pub fn can_move(&self) -> bool {
        let worker = self.task.state().worker.unwrap_or_default();
        self.core.ports.environments.available(&worker)
    }
}
