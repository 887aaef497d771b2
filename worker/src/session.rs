//! Enrolment and the session loop: dial out to the brain, say hello, answer calls, send
//! heartbeats, and reconnect with exponential backoff and jitter whenever the session ends.

use shared::locks::Lock;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::enrollment_client::EnrollmentClient;
use proto::worker_session_client::WorkerSessionClient;
use proto::{BrainMessage, WorkerMessage, brain_message, worker_message};
use shared::pki::{self, IdentityFiles, PinnedCaVerifier};
use shared::tls::{self, BrainAddr, DialOptions};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::state::{Membership, StateDir};

/// Errors joining or running.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    State(#[from] crate::state::Error),
    #[error(transparent)]
    Pki(#[from] pki::Error),
    #[error(transparent)]
    Tls(#[from] tls::Error),
    #[error(
        "CA hash mismatch: the brain at {url} presents CA {presented}, but --ca-hash pins {pinned}; check the hash printed by `brain token create` (or you are talking to another brain)"
    )]
    CaMismatch {
        url: String,
        presented: String,
        pinned: String,
    },
    #[error("enrolment refused: {0}")]
    Refused(String),
    #[error(
        "this worker already joined a brain as {0}: use `worker run`, or `worker join --force` to enrol again"
    )]
    AlreadyJoined(String),
    #[error("the brain at {url} has been unreachable for {after:?}; giving up as configured")]
    Unreachable { url: String, after: Duration },
    #[error(
        "the brain at {url} no longer takes this worker ({reason}), so it stops. To work for that brain again, join it anew: `worker join --force --brain URL --token T --ca-hash H`"
    )]
    Dismissed { url: String, reason: String },
}

impl shared::exit::Classify for Error {
    fn exit_code(&self) -> Option<shared::exit::ExitCode> {
        match self {
            Error::State(e) => e.exit_code(),
            Error::Pki(e) => e.exit_code(),
            Error::Tls(e) => e.exit_code(),
            // The brain's CA is not the pinned one: the --ca-hash or the URL is wrong.
            Error::CaMismatch { .. } => Some(shared::exit::ExitCode::Config),
            // `Refused` carries any status the brain or the transport gave, some of them
            // transient; `AlreadyJoined` is a usage error.
            Error::Unreachable { .. } => Some(shared::exit::ExitCode::GaveUp),
            // Starting again would be refused again: a service manager must not restart it.
            Error::Dismissed { .. } => Some(shared::exit::ExitCode::Config),
            Error::Refused(_) | Error::AlreadyJoined(_) => None,
        }
    }
}

/// Why a session could not start, or broke before it ran.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Dial(#[from] tls::Error),
    #[error("internal: outbound queue closed")]
    QueueClosed,
    /// The brain's or the transport's status, in `tls::explain_status`'s words.
    #[error("{0}")]
    Status(String),
    #[error("the brain did not acknowledge our hello")]
    NoAck,
    #[error("no hello acknowledgement from the brain within 10s")]
    AckTimeout,
    /// The brain speaks no protocol this worker does (`proto::compatible` says which).
    #[error("{0}")]
    Protocol(String),
    /// The brain refused this worker's certificate for good (`tls::refused_for_good`).
    #[error("{0}")]
    RefusedForGood(String),
}

/// What `worker join` needs.
#[derive(Clone)]
pub struct JoinOptions {
    pub brain: String,
    /// Further brains sharing its store, kept for reconnecting.
    pub more_brains: Vec<String>,
    pub token: String,
    pub ca_hash: String,
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub force: bool,
}

