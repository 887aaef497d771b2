//! Attempts: one task run as several tries from the same base, each a task of its own (its
//! own log, workspace and worker) linked to a parent that records them. The brain's own run
//! of the acceptance check judges each; the parent's result is the winner's. This module is
//! the pure half: what a parent records ([`Attempts`]) and what it does next ([`decide`]).

use serde::{Deserialize, Serialize};

pub use super::attempt::{
    Attempt, AttemptEnd, AttemptOf, AttemptsSpec, MAX_ATTEMPTS, MAX_ESCALATIONS, Pick, Picked,
    Sampling,
};
use super::event::Outcome;
use super::task::TaskId;

/// How much of a failed attempt's last check output the next model is shown.
const BRIEF_OUTPUT: usize = 2048;

/// How long past the wall budget the parent waits for its attempts to stop by themselves
/// before it stops them. Each attempt's own wall budget ends with the parent's, and an
/// attempt stopping on its budget still checks its last change (and finishes on a passing
/// version it kept), which the parent would otherwise cut short.
pub const WALL_GRACE_MS: u64 = 60_000;

/// A parent's state: its attempts and their outcome, rebuilt from its log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempts {
    pub spec: AttemptsSpec,
    /// What each attempt runs with (its model and sampling set per attempt).
    pub template: super::agent::AgentSpec,
    /// In the order they started.
    pub list: Vec<Attempt>,
    /// Indexes in the order their ends were recorded.
    #[serde(default)]
    pub ended: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub picked: Option<Picked>,
    /// Where the base came from, and its size (for the attempts' own seed records).
    #[serde(default)]
    pub base_source: String,
    #[serde(default)]
    pub base_files: u64,
    #[serde(default)]
    pub base_bytes: u64,
}

impl Attempts {
    pub fn new(spec: AttemptsSpec, template: super::agent::AgentSpec) -> Self {
        Self {
            spec,
            template,
            list: vec![],
            ended: vec![],
            picked: None,
            base_source: String::new(),
            base_files: 0,
            base_bytes: 0,
        }
    }

    pub fn get(&self, index: u32) -> Option<&Attempt> {
        self.list.iter().find(|a| a.index == index)
    }

    pub(super) fn on_started(&mut self, a: Attempt) {
        if self.get(a.index).is_none() {
            self.list.push(a);
        }
    }

    pub(super) fn on_ended(&mut self, index: u32, end: AttemptEnd) {
        if let Some(a) = self.list.iter_mut().find(|a| a.index == index)
            && a.end.is_none()
        {
            a.end = Some(end);
            self.ended.push(index);
        }
    }

    /// Escalations started so far.
    fn escalations(&self) -> usize {
        self.list.iter().filter(|a| a.escalation).count()
    }

    /// The goal an escalation starts with: the task's, and how the attempts before failed.
    pub fn escalation_goal(&self, goal: &str) -> String {
        let mut text = format!(
            "{goal}\n\nEarlier attempts at this task did not pass the acceptance check. How the check ended on each, last:"
        );
        for a in &self.list {
            if let Some(e) = &a.end {
                let out = tail(&e.check_output, BRIEF_OUTPUT);
                text.push_str(&format!(
                    "\n\nAttempt {} ({}): {}",
                    a.index + 1,
                    a.model,
                    if e.check.is_empty() {
                        e.reason.as_str()
                    } else {
                        e.check.as_str()
                    }
                ));
                if !out.trim().is_empty() {
                    text.push_str(&format!("\n{}", out.trim_end()));
                }
            }
        }
        text
    }

    /// Why a parent has no result of its own to show or deliver (no attempt won yet, or
    /// none did), and what to ask for instead; `None` once one won.
    pub fn no_result(&self, parent: TaskId) -> Option<String> {
        if self.picked.is_some() {
            return None;
        }
        let ids: Vec<String> = self.list.iter().map(|a| a.task.to_string()).collect();
        Some(format!(
            "task {parent} runs as attempts and no attempt has won, so it has no result of its own: name one of its attempts instead ({})",
            if ids.is_empty() {
                "none started yet".to_string()
            } else {
                ids.join(", ")
            }
        ))
    }

    /// Why no attempt won, one line per attempt.
    pub fn failures(&self) -> String {
        let lines: Vec<String> = self
            .list
            .iter()
            .map(|a| match &a.end {
                Some(e) => format!(
                    "attempt {} ({}, {}) {}: {}",
                    a.index + 1,
                    a.task,
                    a.model,
                    e.status,
                    if e.reason.is_empty() {
                        e.check.as_str()
                    } else {
                        e.reason.as_str()
                    }
                ),
                None => format!("attempt {} ({}) did not end", a.index + 1, a.task),
            })
            .collect();
        lines.join("; ")
    }
}

/// The last `max` bytes of `s`, on a character boundary.
fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut i = s.len() - max;
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

/// An attempt as it stands now, for [`decide`].
#[derive(Debug, Clone, PartialEq)]
pub struct Child {
    pub index: u32,
    pub task: TaskId,
    /// It will not go on by itself (ended, or stopped for its budget).
    pub stopped: bool,
    pub tokens: u64,
    pub usd: f64,
}

