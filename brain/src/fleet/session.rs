//! One worker's live session: its outbound queue, the calls waiting for answers on it, the
//! stream tonic sends to the worker, and a running command's events. The hub creates and
//! routes them; callers see only [`ExecCall`].

use shared::locks::Lock;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use proto::{BrainMessage, ExecEvent, ExecExit, FileResponse, brain_message};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::Status;

/// Errors from acting on a worker.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("worker {0} is not connected")]
    NotConnected(String),
    #[error("worker {0} was lost before the call finished")]
    Lost(String),
    #[error("worker {worker} did not answer within {timeout:?}")]
    Timeout { worker: String, timeout: Duration },
    #[error("worker {worker} sent a malformed answer: {reason}")]
    Malformed { worker: String, reason: String },
}

/// Outbound messages to one worker. Bounded: a worker that stops reading is eventually
/// declared lost by the heartbeat timeout rather than growing memory.
pub(super) const OUTBOUND_QUEUE: usize = 1024;
/// Events buffered for one exec call's consumer before the session reader waits for it.
pub(super) const EXEC_EVENT_QUEUE: usize = 256;
/// How long a call may wait for room in the outbound queue before the worker counts as lost.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after its own timeout a command may take to report its end before the brain
/// gives up on it.
pub(super) const EXEC_GRACE: Duration = Duration::from_secs(30);

pub(super) enum Pending {
    /// The sender, and a flag set when the caller fell too far behind and the call was dropped.
    Exec(mpsc::Sender<ExecEvent>, Arc<AtomicBool>),
    File(oneshot::Sender<FileResponse>),
    Echo(oneshot::Sender<Vec<u8>>),
}

/// One worker's live session.
pub struct Session {
    pub worker_id: String,
    /// Distinguishes this session from an older or newer one of the same worker.
    pub session_no: u64,
    pub(super) tx: mpsc::Sender<Result<BrainMessage, Status>>,
    /// Calls awaiting an answer, by call id. A std mutex: held only for map operations.
    pub(super) pending: Mutex<HashMap<u64, Pending>>,
    /// Cancelled when the session must end (revocation, replacement, shutdown).
    pub closed: CancellationToken,
    /// Why the session was closed, sent to the worker as the stream's final status.
    pub(super) final_status: Mutex<Option<Status>>,
    /// Unix ms of the last message from the worker; kept in memory, persisted on heartbeats.
    pub last_seen_ms: std::sync::atomic::AtomicI64,
    /// Unix ms of the last pulse (0: none yet): pulses come on a connection of their own.
    pub last_pulse_ms: std::sync::atomic::AtomicI64,
}

impl Session {
    /// Ends the session, telling the worker why. The status is delivered even when the
    /// outbound queue is full: the stream ends with it.
    pub fn close(&self, status: Status) {
        let mut slot = self.final_status.locked();
        if slot.is_none() {
            *slot = Some(status);
        }
        drop(slot);
        self.closed.cancel();
    }