/// Enrols with the brain: pins its CA by hash, sends a CSR with the token, stores the
/// returned certificate. The private key is generated here and never sent.
pub async fn join(state: &StateDir, opts: JoinOptions) -> Result<Membership, Error> {
    if state.is_joined() && !opts.force {
        let (m, _) = state.load()?;
        return Err(Error::AlreadyJoined(m.worker_id));
    }
    let pin = pki::parse_ca_hash(&opts.ca_hash)?;
    let addr = BrainAddr::parse(&opts.brain)?;
    let more_brains = opts
        .more_brains
        .iter()
        .map(|u| BrainAddr::parse(u).map(|a| a.url()))
        .collect::<Result<Vec<_>, _>>()?;
    let (verifier, seen) = PinnedCaVerifier::new(pin);
    let channel = match tls::dial(&addr, verifier.client_config()?, DialOptions::default()).await {
        Ok(c) => c,
        Err(e) => {
            let seen = seen.locked().clone();
            if seen.ca_der.is_none() && !seen.presented.is_empty() {
                return Err(Error::CaMismatch {
                    url: addr.url(),
                    presented: seen.presented.join(", "),
                    pinned: opts.ca_hash.trim().to_string(),
                });
            }
            return Err(e.into());
        }
    };
    let (key, csr) = pki::new_key_and_csr(&opts.name)?;
    let resp = EnrollmentClient::new(channel)
        .enroll(proto::EnrollRequest {
            token: opts.token.trim().to_string(),
            csr_der: csr,
            name: opts.name.clone(),
            labels: opts.labels.iter().cloned().collect(),
        })
        .await
        .map_err(|s| match s.code() {
            // The brain went away mid-call (a restart): as unreachable as a refused connection.
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
                Error::Tls(tls::Error::Connect(format!(
                    "the brain at {} dropped the enrolment: {}",
                    addr.url(),
                    s.message()
                )))
            }
            _ => Error::Refused(s.message().to_string()),
        })?
        .into_inner();
    // The CA we were given must be the one we pinned.
    let ca_der = pki::certs_from_pem(&resp.ca_pem, &state.identity())?.remove(0);
    if ca_der.as_ref() != seen.locked().ca_der.as_deref().unwrap_or_default() {
        return Err(Error::CaMismatch {
            url: addr.url(),
            presented: pki::ca_hash(&ca_der),
            pinned: opts.ca_hash,
        });
    }
    let m = Membership {
        v: 1,
        worker_id: resp.worker_id,
        name: opts.name,
        brain_url: addr.url(),
        labels: opts.labels.into_iter().collect(),
        more_brains,
    };
    state.save(
        &m,
        &IdentityFiles {
            ca_pem: resp.ca_pem,
            cert_pem: resp.cert_pem,
            key_pem: key.serialize_pem(),
        },
    )?;
    Ok(m)
}

/// Backoff between reconnect attempts, and when to stop trying.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    /// Give up once the brain has been unreachable this long (`None`: never).
    pub give_up_after: Option<Duration>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(30),
            give_up_after: None,
        }
    }
}

/// Full jitter: a random delay in [d/2, d].
fn jitter(d: Duration) -> Duration {
    let ms = d.as_millis() as u64;
    Duration::from_millis(ms / 2 + rand::random_range(0..=ms / 2))
}

/// Runs sessions until `shutdown` is cancelled, reconnecting indefinitely. With several
/// brains (`brains`, else those stored at join), a lost session or a failed connection moves
/// on to the next at once; a pause (the backoff) comes only after a whole round failed.
pub async fn run(
    state: StateDir,
    brains: Vec<String>,
    backoff: Backoff,
    sandbox: crate::sandbox::Sandbox,
    max_tasks: Option<u32>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let (membership, ident) = state.load()?;
    let urls = if brains.is_empty() {
        std::iter::once(membership.brain_url.clone())
            .chain(membership.more_brains.iter().cloned())
            .collect()
    } else {
        brains
    };
    let addrs = urls
        .iter()
        .map(|u| BrainAddr::parse(u))
        .collect::<Result<Vec<_>, _>>()?;
    let config = ident.client_config(&state.identity())?;
    let journal = crate::journal::Journal::open(state.0.join("calls")).map_err(|source| {
        crate::state::Error::Io {
            path: state.0.join("calls"),
            source,
        }
    })?;
    let ctx = Arc::new(Ctx {
        membership,
        workspaces: state.workspaces(),
        state_dir: state.0.clone(),
        journal: Arc::new(journal),
        durable_running: Arc::default(),
        shutdown: shutdown.clone(),
        current_out: Arc::default(),
        sandbox: Arc::new(sandbox),
        sync: Arc::default(),
        watches: Arc::default(),
        link: Arc::default(),
        max_tasks: max_tasks.unwrap_or_else(crate::caps::default_max_tasks),
    });
    tracing::info!(sandbox = ?ctx.sandbox.report.active(), "confinement active for commands");
    let names: Vec<String> = addrs.iter().map(BrainAddr::url).collect();
    tracing::info!(worker = %ctx.membership.worker_id, brains = ?names, "worker starting");
    let mut delay = backoff.initial;
    // When the brain was last known reachable: at start, and whenever a session ends.
    let mut reachable_at = Instant::now();
    // Which brain to dial next, and how many have failed in a row since one answered.
    let (mut at, mut failed) = (0usize, 0usize);
    loop {
        let addr = &addrs[at % addrs.len()];
        let started = Instant::now();
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            r = session(addr, config.clone(), &ctx, &shutdown) => r,
        };
        if shutdown.is_cancelled() {
            return Ok(());
        }
        at += 1;
        match outcome {
            Ok(reason) => {
                tracing::warn!(brain = %addr.url(), %reason, "session with the brain ended; reconnecting");
                // We were connected: start the backoff over.
                delay = backoff.initial;
                reachable_at = Instant::now();
                // A session cut at once counts as a failure: no tight loop over brains that
                // answer and hang up.
                failed = if started.elapsed() < SHORT_SESSION {
                    failed + 1
                } else {
                    0
                };
            }
            Err(StartError::RefusedForGood(reason)) => {
                tracing::error!(brain = %addr.url(), %reason, "the brain no longer takes this worker; it exits");
                return Err(Error::Dismissed {
                    url: addr.url(),
                    reason,
                });
            }
            Err(reason) => {
                tracing::warn!(brain = %addr.url(), %reason, "cannot connect to the brain; will retry");
                failed += 1;
            }
        }
        if let Some(after) = backoff.give_up_after
            && reachable_at.elapsed() >= after
        {
            tracing::error!(?after, "the brain stayed unreachable; the worker exits");
            return Err(Error::Unreachable {
                url: names.join(", "),
                after,
            });
        }
        // Another brain not tried since the last answer: dial it now.
        if addrs.len() > 1 && failed < addrs.len() {
            continue;
        }
        failed = 0;
        let wait = jitter(delay);
        tracing::info!(retry_in = ?wait, "reconnecting");
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(wait) => {}
        }
        delay = (delay * 2).min(backoff.max);
    }
}

