//! A machine's durable record: what was asked for, where it is in its life, what it costs.
//! Stored as versioned JSON in the sled tree `machines`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::Error;

/// The version of [`Machine`] this code writes.
pub(super) const V: u32 = 1;
/// Ended records are kept this long for `brain machines --all`, then dropped.
pub(super) const KEEP_ENDED_MS: i64 = 7 * 24 * 3_600_000;

/// What a machine should offer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    pub cpu: u32,
    pub memory_gb: u32,
    pub disk_gb: u32,
    pub gpu: u32,
}

/// Where a machine is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// The record is written; the provider call may or may not have happened.
    Creating,
    /// The provider made it; its worker has not joined yet.
    Joining,
    /// Its worker is enrolled.
    Ready,
    /// Being destroyed; after a crash the release is done again.
    Releasing,
    Released,
    /// Creation failed and nothing of it is left.
    Failed,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Creating => "creating",
            State::Joining => "joining",
            State::Ready => "ready",
            State::Releasing => "releasing",
            State::Released => "released",
            State::Failed => "failed",
        }
    }

    /// Released or failed: nothing of the machine is left.
    pub fn is_ended(self) -> bool {
        matches!(self, State::Released | State::Failed)
    }
}

/// The durable record of one machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub v: u32,
    pub id: String,
    pub provider: String,
    pub spec: Spec,
    /// Provider-specific request (e.g. the ssh destination).
    #[serde(default)]
    pub params: serde_json::Value,
    pub labels: BTreeMap<String, String>,
    pub state: State,
    /// The provider's own name for it (a pid, a container or instance id, host:unit).
    #[serde(default)]
    pub handle: String,
    /// Where it is, for people.
    #[serde(default)]
    pub address: String,
    /// The worker it enrolled as.
    #[serde(default)]
    pub worker: Option<String>,
    /// The task it was created for, if any.
    #[serde(default)]
    pub task: Option<String>,
    pub usd_per_hour: f64,
    pub created_ms: i64,
    #[serde(default)]
    pub joined_ms: i64,
    #[serde(default)]
    pub ended_ms: i64,
    /// Why it was released or failed, or what happened to it last.
    #[serde(default)]
    pub note: String,
}

impl Machine {
    /// What it has cost so far (until now, or until it ended).
    pub fn cost_usd(&self, now_ms: i64) -> f64 {
        let end = if self.ended_ms > 0 {
            self.ended_ms
        } else {
            now_ms
        };
        let hours = (end - self.created_ms).max(0) as f64 / 3_600_000.0;
        hours * self.usd_per_hour
    }
}

pub(super) fn decode(key: &[u8], bytes: &[u8]) -> Result<Machine, Error> {
    serde_json::from_slice(bytes).map_err(|e| Error::Decode {
        id: String::from_utf8_lossy(key).into_owned(),
        reason: e.to_string(),
    })
}
