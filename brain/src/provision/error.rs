//! Errors of provisioning: the brain's own (quota, store, bad request) and a provider's.

use std::time::Duration;

/// Errors of provisioning.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("machine store: {0}")]
    Sled(#[from] sled::Error),
    #[error(transparent)]
    Store(#[from] crate::storage::kv::Error),
    #[error(transparent)]
    Registry(#[from] crate::trust::registry::Error),
    #[error("machine record {id} cannot be decoded: {reason}")]
    Decode { id: String, reason: String },
    #[error("unknown provider {name:?}: this brain has {have}")]
    UnknownProvider { name: String, have: String },
    #[error("no machine {0:?}: see `brain machines --all`")]
    NoSuchMachine(String),
    #[error("over quota: {0}")]
    Quota(String),
    #[error("machine {id} is already {state}")]
    AlreadyEnded { id: String, state: &'static str },
    #[error("provider {provider} failed: {source}")]
    Provider {
        provider: String,
        #[source]
        source: ProviderError,
    },
    #[error("{provider} did not finish {doing} within {after:?}")]
    Timeout {
        provider: String,
        doing: &'static str,
        after: Duration,
    },
    #[error("invalid request: {0}")]
    Invalid(String),
}

/// What a provider reports when a call fails: a message for a person, and whether the call
/// certainly changed nothing (so a failed create needs no clean-up).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ProviderError {
    pub message: String,
    pub untouched: bool,
}

impl ProviderError {
    pub fn new(msg: impl Into<String>) -> Self {
        Self {
            message: msg.into(),
            untouched: false,
        }
    }

    /// The call failed before it changed anything (e.g. the host could not be reached).
    pub fn untouched(msg: impl Into<String>) -> Self {
        Self {
            message: msg.into(),
            untouched: true,
        }
    }
}