struct Ctx {
    membership: Membership,
    workspaces: PathBuf,
    state_dir: PathBuf,
    /// Durable calls: what ran, what finished, across sessions and restarts.
    journal: Arc<crate::journal::Journal>,
    /// Durable calls running now, by id; they outlive sessions (not the process).
    durable_running: Arc<Mutex<HashMap<u64, CancellationToken>>>,
    /// Ends with the process; durable calls are children of it.
    shutdown: CancellationToken,
    /// The outbound queue of the session open now, for durable calls.
    current_out: crate::durable::CurrentOut,
    /// What confines the commands this worker runs.
    sandbox: Arc<crate::sandbox::Sandbox>,
    /// Workspace sync: scanners and the manifests the brain confirmed.
    sync: Arc<crate::sync::SyncState>,
    /// Live file watchers of the workspaces in use.
    watches: Arc<crate::watch::Watches>,
    /// The brain's channel of the session open now, for egress tunnels.
    link: crate::egress::Link,
    /// Tasks this worker takes at once, said in its hello and pulses.
    max_tasks: u32,
}

impl Ctx {
    fn confinement(&self) -> crate::exec::Confinement {
        crate::exec::Confinement {
            sandbox: self.sandbox.clone(),
            link: self.link.clone(),
        }
    }
}

/// A session shorter than this counts as a failed connection when choosing whether to wait.
const SHORT_SESSION: Duration = Duration::from_secs(5);

/// Outbound queue to the brain; bounded so a stalled connection pushes back on producers.
const OUTBOUND_QUEUE: usize = 1024;
const HELLO_ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// Clock difference with the brain above which we warn.
const SKEW_WARN: Duration = Duration::from_secs(30);

