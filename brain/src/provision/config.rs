//! `[provision]` in the brain's config file: per-provider quotas and prices, the reaper's
//! deadlines, the offers `request_environment` may provision, and each provider's section.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::{docker, ec2, k8s, local, ssh};
use crate::model::env::EnvRequest;

/// What is wrong with `[provision]`, or with a brain URL machines would be given.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("provision.{setting}: {why}")]
    Duration {
        setting: &'static str,
        #[source]
        why: shared::ParseError,
    },
    #[error("provision.join_timeout, call_timeout and reaper_every must be more than 0s")]
    ZeroDuration,
    #[error("provision.worker_exit_after must be at least 1s")]
    ShortExitAfter,
    /// A brain URL set in the config (`setting`: where) that [`check_url`] refuses.
    #[error("{setting}: {source}")]
    BrainUrl {
        setting: &'static str,
        #[source]
        source: Box<Error>,
    },
    #[error(transparent)]
    Url(#[from] shared::tls::Error),
    #[error("{0:?} has characters a brain URL does not need: use https://HOST:PORT")]
    UrlCharacters(String),
}

/// Per-provider limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderPolicy {
    /// Machines alive at once (0: none may be created).
    pub max_machines: u32,
    /// Sum of the hourly prices of live machines, in USD (0: no limit).
    pub max_usd_per_hour: f64,
    /// Hourly price of one machine, in USD.
    pub usd_per_hour: f64,
}

impl Default for ProviderPolicy {
    fn default() -> Self {
        Self {
            max_machines: 4,
            max_usd_per_hour: 0.0,
            usd_per_hour: 0.0,
        }
    }
}

/// `[provision]` in the brain's config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProvisionConfig {
    /// The URL machines dial (default: `https://127.0.0.1:<port>`, enough for `local`).
    pub brain_url: Option<String>,
    /// A machine whose worker has not joined by then is destroyed.
    pub join_timeout: String,
    /// A machine is released this long after it was created ("0s": never).
    pub ttl: String,
    /// A ready machine no task has used for this long is released ("0s": never).
    pub idle_timeout: String,
    /// Workers the brain starts exit when they cannot reach it for this long.
    pub worker_exit_after: String,
    /// How long one provider call may take.
    pub call_timeout: String,
    /// How often the reaper looks.
    pub reaper_every: String,
    /// How often the records are compared with what the providers show.
    pub reconcile_every: String,
    /// Requests from the agent whose machine costs more per hour than this ask for approval.
    pub approval_above_usd_per_hour: f64,
    pub providers: BTreeMap<String, ProviderPolicy>,
    pub local: local::LocalConfig,
    pub ssh: ssh::SshConfig,
    pub docker: docker::DockerConfig,
    pub ec2: ec2::Ec2Config,
    pub k8s: k8s::K8sConfig,
    /// What `request_environment` may provision, first fit first.
    pub offers: Vec<Offer>,
}

impl Default for ProvisionConfig {
    fn default() -> Self {
        Self {
            brain_url: None,
            join_timeout: "2m".into(),
            ttl: "12h".into(),
            idle_timeout: "30m".into(),
            worker_exit_after: "10m".into(),
            call_timeout: "5m".into(),
            reaper_every: "5s".into(),
            reconcile_every: "1m".into(),
            approval_above_usd_per_hour: 1.0,
            providers: BTreeMap::new(),
            local: local::LocalConfig::default(),
            ssh: ssh::SshConfig::default(),
            docker: docker::DockerConfig::default(),
            ec2: ec2::Ec2Config::default(),
            k8s: k8s::K8sConfig::default(),
            offers: Vec::new(),
        }
    }
}

/// [`ProvisionConfig`] with its durations parsed.
#[derive(Debug, Clone)]
pub struct Policy {
    pub join_timeout: Duration,
    pub ttl: Option<Duration>,
    pub idle_timeout: Option<Duration>,
    pub worker_exit_after: Duration,
    pub call_timeout: Duration,
    pub reaper_every: Duration,
    pub reconcile_every: Duration,
    pub approval_above_usd_per_hour: f64,
    pub providers: BTreeMap<String, ProviderPolicy>,
    pub offers: Vec<Offer>,
}

