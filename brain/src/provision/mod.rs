//! Machines the brain creates for itself and releases again.
//!
//! A [`Provisioner`] knows one kind of machine (`local` processes, `ssh` hosts, …): it
//! creates one that runs a worker joining this brain with a one-time token, destroys one, and
//! lists what it can see that carries this brain's marker. [`Machines`] is the bookkeeping
//! around providers:
//!
//! - **Intent log.** A machine's record is in sled (flushed) *before* every provider call and
//!   updated after it: `creating` → `joining` → `ready` → `releasing` → `released` (or
//!   `failed`). A brain killed at any point leaves a record saying what it was about to do.
//! - **Reconcile.** On start, and every minute, records are compared with what each provider
//!   lists: a machine found for a record still `creating` is adopted (it joins with the token
//!   it was given, or the join deadline releases it); a record whose machine is gone is closed;
//!   a marked machine with no live record is destroyed; `releasing` records are released again.
//! - **Policy.** Per provider a maximum number of machines and of cost per hour; a join
//!   deadline, a time to live and an idle timeout, enforced by the reaper.
//!
//! Releasing a machine also revokes the worker identity it enrolled, so a released machine
//! cannot come back.

pub mod aws;
pub mod docker;
pub mod ec2;
pub mod env;
pub mod local;
pub mod ssh;

use shared::locks::Lock;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::fleet::hub::Hub;
use crate::fleet::placement::Placement;
use crate::trust::registry::Registry;

/// The label that names, on a worker, the machine record it was created for.
pub const MACHINE_LABEL: &str = "tether.machine";

/// Errors of provisioning.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("machine store: {0}")]
    Sled(#[from] sled::Error),
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
    #[error("{provider}: {source}")]
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
}

/// One kind of machine.
#[async_trait::async_trait]
pub trait Provisioner: Send + Sync {
    /// The provider's name in config, records and the CLI.
    fn name(&self) -> &'static str;

    /// Checks a request's provider-specific parameters before anything is recorded.
    fn check(&self, params: &serde_json::Value) -> Result<(), ProviderError>;

    /// Creates `m` (its id is the marker to put on it) running a worker that joins with `join`.
    async fn create(&self, m: &Machine, join: &Join) -> Result<Created, ProviderError>;

    /// Destroys `m` and removes what was installed for it. Destroying what is already gone
    /// succeeds.
    async fn destroy(&self, m: &Machine) -> Result<(), ProviderError>;

    /// The machines carrying this brain's marker. `records` are this provider's records that
    /// are not ended, for providers that cannot enumerate on their own (ssh hosts).
    async fn list(&self, records: &[Machine]) -> Result<Vec<Seen>, ProviderError>;
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
    /// Requests from the agent whose machine costs more per hour than this ask for approval.
    pub approval_above_usd_per_hour: f64,
    pub providers: BTreeMap<String, ProviderPolicy>,
    pub local: local::LocalConfig,
    pub ssh: ssh::SshConfig,
    pub docker: docker::DockerConfig,
    pub ec2: ec2::Ec2Config,
    /// What `request_environment` may provision, first fit first.
    pub offers: Vec<env::Offer>,
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
            approval_above_usd_per_hour: 1.0,
            providers: BTreeMap::new(),
            local: local::LocalConfig::default(),
            ssh: ssh::SshConfig::default(),
            docker: docker::DockerConfig::default(),
            ec2: ec2::Ec2Config::default(),
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
    pub approval_above_usd_per_hour: f64,
    pub providers: BTreeMap<String, ProviderPolicy>,
    pub offers: Vec<env::Offer>,
}

impl ProvisionConfig {
    /// Parses the durations; the error names the setting.
    pub fn policy(&self) -> Result<Policy, String> {
        let d = |name: &str, v: &str| {
            shared::parse_duration(v).map_err(|e| format!("provision.{name}: {e}"))
        };
        let nonzero = |x: Duration| (!x.is_zero()).then_some(x);
        let p = Policy {
            join_timeout: d("join_timeout", &self.join_timeout)?,
            ttl: nonzero(d("ttl", &self.ttl)?),
            idle_timeout: nonzero(d("idle_timeout", &self.idle_timeout)?),
            worker_exit_after: d("worker_exit_after", &self.worker_exit_after)?,
            call_timeout: d("call_timeout", &self.call_timeout)?,
            reaper_every: d("reaper_every", &self.reaper_every)?,
            approval_above_usd_per_hour: self.approval_above_usd_per_hour,
            providers: self.providers.clone(),
            offers: self.offers.clone(),
        };
        for o in &p.offers {
            if let Some(url) = &o.brain_url {
                check_url(url).map_err(|e| format!("provision.offers brain_url: {e}"))?;
            }
        }
        if p.join_timeout.is_zero() || p.call_timeout.is_zero() || p.reaper_every.is_zero() {
            return Err(
                "provision.join_timeout, call_timeout and reaper_every must be more than 0s".into(),
            );
        }
        if p.worker_exit_after < Duration::from_secs(1) {
            return Err("provision.worker_exit_after must be at least 1s".into());
        }
        if let Some(url) = &self.brain_url {
            check_url(url).map_err(|e| format!("provision.brain_url: {e}"))?;
        }
        Ok(p)
    }
}

