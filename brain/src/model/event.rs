//! What happens to a task, as versioned records in its append-only log. Field names are part
//! of the stored format and of `brain task log --json`: change them only with a new version.

use serde::{Deserialize, Serialize};

pub use super::task::{Status, TaskId};

/// The version of [`Record`] this code writes.
pub const RECORD_VERSION: u32 = 1;

/// One entry of a task's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub v: u32,
    pub task: TaskId,
    pub seq: u64,
    pub at_ms: i64,
    #[serde(flatten)]
    pub event: Event,
}

/// How a task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Finished,
    Failed,
    Cancelled,
    /// The agent went round in circles (the same calls, the same errors) until the guard
    /// stopped it.
    Stuck,
    /// The model stopped calling tools: it neither acted nor claimed to be done.
    Stalled,
}

/// A step of a scripted plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub struct Step {
    /// A command to run (argv), or
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<Vec<String>>,
    /// a file to write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<WriteStep>,
    /// For `run` steps: a read-only command that exits 0 if the step's effect is already in
    /// place. Used when a call was interrupted and nobody can tell whether it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<Vec<String>>,
    /// Per-step timeout, e.g. "30s" (default 10m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteStep {
    pub path: String,
    pub content: String,
    #[serde(default)]
    pub mode: Option<u32>,
}

/// A scripted plan: tool calls run in order; a failing step fails the task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub steps: Vec<Step>,
}

/// Most steps a plan may have.
pub const MAX_PLAN_STEPS: usize = 10_000;

/// Why a request's plan or sync rules are refused (the message says which step or name).
#[derive(Debug, thiserror::Error)]
pub enum Invalid {
    #[error("invalid plan: {0}")]
    PlanJson(#[source] serde_json::Error),
    #[error("invalid plan: it must have 1 to {MAX_PLAN_STEPS} steps, it has {0}")]
    PlanLength(usize),
    #[error(
        "invalid plan: step {0} must have exactly one of a non-empty \"run\" or a \"write\" (and \"check\" only with \"run\")"
    )]
    PlanStep(usize),
    #[error("invalid plan: step {step}: {source}")]
    PlanTimeout {
        step: usize,
        #[source]
        source: shared::ParseError,
    },
    #[error("at most 64 excludes")]
    TooManyExcludes,
    #[error("invalid exclude {0:?}: give a file or directory name, like target")]
    Exclude(String),
}

impl Plan {
    /// Parses and checks a plan from JSON, saying which step is wrong.
    pub fn parse(json: &str) -> Result<Self, Invalid> {
        let plan: Plan = serde_json::from_str(json).map_err(Invalid::PlanJson)?;
        if plan.steps.is_empty() || plan.steps.len() > MAX_PLAN_STEPS {
            return Err(Invalid::PlanLength(plan.steps.len()));
        }
        for (i, s) in plan.steps.iter().enumerate() {
            match (&s.run, &s.write) {
                (Some(argv), None) if !argv.is_empty() => {}
                (None, Some(_)) if s.check.is_none() => {}
                _ => return Err(Invalid::PlanStep(i)),
            }
            if let Some(t) = &s.timeout {
                shared::parse_duration(t)
                    .map_err(|source| Invalid::PlanTimeout { step: i, source })?;
            }
        }
        Ok(plan)
    }
}

/// What a task's workspace sync leaves out, besides `.gitignore`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRules {
    /// `.git/` is part of the workspace.
    #[serde(default)]
    pub include_git: bool,
    /// Names excluded wherever they are, on top of the defaults (or instead of them).
    #[serde(default)]
    pub extra_excludes: Vec<String>,
    #[serde(default)]
    pub no_default_excludes: bool,
}

impl SyncRules {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The scanner's rules these make.
    pub fn to_rules(&self) -> shared::manifest::Rules {
        let mut r = shared::manifest::Rules {
            include_git: self.include_git,
            ..Default::default()
        };
        if self.no_default_excludes {
            r.excludes.clear();
        }
        r.excludes.extend(self.extra_excludes.iter().cloned());
        r
    }

    /// Checks rules from a request: plain names only, a bounded number.
    pub fn check(&self) -> Result<(), Invalid> {
        if self.extra_excludes.len() > 64 {
            return Err(Invalid::TooManyExcludes);
        }
        for e in &self.extra_excludes {
            if e.is_empty() || e.len() > 255 || e.contains(['/', '\0']) || e == "." || e == ".." {
                return Err(Invalid::Exclude(e.clone()));
            }
        }
        Ok(())
    }
}

