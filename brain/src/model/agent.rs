//! The agent: a tool-calling loop (think → act → observe) that lives in the brain and acts
//! only through the task's worker. Everything it knows is rebuilt from the task's log: the
//! conversation, what it has spent, which call waits for a person. See [`run`] for the loop
//! and [`tools`] for what the model may call.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::llm::{Message, Role, ToolUse};

pub use super::assists::{Assist, Assists};
pub use super::check::{CHECK_FILE, Check, CheckRun, check_from_file, is_protected};
use super::prompt::words;
pub use super::stuck::{Loop, Turn};
use super::stuck::{NOTE_MARK, RECENT_TURNS, detect, obs_hash};

/// What a task may do without asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Permission {
    /// Read tools only.
    ReadOnly,
    /// Every mutating call waits for `brain approve` / `brain deny`.
    #[default]
    Ask,
    /// Commands and paths on the configured allow-lists run; anything else asks.
    Auto,
    /// Everything runs.
    Full,
}

impl std::str::FromStr for Permission {
    type Err = super::word::UnknownWord;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "read-only" | "readonly" => Ok(Permission::ReadOnly),
            "ask" => Ok(Permission::Ask),
            "auto" => Ok(Permission::Auto),
            "full" => Ok(Permission::Full),
            _ => Err(Self::Err::new(
                "permission",
                s,
                "read-only, ask, auto or full",
            )),
        }
    }
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Permission::ReadOnly => "read-only",
            Permission::Ask => "ask",
            Permission::Auto => "auto",
            Permission::Full => "full",
        })
    }
}

/// Limits of a task; 0 means no limit on that measure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    #[serde(default)]
    pub usd: f64,
    #[serde(default)]
    pub tokens: u64,
    #[serde(default)]
    pub steps: u32,
    #[serde(default)]
    pub wall_ms: u64,
}

/// What an agent task was created with; fixed for its life, so a config change never
/// changes a running task's rules.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentSpec {
    /// e.g. `openai:gpt-4.1`, `anthropic:claude-sonnet-4-5`, `replay:demo`.
    pub model: String,
    pub permission: Permission,
    pub budget: Budget,
    /// `auto`: command patterns (globs over the whole command line) that run unasked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_commands: Vec<String>,
    /// `auto`: path patterns that may be written unasked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_paths: Vec<String>,
    /// The same failing call this many times in a row earns a reflection note; two more and
    /// the task stops as stuck.
    pub repeat_limit: u32,
    /// Replay models: the recorded transcript (JSON lines).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub transcript: String,
    /// The acceptance check that decides whether a `finish` is done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<Check>,
    /// Its commands run behind the egress proxy with these secrets and this allow-list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::model::egress::EgressSpec>,
    /// An attempt's own sampling (seed, temperature); `None`: the provider's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<crate::model::attempt::Sampling>,
    /// The repository's AGENTS.md (or CLAUDE.md) is not read for the model.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_agents_md: bool,
    /// The assists the loop gives the model (`None`: a task from before they could be
    /// switched, which had all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assists: Option<Assists>,
}

impl AgentSpec {
    /// The assists this task runs with.
    pub fn assists(&self) -> std::borrow::Cow<'_, Assists> {
        match &self.assists {
            Some(a) => std::borrow::Cow::Borrowed(a),
            None => std::borrow::Cow::Owned(Assists::all()),
        }
    }

    /// Whether `assist` is on for this task.
    pub fn assisted(&self, assist: Assist) -> bool {
        self.assists.as_ref().is_none_or(|a| a.on(assist))
    }
}

#[cfg(test)]
impl AgentSpec {
    /// A replay-model spec for table tests, with nothing optional set.
    pub(crate) fn for_test(permission: Permission, budget: Budget) -> Self {
        AgentSpec {
            model: "replay:t".into(),
            permission,
            budget,
            allow_commands: vec![],
            allow_paths: vec![],
            repeat_limit: 2,
            transcript: String::new(),
            check: None,
            egress: None,
            sampling: None,
            no_agents_md: false,
            assists: None,
        }
    }
}

