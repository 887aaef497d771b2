//! The effects drivers have, each logged before (or as) it is performed: issuing and running
//! calls, barriers, moves, seeding a workspace, waiting for a worker or a person.

use std::time::Duration;

use super::core::Cx;
use super::error::Error;
use super::ports::{CallError, OutputSink};
use super::store::LiveOutput;
use crate::model::event::{Event, Outcome, Purpose, ToolCall, ToolResult};
use crate::model::ops::{Command, CommandEnd, Egress, FileAnswer, FileOp, Stream, SyncOp};
use crate::model::state::{PendingCall, Status, TaskState};
use shared::locks::Lock;

/// Output kept per result in the log (the worker captures up to 64 KiB per stream).
const LOGGED_OUTPUT: usize = 16 * 1024;
/// Output a command may produce before the worker cuts it.
const OUTPUT_CAP: u64 = 1 << 20;
/// How long one file call may take.
const FILE_TIMEOUT: Duration = Duration::from_secs(60);
/// Tries of a file operation on a connected worker that keeps failing (a timeout, an
/// error of the session) before the failure is the call's answer.
const FILE_TRIES: u32 = 3;
/// How long a barrier or a materialisation may take.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(300);
const MATERIALISE_TIMEOUT: Duration = Duration::from_secs(1800);
/// How long a move waits for its target to be connected.
const MOVE_TARGET_WAIT: Duration = Duration::from_secs(60);
/// How long a task waits for its worker before looking again.
const WORKER_WAIT: Duration = Duration::from_secs(3600);
/// How often a task whose worker is gone looks again whether it is back, or where else it
/// may go. A look, not an event: where it may go changes with time as much as with events
/// (its back-off since the last failover, workers held for dropping until they are steady,
/// the load each reports every pulse), and the worker's own return is settled by the call
/// in flight, which waits on the session itself.
const FAILOVER_POLL: Duration = Duration::from_millis(250);
/// A starting workspace that could not be put on the worker is tried again after this.
const SEED_RETRY: Duration = Duration::from_secs(2);

/// Logs `before` and the end of the task.
pub async fn finish(
    cx: &Cx<'_>,
    outcome: Outcome,
    reason: String,
    mut before: Vec<Event>,
) -> Result<(), Error> {
    tracing::info!(task = %cx.task.id, ?outcome, %reason, "task ended");
    before.push(Event::Finished {
        outcome,
        reason,
        verified: None,
    });
    cx.store().append(cx.task, before).await
}

/// Logs a status change, unless the task is in that status for that reason already.
pub async fn set_status(cx: &Cx<'_>, status: Status, reason: &str) -> Result<(), Error> {
    let st = cx.task.state();
    if st.status != status || st.reason != reason {
        cx.store()
            .append(
                cx.task,
                vec![Event::StatusChanged {
                    status,
                    reason: reason.into(),
                }],
            )
            .await?;
    }
    Ok(())
}

/// Finds the task a worker: the least loaded with room now, else a turn in the queue, in
/// order, with how the fleet stands as the task's `queued` reason. Logs the worker assigned.
pub async fn place(cx: &Cx<'_>) -> Result<(), Error> {
    let st = cx.task.state();
    let labels = st.require_labels.clone();
    let placement = &cx.ports().placement;
    let id = cx.task.id.0;
    let apart = siblings_workers(cx, &st);
    let placed = placement.place_apart(id, &labels, &apart);
    // An attempt that would share a worker (or wait for one) gets a machine of its own when
    // the task may have one without asking a person.
    let placed = match placed {
        Ok(w) if !apart.contains(&w) => Ok(w),
        other if st.attempt_of.is_some() => match own_machine(cx, &st).await? {
            Some(w) => Ok(w),
            None => other,
        },
        other => other,
    };
    let worker = match placed {
        Ok(w) => w,
        Err(reason) => {
            tracing::info!(task = %cx.task.id, %reason, "task queued");
            set_status(cx, Status::Queued, &reason.to_string()).await?;
            let turn = placement.enqueue(id, &labels);
            tokio::select! {
                w = turn => match w {
                    Ok(w) => w,
                    Err(_) => return Ok(()),
                },
                _ = cx.task.cancel.cancelled() => return Ok(()),
            }
        }
    };
    tracing::info!(task = %cx.task.id, %worker, "task placed");
    let mut events = vec![Event::WorkerAssigned { worker }];
    if cx.task.state().status == Status::Queued {
        events.push(Event::StatusChanged {
            status: Status::Running,
            reason: String::new(),
        });
    }
    cx.store().append(cx.task, events).await
}