/// Why a call was issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// The step itself.
    Step,
    /// The step's check, after the step was interrupted.
    Check,
    /// The task's acceptance check: the brain's test of a `finish`, or the first look at the
    /// workspace before the model starts.
    Acceptance,
}

/// A tool call as logged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "tool", rename_all = "snake_case")]
pub enum ToolCall {
    RunCommand {
        argv: Vec<String>,
        timeout_ms: u64,
        /// Workspace-relative directory to start in; empty: the workspace root.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        cwd: String,
    },
    WriteFile {
        path: String,
        content: String,
        mode: u32,
    },
    /// Lines `start_line..=end_line` (1-based; 0: from the start / to the end).
    ReadFile {
        path: String,
        start_line: u32,
        end_line: u32,
    },
    /// Replaces the one occurrence of `old` with `new`.
    EditFile {
        path: String,
        old: String,
        new: String,
    },
    ListFiles {
        glob: String,
    },
    Search {
        pattern: String,
        glob: String,
    },
}

impl ToolCall {
    /// Whether it only reads the workspace (no barrier needed after it).
    pub fn is_read_only(&self) -> bool {
        matches!(
            self,
            ToolCall::ReadFile { .. } | ToolCall::ListFiles { .. } | ToolCall::Search { .. }
        )
    }
}

/// A tool call's result as logged.
/// What a model request was rendered with, beside the task's state at its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rendered {
    /// The renderer's version (`prompt::VERSION`) that wrote its words.
    pub version: u32,
    /// `prompt::hash` of the request as sent.
    pub hash: String,
    /// How its tools were sent.
    pub tools: crate::llm::ToolsSent,
    /// Whether the task could move to another machine then (the one input of the request
    /// that is not the task's state).
    pub can_move: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default)]
    pub timed_out: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// The sandbox limit that ended or hampered the command, in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub limit: String,
}

impl ToolResult {
    pub fn ok(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out && self.error.is_empty()
    }
}

/// A result in words, for failure reasons.
pub fn describe_result(r: &ToolResult) -> String {
    let how = describe_exit(r);
    if r.limit.is_empty() {
        how
    } else {
        format!("{how}; {}", r.limit)
    }
}

fn describe_exit(r: &ToolResult) -> String {
    if !r.error.is_empty() {
        r.error.clone()
    } else if r.timed_out {
        "timed out".into()
    } else if let Some(c) = r.exit_code {
        format!("exit code {c}")
    } else if let Some(s) = r.signal {
        format!("killed by signal {s}")
    } else {
        "no exit status".into()
    }
}

