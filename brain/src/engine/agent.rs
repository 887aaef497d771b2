//! The agent loop. Each turn reads the task's state (a pure function of its log), does the
//! one next thing, and logs it before acting on it:
//!
//! 1. a call in flight is settled (its result, or "interrupted", becomes an observation);
//! 2. the next tool call of the model's last answer is checked (unknown tool, bad arguments,
//!    permission, approval) and issued;
//! 3. with nothing left to do, the budgets are checked and the model is asked again.
//!
//! After a crash the same loop picks up from the log: an answered LLM request is never sent
//! again, a command in flight is settled by the worker's journal, an edit that may have
//! happened is reported as interrupted, and a call waiting for approval waits on.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::manager::{Error, Manager, Task};
use crate::engine::runner::{
    CommandOutcome, barrier, completed, file_call, finish, move_task, move_wanted, run_command,
    seed, set_status, wait_for_report, worker_ready,
};
use crate::llm::{self, Provider, ToolUse};
use crate::model::agent::{AgentState, Permission};
use crate::model::event::{Event, Outcome, Purpose, ToolCall, ToolResult};
use crate::model::state::{PendingCall, Status};
use crate::model::tools::{self, Prepared};

/// How long to wait before asking an unreachable model again (after the provider's own
/// retries gave up).
const LLM_RETRY: Duration = Duration::from_secs(30);
/// Most tokens the model may write in one answer.
const MAX_ANSWER_TOKENS: u32 = 4096;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The system prompt. Built anew for every request (it is not logged): it depends only on
/// the task's fixed spec.
pub fn system_prompt(a: &AgentState) -> String {
    let perm = match a.spec.permission {
        Permission::ReadOnly => "You may only read: inspect and report, change nothing.",
        Permission::Ask => {
            "Every command and file change waits for a person's approval; a denial comes back as an error with the reason."
        }
        Permission::Auto => {
            "Some commands and paths are pre-approved; others wait for a person's approval."
        }
        Permission::Full => "Your commands and file changes run without asking.",
    };
    format!(
        "You are a careful coding agent working in a project workspace on a remote machine, through tools.\n\
         The first user message is your goal. Work in small steps: look at the files, make a change, run the tests or the program, read the output, fix what fails.\n\
         Paths are relative to the workspace root; commands start there. Command output, exit codes and errors come back to you; long outputs are cut in the middle.\n\
         {perm}\n\
         When the goal is met, or cannot be met, call `finish` with a short summary."
    )
}

/// Masks secrets (LLM keys) in text bound for the log or the model.
pub struct Redactor(Vec<String>);

impl Redactor {
    pub fn new(cfg: &llm::LlmConfig) -> Self {
        let mut secrets: Vec<String> = ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"]
            .iter()
            .filter_map(|v| std::env::var(v).ok())
            .chain(
                cfg.providers
                    .values()
                    .filter_map(|p| p.api_key.as_ref().map(|k| k.expose().to_string())),
            )
            .chain(
                cfg.providers
                    .values()
                    .filter_map(|p| p.api_key_env.as_ref())
                    .filter_map(|v| std::env::var(v).ok()),
            )
            .filter(|s| s.len() >= 8)
            .collect();
        secrets.sort();
        secrets.dedup();
        Self(secrets)
    }

    pub fn apply(&self, text: &str) -> String {
        let mut t = text.to_string();
        for s in &self.0 {
            if t.contains(s.as_str()) {
                t = t.replace(s.as_str(), "[redacted]");
            }
        }
        t
    }
}

/// The provider a task's model names: a replay of its recorded transcript, or a real API.
pub fn provider(a: &AgentState, cfg: &llm::LlmConfig) -> Result<Arc<dyn Provider>, llm::Error> {
    let spec: llm::ModelSpec = a.spec.model.parse()?;
    if spec.provider == llm::ProviderKind::Replay {
        return Ok(Arc::new(llm::Replay::parse(&a.spec.transcript)?));
    }
    llm::connect(&spec, cfg)
}

