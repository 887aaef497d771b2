//! A task's state as a pure function of its log: `apply(state, record)` has no I/O and no
//! clock, so replay after a crash reaches exactly the state the task had.

use serde::{Deserialize, Serialize};

use super::event::{Event, Outcome, Plan, Purpose, Record, TaskId, ToolCall};
use crate::model::agent::{AgentState, Approval};

pub use super::event::Status;

pub use super::agent::CheckRun;

/// Most of a check's output kept in the state.
const CHECK_OUTPUT: usize = 4096;

/// A call that was issued and has no outcome in the log yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    pub call_id: u64,
    pub step: u32,
    pub purpose: Purpose,
    pub worker: String,
    pub call: ToolCall,
}

/// Everything the brain knows about a task, rebuilt from its log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskState {
    pub v: u32,
    pub id: TaskId,
    pub goal: String,
    pub workspace: String,
    pub plan: Option<Plan>,
    pub status: Status,
    /// Why the task waits, failed or was cancelled.
    pub reason: String,
    pub worker: Option<String>,
    /// The next plan step to run.
    pub next_step: u32,
    pub pending: Option<PendingCall>,
    /// A step whose call was interrupted and whose effect must be checked before going on.
    pub unsure_step: Option<u32>,
    /// Checks in a row that failed to give an answer (timed out, killed, refused).
    #[serde(default)]
    pub check_errors: u32,
    /// Set when a step's call completed unsuccessfully: why the task must fail.
    pub step_failed: Option<String>,
    /// Ids of the latest calls with an outcome in the log (bounded), to acknowledge results
    /// a worker replays after they were already logged.
    pub recent_calls: std::collections::VecDeque<u64>,
    pub calls_completed: u64,
    pub calls_interrupted: u64,
    /// Sequence number of the latest stored snapshot.
    pub snapshot_seq: u64,
    /// The latest barrier: its version and the root hash of the mirror's manifest.
    #[serde(default)]
    pub barrier_version: u64,
    #[serde(default)]
    pub barrier_root: String,
    /// What the workspace and its temp dir held at the latest barrier: bytes of files, and
    /// entries (for the disk quota).
    #[serde(default)]
    pub disk_bytes: u64,
    #[serde(default)]
    pub disk_files: u64,
    /// A move that started and has not completed or aborted: the target worker.
    #[serde(default)]
    pub moving_to: Option<String>,
    /// Calls that may have changed the workspace since the last barrier, and the first plan
    /// step among them: a failover from the last barrier loses their effects.
    #[serde(default)]
    pub unsynced_calls: u32,
    #[serde(default)]
    pub first_unsynced_step: Option<u32>,
    /// The unsure step was interrupted after the last barrier.
    #[serde(default)]
    pub unsure_unsynced: bool,
    /// The workspace the task starts from (a manifest root in the mirror), if any.
    #[serde(default)]
    pub seed_root: String,
    #[serde(default)]
    pub sync_rules: super::event::SyncRules,
    /// Labels a worker must have to take the task.
    #[serde(default)]
    pub require_labels: std::collections::BTreeMap<String, String>,
    /// The last run of the task's acceptance check, if it has one and it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check: Option<CheckRun>,
    /// Agent tasks: the conversation, budgets and what waits for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Box<crate::model::agent::AgentState>>,
    /// A task run as attempts: each attempt and how it ended, and the winner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Box<crate::model::attempts::Attempts>>,
    /// An attempt: the task it is an attempt of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_of: Option<crate::model::attempts::AttemptOf>,
    /// Scripted plans: their commands' egress policy (an agent's is in its spec; the
    /// engine's `effects::egress_spec` reads either).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_egress: Option<crate::model::egress::EgressSpec>,
    /// A git import: where the task's repository stands, for its delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<super::delivery::Origin>,
    /// Moves completed (a person's, failovers, `request_environment`).
    #[serde(default)]
    pub moves: u32,
    /// How the task is delivered when it finishes.
    #[serde(default)]
    pub deliver: super::delivery::Mode,
    /// The latest delivery, if any began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<super::delivery::Delivery>,
    pub last_seq: u64,
    pub created_ms: i64,
    pub updated_ms: i64,
}

