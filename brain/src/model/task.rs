//! A task's id and where it is in its life: below the records, so everything that names a
//! task (records, attempts, state) can.

use serde::{Deserialize, Serialize};

/// A task id: `t-` and a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct TaskId(pub u64);

impl TaskId {
    /// The name of the task's workspace on every worker.
    pub fn workspace(self) -> String {
        format!("task-{}", self.0)
    }

    /// The task a workspace name belongs to, if it is a task's.
    pub fn from_workspace(name: &str) -> Option<TaskId> {
        let n = name.strip_prefix("task-")?;
        // Only the canonical form: no sign, no leading zeros.
        (!n.starts_with(['+', '0']) || n == "0")
            .then(|| n.parse().ok().map(TaskId))
            .flatten()
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "t-{}", self.0)
    }
}

impl From<TaskId> for String {
    fn from(t: TaskId) -> String {
        t.to_string()
    }
}

/// Text that is not a task id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid task id {0:?}: expected t-<number>")]
pub struct InvalidTaskId(pub String);

impl TryFrom<String> for TaskId {
    type Error = InvalidTaskId;
    fn try_from(s: String) -> Result<Self, InvalidTaskId> {
        s.parse()
    }
}

impl std::str::FromStr for TaskId {
    type Err = InvalidTaskId;
    fn from_str(s: &str) -> Result<Self, InvalidTaskId> {
        s.strip_prefix("t-")
            .unwrap_or(s)
            .parse()
            .map(TaskId)
            .map_err(|_| InvalidTaskId(s.to_string()))
    }
}

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Created,
    /// Waiting for a worker with room (the reason says how the fleet stands).
    Queued,
    Running,
    Waiting,
    /// Stopped until `brain task resume ID --budget-...` gives it more.
    BudgetExhausted,
    Finished,
    Failed,
    Cancelled,
    /// The agent kept repeating the same calls or errors.
    Stuck,
    /// The model stopped calling tools.
    Stalled,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Status {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Status::Finished | Status::Failed | Status::Cancelled | Status::Stuck | Status::Stalled
        )
    }

    /// Whether a task in this status goes on by itself: not ended, not stopped for budget.
    pub fn goes_on(self) -> bool {
        !self.is_terminal() && self != Status::BudgetExhausted
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Queued => "queued",
            Status::Running => "running",
            Status::Waiting => "waiting",
            Status::BudgetExhausted => "budget_exhausted",
            Status::Finished => "finished",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
            Status::Stuck => "stuck",
            Status::Stalled => "stalled",
        }
    }
}