/// Rough size of a request in tokens (4 characters a token).
fn estimate_tokens(system: &str, a: &AgentState, tools: &[llm::ToolSpec]) -> u64 {
    let mut chars = system.len() + serde_json::to_string(tools).map_or(0, |s| s.len());
    for m in &a.conversation {
        chars += m.content.len() + 16;
        chars += m
            .tool_calls
            .iter()
            .map(|c| c.name.len() + c.arguments.len() + 16)
            .sum::<usize>();
    }
    chars as u64 / 4
}

/// Messages whose old tool outputs to elide so the request fits in the context window, or
/// `None` when it fits (or nothing more can go). The last few messages always stay.
fn elision(a: &AgentState, window: u64, estimate: u64, force: bool) -> Option<(u32, u64)> {
    if !force && estimate * 4 < window * 3 {
        return None;
    }
    const KEEP: usize = 6;
    let len = a.conversation.len();
    let upto = len.saturating_sub(KEEP);
    if upto <= a.elided_upto as usize {
        return None;
    }
    let saved: u64 = a.conversation[..upto]
        .iter()
        .filter(|m| {
            m.role == llm::Role::Tool && m.content.len() > crate::model::agent::ELIDED.len()
        })
        .map(|m| (m.content.len() - crate::model::agent::ELIDED.len()) as u64)
        .sum();
    (saved > 0).then_some((upto as u32, saved))
}

