//! Runs a scripted plan: for each step, log the call as issued (durable), send it, log the
//! result, go on. After a crash the same loop picks up from the log: a pending call is asked
//! for again (the worker's journal answers with the recorded result, or says it was
//! interrupted), an interrupted `run` step is settled by its `check`, and nothing is run twice.

use std::sync::Arc;
use std::time::Duration;

use super::event::{Event, Outcome, Purpose, ToolCall, ToolResult};
use super::manager::{Manager, Task};
use super::state::{PendingCall, Status};
use crate::hub::Durable;

/// Output kept per result in the log (the worker captures up to 64 KiB per stream).
const LOGGED_OUTPUT: usize = 16 * 1024;
const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(600);
const FILE_TIMEOUT: Duration = Duration::from_secs(60);
/// Checks that fail to answer (rather than answer "no") before the task gives up.
const MAX_CHECK_ERRORS: u32 = 3;

/// Drives a task until it ends. Errors appending to the log stop the runner (the task is
/// resumed from the log on the next start).
pub async fn run(m: Manager, task: Arc<Task>) {
    let mut delay = Duration::from_secs(1);
    loop {
        let r = if task.state().agent.is_some() {
            crate::agent::run::drive(&m, &task).await
        } else {
            drive(&m, &task).await
        };
        match r {
            Ok(()) => return,
            Err(e) => {
                // The log could not be written (disk full, I/O error). Nothing was acted on
                // that the log does not show; try again from the log's state.
                tracing::error!(task = %task.id, error = %e, retry_in = ?delay, "task runner cannot write its log; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(60));
            }
        }
    }
}

pub(crate) async fn finish(
    m: &Manager,
    task: &Task,
    outcome: Outcome,
    reason: String,
) -> Result<(), super::manager::Error> {
    tracing::info!(task = %task.id, ?outcome, %reason, "task ended");
    m.append(task, vec![Event::Finished { outcome, reason }])
        .await
}

pub(crate) async fn set_status(
    m: &Manager,
    task: &Task,
    status: Status,
    reason: &str,
) -> Result<(), super::manager::Error> {
    let st = task.state();
    if st.status != status || st.reason != reason {
        m.append(
            task,
            vec![Event::StatusChanged {
                status: status.as_str().into(),
                reason: reason.into(),
            }],
        )
        .await?;
    }
    Ok(())
}

async fn drive(m: &Manager, task: &Arc<Task>) -> Result<(), super::manager::Error> {
    loop {
        let st = task.state();
        if st.status.is_terminal() {
            return Ok(());
        }
        if task.cancel.is_cancelled() && st.pending.is_none() {
            return finish(m, task, Outcome::Cancelled, "cancelled by an admin".into()).await;
        }
        let Some(plan) = st.plan.clone() else {
            return finish(m, task, Outcome::Failed, "the task has no plan".into()).await;
        };
        let Some(worker) = st.worker.clone() else {
            return finish(m, task, Outcome::Failed, "the task has no worker".into()).await;
        };
        if let Some(p) = st.pending.clone() {
            settle(m, task, &st.workspace, p.clone()).await?;
            if task.state().pending.is_none() && m.hub.session(&p.worker).is_some() {
                barrier(m, task, &p.worker, false).await?;
            }
            continue;
        }
        if let Some(to) = move_wanted(task) {
            move_task(m, task, &to).await?;
            continue;
        }
        if !seed(m, task, &worker).await? {
            continue;
        }
        if let Some(reason) = st.step_failed.clone() {
            return finish(m, task, Outcome::Failed, reason).await;
        }
        if st.check_errors >= MAX_CHECK_ERRORS {
            return finish(
                m,
                task,
                Outcome::Failed,
                format!(
                    "the check of step {} failed to give an answer {} times in a row; the step's effect is unknown",
                    st.unsure_step.unwrap_or(st.next_step),
                    st.check_errors
                ),
            )
            .await;
        }
        let (step, purpose, call) = if let Some(step) = st.unsure_step {
            let s = &plan.steps[step as usize];
            match &s.check {
                Some(check) => (step, Purpose::Check, run_call(check, s.timeout.as_deref())),
                None => {
                    return finish(
                        m,
                        task,
                        Outcome::Failed,
                        format!("step {step} was interrupted and has no check: its effect is unknown, so the task stops rather than risk running it twice"),
                    )
                    .await;
                }
            }
        } else if (st.next_step as usize) < plan.steps.len() {
            let s = &plan.steps[st.next_step as usize];
            let call = match (&s.run, &s.write) {
                (Some(argv), _) => run_call(argv, s.timeout.as_deref()),
                (None, Some(w)) => ToolCall::WriteFile {
                    path: w.path.clone(),
                    content: w.content.clone(),
                    mode: w.mode.unwrap_or(0o644),
                },
                (None, None) => {
                    return finish(
                        m,
                        task,
                        Outcome::Failed,
                        format!("step {} is empty", st.next_step),
                    )
                    .await;
                }
            };
            (st.next_step, Purpose::Step, call)
        } else {
            return finish(
                m,
                task,
                Outcome::Finished,
                format!("all {} steps done", plan.steps.len()),
            )
            .await;
        };
        // Wait for the worker before issuing, so a call is issued only when it can be sent.
        if !worker_ready(m, task, &worker).await? {
            continue;
        }
        // Log before act: the call is durable before it is sent.
        let call_id = m.hub.new_call_id();
        m.append(
            task,
            vec![Event::ToolCallIssued {
                call_id,
                step,
                purpose,
                worker: worker.clone(),
                call,
            }],
        )
        .await?;
    }
}

/// Whether the worker is connected (and the task marked running). If not, marks the task
/// waiting and waits a while for it (or a cancel); the caller looks again.
pub(crate) async fn worker_ready(
    m: &Manager,
    task: &Task,
    worker: &str,
) -> Result<bool, super::manager::Error> {
    if m.hub.session(worker).is_none() {
        set_status(
            m,
            task,
            Status::Waiting,
            &format!("waiting for worker {worker}"),
        )
        .await?;
        tokio::select! {
            _ = m.hub.wait_connected(worker, Duration::from_secs(3600)) => {}
            to = failover_target(m, task, worker) => {
                tracing::warn!(task = %task.id, lost = %worker, %to, "worker lost; failing over");
                task.set_move_request(&to);
            }
            _ = task.cancel.cancelled() => {}
        }
        return Ok(false);
    }
    set_status(m, task, Status::Running, "").await?;
    Ok(true)
}

/// How long a barrier or a materialisation may take.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(300);
const MATERIALISE_TIMEOUT: Duration = Duration::from_secs(1800);
/// How long a move waits for its target to be connected.
const MOVE_TARGET_WAIT: Duration = Duration::from_secs(60);

/// Makes the brain's mirror equal to the worker's disk and logs the barrier (when anything
/// changed). The worker lists only what its watcher saw change unless `full` (a move's final
/// barrier walks the whole tree). A barrier that fails is logged as a warning and left to the
/// next one; returns whether the mirror now matches the worker.
pub(crate) async fn barrier(
    m: &Manager,
    task: &Task,
    worker: &str,
    full: bool,
) -> Result<bool, super::manager::Error> {
    let st = task.state();
    let op = proto::sync_request::Op::BarrierBase(st.barrier_root.clone());
    match m
        .hub
        .sync(
            worker,
            &st.workspace,
            op,
            &st.sync_rules,
            full,
            BARRIER_TIMEOUT,
        )
        .await
    {
        Ok(r) if r.error.is_empty() => {
            tracing::debug!(task = %task.id, root = %r.root_hash, files = r.files, wire_bytes = r.wire_bytes, hashed = r.hashed, "barrier");
            if !r.left_out.is_empty() || r.left_out_more > 0 {
                let (entries, more) =
                    shared::manifest::LeftOut::from_wire(&r.left_out, r.left_out_more);
                tracing::warn!(task = %task.id, %worker, named = entries.len(), more, "entries left out of the workspace's mirror");
                let worker = worker.to_string();
                m.append(
                    task,
                    vec![Event::LeftOut {
                        worker,
                        entries,
                        more,
                    }],
                )
                .await?;
            }
            if r.root_hash != st.barrier_root {
                m.append(
                    task,
                    vec![Event::Barrier {
                        version: st.barrier_version + 1,
                        root_hash: r.root_hash,
                        files: r.files,
                        bytes: r.bytes,
                        wire_bytes: r.wire_bytes,
                    }],
                )
                .await?;
            }
            Ok(true)
        }
        Ok(r) => {
            tracing::warn!(task = %task.id, %worker, error = %r.error, "barrier failed; the next one will catch up");
            Ok(false)
        }
        Err(e) => {
            tracing::warn!(task = %task.id, %worker, error = %e, "barrier failed; the next one will catch up");
            Ok(false)
        }
    }
}

/// Moves a task (at a tool-call boundary) to `to`: a final barrier from the source if it is
/// there (else the last barrier is what moves: failover), the target materialises that
/// manifest fetching only the blobs it lacks and verifies the root hash, and the
/// assignment is switched in the log. Logged as started first, so a crash resumes it; a move
/// that cannot complete is logged as aborted and the task stays where it was.
pub(crate) async fn move_task(
    m: &Manager,
    task: &Task,
    to: &str,
) -> Result<(), super::manager::Error> {
    let st = task.state();
    let from = st.worker.clone().unwrap_or_default();
    if st.moving_to.as_deref() != Some(to) {
        tracing::info!(task = %task.id, %from, %to, "move started");
        m.append(
            task,
            vec![Event::MoveStarted {
                from: from.clone(),
                to: to.to_string(),
            }],
        )
        .await?;
    }
    let abort = |reason: String| async move {
        tracing::warn!(task = %task.id, %to, %reason, "move aborted");
        m.append(
            task,
            vec![Event::MoveAborted {
                to: to.to_string(),
                reason,
            }],
        )
        .await
    };
    if m.hub.session(&from).is_some() && !barrier(m, task, &from, true).await? {
        return abort(format!("the final barrier from {from} failed")).await;
    }
    if m.hub.wait_connected(to, MOVE_TARGET_WAIT).await.is_none() {
        return abort(format!("worker {to} is not connected")).await;
    }
    let st = task.state();
    let (mut files, mut wire_bytes) = (0, 0);
    if !st.barrier_root.is_empty() {
        let op = proto::sync_request::Op::MaterialiseRoot(st.barrier_root.clone());
        match m
            .hub
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
                tracing::info!(task = %task.id, %to, files = r.files, bytes = r.bytes, blobs = r.blobs_sent, wire_bytes = r.wire_bytes, "workspace materialised on the target");
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
    m.append(
        task,
        vec![Event::MoveCompleted {
            to: to.to_string(),
            files,
            wire_bytes,
        }],
    )
    .await?;
    tracing::info!(task = %task.id, %from, %to, "move completed");
    Ok(())
}

/// Puts the task's starting workspace on its worker before its first call (once: the
/// barrier it logs marks it done).
pub(crate) async fn seed(
    m: &Manager,
    task: &Task,
    worker: &str,
) -> Result<bool, super::manager::Error> {
    let st = task.state();
    if st.seed_root.is_empty() || st.barrier_version > 0 {
        return Ok(true);
    }
    if !worker_ready(m, task, worker).await? {
        return Ok(false);
    }
    let op = proto::sync_request::Op::MaterialiseRoot(st.seed_root.clone());
    match m
        .hub
        .sync(
            worker,
            &st.workspace,
            op,
            &st.sync_rules,
            false,
            MATERIALISE_TIMEOUT,
        )
        .await
    {
        Ok(r) if r.error.is_empty() && r.root_hash == st.seed_root => {
            m.append(
                task,
                vec![Event::Barrier {
                    version: 1,
                    root_hash: r.root_hash,
                    files: r.files,
                    bytes: r.bytes,
                    wire_bytes: r.wire_bytes,
                }],
            )
            .await?;
            Ok(true)
        }
        Ok(r) => {
            tracing::warn!(task = %task.id, %worker, error = %r.error, "the starting workspace could not be put on the worker; trying again");
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok(false)
        }
        Err(e) => {
            tracing::warn!(task = %task.id, %worker, error = %e, "the starting workspace could not be put on the worker; trying again");
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok(false)
        }
    }
}

/// A move asked for (by a person) or in progress (from the log), if any.
pub(crate) fn move_wanted(task: &Task) -> Option<String> {
    task.state().moving_to.or_else(|| task.take_move_request())
}

/// Resolves with a worker to move to once `worker` has been gone for the failover delay and
/// another eligible worker is connected; pends otherwise.
pub(crate) async fn failover_target(m: &Manager, task: &Task, worker: &str) -> String {
    let mut gone_since: Option<tokio::time::Instant> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if m.hub.session(worker).is_some() {
            gone_since = None;
            continue;
        }
        let since = *gone_since.get_or_insert_with(tokio::time::Instant::now);
        if since.elapsed() >= m.opts.failover_after
            && let Some(to) = m.place(worker, &task.state().require_labels)
        {
            return to;
        }
    }
}

/// Logs that nobody can say what a call did.
pub(crate) async fn interrupt(
    m: &Manager,
    task: &Task,
    call_id: u64,
    reason: impl Into<String>,
) -> Result<(), super::manager::Error> {
    m.append(
        task,
        vec![Event::ToolCallInterrupted {
            call_id,
            reason: reason.into(),
        }],
    )
    .await
}

fn run_call(argv: &[String], timeout: Option<&str>) -> ToolCall {
    let timeout = timeout
        .and_then(|t| shared::parse_duration(t).ok())
        .unwrap_or(DEFAULT_STEP_TIMEOUT);
    ToolCall::RunCommand {
        argv: argv.to_vec(),
        timeout_ms: timeout.as_millis() as u64,
        cwd: String::new(),
    }
}

fn text(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(LOGGED_OUTPUT)];
    String::from_utf8_lossy(cut).into_owned()
}