/// A machine provisioned for the attempt through the configured offers, when its
/// permission and the offer's price need no person's approval and its budget covers it;
/// `None` (and the reason logged) otherwise, and it shares a worker. The machine is released
/// when the attempt ends; one made before a crash is found again (`obtain` prefers an idle
/// machine made for the task).
async fn own_machine(cx: &Cx<'_>, st: &TaskState) -> Result<Option<String>, Error> {
    let Some(a) = st.agent.as_deref() else {
        return Ok(None);
    };
    let envs = &cx.ports().environments;
    let tid = cx.task.id.to_string();
    let req = crate::model::env::EnvRequest {
        labels: st.require_labels.clone(),
        reason: "an attempt of its own".into(),
        ..Default::default()
    };
    let quote = envs.quote(&tid, "", &req);
    if a.spec.permission == crate::model::agent::Permission::Ask || quote.needs_approval {
        tracing::info!(task = %cx.task.id, "an attempt shares a worker: a machine of its own would need a person's approval");
        return Ok(None);
    }
    if !quote.offer {
        return Ok(None);
    }
    set_status(
        cx,
        Status::Queued,
        "provisioning a machine for this attempt",
    )
    .await?;
    let budget_left =
        (a.limits.usd > 0.0).then(|| a.limits.usd - a.spent.usd - envs.task_cost(&tid));
    match envs.obtain(&tid, "", &req, budget_left).await {
        Ok(g) => {
            tracing::info!(task = %cx.task.id, worker = %g.worker, machine = ?g.machine, "an attempt got a machine of its own");
            Ok(Some(g.worker))
        }
        Err(why) => {
            tracing::info!(task = %cx.task.id, %why, "an attempt shares a worker: no machine of its own");
            Ok(None)
        }
    }
}

/// The workers an attempt's siblings hold (one entry per sibling), so attempts spread.
fn siblings_workers(cx: &Cx<'_>, st: &crate::model::state::TaskState) -> Vec<String> {
    let Some(of) = st.attempt_of else {
        return vec![];
    };
    let store = cx.store();
    let Some(parent) = store.task(of.parent).map(|p| p.state()) else {
        return vec![];
    };
    parent
        .attempts
        .iter()
        .flat_map(|a| a.list.iter())
        .filter(|a| a.task != st.id)
        .filter_map(|a| {
            let s = store.task(a.task)?.state();
            s.status.goes_on().then_some(s.worker).flatten()
        })
        .collect()
}

/// Whether the worker is connected (and the task marked running). If not, marks the task
/// waiting and waits a while for it, for failover or a cancel; the caller looks again.
pub async fn worker_ready(cx: &Cx<'_>, worker: &str) -> Result<bool, Error> {
    let workers = &cx.ports().workers;
    if !workers.is_connected(worker) {
        set_status(cx, Status::Waiting, &format!("waiting for worker {worker}")).await?;
        tokio::select! {
            _ = workers.wait_connected(worker, WORKER_WAIT) => {}
            to = failover_target(cx, worker) => {
                tracing::warn!(task = %cx.task.id, lost = %worker, %to, "worker lost; failing over");
                cx.task.set_move_request(&to);
            }
            _ = cx.task.cancel.cancelled() => {}
        }
        return Ok(false);
    }
    set_status(cx, Status::Running, "").await?;
    Ok(true)
}

/// Logs a call as issued once its worker is there (the next turn settles it).
pub async fn issue(cx: &Cx<'_>, call: ToolCall, step: u32, purpose: Purpose) -> Result<(), Error> {
    let worker = cx.task.state().worker.unwrap_or_default();
    // Wait for the worker before issuing, so a call is issued only when it can be sent.
    if worker_ready(cx, &worker).await? {
        cx.store()
            .issue(cx.task, &worker, step, purpose, call)
            .await?;
    }
    Ok(())
}

