//! The brain's gRPC services: enrolment (token-authenticated), the worker session stream and
//! the admin API (both certificate-authenticated), and the one place that turns internal
//! errors into `tonic::Status`.

pub mod sync;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use proto::admin_server::Admin;
use proto::enrollment_server::Enrollment;
use proto::worker_session_server::WorkerSession;
use proto::{
    AdminEchoRequest, AdminEchoResponse, AdminExecRequest, AdminFileRequest, CreateTokenRequest,
    CreateTokenResponse, EnrollRequest, EnrollResponse, ExecEvent, FileResponse, IssueAdminRequest,
    IssueAdminResponse, ListWorkersRequest, ListWorkersResponse, RevokeAdminRequest,
    RevokeAdminResponse, RevokeWorkerRequest, RevokeWorkerResponse, WorkerInfo, WorkerMessage,
    WorkerState, brain_message, worker_message,
};
use shared::limits;
use shared::pki::{self, PeerIdentity, Role};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::fleet::hub::{self, ExecSpec, Hub, Session};
use crate::trust::ca::Ca;
use crate::trust::registry::{self, Caps, Registry, WorkerRecord};

/// Session timing.
#[derive(Debug, Clone, Copy)]
pub struct SessionOptions {
    /// A worker that sends nothing for this long is marked lost.
    pub lost_after: Duration,
}

impl SessionOptions {
    pub fn heartbeat_interval(&self) -> Duration {
        (self.lost_after / 3).max(Duration::from_millis(100))
    }
}

/// State shared by all services.
pub struct Shared {
    pub registry: Registry,
    pub hub: Hub,
    pub tasks: crate::engine::manager::Manager,
    /// The whole store, for backups.
    pub db: sled::Db,
    pub ca: Ca,
    pub session: SessionOptions,
    pub policy: Policy,
    /// The brain's config file (agent defaults; the LLM part also went to the tasks).
    pub config: Arc<crate::config::Config>,
    /// Blobs and manifests of every task's workspace.
    pub mirror: crate::mirror::Mirror,
    /// Machines this brain created.
    pub machines: crate::provision::Machines,
}

/// What the brain demands of where and how commands run.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Limits for every command (a call may ask for tighter ones).
    pub limits: proto::Limits,
    /// Confinement mechanisms a worker must have before a task is placed on it.
    pub require_sandbox: Vec<String>,
}

impl Policy {
    /// The tighter of the policy's and a request's limits, field by field (0 = unset).
    pub fn merge(&self, req: Option<proto::Limits>) -> proto::Limits {
        let r = req.unwrap_or_default();
        let p = &self.limits;
        let min = |a: u64, b: u64| match (a, b) {
            (0, x) | (x, 0) => x,
            (a, b) => a.min(b),
        };
        proto::Limits {
            memory_bytes: min(p.memory_bytes, r.memory_bytes),
            pids: min(p.pids as u64, r.pids as u64) as u32,
            cpus: match (p.cpus, r.cpus) {
                (a, b) if a <= 0.0 => b.max(0.0),
                (a, b) if b <= 0.0 => a,
                (a, b) => a.min(b),
            },
            file_size_bytes: min(p.file_size_bytes, r.file_size_bytes),
            cpu_seconds: min(p.cpu_seconds, r.cpu_seconds),
            network_off: p.network_off || r.network_off,
        }
    }

    /// Why `worker` may not take a task, if it may not.
    pub fn refuse(&self, worker: &WorkerRecord) -> Option<String> {
        let have = worker
            .caps
            .as_ref()
            .map(|c| c.sandbox.clone())
            .unwrap_or_default();
        let missing: Vec<&String> = self
            .require_sandbox
            .iter()
            .filter(|m| !have.contains(m))
            .collect();
        (!missing.is_empty()).then(|| {
            format!(
                "the brain's policy requires {} on the task's worker, and worker {} ({}) lacks {}: see `worker doctor` on it",
                self.require_sandbox.join(", "),
                worker.id,
                worker.name,
                missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            )
        })
    }
}

/// The services, cheap to clone.
#[derive(Clone)]
pub struct Services(pub Arc<Shared>);

const NO_CERT: &str = "no client certificate: this call needs a certificate issued by this brain (workers: run `worker join`; admins: use the data dir's admin identity or --identity DIR)";
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
const FILE_TIMEOUT: Duration = Duration::from_secs(60);

impl From<registry::Error> for Status {
    fn from(e: registry::Error) -> Self {
        use registry::Error as E;
        match e {
            E::TokenUnknown | E::TokenUsed | E::TokenExpired => {
                Status::permission_denied(e.to_string())
            }
            E::NoSuchWorker(_) | E::NoSuchAdmin(_) => Status::not_found(e.to_string()),
            E::Ambiguous(_) => Status::invalid_argument(e.to_string()),
            E::AdminExists(_) => Status::already_exists(e.to_string()),
            E::Open { .. } | E::Sled(_) | E::Decode { .. } => {
                tracing::error!(error = %e, "store error");
                Status::internal(format!("brain store error: {e}"))
            }
        }
    }
}

impl From<crate::engine::manager::Error> for Status {
    fn from(e: crate::engine::manager::Error) -> Self {
        use crate::engine::manager::Error as E;
        match e {
            E::NoSuchTask(_) => Status::not_found(e.to_string()),
            E::Ended(_) | E::Refused { .. } => Status::failed_precondition(e.to_string()),
            E::Log(_) => Status::internal(e.to_string()),
        }
    }
}