/// A brain URL machines can be given: `https://HOST[:PORT]`.
pub fn check_url(url: &str) -> Result<(), String> {
    // The same parse the worker does, and only characters that go into a command line or
    // user data unquoted.
    shared::tls::BrainAddr::parse(url).map_err(|e| e.to_string())?;
    let plain = url.len() <= 255
        && url
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._:[]/".contains(c));
    if plain {
        Ok(())
    } else {
        Err(format!(
            "{url:?} has characters a brain URL does not need: use https://HOST:PORT"
        ))
    }
}

impl Policy {
    fn limits(&self, provider: &str) -> ProviderPolicy {
        self.providers.get(provider).cloned().unwrap_or_default()
    }
}

/// A request for a machine.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub provider: String,
    pub spec: Spec,
    pub params: serde_json::Value,
    pub labels: BTreeMap<String, String>,
    /// Worker name (default: the machine id).
    pub name: Option<String>,
    pub task: Option<String>,
    /// The URL this machine dials instead of the configured one.
    pub brain_url: Option<String>,
}

/// How this brain is reached and recognised.
#[derive(Debug, Clone)]
pub struct BrainInfo {
    pub url: String,
    pub ca_hash: String,
}

const V: u32 = 1;
/// Ended records are kept this long for `brain machines --all`, then dropped.
const KEEP_ENDED_MS: i64 = 7 * 24 * 3_600_000;
/// Reconcile with the providers this often besides at start.
const RECONCILE_EVERY: Duration = Duration::from_secs(60);

/// The machines of this brain. Cheap to clone.
#[derive(Clone)]
pub struct Machines {
    inner: Arc<Inner>,
}

struct Inner {
    db: sled::Db,
    tree: sled::Tree,
    registry: Registry,
    hub: Hub,
    brain: BrainInfo,
    policy: Policy,
    providers: BTreeMap<&'static str, Arc<dyn Provisioner>>,
    /// Serialises quota checks with the records they count.
    admit: tokio::sync::Mutex<()>,
    /// Machines with a provider call running in this process.
    busy: Mutex<HashSet<String>>,
    /// When a ready machine was last seen in use.
    used: Mutex<HashMap<String, Instant>>,
    /// Where tasks may run (for `request_environment`'s idle workers).
    placement: Placement,
    /// Whether a worker has a task now.
    in_use: InUse,
}

/// Whether a worker has a task now (the engine knows).
pub type InUse = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// Marks a machine as having a provider call running; cleared on drop.
struct BusyGuard<'a>(&'a Inner, String);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.busy.locked().remove(&self.1);
    }
}

fn now_ms() -> i64 {
    shared::now_unix_ms()
}

