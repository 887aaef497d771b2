//! The driver of a scripted plan: each step's call is issued, settled and logged in turn. An
//! interrupted `run` step is settled by its `check` (a clean "no" runs it again; a check
//! that cannot answer is tried three times at most); without a check the task fails rather
//! than risk running it twice. Writes are idempotent and are simply asked again.

use super::core::Cx;
use super::driver::{Action, Driver, Facts};
use super::effects::{self, CommandOutcome};
use super::error::Error;
use crate::model::event::{Outcome, Purpose, ToolCall, ToolResult};
use crate::model::ops::{FileAnswer, FileOp};
use crate::model::state::{PendingCall, TaskState};

const DEFAULT_STEP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
/// Checks that fail to answer (rather than answer "no") before the task gives up.
pub const MAX_CHECK_ERRORS: u32 = 3;

/// Drives scripted plans.
pub struct PlanDriver;

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

#[async_trait::async_trait]
impl Driver for PlanDriver {
    /// A plan's steps are calls: it has no action of its own.
    type Own = std::convert::Infallible;

    fn next(&self, st: &TaskState, _f: &Facts) -> Action {
        let Some(plan) = &st.plan else {
            return Action::finish(Outcome::Failed, "the task has no plan");
        };
        if let Some(reason) = &st.step_failed {
            return Action::finish(Outcome::Failed, reason.clone());
        }
        if st.check_errors >= MAX_CHECK_ERRORS {
            return Action::finish(
                Outcome::Failed,
                format!(
                    "the check of step {} failed to give an answer {} times in a row; the step's effect is unknown",
                    st.unsure_step.unwrap_or(st.next_step),
                    st.check_errors
                ),
            );
        }
        if let Some(step) = st.unsure_step {
            let s = &plan.steps[step as usize];
            return match &s.check {
                Some(check) => Action::Issue {
                    call: run_call(check, s.timeout.as_deref()),
                    step,
                    purpose: Purpose::Check,
                },
                None => Action::finish(
                    Outcome::Failed,
                    format!(
                        "step {step} was interrupted and has no check: its effect is unknown, so the task stops rather than risk running it twice"
                    ),
                ),
            };
        }
        let Some(s) = plan.steps.get(st.next_step as usize) else {
            return Action::finish(
                Outcome::Finished,
                format!("all {} steps done", plan.steps.len()),
            );
        };
        let call = match (&s.run, &s.write) {
            (Some(argv), _) => run_call(argv, s.timeout.as_deref()),
            (None, Some(w)) => ToolCall::WriteFile {
                path: w.path.clone(),
                content: w.content.clone(),
                mode: w.mode.unwrap_or(0o644),
            },
            (None, None) => {
                return Action::finish(Outcome::Failed, format!("step {} is empty", st.next_step));
            }
        };
        Action::Issue {
            call,
            step: st.next_step,
            purpose: Purpose::Step,
        }
    }

    async fn settle(&mut self, cx: &Cx<'_>, p: PendingCall) -> Result<(), Error> {
        match &p.call {
            ToolCall::RunCommand {
                argv,
                timeout_ms,
                cwd,
            } => match effects::run_command(cx, &p, argv, *timeout_ms, cwd).await {
                CommandOutcome::Cancelled => {
                    effects::interrupt(cx, p.call_id, "the task was cancelled while the call ran")
                        .await?;
                }
                CommandOutcome::WorkerGone => effects::wait_for_report(cx, &p).await?,
                CommandOutcome::Interrupted(reason) => {
                    effects::interrupt(cx, p.call_id, reason).await?;
                    cx.ports().workers.ack(&p.worker, p.call_id);
                }
                CommandOutcome::Done {
                    result,
                    stdout,
                    stderr,
                } => {
                    cx.store()
                        .append(
                            cx.task,
                            effects::completed(p.call_id, result, stdout, stderr),
                        )
                        .await?;
                    cx.ports().workers.ack(&p.worker, p.call_id);
                }
            },
            ToolCall::WriteFile {
                path,
                content,
                mode,
            } => {
                // An atomic write of fixed content is idempotent: asking again after a crash
                // cannot do it twice in any way that matters.
                let op = FileOp::Write {
                    path: path.clone(),
                    data: content.clone().into_bytes(),
                    mode: *mode,
                    create_dirs: true,
                };
                let result = match effects::file_call(cx, &p.worker, op).await {
                    Err(reason) => {
                        return effects::interrupt(cx, p.call_id, reason.to_string()).await;
                    }
                    Ok(FileAnswer::Done) => ToolResult {
                        exit_code: Some(0),
                        ..Default::default()
                    },
                    Ok(FileAnswer::Error(message)) => ToolResult {
                        error: message,
                        ..Default::default()
                    },
                    Ok(_) => ToolResult {
                        error: "unexpected answer to a write".into(),
                        ..Default::default()
                    },
                };
                cx.store()
                    .append(
                        cx.task,
                        vec![crate::model::event::Event::ToolCallCompleted {
                            call_id: p.call_id,
                            result,
                        }],
                    )
                    .await?;
            }
            other => {
                effects::interrupt(
                    cx,
                    p.call_id,
                    format!("a scripted plan has no {other:?} step"),
                )
                .await?;
            }
        }
        Ok(())
    }

