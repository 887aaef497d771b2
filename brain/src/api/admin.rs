//! The admin API: what the `brain` CLI (and later the web page) calls. Each handler checks
//! the admin's certificate, converts the request ([`super::convert`]), and hands the work
//! to the component that owns it: the registry, the hub, the engine, the machines.

use std::sync::atomic::Ordering;
use std::time::Duration;

use proto::admin_server::Admin;
use proto::{
    AdminEchoRequest, AdminEchoResponse, AdminExecRequest, AdminFileRequest, CreateTokenRequest,
    CreateTokenResponse, ExecEvent, FileResponse, IssueAdminRequest, IssueAdminResponse,
    ListWorkersRequest, ListWorkersResponse, RevokeAdminRequest, RevokeAdminResponse,
    RevokeWorkerRequest, RevokeWorkerResponse,
};
use shared::limits;
use shared::pki::{self, Role};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{FILE_TIMEOUT, Services, check_name, convert};
use crate::engine::{Kind, NewTask, Source};
use crate::fleet::hub::ExecSpec;
use crate::model::ops::Limits;
use crate::trust::registry;

/// Largest plan, goal and transcript accepted.
const MAX_PLAN_BYTES: usize = 16 * 1024 * 1024;
const MAX_GOAL_CHARS: usize = 64 * 1024;
/// Longest `--assists` list a run may give (every name in the registry takes under 400).
const MAX_ASSISTS_BYTES: usize = 1024;
const MAX_TRANSCRIPT_BYTES: usize = 8 * 1024 * 1024;

impl Services {
    /// A worker a new task names that this brain does not know may have enrolled through
    /// another replica since this one last read the registry (each second): read it again
    /// once, so the task is not refused for that second.
    async fn know_worker(&self, worker: &str) {
        if worker.is_empty() || self.0.registry.resolve_worker(worker).is_ok() {
            return;
        }
        if let Err(e) = self.0.registry.refresh().await {
            tracing::debug!(error = %e, "cannot read the registry again");
        }
    }

    /// A new task's egress policy, when it names secrets, allow-list entries or a preset.
    async fn egress_spec(
        &self,
        secrets: &[String],
        allow: &[String],
        preset: &str,
    ) -> Result<Option<crate::model::egress::EgressSpec>, Status> {
        if secrets.is_empty() && allow.is_empty() && preset.is_empty() {
            return Ok(None);
        }
        if secrets.len() > 32 || allow.len() > 256 {
            return Err(Status::invalid_argument(
                "at most 32 --secret and 256 --allow entries",
            ));
        }
        let infos = self
            .0
            .egress
            .secrets
            .for_task(secrets)
            .await
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let mut envs = std::collections::BTreeSet::new();
        for i in &infos {
            if !envs.insert(i.env.clone()) {
                return Err(Status::invalid_argument(format!(
                    "two secrets of the task put their placeholder in {}: give one another --env",
                    i.env
                )));
            }
        }
        let allow = self
            .0
            .config
            .get()
            .egress
            .allow_list(preset, allow)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Some(crate::model::egress::EgressSpec {
            secrets: infos
                .into_iter()
                .map(|i| crate::model::egress::Binding {
                    name: i.name,
                    env: i.env,
                    hosts: i.hosts,
                    port: i.port,
                })
                .collect(),
            allow,
        }))
    }

    fn connected(&self, m: &crate::provision::Machine) -> bool {
        m.worker
            .as_deref()
            .is_some_and(|w| self.0.hub.is_connected(w))
    }
}

#[tonic::async_trait]
impl Admin for Services {
    async fn list_workers(
        &self,
        _req: Request<ListWorkersRequest>,
    ) -> Result<Response<ListWorkersResponse>, Status> {
        let workers = self
            .0
            .registry
            .workers()?
            .into_iter()
            .map(|w| {
                let session = match self.0.hub.session(&w.id) {
                    Some(s) => convert::Session::Here(s.last_seen_ms.load(Ordering::Relaxed)),
                    None => self
                        .0
                        .engine
                        .worker_elsewhere(&w.id)
                        .map_or(convert::Session::None, convert::Session::Elsewhere),
                };
                let board = self.0.hub.board();
                let tasks = (board.running_on(&w.id), board.peak(&w.id));
                let view = board.view(&w.id);
                convert::worker_info(w, session, tasks, view)
            })
            .collect();
        Ok(Response::new(ListWorkersResponse { workers }))
    }

