//! Durable calls: run through the journal, so each call id runs at most once; output is
//! streamed live and captured (capped) into a result that is synced to disk before it is
//! sent, and sent again after every reconnect until the brain acknowledges it.

use shared::locks::Lock;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use proto::{CallResult, ExecStart, WorkerMessage, worker_message};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::journal::{Journal, Known};

/// Output kept in a durable result, per stream (the head; live output has it all).
pub const CAPTURE_BYTES: usize = 64 * 1024;

fn result_msg(r: CallResult) -> WorkerMessage {
    WorkerMessage {
        msg: Some(worker_message::Msg::CallResult(r)),
    }
}

/// The sender of the session open now, if any. Durable calls outlive sessions, so they send
/// through whichever session is current when they have something to say.
pub type CurrentOut = Arc<Mutex<Option<mpsc::Sender<WorkerMessage>>>>;

fn current(out: &CurrentOut) -> Option<mpsc::Sender<WorkerMessage>> {
    out.locked().clone()
}

/// Sends a result on the current session; if there is none (or it just ended) the result
/// stays in the journal and goes out after the next reconnect.
async fn send_result(out: &CurrentOut, r: CallResult) {
    if let Some(tx) = current(out) {
        let _ = tx.send(result_msg(r)).await;
    }
}

/// Starts (or answers) a durable call.
pub fn start(
    start: ExecStart,
    journal: Arc<Journal>,
    workspaces: PathBuf,
    out: CurrentOut,
    running: Arc<Mutex<HashMap<u64, CancellationToken>>>,
    cancel: CancellationToken,
    confinement: crate::exec::Confinement,
) {
    let call_id = start.call_id;
    let known = match journal.begin(call_id) {
        Ok(k) => k,
        Err(e) => {
            // Without a journal entry we cannot promise at-most-once: refuse to run.
            tracing::error!(call_id, error = %e, "cannot journal a durable call; not running it");
            let r = CallResult {
                call_id,
                exit: Some(proto::ExecExit {
                    call_id,
                    error: format!("the worker cannot record the call in its journal: {e}"),
                    code: Some(125),
                    ..Default::default()
                }),
                ..Default::default()
            };
            tokio::spawn(async move { send_result(&out, r).await });
            return;
        }
    };
    match known {
        Known::Running => {}
        Known::Done(r) => {
            tokio::spawn(async move { send_result(&out, r).await });
        }
        Known::New => {
            running.locked().insert(call_id, cancel.clone());
            tokio::spawn(async move {
                let (tx, mut rx) = mpsc::channel::<WorkerMessage>(256);
                let j = journal.clone();
                let on_spawn: crate::exec::OnSpawn =
                    Box::new(move |pgid| j.set_group(call_id, pgid));
                let exec = crate::exec::run_with(
                    start,
                    &workspaces,
                    tx,
                    cancel,
                    Some(on_spawn),
                    Some(&confinement),
                );
                let collect = async {
                    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
                    let mut exit = None;
                    while let Some(m) = rx.recv().await {
                        match m.msg {
                            Some(worker_message::Msg::ExecOutput(o)) => {
                                let buf = if o.stream == proto::OutputStream::Stderr as i32 {
                                    &mut stderr
                                } else {
                                    &mut stdout
                                };
                                let room = CAPTURE_BYTES.saturating_sub(buf.len());
                                buf.extend_from_slice(&o.data[..o.data.len().min(room)]);
                                // Live view: best effort, never blocks the command.
                                if let Some(tx) = current(&out) {
                                    let _ = tx.try_send(WorkerMessage {
                                        msg: Some(worker_message::Msg::ExecOutput(o)),
                                    });
                                }
                            }
                            Some(worker_message::Msg::ExecExit(x)) => exit = Some(x),
                            _ => {}
                        }
                    }
                    (stdout, stderr, exit)
                };
                let ((), (stdout, stderr, exit)) = tokio::join!(exec, collect);
                let r = CallResult {
                    call_id,
                    exit,
                    stdout,
                    stderr,
                    interrupted: String::new(),
                };
                if let Err(e) = journal.finish(&r) {
                    tracing::error!(call_id, error = %e, "cannot record a durable call's result");
                }
                running.locked().remove(&call_id);
                send_result(&out, r).await;
            });
        }
    }
}