/// One session: returns why it ended (`Ok`) or why it could not start (`Err`).
async fn session(
    addr: &BrainAddr,
    config: rustls::ClientConfig,
    ctx: &Arc<Ctx>,
    shutdown: &CancellationToken,
) -> Result<String, StartError> {
    let channel = tls::dial(addr, config.clone(), DialOptions::default()).await?;
    let sync_channel = channel.clone();
    let mut client = WorkerSessionClient::new(channel)
        .max_decoding_message_size(shared::limits::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(shared::limits::MAX_MESSAGE_BYTES);
    let (out, out_rx) = mpsc::channel::<WorkerMessage>(OUTBOUND_QUEUE);
    let hello = proto::Hello {
        name: ctx.membership.name.clone(),
        labels: ctx.membership.labels.clone().into_iter().collect(),
        capabilities: Some(crate::caps::probe(
            &ctx.state_dir,
            ctx.sandbox.report.active(),
            ctx.max_tasks,
        )),
        protocol: proto::PROTOCOL_VERSION,
    };
    out.send(WorkerMessage {
        msg: Some(worker_message::Msg::Hello(hello)),
    })
    .await
    .map_err(|_| StartError::QueueClosed)?;
    let explain = |s: tonic::Status| {
        if tls::refused_for_good(&s) {
            StartError::RefusedForGood(s.message().to_string())
        } else {
            StartError::Status(tls::explain_status(&s, &addr.url()))
        }
    };
    let mut inbound = client
        .attach(ReceiverStream::new(out_rx))
        .await
        .map_err(explain)?
        .into_inner();
    let ack = match tokio::time::timeout(HELLO_ACK_TIMEOUT, inbound.message()).await {
        Ok(Ok(Some(BrainMessage {
            msg: Some(brain_message::Msg::HelloAck(a)),
        }))) => a,
        Ok(Ok(_)) => return Err(StartError::NoAck),
        Ok(Err(s)) => return Err(explain(s)),
        Err(_) => return Err(StartError::AckTimeout),
    };
    proto::compatible("brain", ack.protocol, proto::OLDEST_PROTOCOL)
        .map_err(StartError::Protocol)?;
    let skew_ms = ack.brain_time_unix_ms - shared::now_unix_ms();
    if skew_ms.unsigned_abs() > SKEW_WARN.as_millis() as u64 {
        tracing::warn!(
            skew_ms,
            "clock skew with the brain: this machine's clock differs by more than 30s; certificates and token expiry may misbehave"
        );
    }
    let beat_every = Duration::from_millis(ack.heartbeat_interval_ms.clamp(100, 60_000));
    let lost_after = Duration::from_millis(ack.lost_after_ms.clamp(300, 600_000));
    tracing::info!(worker = %ack.worker_id, "connected to the brain");
    // The pulse, on its own thread and connection, for as long as this session lasts.
    let pulse_answered = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let pulse_stop = shutdown.child_token();
    let _stop_pulse = pulse_stop.clone().drop_guard();
    let running_now = ctx.durable_running.clone();
    crate::pulse::start(
        addr.clone(),
        config,
        beat_every,
        crate::pulse::Source {
            max_tasks: ctx.max_tasks,
            running: Arc::new(move || running_now.locked().len() as u32),
        },
        pulse_answered.clone(),
        pulse_stop,
    );
    *ctx.current_out.locked() = Some(out.clone());
    *ctx.link.locked() = Some(sync_channel.clone());
    // Results of durable calls the brain has not acknowledged yet (it may have restarted).
    for r in ctx.journal.unacked() {
        let m = WorkerMessage {
            msg: Some(worker_message::Msg::CallResult(r)),
        };
        if out.send(m).await.is_err() {
            return Err(StartError::QueueClosed);
        }
    }

    // Running calls by id, so a cancel from the brain (or the end of the session) stops them.
    let running: Arc<Mutex<HashMap<u64, CancellationToken>>> = Arc::default();
    let session_end = shutdown.child_token();
    let _stop_calls = session_end.clone().drop_guard();
    let mut beat = tokio::time::interval(beat_every);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // One deadline, pushed back by every message from the brain.
    let lost = tokio::time::sleep(lost_after);
    tokio::pin!(lost);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok("shutting down".into()),
            _ = &mut lost => {
                // The brain answering pulses is alive too (its session queue may be full).
                let quiet_ms = shared::now_unix_ms() - pulse_answered.load(std::sync::atomic::Ordering::Relaxed);
                let quiet = Duration::from_millis(quiet_ms.max(0) as u64);
                if quiet >= lost_after {
                    return Ok(format!("the brain sent nothing for {lost_after:?}"));
                }
                lost.as_mut().reset(tokio::time::Instant::now() + (lost_after - quiet));
            }
            _ = beat.tick() => {
                let hb = WorkerMessage { msg: Some(worker_message::Msg::Heartbeat(proto::Heartbeat { unix_ms: shared::now_unix_ms(), load: None })) };
                if out.try_send(hb).is_err() {
                    tracing::debug!("outbound queue full; heartbeat skipped");
                }
            }
            msg = inbound.message() => {
                let msg = match msg {
                    Err(s) => return Ok(tls::explain_status(&s, &addr.url())),
                    Ok(None) => return Ok("the brain closed the session".into()),
                    Ok(Some(m)) => m,
                };
                lost.as_mut().reset(tokio::time::Instant::now() + lost_after);
                dispatch(msg, ctx, &out, &running, &session_end, &sync_channel);
            }
        }
    }
}

