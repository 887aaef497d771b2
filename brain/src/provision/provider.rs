//! One kind of machine: the [`Provisioner`] trait every provider implements, and what passes
//! between it and the bookkeeping (the join it must hand the worker, what it made, what it
//! sees).

use std::collections::BTreeMap;
use std::time::Duration;

use super::error::ProviderError;
use super::records::{Machine, Spec};

/// Everything a new machine needs to join this brain. The token is one-time and expires with
/// the join deadline; providers pass it so it lands in no image, log or process list.
#[derive(Clone)]
pub struct Join {
    pub brain_url: String,
    pub ca_hash: String,
    pub token: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// The worker exits when the brain has been unreachable this long.
    pub exit_after_unreachable: Duration,
}

impl std::fmt::Debug for Join {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Join")
            .field("brain_url", &self.brain_url)
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .finish()
    }
}

impl Join {
    /// The `worker join` arguments every provider passes (besides the token and the state
    /// directory, which depend on where the worker runs).
    pub fn args(&self) -> Vec<String> {
        let mut v = vec![
            "join".to_string(),
            "--brain".into(),
            self.brain_url.clone(),
            "--ca-hash".into(),
            self.ca_hash.clone(),
            "--name".into(),
            self.name.clone(),
            "--exit-after-unreachable".into(),
            format!("{}s", self.exit_after_unreachable.as_secs().max(1)),
        ];
        for (k, val) in &self.labels {
            v.push("--label".into());
            v.push(format!("{k}={val}"));
        }
        v
    }
}

/// For a provider whose settings all live in its config section: refuses a request that
/// brings parameters of its own, saying where the settings go (`where_`, e.g. "they are in
/// [provision.ec2]").
pub fn no_params(
    provider: &str,
    params: &serde_json::Value,
    where_: &str,
) -> Result<(), ProviderError> {
    if params.is_null() || params.as_object().is_some_and(|o| o.is_empty()) {
        Ok(())
    } else if where_.is_empty() {
        Err(ProviderError::new(format!(
            "the {provider} provider takes no parameters"
        )))
    } else {
        Err(ProviderError::new(format!(
            "the {provider} provider takes no parameters ({where_})"
        )))
    }
}

/// What a provider made.
#[derive(Debug, Clone)]
pub struct Created {
    pub handle: String,
    pub address: String,
}

/// A machine a provider sees that carries this brain's marker.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub machine: String,
    pub handle: String,
    /// Why the machine is dead or can never join (a pod OOMKilled, evicted, or its image not
    /// pulled), in the provider's words; `None` while it lives.
    pub failure: Option<String>,
}

/// One kind of machine.
#[async_trait::async_trait]
pub trait Provisioner: Send + Sync {
    /// The provider's name in config, records and the CLI.
    fn name(&self) -> &'static str;

    /// Checks a request's provider-specific parameters and what it asks for (this provider
    /// may have nothing that fits) before anything is recorded.
    fn check(&self, params: &serde_json::Value, spec: &Spec) -> Result<(), ProviderError>;

    /// Whether the machine for `params` is another host than the brain's (so a loopback
    /// brain URL cannot reach the brain from it).
    fn remote(&self, params: &serde_json::Value) -> bool;

    /// Creates `m` (its id is the marker to put on it) running a worker that joins with `join`.
    async fn create(&self, m: &Machine, join: &Join) -> Result<Created, ProviderError>;

    /// Destroys `m` and removes what was installed for it. Destroying what is already gone
    /// succeeds.
    async fn destroy(&self, m: &Machine) -> Result<(), ProviderError>;

    /// The machines carrying this brain's marker. `records` are this provider's records that
    /// are not ended, for providers that cannot enumerate on their own (ssh hosts).
    async fn list(&self, records: &[Machine]) -> Result<Vec<Seen>, ProviderError>;

    /// Called once `m`'s worker has joined: what only the join needed can go (the k8s
    /// provider's token secret).
    async fn joined(&self, _m: &Machine) -> Result<(), ProviderError> {
        Ok(())
    }
}