/// Everything that can happen to a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    Created {
        goal: String,
        workspace: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        plan: Option<Plan>,
        /// An agent task: model, permission, budgets (fixed when the task is created).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<Box<crate::model::agent::AgentSpec>>,
        /// A scripted plan's egress policy (an agent's is in its spec), fixed at creation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        egress: Option<crate::model::egress::EgressSpec>,
        /// The task runs as attempts, each a task of its own (`agent` is what they run).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempts: Option<crate::model::attempt::AttemptsSpec>,
        /// The task is an attempt of another.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempt_of: Option<crate::model::attempt::AttemptOf>,
    },
    /// Running, or waiting (for a worker, an approval, budget) with the reason. A status this
    /// code does not know is a record it cannot decode.
    StatusChanged {
        status: Status,
        reason: String,
    },
    LlmRequest {
        model: String,
        messages: u32,
        /// How the request was rendered and sent (absent from records logged before it was
        /// kept): what `brain task prompt` needs to show it again and to tell it is exact.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rendered: Option<Rendered>,
    },
    LlmResponse {
        model: String,
        prompt_tokens: u64,
        completion_tokens: u64,
        cost_usd: f64,
        /// What the model said: the conversation is rebuilt from these after a crash, so
        /// an answered request is never sent again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        response: Option<Box<crate::llm::Response>>,
    },
    /// What the agent was told about one of the model's tool calls.
    Observation {
        tool_use_id: String,
        text: String,
        /// The call failed (non-zero exit, error, refusal): counted by the repeat guard.
        failed: bool,
    },
    /// Old tool outputs in the first `upto` messages were replaced by a note to fit the
    /// model's context window.
    ContextElided {
        upto: u32,
        bytes_saved: u64,
    },
    /// A stopped task got more budget: the new totals.
    BudgetRaised {
        limits: crate::model::agent::Budget,
    },
    /// Appended and flushed before the call is sent.
    ToolCallIssued {
        call_id: u64,
        step: u32,
        purpose: Purpose,
        worker: String,
        call: ToolCall,
    },
    /// Captured output of a call (capped), appended before its completion.
    ToolOutput {
        call_id: u64,
        stdout: String,
        stderr: String,
    },
    ToolCallCompleted {
        call_id: u64,
        result: ToolResult,
    },
    /// Nobody can say what the call did; it is never silently re-run.
    ToolCallInterrupted {
        call_id: u64,
        reason: String,
    },
    /// The brain's mirror equals the worker's disk as of this record (root hash checked).
    Barrier {
        version: u64,
        root_hash: String,
        #[serde(default)]
        files: u64,
        #[serde(default)]
        bytes: u64,
        /// Compressed bytes that crossed the wire for it.
        #[serde(default)]
        wire_bytes: u64,
        /// What the workspace's temp dir held (bytes of its files, and its entries).
        #[serde(default)]
        tmp_bytes: u64,
        #[serde(default)]
        tmp_files: u64,
    },
    /// Entries of the workspace its worker left out of the mirror (a FIFO, a name that is not
    /// UTF-8, ...), each named once; `more` were left out too but not named.
    LeftOut {
        worker: String,
        entries: Vec<shared::manifest::LeftOut>,
        #[serde(default)]
        more: u64,
    },
    /// A connection a command opened through the egress proxy was refused (off the
    /// allow-list, a method not allowed, a placeholder not valid there).
    EgressRefused {
        host: String,
        port: u16,
        reason: String,
    },
    /// An attempt began: a task of its own, from this task's base.
    AttemptStarted {
        index: u32,
        /// The attempt's own task (`task` names the record's).
        attempt: TaskId,
        model: String,
        /// Started because the attempts before it all failed.
        #[serde(default)]
        escalation: bool,
    },
    /// An attempt ended (or stopped for its budget).
    AttemptEnded {
        index: u32,
        end: crate::model::attempt::AttemptEnd,
    },
    /// An attempt won: this task's result is its last workspace, and the check's run on it.
    AttemptPicked {
        index: u32,
        attempt: TaskId,
        why: String,
        root_hash: String,
        check: super::check::CheckRun,
    },
    /// Labels a worker must have to take this task (placement, moves and failover).
    Placement {
        require_labels: std::collections::BTreeMap<String, String>,
    },
    /// What the task's workspace sync leaves out, when not the defaults.
    WorkspaceRules {
        rules: SyncRules,
    },
    /// The task starts from this workspace (stored in the mirror): materialised on its
    /// worker before its first call.
    WorkspaceSeeded {
        root_hash: String,
        source: String,
        files: u64,
        bytes: u64,
        /// A git import: the commit imported and the branch it was on (`source` is the
        /// repository's URL without userinfo).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        commit: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        branch: String,
    },
    /// The task's result is to be delivered this way when it finishes.
    DeliveryPlanned {
        mode: super::delivery::Mode,
    },
    /// A delivery began: the commit it makes of workspace `root` (author date `date_s`) and
    /// the branch it pushes it to.
    DeliveryStarted {
        mode: super::delivery::Mode,
        wip: bool,
        branch: String,
        root: String,
        commit: String,
        date_s: i64,
    },
    DeliveryPushed {
        branch: String,
        commit: String,
    },
    PullRequestOpened {
        url: String,
        number: u64,
    },
    Delivered {
        branch: String,
    },
    DeliveryFailed {
        reason: String,
    },
    /// A move could not complete; the task stays where it was.
    MoveAborted {
        to: String,
        reason: String,
    },
    WorkerAssigned {
        worker: String,
    },
    MoveStarted {
        from: String,
        to: String,
    },
    MoveCompleted {
        to: String,
        /// Files the target wrote, and the compressed bytes sent to it.
        #[serde(default)]
        files: u64,
        #[serde(default)]
        wire_bytes: u64,
    },
    ApprovalRequested {
        approval_id: u64,
        what: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        tool_use_id: String,
    },
    ApprovalDecided {
        approval_id: u64,
        approved: bool,
        by: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reason: String,
        /// Approved for this command (or file) from now on: the same call is not asked again
        /// in this task.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        always: bool,
    },
    BudgetUpdate {
        spent_usd: f64,
        tokens: u64,
        steps: u32,
    },
    /// What the agent's workspace held before the model's first turn: its files (capped,
    /// `.gitignore`-aware), and the head of its README. Shown to the model with the goal.
    Surveyed {
        files: Vec<String>,
        #[serde(default)]
        truncated: bool,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        readme_path: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        readme: String,
        /// The repository's instructions for agents: its root `AGENTS.md` (or `CLAUDE.md`
        /// where there is none), bounded; empty when there is none or the task turned it off.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        agents_md_path: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        agents_md: String,
    },
    /// The instructions for agents nearest above a file the model's last call touched
    /// (`path`, such as `crates/x/AGENTS.md`; the root's are in [`Event::Surveyed`]),
    /// bounded and masked: shown to the model after that call's result, once.
    InstructionsInView {
        path: String,
        text: String,
    },
    /// The code the check's first (failing) run points at, or a small workspace's files
    /// whole: shown to the model with the goal.
    CodeInView {
        text: String,
    },
    /// The acceptance check ran after the model changed files (its run is the call before
    /// this record): what the model is told, with the code a failure points at.
    CheckAfterChanges {
        passed: bool,
        text: String,
    },
    /// The acceptance check failed on changes made after it had passed (or, `to_start`, the
    /// model stopped making progress on changes it never passed on): they were undone.
    /// `restored` were written back as they were at `root` (where it passed; their text,
    /// as the model is shown it, in `shown`); `left` were made since and stay (no file is
    /// deleted).
    ChangesUndone {
        root: String,
        /// Back to the task's start (the model stopped making progress on its own failed
        /// changes), not to a version the check passed on.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        to_start: bool,
        restored: Vec<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        left: Vec<String>,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        shown: String,
    },
    /// The model stopped (`why`: stuck, stalled, out of steps) with the workspace as the
    /// acceptance check last passed on it: the brain calls `finish` in its place.
    FinishedForModel {
        why: String,
    },
    /// The files the acceptance check relies on were put back as the task started, before
    /// the check runs for the `finish` call `tool_use_id`.
    ProtectedRestored {
        tool_use_id: String,
        paths: Vec<String>,
    },
    /// A snapshot of the state up to and including `upto` was stored.
    Snapshot {
        upto: u64,
    },
    Finished {
        outcome: Outcome,
        reason: String,
        /// For an agent task that finished: whether its acceptance check passed on the final
        /// workspace (`false`: it has no check).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verified: Option<bool>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_have_stable_json() {
        let r = Record {
            v: RECORD_VERSION,
            task: TaskId(7),
            seq: 3,
            at_ms: 1000,
            event: Event::ToolCallCompleted {
                call_id: 9,
                result: ToolResult {
                    exit_code: Some(0),
                    ..Default::default()
                },
            },
        };
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(
            json,
            r#"{"v":1,"task":"t-7","seq":3,"at_ms":1000,"kind":"tool_call_completed","call_id":9,"result":{"exit_code":0,"timed_out":false}}"#
        );
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), r);
    }

    #[test]
    fn a_task_id_and_its_workspace_name_round_trip() {
        assert_eq!(TaskId(12).workspace(), "task-12");
        assert_eq!(TaskId::from_workspace("task-12"), Some(TaskId(12)));
        for other in ["default", "task-", "task-x", "task-012", "task-+1", "t-12"] {
            assert_eq!(TaskId::from_workspace(other), None, "{other}");
        }
        assert_eq!("t-7".parse::<TaskId>(), Ok(TaskId(7)));
        assert_eq!("7".parse::<TaskId>(), Ok(TaskId(7)));
    }

    #[test]
    fn statuses_keep_their_stored_names_and_unknown_ones_do_not_decode() {
        let r = Record {
            v: RECORD_VERSION,
            task: TaskId(1),
            seq: 1,
            at_ms: 0,
            event: Event::StatusChanged {
                status: Status::BudgetExhausted,
                reason: "r".into(),
            },
        };
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains(r#""status":"budget_exhausted""#), "{json}");
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), r);
        let bad = json.replace("budget_exhausted", "on_holiday");
        assert!(serde_json::from_str::<Record>(&bad).is_err());
    }

    #[test]
    fn plans_are_checked_step_by_step() {
        assert!(
            Plan::parse(r#"{"steps":[{"run":["true"]},{"write":{"path":"a","content":"x"}}]}"#)
                .is_ok()
        );
        let e = Plan::parse(r#"{"steps":[{"run":["true"]},{"run":[]}]}"#).unwrap_err();
        assert!(e.to_string().contains("step 1"), "{e}");
        assert!(Plan::parse(r#"{"steps":[]}"#).is_err());
        assert!(Plan::parse(r#"{"steps":[{"run":["x"],"bogus":1}]}"#).is_err());
        assert!(Plan::parse(r#"{"steps":[{"run":["x"],"timeout":"soon"}]}"#).is_err());
    }
}