/// What an agent task has used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    pub usd: f64,
    pub tokens: u64,
    pub steps: u32,
}

/// A call waiting for a person.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    pub id: u64,
    pub tool_use_id: String,
    pub what: String,
    /// (approved, by, reason) once decided.
    pub decision: Option<(bool, String, String)>,
}

/// The agent half of a task's state, rebuilt from the log by [`crate::model::apply`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentState {
    pub spec: AgentSpec,
    /// Current limits: the spec's, raised by `brain task resume`.
    pub limits: Budget,
    /// When the wall-time budget started counting (creation, or the last resume).
    pub wall_start_ms: i64,
    pub spent: Spent,
    /// The conversation so far (the goal is the first user message).
    pub conversation: Vec<Message>,
    /// Tool calls of the last response that have no observation yet, in order.
    pub queue: VecDeque<ToolUse>,
    /// Said to the model once the queue is done (malformed text tool calls).
    pub note_after: Option<String>,
    /// A request was logged and its response is not.
    pub awaiting_llm: bool,
    pub approval: Option<Approval>,
    /// Approvals asked so far (their ids count up from 1).
    pub approvals_asked: u64,
    /// Calls a person approved "always" (`tools::standing` keys): not asked
    /// again in this task. Bounded by [`MAX_STANDING`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved_always: Vec<String>,
    /// The last failing call (tool name and arguments) and how many times in a row.
    pub repeat: Option<(String, u32)>,
    /// Replies in a row without a tool call that could run.
    pub idle_replies: u32,
    /// The last of them held calls that could not be read.
    #[serde(default)]
    pub idle_malformed: bool,
    /// Messages before this index have had their tool outputs elided.
    pub elided_upto: u32,
    /// Calls in the model's last reply (a `finish` is taken only alone).
    #[serde(default)]
    pub reply_calls: u32,
    /// The latest calls and what came of them, newest last (bounded), for the loop detector.
    #[serde(default)]
    pub recent: VecDeque<Turn>,
    /// The workspace overview is in the first message.
    #[serde(default)]
    pub surveyed: bool,
    /// The `finish` call for which the protected files were last put back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_for: Option<String>,
    /// The workspace's root hash at the latest barrier (for the loop detector).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub root: String,
    /// The model changed files since the acceptance check last ran: the check runs before
    /// its next turn, and it hears the result.
    #[serde(default)]
    pub changed_since_check: bool,
    /// The workspace's root as the acceptance check last left it (its barrier): a later
    /// barrier at another root means a call changed the workspace, whatever the tool (a
    /// `sed -i`, a formatter, `>>`), and the check runs again.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub checked_root: String,
    /// The acceptance check ran (the brain's run, or the model's own) and its barrier has not
    /// come yet: that barrier's root is what the check saw.
    #[serde(default)]
    pub check_ran_last: bool,
    /// The acceptance check's latest run passed and the model has not acted since.
    #[serde(default)]
    pub check_passes: bool,
    /// The workspace's root the last time the check passed on what the model changed (empty:
    /// it has not). Changes that make it fail again are undone back to it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub passed_root: String,
    /// The check failed on changes made after it passed: they are undone before the model's
    /// next turn.
    #[serde(default)]
    pub undo_due: bool,
    /// The root on which the brain called `finish` for the model, once per root: the model
    /// stopped (stuck, stalled, out of steps) with the workspace as the check passed on it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub concluded_on: String,
    /// The model's changes were undone back to the task's start once already.
    #[serde(default)]
    pub restarted: bool,
    /// A `request_environment` did not move the task (nothing fits, a person said no, or
    /// this machine fits already): the tool is not offered again, since small models ask
    /// for the same machine over and over.
    #[serde(default)]
    pub environment_refused: bool,
    /// The acceptance check failed before the model acted: a pass on its changes is the
    /// goal reached as the check defines it (an attempt ends there).
    #[serde(default)]
    pub failed_at_start: bool,
    /// The nested instructions for agents (`sub/AGENTS.md`) the model has been shown, each
    /// once, by path (bounded by [`MAX_NESTED_INSTRUCTIONS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instructions_shown: Vec<String>,
}

