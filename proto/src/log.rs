//! A task's log records as the API sends them: JSON in `TaskRecord.record`, the web API's
//! event streams and `brain task log --json`, at [`WIRE_VERSION`].
//!
//! These are the protocol's own types. The brain converts its log's records into them
//! (`brain/src/api/convert/log.rs`), so the engine's records can change without changing what
//! a client reads; a change here is a change of the protocol. The field names are those the
//! log has always had; 64-bit integers are strings ([`crate::json64`]); names from a closed
//! set (a status, a permission, ...) are plain strings, so a client shows a name a newer brain
//! sends instead of failing on it.

use serde::{Deserialize, Serialize};

/// The version of [`Record`] this crate speaks (the `v` of every record).
pub const WIRE_VERSION: u32 = 1;

/// One entry of a task's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub v: u32,
    /// `t-N`.
    pub task: String,
    #[serde(with = "crate::json64")]
    pub seq: u64,
    #[serde(with = "crate::json64")]
    pub at_ms: i64,
    #[serde(flatten)]
    pub event: Event,
}

/// A step of a scripted plan.
/// What a model request was rendered with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rendered {
    /// The version of the words it was rendered with.
    pub version: u32,
    /// SHA-256 of the request as sent, in hex.
    pub hash: String,
    /// How its tools were sent: `native`, `text` or `text_constrained`.
    pub tools: String,
    /// Whether the task could move to another machine then.
    pub can_move: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<WriteStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteStep {
    pub path: String,
    pub content: String,
    #[serde(default)]
    pub mode: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub steps: Vec<Step>,
}

/// What a task's workspace sync leaves out, besides `.gitignore`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SyncRules {
    pub include_git: bool,
    pub extra_excludes: Vec<String>,
    pub no_default_excludes: bool,
}

/// A tool call as issued.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "tool", rename_all = "snake_case")]
pub enum ToolCall {
    RunCommand {
        argv: Vec<String>,
        #[serde(with = "crate::json64")]
        timeout_ms: u64,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        cwd: String,
    },
    WriteFile {
        path: String,
        content: String,
        mode: u32,
    },
    ReadFile {
        path: String,
        start_line: u32,
        end_line: u32,
    },
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

/// A tool call's result.
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
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub limit: String,
}

/// An agent's budget (0: no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Budget {
    pub usd: f64,
    #[serde(with = "crate::json64")]
    pub tokens: u64,
    pub steps: u32,
    #[serde(with = "crate::json64")]
    pub wall_ms: u64,
}

/// An acceptance check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub command: String,
    #[serde(default, with = "crate::json64")]
    pub timeout_ms: u64,
    /// `--check` (the request), `.tether/check` (the repository), `config`, or empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protect: Vec<String>,
}

/// A secret a task's commands may use: its name, the variable that holds its placeholder,
/// and where the placeholder is replaced by the value (never the value).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Binding {
    pub name: String,
    pub env: String,
    pub hosts: Vec<String>,
    pub port: u16,
}

/// A host a task's commands may reach.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllowRule {
    pub host: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pass_through: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EgressSpec {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<Binding>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<AllowRule>,
}

/// An attempt's own sampling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    #[serde(with = "crate::json64")]
    pub seed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// How many attempts started alike with this one (their first turn asked at once).
    #[serde(default, skip_serializing_if = "is_alone")]
    pub together: u32,
}

fn is_alone(n: &u32) -> bool {
    *n <= 1
}

/// What an agent task was created with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentSpec {
    pub model: String,
    /// `read_only`, `ask`, `auto` or `full`.
    pub permission: String,
    pub budget: Budget,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_commands: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_paths: Vec<String>,
    pub repeat_limit: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub transcript: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<Check>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<Sampling>,
    /// The repository's AGENTS.md is not shown to the model (`brain run --no-agents-md`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_agents_md: bool,
    /// The names of the assists the loop gives the model; absent: all of them (a task from
    /// before they could be switched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assists: Option<Vec<String>>,
}

/// A task that runs as attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptsSpec {
    pub count: u32,
    /// `first` or `smallest`.
    pub pick: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalate: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub worker: String,
}

/// An attempt's link to its parent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptOf {
    pub parent: String,
    pub index: u32,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptEnd {
    pub status: String,
    pub verified: bool,
    pub reason: String,
    #[serde(default)]
    pub root: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub check: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub check_output: String,
    #[serde(default, with = "crate::json64")]
    pub files_changed: u64,
    #[serde(default, with = "crate::json64")]
    pub lines_changed: u64,
    #[serde(default)]
    pub steps: u32,
    #[serde(default, with = "crate::json64")]
    pub tokens: u64,
    #[serde(default)]
    pub usd: f64,
}

/// A run of the acceptance check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckRun {
    #[serde(with = "crate::json64")]
    pub call_id: u64,
    pub passed: bool,
    pub result: String,
    pub output: String,
    /// Its exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

/// A workspace entry left out of the mirror, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeftOut {
    pub path: String,
    pub reason: String,
}

/// A tool call the model asked for (`arguments` as it wrote them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolUse {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// A message of the model's conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `user`, `assistant` or `tool`.
    pub role: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolUse>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tool_call_id: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(with = "crate::json64")]
    pub prompt_tokens: u64,
    #[serde(with = "crate::json64")]
    pub completion_tokens: u64,
}

/// A fenced block of code in an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CodeBlock {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lang: String,
    pub body: String,
}

