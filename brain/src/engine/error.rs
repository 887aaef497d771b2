//! The engine's errors: the log failing, and the commands' refusals (each says what to do).

use super::log;
use super::ports::PortError;
use crate::model::event::TaskId;

/// Errors of the engine's commands.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Log(#[from] log::Error),
    #[error("no task {0}")]
    NoSuchTask(String),
    #[error("task {0} has already ended")]
    Ended(TaskId),
    #[error("task {task}: {reason}")]
    Refused { task: TaskId, reason: String },
    /// No worker can take the task (the reason says why and what to do).
    #[error(transparent)]
    Unplaceable(PortError),
    /// The starting workspace could not be fetched.
    #[error("{0}")]
    Import(String),
    /// The request contradicts itself (the message says how).
    #[error("{0}")]
    Invalid(String),
    /// A delivery failed (the log has it too).
    #[error("{0}")]
    Delivery(String),
}