impl From<crate::provision::Error> for Status {
    fn from(e: crate::provision::Error) -> Self {
        use crate::provision::Error as E;
        match e {
            E::UnknownProvider { .. } | E::Invalid(_) => Status::invalid_argument(e.to_string()),
            E::NoSuchMachine(_) => Status::not_found(e.to_string()),
            E::Quota(_) => Status::resource_exhausted(e.to_string()),
            E::AlreadyEnded { .. } => Status::failed_precondition(e.to_string()),
            E::Provider { .. } => Status::unavailable(e.to_string()),
            E::Timeout { .. } => Status::deadline_exceeded(e.to_string()),
            E::Registry(e) => e.into(),
            E::Sled(_) | E::Decode { .. } => {
                tracing::error!(error = %e, "machine store error");
                Status::internal(e.to_string())
            }
        }
    }
}

/// A machine record as the admin API shows it.
pub(crate) fn machine_info(m: &crate::provision::Machine, connected: bool) -> proto::MachineInfo {
    proto::MachineInfo {
        id: m.id.clone(),
        provider: m.provider.clone(),
        state: m.state.name().into(),
        handle: m.handle.clone(),
        address: m.address.clone(),
        spec: Some(proto::MachineSpec {
            cpu: m.spec.cpu,
            memory_gb: m.spec.memory_gb,
            disk_gb: m.spec.disk_gb,
            gpu: m.spec.gpu,
        }),
        worker_id: m.worker.clone().unwrap_or_default(),
        task_id: m.task.clone().unwrap_or_default(),
        created_unix_ms: m.created_ms,
        ended_unix_ms: m.ended_ms,
        usd_per_hour: m.usd_per_hour,
        cost_usd: m.cost_usd(shared::now_unix_ms()),
        note: m.note.clone(),
        labels: m.labels.clone().into_iter().collect(),
        connected,
    }
}

impl From<hub::Error> for Status {
    fn from(e: hub::Error) -> Self {
        match e {
            hub::Error::NotConnected(_) => Status::failed_precondition(e.to_string()),
            hub::Error::Lost(_) => Status::unavailable(e.to_string()),
            hub::Error::Timeout { .. } => Status::deadline_exceeded(e.to_string()),
            hub::Error::Malformed { .. } => Status::internal(e.to_string()),
        }
    }
}

impl Services {
    /// Checks the caller's certificate: issued by our CA (rustls did that), naming `role`,
    /// current and not revoked.
    pub(crate) fn authorize<T>(
        &self,
        req: &Request<T>,
        role: Role,
    ) -> Result<PeerIdentity, Status> {
        let certs = req
            .peer_certs()
            .ok_or_else(|| Status::unauthenticated(NO_CERT))?;
        let leaf = certs
            .first()
            .ok_or_else(|| Status::unauthenticated(NO_CERT))?;
        let peer = pki::peer_identity(leaf).map_err(|e| {
            Status::unauthenticated(format!("client certificate not usable here: {e}"))
        })?;
        if peer.role != role {
            return Err(Status::permission_denied(format!(
                "{peer} may not make this call: it needs a {} certificate",
                match role {
                    Role::Admin => "admin",
                    Role::Worker => "worker",
                }
            )));
        }
        match self.0.registry.check_peer(&peer)? {
            Ok(()) => Ok(peer),
            Err(reason) => Err(Status::permission_denied(reason)),
        }
    }

    fn connected(&self, m: &crate::provision::Machine) -> bool {
        m.worker
            .as_deref()
            .is_some_and(|w| self.0.hub.session(w).is_some())
    }

    /// The worker for a new task: the one named (it must have the labels), or any connected
    /// one with the labels; either way one the policy allows.
    fn pick_worker(
        &self,
        name: &str,
        labels: &crate::engine::manager::Labels,
    ) -> Result<WorkerRecord, Status> {
        let fits = |w: &WorkerRecord| labels.iter().all(|(k, v)| w.labels.get(k) == Some(v));
        if !name.is_empty() {
            let w = self.resolve(name)?;
            if !fits(&w) {
                let want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                return Err(Status::failed_precondition(format!(
                    "worker {} ({}) does not have the labels the task requires: {}",
                    w.id,
                    w.name,
                    want.join(", ")
                )));
            }
            if let Some(why) = self.0.policy.refuse(&w) {
                return Err(Status::failed_precondition(why));
            }
            return Ok(w);
        }
        let candidates: Vec<WorkerRecord> = self
            .0
            .registry
            .workers()?
            .into_iter()
            .filter(|w| !w.revoked && self.0.hub.session(&w.id).is_some() && fits(w))
            .collect();
        if let Some(w) = candidates
            .iter()
            .find(|w| self.0.policy.refuse(w).is_none())
        {
            return Ok(w.clone());
        }
        match candidates.first() {
            Some(w) => Err(Status::failed_precondition(
                self.0.policy.refuse(w).unwrap_or_default(),
            )),
            None if labels.is_empty() => Err(Status::failed_precondition(
                "no worker is connected: start one (`worker join ...`) or name one with --worker",
            )),
            None => Err(Status::failed_precondition(
                "no connected worker has the labels the task requires",
            )),
        }
    }

