//! The engine's errors: the log failing, and the commands' refusals (each says what to do).

use super::handoff::{Answer, Refusal};
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
    /// The brain driving the task (another, sharing the log) did not answer, or could not.
    #[error(transparent)]
    Peer(PortError),
}

/// A change's answer as it crosses to the brain that asked (see [`super::handoff`]).
impl Answer {
    /// The answer to a change that failed with `e`.
    pub fn refused(e: &Error) -> Self {
        let (kind, detail) = match e {
            Error::NoSuchTask(t) => (Refusal::NoSuchTask, t.clone()),
            Error::Ended(_) => (Refusal::Ended, String::new()),
            Error::Refused { reason, .. } => (Refusal::Refused, reason.clone()),
            Error::Unplaceable(p) => (Refusal::Unplaceable, p.to_string()),
            Error::Invalid(m) => (Refusal::Invalid, m.clone()),
            Error::Delivery(m) => (Refusal::Delivery, m.clone()),
            other => (Refusal::Failed, other.to_string()),
        };
        Self::Refused { kind, detail }
    }

    /// The error this answer stands for (an answer of the wrong kind is one too).
    pub fn into_error(self, task: TaskId) -> Error {
        match self {
            Self::Refused { kind, detail } => match kind {
                Refusal::NoSuchTask => Error::NoSuchTask(detail),
                Refusal::Ended => Error::Ended(task),
                Refusal::Refused => Error::Refused {
                    task,
                    reason: detail,
                },
                Refusal::Unplaceable => Error::Unplaceable(PortError::Unplaceable(detail)),
                Refusal::Invalid => Error::Invalid(detail),
                Refusal::Delivery => Error::Delivery(detail),
                Refusal::Failed => Error::Peer(PortError::Peer(detail)),
            },
            other => Error::Peer(PortError::Peer(format!(
                "the brain driving task {task} answered {other:?}, not what was asked"
            ))),
        }
    }
}
