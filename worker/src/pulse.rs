//! The worker's pulse: a thread of its own, with its own runtime and its own connection to
//! the brain, that says every beat that this worker is alive and what it has free. Nothing a
//! task does (scans, materialising, floods of output filling the session's queue, a busy
//! runtime) stands in front of it, so the brain reads a busy worker as busy, never as lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use proto::worker_session_client::WorkerSessionClient;
use shared::tls::{self, BrainAddr, DialOptions};
use tokio_util::sync::CancellationToken;

/// How long one pulse may take before it counts as missed.
const PULSE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a pulse reports besides the load of the machine.
pub struct Source {
    pub max_tasks: u32,
    /// Commands running now.
    pub running: Arc<dyn Fn() -> u32 + Send + Sync>,
}

/// Starts the pulse for one session; it stops when `stop` is cancelled. `answered` holds the
/// unix ms of the brain's last answer, for the session's own liveness check.
pub fn start(
    addr: BrainAddr,
    config: rustls::ClientConfig,
    every: Duration,
    source: Source,
    answered: Arc<AtomicI64>,
    stop: CancellationToken,
) {
    let spawned = std::thread::Builder::new()
        .name("tether-pulse".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the pulse; heartbeats ride on the session only");
                    return;
                }
            };
            rt.block_on(run(addr, config, every, source, answered, stop));
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the pulse thread; heartbeats ride on the session only");
    }
}

async fn run(
    addr: BrainAddr,
    config: rustls::ClientConfig,
    every: Duration,
    source: Source,
    answered: Arc<AtomicI64>,
    stop: CancellationToken,
) {
    let mut client: Option<WorkerSessionClient<tonic::transport::Channel>> = None;
    let mut cpu = crate::caps::cpu_times();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if client.is_none() {
            let dial = tls::dial(&addr, config.clone(), DialOptions::default());
            match tokio::time::timeout(PULSE_TIMEOUT, dial).await {
                Ok(Ok(ch)) => client = Some(WorkerSessionClient::new(ch)),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "pulse: cannot reach the brain");
                    continue;
                }
                Err(_) => continue,
            }
        }
        let now = crate::caps::cpu_times();
        let cpu_busy_permille = match (cpu, now) {
            (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
                ((b1.saturating_sub(b0)) * 1000 / (t1 - t0)) as u32
            }
            _ => 0,
        };
        cpu = now;
        let beat = proto::Heartbeat {
            unix_ms: shared::now_unix_ms(),
            load: Some(proto::Load {
                memory_free_bytes: crate::caps::memory_free(),
                cpu_busy_permille,
                running_calls: (source.running)(),
                max_tasks: source.max_tasks,
            }),
        };
        let Some(c) = client.as_mut() else { continue };
        match tokio::time::timeout(PULSE_TIMEOUT, c.pulse(beat)).await {
            Ok(Ok(_)) => answered.store(shared::now_unix_ms(), Ordering::Relaxed),
            Ok(Err(s)) if s.code() == tonic::Code::FailedPrecondition => {
                // The session is not registered yet (or just ended): nothing to keep.
            }
            Ok(Err(s)) => {
                tracing::debug!(status = %s.message(), "pulse refused; reconnecting it");
                client = None;
            }
            Err(_) => {
                tracing::debug!("pulse unanswered in time; reconnecting it");
                client = None;
            }
        }
    }
}