    fn resolve(&self, worker: &str) -> Result<WorkerRecord, Status> {
        Ok(self.0.registry.resolve_worker(worker)?)
    }
}

/// Checks a request's required labels and puts them in order.
fn check_labels_map(
    labels: &std::collections::HashMap<String, String>,
) -> Result<crate::engine::manager::Labels, Status> {
    check_labels(labels)?;
    Ok(labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

fn check_labels(labels: &std::collections::HashMap<String, String>) -> Result<(), Status> {
    if labels.len() > 64 {
        return Err(Status::invalid_argument("at most 64 labels"));
    }
    for (k, v) in labels {
        shared::parse_label(&format!("{k}={v}")).map_err(Status::invalid_argument)?;
    }
    Ok(())
}

fn check_name(name: &str) -> Result<(), Status> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "invalid name {name:?}: use 1-64 characters of [A-Za-z0-9._-]"
        )))
    }
}

#[tonic::async_trait]
impl Enrollment for Services {
    async fn enroll(
        &self,
        req: Request<EnrollRequest>,
    ) -> Result<Response<EnrollResponse>, Status> {
        let req = req.into_inner();
        check_name(&req.name)?;
        check_labels(&req.labels)?;
        // Cheap checks first: an unknown token costs no signature.
        self.0.registry.check_token(&req.token)?;
        let worker_id = format!("w-{}", hex::encode(rand::random::<[u8; 6]>()));
        // Sign before consuming the token, so a malformed request does not burn it.
        let cert_pem = self
            .0
            .ca
            .sign_client(&req.csr_der, Role::Worker, &worker_id)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let token_labels = self.0.registry.consume_token(&req.token).await?;
        let cert_der = pki::certs_from_pem(&cert_pem, std::path::Path::new("issued"))
            .map_err(|e| Status::internal(e.to_string()))?
            .remove(0);
        // Labels from the token were chosen by an admin and win over the worker's own.
        let mut labels: BTreeMap<String, String> = req.labels.into_iter().collect();
        labels.extend(token_labels);
        let rec = WorkerRecord {
            v: 1,
            id: worker_id.clone(),
            name: req.name.clone(),
            labels,
            cert_fingerprint: pki::fingerprint(&cert_der),
            enrolled_ms: shared::now_unix_ms(),
            last_seen_ms: 0,
            revoked: false,
            caps: None,
        };
        self.0.registry.add_worker(&rec).await?;
        tracing::info!(worker = %worker_id, name = %req.name, "worker enrolled");
        Ok(Response::new(EnrollResponse {
            worker_id,
            cert_pem,
            ca_pem: self.0.ca.cert_pem.clone(),
        }))
    }
}

#[tonic::async_trait]
impl WorkerSession for Services {
    type AttachStream = crate::fleet::hub::SessionStream;

    async fn attach(
        &self,
        req: Request<Streaming<WorkerMessage>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let peer = self.authorize(&req, Role::Worker)?;
        let mut inbound = req.into_inner();
        let hello = match tokio::time::timeout(HELLO_TIMEOUT, inbound.message()).await {
            Ok(Ok(Some(WorkerMessage {
                msg: Some(worker_message::Msg::Hello(h)),
            }))) => h,
            Ok(Ok(_)) => {
                return Err(Status::invalid_argument(
                    "the first message must be a hello",
                ));
            }
            Ok(Err(s)) => return Err(s),
            Err(_) => return Err(Status::deadline_exceeded("no hello within 10s")),
        };
        check_labels(&hello.labels)?;
        let caps = hello.capabilities.unwrap_or_default();
        self.0.registry.update_worker(&peer.id, |w| {
            w.last_seen_ms = shared::now_unix_ms();
            for (k, v) in &hello.labels {
                w.labels.entry(k.clone()).or_insert_with(|| v.clone());
            }
            w.caps = Some(Caps {
                cpus: caps.cpus,
                memory_bytes: caps.memory_bytes,
                disk_free_bytes: caps.disk_free_bytes,
                os: caps.os.chars().take(64).collect(),
                arch: caps.arch.chars().take(64).collect(),
                version: caps.version.chars().take(64).collect(),
                hostname: caps.hostname.chars().take(255).collect(),
                sandbox: caps
                    .sandbox
                    .iter()
                    .take(16)
                    .map(|m| m.chars().take(32).collect())
                    .collect(),
            });
        })?;
        let (session, stream) = self.0.hub.register(&peer.id);
        // A revocation that landed between `authorize` and `register` found no session to
        // close; check again now that this one is visible to it.
        if let Ok(Err(reason)) = self.0.registry.check_peer(&peer) {
            self.0.hub.unregister(&session);
            return Err(Status::permission_denied(reason));
        }
        let opts = self.0.session;
        session
            .send(brain_message::Msg::HelloAck(proto::HelloAck {
                worker_id: peer.id.clone(),
                brain_time_unix_ms: shared::now_unix_ms(),
                heartbeat_interval_ms: opts.heartbeat_interval().as_millis() as u64,
                lost_after_ms: opts.lost_after.as_millis() as u64,
            }))
            .await?;
        tracing::info!(worker = %peer.id, name = %hello.name, session = session.session_no, "worker connected");
        let shared = self.0.clone();
        tokio::spawn(async move {
            let reason = run_session(&shared.hub, &session, &mut inbound, opts).await;
            shared.hub.unregister(&session);
            session.close(Status::unavailable(reason.clone()));
            session.fail_pending();
            let seen = session.last_seen_ms.load(Ordering::Relaxed);
            let _ = shared
                .registry
                .update_worker(&session.worker_id, |w| w.last_seen_ms = seen);
            tracing::warn!(worker = %session.worker_id, session = session.session_no, %reason, "worker session ended");
        });
        Ok(Response::new(stream))
    }
}

