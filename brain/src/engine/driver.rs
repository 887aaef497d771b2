//! Drivers decide, then act. A driver's [`Driver::next`] is a pure function of the task's
//! state (the log's truth) and a few facts from outside it (a cancel asked, a move asked, the
//! clock, what machines have cost); the supervisor performs the action it returns, and asks
//! again. The part every task shares — ended, cancelled, no worker, a call to settle, a move
//! to make, a workspace to seed — is [`preamble`], decided once for all drivers. What only one
//! kind of task does is that driver's own type ([`Driver::Own`], in [`Action::Driver`]), so
//! a driver is never handed another's action.

use crate::model::event::{Event, Outcome, Purpose, ToolCall};
use crate::model::state::{PendingCall, Status, TaskState};

/// What a driver decides needs doing next: the actions every task shares, or one of the
/// driver's own (`D`; a plan has none).
#[derive(Debug, Clone, PartialEq)]
pub enum Action<D = std::convert::Infallible> {
    /// Nothing more for now: the task ended, or stopped until a person gives it more budget.
    Stop,
    /// Log `before`, then the end of the task.
    Finish {
        outcome: Outcome,
        reason: String,
        before: Vec<Event>,
    },
    /// Log these (observations, status changes, approval requests, elisions) and look again.
    Log(Vec<Event>),
    /// Get the outcome of the call in flight and log it; then a barrier, if it could have
    /// changed the workspace.
    Settle(PendingCall),
    /// Move the task to this worker now (a tool-call boundary).
    Move(String),
    /// Put the task's starting workspace on its worker.
    Seed,
    /// Find the task a worker: the least loaded with room, else wait in the queue.
    Place,
    /// Log the call as issued (once the worker is there); it is sent when settled.
    Issue {
        call: ToolCall,
        step: u32,
        purpose: Purpose,
    },
    /// Wait for a person to decide the approval asked.
    AwaitDecision,
    /// What only this task's driver does ([`Driver::act`]).
    Driver(D),
}

impl<D> Action<D> {
    /// Ends the task with `outcome`.
    pub fn finish(outcome: Outcome, reason: impl Into<String>) -> Self {
        Action::Finish {
            outcome,
            reason: reason.into(),
            before: vec![],
        }
    }
}

/// What a decision needs that is not in the task's log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    /// The task was cancelled (by a person, or by its parent when another attempt won), and why.
    pub cancelled: Option<String>,
    /// A move asked for by a person (or chosen by failover), not yet started.
    pub move_request: Option<String>,
    /// The wall clock, for the wall-time budget.
    pub now_ms: i64,
    /// What machines created for the task have cost so far (USD).
    pub machines_usd: f64,
    /// The brain has somewhere else to run the task (an offer, or another worker), so
    /// `request_environment` is worth offering.
    pub can_move: bool,
    /// How much the task may keep on its worker's disk (the brain's policy).
    pub disk_quota: crate::model::ops::DiskQuota,
}

/// What every task does before its driver is asked: `None` when the driver decides.
pub fn preamble<D>(st: &TaskState, f: &Facts) -> Option<Action<D>> {
    if st.status.is_terminal() || st.status == Status::BudgetExhausted {
        return Some(Action::Stop);
    }
    if let Some(why) = &f.cancelled
        && st.pending.is_none()
    {
        return Some(Action::finish(Outcome::Cancelled, why.clone()));
    }
    if st.worker.is_none() {
        return Some(Action::Place);
    }
    if let Some(p) = &st.pending {
        return Some(Action::Settle(p.clone()));
    }
    // After the call is settled (and its barrier taken), before anything else runs.
    if let Some(reason) = f.disk_quota.exceeded(st.disk_bytes, st.disk_files) {
        return Some(Action::finish(Outcome::Failed, reason));
    }
    if let Some(to) = st.moving_to.clone().or_else(|| f.move_request.clone()) {
        return Some(Action::Move(to));
    }
    if !st.seed_root.is_empty() && st.barrier_version == 0 {
        return Some(Action::Seed);
    }
    None
}

