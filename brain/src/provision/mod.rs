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
mod config;
pub mod docker;
pub mod ec2;
pub mod env;
mod error;
pub mod k8s;
pub mod local;
mod provider;
mod reconcile;
mod records;
pub mod ssh;

pub use config::{Error as ConfigError, Offer, Policy, ProviderPolicy, ProvisionConfig, check_url};
pub use error::{Error, ProviderError};
pub use provider::{Created, Join, Provisioner, Seen};
pub use records::{Machine, Spec, State};
use records::{V, decode};

use shared::locks::{Lock, RwLockExt};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::fleet::hub::Hub;
use crate::fleet::placement::Placement;
use crate::trust::registry::Registry;

/// The label that names, on a worker, the machine record it was created for.
pub const MACHINE_LABEL: &str = "tether.machine";

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

/// Whether work only one replica may do may still be done here (the machine reaper checks it
/// before each pass).
pub type Fence =
    std::sync::Arc<dyn Fn() -> futures_util::future::BoxFuture<'static, bool> + Send + Sync>;

/// The machines of this brain. Cheap to clone.
#[derive(Clone)]
pub struct Machines {
    inner: Arc<Inner>,
}

struct Inner {
    tree: Arc<dyn crate::storage::kv::Tree>,
    /// Every record as stored, by id, read at start and kept as this brain writes them:
    /// the quota checks, costs and placement read them without waiting on the store.
    held: std::sync::RwLock<BTreeMap<String, Result<Machine, String>>>,
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
    /// Woken on every change of a machine's record.
    changed: tokio::sync::Notify,
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

/// Whether a brain URL names an address another host can dial: not loopback (`127.0.0.1`,
/// `::1`, `localhost`) and not unspecified (`0.0.0.0`, `::`).
fn reachable_from_elsewhere(url: &str) -> bool {
    let Ok(addr) = shared::tls::BrainAddr::parse(url) else {
        return false;
    };
    let host = addr.host.trim_start_matches('[').trim_end_matches(']');
    if host.eq_ignore_ascii_case("localhost") || host.ends_with(".localhost") {
        return false;
    }
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => !(ip.is_loopback() || ip.is_unspecified()),
        Err(_) => true,
    }
}

