//! What an attempt is, below the records that carry it: how a task runs as attempts
//! ([`AttemptsSpec`]), an attempt's sampling, its link to its parent and how it ended. The
//! parent's state and its decisions are in [`super::attempts`].

use serde::{Deserialize, Serialize};

use super::task::{Status, TaskId};

/// The most attempts one task may run (escalations aside).
pub const MAX_ATTEMPTS: u32 = 16;
/// The most models a task may escalate to.
pub const MAX_ESCALATIONS: u32 = 4;

/// Which verified attempt wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pick {
    /// The first attempt the check passes on; the others are cancelled.
    #[default]
    First,
    /// Every attempt runs to its end; the verified one with the fewest changed lines wins.
    Smallest,
}

impl std::str::FromStr for Pick {
    type Err = super::word::UnknownWord;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "first" => Ok(Pick::First),
            "smallest" => Ok(Pick::Smallest),
            _ => Err(Self::Err::new("pick", s, "first or smallest")),
        }
    }
}

impl std::fmt::Display for Pick {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Pick::First => "first",
            Pick::Smallest => "smallest",
        })
    }
}

/// How a task runs as attempts; fixed when it is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptsSpec {
    pub count: u32,
    pub pick: Pick,
    /// The sampling temperature of every attempt after the first (`None`: the server's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Models for the attempts after the first, in turn (the task's own model first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// When no attempt passes the check: one more attempt on each of these, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalate: Vec<String>,
    /// The worker (id) every attempt runs on, if the task named one; else each is placed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub worker: String,
}

impl AttemptsSpec {
    /// The model of attempt `index` of the first round: `base` (the task's), then the
    /// attempt models in turn.
    pub fn model_of(&self, index: u32, base: &str) -> String {
        let n = self.models.len() as u32 + 1;
        match index % n {
            0 => base.to_string(),
            k => self.models[k as usize - 1].clone(),
        }
    }

    /// What attempt `index` samples with: a seed of its own, and from the second on the
    /// attempts' temperature.
    pub fn sampling_of(&self, parent: TaskId, index: u32) -> Sampling {
        Sampling {
            seed: seed_of(parent, index),
            temperature: self.temperature_of(index),
            together: self.together_with(index),
        }
    }

    fn temperature_of(&self, index: u32) -> Option<f32> {
        if index == 0 { None } else { self.temperature }
    }

    /// How many attempts of the first round start as attempt `index` does (the same model
    /// and temperature): their first turns are the same request but for the seed.
    /// Attempts after the first round (escalations) start alone.
    fn together_with(&self, index: u32) -> u32 {
        if index >= self.count {
            return 1;
        }
        let base = "";
        let like = |j: u32| {
            self.model_of(j, base) == self.model_of(index, base)
                && self.temperature_of(j) == self.temperature_of(index)
        };
        (0..self.count).filter(|&j| like(j)).count() as u32
    }
}

/// An attempt's sampling: its seed (sent where the provider takes one) and temperature.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    pub seed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// How many attempts (this one among them) start with the same first request but for
    /// the seed; more than one: the first turn may be asked for all of them at once.
    #[serde(default, skip_serializing_if = "is_alone")]
    pub together: u32,
}

fn is_alone(n: &u32) -> bool {
    *n <= 1
}

/// A seed that differs between attempts and between tasks, the same after a restart.
fn seed_of(parent: TaskId, index: u32) -> u64 {
    // splitmix64 of the pair: well spread, no state.
    let mut z = parent
        .0
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(index) + 1);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    // Servers read the seed as a signed or 32-bit number: keep it small and positive.
    (z ^ (z >> 31)) & 0x7FFF_FFFF
}

/// An attempt's link to the task it is an attempt of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptOf {
    pub parent: TaskId,
    /// From 0, in the order they started.
    pub index: u32,
}

/// How an attempt ended, as its parent recorded it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptEnd {
    pub status: Status,
    /// Finished with the acceptance check passing on its last workspace.
    pub verified: bool,
    pub reason: String,
    /// Its last workspace (a manifest root in the mirror).
    #[serde(default)]
    pub root: String,
    /// How its last run of the check ended, in words, and its output (head and tail).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub check: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub check_output: String,
    /// What it changed from the base: files, and lines added plus removed.
    #[serde(default)]
    pub files_changed: u64,
    #[serde(default)]
    pub lines_changed: u64,
    #[serde(default)]
    pub steps: u32,
    #[serde(default)]
    pub tokens: u64,
    #[serde(default)]
    pub usd: f64,
}

/// One attempt as its parent knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub index: u32,
    pub task: TaskId,
    pub model: String,
    /// Started because the attempts before it all failed.
    #[serde(default)]
    pub escalation: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<AttemptEnd>,
}

/// The winner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Picked {
    pub index: u32,
    pub task: TaskId,
    pub why: String,
}