/// Waits for a person's decision (or a cancel, or a move asked); survives restarts: the
/// request is in the log.
pub async fn await_decision(cx: &Cx<'_>) {
    tokio::select! {
        _ = cx.task.wake.notified() => {}
        _ = cx.task.cancel.cancelled() => {}
    }
}

/// Makes the brain's mirror equal to the worker's disk and logs the barrier (when anything
/// changed). The worker lists only what its watcher saw change unless `full`, or when its
/// watcher cannot say (then it walks the whole tree). A barrier that fails is logged as a warning and left to the
/// next one; returns whether the mirror now matches the worker.
pub async fn barrier(cx: &Cx<'_>, worker: &str, full: bool) -> Result<bool, Error> {
    let st = cx.task.state();
    let op = SyncOp::Barrier {
        base: st.barrier_root.clone(),
    };
    let r = cx
        .ports()
        .workers
        .sync(
            worker,
            &st.workspace,
            op,
            &st.sync_rules,
            full,
            BARRIER_TIMEOUT,
        )
        .await;
    match r {
        Ok(r) if r.error.is_empty() => {
            tracing::debug!(task = %cx.task.id, root = %r.root_hash, files = r.files, wire_bytes = r.wire_bytes, hashed = r.hashed, "barrier");
            if !r.left_out.is_empty() || r.left_out_more > 0 {
                tracing::warn!(task = %cx.task.id, %worker, named = r.left_out.len(), more = r.left_out_more, "entries left out of the workspace's mirror");
                cx.store()
                    .append(
                        cx.task,
                        vec![Event::LeftOut {
                            worker: worker.to_string(),
                            entries: r.left_out,
                            more: r.left_out_more,
                        }],
                    )
                    .await?;
            }
            // Logged when the root changed, and also when it did not but calls ran since the
            // last barrier: the log must say their effects (none) are in the mirror, or a
            // move would rewind and run them again.
            let changed = r.root_hash != st.barrier_root;
            if changed || st.unsynced_calls > 0 || st.unsure_unsynced {
                cx.store()
                    .append(
                        cx.task,
                        vec![Event::Barrier {
                            version: st.barrier_version + u64::from(changed),
                            root_hash: r.root_hash,
                            files: r.files,
                            bytes: r.bytes,
                            wire_bytes: r.wire_bytes,
                            tmp_bytes: r.tmp_bytes,
                            tmp_files: r.tmp_files,
                        }],
                    )
                    .await?;
            }
            Ok(true)
        }
        Ok(r) => {
            tracing::warn!(task = %cx.task.id, %worker, error = %r.error, "barrier failed; the next one will catch up");
            Ok(false)
        }
        Err(e) => {
            tracing::warn!(task = %cx.task.id, %worker, error = %e, "barrier failed; the next one will catch up");
            Ok(false)
        }
    }
}