impl TaskState {
    pub fn new(id: TaskId) -> Self {
        Self {
            v: 1,
            id,
            goal: String::new(),
            workspace: String::new(),
            plan: None,
            status: Status::Created,
            reason: String::new(),
            worker: None,
            next_step: 0,
            pending: None,
            unsure_step: None,
            check_errors: 0,
            step_failed: None,
            recent_calls: Default::default(),
            calls_completed: 0,
            calls_interrupted: 0,
            snapshot_seq: 0,
            barrier_version: 0,
            barrier_root: String::new(),
            disk_bytes: 0,
            disk_files: 0,
            moving_to: None,
            unsynced_calls: 0,
            first_unsynced_step: None,
            unsure_unsynced: false,
            seed_root: String::new(),
            sync_rules: Default::default(),
            require_labels: Default::default(),
            last_check: None,
            agent: None,
            attempts: None,
            attempt_of: None,
            plan_egress: None,
            origin: None,
            moves: 0,
            deliver: Default::default(),
            delivery: None,
            last_seq: 0,
            created_ms: 0,
            updated_ms: 0,
        }
    }

    /// Whether the task ended as `finished` with its acceptance check passing on the final
    /// workspace. A task without a check is finished but unverified.
    pub fn verified(&self) -> bool {
        self.status == Status::Finished && self.last_check.as_ref().is_some_and(|c| c.passed)
    }

    /// The acceptance check the task carries, if any.
    pub fn check(&self) -> Option<&crate::model::agent::Check> {
        match &self.attempts {
            Some(a) => a.template.check.as_ref(),
            None => self.agent.as_ref().and_then(|a| a.spec.check.as_ref()),
        }
    }

    pub fn steps_total(&self) -> u32 {
        self.plan.as_ref().map_or(0, |p| p.steps.len() as u32)
    }
}