/// Reads a worker's messages until the session ends; returns why it ended.
async fn run_session(
    hub: &Hub,
    session: &Arc<Session>,
    inbound: &mut Streaming<WorkerMessage>,
    opts: SessionOptions,
) -> String {
    let mut beat = tokio::time::interval(opts.heartbeat_interval());
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // One deadline, pushed back by every message: a worker that sends nothing for
    // `lost_after` is lost, whatever else this loop is doing.
    let lost = tokio::time::sleep(opts.lost_after);
    tokio::pin!(lost);
    loop {
        tokio::select! {
            _ = session.closed.cancelled() => return "closed by the brain".into(),
            _ = &mut lost => return format!("lost: no message for {:?}", opts.lost_after),
            _ = beat.tick() => {
                // Never wait on a full queue here: heartbeats are best effort.
                session.try_send(brain_message::Msg::Heartbeat(proto::Heartbeat {
                    unix_ms: shared::now_unix_ms(),
                }));
            }
            msg = inbound.message() => {
                let msg = match msg {
                    Err(status) => return format!("stream error: {}", status.message()),
                    Ok(None) => return "the worker closed the session".into(),
                    Ok(Some(m)) => m,
                };
                lost.as_mut().reset(tokio::time::Instant::now() + opts.lost_after);
                session.last_seen_ms.store(shared::now_unix_ms(), Ordering::Relaxed);
                match msg.msg {
                    Some(worker_message::Msg::ExecOutput(out)) => {
                        let id = out.call_id;
                        if let Some(ExecEvent { event: Some(proto::exec_event::Event::Output(out)) }) =
                            session.deliver_exec(id, ExecEvent { event: Some(proto::exec_event::Event::Output(out)) }, false)
                        {
                            hub.deliver_live(out);
                        }
                    }
                    Some(worker_message::Msg::ExecExit(mut exit)) => {
                        exit.worker_lost = false;
                        let id = exit.call_id;
                        session.deliver_exec(id, ExecEvent { event: Some(proto::exec_event::Event::Exit(exit)) }, true);
                    }
                    Some(worker_message::Msg::FileResponse(resp)) => session.deliver_file(resp),
                    Some(worker_message::Msg::CallResult(r)) => hub.deliver_result(&session.worker_id, r),
                    Some(worker_message::Msg::Echo(e)) => session.deliver_echo(e.call_id, e.payload),
                    Some(worker_message::Msg::FsChanged(f)) => hub.deliver_fs(&session.worker_id, f),
                    Some(worker_message::Msg::Heartbeat(_)) => {}
                    Some(worker_message::Msg::Hello(_)) | None => {
                        tracing::warn!(worker = %session.worker_id, "unexpected message on session; ignored");
                    }
                }
            }
        }
    }
}

#[tonic::async_trait]
impl Admin for Services {
    async fn list_workers(
        &self,
        req: Request<ListWorkersRequest>,
    ) -> Result<Response<ListWorkersResponse>, Status> {
        self.authorize(&req, Role::Admin)?;
        let workers = self
            .0
            .registry
            .workers()?
            .into_iter()
            .map(|w| {
                let session = self.0.hub.session(&w.id);
                let state = if w.revoked {
                    WorkerState::Revoked
                } else if session.is_some() {
                    WorkerState::Connected
                } else if w.last_seen_ms > 0 {
                    WorkerState::Lost
                } else {
                    WorkerState::Enrolled
                };
                let last_seen = session
                    .map(|s| s.last_seen_ms.load(Ordering::Relaxed))
                    .unwrap_or(w.last_seen_ms);
                let caps = w.caps.unwrap_or_default();
                WorkerInfo {
                    id: w.id,
                    name: w.name,
                    labels: w.labels.into_iter().collect(),
                    capabilities: Some(proto::Capabilities {
                        cpus: caps.cpus,
                        memory_bytes: caps.memory_bytes,
                        disk_free_bytes: caps.disk_free_bytes,
                        os: caps.os,
                        arch: caps.arch,
                        version: caps.version,
                        hostname: caps.hostname,
                        sandbox: caps.sandbox,
                    }),
                    state: state as i32,
                    last_seen_unix_ms: last_seen,
                    enrolled_unix_ms: w.enrolled_ms,
                }
            })
            .collect();
        Ok(Response::new(ListWorkersResponse { workers }))
    }

    async fn revoke_worker(
        &self,
        req: Request<RevokeWorkerRequest>,
    ) -> Result<Response<RevokeWorkerResponse>, Status> {
        let admin = self.authorize(&req, Role::Admin)?;
        let w = self.resolve(&req.get_ref().worker)?;
        self.0.registry.revoke_worker(&w.id).await?;
        let closed = self.0.hub.disconnect(
            &w.id,
            Status::permission_denied(format!(
                "certificate revoked: worker {} was revoked on this brain",
                w.id
            )),
        );
        tracing::warn!(worker = %w.id, by = %admin, session_closed = closed, "worker revoked");
        Ok(Response::new(RevokeWorkerResponse {
            worker_id: w.id,
            session_closed: closed,
        }))
    }

