//! `request_environment`: the agent asks for a machine with at least some resources and
//! labels. An idle connected worker that fits is reused; otherwise the first configured offer
//! that fits (`[[provision.offers]]`) is provisioned for the task, within the provider's
//! quota and the task's money budget. The agent loop then moves the task there and releases
//! the machine it left if the brain created it.

use super::config::Offer;
use super::{Machines, Request, Spec, State};
use crate::model::env::{EnvRequest, Grant, Quote};
use crate::trust::registry::WorkerRecord;

/// Why no machine can be had for a request, or why every offer that fits was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Registry(#[from] crate::trust::registry::Error),
    #[error(
        "no connected idle worker and no configured machine offer has {} cpu, {} GB memory, {} GB disk, {} gpu and labels {:?}; ask for less, or finish with what you have",
        .0.cpu, .0.memory_gb, .0.disk_gb, .0.gpu, .0.labels
    )]
    NoOffer(EnvRequest),
    #[error("a {provider} machine costs ${usd:.2}/h and the task's budget has ${left:.2} left")]
    OverBudget {
        provider: String,
        usd: f64,
        left: f64,
    },
    #[error(transparent)]
    Provision(#[from] super::Error),
    #[error("machine {0} did not join in time")]
    NotJoined(String),
    /// Why each fitting offer was refused, in order.
    #[error("{}", refusals(.0))]
    Refused(Vec<Error>),
}