impl Machines {
    #[allow(clippy::too_many_arguments)]
    pub async fn new(
        store: &crate::storage::kv::Store,
        registry: Registry,
        hub: Hub,
        placement: Placement,
        brain: BrainInfo,
        policy: Policy,
        providers: Vec<Arc<dyn Provisioner>>,
        in_use: InUse,
    ) -> Result<Self, Error> {
        let tree = store.tree("machines")?;
        let held = read_records(tree.as_ref()).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                tree,
                held: std::sync::RwLock::new(held),
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
                changed: tokio::sync::Notify::new(),
            }),
        })
    }

    /// Reads the machine records again from the store: what other brains sharing it
    /// provisioned or released since (the reaper of a replica that becomes the leader starts
    /// from them).
    pub async fn refresh(&self) -> Result<(), Error> {
        let held = read_records(self.inner.tree.as_ref()).await?;
        *self.inner.held.write_locked() = held;
        Ok(())
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
        for (id, m) in self.inner.held.read_locked().iter() {
            v.push(m.clone().map_err(|reason| Error::Decode {
                id: id.clone(),
                reason,
            })?);
        }
        v.sort_by_key(|m: &Machine| std::cmp::Reverse(m.created_ms));
        Ok(v)
    }

    pub fn get(&self, id: &str) -> Result<Machine, Error> {
        self.inner
            .held
            .read_locked()
            .get(id)
            .cloned()
            .ok_or_else(|| Error::NoSuchMachine(id.to_string()))?
            .map_err(|reason| Error::Decode {
                id: id.to_string(),
                reason,
            })
    }

    /// The machine a worker was created as, if any.
    pub fn by_worker(&self, worker: &str) -> Result<Option<Machine>, Error> {
        Ok(self
            .list()?
            .into_iter()
            .find(|m| m.worker.as_deref() == Some(worker) && !m.state.is_ended()))
    }

    async fn put(&self, m: &Machine) -> Result<(), Error> {
        self.inner
            .tree
            .insert(
                m.id.as_bytes(),
                &serde_json::to_vec(m).expect("records serialise"),
            )
            .await?;
        self.inner.tree.flush().await?;
        self.inner
            .held
            .write_locked()
            .insert(m.id.clone(), Ok(m.clone()));
        self.inner.changed.notify_waiters();
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
            .check(&req.params, &req.spec)
            .map_err(|source| Error::Provider {
                provider: req.provider.clone(),
                source,
            })?;
        let brain_url = req
            .brain_url
            .clone()
            .unwrap_or_else(|| self.inner.brain.url.clone());
        if provider.remote(&req.params) && !reachable_from_elsewhere(&brain_url) {
            return Err(Error::Invalid(format!(
                "a {} machine is another host, and cannot reach this brain at {brain_url}: set provision.brain_url in the brain's config to an address it can reach (e.g. https://brain.example:7443)",
                req.provider
            )));
        }
        if let Some(name) = &req.name {
            shared::parse_label(&format!("name={name}"))
                .map_err(|e| Error::Invalid(e.to_string()))?;
        }
        if let Some(url) = &req.brain_url {
            check_url(url).map_err(|e| Error::Invalid(e.to_string()))?;
        }
        let id = format!("m-{}", hex::encode(rand::random::<[u8; 6]>()));
        // Held from before the record is written: reconcile must never read a `creating`
        // record of a create still running as interrupted.
        let _busy = self.busy(&id);
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
        let policy = &self.inner.policy;
        let (token, _) = self
            .inner
            .registry
            .create_token(policy.join_timeout.as_millis() as i64, m.labels.clone())
            .await?;
        let join = Join {
            brain_url,
            ca_hash: self.inner.brain.ca_hash.clone(),
            token,
            name: req.name.clone().unwrap_or_else(|| id.clone()),
            labels: m.labels.clone(),
            exit_after_unreachable: policy.worker_exit_after,
        };
        tracing::info!(machine = %id, provider = %m.provider, "creating a machine");
        let created = tokio::time::timeout(policy.call_timeout, provider.create(&m, &join)).await;
        shared::failpoint("provision-created");
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
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Made before looking, so what changes between the look and the wait wakes it:
            // a worker's session registered (it enrolled just before), or the record changed
            // (released, failed).
            let session = self.inner.hub.registered();
            let record = self.inner.changed.notified();
            self.check_joined(id).await?;
            let m = self.get(id)?;
            let connected = m
                .worker
                .as_deref()
                .is_some_and(|w| self.inner.hub.session(w).is_some());
            if (m.state == State::Ready && connected) || m.state.is_ended() {
                return Ok(m);
            }
            tokio::select! {
                _ = session => {}
                _ = record => {}
                _ = tokio::time::sleep_until(deadline) => return self.get(id),
            }
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
                if let Ok(p) = self.provider(&m.provider)
                    && let Err(e) = p.joined(&m).await
                {
                    tracing::warn!(machine = %m.id, error = %e, "tidying up after the join failed");
                }
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
}

/// Every machine record in `tree`, each decoded or the reason it cannot be.
async fn read_records(
    tree: &dyn crate::storage::kv::Tree,
) -> Result<std::collections::BTreeMap<String, Result<Machine, String>>, Error> {
    Ok(tree
        .scan_prefix(b"")
        .await?
        .into_iter()
        .map(|(k, v)| {
            let m = decode(&k, &v).map_err(|e| match e {
                Error::Decode { reason, .. } => reason,
                other => other.to_string(),
            });
            (String::from_utf8_lossy(&k).into_owned(), m)
        })
        .collect())
}