    async fn create_token(
        &self,
        req: Request<CreateTokenRequest>,
    ) -> Result<Response<CreateTokenResponse>, Status> {
        self.authorize(&req, Role::Admin)?;
        let req = req.into_inner();
        check_labels(&req.labels)?;
        let ttl = req.ttl_seconds;
        if ttl == 0 || ttl > 30 * 24 * 3600 {
            return Err(Status::invalid_argument(
                "token TTL must be between 1s and 30 days",
            ));
        }
        let (token, expires) = self
            .0
            .registry
            .create_token(ttl as i64 * 1000, req.labels.into_iter().collect())
            .await?;
        Ok(Response::new(CreateTokenResponse {
            token,
            expires_unix_ms: expires,
            ca_hash: self.0.ca.hash(),
        }))
    }

    async fn issue_admin(
        &self,
        req: Request<IssueAdminRequest>,
    ) -> Result<Response<IssueAdminResponse>, Status> {
        let admin = self.authorize(&req, Role::Admin)?;
        let req = req.into_inner();
        check_name(&req.name)?;
        if let Some(old) = self.0.registry.admin(&req.name)?
            && !old.revoked
        {
            return Err(registry::Error::AdminExists(req.name).into());
        }
        let cert_pem = self
            .0
            .ca
            .sign_client(&req.csr_der, Role::Admin, &req.name)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let der = pki::certs_from_pem(&cert_pem, std::path::Path::new("issued"))
            .map_err(|e| Status::internal(e.to_string()))?
            .remove(0);
        self.0
            .registry
            .add_admin(&req.name, &pki::fingerprint(&der), &self.0.ca.hash(), true)
            .await?;
        tracing::info!(name = %req.name, by = %admin, "admin identity issued");
        Ok(Response::new(IssueAdminResponse {
            cert_pem,
            ca_pem: self.0.ca.cert_pem.clone(),
        }))
    }

    async fn revoke_admin(
        &self,
        req: Request<RevokeAdminRequest>,
    ) -> Result<Response<RevokeAdminResponse>, Status> {
        let admin = self.authorize(&req, Role::Admin)?;
        let name = &req.get_ref().name;
        if *name == admin.id {
            return Err(Status::failed_precondition(
                "refusing to revoke the identity making this call: use another admin identity",
            ));
        }
        self.0.registry.revoke_admin(name).await?;
        tracing::warn!(name = %name, by = %admin, "admin identity revoked");
        Ok(Response::new(RevokeAdminResponse {}))
    }

    type ExecStream = ReceiverStream<Result<ExecEvent, Status>>;

