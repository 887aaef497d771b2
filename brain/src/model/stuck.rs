//! The agent's loop detector: the calls it made and what came of them, and the cycles (a
//! round of one to four calls, or of errors) that repeat at their end.
//!
//! Two turns are the same when they left the workspace with the same root hash and told the
//! model the same thing (timings and addresses aside), whatever the calls' exact bytes: a
//! write that changes nothing followed by a refused `finish` is a cycle even when the model
//! words the write differently each time.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// One call the model made and what it was told, as the loop detector compares them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Turn {
    /// The call's tool name and arguments.
    pub sig: String,
    /// A hash of the observation (without the guard's notes, timings and addresses).
    pub obs: u64,
    pub failed: bool,
    /// The workspace's root hash after the call (the mirror's, at the barrier that followed
    /// it; before any barrier, empty: then the call's own bytes tell turns apart).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub root: String,
}

impl PartialEq for Turn {
    fn eq(&self, o: &Self) -> bool {
        let same_state = if self.root.is_empty() || o.root.is_empty() {
            self.sig == o.sig
        } else {
            self.root == o.root
        };
        same_state && self.obs == o.obs && self.failed == o.failed
    }
}

/// Turns remembered for the loop detector: four rounds of a four-call cycle, and a few more.
pub(crate) const RECENT_TURNS: usize = 20;
/// Where the guard's notes start in an observation.
pub(crate) const NOTE_MARK: &str = "\n\nNote: ";

/// A loop the agent is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loop {
    /// Calls per round, and rounds in a row.
    pub period: usize,
    pub rounds: usize,
    /// The calls of a round (tool names), or `None` when only the errors repeat.
    pub calls: Option<Vec<String>>,
}

impl Loop {
    /// The loop in words, for the model and for the reason the task stopped.
    pub fn describe(&self) -> String {
        match &self.calls {
            Some(c) if self.period == 1 => format!(
                "the same call ({}) with the same result {} times in a row",
                c[0], self.rounds
            ),
            Some(c) => format!(
                "the same {} calls ({}) with the same results, {} rounds in a row",
                self.period,
                c.join(", "),
                self.rounds
            ),
            None if self.period == 1 => format!("the same error {} times in a row", self.rounds),
            None => format!(
                "the same {} errors in turn, {} rounds in a row",
                self.period, self.rounds
            ),
        }
    }
}

/// The longest repetition of a round of 1 to 4 items at the end of `items`: (period, rounds),
/// counting only rounds that repeat back to back at least twice.
pub(crate) fn repetition<T: PartialEq>(items: &[T]) -> Option<(usize, usize)> {
    let n = items.len();
    let mut best: Option<(usize, usize)> = None;
    for p in 1..=4usize {
        let mut rounds = 1;
        while (rounds + 1) * p <= n
            && (0..p).all(|i| items[n - 1 - i] == items[n - 1 - i - rounds * p])
        {
            rounds += 1;
        }
        if rounds >= 2 && best.is_none_or(|(bp, br)| rounds * p > br * bp) {
            best = Some((p, rounds));
        }
    }
    best
}

/// The loop `recent` ends in, if any: repeating calls with repeating results, or (whatever
/// the calls) repeating errors.
pub(crate) fn detect(recent: &VecDeque<Turn>) -> Option<Loop> {
    let turns: Vec<&Turn> = recent.iter().collect();
    let calls = repetition(&turns).map(|(period, rounds)| Loop {
        period,
        rounds,
        calls: Some(
            turns[turns.len() - period..]
                .iter()
                .map(|t| t.sig.split('\u{0}').next().unwrap_or("").to_string())
                .collect(),
        ),
    });
    let failing: Vec<u64> = turns
        .iter()
        .rev()
        .take_while(|t| t.failed)
        .map(|t| t.obs)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let errors = repetition(&failing).map(|(period, rounds)| Loop {
        period,
        rounds,
        calls: None,
    });
    match (calls, errors) {
        (Some(c), Some(e)) if e.period * e.rounds > c.period * c.rounds => Some(e),
        (Some(c), _) => Some(c),
        (None, e) => e,
    }
}

/// A hash of an observation without the notes the guard added to it, and with what changes
/// from one run of the same thing to the next (durations such as `Ran 3 tests in 0.001s`,
/// `finished in 0.02s`, `(12 ms)`; hexadecimal addresses) put aside.
pub(crate) fn obs_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    static VARYING: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(
            r"(?i)\b\d+(?:\.\d+)?\s?(?:ns|µs|us|ms|s|sec|secs|seconds?|m|min)\b|\b0x[0-9a-f]{4,}\b",
        )
        .expect("a valid pattern")
    });
    let raw = text.split(NOTE_MARK).next().unwrap_or(text);
    let steady = VARYING.replace_all(raw, "_");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    steady.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_and_addresses_do_not_make_outputs_differ() {
        assert_eq!(
            obs_hash("FAILED (failures=1)\nRan 3 tests in 0.001s"),
            obs_hash("FAILED (failures=1)\nRan 3 tests in 0.013s")
        );
        assert_eq!(
            obs_hash("test result: FAILED. finished in 0.00s; at 0x55d4a1b2c3d0"),
            obs_hash("test result: FAILED. finished in 1.25s; at 0x7f00aa11bb22")
        );
        assert_ne!(obs_hash("expected 3, got 2"), obs_hash("expected 3, got 4"));
        assert_eq!(obs_hash("same\n\nNote: one"), obs_hash("same\n\nNote: two"));
    }

    fn turn(sig: &str, obs: &str, root: &str) -> Turn {
        Turn {
            sig: sig.into(),
            obs: obs_hash(obs),
            failed: true,
            root: root.into(),
        }
    }

    #[test]
    fn turns_with_the_same_workspace_and_output_are_the_same_whatever_the_call() {
        // The same workspace and output: the same turn, though the calls differ in bytes.
        assert_eq!(
            turn("write_file\0{\"path\":\"a\"}", "wrote", "r1"),
            turn("write_file\0{ \"path\": \"a\" }", "wrote", "r1")
        );
        assert_ne!(turn("x", "wrote", "r1"), turn("x", "wrote", "r2"));
        // Before any barrier, the call's bytes decide.
        assert_ne!(turn("a", "out", ""), turn("b", "out", ""));
        assert_eq!(turn("a", "out", ""), turn("a", "out", ""));
    }
}