/// At most this many nested AGENTS.md files are shown to the model in one task.
pub const MAX_NESTED_INSTRUCTIONS: usize = 16;

/// At most this many standing approvals per task (the oldest is forgotten first).
pub const MAX_STANDING: usize = 64;

/// Where a person's approval of a call stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Not asked yet: ask, as approval number `.0`.
    Ask(u64),
    /// Asked, not decided.
    Waiting,
    /// Approved: go on.
    Go,
    /// Denied: this is the observation for the model.
    Denied(String),
}

pub use super::prompt::words::{ALREADY_FITS, ELIDED, NUDGE};

impl AgentState {
    pub fn new(spec: AgentSpec, goal: &str, at_ms: i64) -> Self {
        Self {
            limits: spec.budget,
            spec,
            wall_start_ms: at_ms,
            spent: Spent::default(),
            conversation: vec![Message::user(goal)],
            queue: VecDeque::new(),
            note_after: None,
            awaiting_llm: false,
            approval: None,
            approvals_asked: 0,
            approved_always: Vec::new(),
            repeat: None,
            idle_replies: 0,
            idle_malformed: false,
            elided_upto: 0,
            reply_calls: 0,
            recent: VecDeque::new(),
            surveyed: false,
            changed_since_check: false,
            checked_root: String::new(),
            check_ran_last: false,
            check_passes: false,
            restored_for: None,
            root: String::new(),
            passed_root: String::new(),
            undo_due: false,
            concluded_on: String::new(),
            restarted: false,
            environment_refused: false,
            failed_at_start: false,
            instructions_shown: Vec::new(),
        }
    }

    /// Adds the workspace overview to the first message (the goal), once: its files, the
    /// head of its README (path, text) and the repository's instructions for agents (path,
    /// text), said to be the repository's words, not the person's.
    pub fn on_surveyed(
        &mut self,
        files: &[String],
        truncated: bool,
        (readme_path, readme): (&str, &str),
        (agents_path, agents): (&str, &str),
    ) {
        if self.surveyed {
            return;
        }
        self.surveyed = true;
        let text = words::survey(
            files,
            truncated,
            (readme_path, readme),
            (agents_path, agents),
            self.spec.check.as_ref().map(|c| c.command.as_str()),
        );
        if let Some(first) = self.conversation.first_mut() {
            first.content.push_str(text.trim_end());
        }
    }

    /// A run of the acceptance check completed. Before the model's first turn it learns where
    /// it starts; a pass once the model has acted lets a reply that only talks be its finish
    /// (a pass before it acted does not: the goal may ask for more than the check).
    pub fn on_check_run(&mut self, run: &CheckRun) {
        if self.queue.is_empty() && self.spent.steps == 0 {
            self.on_first_check(run);
        }
        self.changed_since_check = false;
        self.check_ran_last = true;
        self.check_passes = run.passed && self.spent.steps > 0;
        self.on_verdict(run.passed);
    }

    /// Adds the acceptance check's first result (before any change) to the first message.
    fn on_first_check(&mut self, run: &CheckRun) {
        let Some(c) = &self.spec.check else {
            return;
        };
        self.failed_at_start = !run.passed;
        let mut text = format!(
            "\n\nThe acceptance check `{}` now: {}",
            c.command,
            if run.passed {
                "it passes already.".to_string()
            } else {
                format!("it fails ({}).", run.result)
            }
        );
        if !run.output.trim().is_empty() {
            text.push_str(&format!("\n{}", run.output.trim_end()));
        }
        if let Some(first) = self.conversation.first_mut() {
            first.content.push_str(&text);
        }
    }

