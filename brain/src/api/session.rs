//! The worker session: one long-lived bidirectional stream per worker. The first message is
//! a hello (capabilities, labels); then heartbeats both ways, the calls the hub routes, and
//! their answers. One deadline, reset by every message, declares a silent worker lost.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use proto::worker_session_server::WorkerSession;
use proto::{ExecEvent, WorkerMessage, brain_message, worker_message};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::{Services, SessionOptions, convert};
use crate::fleet::board::Member;
use crate::fleet::hub::{Hub, Session};
use crate::trust::registry::Caps;

/// How long a new session may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

#[tonic::async_trait]
impl WorkerSession for Services {
    type AttachStream = crate::fleet::hub::SessionStream;

    async fn attach(
        &self,
        req: Request<Streaming<WorkerMessage>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let peer = self.worker_caller(&req)?;
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
        if let Err(why) = proto::compatible("worker", hello.protocol, proto::OLDEST_PROTOCOL) {
            tracing::warn!(worker = %peer.id, name = %hello.name, "{why}");
            return Err(Status::failed_precondition(why));
        }
        convert::labels(&hello.labels)?;
        let caps = Caps::from(hello.capabilities.unwrap_or_default());
        self.0
            .registry
            .update_worker(&peer.id, |w| {
                w.last_seen_ms = shared::now_unix_ms();
                for (k, v) in &hello.labels {
                    w.labels.entry(k.clone()).or_insert_with(|| v.clone());
                }
                w.caps = Some(caps.clone());
            })
            .await?;
        let (session, stream) = self.0.hub.register(&peer.id);
        // A revocation that landed between `the role layer and `register` found no session to
        // close; check again now that this one is visible to it.
        if let Ok(Err(reason)) = self.0.registry.check_peer(&peer) {
            self.0.hub.unregister(&session);
            return Err(Status::permission_denied(reason.to_string()));
        }
        let opts = self.0.session;
        // Placement may choose it from now on, with the labels as the registry holds them
        // (an enrolment's labels win over the hello's).
        let record = self.0.registry.worker(&peer.id)?;
        let labels = record.map(|w| w.labels).unwrap_or_default();
        let max_tasks = match caps.max_tasks {
            0 => crate::fleet::board::default_capacity(caps.cpus),
            n => n,
        };
        self.0.hub.join(
            &session,
            Member {
                id: Arc::from(peer.id.as_str()),
                name: hello.name.chars().take(255).collect(),
                labels: Arc::new(labels),
                sandbox: Arc::new(caps.sandbox.clone()),
                max_tasks,
                load: None,
                session_no: session.session_no,
                since: std::time::Instant::now(),
                last_pulse: None,
                pulse_every: opts.heartbeat_interval(),
            },
        );
        session
            .send(brain_message::Msg::HelloAck(proto::HelloAck {
                worker_id: peer.id.clone(),
                brain_time_unix_ms: shared::now_unix_ms(),
                heartbeat_interval_ms: opts.heartbeat_interval().as_millis() as u64,
                lost_after_ms: opts.lost_after.as_millis() as u64,
                protocol: proto::PROTOCOL_VERSION,
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
                .update_worker(&session.worker_id, |w| w.last_seen_ms = seen)
                .await;
            tracing::warn!(worker = %session.worker_id, session = session.session_no, %reason, "worker session ended");
        });
        Ok(Response::new(stream))
    }

    /// A worker's pulse, on its own connection: it keeps the session alive (a worker busy
    /// with output is slow, never lost, while it pulses) and reports its load.
    async fn pulse(
        &self,
        req: Request<proto::Heartbeat>,
    ) -> Result<Response<proto::Heartbeat>, Status> {
        let peer = self.worker_caller(&req)?;
        let beat = req.into_inner();
        let Some(session) = self.0.hub.session(&peer.id) else {
            return Err(Status::failed_precondition(
                "no session: attach before pulsing",
            ));
        };
        let now = shared::now_unix_ms();
        session.last_seen_ms.store(now, Ordering::Relaxed);
        session.last_pulse_ms.store(now, Ordering::Relaxed);
        if let Some(load) = beat.load {
            self.0.hub.board().pulse(&peer.id, load);
        }
        Ok(Response::new(proto::Heartbeat {
            unix_ms: shared::now_unix_ms(),
            load: None,
        }))
    }
}

/// Reads a worker's messages until the session ends; returns why it ended.
async fn run_session(
    hub: &Hub,
    session: &Arc<Session>,
    inbound: &mut (impl Stream<Item = Result<WorkerMessage, Status>> + Unpin),
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
            // A message already here counts before the deadline does, however late this
            // loop runs on a busy brain.
            biased;
            _ = session.closed.cancelled() => return "closed by the brain".into(),
            msg = inbound.next() => {
                let msg = match msg {
                    Some(Err(status)) => return format!("stream error: {}", status.message()),
                    None => return "the worker closed the session".into(),
                    Some(Ok(m)) => m,
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
            _ = &mut lost => {
                // Pulses (on their own connection) keep the worker too.
                let quiet_ms = shared::now_unix_ms() - session.last_pulse_ms.load(Ordering::Relaxed);
                let quiet = Duration::from_millis(quiet_ms.max(0) as u64);
                if quiet >= opts.lost_after {
                    return format!("lost: no message for {:?}", opts.lost_after);
                }
                lost.as_mut().reset(tokio::time::Instant::now() + (opts.lost_after - quiet));
            }
            _ = beat.tick() => {
                // Never wait on a full queue here: heartbeats are best effort.
                session.try_send(brain_message::Msg::Heartbeat(proto::Heartbeat {
                    unix_ms: shared::now_unix_ms(),
                    load: None,
                }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::CallIds;

    #[tokio::test(start_paused = true)]
    async fn a_worker_silent_for_lost_after_is_lost_and_messages_keep_it() {
        let (hub, _events) = Hub::new(CallIds::starting_above(0, 1));
        let (session, _out) = hub.register("w-1");
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let mut inbound = tokio_stream::wrappers::ReceiverStream::new(rx);
        let opts = SessionOptions {
            lost_after: Duration::from_secs(15),
        };
        let (h, s) = (hub.clone(), session.clone());
        let run = tokio::spawn(async move { run_session(&h, &s, &mut inbound, opts).await });
        // Heartbeats every 10 s for a minute: still connected.
        let beat = || {
            Ok(WorkerMessage {
                msg: Some(worker_message::Msg::Heartbeat(proto::Heartbeat {
                    unix_ms: 0,
                    load: None,
                })),
            })
        };
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_secs(10)).await;
            tx.send(beat()).await.unwrap();
        }
        assert!(!run.is_finished(), "lost although it kept talking");
        let silent = tokio::time::Instant::now();
        let why = run.await.unwrap();
        assert_eq!(why, "lost: no message for 15s");
        let waited = silent.elapsed();
        assert!(
            waited >= Duration::from_secs(15) && waited < Duration::from_secs(16),
            "{waited:?}"
        );
        drop(tx);
    }
}