/// Moves a task (at a tool-call boundary) to `to`: a final barrier from the source if it is
/// there (else the last barrier is what moves: failover), the target materialises that
/// manifest fetching only the blobs it lacks and verifies the root hash, and the assignment
/// is switched in the log. Logged as started first, so a crash resumes it; a move that
/// cannot complete is logged as aborted and the task stays where it was.
pub async fn move_task(cx: &Cx<'_>, to: &str) -> Result<(), Error> {
    cx.task.take_move_request(to);
    let st = cx.task.state();
    let workers = &cx.ports().workers;
    let from = st.worker.clone().unwrap_or_default();
    if st.moving_to.as_deref() != Some(to) {
        tracing::info!(task = %cx.task.id, %from, %to, "move started");
        cx.store()
            .append(
                cx.task,
                vec![Event::MoveStarted {
                    from: from.clone(),
                    to: to.to_string(),
                }],
            )
            .await?;
    }
    let abort = |reason: String| async move {
        tracing::warn!(task = %cx.task.id, %to, %reason, "move aborted");
        cx.store()
            .append(
                cx.task,
                vec![Event::MoveAborted {
                    to: to.to_string(),
                    reason,
                }],
            )
            .await
    };
    // As every barrier: what the source's tracker saw change (it sees writes through a
    // memory mapping too, at their close), a whole walk only when it cannot say. A walk would
    // cost the size of the tree, not of the change, on every move.
    if workers.is_connected(&from) && !barrier(cx, &from, false).await? {
        return abort(format!("the final barrier from {from} failed")).await;
    }
    if !workers.wait_connected(to, MOVE_TARGET_WAIT).await {
        return abort(format!("worker {to} is not connected")).await;
    }
    let st = cx.task.state();
    let (mut files, mut wire_bytes) = (0, 0);
    if !st.barrier_root.is_empty() {
        let op = SyncOp::Materialise {
            root: st.barrier_root.clone(),
        };
        match workers
            .sync(
                to,
                &st.workspace,
                op,
                &st.sync_rules,
                false,
                MATERIALISE_TIMEOUT,
            )
            .await
        {
            Ok(r) if r.error.is_empty() && r.root_hash == st.barrier_root => {
                tracing::info!(task = %cx.task.id, %to, files = r.files, bytes = r.bytes, blobs = r.blobs_sent, wire_bytes = r.wire_bytes, "workspace materialised on the target");
                (files, wire_bytes) = (r.files, r.wire_bytes);
            }
            Ok(r) if r.error.is_empty() => {
                return abort(format!(
                    "{to} reported root {} instead of {}",
                    r.root_hash, st.barrier_root
                ))
                .await;
            }
            Ok(r) => {
                return abort(format!(
                    "{to} could not materialise the workspace: {}",
                    r.error
                ))
                .await;
            }
            Err(e) => return abort(format!("{to} could not materialise the workspace: {e}")).await,
        }
    }
    cx.store()
        .append(
            cx.task,
            vec![Event::MoveCompleted {
                to: to.to_string(),
                files,
                wire_bytes,
            }],
        )
        .await?;
    tracing::info!(task = %cx.task.id, %from, %to, "move completed");
    Ok(())
}

/// Puts the task's starting workspace on its worker before its first call (once: the
/// barrier it logs marks it done).
pub async fn seed(cx: &Cx<'_>) -> Result<(), Error> {
    let st = cx.task.state();
    let worker = st.worker.clone().unwrap_or_default();
    if !worker_ready(cx, &worker).await? {
        return Ok(());
    }
    let op = SyncOp::Materialise {
        root: st.seed_root.clone(),
    };
    let r = cx
        .ports()
        .workers
        .sync(
            &worker,
            &st.workspace,
            op,
            &st.sync_rules,
            false,
            MATERIALISE_TIMEOUT,
        )
        .await;
    let why = match r {
        Ok(r) if r.error.is_empty() && r.root_hash == st.seed_root => {
            return cx
                .store()
                .append(
                    cx.task,
                    vec![Event::Barrier {
                        version: 1,
                        root_hash: r.root_hash,
                        files: r.files,
                        bytes: r.bytes,
                        wire_bytes: r.wire_bytes,
                        tmp_bytes: 0,
                        tmp_files: 0,
                    }],
                )
                .await;
        }
        Ok(r) if r.error.is_empty() => format!("it reported root {}", r.root_hash),
        Ok(r) => r.error,
        Err(e) => e.to_string(),
    };
    tracing::warn!(task = %cx.task.id, %worker, error = %why, "the starting workspace could not be put on the worker; trying again");
    tokio::select! {
        _ = tokio::time::sleep(SEED_RETRY) => {}
        _ = cx.task.cancel.cancelled() => {}
    }
    Ok(())
}

/// Resolves with a worker to move to once `worker` has been gone for the failover delay and
/// another eligible worker is connected; pends otherwise.
pub async fn failover_target(cx: &Cx<'_>, worker: &str) -> String {
    let mut gone_since: Option<tokio::time::Instant> = None;
    loop {
        tokio::time::sleep(FAILOVER_POLL).await;
        if cx.ports().workers.is_connected(worker) {
            gone_since = None;
            continue;
        }
        let since = *gone_since.get_or_insert_with(tokio::time::Instant::now);
        if since.elapsed() >= cx.opts().failover_after
            && let Some(to) =
                cx.ports()
                    .placement
                    .failover(cx.task.id.0, worker, &cx.task.state().require_labels)
        {
            return to;
        }
    }
}