    async fn act(&mut self, _cx: &Cx<'_>, own: Self::Own) -> Result<(), Error> {
        match own {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{Plan, TaskId};
    use crate::model::state::Status;

    fn plan(json: &str) -> TaskState {
        let mut st = TaskState::new(TaskId(1));
        st.status = Status::Running;
        st.worker = Some("w".into());
        st.plan = Some(Plan::parse(json).unwrap());
        st
    }

    const TWO: &str = r#"{"steps":[
        {"run":["make"],"check":["test","-f","out"],"timeout":"5s"},
        {"write":{"path":"a.txt","content":"x"}}
    ]}"#;

    #[test]
    fn what_a_plan_does_next() {
        let f = Facts::default();
        let run = |argv: &[&str], ms: u64| ToolCall::RunCommand {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            timeout_ms: ms,
            cwd: String::new(),
        };
        let fresh = plan(TWO);
        let mut second = plan(TWO);
        second.next_step = 1;
        let mut done = plan(TWO);
        done.next_step = 2;
        let mut failed = plan(TWO);
        failed.step_failed = Some("step 0 failed: exit code 2".into());
        let mut unsure = plan(TWO);
        unsure.unsure_step = Some(0);
        let mut unsure_no_check = plan(r#"{"steps":[{"run":["make"]}]}"#);
        unsure_no_check.unsure_step = Some(0);
        let mut checks_fail = plan(TWO);
        checks_fail.unsure_step = Some(0);
        checks_fail.check_errors = MAX_CHECK_ERRORS;
        let mut no_plan = plan(TWO);
        no_plan.plan = None;
        let cases: Vec<(&str, &TaskState, Action)> = vec![
            (
                "the first step, with its own timeout",
                &fresh,
                Action::Issue {
                    call: run(&["make"], 5000),
                    step: 0,
                    purpose: Purpose::Step,
                },
            ),
            (
                "a write step, default mode",
                &second,
                Action::Issue {
                    call: ToolCall::WriteFile {
                        path: "a.txt".into(),
                        content: "x".into(),
                        mode: 0o644,
                    },
                    step: 1,
                    purpose: Purpose::Step,
                },
            ),
            (
                "all done",
                &done,
                Action::finish(Outcome::Finished, "all 2 steps done"),
            ),
            (
                "a failed step fails the task",
                &failed,
                Action::finish(Outcome::Failed, "step 0 failed: exit code 2"),
            ),
            (
                "an interrupted step is checked",
                &unsure,
                Action::Issue {
                    call: run(&["test", "-f", "out"], 5000),
                    step: 0,
                    purpose: Purpose::Check,
                },
            ),
            (
                "no plan",
                &no_plan,
                Action::finish(Outcome::Failed, "the task has no plan"),
            ),
        ];
        for (name, st, want) in cases {
            assert_eq!(PlanDriver.next(st, &f), want, "{name}");
        }
        let Action::Finish {
            outcome, reason, ..
        } = PlanDriver.next(&unsure_no_check, &f)
        else {
            panic!("an interrupted step without a check must end the task");
        };
        assert_eq!(outcome, Outcome::Failed);
        assert!(reason.contains("has no check"), "{reason}");
        let Action::Finish {
            outcome, reason, ..
        } = PlanDriver.next(&checks_fail, &f)
        else {
            panic!("a check that never answers must end the task");
        };
        assert_eq!(outcome, Outcome::Failed);
        assert!(reason.contains("3 times in a row"), "{reason}");
    }
}
