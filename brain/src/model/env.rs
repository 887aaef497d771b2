//! `request_environment`: what the agent asks for, what it would cost, and what it got.

use serde::{Deserialize, Serialize};

/// What `request_environment` asked for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnvRequest {
    pub cpu: u32,
    pub memory_gb: u32,
    pub disk_gb: u32,
    pub gpu: u32,
    pub labels: std::collections::BTreeMap<String, String>,
    pub reason: String,
}

/// What an environment would cost.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Quote {
    /// An existing worker fits: nothing new is bought.
    pub reuse: bool,
    /// A configured offer fits (a new machine could be made).
    pub offer: bool,
    pub usd_per_hour: f64,
    pub needs_approval: bool,
}

/// An environment obtained.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    pub worker: String,
    /// For the model and people: what it is.
    pub describe: String,
    /// The machine created for it, if one was.
    pub machine: Option<String>,
}