    async fn exec(
        &self,
        req: Request<AdminExecRequest>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        self.authorize(&req, Role::Admin)?;
        let req = req.into_inner();
        let w = self.resolve(&req.worker)?;
        if req.argv.is_empty() {
            return Err(Status::invalid_argument("no command given"));
        }
        if req.argv.iter().map(|a| a.len()).sum::<usize>() > limits::MAX_ARGV_BYTES {
            return Err(Status::invalid_argument("command line longer than 256 KiB"));
        }
        let spec = ExecSpec {
            workspace: if req.workspace.is_empty() {
                "default".into()
            } else {
                req.workspace
            },
            argv: req.argv,
            cwd: req.cwd,
            timeout: Duration::from_millis(if req.timeout_ms == 0 {
                limits::DEFAULT_EXEC_TIMEOUT_MS
            } else {
                req.timeout_ms
            }),
            output_cap_bytes: match req.output_cap_bytes {
                0 => limits::DEFAULT_OUTPUT_CAP_BYTES,
                n => n.min(limits::MAX_OUTPUT_CAP_BYTES),
            },
            limits: self.0.policy.merge(req.limits),
        };
        let mut call = self.0.hub.exec(&w.id, spec).await?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            // Dropping `call` cancels the command on the worker, so stop as soon as the admin
            // goes away, even while the command is silent.
            loop {
                tokio::select! {
                    ev = call.next() => {
                        let Some(ev) = ev else { break };
                        let last = matches!(ev.event, Some(proto::exec_event::Event::Exit(_)));
                        if tx.send(Ok(ev)).await.is_err() || last {
                            break;
                        }
                    }
                    _ = tx.closed() => break,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn file(&self, req: Request<AdminFileRequest>) -> Result<Response<FileResponse>, Status> {
        self.authorize(&req, Role::Admin)?;
        let req = req.into_inner();
        let w = self.resolve(&req.worker)?;
        let mut call = req
            .call
            .ok_or_else(|| Status::invalid_argument("no file operation given"))?;
        if call.workspace.is_empty() {
            call.workspace = "default".into();
        }
        let resp = self.0.hub.file(&w.id, call, FILE_TIMEOUT).await?;
        Ok(Response::new(resp))
    }

    async fn echo(
        &self,
        req: Request<AdminEchoRequest>,
    ) -> Result<Response<AdminEchoResponse>, Status> {
        self.authorize(&req, Role::Admin)?;
        let req = req.into_inner();
        let w = self.resolve(&req.worker)?;
        let payload = self
            .0
            .hub
            .echo(&w.id, req.payload, Duration::from_secs(10))
            .await?;
        Ok(Response::new(AdminEchoResponse { payload }))
    }

    async fn run_plan(
        &self,
        req: Request<proto::RunPlanRequest>,
    ) -> Result<Response<proto::RunPlanResponse>, Status> {
        self.authorize(&req, Role::Admin)?;
        let req = req.into_inner();
        if req.plan_json.len() > 16 * 1024 * 1024 {
            return Err(Status::invalid_argument("plan larger than 16 MiB"));
        }
        let plan = crate::model::Plan::parse(&req.plan_json).map_err(Status::invalid_argument)?;
        let labels = check_labels_map(&req.require_labels)?;
        let w = self.pick_worker(&req.worker, &labels)?;
        let goal = if req.goal.is_empty() {
            format!("scripted plan of {} steps", plan.steps.len())
        } else {
            req.goal.chars().take(4096).collect()
        };
        let empty = labels.is_empty();
        let placement = (!empty).then_some(crate::model::Event::Placement {
            require_labels: labels,
        });
        let id = self
            .0
            .tasks
            .create_plan(goal, plan, w.id, placement.into_iter().collect())
            .await?;
        Ok(Response::new(proto::RunPlanResponse {
            task_id: id.to_string(),
        }))
    }

    async fn run_agent(
        &self,
        req: Request<proto::RunAgentRequest>,
    ) -> Result<Response<proto::RunPlanResponse>, Status> {
        let admin = self.authorize(&req, Role::Admin)?;
        let req = req.into_inner();
        let goal: String = req.goal.trim().chars().take(64 * 1024).collect();
        if goal.is_empty() {
            return Err(Status::invalid_argument(
                "the goal is empty: say what the task is for",
            ));
        }
        if req.transcript.len() > 8 * 1024 * 1024 {
            return Err(Status::invalid_argument("transcript larger than 8 MiB"));
        }
        let permission = match req.permission.as_str() {
            "" => None,
            p => Some(p.parse().map_err(Status::invalid_argument)?),
        };
        let b = req.budget.unwrap_or_default();
        if !(b.usd.is_finite() && b.usd >= 0.0) {
            return Err(Status::invalid_argument(
                "the money budget must be a positive number",
            ));
        }
        let budget = crate::model::agent::Budget {
            usd: b.usd,
            tokens: b.tokens,
            steps: b.steps,
            wall_ms: b.wall_ms,
        };
        let mut spec = self
            .0
            .config
            .agent_spec(&req.model, permission, budget)
            .map_err(Status::invalid_argument)?;
        if spec.model.starts_with("replay:") {
            if req.transcript.is_empty() {
                return Err(Status::invalid_argument(
                    "a replay model needs its transcript: `brain run --model replay:FILE` sends it",
                ));
            }
            crate::llm::Replay::parse(&req.transcript)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            spec.transcript = req.transcript;
        }
        let labels = check_labels_map(&req.require_labels)?;
        let w = self.pick_worker(&req.worker, &labels)?;
        let model = spec.model.clone();
        let rules = crate::model::event::SyncRules {
            include_git: req.include_git,
            extra_excludes: req.extra_excludes.clone(),
            no_default_excludes: req.no_default_excludes,
        };
        rules.check().map_err(Status::invalid_argument)?;
        if !req.git_url.is_empty() && !req.dir.is_empty() {
            return Err(Status::invalid_argument("give --git or --dir, not both"));
        }
        let seed = if !req.dir.is_empty() {
            let op = proto::sync_request::Op::ImportDir(req.dir.clone());
            let r = self
                .0
                .hub
                .sync(
                    &w.id,
                    "import",
                    op,
                    &rules,
                    false,
                    Duration::from_secs(1800),
                )
                .await
                .map_err(|e| {
                    Status::failed_precondition(format!(
                        "importing {} from {}: {e}",
                        req.dir, w.name
                    ))
                })?;
            if !r.error.is_empty() {
                return Err(Status::failed_precondition(format!(
                    "importing {} from {}: {}",
                    req.dir, w.name, r.error
                )));
            }
            tracing::info!(dir = %req.dir, worker = %w.id, files = r.files, bytes = r.bytes, wire_bytes = r.wire_bytes, "workspace imported");
            Some(crate::model::Event::WorkspaceSeeded {
                root_hash: r.root_hash,
                source: format!("{}:{}", w.name, req.dir),
                files: r.files,
                bytes: r.bytes,
            })
        } else if req.git_url.is_empty() {
            None
        } else {
            let imported = crate::mirror::import::from_git(
                &self.0.mirror,
                &req.git_url,
                &req.git_ref,
                rules.to_rules(),
            )
            .await
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
            tracing::info!(url = %req.git_url, files = imported.files, bytes = imported.bytes, "workspace imported");
            Some(crate::model::Event::WorkspaceSeeded {
                root_hash: imported.root_hash,
                source: req.git_url.clone(),
                files: imported.files,
                bytes: imported.bytes,
            })
        };
        let id = self
            .0
            .tasks
            .create_agent(goal, spec, w.id.clone(), {
                let mut first = Vec::new();
                if !labels.is_empty() {
                    first.push(crate::model::Event::Placement {
                        require_labels: labels,
                    });
                }
                if !rules.is_default() {
                    first.push(crate::model::Event::WorkspaceRules { rules });
                }
                first.extend(seed);
                first
            })
            .await?;
        tracing::info!(task = %id, worker = %w.id, %model, by = %admin, "agent task created");
        Ok(Response::new(proto::RunPlanResponse {
            task_id: id.to_string(),
        }))
    }

    async fn decide(
        &self,
        req: Request<proto::DecideRequest>,
    ) -> Result<Response<proto::DecideResponse>, Status> {
        let admin = self.authorize(&req, Role::Admin)?;
        let req = req.into_inner();
        let what = self
            .0
            .tasks
            .decide(&req.task_id, req.approve, &admin.id, &req.reason)
            .await?;
        tracing::info!(task = %req.task_id, approved = req.approve, by = %admin, %what, "approval decided");
        Ok(Response::new(proto::DecideResponse { what }))
    }

    async fn resume_task(
        &self,
        req: Request<proto::ResumeTaskRequest>,
    ) -> Result<Response<proto::ResumeTaskResponse>, Status> {
        let admin = self.authorize(&req, Role::Admin)?;
        let req = req.into_inner();
        let b = req.budget.unwrap_or_default();
        if !(b.usd.is_finite() && b.usd >= 0.0) {
            return Err(Status::invalid_argument(
                "the money budget must be a positive number",
            ));
        }
        let id = self
            .0
            .tasks
            .resume(
                &req.task_id,
                crate::model::agent::Budget {
                    usd: b.usd,
                    tokens: b.tokens,
                    steps: b.steps,
                    wall_ms: b.wall_ms,
                },
            )
            .await?;
        tracing::info!(task = %id, by = %admin, "task resumed with more budget");
        Ok(Response::new(proto::ResumeTaskResponse {}))
    }

    async fn provision(
        &self,
        req: Request<proto::ProvisionRequest>,
    ) -> Result<Response<proto::MachineResponse>, Status> {
        let admin = self.authorize(&req, Role::Admin)?;
        let req = req.into_inner();
        check_labels(&req.labels)?;
        if !req.name.is_empty() {
            check_name(&req.name)?;
        }
        let params = match (req.provider.as_str(), req.ssh) {
            ("ssh", Some(t)) => serde_json::json!({
                "destination": t.destination,
                "port": t.port,
                "identity_file": t.identity_file,
            }),
            ("ssh", None) => {
                return Err(Status::invalid_argument(
                    "the ssh provider needs a destination (USER@HOST)",
                ));
            }
            _ => serde_json::Value::Null,
        };
        let spec = req.spec.unwrap_or_default();
        let m = self
            .0
            .machines
            .provision(crate::provision::Request {
                provider: req.provider,
                spec: crate::provision::Spec {
                    cpu: spec.cpu,
                    memory_gb: spec.memory_gb,
                    disk_gb: spec.disk_gb,
                    gpu: spec.gpu,
                },
                params,
                labels: req.labels.into_iter().collect(),
                name: (!req.name.is_empty()).then_some(req.name),
                task: None,
                brain_url: (!req.brain_url.is_empty()).then_some(req.brain_url),
            })
            .await?;
        tracing::info!(machine = %m.id, by = %admin, "machine provisioned");
        let wait = Duration::from_secs(u64::from(req.wait_seconds.min(3600)));
        let m = if wait.is_zero() {
            m
        } else {
            self.0.machines.wait_ready(&m.id, wait).await?
        };
        let connected = self.connected(&m);
        Ok(Response::new(proto::MachineResponse {
            machine: Some(machine_info(&m, connected)),
        }))
    }

    async fn list_machines(
        &self,
        req: Request<proto::ListMachinesRequest>,
    ) -> Result<Response<proto::ListMachinesResponse>, Status> {
        self.authorize(&req, Role::Admin)?;
        let all = req.get_ref().all;
        let machines = self
            .0
            .machines
            .list()?
            .iter()
            .filter(|m| all || !m.state.is_ended())
            .map(|m| machine_info(m, self.connected(m)))
            .collect();
        Ok(Response::new(proto::ListMachinesResponse { machines }))
    }

    async fn release_machine(
        &self,
        req: Request<proto::ReleaseMachineRequest>,
    ) -> Result<Response<proto::MachineResponse>, Status> {
        let admin = self.authorize(&req, Role::Admin)?;
        let m = self
            .0
            .machines
            .release(&req.get_ref().id, &format!("released by {admin}"))
            .await?;
        Ok(Response::new(proto::MachineResponse {
            machine: Some(machine_info(&m, false)),
        }))
    }

    async fn move_task(
        &self,
        req: Request<proto::MoveTaskRequest>,
    ) -> Result<Response<proto::MoveTaskResponse>, Status> {
        let admin = self.authorize(&req, Role::Admin)?;
        let req = req.into_inner();
        let labels = self.0.tasks.find(&req.task_id)?.state().require_labels;
        let w = self.pick_worker(&req.to, &labels)?;
        if w.revoked {
            return Err(Status::failed_precondition(format!(
                "worker {} is revoked",
                w.id
            )));
        }
        let id = self.0.tasks.request_move(&req.task_id, &w.id).await?;
        tracing::info!(task = %id, to = %w.id, by = %admin, "move requested");
        Ok(Response::new(proto::MoveTaskResponse { to: w.id }))
    }

    async fn list_tasks(
        &self,
        req: Request<proto::ListTasksRequest>,
    ) -> Result<Response<proto::ListTasksResponse>, Status> {
        self.authorize(&req, Role::Admin)?;
        let tasks = self
            .0
            .tasks
            .list()
            .into_iter()
            .map(|t| proto::TaskSummary {
                id: t.id.to_string(),
                status: t.status.as_str().into(),
                steps_done: t.agent.as_ref().map_or(t.next_step, |a| a.spent.steps),
                steps_total: t.agent.as_ref().map_or(t.steps_total(), |a| a.limits.steps),
                goal: t.goal,
                worker: t.worker.unwrap_or_default(),
                created_unix_ms: t.created_ms,
                updated_unix_ms: t.updated_ms,
                model: t
                    .agent
                    .as_ref()
                    .map(|a| a.spec.model.clone())
                    .unwrap_or_default(),
                tokens: t.agent.as_ref().map_or(0, |a| a.spent.tokens),
                spent_usd: t.agent.as_ref().map_or(0.0, |a| a.spent.usd),
                limits: t.agent.as_ref().map(|a| proto::Budget {
                    usd: a.limits.usd,
                    tokens: a.limits.tokens,
                    steps: a.limits.steps,
                    wall_ms: a.limits.wall_ms,
                }),
                permission: t
                    .agent
                    .as_ref()
                    .map(|a| a.spec.permission.to_string())
                    .unwrap_or_default(),
                reason: t.reason,
            })
            .collect();
        Ok(Response::new(proto::ListTasksResponse { tasks }))
    }

    type TaskLogStream = ReceiverStream<Result<proto::TaskRecord, Status>>;

    async fn task_log(
        &self,
        req: Request<proto::TaskLogRequest>,
    ) -> Result<Response<Self::TaskLogStream>, Status> {
        self.authorize(&req, Role::Admin)?;
        let req = req.into_inner();
        let task = self.0.tasks.find(&req.task_id)?;
        // Subscribe before reading the history, so nothing falls between the two.
        let mut live = task.events.subscribe();
        let mut output = task.live.subscribe();
        let log = self.0.tasks.log.clone();
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            let mut last = 0u64;
            let send = |json: String| {
                let tx = tx.clone();
                async move { tx.send(Ok(proto::TaskRecord { json })).await.is_ok() }
            };
            let mut ended = task.state().status.is_terminal();
            loop {
                // History (or what was missed after lagging behind).
                let records = match log.read(task.id, last) {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = tx.send(Err(Status::internal(e.to_string()))).await;
                        return;
                    }
                };
                for r in records {
                    let json = match r {
                        Ok(r) => {
                            last = r.seq;
                            ended |= matches!(r.event, crate::model::Event::Finished { .. });
                            serde_json::to_string(&r).expect("records serialise")
                        }
                        Err(e) => serde_json::json!({ "error": e.to_string() }).to_string(),
                    };
                    if !send(json).await {
                        return;
                    }
                }
                if !req.follow || ended {
                    return;
                }
                loop {
                    tokio::select! {
                        r = live.recv() => match r {
                            Ok(r) if r.seq <= last => {}
                            Ok(r) => {
                                last = r.seq;
                                let end = matches!(r.event, crate::model::Event::Finished { .. });
                                if !send(serde_json::to_string(&r).expect("records serialise")).await || end {
                                    return;
                                }
                            }
                            // Fell behind: re-read from the log.
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                        },
                        o = output.recv() => {
                            if let Ok(o) = o
                                && !send(serde_json::to_string(&o).expect("output serialises")).await
                            {
                                return;
                            }
                        }
                        _ = tx.closed() => return,
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn cancel_task(
        &self,
        req: Request<proto::CancelTaskRequest>,
    ) -> Result<Response<proto::CancelTaskResponse>, Status> {
        let admin = self.authorize(&req, Role::Admin)?;
        let id = self.0.tasks.cancel(&req.get_ref().task_id).await?;
        tracing::info!(task = %id, by = %admin, "task cancel requested");
        Ok(Response::new(proto::CancelTaskResponse {}))
    }

    type BackupStream = ReceiverStream<Result<proto::BackupChunk, Status>>;

    async fn backup(
        &self,
        req: Request<proto::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        let admin = self.authorize(&req, Role::Admin)?;
        tracing::info!(by = %admin, "backup started");
        let db = self.0.db.clone();
        let (tx, rx) = mpsc::channel(16);
        tokio::task::spawn_blocking(move || {
            let mut buf = Vec::with_capacity(128 * 1024);
            // Snapshots first: a snapshot must never cover events the backup lacks.
            let mut names = db.tree_names();
            names.sort_by_key(|n| n.as_ref() != b"snapshots");
            for name in names {
                let tree = match db.open_tree(&name) {
                    Ok(t) => t,
                    Err(e) => {
                        let _ = tx.blocking_send(Err(Status::internal(e.to_string())));
                        return;
                    }
                };
                for kv in tree.iter() {
                    let (k, v) = match kv {
                        Ok(kv) => kv,
                        Err(e) => {
                            let _ = tx.blocking_send(Err(Status::internal(e.to_string())));
                            return;
                        }
                    };
                    crate::storage::write_line(&mut buf, &name, &k, &v);
                    if buf.len() >= 64 * 1024
                        && tx
                            .blocking_send(Ok(proto::BackupChunk {
                                data: std::mem::take(&mut buf),
                            }))
                            .is_err()
                    {
                        return;
                    }
                }
            }
            if !buf.is_empty() {
                let _ = tx.blocking_send(Ok(proto::BackupChunk { data: buf }));
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