/// The refusals, one after another.
fn refusals(each: &[Error]) -> String {
    each.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A budget must cover a new machine for this long.
const MIN_AFFORDABLE: f64 = 0.25;
const GIB: f64 = (1u64 << 30) as f64;

/// Whether a worker's reported resources and labels meet `req` (10% slack on memory and
/// disk: systems report less than the nominal size).
fn worker_fits(w: &WorkerRecord, req: &EnvRequest) -> bool {
    let caps = w.caps.clone().unwrap_or_default();
    let gpus: u32 = w
        .labels
        .get("gpu")
        .and_then(|g| g.parse().ok())
        .unwrap_or(0);
    caps.cpus >= req.cpu
        && caps.memory_bytes as f64 >= f64::from(req.memory_gb) * GIB * 0.9
        && caps.disk_free_bytes as f64 >= f64::from(req.disk_gb) * GIB * 0.9
        && gpus >= req.gpu
        && req.labels.iter().all(|(k, v)| w.labels.get(k) == Some(v))
}

fn describe_worker(w: &WorkerRecord) -> String {
    let caps = w.caps.clone().unwrap_or_default();
    format!(
        "worker {} ({}; {} cpu, {:.1} GB memory, {:.0} GB disk free)",
        w.name,
        w.id,
        caps.cpus,
        caps.memory_bytes as f64 / GIB,
        caps.disk_free_bytes as f64 / GIB
    )
}

impl Machines {
    /// A connected, allowed, idle worker other than `current` that fits, preferring one
    /// created for `task` (e.g. adopted after a restart).
    fn idle_fit(&self, task: &str, current: &str, req: &EnvRequest) -> Option<WorkerRecord> {
        let mine: Vec<String> = self
            .list()
            .ok()?
            .into_iter()
            .filter(|m| m.task.as_deref() == Some(task) && !m.state.is_ended())
            .filter_map(|m| m.worker)
            .collect();
        let mut fits: Vec<WorkerRecord> = self
            .inner
            .placement
            .candidates(&req.labels)
            .into_iter()
            .filter(|w| w.id != current)
            .filter(|w| !(self.inner.in_use)(&w.id))
            .filter(|w| worker_fits(w, req))
            .collect();
        fits.sort_by_key(|w| !mine.contains(&w.id));
        fits.into_iter().next()
    }

    fn offer_price(&self, o: &Offer) -> f64 {
        o.usd_per_hour.unwrap_or_else(|| self.price(&o.provider))
    }
}

/// What `request_environment` gets from the machines (the engine's `Environments` port).
impl Machines {
    /// The hourly price of what `req` would get, and whether that needs a person's approval.
    pub fn quote(&self, task: &str, current: &str, req: &EnvRequest) -> Quote {
        let current_fits = self
            .inner
            .registry
            .workers()
            .ok()
            .and_then(|ws| ws.into_iter().find(|w| w.id == current))
            .is_some_and(|w| worker_fits(&w, req));
        if current_fits || self.idle_fit(task, current, req).is_some() {
            return Quote {
                reuse: true,
                ..Quote::default()
            };
        }
        match self.inner.policy.offers.iter().find(|o| o.fits(req)) {
            Some(o) => {
                let usd = self.offer_price(o);
                Quote {
                    reuse: false,
                    offer: true,
                    usd_per_hour: usd,
                    needs_approval: usd > self.inner.policy.approval_above_usd_per_hour,
                }
            }
            None => Quote::default(),
        }
    }

    /// A connected worker that fits `req` (not `current`), provisioned for `task` if need
    /// be; `budget_left` (USD, `None`: no money limit) bounds what it may cost.
    pub async fn obtain(
        &self,
        task: &str,
        current: &str,
        req: &EnvRequest,
        budget_left: Option<f64>,
    ) -> Result<Grant, Error> {
        let workers = self.inner.registry.workers()?;
        if let Some(w) = workers.iter().find(|w| w.id == current)
            && worker_fits(w, req)
        {
            return Ok(Grant {
                worker: w.id.clone(),
                describe: describe_worker(w),
                machine: None,
            });
        }
        if let Some(w) = self.idle_fit(task, current, req) {
            tracing::info!(task, worker = %w.id, "an idle worker fits the request");
            return Ok(Grant {
                worker: w.id.clone(),
                describe: describe_worker(&w),
                machine: None,
            });
        }
        let offers: Vec<&Offer> = self
            .inner
            .policy
            .offers
            .iter()
            .filter(|o| o.fits(req))
            .collect();
        if offers.is_empty() {
            return Err(Error::NoOffer(req.clone()));
        }
        let mut refusals: Vec<Error> = Vec::new();
        for o in offers {
            let usd = self.offer_price(o);
            if let Some(left) = budget_left
                && usd * MIN_AFFORDABLE > left
            {
                refusals.push(Error::OverBudget {
                    provider: o.provider.clone(),
                    usd,
                    left: left.max(0.0),
                });
                continue;
            }
            let mut labels = o.labels.clone();
            labels.extend(req.labels.clone());
            let request = Request {
                provider: o.provider.clone(),
                spec: Spec {
                    cpu: o.cpu,
                    memory_gb: o.memory_gb,
                    disk_gb: o.disk_gb,
                    gpu: o.gpu,
                },
                params: o.params(),
                labels,
                name: None,
                task: Some(task.to_string()),
                brain_url: o.brain_url.clone(),
            };
            let m = match self.provision(request).await {
                Ok(m) => m,
                Err(e) => {
                    refusals.push(e.into());
                    continue;
                }
            };
            let m = self
                .wait_ready(&m.id, self.inner.policy.join_timeout)
                .await?;
            let connected = m
                .worker
                .as_deref()
                .is_some_and(|w| self.inner.hub.session(w).is_some());
            if m.state != State::Ready || !connected {
                let _ = self.release(&m.id, "its worker did not join in time").await;
                refusals.push(Error::NotJoined(m.id));
                continue;
            }
            let worker = m.worker.clone().unwrap_or_default();
            return Ok(Grant {
                describe: format!(
                    "machine {} ({}, {}; {} cpu, {} GB memory, {} GB disk; ${usd:.2}/h), worker {worker}",
                    m.id, m.provider, m.address, o.cpu, o.memory_gb, o.disk_gb
                ),
                worker,
                machine: Some(m.id),
            });
        }
        Err(Error::Refused(refusals))
    }

    /// Releases the machine `worker` runs on if the brain created it and no task uses it
    /// any more; says what it did.
    pub async fn release_if_ours(&self, worker: &str, task: &str) -> Option<String> {
        let m = self.by_worker(worker).ok()??;
        if (self.inner.in_use)(worker) {
            return None;
        }
        match self
            .release(&m.id, &format!("task {task} moved to another machine"))
            .await
        {
            Ok(m) => Some(format!(
                "The previous machine {} ({}) was released.",
                m.id, m.provider
            )),
            Err(e) => {
                tracing::warn!(machine = %m.id, error = %e, "releasing the machine a task left failed; the reaper will");
                None
            }
        }
    }

    /// Releases every machine created for `task` that no task uses any more (an attempt
    /// that ended); says what it released.
    pub async fn release_for_task(&self, task: &str) -> Vec<String> {
        let mine: Vec<_> = self
            .list()
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m.task.as_deref() == Some(task) && !m.state.is_ended())
            .collect();
        let mut done = Vec::new();
        for m in mine {
            if m.worker.as_deref().is_some_and(|w| (self.inner.in_use)(w)) {
                continue;
            }
            match self.release(&m.id, &format!("task {task} ended")).await {
                Ok(m) => done.push(format!("machine {} ({})", m.id, m.provider)),
                Err(e) => {
                    tracing::warn!(machine = %m.id, error = %e, "releasing an ended task's machine failed; the reaper will");
                }
            }
        }
        done
    }

    /// Whether anything could be obtained for a task on `current`: an offer is configured,
    /// or another worker the policy allows is connected.
    pub fn available(&self, current: &str) -> bool {
        !self.inner.policy.offers.is_empty() || self.inner.placement.another_connected(current)
    }

    /// What the machines created for `task` have cost so far (USD).
    pub fn task_cost(&self, task: &str) -> f64 {
        let now = shared::now_unix_ms();
        self.list()
            .map(|ms| {
                ms.iter()
                    .filter(|m| m.task.as_deref() == Some(task))
                    .map(|m| m.cost_usd(now))
                    .sum()
            })
            .unwrap_or(0.0)
    }
}