    /// Whether `u` runs the task's acceptance check, word for word.
    fn runs_the_check(&self, u: &ToolUse) -> bool {
        let Some(c) = &self.spec.check else {
            return false;
        };
        u.name == "run_command"
            && serde_json::from_str::<serde_json::Value>(&u.arguments).is_ok_and(|v| {
                v["command"].as_str().map(str::trim) == Some(c.command.trim())
                    && v["cwd"]
                        .as_str()
                        .is_none_or(|d| matches!(d.trim(), "" | "." | "./"))
            })
    }

    /// The acceptance check ran on what the model's changes left: it hears how it went.
    pub fn on_check_after_changes(&mut self, text: &str) {
        self.conversation.push(Message::user(text));
    }

    /// Shows the model the instructions for agents nearest above a file it touched (`path`,
    /// say `crates/x/AGENTS.md`), once per file, with the result of that call (in it, so a
    /// reply's further tool results still follow its calls, as providers require).
    pub fn on_instructions_in_view(&mut self, path: &str, text: &str) {
        if text.trim().is_empty()
            || self.instructions_shown.iter().any(|p| p == path)
            || self.instructions_shown.len() >= MAX_NESTED_INSTRUCTIONS
        {
            return;
        }
        self.instructions_shown.push(path.to_string());
        let shown = words::repository_instructions(path, text);
        match self.conversation.last_mut() {
            Some(m) if m.role == Role::Tool => {
                m.content.push_str("\n\n");
                m.content.push_str(&shown);
            }
            _ => self.conversation.push(Message::user(shown)),
        }
    }

    /// Adds the code the check's first run points at to the first message (or, once the
    /// model has answered, as a message of its own).
    pub fn on_code_in_view(&mut self, text: &str) {
        if text.trim().is_empty() {
            return;
        }
        let answered = self.conversation.iter().any(|m| m.role == Role::Assistant);
        match self.conversation.first_mut() {
            Some(first) if !answered => {
                first.content.push_str("\n\n");
                first.content.push_str(text);
            }
            _ => self.conversation.push(Message::user(text)),
        }
    }

    /// The files the model has seen the text of, newest first (at most eight): those shown
    /// in a view of code, read, written or edited.
    pub fn files_in_view(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut add = |p: &str| {
            let p = p.trim().trim_start_matches("./");
            if !p.is_empty() && !out.iter().any(|q| q == p) && out.len() < 8 {
                out.push(p.to_string());
            }
        };
        for m in self.conversation.iter().rev() {
            for c in &m.tool_calls {
                if matches!(c.name.as_str(), "read_file" | "write_file" | "edit_file")
                    && let Ok(v) = serde_json::from_str::<serde_json::Value>(&c.arguments)
                    && let Some(p) = v["path"].as_str()
                {
                    add(p);
                }
            }
            if m.role != Role::Assistant {
                for h in super::prompt::code_view::headers(&m.content) {
                    add(h
                        .split(" (the whole file)")
                        .next()
                        .unwrap_or("")
                        .split(" lines ")
                        .next()
                        .unwrap_or(""));
                }
            }
        }
        out
    }

    /// The rounds of a loop after which the model is told, and after which the task stops:
    /// a single repeated call gets two more tries after the note, a longer cycle one more
    /// round.
    fn loop_limits(&self, period: usize) -> (usize, usize) {
        let note = self.spec.repeat_limit.max(1) as usize;
        (note, note + if period == 1 { 2 } else { 1 })
    }

    /// The loop the agent is in now and whether it must stop for it.
    pub fn looping(&self) -> Option<(Loop, bool)> {
        let l = detect(&self.recent)?;
        let (note, stop) = self.loop_limits(l.period);
        (l.rounds >= note).then(|| {
            let stuck = l.rounds >= stop;
            (l, stuck)
        })
    }

    /// The signature the repeat guard compares.
    pub fn signature(u: &ToolUse) -> String {
        format!("{}\u{0}{}", u.name, u.arguments.trim())
    }