/// A kind of task's decisions and the effects only it knows.
#[async_trait::async_trait]
pub trait Driver: Send {
    /// The actions only this driver performs.
    type Own: std::fmt::Debug + Send;
    /// What to do next, once [`preamble`] has nothing to do. Pure.
    fn next(&self, st: &TaskState, f: &Facts) -> Action<Self::Own>;
    /// Gets the outcome of the call in flight and logs it.
    async fn settle(
        &mut self,
        cx: &super::core::Cx<'_>,
        p: PendingCall,
    ) -> Result<(), super::error::Error>;
    /// Performs one of its own actions.
    async fn act(
        &mut self,
        cx: &super::core::Cx<'_>,
        action: Self::Own,
    ) -> Result<(), super::error::Error>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::TaskId;
    use crate::model::state::PendingCall;

    fn running(worker: &str) -> TaskState {
        let mut st = TaskState::new(TaskId(1));
        st.status = Status::Running;
        st.worker = Some(worker.into());
        st
    }

    fn pending() -> PendingCall {
        PendingCall {
            call_id: 7,
            step: 0,
            purpose: Purpose::Step,
            worker: "w".into(),
            call: ToolCall::ListFiles {
                glob: String::new(),
            },
        }
    }

    #[test]
    fn the_preamble_in_order() {
        let none = Facts::default();
        let cancel = Facts {
            cancelled: Some("cancelled by an admin".into()),
            ..Facts::default()
        };
        let moving = Facts {
            move_request: Some("v".into()),
            ..Facts::default()
        };
        let mut ended = running("w");
        ended.status = Status::Finished;
        let mut stopped = running("w");
        stopped.status = Status::BudgetExhausted;
        let mut busy = running("w");
        busy.pending = Some(pending());
        let mut unplaced = running("w");
        unplaced.worker = None;
        let mut seeded = running("w");
        seeded.seed_root = "r".into();
        let mut mid_move = running("w");
        mid_move.moving_to = Some("x".into());
        let idle = running("w");
        let quota = Facts {
            disk_quota: crate::model::ops::DiskQuota {
                bytes: 1000,
                files: 10,
            },
            move_request: Some("v".into()),
            ..Facts::default()
        };
        let mut full = running("w");
        full.disk_bytes = 1001;
        let mut full_busy = full.clone();
        full_busy.pending = Some(pending());
        let mut many = running("w");
        many.disk_files = 11;
        let over = |s: &TaskState| {
            quota
                .disk_quota
                .exceeded(s.disk_bytes, s.disk_files)
                .unwrap()
        };
        let table: Vec<(&str, &TaskState, &Facts, Option<Action>)> = vec![
            (
                "over the disk quota: stopped before a move",
                &full,
                &quota,
                Some(Action::finish(Outcome::Failed, over(&full))),
            ),
            (
                "over the disk quota with a call in flight: settle it first",
                &full_busy,
                &quota,
                Some(Action::Settle(pending())),
            ),
            (
                "over the file quota",
                &many,
                &quota,
                Some(Action::finish(Outcome::Failed, over(&many))),
            ),
            (
                "within the quota",
                &idle,
                &quota,
                Some(Action::Move("v".into())),
            ),
            ("ended", &ended, &cancel, Some(Action::Stop)),
            ("budget stop", &stopped, &none, Some(Action::Stop)),
            (
                "cancelled, nothing in flight",
                &idle,
                &cancel,
                Some(Action::finish(Outcome::Cancelled, "cancelled by an admin")),
            ),
            (
                "cancelled with a call in flight: settle it first",
                &busy,
                &cancel,
                Some(Action::Settle(pending())),
            ),
            (
                "no worker yet: placed (or queued)",
                &unplaced,
                &none,
                Some(Action::Place),
            ),
            (
                "a move asked",
                &idle,
                &moving,
                Some(Action::Move("v".into())),
            ),
            (
                "a move in the log wins over a new request",
                &mid_move,
                &moving,
                Some(Action::Move("x".into())),
            ),
            (
                "a call before a move",
                &busy,
                &moving,
                Some(Action::Settle(pending())),
            ),
            ("seed first", &seeded, &none, Some(Action::Seed)),
            ("driver decides", &idle, &none, None),
        ];
        for (name, st, f, want) in table {
            assert_eq!(preamble(st, f), want, "{name}");
        }
        let mut seeded_done = seeded.clone();
        seeded_done.barrier_version = 1;
        assert_eq!(preamble(&seeded_done, &none), None::<Action>, "seeded once");
    }
}