/// Logs that nobody can say what a call did.
pub async fn interrupt(cx: &Cx<'_>, call_id: u64, reason: impl Into<String>) -> Result<(), Error> {
    cx.store()
        .append(
            cx.task,
            vec![Event::ToolCallInterrupted {
                call_id,
                reason: reason.into(),
            }],
        )
        .await
}

/// Waits visibly for a worker that must report a call (it may still be running there).
pub async fn wait_for_report(cx: &Cx<'_>, p: &PendingCall) -> Result<(), Error> {
    set_status(
        cx,
        Status::Waiting,
        &format!(
            "waiting for worker {} to report call {}",
            p.worker, p.call_id
        ),
    )
    .await
}

fn text(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(LOGGED_OUTPUT)];
    String::from_utf8_lossy(cut).into_owned()
}

/// What became of a command.
pub enum CommandOutcome {
    /// The task was cancelled while it ran (it was told to stop on the worker).
    Cancelled,
    /// The worker says it was interrupted; acknowledge once logged.
    Interrupted(String),
    /// The worker is gone and only it can say: wait for it.
    WorkerGone,
    /// Finished; acknowledge once logged.
    Done {
        result: ToolResult,
        stdout: String,
        stderr: String,
    },
}

/// The egress policy of a task's commands, whatever kind of task it is (`None`: behind no
/// proxy): an agent's is in its spec, a plan's beside its plan.
pub fn egress_spec(st: &TaskState) -> Option<&crate::model::egress::EgressSpec> {
    match &st.agent {
        Some(a) => a.spec.egress.as_ref(),
        None => st.plan_egress.as_ref(),
    }
}

/// A call's placeholders and egress policy, when its task's commands run behind the egress
/// proxy.
fn egress_for(cx: &Cx<'_>, call_id: u64) -> (Vec<(String, String)>, Option<Egress>) {
    let st = cx.task.state();
    let Some(spec) = egress_spec(&st).cloned() else {
        return (vec![], None);
    };
    let task = cx.task.id.to_string();
    let (env, grant, ca_pem, resolve) = match &cx.opts().egress {
        Some(keys) => (
            spec.secrets
                .iter()
                .map(|b| (b.env.clone(), keys.0.placeholder(&task, &b.name)))
                .collect(),
            keys.0.grant(&task, call_id),
            keys.0.ca_pem(),
            keys.0.pinned(),
        ),
        // No keys: the brain refuses every tunnel (fails closed).
        None => (vec![], String::new(), String::new(), vec![]),
    };
    let direct = spec.direct_rules().into_iter().cloned().collect();
    (
        env,
        Some(Egress {
            task,
            grant,
            direct,
            ca_pem,
            resolve,
        }),
    )
}

