//! The `Egress` service: a connection a task's command opened through its worker's egress
//! proxy, carried over the worker's mutual-TLS connection. The worker's certificate, the
//! call's grant (a keyed tag of the task and call the brain gave the worker, checked without
//! being stored, so it holds across a restart) and the task's own policy decide; the worker's
//! view is never trusted. Refusals are answered in words for the command and logged in the
//! task's log.

use std::sync::Arc;
use std::time::Duration;

use proto::{TunnelDown, TunnelUp, tunnel_down};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::Services;
use crate::egress::{Injection, Plan, Upstream};
use crate::model::egress::{Decision, HostPattern};
use crate::trust::egress_ca::EgressCa;
use crate::trust::secrets::Secrets;

/// How long the worker has to send the opening message.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes a tunnel carries in one message, and messages queued each way.
const PIECE: usize = 32 * 1024;
const QUEUE: usize = 8;

/// What the egress service needs: the secrets, the egress CA, how to go upstream.
pub struct EgressParts {
    pub secrets: Secrets,
    pub ca: EgressCa,
    pub upstream: Arc<Upstream>,
}

fn refused(reason: String) -> TunnelDown {
    TunnelDown {
        kind: Some(tunnel_down::Kind::Refused(reason)),
    }
}

/// A tunnel that says only why it is refused.
fn refusal(reason: String) -> Response<ReceiverStream<Result<TunnelDown, Status>>> {
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(Ok(refused(reason)));
    Response::new(ReceiverStream::new(rx))
}

/// Equal in time whatever the inputs.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The secrets `names` as they are now, to inject for `task` into a connection to
/// `host:port`: one removed or bound elsewhere since the task started is not sent (the
/// reason, in words).
async fn injections(
    secrets: &Secrets,
    task: &str,
    names: &[String],
    host: &str,
    port: u16,
) -> Result<Vec<Injection>, String> {
    let mut list = Vec::new();
    for name in names {
        let found = secrets
            .reveal(name)
            .await
            .ok()
            .filter(|(info, _)| info.bound_to(host, port));
        let Some((info, value)) = found else {
            return Err(format!(
                "secret {name:?} is no longer in the brain, or no longer bound to {host}:{port}"
            ));
        };
        list.push(Injection {
            name: name.clone(),
            placeholder: secrets.placeholder(task, name),
            value,
            inject: info.inject,
        });
    }
    Ok(list)
}

#[tonic::async_trait]
impl proto::egress_server::Egress for Services {
    type TunnelStream = ReceiverStream<Result<TunnelDown, Status>>;

    async fn tunnel(
        &self,
        req: Request<Streaming<TunnelUp>>,
    ) -> Result<Response<Self::TunnelStream>, Status> {
        let peer = self.worker_caller(&req)?;
        let mut up = req.into_inner();
        let first = tokio::time::timeout(OPEN_TIMEOUT, up.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no opening message"))??
            .ok_or_else(|| Status::invalid_argument("the tunnel closed before it opened"))?;
        let open = first
            .open
            .ok_or_else(|| Status::invalid_argument("the first message must open the tunnel"))?;
        let parts = &self.0.egress;
        let host = open.host.trim_end_matches('.').to_ascii_lowercase();
        let port = u16::try_from(open.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| Status::invalid_argument(format!("port {} is not one", open.port)))?;
        if HostPattern::parse(&host).is_err() {
            return Err(Status::invalid_argument(format!(
                "{:?} is not a host name or address",
                open.host
            )));
        }
        let grant = parts
            .secrets
            .tag(&["egress", &open.task, &open.call_id.to_string()]);
        if !same(&grant, &open.grant) {
            return Err(Status::permission_denied(
                "this call's egress grant is not valid",
            ));
        }
        let spec = self
            .0
            .engine
            .egress_policy(&open.task, &peer.id)
            .ok_or_else(|| {
                Status::permission_denied(format!(
                    "task {} has ended, runs on another worker, or has no egress policy",
                    open.task
                ))
            })?;
        let decision = spec.decide(&host, port, open.plain);
        let plan = match decision {
            Decision::Refuse(reason) => {
                self.0
                    .engine
                    .egress_refused(&open.task, &host, port, &reason)
                    .await;

                return Ok(refusal(reason));
            }
            Decision::Direct => {
                return Ok(refusal(format!(
                    "{host}:{port} is reached directly from the worker, not through the brain"
                )));
            }
            Decision::Intercept { inject, methods } => {
                let list = match injections(&parts.secrets, &open.task, &inject, &host, port).await
                {
                    Ok(list) => list,
                    Err(reason) => {
                        self.0
                            .engine
                            .egress_refused(&open.task, &host, port, &reason)
                            .await;
                        return Ok(refusal(reason));
                    }
                };
                Plan {
                    host: host.clone(),
                    port,
                    inject: list,
                    methods,
                }
            }
        };
        // Each connection the brain carries costs it memory: a bounded number at once.
        let ticket = match parts.upstream.admit(&open.task) {
            Ok(t) => t,
            Err(reason) => {
                self.0
                    .engine
                    .egress_refused(&open.task, &host, port, &reason)
                    .await;

                return Ok(refusal(reason));
            }
        };
        let tls = parts
            .ca
            .server_config(&host)
            .map_err(|e| Status::internal(format!("egress certificate for {host}: {e}")))?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let _ = tx
            .send(Ok(TunnelDown {
                kind: Some(tunnel_down::Kind::Opened(true)),
            }))
            .await;
        tracing::info!(task = %open.task, call_id = open.call_id, %host, port, secrets = plan.inject.len(), "egress tunnel opened");
        let (ours, theirs) = tokio::io::duplex(2 * PIECE);
        let (mut read_half, mut write_half) = tokio::io::split(ours);
        // Worker → proxy.
        tokio::spawn(async move {
            while let Ok(Some(m)) = up.message().await {
                if !m.data.is_empty() && write_half.write_all(&m.data).await.is_err() {
                    break;
                }
            }
            let _ = write_half.shutdown().await;
        });
        // Proxy → worker.
        let down = tx.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; PIECE];
            loop {
                match read_half.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let m = TunnelDown {
                            kind: Some(tunnel_down::Kind::Data(buf[..n].to_vec())),
                        };
                        if down.send(Ok(m)).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let (engine, task) = (self.0.engine.clone(), open.task.clone());
        let refuse_host = host.clone();
        // A refusal inside the connection is logged and told to the worker, which writes it
        // on the command's stderr; the connection goes on.
        let note = tx.clone();
        let on_refuse: Arc<dyn Fn(String) + Send + Sync> = Arc::new(move |reason: String| {
            let (engine, task, host) = (engine.clone(), task.clone(), refuse_host.clone());
            let note = note.clone();
            tokio::spawn(async move {
                let _ = note.send(Ok(refused(reason.clone()))).await;
                engine.egress_refused(&task, &host, port, &reason).await
            });
        });
        let upstream = parts.upstream.clone();
        tokio::spawn(async move {
            crate::egress::intercept(theirs, tls, plan, upstream, on_refuse).await;
            drop((tx, ticket));
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