    pub fn on_response(&mut self, r: &crate::llm::Response, cost_usd: f64) {
        self.awaiting_llm = false;
        self.spent.steps += 1;
        self.spent.tokens += r.usage.prompt_tokens + r.usage.completion_tokens;
        self.spent.usd += cost_usd;
        let mut msg = r.message.clone();
        msg.role = Role::Assistant;
        let idle = msg.tool_calls.is_empty() && r.malformed_calls.is_empty();
        if idle
            && self.spec.check.is_some()
            && self.check_passes
            && self.spec.assisted(Assist::TalkIsFinish)
        {
            // The check passed on what the model left, and it has nothing more to do: a
            // reply that only talks is its `finish` (the check runs once more and decides).
            let summary = crate::model::text::head_tail(msg.content.trim(), 500);
            msg.tool_calls.push(ToolUse {
                id: format!("finish_{}", self.spent.steps),
                name: "finish".into(),
                arguments: serde_json::json!({ "summary": summary }).to_string(),
            });
        }
        self.queue = msg.tool_calls.iter().cloned().collect();
        // With a check to judge it, a `finish` after edits of the same reply is taken: the
        // check runs on what they left. Any other call beside it is not.
        let judged = self.spec.check.is_some();
        self.reply_calls = self
            .queue
            .iter()
            .filter(|c| !(judged && c.id.starts_with(crate::llm::EDIT_ID)))
            .count() as u32;
        self.conversation.push(msg);
        let mut notes = Vec::new();
        if !r.malformed_calls.is_empty() {
            notes.push(words::unreadable_calls(&r.malformed_calls));
        }
        notes.extend(r.skipped_calls.iter().cloned());
        let note = (!notes.is_empty()).then(|| notes.join("\n\n"));
        if self.queue.is_empty() {
            // A reply with no call that could run, whether it tried (malformed) or not.
            self.idle_replies += 1;
            self.idle_malformed = note.is_some();
            match note {
                Some(n) => self.conversation.push(Message::user(n)),
                None => {
                    let nudge = if r.nudge.is_empty() {
                        NUDGE
                    } else {
                        r.nudge.as_str()
                    };
                    self.conversation.push(Message::user(nudge));
                }
            }
        } else {
            self.idle_replies = 0;
            self.note_after = note;
        }
    }

    /// The mirror caught up with the workspace after the latest call: that is what the call
    /// left.
    pub fn on_barrier(&mut self, root: &str) {
        self.root = root.to_string();
        if std::mem::take(&mut self.check_ran_last) {
            self.checked_root = root.to_string();
        } else if self.spec.check.is_some()
            && !self.checked_root.is_empty()
            && root != self.checked_root
        {
            // A call left the workspace other than the check saw it.
            self.changed_since_check = true;
        }
        if let Some(t) = self.recent.back_mut() {
            t.root = root.to_string();
        }
    }

    /// Whether the model has stopped calling tools: two replies in a row without a call (the
    /// nudge after the first did not help), or three when the last tried and could not be read
    /// (a model copying the call format wrong alternates between the two for ever otherwise).
    pub fn stalled(&self) -> bool {
        self.idle_replies >= 3 || (self.idle_replies >= 2 && !self.idle_malformed)
    }