/// Applies one record. Records at or below `last_seq` are ignored, so replaying an overlap
/// between a snapshot and the tail is harmless.
pub fn apply(st: &mut TaskState, rec: &Record) {
    if rec.seq <= st.last_seq && st.last_seq != 0 {
        return;
    }
    st.last_seq = rec.seq;
    st.updated_ms = rec.at_ms;
    match &rec.event {
        Event::Created { .. } => created(st, rec),
        Event::AttemptStarted { .. } | Event::AttemptEnded { .. } | Event::AttemptPicked { .. } => {
            attempt_event(st, &rec.event)
        }
        Event::StatusChanged { status, reason } => {
            // Only `Finished` ends a task; a status change names a live status.
            if !st.status.is_terminal() && !status.is_terminal() {
                st.status = *status;
                st.reason = reason.clone();
            }
        }
        Event::ToolCallIssued {
            call_id,
            step,
            purpose,
            worker,
            call,
        } => {
            st.pending = Some(PendingCall {
                call_id: *call_id,
                step: *step,
                purpose: *purpose,
                worker: worker.clone(),
                call: call.clone(),
            });
        }
        Event::ToolCallCompleted { call_id, result } => call_completed(st, *call_id, result),
        Event::ToolCallInterrupted { call_id, .. } => {
            if let Some(p) = st.pending.take_if(|p| p.call_id == *call_id) {
                st.calls_interrupted += 1;
                remember(st, *call_id);
                st.unsure_step = Some(p.step);
                st.unsure_unsynced = true;
            }
        }
        Event::ToolOutput {
            call_id,
            stdout,
            stderr,
        } => check_output(st, *call_id, stdout, stderr),
        Event::WorkerAssigned { worker } => {
            st.worker = Some(worker.clone());
        }
        Event::MoveStarted { to, .. } => st.moving_to = Some(to.clone()),
        Event::MoveAborted { .. } => st.moving_to = None,
        Event::MoveCompleted { to, .. } => move_completed(st, to),
        Event::WorkspaceSeeded { .. } => seeded(st, &rec.event),
        Event::WorkspaceRules { rules } => st.sync_rules = rules.clone(),
        Event::Placement { require_labels } => st.require_labels = require_labels.clone(),
        Event::Barrier {
            version,
            root_hash,
            files,
            bytes,
            tmp_bytes,
            tmp_files,
            ..
        } => {
            st.barrier_version = *version;
            st.barrier_root = root_hash.clone();
            if let Some(a) = &mut st.agent {
                a.on_barrier(root_hash);
            }
            st.disk_bytes = bytes + tmp_bytes;
            st.disk_files = files + tmp_files;
            st.unsynced_calls = 0;
            st.first_unsynced_step = None;
            st.unsure_unsynced = false;
        }
        Event::DeliveryPlanned { mode } => st.deliver = *mode,
        Event::DeliveryStarted { .. }
        | Event::DeliveryPushed { .. }
        | Event::PullRequestOpened { .. }
        | Event::Delivered { .. }
        | Event::DeliveryFailed { .. } => delivery_event(st, &rec.event),
        Event::Finished {
            outcome, reason, ..
        } => {
            st.status = match outcome {
                Outcome::Finished => Status::Finished,
                Outcome::Failed => Status::Failed,
                Outcome::Cancelled => Status::Cancelled,
                Outcome::Stuck => Status::Stuck,
                Outcome::Stalled => Status::Stalled,
            };
            st.reason = reason.clone();
            st.pending = None;
        }
        Event::Snapshot { upto } => st.snapshot_seq = *upto,
        Event::LlmRequest { .. }
        | Event::LlmResponse { .. }
        | Event::Observation { .. }
        | Event::ContextElided { .. }
        | Event::BudgetRaised { .. }
        | Event::ApprovalRequested { .. }
        | Event::ApprovalDecided { .. }
        | Event::Surveyed { .. }
        | Event::CodeInView { .. }
        | Event::InstructionsInView { .. }
        | Event::CheckAfterChanges { .. }
        | Event::ChangesUndone { .. }
        | Event::FinishedForModel { .. }
        | Event::ProtectedRestored { .. } => {
            if let Some(a) = &mut st.agent {
                agent_event(a, rec);
            }
        }
        Event::BudgetUpdate { .. } | Event::LeftOut { .. } | Event::EgressRefused { .. } => {}
    }
}

fn created(st: &mut TaskState, rec: &Record) {
    let Event::Created {
        goal,
        workspace,
        plan,
        agent,
        egress,
        attempts,
        attempt_of,
    } = &rec.event
    else {
        return;
    };
    st.goal = goal.clone();
    st.workspace = workspace.clone();
    st.plan = plan.clone();
    st.plan_egress = egress.clone();
    st.created_ms = rec.at_ms;
    st.attempt_of = *attempt_of;
    // A task run as attempts is no agent itself: its attempts run the spec.
    match (attempts, agent) {
        (Some(spec), Some(template)) => {
            st.attempts = Some(Box::new(crate::model::attempts::Attempts::new(
                spec.clone(),
                (**template).clone(),
            )));
        }
        _ => {
            st.agent = agent
                .as_ref()
                .map(|spec| Box::new(AgentState::new((**spec).clone(), goal, rec.at_ms)));
        }
    }
}

/// The records of a task run as attempts: one started, one ended, the winner picked.
fn attempt_event(st: &mut TaskState, event: &Event) {
    match event {
        Event::AttemptStarted {
            index,
            attempt,
            model,
            escalation,
        } => {
            if let Some(a) = &mut st.attempts {
                a.on_started(crate::model::attempts::Attempt {
                    index: *index,
                    task: *attempt,
                    model: model.clone(),
                    escalation: *escalation,
                    end: None,
                });
            }
        }
        Event::AttemptEnded { index, end } => {
            if let Some(a) = &mut st.attempts {
                a.on_ended(*index, end.clone());
            }
        }
        Event::AttemptPicked {
            index,
            attempt,
            why,
            root_hash,
            check,
        } => {
            if let Some(a) = &mut st.attempts {
                a.picked = Some(crate::model::attempts::Picked {
                    index: *index,
                    task: *attempt,
                    why: why.clone(),
                });
            }
            // The winner's result is this task's.
            st.barrier_root = root_hash.clone();
            st.last_check = Some(check.clone());
        }
        _ => {}
    }
}

