//! The agent's loop detector: the calls it made and what came of them, and the cycles (a
//! round of one to four calls, or of errors) that repeat at their end.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// One call the model made and what it was told, as the loop detector compares them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    /// The call's tool name and arguments.
    pub sig: String,
    /// A hash of the observation (without the guard's notes).
    pub obs: u64,
    pub failed: bool,
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

/// A hash of an observation without the notes the guard added to it.
pub(crate) fn obs_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let raw = text.split(NOTE_MARK).next().unwrap_or(text);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    raw.hash(&mut h);
    h.finish()
}
