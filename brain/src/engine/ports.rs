//! What the engine needs from the rest of the brain, as small traits: workers to act on, a
//! placement policy, machines on demand, workspace imports and deliveries. The composition
//! root (`app`) implements them over the fleet, the provisioners, the mirror and git; the engine tests
//! implement them in memory. All in domain types: no wire types cross a port.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::model::delivery::{Mode, Origin};
use crate::model::env::{EnvRequest, Grant, Quote};
use crate::model::event::SyncRules;
use crate::model::ops::{Command, CommandEnd, FileAnswer, FileOp, OutputChunk, SyncOp, SyncReport};

/// The labels a worker must have.
pub type Labels = BTreeMap<String, String>;

/// Receives the output of a running durable command as it is produced.
pub type OutputSink = Arc<dyn Fn(OutputChunk) + Send + Sync>;

/// Why a worker call has no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("worker {0} is not connected")]
    NotConnected(String),
    #[error("worker {0} was lost before the call finished")]
    Lost(String),
    #[error("worker {worker} did not answer within {timeout:?}")]
    Timeout { worker: String, timeout: Duration },
    #[error("{0}")]
    Other(String),
}

/// Why a placement, an environment, an import or a delivery port could not do what the
/// engine asked. The implementations keep their own typed errors; a port passes their
/// message on (what failed and what to do), sorted by what failed, and the engine adds what
/// it was doing for the task's log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// No worker will do: the one named is refused, or none qualifies or has room.
    #[error("{0}")]
    Unplaceable(String),
    /// No machine could be had for an environment request.
    #[error("{0}")]
    NoMachine(String),
    /// The brain's git or its mirror failed: a clone, a commit, a diff or a push.
    #[error("{0}")]
    Git(String),
    /// The brain does not have the git objects of the commit a delivery builds on, and
    /// could not fetch them again from the task's origin.
    #[error(
        "the brain does not have the git objects of the imported commit {commit} (expected at {}) and could not fetch them again: {why}",
        .at.display()
    )]
    ObjectsGone {
        commit: String,
        at: PathBuf,
        why: String,
    },
    /// The origin's URL names no GitHub repository, so no pull request can be opened there.
    #[error("cannot tell the GitHub owner and repository from {0}")]
    NotGithub(String),
    /// The forge refused or failed to open a pull request.
    #[error("{0}")]
    Forge(String),
    /// Another brain sharing the log did not take or answer a change handed to it.
    #[error("{0}")]
    Peer(String),
}

/// The workers, by id.
#[async_trait::async_trait]
pub trait Workers: Send + Sync {
    fn is_connected(&self, worker: &str) -> bool;
    /// Whether `worker` is connected within `wait`.
    async fn wait_connected(&self, worker: &str, wait: Duration) -> bool;
    /// Runs durable `cmd` on `worker` (or asks its journal about it after a restart) and
    /// waits for the outcome through reconnects; gives up only if the worker stays away for
    /// `wait`. The output goes to `output` as it comes.
    async fn run_durable(
        &self,
        worker: &str,
        cmd: Command,
        wait: Duration,
        output: OutputSink,
    ) -> CommandEnd;
    /// Asks the worker to stop a running call (best effort).
    fn cancel(&self, worker: &str, call_id: u64);
    /// Tells the worker it may forget a durable call: its result is in the log.
    fn ack(&self, worker: &str, call_id: u64);
    async fn file(
        &self,
        worker: &str,
        workspace: &str,
        op: FileOp,
        timeout: Duration,
    ) -> Result<FileAnswer, CallError>;
    /// A barrier, a materialisation or an import, and the worker's report of it.
    async fn sync(
        &self,
        worker: &str,
        workspace: &str,
        op: SyncOp,
        rules: &SyncRules,
        full_scan: bool,
        timeout: Duration,
    ) -> Result<SyncReport, CallError>;
}

/// A worker chosen for a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Picked {
    pub id: String,
    pub name: String,
}

pub use crate::model::ops::Occupancy;

/// Where tasks may run: connected, not revoked, allowed by the brain's policy, with the
/// labels the task requires, with room; the least loaded of those.
pub trait Placement: Send + Sync {
    /// The worker named (id or name); it must qualify, but need not have room. The error
    /// says why it does not.
    fn named(&self, named: &str, labels: &Labels) -> Result<Picked, PortError>;
    /// Whether a task with `labels` can be placed as the fleet stands (it may have to queue
    /// for room); the error says why not.
    fn check(&self, labels: &Labels) -> Result<(), PortError>;
    /// The least loaded worker for `task`, its room reserved; else why none has room now.
    fn place(&self, task: u64, labels: &Labels) -> Result<String, PortError>;
    /// [`Placement::place`], preferring workers that hold fewer of `apart` (workers, one
    /// entry per sibling task there): attempts of one task spread over distinct workers.
    fn place_apart(
        &self,
        task: u64,
        labels: &Labels,
        apart: &[String],
    ) -> Result<String, PortError> {
        let _ = apart;
        self.place(task, labels)
    }
    /// Waits, in order, for room for `task`; resolves with the worker reserved for it.
    fn enqueue(&self, task: u64, labels: &Labels) -> tokio::sync::oneshot::Receiver<String>;
    /// A worker other than `current` for a move asked without a target (reserved).
    fn move_target(&self, task: u64, current: &str, labels: &Labels) -> Result<String, PortError>;
    /// A worker other than `lost` to fail over to, within the bounds on moves (reserved).
    fn failover(&self, task: u64, lost: &str, labels: &Labels) -> Option<String>;
    /// Where `task` is now (`None`: ended or stopped).
    fn occupy(&self, task: u64, now: Option<Occupancy>);
}

