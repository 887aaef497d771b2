//! Settling a call in flight: its result (or "interrupted") becomes the model's observation,
//! in one append; the acceptance check's own runs (before the first turn, after the model's
//! changes, for its `finish`) say what the model hears.

use super::super::core::Cx;
use super::super::effects::{self, CommandOutcome};
use super::super::error::Error;
use super::super::redact::Redactor;
use super::{files, observe, summary_or_default, view};
use crate::model::event::{Event, Outcome, Purpose, ToolCall, ToolResult};
use crate::model::prompt::{self, CheckAfterChanges};
use crate::model::state::PendingCall;
use crate::model::tools::{self, Prepared};

/// Settles an acceptance check no call of the model waits for: the run before the model's
/// first turn (its result goes into the first message) or after the model changed files (the
/// model is told how it went).
async fn settle_own_check(
    cx: &Cx<'_>,
    p: PendingCall,
    first: bool,
    redact: &Redactor,
) -> Result<(), Error> {
    let ToolCall::RunCommand {
        argv,
        timeout_ms,
        cwd,
    } = &p.call
    else {
        return effects::interrupt(cx, p.call_id, "an acceptance check must be a command").await;
    };
    match effects::run_command(cx, &p, argv, *timeout_ms, cwd).await {
        CommandOutcome::WorkerGone => effects::wait_for_report(cx, &p).await,
        CommandOutcome::Cancelled => {
            effects::interrupt(cx, p.call_id, "the task was cancelled while the check ran").await
        }
        CommandOutcome::Interrupted(reason) => {
            effects::interrupt(cx, p.call_id, reason).await?;
            cx.ports().workers.ack(&p.worker, p.call_id);
            Ok(())
        }
        CommandOutcome::Done {
            result,
            stdout,
            stderr,
        } => {
            let (stdout, stderr) = (redact.apply(&stdout), redact.apply(&stderr));
            let passed = result.ok();
            let output = format!("{stdout}\n{stderr}");
            let described = prompt::describe_command(&result, &stdout, &stderr);
            let mut events = effects::completed(p.call_id, result, stdout, stderr);
            if first {
                if !passed {
                    let view = view::failing_code(cx, &p.worker, &output, true, redact).await;
                    if !view.is_empty() {
                        events.push(Event::CodeInView { text: view });
                    }
                }
            } else {
                let check = cx.task.state().check().map(|c| c.command.clone());
                let check = check.unwrap_or_default();
                let text = if passed {
                    prompt::check_after_changes(&check, CheckAfterChanges::Passes)
                } else {
                    let undone = cx
                        .task
                        .state()
                        .agent
                        .as_ref()
                        .is_some_and(|a| a.undoes_on_failure());
                    if undone {
                        // The files go back to the version it passed on, shown with that.
                        prompt::check_after_changes(&check, CheckAfterChanges::Fails(&described))
                    } else {
                        let told = prompt::check_after_changes(
                            &check,
                            CheckAfterChanges::StillFails(&described),
                        );
                        with_code(cx, &p.worker, told, &output, true, redact).await
                    }
                };
                events.push(Event::CheckAfterChanges { passed, text });
            }
            cx.store().append(cx.task, events).await?;
            cx.ports().workers.ack(&p.worker, p.call_id);
            Ok(())
        }
    }
}

/// A failing run's description with the code its output points at: the output cut to leave
/// room for the code, so the observation stays within its bound.
async fn with_code(
    cx: &Cx<'_>,
    worker: &str,
    described: String,
    output: &str,
    check: bool,
    redact: &Redactor,
) -> String {
    let view = view::failing_code(cx, worker, output, check, redact).await;
    if view.is_empty() {
        return described;
    }
    let room = tools::MAX_OBSERVATION.saturating_sub(view.len() + 2);
    format!("{}\n\n{view}", tools::head_tail(&described, room))
}

