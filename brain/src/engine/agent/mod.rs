//! The agent driver. Each turn it decides from the task's state (a pure function of its log)
//! the one next thing, and the supervisor performs it, logged before it is acted on:
//!
//! 1. a call in flight is settled (its result, or "interrupted", becomes an observation);
//! 2. the next tool call of the model's last answer is checked (unknown tool, bad arguments,
//!    permission, approval) and issued;
//! 3. with nothing left to do, the budgets are checked and the model is asked again.
//!
//! After a crash the same turns pick up from the log: an answered LLM request is never sent
//! again, a command in flight is settled by the worker's journal, an edit that may have
//! happened is reported as interrupted, and a call waiting for approval waits on.

mod files;
mod instructions;
mod settle;
#[cfg(test)]
mod tests;
mod undo;
mod view;

use std::sync::Arc;
use std::time::Duration;

use super::core::Cx;
use super::driver::{self, Driver, Facts};
use super::effects;
use super::error::Error;
use super::redact::Redactor;
use crate::llm::{self, Provider, ToolUse};
use crate::model::agent::{AgentState, Assist, Gate, Permission};
use crate::model::event::{Event, Outcome, Purpose, Rendered, ToolCall};
use crate::model::prompt::{self, EnvironmentAnswer};
use crate::model::state::{PendingCall, Status, TaskState};
use crate::model::tools::{self, Prepared};

/// How long to wait before asking an unreachable model again (after the provider's own
/// retries gave up).
const LLM_RETRY: Duration = Duration::from_secs(30);

/// The provider a task's model names: a replay of its recorded transcript, or a real API.
pub fn provider(
    a: &crate::model::agent::AgentSpec,
    cfg: &llm::LlmConfig,
    together: &Arc<llm::Together>,
) -> Result<Arc<dyn Provider>, llm::Error> {
    let spec: llm::ModelSpec = a.model.parse()?;
    if spec.provider == llm::ProviderKind::Replay {
        return Ok(Arc::new(llm::Replay::parse(&a.transcript)?));
    }
    llm::connect(&spec, cfg, together)
}

/// The first turn of an attempt that starts with others alike may be asked with theirs.
pub(crate) fn share(st: &TaskState, a: &AgentState) -> Option<llm::Share> {
    let sampling = a.spec.sampling?;
    let parent = st.attempt_of?.parent;
    let first = !a
        .conversation
        .iter()
        .any(|m| m.role == llm::Role::Assistant);
    (first && sampling.together > 1).then_some(llm::Share {
        group: parent.0,
        of: sampling.together,
    })
}

/// What only the agent does (the rest are [`driver::Action`]'s own).
#[derive(Debug, Clone, PartialEq)]
pub enum AgentAction {
    /// Look at the workspace before the model's first turn.
    Survey,
    /// Put back the files the check relies on, before the check of this `finish`.
    Restore { tool_use: ToolUse },
    /// Undo the model's changes, back to the version the check passed on, or (`to_start`)
    /// to the task's start, for a model stuck on its own failed fix.
    UndoChanges { to_start: bool },
    /// Ask the model.
    Think,
    /// Obtain a machine that fits and move there.
    Environment {
        tool_use: ToolUse,
        req: crate::model::env::EnvRequest,
        what: String,
    },
}

/// The agent's decisions.
pub type Action = driver::Action<AgentAction>;

/// Drives agent tasks.
pub struct AgentDriver {
    llm: Arc<llm::LlmConfig>,
    /// Made on first use, kept for the task's run.
    model: Option<Arc<dyn Provider>>,
    redact: Arc<Redactor>,
}

impl AgentDriver {
    pub fn new(llm: Arc<llm::LlmConfig>, redact: Arc<Redactor>) -> Self {
        Self {
            redact,
            llm,
            model: None,
        }
    }
}

fn summary_or_default(summary: String) -> String {
    if summary.trim().is_empty() {
        "finished (no summary given)".to_string()
    } else {
        summary
    }
}