    /// Sends a message to the worker, waiting (bounded) for room in the queue.
    pub async fn send(&self, msg: brain_message::Msg) -> Result<(), Error> {
        let send = self.tx.send(Ok(BrainMessage { msg: Some(msg) }));
        match tokio::time::timeout(SEND_TIMEOUT, send).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Error::Lost(self.worker_id.clone())),
            Err(_) => Err(Error::Timeout {
                worker: self.worker_id.clone(),
                timeout: SEND_TIMEOUT,
            }),
        }
    }

    /// Sends a message if there is room; best effort (heartbeats, cancels).
    pub fn try_send(&self, msg: brain_message::Msg) {
        let _ = self.tx.try_send(Ok(BrainMessage { msg: Some(msg) }));
    }

    /// Answers every pending call as lost. Called once the session has ended.
    pub fn fail_pending(&self) {
        let drained: Vec<(u64, Pending)> = self.lock_pending().drain().collect();
        for (call_id, p) in drained {
            if let Pending::Exec(tx, _) = p {
                let _ = tx.try_send(ExecEvent {
                    event: Some(proto::exec_event::Event::Exit(ExecExit {
                        call_id,
                        worker_lost: true,
                        ..Default::default()
                    })),
                });
            }
            // File and echo waiters see their sender dropped and report `Lost`.
        }
    }

    pub(super) fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Pending>> {
        self.pending.locked()
    }

    /// Routes an exec event from the worker to its caller. Never waits: a caller that has
    /// fallen a whole queue behind loses its call (the command is cancelled and the caller is
    /// told why), so one slow reader cannot stall the session.
    /// Returns the event if no exec call of this session wanted it.
    pub fn deliver_exec(&self, call_id: u64, ev: ExecEvent, last: bool) -> Option<ExecEvent> {
        let mut pending = self.lock_pending();
        let Some(Pending::Exec(tx, overflow)) = pending.get(&call_id) else {
            return Some(ev); // cancelled, unknown, or a durable call's live output
        };
        match tx.try_send(ev) {
            Ok(()) => {
                if last {
                    pending.remove(&call_id);
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                pending.remove(&call_id);
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                overflow.store(true, Ordering::Relaxed);
                pending.remove(&call_id);
                drop(pending);
                tracing::warn!(worker = %self.worker_id, call_id, "exec caller too slow; cancelling the call");
                self.try_send(brain_message::Msg::Cancel(proto::Cancel { call_id }));
            }
        }
        None
    }

    pub fn deliver_file(&self, resp: FileResponse) {
        let mut pending = self.lock_pending();
        if matches!(pending.get(&resp.call_id), Some(Pending::File(_)))
            && let Some(Pending::File(tx)) = pending.remove(&resp.call_id)
        {
            let _ = tx.send(resp);
        }
    }

    pub fn deliver_echo(&self, call_id: u64, payload: Vec<u8>) {
        let mut pending = self.lock_pending();
        if matches!(pending.get(&call_id), Some(Pending::Echo(_)))
            && let Some(Pending::Echo(tx)) = pending.remove(&call_id)
        {
            let _ = tx.send(payload);
        }
    }
}

/// The brain → worker half of a session, as tonic sends it: the queued messages, then, once
/// the session is closed, the status saying why.
pub struct SessionStream {
    pub(super) rx: mpsc::Receiver<Result<BrainMessage, Status>>,
    pub(super) closed: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    pub(super) session: Arc<Session>,
    pub(super) done: bool,
}

impl tokio_stream::Stream for SessionStream {
    type Item = Result<BrainMessage, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.closed.as_mut().poll(cx).is_ready() {
            self.done = true;
            let status = self
                .session
                .final_status
                .locked()
                .take()
                .unwrap_or_else(|| Status::unavailable("session closed"));
            return Poll::Ready(Some(Err(status)));
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            other => other,
        }
    }
}

/// Removes a call from the pending map when its caller goes away, and tells the worker to
/// stop it if it had not finished.
pub(super) struct CallGuard {
    pub(super) session: Arc<Session>,
    pub(super) call_id: u64,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let was_pending = self.session.lock_pending().remove(&self.call_id).is_some();
        if was_pending {
            self.session
                .try_send(brain_message::Msg::Cancel(proto::Cancel {
                    call_id: self.call_id,
                }));
        }
    }
}

/// A running command: its output and exit, in order. Dropping it cancels the command.
pub struct ExecCall {
    pub(super) call_id: u64,
    pub(super) rx: mpsc::Receiver<ExecEvent>,
    pub(super) overflow: Arc<AtomicBool>,
    /// The brain's own bound: the command's timeout plus a grace.
    pub(super) deadline: tokio::time::Instant,
    pub(super) finished: bool,
    pub(super) _guard: CallGuard,
}

impl ExecCall {
    /// The next event; `None` after the exit event. There is always an exit event: if the
    /// worker cannot give one, the brain makes it (worker lost, caller too slow, no answer).
    pub async fn next(&mut self) -> Option<ExecEvent> {
        if self.finished {
            return None;
        }
        let exit = |x: ExecExit| ExecEvent {
            event: Some(proto::exec_event::Event::Exit(x)),
        };
        let ev = match tokio::time::timeout_at(self.deadline, self.rx.recv()).await {
            Ok(Some(ev)) => ev,
            Ok(None) if self.overflow.load(Ordering::Relaxed) => exit(ExecExit {
                call_id: self.call_id,
                cancelled: true,
                error: "cancelled: the caller read the output too slowly".into(),
                ..Default::default()
            }),
            Ok(None) => exit(ExecExit {
                call_id: self.call_id,
                worker_lost: true,
                ..Default::default()
            }),
            Err(_) => exit(ExecExit {
                call_id: self.call_id,
                timed_out: true,
                error: "the worker did not report the end of the command in time".into(),
                ..Default::default()
            }),
        };
        if matches!(ev.event, Some(proto::exec_event::Event::Exit(_))) {
            self.finished = true;
        }
        Some(ev)
    }
}