    async fn revoke_worker(
        &self,
        req: Request<RevokeWorkerRequest>,
    ) -> Result<Response<RevokeWorkerResponse>, Status> {
        let admin = self.caller(&req)?;
        let w = self.resolve(&req.get_ref().worker)?;
        let remove = req.get_ref().remove;
        if remove {
            self.0.registry.remove_worker(&w.id).await?;
        } else {
            self.0.registry.revoke_worker(&w.id).await?;
        }
        let closed = self.0.hub.disconnect(
            &w.id,
            Status::permission_denied(
                crate::trust::registry::PeerRefused::Revoked(format!("worker {}", w.id))
                    .to_string(),
            ),
        );
        tracing::warn!(worker = %w.id, by = %admin, session_closed = closed, remove, "worker revoked");
        Ok(Response::new(RevokeWorkerResponse {
            worker_id: w.id,
            session_closed: closed,
        }))
    }

    async fn create_token(
        &self,
        req: Request<CreateTokenRequest>,
    ) -> Result<Response<CreateTokenResponse>, Status> {
        let req = req.into_inner();
        let labels = convert::labels(&req.labels)?;
        let ttl = req.ttl_seconds;
        if ttl == 0 || ttl > 30 * 24 * 3600 {
            return Err(Status::invalid_argument(
                "token TTL must be between 1s and 30 days",
            ));
        }
        let (token, expires) = self
            .0
            .registry
            .create_token(ttl as i64 * 1000, labels)
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
        let admin = self.cert_caller(&req)?;
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
        let admin = self.cert_caller(&req)?;
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
        self.cert_caller(&req)?;
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
            limits: self
                .0
                .placement
                .policy()
                .merge(&req.limits.map(Limits::from).unwrap_or_default())
                .into(),
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
        self.cert_caller(&req)?;
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
        self.cert_caller(&req)?;
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
        let admin = self.caller(&req)?;
        let req = req.into_inner();
        if req.plan_json.len() > MAX_PLAN_BYTES {
            return Err(Status::invalid_argument("plan larger than 16 MiB"));
        }
        let plan = crate::model::Plan::parse(&req.plan_json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let goal = if req.goal.is_empty() {
            format!("scripted plan of {} steps", plan.steps.len())
        } else {
            req.goal.chars().take(4096).collect()
        };
        let egress = self
            .egress_spec(&req.secrets, &req.allow, &req.egress)
            .await?;
        self.know_worker(&req.worker).await;
        let id = self
            .0
            .engine
            .create(NewTask {
                goal,
                kind: Kind::Plan { plan, egress },
                worker: req.worker,
                labels: convert::labels(&req.require_labels)?,
                rules: Default::default(),
                source: Source::Empty,
                deliver: None,
                attempts: None,
            })
            .await?;
        tracing::info!(task = %id, by = %admin, "plan task created");
        Ok(Response::new(proto::RunPlanResponse {
            task_id: id.to_string(),
        }))
    }

    async fn run_agent(
        &self,
        req: Request<proto::RunAgentRequest>,
    ) -> Result<Response<proto::RunPlanResponse>, Status> {
        let admin = self.caller(&req)?;
        let req = req.into_inner();
        let goal: String = req.goal.trim().chars().take(MAX_GOAL_CHARS).collect();
        if goal.is_empty() {
            return Err(Status::invalid_argument(
                "the goal is empty: say what the task is for",
            ));
        }
        if req.transcript.len() > MAX_TRANSCRIPT_BYTES {
            return Err(Status::invalid_argument("transcript larger than 8 MiB"));
        }
        let permission = match req.permission.as_str() {
            "" => None,
            p => Some(
                p.parse::<crate::model::agent::Permission>()
                    .map_err(|e| Status::invalid_argument(e.to_string()))?,
            ),
        };
        let budget = req.budget.unwrap_or_default().try_into()?;
        let mut spec = self
            .0
            .config
            .get()
            .agent_spec(&req.model, permission, budget)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
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
        convert::request_check(&mut spec, &req.check, req.check_timeout_ms, &req.protect)?;
        spec.no_agents_md = req.no_agents_md;
        if req.assists.len() > MAX_ASSISTS_BYTES {
            return Err(Status::invalid_argument(format!(
                "--assists is longer than {MAX_ASSISTS_BYTES} bytes: name presets, families or assists (`brain config assists` lists them)"
            )));
        }
        if !req.assists.trim().is_empty() {
            let choice = crate::model::assists::Choice::Preset(req.assists.clone());
            spec.assists = Some(
                crate::model::assists::Assists::from_choice(&choice)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?,
            );
        }
        spec.egress = self
            .egress_spec(&req.secrets, &req.allow, &req.egress)
            .await?;
        let rules = convert::sync_rules(
            req.include_git,
            &req.extra_excludes,
            req.no_default_excludes,
        )?;
        let source = match (req.git_url.is_empty(), req.dir.is_empty()) {
            (false, false) => {
                return Err(Status::invalid_argument("give --git or --dir, not both"));
            }
            (true, true) => Source::Empty,
            (true, false) => Source::Dir(req.dir),
            (false, true) => {
                // Refused now, in words, rather than when the task first clones.
                self.0
                    .config
                    .get()
                    .deliver
                    .settings()
                    .remotes
                    .check(&req.git_url)
                    .await
                    .map_err(|e| Status::invalid_argument(e.to_string()))?;
                Source::Git {
                    url: req.git_url,
                    git_ref: req.git_ref,
                }
            }
        };
        let deliver = match req.deliver.as_str() {
            "" => None,
            d => Some(
                d.parse::<crate::model::delivery::Mode>()
                    .map_err(|e| Status::invalid_argument(e.to_string()))?,
            ),
        };
        let attempts = self
            .0
            .config
            .get()
            .attempts_spec(crate::config::AttemptsRequest {
                count: req.attempts,
                pick: &req.pick,
                models: &req.attempt_models,
                temperature: req.attempt_temperature,
                escalate: &req.escalate_models,
            })
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let model = spec.model.clone();
        self.know_worker(&req.worker).await;
        let id = self
            .0
            .engine
            .create(NewTask {
                goal,
                kind: Kind::Agent(Box::new(spec)),
                worker: req.worker,
                labels: convert::labels(&req.require_labels)?,
                rules,
                source,
                deliver,
                attempts,
            })
            .await?;
        tracing::info!(task = %id, %model, by = %admin, "agent task created");
        Ok(Response::new(proto::RunPlanResponse {
            task_id: id.to_string(),
        }))
    }

    async fn decide(
        &self,
        req: Request<proto::DecideRequest>,
    ) -> Result<Response<proto::DecideResponse>, Status> {
        let admin = self.caller(&req)?;
        let req = req.into_inner();
        let what = self
            .0
            .engine
            .decide(
                &req.task_id,
                req.approve,
                &admin.id,
                &req.reason,
                req.always,
            )
            .await?;
        tracing::info!(task = %req.task_id, approved = req.approve, always = req.always, by = %admin, %what, "approval decided");
        Ok(Response::new(proto::DecideResponse { what }))
    }

    async fn resume_task(
        &self,
        req: Request<proto::ResumeTaskRequest>,
    ) -> Result<Response<proto::ResumeTaskResponse>, Status> {
        let admin = self.caller(&req)?;
        let req = req.into_inner();
        let extra = req.budget.unwrap_or_default().try_into()?;
        let id = self.0.engine.resume(&req.task_id, extra).await?;
        tracing::info!(task = %id, by = %admin, "task resumed with more budget");
        Ok(Response::new(proto::ResumeTaskResponse {}))
    }

    async fn provision(
        &self,
        req: Request<proto::ProvisionRequest>,
    ) -> Result<Response<proto::MachineResponse>, Status> {
        let admin = self.caller(&req)?;
        let req = req.into_inner();
        let labels = convert::labels(&req.labels)?;
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
                labels,
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
            machine: Some(convert::machine_info(&m, connected)),
        }))
    }

    async fn list_machines(
        &self,
        req: Request<proto::ListMachinesRequest>,
    ) -> Result<Response<proto::ListMachinesResponse>, Status> {
        let all = req.get_ref().all;
        let machines = self
            .0
            .machines
            .list()?
            .iter()
            .filter(|m| all || !m.state.is_ended())
            .map(|m| convert::machine_info(m, self.connected(m)))
            .collect();
        Ok(Response::new(proto::ListMachinesResponse { machines }))
    }

    async fn release_machine(
        &self,
        req: Request<proto::ReleaseMachineRequest>,
    ) -> Result<Response<proto::MachineResponse>, Status> {
        let admin = self.caller(&req)?;
        let m = self
            .0
            .machines
            .release(&req.get_ref().id, &format!("released by {admin}"))
            .await?;
        Ok(Response::new(proto::MachineResponse {
            machine: Some(convert::machine_info(&m, false)),
        }))
    }

    async fn move_task(
        &self,
        req: Request<proto::MoveTaskRequest>,
    ) -> Result<Response<proto::MoveTaskResponse>, Status> {
        let admin = self.caller(&req)?;
        let req = req.into_inner();
        let (id, to) = self.0.engine.request_move(&req.task_id, &req.to).await?;
        tracing::info!(task = %id, %to, by = %admin, "move requested");
        Ok(Response::new(proto::MoveTaskResponse { to }))
    }

    async fn list_tasks(
        &self,
        _req: Request<proto::ListTasksRequest>,
    ) -> Result<Response<proto::ListTasksResponse>, Status> {
        let engine = &self.0.engine;
        let tasks = engine
            .list()
            .into_iter()
            .map(|t| convert::summary_in(engine, t))
            .collect();
        Ok(Response::new(proto::ListTasksResponse { tasks }))
    }

    type TaskLogStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<proto::TaskRecord, Status>> + Send>,
    >;

    async fn task_log(
        &self,
        req: Request<proto::TaskLogRequest>,
    ) -> Result<Response<Self::TaskLogStream>, Status> {
        let req = req.into_inner();
        let items = self
            .0
            .engine
            .follow(&req.task_id, req.after_seq, req.follow)?;
        // Polled by the connection itself: no task and no queue between the log and the wire.
        Ok(Response::new(Box::pin(
            items.map_while(|item| convert::task_record(item).map(Ok)),
        )))
    }

    async fn task_prompt(
        &self,
        req: Request<proto::TaskPromptRequest>,
    ) -> Result<Response<proto::TaskPromptResponse>, Status> {
        use crate::engine::Turn;
        let req = req.into_inner();
        let turn = match (req.step, req.seq) {
            (0, 0) => Turn::Last,
            (step, 0) => Turn::Step(step),
            (0, seq) => Turn::Seq(seq),
            _ => {
                return Err(Status::invalid_argument(
                    "name a step or a record, not both",
                ));
            }
        };
        let engine = &self.0.engine;
        let sent = engine.sent_request(&req.task_id, turn).await?;
        let mut json = serde_json::to_value(&sent).map_err(|e| Status::internal(e.to_string()))?;
        // Each string masked as text, before JSON escapes a secret's quotes or backslashes.
        mask_strings(&mut json, &|s| engine.redact(s));
        Ok(Response::new(proto::TaskPromptResponse {
            json: json.to_string(),
        }))
    }

    async fn cancel_task(
        &self,
        req: Request<proto::CancelTaskRequest>,
    ) -> Result<Response<proto::CancelTaskResponse>, Status> {
        let admin = self.caller(&req)?;
        let id = self.0.engine.cancel(&req.get_ref().task_id).await?;
        tracing::info!(task = %id, by = %admin, "task cancel requested");
        Ok(Response::new(proto::CancelTaskResponse {}))
    }

    type TaskDiffStream = ReceiverStream<Result<proto::DataChunk, Status>>;

    async fn task_diff(
        &self,
        req: Request<proto::TaskDiffRequest>,
    ) -> Result<Response<Self::TaskDiffStream>, Status> {
        let req = req.into_inner();
        Ok(Response::new(
            super::results::diff(&self.0, &req.task_id, &req.form, &req.root).await?,
        ))
    }

    type ExportTaskStream = ReceiverStream<Result<proto::ExportEntry, Status>>;

    async fn export_task(
        &self,
        req: Request<proto::ExportTaskRequest>,
    ) -> Result<Response<Self::ExportTaskStream>, Status> {
        let req = req.into_inner();
        Ok(Response::new(
            super::results::export(&self.0, &req.task_id).await?,
        ))
    }

    async fn deliver_task(
        &self,
        req: Request<proto::DeliverTaskRequest>,
    ) -> Result<Response<proto::DeliverTaskResponse>, Status> {
        let admin = self.caller(&req)?;
        let req = req.into_inner();
        let r = super::results::deliver(&self.0, &req.task_id, req.pull_request).await?;
        tracing::info!(task = %req.task_id, branch = %r.branch, commit = %r.commit, by = %admin, "task delivered");
        Ok(Response::new(r))
    }

    type BackupStream = ReceiverStream<Result<proto::BackupChunk, Status>>;

    async fn backup(
        &self,
        req: Request<proto::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        let admin = self.cert_caller(&req)?;
        tracing::info!(by = %admin, "backup started");
        let Some(db) = self.0.db.clone() else {
            return Err(Status::failed_precondition(
                "this brain keeps its state in PostgreSQL, shared by its replicas: back it up with PostgreSQL's own tools (pg_dump, or the server's base backups)",
            ));
        };
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

    async fn create_api_token(
        &self,
        req: Request<proto::CreateApiTokenRequest>,
    ) -> Result<Response<proto::CreateApiTokenResponse>, Status> {
        let admin = self.cert_caller(&req)?;
        let r = super::credentials::create_token(&self.0, req.into_inner()).await?;
        tracing::info!(credential = %r.id, by = %admin, "web API token created");
        Ok(Response::new(r))
    }

    async fn create_web_login(
        &self,
        req: Request<proto::CreateWebLoginRequest>,
    ) -> Result<Response<proto::CreateWebLoginResponse>, Status> {
        let admin = self.cert_caller(&req)?;
        let r = super::credentials::create_login(&self.0, req.into_inner()).await?;
        tracing::info!(by = %admin, "web login link created");
        Ok(Response::new(r))
    }

    async fn list_api_tokens(
        &self,
        req: Request<proto::ListApiTokensRequest>,
    ) -> Result<Response<proto::ListApiTokensResponse>, Status> {
        self.cert_caller(&req)?;
        Ok(Response::new(
            super::credentials::list(&self.0, req.get_ref().all).await?,
        ))
    }

    async fn revoke_api_token(
        &self,
        req: Request<proto::RevokeApiTokenRequest>,
    ) -> Result<Response<proto::RevokeApiTokenResponse>, Status> {
        let admin = self.cert_caller(&req)?;
        let id = &req.get_ref().id;
        let revoked = self.0.web.revoke(id).await?;
        if revoked == 0 {
            return Err(Status::not_found(format!(
                "no live web token or session with id or name {id:?}: see `brain admin token list`"
            )));
        }
        tracing::warn!(credential = %id, revoked, by = %admin, "web credentials revoked");
        Ok(Response::new(proto::RevokeApiTokenResponse {
            revoked: revoked as u32,
        }))
    }

    async fn reload_config(
        &self,
        req: Request<proto::ReloadConfigRequest>,
    ) -> Result<Response<proto::ReloadConfigResponse>, Status> {
        let admin = self.cert_caller(&req)?;
        let r = self.0.reload_config().map_err(|e| {
            Status::failed_precondition(format!(
                "{e}: nothing was changed; fix it (`brain config check` says what is wrong) and reload again"
            ))
        })?;
        tracing::info!(by = %admin, "config reload asked for");
        Ok(Response::new(proto::ReloadConfigResponse {
            file: r.file,
            applied: r.applied.iter().map(|s| s.to_string()).collect(),
            need_restart: r.need_restart.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn set_secret(
        &self,
        req: Request<proto::SetSecretRequest>,
    ) -> Result<Response<proto::SetSecretResponse>, Status> {
        let admin = self.cert_caller(&req)?;
        let req = req.into_inner();
        let name = req.name.clone();
        // Masked before it is stored, so no output shown after this call can hold it.
        if let Ok(value) = String::from_utf8(req.value.clone()) {
            self.0.engine.learn_secret(value);
        }
        let resp = super::secrets::set(&self.0.egress.secrets, req).await?;
        tracing::info!(secret = %name, replaced = resp.replaced, by = %admin, "secret set");
        Ok(Response::new(resp))
    }

    async fn list_secrets(
        &self,
        req: Request<proto::ListSecretsRequest>,
    ) -> Result<Response<proto::ListSecretsResponse>, Status> {
        self.cert_caller(&req)?;
        Ok(Response::new(
            super::secrets::list(&self.0.egress.secrets).await?,
        ))
    }

    async fn remove_secret(
        &self,
        req: Request<proto::RemoveSecretRequest>,
    ) -> Result<Response<proto::RemoveSecretResponse>, Status> {
        let admin = self.cert_caller(&req)?;
        let req = req.into_inner();
        let name = req.name.clone();
        let resp = super::secrets::remove(&self.0.egress.secrets, req).await?;
        tracing::info!(secret = %name, removed = resp.removed, by = %admin, "secret removed");
        Ok(Response::new(resp))
    }
}

/// Every string in `v` through `mask`.
fn mask_strings(v: &mut serde_json::Value, mask: &dyn Fn(&str) -> String) {
    use serde_json::Value;
    match v {
        Value::String(s) => *s = mask(s),
        Value::Array(a) => a.iter_mut().for_each(|v| mask_strings(v, mask)),
        Value::Object(o) => o.values_mut().for_each(|v| mask_strings(v, mask)),
        _ => {}
    }
}