impl ProvisionConfig {
    /// Parses the durations; the error names the setting.
    pub fn policy(&self) -> Result<Policy, Error> {
        let d = |setting: &'static str, v: &str| {
            shared::parse_duration(v).map_err(|why| Error::Duration { setting, why })
        };
        let brain_url = |setting: &'static str, url: &str| {
            check_url(url).map_err(|e| Error::BrainUrl {
                setting,
                source: Box::new(e),
            })
        };
        let nonzero = |x: Duration| (!x.is_zero()).then_some(x);
        let p = Policy {
            join_timeout: d("join_timeout", &self.join_timeout)?,
            ttl: nonzero(d("ttl", &self.ttl)?),
            idle_timeout: nonzero(d("idle_timeout", &self.idle_timeout)?),
            worker_exit_after: d("worker_exit_after", &self.worker_exit_after)?,
            call_timeout: d("call_timeout", &self.call_timeout)?,
            reaper_every: d("reaper_every", &self.reaper_every)?,
            reconcile_every: d("reconcile_every", &self.reconcile_every)?,
            approval_above_usd_per_hour: self.approval_above_usd_per_hour,
            providers: self.providers.clone(),
            offers: self.offers.clone(),
        };
        for o in &p.offers {
            if let Some(url) = &o.brain_url {
                brain_url("provision.offers brain_url", url)?;
            }
        }
        if p.join_timeout.is_zero() || p.call_timeout.is_zero() || p.reaper_every.is_zero() {
            return Err(Error::ZeroDuration);
        }
        if p.worker_exit_after < Duration::from_secs(1) {
            return Err(Error::ShortExitAfter);
        }
        if let Some(url) = &self.brain_url {
            brain_url("provision.brain_url", url)?;
        }
        Ok(p)
    }
}

/// A brain URL machines can be given: `https://HOST[:PORT]`.
pub fn check_url(url: &str) -> Result<(), Error> {
    // The same parse the worker does, and only characters that go into a command line or
    // user data unquoted.
    shared::tls::BrainAddr::parse(url)?;
    let plain = url.len() <= 255
        && url
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._:[]/".contains(c));
    if plain {
        Ok(())
    } else {
        Err(Error::UrlCharacters(url.to_string()))
    }
}

impl Policy {
    pub(super) fn limits(&self, provider: &str) -> ProviderPolicy {
        self.providers.get(provider).cloned().unwrap_or_default()
    }
}

/// A machine the brain may provision when an agent asks for one.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Offer {
    /// `local`, `ssh`, `docker`, `ec2` or `k8s`.
    pub provider: String,
    /// For `ssh`: `[USER@]HOST`, and optionally a port and a key file.
    #[serde(default)]
    pub destination: String,
    #[serde(default)]
    pub port: u16,
    #[serde(default)]
    pub identity_file: String,
    pub cpu: u32,
    pub memory_gb: u32,
    #[serde(default)]
    pub disk_gb: u32,
    #[serde(default)]
    pub gpu: u32,
    /// Labels its worker carries.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Hourly price (default: the provider's `usd_per_hour`).
    #[serde(default)]
    pub usd_per_hour: Option<f64>,
    /// The URL this machine dials (default: `provision.brain_url`).
    #[serde(default)]
    pub brain_url: Option<String>,
}

impl Offer {
    pub(super) fn fits(&self, req: &EnvRequest) -> bool {
        self.cpu >= req.cpu
            && self.memory_gb >= req.memory_gb
            && self.disk_gb >= req.disk_gb
            && self.gpu >= req.gpu
            && req
                .labels
                .iter()
                .all(|(k, v)| self.labels.get(k) == Some(v))
    }

    pub(super) fn params(&self) -> serde_json::Value {
        if self.provider == "ssh" {
            serde_json::json!({
                "destination": self.destination,
                "port": self.port,
                "identity_file": self.identity_file,
            })
        } else {
            serde_json::Value::Null
        }
    }
}