/// Where `request_environment` gets machines: idle workers that fit, or new ones.
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
    ) -> Result<Grant, PortError>;
    /// Releases the machine `worker` runs on if the brain created it and no other task uses
    /// it; says what it did.
    async fn release_if_ours(&self, worker: &str, task: &str) -> Option<String>;
    /// Releases the machines created for `task` that no task uses any more; says which.
    async fn release_for_task(&self, task: &str) -> Vec<String>;
    /// What the machines created for `task` have cost so far (USD).
    fn task_cost(&self, task: &str) -> f64;
    /// Whether anything could be obtained for a task on `current`: an offer is configured,
    /// or another worker is connected.
    fn available(&self, current: &str) -> bool;
}

/// A workspace stored in the mirror for a task to start from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    pub root_hash: String,
    pub files: u64,
    pub bytes: u64,
    /// The commit imported and its branch, and the URL without userinfo.
    pub commit: String,
    pub branch: String,
    pub url: String,
}

/// A commit a delivery makes: the workspace `root` on top of the imported `origin` commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRequest {
    pub origin: Origin,
    /// The workspace as imported, and the one delivered (manifest roots in the mirror).
    pub base_root: String,
    pub root: String,
    pub date_s: i64,
    pub message: String,
}

/// A pull request to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRequestSpec {
    pub origin_url: String,
    pub head: String,
    pub base: String,
    pub title: String,
    pub body: String,
}

/// Where results go: git commits pushed with the brain's own credentials, and pull requests.
#[async_trait::async_trait]
pub trait Delivery: Send + Sync {
    /// How tasks are delivered unless they say: the config's `[deliver] mode`.
    fn default_mode(&self) -> Mode;
    /// The prefix of delivered branches (`tether/`).
    fn branch_prefix(&self) -> String;
    /// Makes the commit (the same request always makes the same id); its id.
    async fn commit(&self, req: &CommitRequest) -> Result<String, PortError>;
    /// Pushes `commit` (made on `origin`'s commit) to `branch` of the origin repository,
    /// replacing what the branch held.
    async fn push(&self, origin: &Origin, commit: &str, branch: &str) -> Result<(), PortError>;
    /// Opens the pull request, or finds the one open already: (URL, number).
    async fn open_pull_request(&self, pr: &PullRequestSpec) -> Result<(String, u64), PortError>;
}

/// Workspaces the brain fetches itself.
#[async_trait::async_trait]
pub trait Workspaces: Send + Sync {
    /// Clones a git repository (shallow, at `git_ref` or its default branch) into the mirror.
    async fn import_git(
        &self,
        url: &str,
        git_ref: &str,
        rules: &SyncRules,
    ) -> Result<Imported, PortError>;
    /// A file of a workspace in the mirror (`root`: its manifest), if it is there, is a
    /// regular file and has at most `max` bytes.
    async fn read_file(&self, root: &str, path: &str, max: u64) -> Option<Vec<u8>>;
    /// The regular files of a workspace in the mirror, each with its exec bit.
    async fn list_files(&self, root: &str) -> Vec<(String, bool)>;
    /// The paths whose regular file differs between two versions of a workspace in the
    /// mirror (changed, added or gone), each with its exec bit in `from` (`None`: no regular
    /// file there). Empty when either version is not in the mirror.
    async fn changed_files(&self, from: &str, to: &str) -> Vec<(String, Option<bool>)>;
    /// How big the change from one version of a workspace to another is: files changed, and
    /// lines added plus removed (as `git diff --numstat` counts them).
    async fn diff_size(&self, from: &str, to: &str) -> Result<(u64, u64), PortError>;
}

/// Every port, as the engine holds them.
/// The other brains sharing the log (replicas on one database).
#[async_trait::async_trait]
pub trait Peers: Send + Sync {
    /// Hands `change` to the brain that drives `task` now (whichever that is when it is
    /// taken) and waits for its answer.
    async fn hand_off(
        &self,
        task: crate::model::event::TaskId,
        change: &super::handoff::Change,
    ) -> Result<super::handoff::Answer, PortError>;
    /// The replica `worker`'s session is on, when that is another live one.
    fn worker_elsewhere(&self, worker: &str) -> Option<String>;
}

#[derive(Clone)]
pub struct Ports {
    pub workers: Arc<dyn Workers>,
    pub placement: Arc<dyn Placement>,
    pub environments: Arc<dyn Environments>,
    pub workspaces: Arc<dyn Workspaces>,
    pub delivery: Arc<dyn Delivery>,
}