/// Drives an agent task until it ends, stops for budget, or its log cannot be written.
pub async fn drive(m: &Manager, task: &Arc<Task>) -> Result<(), Error> {
    let mut model: Option<Arc<dyn Provider>> = None;
    // Calls issued by this run of the loop; a pending call not among them was in flight
    // when the brain went down.
    let mut issued_here: HashSet<u64> = HashSet::new();
    let redact = Redactor::new(&m.opts.llm);
    loop {
        let st = task.state();
        if st.status.is_terminal() || st.status == Status::BudgetExhausted {
            return Ok(());
        }
        let Some(a) = st.agent.clone() else {
            return finish(m, task, Outcome::Failed, "not an agent task".into()).await;
        };
        if task.cancel.is_cancelled() && st.pending.is_none() {
            return finish(m, task, Outcome::Cancelled, "cancelled by an admin".into()).await;
        }
        let Some(worker) = st.worker.clone() else {
            return finish(m, task, Outcome::Failed, "the task has no worker".into()).await;
        };

        // 1. A call in flight.
        if let Some(p) = st.pending.clone() {
            let fresh = issued_here.contains(&p.call_id);
            let (worker, changes) = (p.worker.clone(), !p.call.is_read_only());
            settle(m, task, &st.workspace, &a, p, fresh, &redact).await?;
            // The mirror follows the disk after every call that can change it.
            if changes && task.state().pending.is_none() && m.hub.session(&worker).is_some() {
                barrier(m, task, &worker, false).await?;
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
        if a.stuck() {
            let call = a
                .repeat
                .as_ref()
                .map(|(s, _)| s.replace('\u{0}', " "))
                .unwrap_or_default();
            return finish(
                m,
                task,
                Outcome::Stuck,
                format!(
                    "the same call failed {} times in a row: {}",
                    a.repeat.as_ref().map_or(0, |r| r.1),
                    tools::head_tail(&call, 200)
                ),
            )
            .await;
        }

        // 2. The next tool call of the model's last answer.
        if let Some(u) = a.queue.front().cloned() {
            match tools::prepare(&u, &a.spec) {
                Prepared::Refused(e) => observe(m, task, &a, &u, e, true).await?,
                Prepared::Environment { req, what } => {
                    let Some(envs) = m.environments() else {
                        let text = "error: this brain provides no other machines".to_string();
                        observe(m, task, &a, &u, text, true).await?;
                        continue;
                    };
                    let tid = task.id.to_string();
                    let quote = envs.quote(&tid, &worker, &req);
                    if quote.needs_approval || a.spec.permission == Permission::Ask {
                        let what = if quote.reuse {
                            what.clone()
                        } else {
                            format!("{what}; a new machine at ${:.2}/h", quote.usd_per_hour)
                        };
                        if !approved(m, task, &a, &u, &what).await? {
                            continue;
                        }
                    }
                    let budget_left = (a.limits.usd > 0.0)
                        .then(|| a.limits.usd - a.spent.usd - envs.task_cost(&tid));
                    tracing::info!(task = %task.id, %what, "environment requested");
                    let (text, failed) = match envs.obtain(&tid, &worker, &req, budget_left).await {
                        Err(why) => (format!("error: no environment: {why}"), true),
                        Ok(g) if g.worker == worker => (
                            format!(
                                "this task already runs on a machine that fits: {}",
                                g.describe
                            ),
                            false,
                        ),
                        Ok(g) => {
                            move_task(m, task, &g.worker).await?;
                            if task.state().worker.as_deref() == Some(g.worker.as_str()) {
                                let released = envs
                                    .release_if_ours(&worker, &tid)
                                    .await
                                    .map(|r| format!(" {r}"))
                                    .unwrap_or_default();
                                (
                                    format!(
                                        "now running on {}. The workspace moved along; processes started on the previous machine are gone.{released}",
                                        g.describe
                                    ),
                                    false,
                                )
                            } else {
                                if g.machine.is_some() {
                                    envs.release_if_ours(&g.worker, &tid).await;
                                }
                                (
                                    format!(
                                        "error: the move to {} did not complete; the task stays where it was",
                                        g.describe
                                    ),
                                    true,
                                )
                            }
                        }
                    };
                    observe(m, task, &a, &u, text, failed).await?;
                    continue;
                }
                Prepared::Finish(summary) => {
                    let summary = if summary.trim().is_empty() {
                        "finished (no summary given)".to_string()
                    } else {
                        summary
                    };
                    m.append(
                        task,
                        vec![
                            Event::Observation {
                                tool_use_id: u.id.clone(),
                                text: "the task is finished".into(),
                                failed: false,
                            },
                            Event::Finished {
                                outcome: Outcome::Finished,
                                reason: summary,
                            },
                        ],
                    )
                    .await?;
                    return Ok(());
                }
                Prepared::Call {
                    call,
                    mutating,
                    what,
                } => {
                    if mutating
                        && tools::needs_approval(&call, &a.spec)
                        && !approved(m, task, &a, &u, &what).await?
                    {
                        continue;
                    }
                    if !worker_ready(m, task, &worker).await? {
                        continue;
                    }
                    let call_id = m.hub.new_call_id();
                    issued_here.insert(call_id);
                    // Log before act.
                    m.append(
                        task,
                        vec![Event::ToolCallIssued {
                            call_id,
                            step: a.spent.steps,
                            purpose: Purpose::Step,
                            worker: worker.clone(),
                            call,
                        }],
                    )
                    .await?;
                }
            }
            continue;
        }

        // 3. Think.
        if a.idle_replies >= 2 {
            let last = a
                .conversation
                .iter()
                .rev()
                .find(|m| m.role == llm::Role::Assistant)
                .map(|m| m.content.clone())
                .unwrap_or_default();
            return finish(
                m,
                task,
                Outcome::Finished,
                format!(
                    "the model stopped calling tools: {}",
                    tools::head_tail(&last, 500)
                ),
            )
            .await;
        }
        let machines_usd = m
            .environments()
            .map(|e| e.task_cost(&task.id.to_string()))
            .unwrap_or(0.0);
        if let Some(why) = a.exhausted_with(now_ms(), machines_usd) {
            tracing::info!(task = %task.id, %why, "budget exhausted");
            m.append(
                task,
                vec![Event::StatusChanged {
                    status: Status::BudgetExhausted.as_str().into(),
                    reason: format!(
                        "{why}; continue with `brain task resume {} --budget-usd X` (or --max-steps, --max-tokens, --max-wall)",
                        task.id
                    ),
                }],
            )
            .await?;
            return Ok(());
        }
        let provider = match &model {
            Some(p) => p.clone(),
            None => match provider(&a, &m.opts.llm) {
                Ok(p) => {
                    model = Some(p.clone());
                    p
                }
                Err(e) => {
                    return finish(
                        m,
                        task,
                        Outcome::Failed,
                        format!("model {}: {e}", a.spec.model),
                    )
                    .await;
                }
            },
        };
        let info = llm::model_info(&a.spec.model, &m.opts.llm);
        let system = system_prompt(&a);
        let tool_specs = tools::specs(a.spec.permission);
        let estimate = estimate_tokens(&system, &a, &tool_specs);
        if let Some((upto, bytes_saved)) = elision(&a, info.context_window, estimate, false) {
            tracing::info!(task = %task.id, upto, bytes_saved, estimate, "eliding old tool outputs");
            m.append(task, vec![Event::ContextElided { upto, bytes_saved }])
                .await?;
            continue;
        }
        let mut pre = vec![];
        if st.status != Status::Running || !st.reason.is_empty() {
            pre.push(Event::StatusChanged {
                status: Status::Running.as_str().into(),
                reason: String::new(),
            });
        }
        if !a.awaiting_llm {
            pre.push(Event::LlmRequest {
                model: a.spec.model.clone(),
                messages: a.conversation.len() as u32,
            });
        }
        if !pre.is_empty() {
            m.append(task, pre).await?;
        }
        let req = llm::Request {
            system,
            messages: a.conversation.clone(),
            tools: tool_specs,
            max_tokens: MAX_ANSWER_TOKENS,
        };
        let answer = tokio::select! {
            r = provider.complete(&req) => r,
            _ = task.cancel.cancelled() => continue,
        };
        match answer {
            Ok(mut r) => {
                r.message.content = redact.apply(&r.message.content);
                let cost_usd = info.price.map_or(0.0, |p| p.cost(&r.usage));
                tracing::info!(
                    task = %task.id,
                    prompt_tokens = r.usage.prompt_tokens,
                    completion_tokens = r.usage.completion_tokens,
                    cost_usd,
                    tool_calls = r.message.tool_calls.len(),
                    "model answered"
                );
                m.append(
                    task,
                    vec![Event::LlmResponse {
                        model: a.spec.model.clone(),
                        prompt_tokens: r.usage.prompt_tokens,
                        completion_tokens: r.usage.completion_tokens,
                        cost_usd,
                        response: Some(Box::new(r)),
                    }],
                )
                .await?;
            }
            Err(llm::Error::ContextOverflow(msg)) => {
                match elision(&a, info.context_window, estimate, true) {
                    Some((upto, bytes_saved)) => {
                        m.append(task, vec![Event::ContextElided { upto, bytes_saved }])
                            .await?;
                    }
                    None => {
                        return finish(
                            m,
                            task,
                            Outcome::Failed,
                            format!("the conversation no longer fits the model's context window, even with old outputs elided: {msg}"),
                        )
                        .await;
                    }
                }
            }
            Err(e) if e.retryable() => {
                tracing::warn!(task = %task.id, error = %e, "model unreachable; trying again");
                set_status(
                    m,
                    task,
                    Status::Waiting,
                    &format!(
                        "the model is unreachable ({e}); trying again every {}s",
                        LLM_RETRY.as_secs()
                    ),
                )
                .await?;
                tokio::select! {
                    _ = tokio::time::sleep(LLM_RETRY) => {}
                    _ = task.cancel.cancelled() => {}
                }
            }
            Err(e) => {
                return finish(
                    m,
                    task,
                    Outcome::Failed,
                    format!("model {}: {e}", a.spec.model),
                )
                .await;
            }
        }
    }
}

/// Where an approval stands for the call at the head of the queue.
enum Gate {
    /// Approved: go on.
    Go,
    /// Asked for, or still waiting: look again.
    Again,
    /// Denied: this is the observation.
    Denied(String),
}

/// Whether `u` may go ahead now: asks a person once, waits for the decision, and on a
/// denial tells the model. `false`: look at the task again.
async fn approved(
    m: &Manager,
    task: &Task,
    a: &AgentState,
    u: &ToolUse,
    what: &str,
) -> Result<bool, Error> {
    match approval_gate(m, task, a, u, what).await? {
        Gate::Go => Ok(true),
        Gate::Again => Ok(false),
        Gate::Denied(text) => {
            observe(m, task, a, u, text, true).await?;
            Ok(false)
        }
    }
}

/// Asks a person about `u` (once; the request is in the log) and reports the decision.
async fn approval_gate(
    m: &Manager,
    task: &Task,
    a: &AgentState,
    u: &ToolUse,
    what: &str,
) -> Result<Gate, Error> {
    match a.approval.as_ref().filter(|ap| ap.tool_use_id == u.id) {
        None => {
            let id = a.approvals_asked + 1;
            tracing::info!(task = %task.id, approval = id, %what, "approval requested");
            m.append(
                task,
                vec![
                    Event::ApprovalRequested {
                        approval_id: id,
                        what: what.to_string(),
                        tool_use_id: u.id.clone(),
                    },
                    Event::StatusChanged {
                        status: Status::Waiting.as_str().into(),
                        reason: format!(
                            "waiting for approval #{id}: {what} (brain approve {t} / brain deny {t} --reason TEXT)",
                            t = task.id
                        ),
                    },
                ],
            )
            .await?;
            Ok(Gate::Again)
        }
        Some(ap) => match &ap.decision {
            None => {
                // Survives restarts: the request is in the log.
                tokio::select! {
                    _ = task.wake.notified() => {}
                    _ = task.cancel.cancelled() => {}
                }
                Ok(Gate::Again)
            }
            Some((false, by, reason)) => {
                let why = if reason.is_empty() {
                    "no reason given".to_string()
                } else {
                    reason.clone()
                };
                Ok(Gate::Denied(format!(
                    "error: {by} denied this call ({why}). Do not repeat it; do something else or finish."
                )))
            }
            Some((true, ..)) => Ok(Gate::Go),
        },
    }
}

/// Tells the model about one of its calls (that was not run, or whose run is logged).
async fn observe(
    m: &Manager,
    task: &Task,
    a: &AgentState,
    u: &ToolUse,
    text: String,
    failed: bool,
) -> Result<(), Error> {
    let text = with_guard_note(a, u, text, failed);
    m.append(
        task,
        vec![Event::Observation {
            tool_use_id: u.id.clone(),
            text,
            failed,
        }],
    )
    .await
}

/// Adds the repeat guard's note to the observation of a failing call that repeats.
fn with_guard_note(a: &AgentState, u: &ToolUse, mut text: String, failed: bool) -> String {
    if !failed {
        return text;
    }
    let sig = AgentState::signature(u);
    let n = match &a.repeat {
        Some((s, n)) if *s == sig => n + 1,
        _ => 1,
    };
    let limit = a.spec.repeat_limit.max(1);
    if n >= limit {
        text.push_str(&format!(
            "\n\nNote: this exact call has now failed {n} times in a row. Stop and think about why before trying again: read the error, look at the files, change your approach."
        ));
        if n + 1 >= limit + 2 {
            text.push_str(" One more identical failure and the task stops as stuck.");
        }
    }
    text
}

/// Settles the pending call and logs its outcome with the observation, in one append.
async fn settle(
    m: &Manager,
    task: &Task,
    workspace: &str,
    a: &AgentState,
    p: PendingCall,
    fresh: bool,
    redact: &Redactor,
) -> Result<(), Error> {
    let Some(u) = a.queue.front().cloned() else {
        // Nothing asked for it (cannot happen with a log this code wrote): close it.
        return crate::engine::runner::interrupt(
            m,
            task,
            p.call_id,
            "no tool call of the model is waiting for it",
        )
        .await;
    };
    let mut ack = false;
    let (mut events, text, failed) = match &p.call {
        ToolCall::RunCommand {
            argv,
            timeout_ms,
            cwd,
        } => match run_command(m, task, workspace, &p, argv, *timeout_ms, cwd).await {
            CommandOutcome::WorkerGone => return wait_for_report(m, task, &p).await,
            CommandOutcome::Cancelled => {
                interrupted(&p, "the task was cancelled while the command ran")
            }
            CommandOutcome::Interrupted(reason) => {
                ack = true;
                interrupted(&p, &reason)
            }
            CommandOutcome::Done {
                result,
                stdout,
                stderr,
            } => {
                ack = true;
                let (stdout, stderr) = (redact.apply(&stdout), redact.apply(&stderr));
                let text = describe_run(&result, &stdout, &stderr);
                let failed = !result.ok();
                (completed(p.call_id, result, stdout, stderr), text, failed)
            }
        },
        // It may have happened before the brain went down, and doing it again is not safe.
        ToolCall::EditFile { .. } if !fresh => {
            interrupted(&p, "the brain restarted while this edit ran")
        }
        other => match file_tool(m, task, &p.worker, workspace, other).await {
            Err(reason) => interrupted(&p, &reason),
            Ok((text, failed)) => {
                let result = ToolResult {
                    exit_code: Some(if failed { 1 } else { 0 }),
                    error: if failed {
                        tools::head_tail(&text, 500)
                    } else {
                        String::new()
                    },
                    ..Default::default()
                };
                (
                    vec![Event::ToolCallCompleted {
                        call_id: p.call_id,
                        result,
                    }],
                    redact.apply(&text),
                    failed,
                )
            }
        },
    };
    let text = with_guard_note(
        a,
        &u,
        tools::head_tail(&text, tools::MAX_OBSERVATION),
        failed,
    );
    events.push(Event::Observation {
        tool_use_id: u.id.clone(),
        text,
        failed,
    });
    m.append(task, events).await?;
    if ack {
        m.hub.ack(&p.worker, p.call_id);
    }
    Ok(())
}

fn interrupted(p: &PendingCall, reason: &str) -> (Vec<Event>, String, bool) {
    (
        vec![Event::ToolCallInterrupted {
            call_id: p.call_id,
            reason: reason.to_string(),
        }],
        format!(
            "interrupted: {reason}. It may or may not have taken effect: check (read the files, look at the state) before doing it again."
        ),
        true,
    )
}

/// What the model is told about a finished command.
fn describe_run(r: &ToolResult, stdout: &str, stderr: &str) -> String {
    let status = if r.timed_out {
        "timed out (the command was killed)".to_string()
    } else if !r.error.is_empty() {
        format!("could not run: {}", r.error)
    } else {
        crate::model::state::describe(r)
    };
    let half = tools::MAX_OBSERVATION / 2;
    let mut text = status;
    if !stdout.is_empty() {
        text.push_str("\n[stdout]\n");
        text.push_str(&tools::head_tail(stdout, half));
    }
    if !stderr.is_empty() {
        text.push_str("\n[stderr]\n");
        text.push_str(&tools::head_tail(stderr, half));
    }
    text
}

fn file_error(r: proto::file_response::Result) -> String {
    match r {
        proto::file_response::Result::Error(e) => format!("error: {}", e.message),
        _ => "error: unexpected answer from the worker".into(),
    }
}

/// Runs a file tool; Ok((observation, failed)), or Err(why it has no answer).
async fn file_tool(
    m: &Manager,
    task: &Task,
    worker: &str,
    ws: &str,
    call: &ToolCall,
) -> Result<(String, bool), String> {
    use proto::file_call::Op;
    use proto::file_response::Result as R;
    let read = |path: &str| {
        Op::Read(proto::ReadFile {
            path: path.to_string(),
            offset: 0,
            length: 0,
        })
    };
    let write = |path: &str, data: Vec<u8>| {
        Op::Write(proto::WriteFile {
            path: path.to_string(),
            data,
            mode: 0o644,
            create_dirs: true,
        })
    };
    Ok(match call {
        ToolCall::ReadFile {
            path,
            start_line,
            end_line,
        } => match file_call(m, task, worker, ws, read(path)).await? {
            R::Data(d) if d.data[..d.data.len().min(8192)].contains(&0) => {
                (format!("error: {path} is a binary file"), true)
            }
            R::Data(d) => {
                let mut text =
                    tools::numbered(&String::from_utf8_lossy(&d.data), *start_line, *end_line);
                if d.file_size > d.data.len() as u64 {
                    text.push_str(&format!(
                        "[only the first {} of {} bytes were read]\n",
                        d.data.len(),
                        d.file_size
                    ));
                }
                (text, false)
            }
            other => (file_error(other), true),
        },
        ToolCall::WriteFile {
            path,
            content,
            mode,
        } => {
            let op = Op::Write(proto::WriteFile {
                path: path.clone(),
                data: content.clone().into_bytes(),
                mode: *mode,
                create_dirs: true,
            });
            match file_call(m, task, worker, ws, op).await? {
                R::Done(_) => (format!("wrote {} bytes to {path}", content.len()), false),
                other => (file_error(other), true),
            }
        }
        ToolCall::EditFile { path, old, new } => {
            let text = match file_call(m, task, worker, ws, read(path)).await? {
                R::Data(d) if d.file_size as usize > tools::MAX_EDIT_BYTES => {
                    return Ok((
                        format!(
                            "error: {path} is over {} bytes; edit it with a command instead",
                            tools::MAX_EDIT_BYTES
                        ),
                        true,
                    ));
                }
                R::Data(d) => match String::from_utf8(d.data) {
                    Ok(t) => t,
                    Err(_) => return Ok((format!("error: {path} is not UTF-8 text"), true)),
                },
                other => return Ok((file_error(other), true)),
            };
            match tools::apply_edit(&text, old, new, path) {
                Err(e) => (e, true),
                Ok(edited) => {
                    match file_call(m, task, worker, ws, write(path, edited.into_bytes())).await? {
                        R::Done(_) => (format!("edited {path}: replaced 1 occurrence"), false),
                        other => (file_error(other), true),
                    }
                }
            }
        }
        ToolCall::ListFiles { glob } => {
            let op = Op::Find(proto::FindFiles {
                glob: glob.clone(),
                max_results: 0,
            });
            match file_call(m, task, worker, ws, op).await? {
                R::Paths(p) if p.paths.is_empty() => ("(no files match)".to_string(), false),
                R::Paths(p) => {
                    let mut t = p.paths.join("\n");
                    if p.truncated {
                        t.push_str(&format!(
                            "\n[more files match; only the first {} are listed: narrow the glob]",
                            p.paths.len()
                        ));
                    }
                    (t, false)
                }
                other => (file_error(other), true),
            }
        }
        ToolCall::Search { pattern, glob } => {
            let op = Op::Search(proto::SearchFiles {
                pattern: pattern.clone(),
                glob: glob.clone(),
                max_matches: 0,
            });
            match file_call(m, task, worker, ws, op).await? {
                R::Matches(x) if x.matches.is_empty() => {
                    (format!("no matches in {} files", x.files_searched), false)
                }
                R::Matches(x) => {
                    let mut t: String = x
                        .matches
                        .iter()
                        .map(|h| format!("{}:{}: {}\n", h.path, h.line, h.text))
                        .collect();
                    if x.truncated {
                        t.push_str("[more matches; narrow the pattern or the glob]\n");
                    }
                    (t, false)
                }
                other => (file_error(other), true),
            }
        }
        ToolCall::RunCommand { .. } => {
            return Err("a command is not a file tool".into());
        }
    })
}