    /// The turn's root is the workspace's as the mirror last saw it, until the barrier after
    /// the call says what the call left ([`Self::on_barrier`]).
    pub fn on_observation(&mut self, tool_use_id: &str, text: &str, failed: bool) {
        let Some(u) = self.queue.front().filter(|u| u.id == tool_use_id).cloned() else {
            return;
        };
        self.queue.pop_front();
        self.conversation.push(Message::tool(tool_use_id, text));
        if u.name != "finish" {
            self.check_passes = false;
        }
        if !failed && matches!(u.name.as_str(), "write_file" | "edit_file") {
            self.changed_since_check = true;
        }
        if u.name == "request_environment" && (failed || text.starts_with(ALREADY_FITS)) {
            self.environment_refused = true;
        }
        if self.runs_the_check(&u) && self.spent.steps > 0 {
            // The model ran the check itself on what it changed and saw the result: the
            // brain need not run it again (a pass lets talk be the finish, as the brain's).
            self.changed_since_check = false;
            self.check_ran_last = true;
            self.check_passes = !failed;
            self.on_verdict(!failed);
        }
        self.recent.push_back(Turn {
            sig: Self::signature(&u),
            obs: obs_hash(text),
            failed,
            root: self.root.clone(),
        });
        while self.recent.len() > RECENT_TURNS {
            self.recent.pop_front();
        }
        let sig = Self::signature(&u);
        self.repeat = match self.repeat.take() {
            _ if !failed => None,
            Some((s, n)) if s == sig => Some((s, n + 1)),
            _ => Some((sig, 1)),
        };
        if self
            .approval
            .as_ref()
            .is_some_and(|a| a.tool_use_id == tool_use_id)
        {
            self.approval = None;
        }
        if self.queue.is_empty()
            && let Some(n) = self.note_after.take()
        {
            self.conversation.push(Message::user(n));
        }
    }

    /// The task moved: the model is told before its next step (after the tool calls it is
    /// in the middle of, if any).
    pub fn on_moved(&mut self, from: &str, to: &str, lost_calls: u32) {
        let note = words::moved(from, to, lost_calls);
        if self.queue.is_empty() {
            self.conversation.push(Message::user(note));
        } else {
            self.note_after = Some(match self.note_after.take() {
                Some(n) => format!("{n}\n\n{note}"),
                None => note,
            });
        }
    }

    /// Where the approval for `u` (the call at the head of the queue) stands.
    pub fn gate(&self, u: &ToolUse) -> Gate {
        match self.approval.as_ref().filter(|ap| ap.tool_use_id == u.id) {
            None => Gate::Ask(self.approvals_asked + 1),
            Some(ap) => match &ap.decision {
                None => Gate::Waiting,
                Some((true, ..)) => Gate::Go,
                Some((false, by, reason)) => Gate::Denied(words::denied(by, reason)),
            },
        }
    }

    /// The observation of `u` with the repeat guard's note when it is a failure that
    /// repeats the same call.
    pub fn with_guard_note(&self, u: &ToolUse, mut text: String, failed: bool) -> String {
        if !self.spec.assisted(Assist::LoopNotes) {
            // The guard still stops a stuck task; the model is not told it is looping.
            return text;
        }
        // The same failing call again: the most specific note.
        let sig = Self::signature(u);
        let n = match &self.repeat {
            Some((s, n)) if failed && *s == sig => n + 1,
            _ if failed => 1,
            _ => 0,
        };
        let limit = self.spec.repeat_limit.max(1);
        if n >= limit {
            text.push_str(NOTE_MARK);
            text.push_str(&words::failed_again(n, n + 1 >= limit + 2));
            return text;
        }
        // A failing command run again on the same files, with the same result: said at
        // once, before it becomes a loop (small models run the failing tests over and over).
        let obs = obs_hash(&text);
        let same_again = failed
            && u.name == "run_command"
            && !self.root.is_empty()
            && self
                .recent
                .iter()
                .rev()
                .find(|t| t.sig == sig)
                .is_some_and(|t| t.root == self.root && t.obs == obs);
        // The loop detector, with this turn counted.
        let mut next = self.clone();
        next.recent.push_back(Turn {
            sig,
            obs,
            failed,
            root: self.root.clone(),
        });
        if let Some((l, stuck)) = next.looping() {
            text.push_str(NOTE_MARK);
            text.push_str(&words::going_round(
                &l.describe(),
                !stuck && l.rounds + 1 >= next.loop_limits(l.period).1,
            ));
        } else if same_again {
            text.push_str(NOTE_MARK);
            text.push_str(words::SAME_FAILURE_AGAIN);
        }
        text
    }