/// What the parent does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Start attempt `index` (or adopt the task already made for it) and record it.
    Start {
        index: u32,
        model: String,
        escalation: bool,
    },
    /// Record how these attempts ended (in this order).
    Record(Vec<u32>),
    /// `index` wins.
    Pick { index: u32, why: String },
    /// Ask these attempts to stop, then wait for them to end.
    Cancel { tasks: Vec<TaskId>, why: String },
    /// The parent ends.
    Finish { outcome: Outcome, reason: String },
    /// Wait for an attempt to change.
    Wait,
}

/// What is spent over all attempts, and the budget over all of them (0: no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spend {
    pub tokens: u64,
    pub usd: f64,
    pub wall_ms: u64,
}

/// The parent's next move, from its record, its attempts as they stand, whether a person
/// cancelled it, what all attempts have spent and the budget over them.
pub fn decide(
    a: &Attempts,
    children: &[Child],
    cancelled: bool,
    spent: Spend,
    budget: Spend,
) -> Next {
    // Ends are recorded first, in the order they are seen: the pick reads that record.
    let ended: Vec<u32> = children
        .iter()
        .filter(|c| c.stopped)
        .filter(|c| a.get(c.index).is_some_and(|x| x.end.is_none()))
        .map(|c| c.index)
        .collect();
    if !ended.is_empty() {
        return Next::Record(ended);
    }
    let running: Vec<TaskId> = a
        .list
        .iter()
        .filter(|x| x.end.is_none())
        .map(|x| x.task)
        .collect();
    let verified = |x: &&Attempt| x.end.as_ref().is_some_and(|e| e.verified);
    let stop_all = |why: String, outcome: Outcome| {
        if running.is_empty() {
            Next::Finish {
                outcome,
                reason: why,
            }
        } else {
            Next::Cancel {
                tasks: running.clone(),
                why,
            }
        }
    };
    if let Some(p) = &a.picked {
        return stop_all(
            format!("attempt {} ({}) won: {}", p.index + 1, p.task, p.why),
            Outcome::Finished,
        );
    }
    // The first verified attempt, in the order their ends were recorded.
    let first = a
        .ended
        .iter()
        .filter_map(|i| a.get(*i))
        .find(|x| verified(x));
    let smallest = a.list.iter().filter(verified).min_by_key(|x| {
        (
            x.end.as_ref().map_or(u64::MAX, |e| e.lines_changed),
            x.index,
        )
    });
    let why_smallest = |x: &Attempt| {
        let e = x.end.as_ref().expect("verified attempts ended");
        format!(
            "the check passed on it, with the smallest change of those it passed on ({} lines in {} files)",
            e.lines_changed, e.files_changed
        )
    };
    if a.spec.pick == Pick::First
        && let Some(x) = first
    {
        return Next::Pick {
            index: x.index,
            why: "the check passed on it first".into(),
        };
    }
    if cancelled {
        return stop_all("cancelled by an admin".into(), Outcome::Cancelled);
    }
    if let Some(why) = over(spent, budget) {
        // What passed already still wins; otherwise the task ends with what it has.
        if let Some(x) = smallest {
            return Next::Pick {
                index: x.index,
                why: format!("{} (the budget over all attempts ran out)", why_smallest(x)),
            };
        }
        return stop_all(
            format!(
                "the budget over all attempts ran out ({why}); {}",
                a.failures()
            ),
            Outcome::Failed,
        );
    }
    let started = a.list.len() as u32;
    let first_round = a.list.iter().filter(|x| !x.escalation).count() as u32;
    if first_round < a.spec.count {
        return Next::Start {
            index: started,
            model: a.spec.model_of(first_round, &a.template.model),
            escalation: false,
        };
    }
    if !running.is_empty() {
        return Next::Wait;
    }
    if let Some(x) = smallest {
        return Next::Pick {
            index: x.index,
            why: why_smallest(x),
        };
    }
    if let Some(model) = a.spec.escalate.get(a.escalations()) {
        return Next::Start {
            index: started,
            model: model.clone(),
            escalation: true,
        };
    }
    Next::Finish {
        outcome: Outcome::Failed,
        reason: format!(
            "no attempt passed the check ({}); one of them can be delivered as it stands",
            a.failures()
        ),
    }
}

/// Which limit `spent` is over, in words.
fn over(spent: Spend, budget: Spend) -> Option<String> {
    if budget.tokens > 0 && spent.tokens >= budget.tokens {
        return Some(format!("{} of {} tokens", spent.tokens, budget.tokens));
    }
    if budget.usd > 0.0 && spent.usd >= budget.usd {
        return Some(format!("${:.4} of ${:.4}", spent.usd, budget.usd));
    }
    if budget.wall_ms > 0 && spent.wall_ms >= budget.wall_ms + WALL_GRACE_MS {
        return Some(format!(
            "{}s of wall time, and {}s more for attempts to stop by themselves",
            budget.wall_ms / 1000,
            WALL_GRACE_MS / 1000
        ));
    }
    None
}

#[cfg(test)]
#[path = "attempts_tests.rs"]
mod tests;