/// Settles the pending call and logs its outcome with the observation, in one append.
pub(super) async fn settle(cx: &Cx<'_>, p: PendingCall, redact: &Redactor) -> Result<(), Error> {
    let st = cx.task.state();
    if p.purpose == Purpose::Acceptance
        && let Some(a) = st.agent.as_deref().filter(|a| a.queue.is_empty())
    {
        return settle_own_check(cx, p, a.spent.steps == 0, redact).await;
    }
    let (Some(a), Some(u)) = (
        st.agent.as_deref(),
        st.agent.as_ref().and_then(|a| a.queue.front().cloned()),
    ) else {
        // Nothing asked for it (cannot happen with a log this code wrote): close it.
        return effects::interrupt(cx, p.call_id, "no tool call of the model is waiting for it")
            .await;
    };
    let mut ack = false;
    // The instructions for agents nearest above a file the call touched, when new.
    let mut instructions = None;
    let (mut events, text, failed) = match &p.call {
        ToolCall::RunCommand {
            argv,
            timeout_ms,
            cwd,
        } => match effects::run_command(cx, &p, argv, *timeout_ms, cwd).await {
            CommandOutcome::WorkerGone => return effects::wait_for_report(cx, &p).await,
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
            } if p.purpose == Purpose::Acceptance => {
                let (stdout, stderr) = (redact.apply(&stdout), redact.apply(&stderr));
                let check = st.check().map(|c| c.command.clone()).unwrap_or_default();
                let passed = result.ok();
                let mut events =
                    effects::completed(p.call_id, result.clone(), stdout.clone(), stderr.clone());
                let output = prompt::describe_command(&result, &stdout, &stderr);
                if passed {
                    let summary = match tools::prepare(&u, &a.spec) {
                        Prepared::Finish(s) => summary_or_default(s),
                        _ => "finished".into(),
                    };
                    events.push(Event::Observation {
                        tool_use_id: u.id.clone(),
                        text: format!(
                            "the task is finished: the acceptance check `{check}` passed"
                        ),
                        failed: false,
                    });
                    events.push(Event::Finished {
                        outcome: Outcome::Finished,
                        reason: summary,
                        verified: Some(true),
                    });
                    cx.store().append(cx.task, events).await?;
                    cx.ports().workers.ack(&p.worker, p.call_id);
                    tracing::info!(task = %cx.task.id, "task ended: finished, verified");
                    return Ok(());
                }
                ack = true;
                let told = prompt::finish_refused(&check, &output);
                let told = with_code(
                    cx,
                    &p.worker,
                    told,
                    &format!("{stdout}\n{stderr}"),
                    true,
                    redact,
                )
                .await;
                (events, told, true)
            }
            CommandOutcome::Done {
                result,
                stdout,
                stderr,
            } => {
                ack = true;
                let (stdout, stderr) = (redact.apply(&stdout), redact.apply(&stderr));
                let mut text = prompt::describe_command(&result, &stdout, &stderr);
                let failed = !result.ok();
                if failed {
                    let output = format!("{stdout}\n{stderr}");
                    text = with_code(cx, &p.worker, text, &output, false, redact).await;
                }
                (
                    effects::completed(p.call_id, result, stdout, stderr),
                    text,
                    failed,
                )
            }
        },
        // It may have happened before the brain went down, and doing it again is not safe.
        ToolCall::EditFile { .. } if !cx.task.minted_here(p.call_id) => {
            interrupted(&p, "the brain restarted while this edit ran")
        }
        other => match files::run(cx, &p.worker, other).await {
            Err(reason) => interrupted(&p, &reason.to_string()),
            Ok((text, failed)) => {
                instructions = if failed {
                    None
                } else {
                    super::instructions::nearest(cx, &p.worker, other, redact).await
                };
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
    events.push(observe(
        a,
        &u,
        tools::head_tail(&text, tools::MAX_OBSERVATION),
        failed,
    ));
    events.extend(instructions);
    cx.store().append(cx.task, events).await?;
    if ack {
        cx.ports().workers.ack(&p.worker, p.call_id);
    }
    Ok(())
}

fn interrupted(p: &PendingCall, reason: &str) -> (Vec<Event>, String, bool) {
    (
        vec![Event::ToolCallInterrupted {
            call_id: p.call_id,
            reason: reason.to_string(),
        }],
        tools::describe_interrupted(reason),
        true,
    )
}