/// Kills this process with SIGKILL when `TETHER_FAILPOINT` names `point`: how the tests
/// stop the brain at an exact place in a provisioning flow.
fn failpoint(point: &str) {
    if std::env::var("TETHER_FAILPOINT").is_ok_and(|v| v == point) {
        tracing::warn!(point, "failpoint reached: killing this process");
        // SAFETY: kill(2) on our own pid has no memory-safety requirements.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

impl Machines {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        db: sled::Db,
        registry: Registry,
        hub: Hub,
        placement: Placement,
        brain: BrainInfo,
        policy: Policy,
        providers: Vec<Arc<dyn Provisioner>>,
        in_use: InUse,
    ) -> Result<Self, Error> {
        let tree = db.open_tree("machines")?;
        Ok(Self {
            inner: Arc::new(Inner {
                db,
                tree,
                registry,
                hub,
                brain,
                policy,
                providers: providers.into_iter().map(|p| (p.name(), p)).collect(),
                admit: tokio::sync::Mutex::new(()),
                busy: Mutex::default(),
                used: Mutex::default(),
                placement,
                in_use,
            }),
        })
    }

    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// The providers this brain has, by name.
    pub fn provider_names(&self) -> Vec<&'static str> {
        self.inner.providers.keys().copied().collect()
    }

    fn provider(&self, name: &str) -> Result<Arc<dyn Provisioner>, Error> {
        self.inner
            .providers
            .get(name)
            .cloned()
            .ok_or_else(|| Error::UnknownProvider {
                name: name.to_string(),
                have: self.provider_names().join(", "),
            })
    }

    /// Every record, newest first.
    pub fn list(&self) -> Result<Vec<Machine>, Error> {
        let mut v = Vec::new();
        for kv in self.inner.tree.iter() {
            let (k, bytes) = kv?;
            v.push(decode(&k, &bytes)?);
        }
        v.sort_by_key(|m: &Machine| std::cmp::Reverse(m.created_ms));
        Ok(v)
    }

    pub fn get(&self, id: &str) -> Result<Machine, Error> {
        let bytes = self
            .inner
            .tree
            .get(id.as_bytes())?
            .ok_or_else(|| Error::NoSuchMachine(id.to_string()))?;
        decode(id.as_bytes(), &bytes)
    }

    /// The machine a worker was created as, if any.
    pub fn by_worker(&self, worker: &str) -> Result<Option<Machine>, Error> {
        Ok(self
            .list()?
            .into_iter()
            .find(|m| m.worker.as_deref() == Some(worker) && !m.state.is_ended()))
    }

    async fn put(&self, m: &Machine) -> Result<(), Error> {
        self.inner.tree.insert(
            m.id.as_bytes(),
            serde_json::to_vec(m).expect("records serialise"),
        )?;
        self.inner.db.flush_async().await?;
        Ok(())
    }

    fn busy(&self, id: &str) -> Option<BusyGuard<'_>> {
        let mut b = self.inner.busy.locked();
        b.insert(id.to_string())
            .then(|| BusyGuard(&self.inner, id.to_string()))
    }

    /// Why `req` may not have a machine now, if it may not.
    pub fn refusal(&self, req: &Request) -> Result<Option<String>, Error> {
        let limits = self.inner.policy.limits(&req.provider);
        let live: Vec<Machine> = self
            .list()?
            .into_iter()
            .filter(|m| m.provider == req.provider && !m.state.is_ended())
            .collect();
        if live.len() as u32 >= limits.max_machines {
            return Ok(Some(format!(
                "provider {} may have at most {} machine(s) and has {}; release one (`brain machines release ID`) or raise provision.providers.{}.max_machines",
                req.provider,
                limits.max_machines,
                live.len(),
                req.provider
            )));
        }
        let hourly: f64 = live.iter().map(|m| m.usd_per_hour).sum();
        if limits.max_usd_per_hour > 0.0 && hourly + limits.usd_per_hour > limits.max_usd_per_hour {
            return Ok(Some(format!(
                "provider {} may cost at most ${:.2}/h; its machines cost ${:.2}/h and one more costs ${:.2}/h",
                req.provider, limits.max_usd_per_hour, hourly, limits.usd_per_hour
            )));
        }
        Ok(None)
    }

    /// The hourly price of a machine of `provider`.
    pub fn price(&self, provider: &str) -> f64 {
        self.inner.policy.limits(provider).usd_per_hour
    }

    /// Creates a machine: checks the request and the quota, records the intent, asks the
    /// provider, records the outcome. The machine then joins on its own (see [`Self::wait_ready`]).
    pub async fn provision(&self, req: Request) -> Result<Machine, Error> {
        let provider = self.provider(&req.provider)?;
        provider
            .check(&req.params)
            .map_err(|source| Error::Provider {
                provider: req.provider.clone(),
                source,
            })?;
        if let Some(name) = &req.name {
            shared::parse_label(&format!("name={name}")).map_err(Error::Invalid)?;
        }
        if let Some(url) = &req.brain_url {
            check_url(url).map_err(Error::Invalid)?;
        }
        let id = format!("m-{}", hex::encode(rand::random::<[u8; 6]>()));
        let mut m = {
            let _admit = self.inner.admit.lock().await;
            if let Some(why) = self.refusal(&req)? {
                return Err(Error::Quota(why));
            }
            let mut labels = req.labels.clone();
            labels.insert(MACHINE_LABEL.into(), id.clone());
            labels.insert("tether.provider".into(), req.provider.clone());
            let m = Machine {
                v: V,
                id: id.clone(),
                provider: req.provider.clone(),
                spec: req.spec.clone(),
                params: req.params.clone(),
                labels,
                state: State::Creating,
                handle: String::new(),
                address: String::new(),
                worker: None,
                task: req.task.clone(),
                usd_per_hour: self.price(&req.provider),
                created_ms: now_ms(),
                joined_ms: 0,
                ended_ms: 0,
                note: String::new(),
            };
            self.put(&m).await?;
            m
        };
        let _busy = self.busy(&id);
        let policy = &self.inner.policy;
        let (token, _) = self
            .inner
            .registry
            .create_token(policy.join_timeout.as_millis() as i64, m.labels.clone())
            .await?;
        let join = Join {
            brain_url: req
                .brain_url
                .clone()
                .unwrap_or_else(|| self.inner.brain.url.clone()),
            ca_hash: self.inner.brain.ca_hash.clone(),
            token,
            name: req.name.clone().unwrap_or_else(|| id.clone()),
            labels: m.labels.clone(),
            exit_after_unreachable: policy.worker_exit_after,
        };
        tracing::info!(machine = %id, provider = %m.provider, "creating a machine");
        let created = tokio::time::timeout(policy.call_timeout, provider.create(&m, &join)).await;
        failpoint("provision-created");
        match created {
            Ok(Ok(c)) => {
                m.state = State::Joining;
                m.handle = c.handle;
                m.address = c.address;
                self.put(&m).await?;
                tracing::info!(machine = %id, handle = %m.handle, address = %m.address, "machine created; waiting for its worker to join");
                Ok(m)
            }
            outcome => {
                let untouched = matches!(&outcome, Ok(Err(e)) if e.untouched);
                let err = match outcome {
                    Ok(Err(source)) => Error::Provider {
                        provider: m.provider.clone(),
                        source,
                    },
                    _ => Error::Timeout {
                        provider: m.provider.clone(),
                        doing: "creating a machine",
                        after: policy.call_timeout,
                    },
                };
                tracing::warn!(machine = %id, error = %err, "creating a machine failed; cleaning up");
                m.note = format!("create failed: {err}");
                if untouched {
                    m.state = State::Failed;
                    m.ended_ms = now_ms();
                    self.put(&m).await?;
                    return Err(err);
                }
                // A half-made machine may exist: destroy what there is. If that fails too,
                // the record stays `releasing` and reconcile tries again.
                m.state = State::Releasing;
                self.put(&m).await?;
                if let Err(e) = self.finish_release(m, State::Failed).await {
                    tracing::warn!(machine = %id, error = %e, "cleaning up after a failed create failed; will retry");
                }
                Err(err)
            }
        }
    }

    /// Waits until `id` is ready (its worker joined and connected), ended, or `timeout` passed.
    pub async fn wait_ready(&self, id: &str, timeout: Duration) -> Result<Machine, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_joined(id).await?;
            let m = self.get(id)?;
            let connected = m
                .worker
                .as_deref()
                .is_some_and(|w| self.inner.hub.session(w).is_some());
            if (m.state == State::Ready && connected)
                || m.state.is_ended()
                || Instant::now() >= deadline
            {
                return Ok(m);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Moves a joining machine to ready once a worker enrolled with its label.
    async fn check_joined(&self, id: &str) -> Result<(), Error> {
        let m = self.get(id)?;
        if m.state != State::Joining {
            return Ok(());
        }
        let worker = self
            .inner
            .registry
            .workers()?
            .into_iter()
            .find(|w| !w.revoked && w.labels.get(MACHINE_LABEL) == Some(&m.id));
        if let Some(w) = worker {
            let _admit = self.inner.admit.lock().await;
            let mut m = self.get(id)?;
            if m.state == State::Joining {
                m.state = State::Ready;
                m.worker = Some(w.id.clone());
                m.joined_ms = now_ms();
                self.put(&m).await?;
                self.inner
                    .used
                    .locked()
                    .insert(m.id.clone(), Instant::now());
                tracing::info!(machine = %m.id, worker = %w.id, "machine joined");
            }
        }
        Ok(())
    }

    /// Releases a machine: records the intent, destroys it, revokes its worker, records the end.
    pub async fn release(&self, id: &str, why: &str) -> Result<Machine, Error> {
        let _busy = self.busy(id).ok_or_else(|| {
            Error::Invalid(format!(
                "machine {id} is being created or released right now; try again in a moment"
            ))
        })?;
        let m = {
            let _admit = self.inner.admit.lock().await;
            let mut m = self.get(id)?;
            if m.state.is_ended() {
                return Err(Error::AlreadyEnded {
                    id: m.id,
                    state: m.state.name(),
                });
            }
            m.state = State::Releasing;
            m.note = why.to_string();
            self.put(&m).await?;
            m
        };
        self.finish_release(m, State::Released).await
    }

    /// Destroys a machine already recorded as releasing and records `end`.
    async fn finish_release(&self, mut m: Machine, end: State) -> Result<Machine, Error> {
        let provider = self.provider(&m.provider)?;
        tracing::info!(machine = %m.id, why = %m.note, "releasing a machine");
        let destroyed =
            tokio::time::timeout(self.inner.policy.call_timeout, provider.destroy(&m)).await;
        match destroyed {
            Ok(Ok(())) => {}
            Ok(Err(source)) => {
                return Err(Error::Provider {
                    provider: m.provider.clone(),
                    source,
                });
            }
            Err(_) => {
                return Err(Error::Timeout {
                    provider: m.provider.clone(),
                    doing: "destroying a machine",
                    after: self.inner.policy.call_timeout,
                });
            }
        }
        // Its identity goes with it: whatever runs there cannot come back.
        let worker = match &m.worker {
            Some(w) => Some(w.clone()),
            None => self
                .inner
                .registry
                .workers()?
                .into_iter()
                .find(|w| w.labels.get(MACHINE_LABEL) == Some(&m.id))
                .map(|w| w.id),
        };
        if let Some(w) = worker {
            self.inner.registry.revoke_worker(&w).await?;
            self.inner.hub.disconnect(
                &w,
                tonic::Status::permission_denied(format!("machine {} was released", m.id)),
            );
            m.worker = Some(w);
        }
        m.state = end;
        m.ended_ms = now_ms();
        self.put(&m).await?;
        self.inner.used.locked().remove(&m.id);
        tracing::info!(machine = %m.id, state = end.name(), "machine released");
        Ok(m)
    }

    /// Compares records with what the providers see, and settles every difference.
    pub async fn reconcile(&self) -> Result<(), Error> {
        for (name, provider) in &self.inner.providers {
            let records: Vec<Machine> = self
                .list()?
                .into_iter()
                .filter(|m| m.provider == *name && !m.state.is_ended())
                .collect();
            let seen = match tokio::time::timeout(
                self.inner.policy.call_timeout,
                provider.list(&records),
            )
            .await
            {
                Ok(Ok(s)) => s,
                // A provider nobody uses (no Docker engine here, say) is not worth a warning.
                Ok(Err(e)) if records.is_empty() => {
                    tracing::debug!(provider = name, error = %e, "cannot list machines");
                    continue;
                }
                Ok(Err(e)) => {
                    tracing::warn!(provider = name, error = %e, "cannot list machines; will retry");
                    continue;
                }
                Err(_) => {
                    tracing::warn!(provider = name, "listing machines timed out; will retry");
                    continue;
                }
            };
            tracing::debug!(provider = name, records = records.len(), seen = ?seen, "reconciling");
            let seen_ids: HashMap<&str, &Seen> =
                seen.iter().map(|s| (s.machine.as_str(), s)).collect();
            for m in records {
                let Some(_busy) = self.busy(&m.id) else {
                    continue;
                };
                let found = seen_ids.get(m.id.as_str());
                let outcome = match (m.state, found) {
                    (State::Creating, Some(s)) => {
                        let mut m = m.clone();
                        m.state = State::Joining;
                        m.handle = s.handle.clone();
                        m.note = "adopted: found after its creation was interrupted".into();
                        tracing::info!(machine = %m.id, handle = %m.handle, "machine adopted");
                        self.put(&m).await
                    }
                    (State::Creating, None) => {
                        let mut m = m.clone();
                        m.note =
                            "creation was interrupted and the provider shows no machine".into();
                        m.state = State::Releasing;
                        self.put(&m).await?;
                        self.finish_release(m, State::Failed).await.map(drop)
                    }
                    (State::Releasing, _) => self
                        .finish_release(m.clone(), State::Released)
                        .await
                        .map(drop),
                    (State::Joining | State::Ready, None) => {
                        let mut m = m.clone();
                        m.note = "gone: the provider no longer shows it".into();
                        m.state = State::Releasing;
                        self.put(&m).await?;
                        self.finish_release(m, State::Released).await.map(drop)
                    }
                    _ => Ok(()),
                };
                if let Err(e) = outcome {
                    tracing::warn!(machine = %m.id, error = %e, "reconciling a machine failed; will retry");
                }
            }
            // Marked machines without a live record: left by a crash or a lost record.
            for s in &seen {
                let rec = self.get(&s.machine).ok();
                if rec.as_ref().is_some_and(|m| !m.state.is_ended()) {
                    continue;
                }
                let Some(_busy) = self.busy(&s.machine) else {
                    continue;
                };
                tracing::warn!(provider = name, machine = %s.machine, handle = %s.handle, "destroying a machine this brain no longer accounts for");
                let m = rec.unwrap_or_else(|| Machine {
                    v: V,
                    id: s.machine.clone(),
                    provider: name.to_string(),
                    spec: Spec::default(),
                    params: serde_json::Value::Null,
                    labels: BTreeMap::new(),
                    state: State::Releasing,
                    handle: s.handle.clone(),
                    address: String::new(),
                    worker: None,
                    task: None,
                    usd_per_hour: 0.0,
                    created_ms: now_ms(),
                    joined_ms: 0,
                    ended_ms: 0,
                    note: "orphan: no record named it".into(),
                });
                if let Err(e) = provider.destroy(&m).await {
                    tracing::warn!(machine = %m.id, error = %e, "destroying an orphan failed; will retry");
                }
            }
        }
        Ok(())
    }

    /// One pass of the reaper: joins, join deadlines, time to live, idleness, old records.
    pub async fn tick(&self) -> Result<(), Error> {
        let now = now_ms();
        let policy = self.inner.policy.clone();
        for m in self.list()? {
            if self.inner.busy.locked().contains(&m.id) {
                continue;
            }
            if m.state.is_ended() {
                if now - m.ended_ms > KEEP_ENDED_MS {
                    self.inner.tree.remove(m.id.as_bytes())?;
                }
                continue;
            }
            if m.state == State::Joining {
                self.check_joined(&m.id).await?;
            }
            let m = self.get(&m.id)?;
            let age = Duration::from_millis((now - m.created_ms).max(0) as u64);
            let why = match m.state {
                State::Joining if age > policy.join_timeout => Some(format!(
                    "its worker did not join within {:?}",
                    policy.join_timeout
                )),
                State::Joining | State::Ready if policy.ttl.is_some_and(|t| age > t) => Some(
                    format!("its time to live ({:?}) ran out", policy.ttl.unwrap()),
                ),
                State::Ready => self.idle_for(&m).and_then(|idle| {
                    policy
                        .idle_timeout
                        .filter(|t| idle > *t)
                        .map(|t| format!("no task used it for {t:?}"))
                }),
                _ => None,
            };
            if let Some(why) = why
                && let Err(e) = self.release(&m.id, &why).await
            {
                tracing::warn!(machine = %m.id, error = %e, "releasing a machine failed; will retry");
            }
        }
        Ok(())
    }

    /// How long a ready machine has gone without a task.
    fn idle_for(&self, m: &Machine) -> Option<Duration> {
        let w = m.worker.as_deref()?;
        let mut used = self.inner.used.locked();
        let last = used.entry(m.id.clone()).or_insert_with(Instant::now);
        if (self.inner.in_use)(w) {
            *last = Instant::now();
        }
        Some(last.elapsed())
    }

    /// Reconciles with the providers, then reaps (join deadline, TTL, idle) every
    /// `reaper_every` and reconciles every minute, until `stop`.
    pub async fn run_reaper(&self, stop: tokio_util::sync::CancellationToken) {
        let pass = async {
            if let Err(e) = self.reconcile().await {
                tracing::warn!(error = %e, "reconciling machines failed");
            }
            let mut every = tokio::time::interval(self.inner.policy.reaper_every);
            let mut reconciled = Instant::now();
            loop {
                every.tick().await;
                if let Err(e) = self.tick().await {
                    tracing::warn!(error = %e, "machine reaper pass failed");
                }
                if reconciled.elapsed() >= RECONCILE_EVERY {
                    reconciled = Instant::now();
                    if let Err(e) = self.reconcile().await {
                        tracing::warn!(error = %e, "reconciling machines failed");
                    }
                }
            }
        };
        tokio::select! {
            _ = pass => {}
            _ = stop.cancelled() => {}
        }
    }
}

fn decode(key: &[u8], bytes: &[u8]) -> Result<Machine, Error> {
    serde_json::from_slice(bytes).map_err(|e| Error::Decode {
        id: String::from_utf8_lossy(key).into_owned(),
        reason: e.to_string(),
    })
}