    pub fn elide(&mut self, upto: u32) {
        let upto = (upto as usize).min(self.conversation.len());
        for m in &mut self.conversation[..upto] {
            if m.role == Role::Tool && m.content.len() > ELIDED.len() {
                m.content = ELIDED.into();
            }
        }
        self.elided_upto = self.elided_upto.max(upto as u32);
    }

    /// Why the guard stops the task, if it does: the same failing call too many times, or a
    /// loop of calls or errors past its note.
    pub fn stuck(&self) -> Option<String> {
        if let Some((sig, n)) = &self.repeat
            && *n >= self.spec.repeat_limit.max(1) + 2
        {
            let call = sig.replace('\u{0}', " ");
            return Some(format!(
                "the same call failed {n} times in a row: {}",
                super::text::head_tail(&call, 200)
            ));
        }
        match self.looping() {
            Some((l, true)) => Some(format!("it went round in circles: {}", l.describe())),
            _ => None,
        }
    }

    /// Why the task may not take another step, if it may not.
    pub fn exhausted(&self, now_ms: i64) -> Option<String> {
        self.exhausted_with(now_ms, 0.0)
    }

    /// The same, with `machines_usd` spent on machines counted in the money budget.
    pub fn exhausted_with(&self, now_ms: i64, machines_usd: f64) -> Option<String> {
        let (l, s) = (&self.limits, &self.spent);
        if l.steps > 0 && s.steps >= l.steps {
            return Some(format!("step budget spent ({} of {})", s.steps, l.steps));
        }
        if l.tokens > 0 && s.tokens >= l.tokens {
            return Some(format!("token budget spent ({} of {})", s.tokens, l.tokens));
        }
        if l.usd > 0.0 && s.usd + machines_usd >= l.usd {
            return Some(if machines_usd > 0.0 {
                format!(
                    "money budget spent (${:.4} on the model and ${:.4} on machines, of ${:.4})",
                    s.usd, machines_usd, l.usd
                )
            } else {
                format!("money budget spent (${:.4} of ${:.4})", s.usd, l.usd)
            });
        }
        let ran = now_ms.saturating_sub(self.wall_start_ms).max(0) as u64;
        if l.wall_ms > 0 && ran >= l.wall_ms {
            return Some(format!(
                "wall-time budget spent ({} of {})",
                humantime::format_duration(std::time::Duration::from_secs(ran / 1000)),
                humantime::format_duration(std::time::Duration::from_millis(l.wall_ms))
            ));
        }
        None
    }

    /// The limits after a resume that adds `extra` (0: keep that limit as it is).
    /// Errors when the task would stop again at once.
    pub fn raised(&self, extra: Budget) -> Result<Budget, StopsAtOnce> {
        let (l, s) = (self.limits, self.spent);
        let new = Budget {
            usd: if extra.usd > 0.0 {
                s.usd + extra.usd
            } else {
                l.usd
            },
            tokens: if extra.tokens > 0 {
                s.tokens + extra.tokens
            } else {
                l.tokens
            },
            steps: if extra.steps > 0 {
                s.steps + extra.steps
            } else {
                l.steps
            },
            wall_ms: if extra.wall_ms > 0 {
                extra.wall_ms
            } else {
                l.wall_ms
            },
        };
        let mut probe = self.clone();
        probe.limits = new;
        probe.wall_start_ms = i64::MAX / 2;
        match probe.exhausted(i64::MAX / 2) {
            Some(why) => Err(StopsAtOnce(why)),
            None => Ok(new),
        }
    }
}

/// Why a resume is refused: with the budget it adds, the task would stop again at once (`.0`:
/// which limit it would hit, as [`AgentState::exhausted`] words it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the task would stop again at once: {0}; raise the budget that ran out")]
pub struct StopsAtOnce(pub String);

#[cfg(test)]
#[path = "agent_tests.rs"]
mod tests;
