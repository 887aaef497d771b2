//! `brain run` on a terminal asks inline for each approval the task waits on, as a person
//! expects of an agent in their terminal: `[y]es / [n]o / [a]lways for this command / show
//! [d]iff`. Off a terminal (a pipe, a script) nothing is read and `brain approve` decides, as
//! before. Someone else deciding first (`brain approve` from another shell, the web page)
//! ends the question.

use std::collections::HashMap;
use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use tokio::sync::mpsc;

use super::client::{Target, status};

/// How long the log must stay quiet after an approval is asked before the question is shown:
/// a followed log starts with its history, where an approval asked long ago is decided a few
/// records later and must not be asked again.
pub const SETTLE: Duration = Duration::from_millis(150);

/// Lines a person types, read by a thread of their own (a read of stdin cannot be cancelled).
pub struct Asker {
    lines: mpsc::Receiver<String>,
    /// The approval the task waits on, and the call it is for.
    pending: Option<Pending>,
    /// The latest model reply's calls, by id: what `d` shows.
    calls: HashMap<String, (String, String)>,
}

struct Pending {
    id: u64,
    tool_use_id: String,
    shown: bool,
    /// `n` was typed: the next line is the reason told to the model.
    denying: bool,
}

/// What the person's answer asks of the follower.
pub enum Answer {
    /// Nothing to send yet (a question shown, a diff shown, a line not understood).
    Wait,
    Decide {
        approve: bool,
        always: bool,
        reason: String,
    },
    /// Show the pending call's change (or the task's changes so far, for a command).
    Diff,
}

impl Asker {
    /// An asker when both stdin and stderr are a terminal (a person is there to answer).
    pub fn on_a_terminal() -> Option<Self> {
        if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
            return None;
        }
        let (tx, rx) = mpsc::channel(16);
        std::thread::Builder::new()
            .name("stdin".into())
            .spawn(move || {
                for line in std::io::stdin().lock().lines() {
                    let Ok(line) = line else { break };
                    if tx.blocking_send(line).is_err() {
                        break;
                    }
                }
            })
            .ok()?;
        Some(Self {
            lines: rx,
            pending: None,
            calls: HashMap::new(),
        })
    }

    /// Sees one record of the followed log.
    pub fn see(&mut self, e: &proto::log::Event) {
        use proto::log::Event as E;
        match e {
            E::LlmResponse {
                response: Some(r), ..
            } => {
                self.calls = r
                    .message
                    .tool_calls
                    .iter()
                    .map(|u| (u.id.clone(), (u.name.clone(), u.arguments.clone())))
                    .collect();
            }
            E::ApprovalRequested {
                approval_id,
                tool_use_id,
                ..
            } => {
                self.pending = Some(Pending {
                    id: *approval_id,
                    tool_use_id: tool_use_id.clone(),
                    shown: false,
                    denying: false,
                });
            }
            E::ApprovalDecided { approval_id, .. }
                if self.pending.as_ref().is_some_and(|p| p.id == *approval_id) =>
            {
                self.pending = None;
            }
            E::Finished { .. } => self.pending = None,
            _ => {}
        }
    }

    /// An approval is asked and its question is not shown yet: show it after [`SETTLE`].
    pub fn unasked(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| !p.shown)
    }

    /// An approval's question is shown: a line typed now answers it.
    pub fn asking(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| p.shown)
    }

    /// Shows the question for the pending approval.
    pub fn ask(&mut self) {
        let Some(p) = self.pending.as_mut() else {
            return;
        };
        p.shown = true;
        // What was typed before the question (while the model thought) answers nothing.
        while self.lines.try_recv().is_ok() {}
        prompt(&format!(
            "approve #{}? [y]es / [n]o / [a]lways for this command / show [d]iff: ",
            p.id
        ));
    }

    /// The next line the person types.
    pub async fn line(&mut self) -> Option<String> {
        self.lines.recv().await
    }

    /// What a typed line asks for.
    pub fn answer(&mut self, line: &str) -> Answer {
        let Some(p) = self.pending.as_mut() else {
            return Answer::Wait;
        };
        if p.denying {
            p.denying = false;
            return Answer::Decide {
                approve: false,
                always: false,
                reason: line.trim().to_string(),
            };
        }
        match line.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => Answer::Decide {
                approve: true,
                always: false,
                reason: String::new(),
            },
            "a" | "always" => Answer::Decide {
                approve: true,
                always: true,
                reason: String::new(),
            },
            "n" | "no" => {
                p.denying = true;
                prompt("why? (told to the model; Enter for no reason): ");
                Answer::Wait
            }
            "d" | "diff" => Answer::Diff,
            _ => {
                prompt("y, n, a or d: ");
                Answer::Wait
            }
        }
    }

    /// The pending call's change, as lines of a diff; `None` for a call that changes no file
    /// by itself (a command).
    pub fn change(&self) -> Option<String> {
        let p = self.pending.as_ref()?;
        let (name, args) = self.calls.get(&p.tool_use_id)?;
        change_of(name, args)
    }

    /// Asks again after something was shown.
    pub fn ask_again(&mut self) {
        if let Some(p) = self.pending.as_mut() {
            p.shown = false;
        }
        self.ask();
    }
}