/// The call that runs an acceptance check.
pub fn check_call(check: &crate::model::agent::Check) -> ToolCall {
    ToolCall::RunCommand {
        argv: vec!["sh".into(), "-c".into(), check.command.clone()],
        timeout_ms: check.timeout().as_millis() as u64,
        cwd: String::new(),
    }
}

/// The observation of a call that was not run, or whose outcome is logged with it.
fn observe(a: &AgentState, u: &ToolUse, text: String, failed: bool) -> Event {
    Event::Observation {
        tool_use_id: u.id.clone(),
        text: a.with_guard_note(u, text, failed),
        failed,
    }
}

/// Asks a person about `u`: the request and the waiting status, in one append.
fn ask(u: &ToolUse, id: u64, what: &str) -> Vec<Event> {
    vec![
        Event::ApprovalRequested {
            approval_id: id,
            what: what.to_string(),
            tool_use_id: u.id.clone(),
        },
        Event::StatusChanged {
            status: Status::Waiting,
            reason: format!("waiting for approval #{id}: {what} (a person approves or denies it)"),
        },
    ]
}

/// Why the brain finishes for an attempt whose changes the check passes on.
const ATTEMPT_PASSED: &str =
    "made the acceptance check pass in an attempt (an attempt ends at its first pass)";

/// The model stopped (`why`) with the workspace as the acceptance check passed on it: the
/// brain calls `finish` for it (once per version), and the check decides as for the model's.
fn conclude(a: &AgentState, why: &str) -> Option<Action> {
    a.spec.assisted(Assist::FinishForModel).then_some(())?;
    concluded(a, why)
}

/// The brain calls `finish` on the passing version (an attempt's first pass: not an assist).
fn concluded(a: &AgentState, why: &str) -> Option<Action> {
    (a.spec.check.is_some() && a.holds_a_pass()).then(|| {
        Action::Log(vec![Event::FinishedForModel {
            why: why.to_string(),
        }])
    })
}

/// The model stopped making progress and the check never passed on what it did: once per
/// task, its changes are undone back to the task's start and it begins again from the first
/// message (a small model anchors on its own failed fix and writes it again and again).
fn restart(a: &AgentState) -> Option<Action> {
    (a.spec.assisted(Assist::Restart)
        && a.spec.check.is_some()
        && !a.restarted
        && a.passed_root.is_empty()
        && a.queue.is_empty())
    .then_some(Action::Driver(AgentAction::UndoChanges { to_start: true }))
}

