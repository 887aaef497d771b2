//! Keeping the records true to the providers: reconcile (at start and every `reconcile_every`,
//! a minute by default; a machine the provider reports failed ends `failed` with its reason) and the
//! reaper (join deadline, time to live, idle timeout).

use shared::locks::{Lock, RwLockExt};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::records::{KEEP_ENDED_MS, V};
use super::{Error, Fence, Machine, Machines, Seen, Spec, State, now_ms};

impl Machines {
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
                // The listing is older than whatever happened before we took the guard: a
                // record that moved on since the snapshot is settled on the next pass.
                match self.get(&m.id) {
                    Ok(now) if now.state == m.state && now.handle == m.handle => {}
                    _ => continue,
                }
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
                    (
                        State::Joining | State::Ready,
                        Some(Seen {
                            failure: Some(why), ..
                        }),
                    ) => {
                        // Dead, or never to join: the provider said why.
                        let mut m = m.clone();
                        tracing::warn!(machine = %m.id, reason = %why, "machine failed");
                        m.note = why.clone();
                        m.state = State::Releasing;
                        self.put(&m).await?;
                        self.finish_release(m, State::Failed).await.map(drop)
                    }
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
                    self.inner.tree.remove(m.id.as_bytes()).await?;
                    self.inner.held.write_locked().remove(&m.id);
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
    /// `reaper_every` and reconciles every `reconcile_every`, until `stop`. With a `fence`
    /// (replicas: the leader lease), each pass runs only when the fence says it still may.
    pub async fn run_reaper(
        &self,
        stop: tokio_util::sync::CancellationToken,
        fence: Option<Fence>,
    ) {
        let may = || async {
            let Some(f) = &fence else { return true };
            let ok = f().await;
            if !ok {
                tracing::warn!(
                    "this replica's leader lease lapsed: the machine reaper's pass is skipped"
                );
            }
            ok
        };
        let pass = async {
            if may().await
                && let Err(e) = self.reconcile().await
            {
                tracing::warn!(error = %e, "reconciling machines failed");
            }
            let mut every = tokio::time::interval(self.inner.policy.reaper_every);
            let mut reconciled = Instant::now();
            loop {
                every.tick().await;
                if !may().await {
                    continue;
                }
                if let Err(e) = self.tick().await {
                    tracing::warn!(error = %e, "machine reaper pass failed");
                }
                if reconciled.elapsed() >= self.inner.policy.reconcile_every {
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