/// At most this many lines of a proposed change are shown (a note says how many more).
const MAX_SHOWN: usize = 200;

/// A `write_file` or `edit_file` call's change as diff lines.
fn change_of(name: &str, args: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(args).ok()?;
    let field = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or_default();
    let path = field("path");
    let mut lines = vec![format!("--- {path}"), format!("+++ {path}")];
    match name {
        "write_file" => {
            lines.push("(the whole file, as it would be written)".into());
            lines.extend(field("content").lines().map(|l| format!("+{l}")));
        }
        "edit_file" => {
            lines.extend(field("old_string").lines().map(|l| format!("-{l}")));
            lines.extend(field("new_string").lines().map(|l| format!("+{l}")));
        }
        _ => return None,
    }
    let more = lines.len().saturating_sub(MAX_SHOWN);
    lines.truncate(MAX_SHOWN);
    if more > 0 {
        lines.push(format!("… {more} more lines"));
    }
    Some(lines.join("\n") + "\n")
}

fn prompt(text: &str) {
    let mut e = std::io::stderr();
    let _ = e
        .write_all(shared::visible::visible(text).as_bytes())
        .and_then(|_| e.flush());
}

/// Sends a person's decision; a refusal (someone decided first) is said, not fatal.
pub async fn decide(target: &Target, task: &str, approve: bool, always: bool, reason: String) {
    let sent = target
        .rpc(async |mut c| {
            c.decide(proto::DecideRequest {
                task_id: task.to_string(),
                approve,
                reason: reason.clone(),
                always,
            })
            .await
        })
        .await;
    if let Err(e) = sent {
        err!("  (not decided: {e:#})");
    }
}

/// `brain task diff --stat` of the task so far, for `d` on a command.
pub async fn task_changes(target: &Target, task: &str) {
    let stream = target
        .rpc(async |mut c| {
            c.task_diff(proto::TaskDiffRequest {
                task_id: task.into(),
                form: "stat".into(),
                root: String::new(),
            })
            .await
        })
        .await;
    let mut stream = match stream {
        Ok(s) => s,
        Err(e) => {
            err!("  (no diff: {e:#})");
            return;
        }
    };
    let mut text = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(piece)) => text.extend_from_slice(&piece.data),
            Ok(None) => break,
            Err(s) => {
                err!("  (no diff: {:#})", status(s, &target.url));
                return;
            }
        }
    }
    let text = String::from_utf8_lossy(&text);
    if text.trim().is_empty() {
        err!("a command changes no file by itself; the task has changed nothing so far");
    } else {
        err!("a command changes no file by itself; the task's changes so far:\n{text}");
    }
}
