//! Keeping what the check passed on: the agent's state for undoing changes on which the
//! acceptance check fails after it passed, for finishing in the place of a model that stops
//! on a passing version, and for beginning again from the start once.

use super::agent::{AgentState, Assist};
use super::prompt::words::{self, Undone};
use crate::llm::{Message, Role, ToolUse};

impl AgentState {
    /// The check passed or failed on the workspace as the model's changes left it: a pass
    /// is the version to keep; a failure after one means the changes since are undone.
    pub(super) fn on_verdict(&mut self, passed: bool) {
        if self.spent.steps == 0 || self.root.is_empty() {
            return;
        }
        if passed {
            self.passed_root = self.root.clone();
            self.undo_due = false;
        } else {
            self.undo_due = self.undoes_on_failure();
        }
    }

    /// Whether a failing check on the workspace as it is now would undo changes (it passed
    /// on another version since the model acted).
    pub fn undoes_on_failure(&self) -> bool {
        self.spec.assisted(Assist::UndoRegression)
            && !self.passed_root.is_empty()
            && !self.root.is_empty()
            && self.root != self.passed_root
    }

    /// The changes that made the check fail after it had passed were undone: `restored`
    /// hold what they held when it passed (`shown`: their text, for the model); `left` were
    /// made since and are still there (no file is deleted), so the check runs again.
    pub fn on_changes_undone(&mut self, restored: &[String], left: &[String], shown: &str) {
        self.undo_due = false;
        self.check_passes = left.is_empty();
        // With files made since still there, the check runs again on what is there now (once:
        // when nothing more can be written back, it does not).
        self.changed_since_check = !left.is_empty() && !restored.is_empty();
        if left.is_empty() {
            // The workspace is back at the version the check passed on: what it saw there
            // stands, and the barrier to come is not a change.
            self.checked_root = self.passed_root.clone();
            self.check_ran_last = false;
        }
        if restored.is_empty() && left.is_empty() {
            return;
        }
        self.conversation.push(Message::user(words::undone(
            Undone::AfterAPass,
            restored,
            left,
            shown,
        )));
    }

    /// The model stopped making progress and its changes were undone back to the task's
    /// start: it begins again from the first message (the goal, the files, the check's first
    /// result), its failed replies no longer in view, told what happened.
    pub fn on_restarted(&mut self, restored: &[String], left: &[String], shown: &str) {
        self.restarted = true;
        self.conversation.truncate(1);
        self.elided_upto = 0;
        self.note_after = None;
        self.idle_replies = 0;
        self.idle_malformed = false;
        self.repeat = None;
        self.recent.clear();
        self.check_passes = false;
        self.changed_since_check = false;
        self.conversation.push(Message::user(words::undone(
            Undone::ToTheStart,
            restored,
            left,
            shown,
        )));
    }

    /// Whether the workspace is as the check last passed on it, and the brain has not yet
    /// finished for the model there: a model that stops now has still done the work.
    pub fn holds_a_pass(&self) -> bool {
        !self.passed_root.is_empty()
            && self.root == self.passed_root
            && self.concluded_on != self.root
            && self.queue.is_empty()
    }

    /// The model stopped (`why`) with the workspace as the check passed on it: the brain
    /// calls `finish` in its place (the check runs once more on the final workspace, with
    /// the files it relies on put back, and decides).
    pub fn on_concluded(&mut self, why: &str) {
        self.concluded_on = self.root.clone();
        let id = format!("finish_brain_{}", self.spent.steps);
        let summary = words::finished_for_the_model(why);
        let msg = Message {
            role: Role::Assistant,
            content: words::BRAIN_CALLS_FINISH.into(),
            tool_calls: vec![ToolUse {
                id,
                name: "finish".into(),
                arguments: serde_json::json!({ "summary": summary }).to_string(),
            }],
            tool_call_id: String::new(),
        };
        self.queue = msg.tool_calls.iter().cloned().collect();
        self.reply_calls = 1;
        self.conversation.push(msg);
    }
}