/// The decision for the agent's next turn, given the task's state. Pure.
pub fn next(st: &TaskState, f: &Facts, llm: &llm::LlmConfig) -> Action {
    let Some(a) = st.agent.as_deref() else {
        return Action::finish(Outcome::Failed, "not an agent task");
    };
    if let Some(why) = a.stuck() {
        if let Some(conclude) = conclude(a, "went round in circles") {
            return conclude;
        }
        if let Some(restart) = restart(a) {
            return restart;
        }
        return Action::finish(Outcome::Stuck, why);
    }
    // 2. The next tool call of the model's last answer.
    if let Some(u) = a.queue.front() {
        return match tools::prepare(u, &a.spec) {
            Prepared::Refused(e) => Action::Log(vec![observe(a, u, e, true)]),
            Prepared::Environment { req, what } => Action::Driver(AgentAction::Environment {
                tool_use: u.clone(),
                req,
                what,
            }),
            Prepared::Finish(summary) => {
                if a.reply_calls > 1 && a.spec.assisted(Assist::FinishAlone) {
                    // Written with other calls, before their results were seen: not taken.
                    return Action::Log(vec![observe(a, u, prompt::FINISH_NOT_ALONE.into(), true)]);
                }
                match &a.spec.check {
                    Some(check)
                        if !check.protect.is_empty()
                            && !st.seed_root.is_empty()
                            && a.restored_for.as_deref() != Some(u.id.as_str()) =>
                    {
                        Action::Driver(AgentAction::Restore {
                            tool_use: u.clone(),
                        })
                    }
                    // The brain decides: the check runs on the final workspace.
                    Some(check) => Action::Issue {
                        call: check_call(check),
                        step: a.spent.steps,
                        purpose: Purpose::Acceptance,
                    },
                    None => Action::Finish {
                        outcome: Outcome::Finished,
                        reason: summary_or_default(summary),
                        before: vec![Event::Observation {
                            tool_use_id: u.id.clone(),
                            text: prompt::words::FINISHED_UNVERIFIED.into(),
                            failed: false,
                        }],
                    },
                }
            }
            Prepared::Call {
                call,
                mutating,
                what,
            } => match tools::gate(a, u, &call, mutating) {
                Gate::Ask(id) => Action::Log(ask(u, id, &what)),
                Gate::Waiting => Action::AwaitDecision,
                Gate::Denied(text) => Action::Log(vec![observe(a, u, text, true)]),
                Gate::Go => Action::Issue {
                    call,
                    step: a.spent.steps,
                    purpose: Purpose::Step,
                },
            },
        };
    }
    // Before the model's first turn: what the workspace holds, and where the check stands.
    if a.spent.steps == 0 && !a.awaiting_llm {
        if !a.surveyed {
            return Action::Driver(AgentAction::Survey);
        }
        if let Some(check) = &a.spec.check {
            let Some(run) = &st.last_check else {
                return Action::Issue {
                    call: check_call(check),
                    step: 0,
                    purpose: Purpose::Acceptance,
                };
            };
            // A check that cannot run would judge nothing: the task stops before the model
            // spends anything against it.
            if let Some(why) = run.unrunnable(&check.command) {
                return Action::finish(Outcome::Failed, why);
            }
        }
    }
    // Changes on which the check fails, after it had passed: back to the version it passed on.
    if a.undo_due && a.spec.check.is_some() && a.spec.assisted(Assist::UndoRegression) {
        return Action::Driver(AgentAction::UndoChanges { to_start: false });
    }
    // 3. Think.
    if a.stalled() {
        if let Some(conclude) = conclude(a, "stopped calling tools") {
            return conclude;
        }
        if let Some(restart) = restart(a) {
            return restart;
        }
        let last = a
            .conversation
            .iter()
            .rev()
            .find(|m| m.role == llm::Role::Assistant)
            .map(|m| m.content.clone())
            .unwrap_or_default();
        return Action::finish(
            Outcome::Stalled,
            format!(
                "the model stopped calling tools without finishing ({} replies in a row without a call that could run): {}",
                a.idle_replies,
                tools::head_tail(&last, 500)
            ),
        );
    }
    // The model changed files: the check runs on them before its next turn, and it hears
    // how it went (a small model cannot tell whether a change helped without it). Also when
    // the budget is spent: the last change may be the fix (or undo a passing version).
    if let Some(check) = &a.spec.check
        && a.changed_since_check
        && a.spent.steps > 0
        && a.spec.assisted(Assist::CheckAfterChanges)
    {
        return Action::Issue {
            call: check_call(check),
            step: a.spent.steps,
            purpose: Purpose::Acceptance,
        };
    }
    // An attempt is judged by the check: once it passes on the attempt's changes (it failed
    // before them), the attempt has done what it is for and ends there, as verified, instead
    // of spending the race's time on turns that can only keep or undo the pass.
    if st.attempt_of.is_some()
        && a.failed_at_start
        && let Some(conclude) = concluded(a, ATTEMPT_PASSED)
    {
        return conclude;
    }
    if let Some(why) = a.exhausted_with(f.now_ms, f.machines_usd) {
        if let Some(conclude) = conclude(a, "ran out of its budget") {
            return conclude;
        }
        return Action::Log(vec![Event::StatusChanged {
            status: Status::BudgetExhausted,
            reason: format!("{why}; resuming it with a larger budget lets it go on"),
        }]);
    }
    let info = llm::model_info(&a.spec.model, llm);
    let system = prompt::system_prompt(a);
    let estimate =
        prompt::estimate_tokens(&system, a, &tools::specs(a.spec.permission, f.can_move));
    if let Some((upto, bytes_saved)) = prompt::elision(a, info.context_window, estimate, false) {
        return Action::Log(vec![Event::ContextElided { upto, bytes_saved }]);
    }
    Action::Driver(AgentAction::Think)
}