/// Runs (or, after a restart, asks the worker's journal about) a pending command, showing
/// its output to watchers as it comes.
pub async fn run_command(
    cx: &Cx<'_>,
    p: &PendingCall,
    argv: &[String],
    timeout_ms: u64,
    cwd: &str,
) -> CommandOutcome {
    let (env, egress) = egress_for(cx, p.call_id);
    let cmd = Command {
        call_id: p.call_id,
        workspace: cx.task.state().workspace,
        argv: argv.to_vec(),
        cwd: cwd.to_string(),
        timeout_ms,
        output_cap_bytes: OUTPUT_CAP,
        limits: cx.opts().limits,
        env,
        egress,
    };
    let live = cx.task.live.clone();
    // One masker per stream, so a secret cut between two pieces is masked too.
    let masks = std::sync::Arc::new(std::sync::Mutex::new((
        cx.core.redact.stream(),
        cx.core.redact.stream(),
    )));
    let (held, held_live, call_id) = (masks.clone(), live.clone(), p.call_id);
    // What the maskers held back, once the command has ended.
    let flush = move || {
        let mut m = held.locked();
        for (stream, text) in [
            (Stream::Stdout, m.0.finish()),
            (Stream::Stderr, m.1.finish()),
        ] {
            if !text.is_empty() {
                held_live.send(LiveOutput {
                    kind: "live_output",
                    call_id,
                    stream: stream.as_str(),
                    text,
                });
            }
        }
    };
    let output: OutputSink = std::sync::Arc::new(move |o| {
        let text = {
            let mut m = masks.locked();
            let mask = match o.stream {
                Stream::Stderr => &mut m.1,
                _ => &mut m.0,
            };
            mask.push(&o.data)
        };
        if text.is_empty() {
            return;
        }
        live.send(LiveOutput {
            kind: "live_output",
            call_id: o.call_id,
            stream: o.stream.as_str(),
            text,
        });
    });
    let workers = &cx.ports().workers;
    let end = tokio::select! {
        o = workers.run_durable(&p.worker, cmd, cx.opts().worker_wait, output) => o,
        to = failover_target(cx, &p.worker) => {
            tracing::warn!(task = %cx.task.id, lost = %p.worker, %to, call_id = p.call_id, "worker lost during a call; failing over");
            cx.task.set_move_request(&to);
            return CommandOutcome::Interrupted(format!(
                "worker {} was lost while the command ran; the task moves to {to}",
                p.worker
            ));
        }
        _ = cx.task.cancel.cancelled() => {
            workers.cancel(&p.worker, p.call_id);
            return CommandOutcome::Cancelled;
        }
    };
    flush();
    match end {
        CommandEnd::WorkerGone => CommandOutcome::WorkerGone,
        CommandEnd::Interrupted(why) => CommandOutcome::Interrupted(why),
        CommandEnd::Finished {
            result,
            stdout,
            stderr,
        } => CommandOutcome::Done {
            result,
            stdout: text(&stdout),
            stderr: text(&stderr),
        },
    }
}

/// The records of a finished command: its captured output, then its result.
pub fn completed(call_id: u64, result: ToolResult, stdout: String, stderr: String) -> Vec<Event> {
    vec![
        Event::ToolOutput {
            call_id,
            stdout,
            stderr,
        },
        Event::ToolCallCompleted { call_id, result },
    ]
}

/// Why a file operation on the task's worker has no answer (what the call's record says).
#[derive(Debug, thiserror::Error)]
pub enum NoAnswer {
    #[error("the task was cancelled while the call ran")]
    Cancelled,
    #[error("worker {worker} did not come back within {wait:?}")]
    Away { worker: String, wait: Duration },
    #[error("worker {worker} was lost; the task moves to {to}")]
    Moving { worker: String, to: String },
    /// The worker is there, and the call failed every time it was tried.
    #[error("{source} ({tries} tries)")]
    Failing {
        #[source]
        source: CallError,
        tries: u32,
    },
    /// A call that is no file operation, given to the file tools (a bug of the brain's).
    #[error("a command is not a file tool")]
    NotFileTool,
}

/// One file operation on the task's worker, waiting for the worker (or failover) if it is
/// away. Err: why it has no answer (the task was cancelled, or the worker did not come back).
pub async fn file_call(cx: &Cx<'_>, worker: &str, op: FileOp) -> Result<FileAnswer, NoAnswer> {
    let workspace = cx.task.state().workspace;
    let workers = &cx.ports().workers;
    let wait = cx.opts().worker_wait;
    let mut failures = 0;
    loop {
        if cx.task.cancel.is_cancelled() {
            return Err(NoAnswer::Cancelled);
        }
        tokio::select! {
            back = workers.wait_connected(worker, wait) => if !back {
                return Err(NoAnswer::Away { worker: worker.to_string(), wait });
            },
            to = failover_target(cx, worker) => {
                cx.task.set_move_request(&to);
                return Err(NoAnswer::Moving { worker: worker.to_string(), to });
            }
        }
        match workers
            .file(worker, &workspace, op.clone(), FILE_TIMEOUT)
            .await
        {
            Ok(a) => return Ok(a),
            // Away: wait for it (or failover) again.
            Err(CallError::NotConnected(_) | CallError::Lost(_)) => {}
            // There and failing: a few more tries, then the error is the answer.
            Err(e) => {
                failures += 1;
                if failures >= FILE_TRIES {
                    return Err(NoAnswer::Failing {
                        source: e,
                        tries: failures,
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
