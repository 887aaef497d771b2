//! A person's change to a task (approve or deny, move, resume, cancel, deliver) made through a
//! brain that only shows the task (a view: another brain sharing the log drives it) is handed
//! to the brain that drives it, through the [`Peers`](super::ports::Peers) port, and answered
//! there as if it had been asked there. What crosses is this module's [`Change`] and
//! [`Answer`], as JSON: the engine's own words, versioned by their tags.

use serde::{Deserialize, Serialize};

use crate::model::agent::Budget;
use crate::model::delivery::{Delivery, Mode};

/// A change a person asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    Decide {
        approved: bool,
        by: String,
        reason: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        always: bool,
    },
    Move {
        to: String,
    },
    Resume {
        extra: Budget,
    },
    Cancel,
    Deliver {
        mode: Mode,
    },
}

/// What the driving brain answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Answer {
    Decided { what: String },
    Moving { to: String },
    Resumed,
    Cancelled,
    Delivered { delivery: Delivery },
    Refused { kind: Refusal, detail: String },
}

/// Which of the engine's errors a refusal was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    NoSuchTask,
    Ended,
    Refused,
    Unplaceable,
    Invalid,
    Delivery,
    /// The driving brain could not do it (its log failed, say): the detail says why.
    Failed,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::error::Error;
    use crate::engine::ports::PortError;
    use crate::model::event::TaskId;

    #[test]
    fn changes_and_refusals_cross_as_json_and_come_back_as_the_same_errors() {
        let c = Change::Decide {
            approved: true,
            by: "admin".into(),
            reason: "ok".into(),
            always: false,
        };
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains(r#""change":"decide""#), "{json}");
        assert_eq!(serde_json::from_str::<Change>(&json).unwrap(), c);

        let task = TaskId(7);
        let e = Error::Refused {
            task,
            reason: "it is not waiting for an approval".into(),
        };
        let a = Answer::refused(&e);
        let back: Answer = serde_json::from_slice(&serde_json::to_vec(&a).unwrap()).unwrap();
        assert_eq!(back.into_error(task).to_string(), e.to_string());
        assert_eq!(
            Answer::refused(&Error::Ended(task))
                .into_error(task)
                .to_string(),
            Error::Ended(task).to_string()
        );
        assert!(matches!(
            Answer::Resumed.into_error(task),
            Error::Peer(PortError::Peer(m)) if m.contains("not what was asked")
        ));
    }
}