/// Starts (or keeps) the live file watcher of a workspace in use.
fn watch_workspace(ctx: &Arc<Ctx>, workspace: &str) {
    if let Ok(root) = crate::state::workspace(&ctx.workspaces, workspace) {
        ctx.watches
            .ensure(workspace, &root, ctx.current_out.clone());
    }
}

fn dispatch(
    msg: BrainMessage,
    ctx: &Arc<Ctx>,
    out: &mpsc::Sender<WorkerMessage>,
    running: &Arc<Mutex<HashMap<u64, CancellationToken>>>,
    session_end: &CancellationToken,
    sync_channel: &tonic::transport::Channel,
) {
    match msg.msg {
        Some(brain_message::Msg::Sync(req)) => {
            if !matches!(req.op, Some(proto::sync_request::Op::ImportDir(_))) {
                watch_workspace(ctx, &req.workspace);
            }
            let (sandbox, workspaces) = (ctx.sandbox.clone(), ctx.workspaces.clone());
            let (sync_channel, sync) = (sync_channel.clone(), ctx.sync.clone());
            tokio::spawn(async move {
                // The workspace's task user (allocated on first use) owns what is written.
                let name = req.workspace.clone();
                let root = workspaces.clone();
                let sb = sandbox.clone();
                // Looked up off the runtime (its first use walks the workspace), and only
                // where there are task users at all.
                let owner = if sb.has_task_users() {
                    tokio::task::spawn_blocking(move || sb.owner(&root, &name))
                        .await
                        .ok()
                        .flatten()
                } else {
                    None
                };
                let imports = sandbox.imports();
                crate::sync::handle(req, workspaces, sync_channel, sync, owner, imports).await
            });
        }
        Some(brain_message::Msg::Exec(start)) if start.durable => {
            watch_workspace(ctx, &start.workspace);
            crate::durable::start(
                start,
                ctx.journal.clone(),
                ctx.workspaces.clone(),
                ctx.current_out.clone(),
                ctx.durable_running.clone(),
                ctx.shutdown.child_token(),
                ctx.confinement(),
            );
        }
        Some(brain_message::Msg::Ack(a)) => ctx.journal.forget(a.call_id),
        Some(brain_message::Msg::Exec(start)) => {
            let call_id = start.call_id;
            let cancel = session_end.child_token();
            running.locked().insert(call_id, cancel.clone());
            let (ctx, out, running) = (ctx.clone(), out.clone(), running.clone());
            tokio::spawn(async move {
                tracing::debug!(call_id, argv = ?start.argv, "exec");
                crate::exec::run_with(
                    start,
                    &ctx.workspaces,
                    out,
                    cancel,
                    None,
                    Some(&ctx.confinement()),
                )
                .await;
                running.locked().remove(&call_id);
            });
        }
        Some(brain_message::Msg::File(call)) => {
            let (ctx, out) = (ctx.clone(), out.clone());
            tokio::spawn(async move {
                let resp = tokio::task::spawn_blocking(move || {
                    let owner = ctx.sandbox.owner(&ctx.workspaces, &call.workspace);
                    crate::files::handle(call, &ctx.workspaces, owner)
                })
                .await;
                if let Ok(resp) = resp {
                    let _ = out
                        .send(WorkerMessage {
                            msg: Some(worker_message::Msg::FileResponse(resp)),
                        })
                        .await;
                }
            });
        }
        Some(brain_message::Msg::Cancel(c)) => {
            if let Some(t) = running.locked().get(&c.call_id) {
                t.cancel();
            }
            if let Some(t) = ctx.durable_running.locked().get(&c.call_id) {
                t.cancel();
            }
        }
        Some(brain_message::Msg::Echo(e)) => {
            let _ = out.try_send(WorkerMessage {
                msg: Some(worker_message::Msg::Echo(e)),
            });
        }
        Some(brain_message::Msg::Heartbeat(_)) => {}
        Some(brain_message::Msg::HelloAck(_)) | None => {
            tracing::warn!("unexpected message from the brain; ignored");
        }
    }
}