/// What became of a command.
pub(crate) enum CommandOutcome {
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

/// Runs (or, after a restart, asks the worker's journal about) a pending command, showing
/// its output to watchers as it comes.
pub(crate) async fn run_command(
    m: &Manager,
    task: &Task,
    workspace: &str,
    p: &PendingCall,
    argv: &[String],
    timeout_ms: u64,
    cwd: &str,
) -> CommandOutcome {
    let start = proto::ExecStart {
        call_id: p.call_id,
        workspace: workspace.to_string(),
        argv: argv.to_vec(),
        cwd: cwd.to_string(),
        timeout_ms,
        output_cap_bytes: 1 << 20,
        durable: true,
        limits: Some(m.opts.limits),
    };
    let live = task.live.clone();
    m.hub.watch(
        p.call_id,
        Arc::new(move |o: proto::ExecOutput| {
            let _ = live.send(super::manager::LiveOutput {
                kind: "live_output",
                call_id: o.call_id,
                stream: if o.stream == proto::OutputStream::Stderr as i32 {
                    "stderr"
                } else {
                    "stdout"
                },
                text: String::from_utf8_lossy(&o.data).into_owned(),
            });
        }),
    );
    let outcome = tokio::select! {
        o = m.hub.durable_exec(&p.worker, start, m.opts.worker_wait) => Some(o),
        to = failover_target(m, task, &p.worker) => {
            m.hub.unwatch(p.call_id);
            tracing::warn!(task = %task.id, lost = %p.worker, %to, call_id = p.call_id, "worker lost during a call; failing over");
            task.set_move_request(&to);
            return CommandOutcome::Interrupted(format!(
                "worker {} was lost while the command ran; the task moves to {to}",
                p.worker
            ));
        }
        _ = task.cancel.cancelled() => None,
    };
    m.hub.unwatch(p.call_id);
    match outcome {
        None => {
            if let Some(s) = m.hub.session(&p.worker) {
                s.try_send(proto::brain_message::Msg::Cancel(proto::Cancel {
                    call_id: p.call_id,
                }));
            }
            CommandOutcome::Cancelled
        }
        Some(Durable::WorkerGone) => CommandOutcome::WorkerGone,
        Some(Durable::Done(r)) if !r.interrupted.is_empty() => {
            CommandOutcome::Interrupted(r.interrupted.clone())
        }
        Some(Durable::Done(r)) => {
            let x = r.exit.clone().unwrap_or_default();
            CommandOutcome::Done {
                result: ToolResult {
                    exit_code: x.code,
                    signal: x.signal,
                    timed_out: x.timed_out,
                    error: x.error.clone(),
                    limit: x.limit.clone(),
                },
                stdout: text(&r.stdout),
                stderr: text(&r.stderr),
            }
        }
    }
}

/// The records of a finished command: its captured output, then its result.
pub(crate) fn completed(
    call_id: u64,
    result: ToolResult,
    stdout: String,
    stderr: String,
) -> Vec<Event> {
    vec![
        Event::ToolOutput {
            call_id,
            stdout,
            stderr,
        },
        Event::ToolCallCompleted { call_id, result },
    ]
}

/// Why a file call has no answer: the task was cancelled or the worker did not come back.
pub(crate) async fn file_call(
    m: &Manager,
    task: &Task,
    worker: &str,
    workspace: &str,
    op: proto::file_call::Op,
) -> Result<proto::file_response::Result, String> {
    let call = proto::FileCall {
        call_id: 0,
        workspace: workspace.to_string(),
        op: Some(op),
    };
    loop {
        if task.cancel.is_cancelled() {
            return Err("the task was cancelled while the call ran".into());
        }
        tokio::select! {
            w = m.hub.wait_connected(worker, m.opts.worker_wait) => if w.is_none() {
                return Err(format!(
                    "worker {worker} did not come back within {:?}",
                    m.opts.worker_wait
                ));
            },
            to = failover_target(m, task, worker) => {
                task.set_move_request(&to);
                return Err(format!("worker {worker} was lost; the task moves to {to}"));
            }
        }
        match m.hub.file(worker, call.clone(), FILE_TIMEOUT).await {
            Ok(resp) => {
                return resp
                    .result
                    .ok_or_else(|| "the worker sent an empty answer".to_string());
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Waits visibly for a worker that must report a call (it may still be running there).
pub(crate) async fn wait_for_report(
    m: &Manager,
    task: &Task,
    p: &PendingCall,
) -> Result<(), super::manager::Error> {
    set_status(
        m,
        task,
        Status::Waiting,
        &format!(
            "waiting for worker {} to report call {}",
            p.worker, p.call_id
        ),
    )
    .await
}

/// Gets the outcome of a pending call and logs it.
async fn settle(
    m: &Manager,
    task: &Task,
    workspace: &str,
    p: PendingCall,
) -> Result<(), super::manager::Error> {
    match &p.call {
        ToolCall::RunCommand {
            argv,
            timeout_ms,
            cwd,
        } => match run_command(m, task, workspace, &p, argv, *timeout_ms, cwd).await {
            CommandOutcome::Cancelled => {
                interrupt(
                    m,
                    task,
                    p.call_id,
                    "the task was cancelled while the call ran",
                )
                .await?;
            }
            CommandOutcome::WorkerGone => wait_for_report(m, task, &p).await?,
            CommandOutcome::Interrupted(reason) => {
                interrupt(m, task, p.call_id, reason).await?;
                m.hub.ack(&p.worker, p.call_id);
            }
            CommandOutcome::Done {
                result,
                stdout,
                stderr,
            } => {
                m.append(task, completed(p.call_id, result, stdout, stderr))
                    .await?;
                m.hub.ack(&p.worker, p.call_id);
            }
        },
        ToolCall::WriteFile {
            path,
            content,
            mode,
        } => {
            // An atomic write of fixed content is idempotent: asking again after a crash
            // cannot do it twice in any way that matters.
            let op = proto::file_call::Op::Write(proto::WriteFile {
                path: path.clone(),
                data: content.clone().into_bytes(),
                mode: *mode,
                create_dirs: true,
            });
            let result = match file_call(m, task, &p.worker, workspace, op).await {
                Err(reason) => return interrupt(m, task, p.call_id, reason).await,
                Ok(proto::file_response::Result::Done(_)) => ToolResult {
                    exit_code: Some(0),
                    ..Default::default()
                },
                Ok(proto::file_response::Result::Error(e)) => ToolResult {
                    error: e.message,
                    ..Default::default()
                },
                Ok(_) => ToolResult {
                    error: "unexpected answer to a write".into(),
                    ..Default::default()
                },
            };
            m.append(
                task,
                vec![Event::ToolCallCompleted {
                    call_id: p.call_id,
                    result,
                }],
            )
            .await?;
        }
        other => {
            interrupt(
                m,
                task,
                p.call_id,
                format!("a scripted plan has no {other:?} step"),
            )
            .await?;
        }
    }
    Ok(())
}