fn call_completed(st: &mut TaskState, call_id: u64, result: &super::event::ToolResult) {
    let Some(p) = st.pending.take_if(|p| p.call_id == call_id) else {
        return;
    };
    st.calls_completed += 1;
    remember(st, call_id);
    if !p.call.is_read_only() {
        // Its effect is on the worker's disk only until the next barrier.
        st.unsynced_calls += 1;
        if p.purpose == Purpose::Step {
            st.first_unsynced_step.get_or_insert(p.step);
        }
    }
    match p.purpose {
        Purpose::Acceptance => {
            let mut run = st
                .last_check
                .take()
                .filter(|c| c.call_id == call_id)
                .unwrap_or_default();
            run.call_id = call_id;
            run.passed = result.ok();
            run.result = describe(result);
            run.exit_code = result.exit_code;
            if let Some(a) = &mut st.agent {
                a.on_check_run(&run);
            }
            st.last_check = Some(run);
        }
        Purpose::Step if result.ok() => st.next_step = p.step + 1,
        Purpose::Step => {
            st.step_failed = Some(format!("step {} failed: {}", p.step, describe(result)));
        }
        Purpose::Check => {
            if result.ok() {
                st.unsure_step = None;
                st.check_errors = 0;
                st.next_step = p.step + 1;
            } else if result.exit_code.is_some_and(|c| c != 0)
                && !result.timed_out
                && result.error.is_empty()
            {
                // A clean "no": the effect is not there; run the step again.
                st.unsure_step = None;
                st.check_errors = 0;
            } else {
                // The check itself failed (timeout, signal, refusal): still unsure.
                st.check_errors += 1;
            }
        }
    }
}

/// The acceptance check's output, kept while it runs (its result comes with the completion).
fn check_output(st: &mut TaskState, call_id: u64, stdout: &str, stderr: &str) {
    if !st
        .pending
        .as_ref()
        .is_some_and(|p| p.call_id == call_id && p.purpose == Purpose::Acceptance)
    {
        return;
    }
    let both = match (stdout.is_empty(), stderr.is_empty()) {
        (_, true) => stdout.to_string(),
        (true, false) => stderr.to_string(),
        (false, false) => format!("{stdout}\n{stderr}"),
    };
    st.last_check = Some(CheckRun {
        call_id,
        output: super::text::head_tail(&both, CHECK_OUTPUT),
        ..CheckRun::default()
    });
}

fn move_completed(st: &mut TaskState, to: &str) {
    st.moving_to = None;
    st.moves += 1;
    let from = st.worker.replace(to.to_string()).unwrap_or_default();
    // The target holds the last barrier: what ran after it (the source died before
    // it could be synced) is not there. Plans run those steps again from the first;
    // the agent is told.
    let lost = std::mem::take(&mut st.unsynced_calls);
    if let Some(k) = st.first_unsynced_step.take() {
        st.next_step = st.next_step.min(k);
    }
    // An interrupted step that ran after the last barrier left nothing on the
    // target: it simply runs again there.
    if std::mem::take(&mut st.unsure_unsynced)
        && let Some(u) = st.unsure_step.take()
    {
        st.next_step = st.next_step.min(u);
        st.check_errors = 0;
    }
    if let Some(a) = &mut st.agent {
        a.on_moved(&from, to, lost);
    }
}

fn seeded(st: &mut TaskState, event: &Event) {
    let Event::WorkspaceSeeded {
        root_hash,
        source,
        commit,
        branch,
        files,
        bytes,
    } = event
    else {
        return;
    };
    st.seed_root = root_hash.clone();
    if let Some(a) = &mut st.attempts {
        a.base_source = source.clone();
        a.base_files = *files;
        a.base_bytes = *bytes;
    }
    if !commit.is_empty() {
        st.origin = Some(super::delivery::Origin {
            url: source.clone(),
            commit: commit.clone(),
            branch: branch.clone(),
        });
    }
}