#[async_trait::async_trait]
impl Driver for AgentDriver {
    type Own = AgentAction;

    fn next(&self, st: &TaskState, f: &Facts) -> Action {
        next(st, f, &self.llm)
    }

    async fn settle(&mut self, cx: &Cx<'_>, p: PendingCall) -> Result<(), Error> {
        settle::settle(cx, p, &self.redact).await
    }

    async fn act(&mut self, cx: &Cx<'_>, action: AgentAction) -> Result<(), Error> {
        match action {
            AgentAction::Think => self.think(cx).await,
            AgentAction::Survey => survey(cx, &self.redact).await,
            AgentAction::Restore { tool_use } => undo::restore(cx, &tool_use).await,
            AgentAction::UndoChanges { to_start } => {
                undo::undo_changes(cx, to_start, &self.redact).await
            }
            AgentAction::Environment {
                tool_use,
                req,
                what,
            } => environment(cx, &tool_use, req, what).await,
        }
    }
}

impl AgentDriver {
    /// Asks the model and logs its answer (or why there is none).
    async fn think(&mut self, cx: &Cx<'_>) -> Result<(), Error> {
        let st = cx.task.state();
        let Some(a) = st.agent.as_deref() else {
            return Ok(());
        };
        let provider = match &self.model {
            Some(p) => p.clone(),
            None => match provider(&a.spec, &self.llm, &cx.core.together) {
                Ok(p) => {
                    self.model = Some(p.clone());
                    p
                }
                Err(e) => {
                    let reason = format!("model {}: {e}", a.spec.model);
                    return effects::finish(cx, Outcome::Failed, reason, vec![]).await;
                }
            },
        };
        let info = llm::model_info(&a.spec.model, &self.llm);
        let can_move = cx.can_move();
        let req = prompt::request(a, can_move, share(&st, a));
        let estimate = prompt::estimate_tokens(&req.system, a, &req.tools);
        let mut pre = vec![];
        if st.status != Status::Running || !st.reason.is_empty() {
            pre.push(Event::StatusChanged {
                status: Status::Running,
                reason: String::new(),
            });
        }
        // As the provider sends it: in text tool-call mode, rendered for it.
        let tools = provider.tools_sent();
        let sent = prompt::as_sent(&req, tools);
        if !a.awaiting_llm {
            pre.push(Event::LlmRequest {
                model: a.spec.model.clone(),
                messages: a.conversation.len() as u32,
                rendered: Some(Rendered {
                    version: prompt::VERSION,
                    hash: prompt::hash(&sent),
                    tools,
                    can_move,
                }),
            });
        }
        if !pre.is_empty() {
            cx.store().append(cx.task, pre).await?;
        }
        // The wall-time budget holds during a call too: a slow answer does not carry the task
        // past it (the next decision logs the budget as spent; a resume asks again).
        let wall_left = (a.limits.wall_ms > 0).then(|| {
            let end = a.wall_start_ms + a.limits.wall_ms as i64;
            Duration::from_millis((end - shared::now_unix_ms()).max(0) as u64 + 1)
        });
        let answer = tokio::select! {
            r = provider.complete(&sent) => r,
            _ = cx.task.cancel.cancelled() => return Ok(()),
            _ = async {
                match wall_left {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            } => {
                tracing::info!(task = %cx.task.id, "wall-time budget spent while the model was answering");
                return Ok(());
            }
        };
        match answer {
            Ok(mut r) => {
                // A secret the model wrote goes nowhere: not into the log, not into the calls
                // sent to the worker, not into a summary.
                r.message.content = self.redact.apply(&r.message.content);
                for c in &mut r.message.tool_calls {
                    c.arguments = self.redact.apply(&c.arguments);
                    if let Some(name) = tools::canonical_name(&c.name) {
                        c.name = name.to_string();
                    }
                }
                let unreadable = std::mem::take(&mut r.unreadable);
                r.malformed_calls
                    .extend(unreadable.iter().map(prompt::text_mode::unreadable));
                for m in &mut r.malformed_calls {
                    *m = self.redact.apply(m);
                }
                for b in &mut r.code_blocks {
                    b.body = self.redact.apply(&b.body);
                }
                view::edits_from_blocks(cx, a, &mut r).await;
                let cost_usd = info.price.map_or(0.0, |p| p.cost(&r.usage));
                tracing::info!(
                    task = %cx.task.id,
                    prompt_tokens = r.usage.prompt_tokens,
                    completion_tokens = r.usage.completion_tokens,
                    cost_usd,
                    tool_calls = r.message.tool_calls.len(),
                    "model answered"
                );
                cx.store()
                    .append(
                        cx.task,
                        vec![Event::LlmResponse {
                            model: a.spec.model.clone(),
                            prompt_tokens: r.usage.prompt_tokens,
                            completion_tokens: r.usage.completion_tokens,
                            cost_usd,
                            response: Some(Box::new(r)),
                        }],
                    )
                    .await
            }
            Err(llm::Error::ContextOverflow(msg)) => {
                match prompt::elision(a, info.context_window, estimate, true) {
                    Some((upto, bytes_saved)) => {
                        cx.store()
                            .append(cx.task, vec![Event::ContextElided { upto, bytes_saved }])
                            .await
                    }
                    None => {
                        let reason = format!(
                            "the conversation no longer fits the model's context window, even with old outputs elided: {msg}"
                        );
                        effects::finish(cx, Outcome::Failed, reason, vec![]).await
                    }
                }
            }
            Err(e) if e.retryable() => {
                tracing::warn!(task = %cx.task.id, error = %e, "model unreachable; trying again");
                let reason = format!(
                    "the model is unreachable ({e}); trying again every {}s",
                    LLM_RETRY.as_secs()
                );
                effects::set_status(cx, Status::Waiting, &reason).await?;
                tokio::select! {
                    _ = tokio::time::sleep(LLM_RETRY) => {}
                    _ = cx.task.cancel.cancelled() => {}
                }
                Ok(())
            }
            Err(e) => {
                let reason = format!("model {}: {e}", a.spec.model);
                effects::finish(cx, Outcome::Failed, reason, vec![]).await
            }
        }
    }
}

/// Most files the overview lists, and README bytes it reads.
const SURVEY_FILES: u32 = 200;
const SURVEY_README: u64 = 4096;

/// Looks at the workspace before the model's first turn: its files and the head of its
/// README, logged so the first message shows them.
async fn survey(cx: &Cx<'_>, redact: &Redactor) -> Result<(), Error> {
    use crate::model::ops::{FileAnswer, FileOp};
    let worker = cx.task.state().worker.unwrap_or_default();
    let list = FileOp::Find {
        glob: String::new(),
        max_results: SURVEY_FILES,
    };
    let (files, truncated) = match effects::file_call(cx, &worker, list).await {
        Ok(FileAnswer::Paths { paths, truncated }) => (paths, truncated),
        Ok(_) => (vec![], false),
        // Cancelled, or the worker is away: look again.
        Err(_) => return Ok(()),
    };
    let readme_path = files
        .iter()
        .filter(|p| !p.contains('/') && p.to_ascii_lowercase().starts_with("readme"))
        .min_by_key(|p| p.len())
        .cloned()
        .unwrap_or_default();
    let mut readme = String::new();
    if !readme_path.is_empty() {
        let read = FileOp::Read {
            path: readme_path.clone(),
            offset: 0,
            length: SURVEY_README,
        };
        if let Ok(FileAnswer::Data { data, .. }) = effects::file_call(cx, &worker, read).await
            && !data.contains(&0)
        {
            readme = redact.apply(&String::from_utf8_lossy(&data));
        }
    }
    let files = files.iter().map(|f| redact.apply(f)).collect();
    let no_agents_md = cx
        .task
        .state()
        .agent
        .as_deref()
        .is_some_and(|a| a.spec.no_agents_md);
    let (agents_md_path, agents_md) = if no_agents_md {
        Default::default()
    } else {
        instructions::at_root(cx, &worker, redact).await
    };
    cx.store()
        .append(
            cx.task,
            vec![Event::Surveyed {
                files,
                truncated,
                readme_path,
                readme,
                agents_md_path,
                agents_md,
            }],
        )
        .await
}

/// `request_environment`: a person's approval if the machine costs more than the policy
/// allows unasked (or the task asks for everything), then a worker that fits, the move
/// there, and the release of the machine the task left.
async fn environment(
    cx: &Cx<'_>,
    u: &ToolUse,
    req: crate::model::env::EnvRequest,
    what: String,
) -> Result<(), Error> {
    let st = cx.task.state();
    let (Some(a), Some(worker)) = (st.agent.as_deref(), st.worker.clone()) else {
        return Ok(());
    };
    let envs = &cx.ports().environments;
    let tid = cx.task.id.to_string();
    let quote = envs.quote(&tid, &worker, &req);
    if quote.needs_approval || a.spec.permission == Permission::Ask {
        let asked = if quote.reuse {
            what.clone()
        } else {
            format!("{what}; a new machine at ${:.2}/h", quote.usd_per_hour)
        };
        match a.gate(u) {
            Gate::Ask(id) => return cx.store().append(cx.task, ask(u, id, &asked)).await,
            Gate::Waiting => {
                effects::await_decision(cx).await;
                return Ok(());
            }
            Gate::Denied(text) => {
                return cx
                    .store()
                    .append(cx.task, vec![observe(a, u, text, true)])
                    .await;
            }
            Gate::Go => {}
        }
    }
    let budget_left =
        (a.limits.usd > 0.0).then(|| a.limits.usd - a.spent.usd - envs.task_cost(&tid));
    tracing::info!(task = %cx.task.id, %what, "environment requested");
    let (text, failed) = match envs.obtain(&tid, &worker, &req, budget_left).await {
        Err(why) => (
            prompt::environment_answer(EnvironmentAnswer::Refused {
                why: &why.to_string(),
            }),
            true,
        ),
        Ok(g) if g.worker == worker => (
            prompt::environment_answer(EnvironmentAnswer::AlreadyFits {
                describe: &g.describe,
            }),
            false,
        ),
        Ok(g) => {
            effects::move_task(cx, &g.worker).await?;
            if cx.task.state().worker.as_deref() == Some(g.worker.as_str()) {
                let released = envs.release_if_ours(&worker, &tid).await;
                (
                    prompt::environment_answer(EnvironmentAnswer::Moved {
                        describe: &g.describe,
                        released: released.as_deref(),
                    }),
                    false,
                )
            } else {
                if g.machine.is_some() {
                    envs.release_if_ours(&g.worker, &tid).await;
                }
                (
                    prompt::environment_answer(EnvironmentAnswer::MoveFailed {
                        describe: &g.describe,
                    }),
                    true,
                )
            }
        }
    };
    let a = cx.task.state().agent.unwrap_or_else(|| Box::new(a.clone()));
    cx.store()
        .append(cx.task, vec![observe(&a, u, text, failed)])
        .await
}