/// The model's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub message: Message,
    pub usage: Usage,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub malformed_calls: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_calls: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nudge: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub code_blocks: Vec<CodeBlock>,
}

/// Everything that can happen to a task; `brain/src/model/event.rs` says what each means.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    Created {
        goal: String,
        workspace: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        plan: Option<Plan>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<Box<AgentSpec>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        egress: Option<EgressSpec>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempts: Option<AttemptsSpec>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempt_of: Option<AttemptOf>,
    },
    StatusChanged {
        /// `created`, `queued`, `running`, `waiting`, `budget_exhausted`, `finished`,
        /// `failed`, `cancelled`, `stuck` or `stalled`.
        status: String,
        reason: String,
    },
    LlmRequest {
        model: String,
        messages: u32,
        /// How the request was rendered and sent (`brain task prompt`); absent from records
        /// logged before it was kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rendered: Option<Rendered>,
    },
    LlmResponse {
        model: String,
        #[serde(with = "crate::json64")]
        prompt_tokens: u64,
        #[serde(with = "crate::json64")]
        completion_tokens: u64,
        cost_usd: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        response: Option<Box<Response>>,
    },
    Observation {
        tool_use_id: String,
        text: String,
        failed: bool,
    },
    ContextElided {
        upto: u32,
        #[serde(with = "crate::json64")]
        bytes_saved: u64,
    },
    BudgetRaised {
        limits: Budget,
    },
    ToolCallIssued {
        #[serde(with = "crate::json64")]
        call_id: u64,
        step: u32,
        /// `step`, `check` or `acceptance`.
        purpose: String,
        worker: String,
        call: ToolCall,
    },
    ToolOutput {
        #[serde(with = "crate::json64")]
        call_id: u64,
        stdout: String,
        stderr: String,
    },
    ToolCallCompleted {
        #[serde(with = "crate::json64")]
        call_id: u64,
        result: ToolResult,
    },
    ToolCallInterrupted {
        #[serde(with = "crate::json64")]
        call_id: u64,
        reason: String,
    },
    Barrier {
        #[serde(with = "crate::json64")]
        version: u64,
        root_hash: String,
        #[serde(default, with = "crate::json64")]
        files: u64,
        #[serde(default, with = "crate::json64")]
        bytes: u64,
        #[serde(default, with = "crate::json64")]
        wire_bytes: u64,
        #[serde(default, with = "crate::json64")]
        tmp_bytes: u64,
        #[serde(default, with = "crate::json64")]
        tmp_files: u64,
    },
    LeftOut {
        worker: String,
        entries: Vec<LeftOut>,
        #[serde(default, with = "crate::json64")]
        more: u64,
    },
    EgressRefused {
        host: String,
        port: u16,
        reason: String,
    },
    AttemptStarted {
        index: u32,
        attempt: String,
        model: String,
        #[serde(default)]
        escalation: bool,
    },
    AttemptEnded {
        index: u32,
        end: AttemptEnd,
    },
    AttemptPicked {
        index: u32,
        attempt: String,
        why: String,
        root_hash: String,
        check: CheckRun,
    },
    Placement {
        require_labels: std::collections::BTreeMap<String, String>,
    },
    WorkspaceRules {
        rules: SyncRules,
    },
    WorkspaceSeeded {
        root_hash: String,
        source: String,
        #[serde(with = "crate::json64")]
        files: u64,
        #[serde(with = "crate::json64")]
        bytes: u64,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        commit: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        branch: String,
    },
    DeliveryPlanned {
        /// `none`, `branch` or `pr`.
        mode: String,
    },
    DeliveryStarted {
        mode: String,
        wip: bool,
        branch: String,
        root: String,
        commit: String,
        #[serde(with = "crate::json64")]
        date_s: i64,
    },
    DeliveryPushed {
        branch: String,
        commit: String,
    },
    PullRequestOpened {
        url: String,
        #[serde(with = "crate::json64")]
        number: u64,
    },
    Delivered {
        branch: String,
    },
    DeliveryFailed {
        reason: String,
    },
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
        #[serde(default, with = "crate::json64")]
        files: u64,
        #[serde(default, with = "crate::json64")]
        wire_bytes: u64,
    },
    ApprovalRequested {
        #[serde(with = "crate::json64")]
        approval_id: u64,
        what: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        tool_use_id: String,
    },
    ApprovalDecided {
        #[serde(with = "crate::json64")]
        approval_id: u64,
        approved: bool,
        by: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reason: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        always: bool,
    },
    BudgetUpdate {
        spent_usd: f64,
        #[serde(with = "crate::json64")]
        tokens: u64,
        steps: u32,
    },
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
    /// The instructions for agents nearest above a file the model touched, shown to it once.
    InstructionsInView {
        path: String,
        text: String,
    },
    CodeInView {
        text: String,
    },
    CheckAfterChanges {
        passed: bool,
        text: String,
    },
    ChangesUndone {
        root: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        to_start: bool,
        restored: Vec<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        left: Vec<String>,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        shown: String,
    },
    FinishedForModel {
        why: String,
    },
    ProtectedRestored {
        tool_use_id: String,
        paths: Vec<String>,
    },
    Snapshot {
        #[serde(with = "crate::json64")]
        upto: u64,
    },
    Finished {
        /// `finished`, `failed`, `cancelled`, `stuck` or `stalled`.
        outcome: String,
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verified: Option<bool>,
    },
}