/// The records of a delivery: started, pushed, a pull request opened, done or failed.
fn delivery_event(st: &mut TaskState, event: &Event) {
    match event {
        Event::DeliveryStarted {
            mode,
            wip,
            branch,
            root,
            commit,
            date_s,
        } => {
            st.delivery = Some(super::delivery::Delivery {
                mode: *mode,
                wip: *wip,
                branch: branch.clone(),
                root: root.clone(),
                commit: commit.clone(),
                date_s: *date_s,
                ..Default::default()
            })
        }
        Event::DeliveryPushed { .. } => {
            if let Some(d) = &mut st.delivery {
                d.pushed = true;
            }
        }
        Event::PullRequestOpened { url, number } => {
            if let Some(d) = &mut st.delivery {
                d.pr_url = url.clone();
                d.pr_number = *number;
            }
        }
        Event::Delivered { .. } => {
            if let Some(d) = &mut st.delivery {
                d.done = true;
            }
        }
        Event::DeliveryFailed { reason } => {
            // Also when it failed before it could start (no commit could be made).
            let d = st.delivery.get_or_insert_with(Default::default);
            d.done = true;
            d.error = reason.clone();
        }
        _ => {}
    }
}

/// The records only an agent task's reasoning state follows.
fn agent_event(a: &mut AgentState, rec: &Record) {
    match &rec.event {
        Event::LlmRequest { .. } => a.awaiting_llm = true,
        Event::LlmResponse {
            response: Some(r),
            cost_usd,
            ..
        } => a.on_response(r, *cost_usd),
        Event::Observation {
            tool_use_id,
            text,
            failed,
        } => a.on_observation(tool_use_id, text, *failed),
        Event::ContextElided { upto, .. } => a.elide(*upto),
        Event::BudgetRaised { limits } => {
            a.limits = *limits;
            a.wall_start_ms = rec.at_ms;
        }
        Event::ApprovalRequested {
            approval_id,
            what,
            tool_use_id,
        } => {
            a.approvals_asked = *approval_id;
            a.approval = Some(Approval {
                id: *approval_id,
                tool_use_id: tool_use_id.clone(),
                what: what.clone(),
                decision: None,
            });
        }
        Event::ApprovalDecided {
            approval_id,
            approved,
            by,
            reason,
            always,
        } => {
            if *approved && *always {
                crate::model::tools::approve_always(a, *approval_id);
            }
            if let Some(p) = a
                .approval
                .as_mut()
                .filter(|p| p.id == *approval_id && p.decision.is_none())
            {
                p.decision = Some((*approved, by.clone(), reason.clone()));
            }
        }
        Event::Surveyed {
            files,
            truncated,
            readme_path,
            readme,
            agents_md_path,
            agents_md,
        } => a.on_surveyed(
            files,
            *truncated,
            (readme_path, readme),
            (agents_md_path, agents_md),
        ),
        Event::CodeInView { text } => a.on_code_in_view(text),
        Event::InstructionsInView { path, text } => a.on_instructions_in_view(path, text),
        Event::CheckAfterChanges { text, .. } => a.on_check_after_changes(text),
        Event::ChangesUndone {
            restored,
            left,
            shown,
            to_start,
            ..
        } => {
            if *to_start {
                a.on_restarted(restored, left, shown);
            } else {
                a.on_changes_undone(restored, left, shown);
            }
        }
        Event::FinishedForModel { why } => a.on_concluded(why),
        Event::ProtectedRestored { tool_use_id, .. } => {
            a.restored_for = Some(tool_use_id.clone());
        }
        _ => {}
    }
}

/// How many recent call ids a task remembers.
const RECENT_CALLS: usize = 64;

fn remember(st: &mut TaskState, call_id: u64) {
    st.recent_calls.push_back(call_id);
    while st.recent_calls.len() > RECENT_CALLS {
        st.recent_calls.pop_front();
    }
}

/// A result in words, for failure reasons.
pub use super::event::describe_result as describe;

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
