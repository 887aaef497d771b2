//! Table tests of the agent's decisions: a task state in, the action out.

use super::*;
use crate::llm::{Response, Usage};
use crate::model::agent::{AgentSpec, Budget};
use crate::model::event::TaskId;

fn spec(permission: Permission) -> AgentSpec {
    AgentSpec::for_test(
        permission,
        Budget {
            steps: 10,
            usd: 1.0,
            ..Default::default()
        },
    )
}

fn task(permission: Permission) -> TaskState {
    let mut st = TaskState::new(TaskId(3));
    st.status = Status::Running;
    st.worker = Some("w".into());
    let mut a = AgentState::new(spec(permission), "fix it", 0);
    // Looked at the workspace already (see `the_first_turn_waits_for_the_overview`).
    a.surveyed = true;
    st.agent = Some(Box::new(a));
    st
}

fn answer(calls: &[(&str, &str)]) -> Response {
    let calls = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| ToolUse {
            id: format!("u{i}"),
            name: name.to_string(),
            arguments: args.to_string(),
        })
        .collect();
    let usage = Usage {
        prompt_tokens: 10,
        completion_tokens: 5,
    };
    Response::new("", calls, usage)
}

/// `st` after the model answered with `calls`.
/// The acceptance check the table's tasks have.
fn check() -> crate::model::agent::Check {
    crate::model::agent::Check {
        command: "python3 test.py".into(),
        timeout_ms: 0,
        source: crate::model::check::CheckSource::Request,
        protect: vec![],
    }
}

fn answered(mut st: TaskState, calls: &[(&str, &str)]) -> TaskState {
    st.agent.as_mut().unwrap().on_response(&answer(calls), 0.01);
    st
}

fn decide(st: &TaskState) -> Action {
    next(st, &Facts::default(), &llm::LlmConfig::default())
}

#[test]
fn a_fresh_task_thinks_and_a_read_runs_unasked() {
    assert_eq!(
        decide(&task(Permission::Ask)),
        Action::Driver(AgentAction::Think)
    );
    let st = answered(
        task(Permission::Ask),
        &[("read_file", r#"{"path":"a.py"}"#)],
    );
    assert_eq!(
        decide(&st),
        Action::Issue {
            call: ToolCall::ReadFile {
                path: "a.py".into(),
                start_line: 0,
                end_line: 0,
            },
            step: 1,
            purpose: Purpose::Step,
        }
    );
}

#[test]
fn bad_calls_are_answered_with_an_error_observation() {
    for (name, args, says) in [
        ("launch_rockets", "{}", "unknown tool"),
        ("read_file", "not json", "not valid JSON"),
        ("read_file", "{}", "missing required argument"),
    ] {
        let st = answered(task(Permission::Full), &[(name, args)]);
        let Action::Log(events) = decide(&st) else {
            panic!("{name}: expected an observation");
        };
        match events.as_slice() {
            [
                Event::Observation {
                    tool_use_id,
                    text,
                    failed: true,
                },
            ] => {
                assert_eq!(tool_use_id, "u0");
                assert!(text.contains(says), "{name}: {text}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn mutating_calls_wait_for_a_person_under_ask() {
    let cmd = r#"{"command":"make"}"#;
    let st = answered(task(Permission::Ask), &[("run_command", cmd)]);
    let Action::Log(events) = decide(&st) else {
        panic!("expected an approval request");
    };
    assert!(matches!(
        events.as_slice(),
        [
            Event::ApprovalRequested { approval_id: 1, tool_use_id, .. },
            Event::StatusChanged { status: Status::Waiting, .. },
        ] if tool_use_id == "u0"
    ));
    // Asked: wait.
    let mut asked = st.clone();
    let rec = |seq, event| crate::model::event::Record {
        v: crate::model::event::RECORD_VERSION,
        task: TaskId(3),
        seq,
        at_ms: 0,
        event,
    };
    let mut seq = 1;
    for e in events {
        crate::model::state::apply(&mut asked, &rec(seq, e));
        seq += 1;
    }
    assert_eq!(decide(&asked), Action::AwaitDecision);
    // Denied: the model hears why.
    let mut denied = asked.clone();
    crate::model::state::apply(
        &mut denied,
        &rec(
            seq,
            Event::ApprovalDecided {
                approval_id: 1,
                approved: false,
                by: "ana".into(),
                reason: "not now".into(),
                always: false,
            },
        ),
    );
    let Action::Log(events) = decide(&denied) else {
        panic!("expected the denial as an observation");
    };
    assert!(
        matches!(&events[..], [Event::Observation { text, failed: true, .. }] if text.contains("ana denied this call (not now)")),
        "{events:?}"
    );
    // Approved: issued.
    let mut approved = asked;
    crate::model::state::apply(
        &mut approved,
        &rec(
            seq,
            Event::ApprovalDecided {
                approval_id: 1,
                approved: true,
                by: "ana".into(),
                reason: String::new(),
                always: false,
            },
        ),
    );
    assert!(matches!(
        decide(&approved),
        Action::Issue {
            call: ToolCall::RunCommand { .. },
            ..
        }
    ));
    // Full permission: no question asked.
    let st = answered(task(Permission::Full), &[("run_command", cmd)]);
    assert!(matches!(decide(&st), Action::Issue { .. }));
}

/// `st` after each of `events`, appended from sequence number `seq` on.
fn applied(mut st: TaskState, seq: u64, events: Vec<Event>) -> TaskState {
    for (i, event) in events.into_iter().enumerate() {
        let rec = crate::model::event::Record {
            v: crate::model::event::RECORD_VERSION,
            task: TaskId(3),
            seq: seq + i as u64,
            at_ms: 0,
            event,
        };
        crate::model::state::apply(&mut st, &rec);
    }
    st
}

#[test]
fn approved_always_the_same_command_is_not_asked_again_but_another_is() {
    let make = r#"{"command":"make test"}"#;
    let st = answered(task(Permission::Ask), &[("run_command", make)]);
    let Action::Log(asked) = decide(&st) else {
        panic!("expected an approval request");
    };
    let st = applied(st, 1, asked);
    let mut st = applied(
        st,
        3,
        vec![Event::ApprovalDecided {
            approval_id: 1,
            approved: true,
            by: "ana".into(),
            reason: String::new(),
            always: true,
        }],
    );
    assert!(matches!(decide(&st), Action::Issue { .. }));
    // The call ran; the model asks for the same command again, then for another.
    st.agent.as_mut().unwrap().on_observation("u0", "ok", false);
    let again = answered(st.clone(), &[("run_command", make)]);
    assert!(
        matches!(decide(&again), Action::Issue { .. }),
        "the same command was asked again: {:?}",
        decide(&again)
    );
    for other in [
        r#"{"command":"make test; rm -rf ~"}"#,
        r#"{"command":"make test","cwd":"sub"}"#,
    ] {
        let st = answered(st.clone(), &[("run_command", other)]);
        assert!(
            matches!(decide(&st), Action::Log(ref e) if matches!(e[0], Event::ApprovalRequested { .. })),
            "{other} ran unasked"
        );
    }
    // A plain approval stands for that one call only.
    let st = answered(task(Permission::Ask), &[("run_command", make)]);
    let Action::Log(asked) = decide(&st) else {
        panic!("expected an approval request");
    };
    let mut st = applied(
        applied(st, 1, asked),
        3,
        vec![Event::ApprovalDecided {
            approval_id: 1,
            approved: true,
            by: "ana".into(),
            reason: String::new(),
            always: false,
        }],
    );
    st.agent.as_mut().unwrap().on_observation("u0", "ok", false);
    let again = answered(st, &[("run_command", make)]);
    assert!(
        matches!(decide(&again), Action::Log(ref e) if matches!(e[0], Event::ApprovalRequested { .. }))
    );
}

#[test]
fn finish_environment_and_the_guards() {
    let st = answered(
        task(Permission::Full),
        &[("finish", r#"{"summary":"done"}"#)],
    );
    assert!(matches!(
        decide(&st),
        Action::Finish { outcome: Outcome::Finished, reason, before } if reason == "done" && before.len() == 1
    ));
    let st = answered(
        task(Permission::Full),
        &[("request_environment", r#"{"cpu":8,"reason":"big build"}"#)],
    );
    assert!(matches!(
        decide(&st),
        Action::Driver(AgentAction::Environment { req, .. }) if req.cpu == 8
    ));
    // Two replies in a row without a tool call end the task, but not as finished.
    let st = answered(answered(task(Permission::Full), &[]), &[]);
    assert!(matches!(
        decide(&st),
        Action::Finish { outcome: Outcome::Stalled, reason, .. } if reason.contains("stopped calling tools")
    ));
    // The same failing call four times (limit 2 + 2): stuck.
    let mut st = task(Permission::Full);
    for i in 0..4 {
        st = answered(st, &[("run_command", r#"{"command":"false"}"#)]);
        st.agent
            .as_mut()
            .unwrap()
            .on_observation("u0", &format!("exit {i}"), true);
    }
    assert!(matches!(
        decide(&st),
        Action::Finish {
            outcome: Outcome::Stuck,
            ..
        }
    ));
}

#[test]
fn budgets_stop_the_task_with_what_to_give() {
    let mut st = task(Permission::Full);
    st.agent.as_mut().unwrap().spent.usd = 0.6;
    let f = Facts {
        machines_usd: 0.5,
        ..Facts::default()
    };
    let Action::Log(events) = next(&st, &f, &llm::LlmConfig::default()) else {
        panic!("machines count in the money budget");
    };
    assert!(matches!(
        &events[..],
        [Event::StatusChanged { status: Status::BudgetExhausted, reason }]
            if reason.contains("on machines") && reason.contains("a larger budget") && !reason.contains("--")
    ));
    assert_eq!(
        next(&st, &Facts::default(), &llm::LlmConfig::default()),
        Action::Driver(AgentAction::Think)
    );
    // The wall clock is a fact too.
    let mut st = task(Permission::Full);
    st.agent.as_mut().unwrap().limits.wall_ms = 1000;
    let late = Facts {
        now_ms: 5000,
        ..Facts::default()
    };
    assert!(matches!(
        next(&st, &late, &llm::LlmConfig::default()),
        Action::Log(_)
    ));
}

#[test]
fn old_outputs_are_elided_near_the_context_window() {
    let mut st = task(Permission::Full);
    st.agent.as_mut().unwrap().limits.steps = 100;
    // 20 outputs of 40k characters: about 200k tokens, past three quarters of 128k.
    for i in 0..20 {
        st = answered(st, &[("read_file", r#"{"path":"big"}"#)]);
        st.agent.as_mut().unwrap().on_observation(
            "u0",
            &format!("{i}{}", "x".repeat(40_000)),
            false,
        );
    }
    let Action::Log(events) = decide(&st) else {
        panic!("expected an elision");
    };
    assert!(matches!(
        &events[..],
        [Event::ContextElided { upto, bytes_saved }] if *upto > 0 && *bytes_saved > 100_000
    ));
}

#[test]
fn the_first_turn_waits_for_the_overview_and_the_checks_first_result() {
    let mut st = task(Permission::Full);
    st.agent.as_mut().unwrap().surveyed = false;
    assert_eq!(decide(&st), Action::Driver(AgentAction::Survey));
    st.agent
        .as_mut()
        .unwrap()
        .on_surveyed(&["a.py".into()], false, ("", ""), ("", ""));
    assert_eq!(
        decide(&st),
        Action::Driver(AgentAction::Think),
        "no check: the model is asked"
    );
    assert!(
        st.agent.as_ref().unwrap().conversation[0]
            .content
            .contains("a.py")
    );
    // With a check, its first result comes before the first question.
    st.agent.as_mut().unwrap().spec.check = Some(check());
    assert!(matches!(
        decide(&st),
        Action::Issue {
            purpose: Purpose::Acceptance,
            step: 0,
            ..
        }
    ));
    st.last_check = Some(crate::model::state::CheckRun::default());
    assert_eq!(decide(&st), Action::Driver(AgentAction::Think));
    // A task that already asked the model (from before overviews) is not surveyed midway.
    let mut old = answered(task(Permission::Full), &[("read_file", r#"{"path":"a"}"#)]);
    old.agent.as_mut().unwrap().surveyed = false;
    assert!(matches!(decide(&old), Action::Issue { .. }));
}

#[test]
fn a_finish_is_checked_taken_only_alone_and_unverified_without_a_check() {
    let with_check = |mut st: TaskState| {
        st.agent.as_mut().unwrap().spec.check = Some(crate::model::agent::Check {
            command: "make test".into(),
            timeout_ms: 5000,
            source: crate::model::check::CheckSource::Request,
            protect: vec![],
        });
        st.last_check = Some(crate::model::state::CheckRun::default());
        st
    };
    let st = answered(
        with_check(task(Permission::Full)),
        &[("finish", r#"{"summary":"x"}"#)],
    );
    assert_eq!(
        decide(&st),
        Action::Issue {
            call: ToolCall::RunCommand {
                argv: vec!["sh".into(), "-c".into(), "make test".into()],
                timeout_ms: 5000,
                cwd: String::new(),
            },
            step: 1,
            purpose: Purpose::Acceptance,
        }
    );
    // Written with another call: not taken, whatever the check.
    let mut st = answered(
        with_check(task(Permission::Full)),
        &[("run_command", r#"{"command":"make"}"#), ("finish", "{}")],
    );
    st.agent
        .as_mut()
        .unwrap()
        .on_observation("u0", "built", false);
    let Action::Log(events) = decide(&st) else {
        panic!("the finish must be refused");
    };
    assert!(matches!(
        &events[..],
        [Event::Observation { tool_use_id, text, .. }] if tool_use_id == "u1" && text.contains("same reply")
    ));
    // No check: finished, unverified.
    let st = answered(
        task(Permission::Full),
        &[("finish", r#"{"summary":"done"}"#)],
    );
    assert!(matches!(
        decide(&st),
        Action::Finish { outcome: Outcome::Finished, before, .. }
            if matches!(&before[..], [Event::Observation { text, .. }] if text.contains("unverified"))
    ));
}

#[test]
fn loops_of_calls_and_of_errors_are_noted_then_stopped() {
    let round = [
        ("list_files", "{}"),
        ("search", r#"{"pattern":"x"}"#),
        ("run_command", r#"{"command":"true"}"#),
    ];
    let mut st = task(Permission::Full);
    st.agent.as_mut().unwrap().spec.repeat_limit = 3;
    st.agent.as_mut().unwrap().limits.steps = 100;
    let mut noted_at = None;
    for i in 0..12 {
        let (name, args) = round[i % 3];
        st = answered(st, &[(name, args)]);
        let a = st.agent.as_ref().unwrap();
        let u = a.queue.front().unwrap().clone();
        let text = a.with_guard_note(&u, "same".into(), false);
        if noted_at.is_none() && text.contains("round in circles") {
            noted_at = Some(i + 1);
        }
        st.agent
            .as_mut()
            .unwrap()
            .on_observation("u0", &text, false);
        if st.agent.as_ref().unwrap().stuck().is_some() {
            assert_eq!(i + 1, 12, "stopped after four rounds of three");
            break;
        }
    }
    assert_eq!(noted_at, Some(9), "told after three rounds of three");
    assert!(
        st.agent
            .as_ref()
            .unwrap()
            .stuck()
            .unwrap()
            .contains("3 calls")
    );
    // Different calls, the same two errors in turn: a loop of errors.
    let mut st = task(Permission::Full);
    st.agent.as_mut().unwrap().limits.steps = 100;
    for i in 0..8 {
        st = answered(st, &[("read_file", &format!(r#"{{"path":"f{i}"}}"#))]);
        let err = if i % 2 == 0 {
            "error: no such file"
        } else {
            "error: denied"
        };
        st.agent.as_mut().unwrap().on_observation("u0", err, true);
    }
    let why = st
        .agent
        .as_ref()
        .unwrap()
        .stuck()
        .expect("a loop of errors stops the task");
    assert!(why.contains("errors in turn"), "{why}");
}

#[test]
fn after_the_model_changes_files_the_check_runs_before_its_next_turn() {
    let mut st = answered(
        task(Permission::Full),
        &[("write_file", r#"{"path":"a.py","content":"x"}"#)],
    );
    st.agent.as_mut().unwrap().spec.check = Some(check());
    st.last_check = Some(crate::model::state::CheckRun::default());
    st.agent
        .as_mut()
        .unwrap()
        .on_observation("u0", "wrote 1 bytes to a.py", false);
    assert!(matches!(
        decide(&st),
        Action::Issue {
            purpose: Purpose::Acceptance,
            step: 1,
            ..
        }
    ));
    // Its run is in: the model is asked.
    let a = st.agent.as_mut().unwrap();
    a.changed_since_check = false;
    assert_eq!(decide(&st), Action::Driver(AgentAction::Think));
    // No check: nothing to run.
    let mut st = answered(
        task(Permission::Full),
        &[("write_file", r#"{"path":"a.py","content":"x"}"#)],
    );
    st.agent
        .as_mut()
        .unwrap()
        .on_observation("u0", "wrote 1 bytes to a.py", false);
    assert_eq!(decide(&st), Action::Driver(AgentAction::Think));
}

#[test]
fn a_failing_check_after_a_pass_undoes_and_a_model_that_stops_on_a_pass_is_finished_for() {
    let mut st = answered(
        task(Permission::Full),
        &[("write_file", r#"{"path":"a.py","content":"x"}"#)],
    );
    st.agent.as_mut().unwrap().spec.check = Some(check());
    st.last_check = Some(crate::model::state::CheckRun::default());
    let run = |passed| crate::model::state::CheckRun {
        passed,
        ..Default::default()
    };
    let a = st.agent.as_mut().unwrap();
    a.on_observation("u0", "wrote 1 bytes to a.py", false);
    a.on_barrier("pass");
    a.on_check_run(&run(true));
    assert_eq!(a.passed_root, "pass");
    // The model changes it again and the check fails: undone before its next turn.
    a.on_response(&answer(&[("write_file", r#"{"path":"a.py"}"#)]), 0.0);
    a.on_observation("u0", "wrote 1 bytes to a.py", false);
    a.on_barrier("broken");
    a.on_check_run(&run(false));
    assert!(a.undo_due);
    assert_eq!(
        decide(&st),
        Action::Driver(AgentAction::UndoChanges { to_start: false })
    );
    let a = st.agent.as_mut().unwrap();
    a.on_changes_undone(
        &["a.py".into()],
        &[],
        "`a.py` (the whole file):\n```\nx\n```",
    );
    a.on_barrier("pass");
    assert!(!a.undo_due && a.check_passes && !a.changed_since_check);
    let told = &a.conversation.last().unwrap().content;
    assert!(
        told.contains("a.py is back") && told.contains("```\nx\n```"),
        "{told}"
    );
    assert_eq!(decide(&st), Action::Driver(AgentAction::Think));
    // The model stops calling tools there: the brain calls `finish` for it, once.
    let a = st.agent.as_mut().unwrap();
    a.idle_replies = 2;
    assert_eq!(
        decide(&st),
        Action::Log(vec![Event::FinishedForModel {
            why: "stopped calling tools".into()
        }])
    );
    let a = st.agent.as_mut().unwrap();
    a.on_concluded("stopped calling tools");
    assert_eq!(a.queue.front().map(|u| u.name.as_str()), Some("finish"));
    assert!(matches!(
        decide(&st),
        Action::Issue {
            purpose: Purpose::Acceptance,
            ..
        }
    ));
    // Its check failed (say the check is flaky): the task ends as the model left it.
    let a = st.agent.as_mut().unwrap();
    a.queue.clear();
    assert!(!a.holds_a_pass());
    assert!(matches!(
        decide(&st),
        Action::Finish {
            outcome: Outcome::Stalled,
            ..
        }
    ));
    // Out of steps on a version that passed: finished for, too.
    let mut st2 = st.clone();
    let a = st2.agent.as_mut().unwrap();
    a.idle_replies = 0;
    a.concluded_on.clear();
    a.spent.steps = a.limits.steps;
    assert_eq!(
        decide(&st2),
        Action::Log(vec![Event::FinishedForModel {
            why: "ran out of its budget".into()
        }])
    );
    // A version the check has not seen (a command changed it) is checked once more, the
    // last change may be the fix; when it fails there, it goes back to the version that
    // passed, as after any change.
    st2.agent.as_mut().unwrap().on_barrier("other");
    assert!(matches!(
        decide(&st2),
        Action::Issue {
            purpose: Purpose::Acceptance,
            ..
        }
    ));
    let a = st2.agent.as_mut().unwrap();
    a.on_check_run(&run(false));
    a.on_barrier("other");
    assert_eq!(
        decide(&st2),
        Action::Driver(AgentAction::UndoChanges { to_start: false })
    );
    // On a version that did not pass and that the check saw, it stops as before.
    let a = st2.agent.as_mut().unwrap();
    a.undo_due = false;
    a.passed_root.clear();
    assert!(
        matches!(decide(&st2), Action::Log(ref e) if matches!(e[0], Event::StatusChanged { .. }))
    );
}

#[test]
fn files_made_since_the_pass_stay_and_the_check_runs_again_only_once() {
    let mut a = AgentState::new(spec(Permission::Full), "goal", 0);
    a.spec.check = Some(check());
    a.on_changes_undone(&["a.py".into()], &["new.py".into()], "");
    assert!(a.changed_since_check && !a.check_passes);
    assert!(
        a.conversation
            .last()
            .unwrap()
            .content
            .contains("still there: new.py")
    );
    a.on_changes_undone(&[], &["new.py".into()], "");
    assert!(
        !a.changed_since_check,
        "nothing more written back: no check again"
    );
}

#[test]
fn a_model_stuck_on_its_own_failed_changes_starts_again_from_the_start_once() {
    let mut st = answered(
        task(Permission::Full),
        &[("write_file", r#"{"path":"a.py","content":"x"}"#)],
    );
    st.seed_root = "start".into();
    st.agent.as_mut().unwrap().spec.check = Some(check());
    st.last_check = Some(crate::model::state::CheckRun::default());
    let a = st.agent.as_mut().unwrap();
    a.on_observation("u0", "wrote 1 bytes to a.py", false);
    a.on_barrier("mine");
    a.changed_since_check = false;
    a.idle_replies = 2;
    assert_eq!(
        decide(&st),
        Action::Driver(AgentAction::UndoChanges { to_start: true })
    );
    let a = st.agent.as_mut().unwrap();
    a.on_restarted(
        &["a.py".into()],
        &[],
        "`a.py` (the whole file):\n```\nold\n```",
    );
    a.on_barrier("start");
    assert!(a.restarted && a.idle_replies == 0 && a.recent.is_empty());
    // It begins again from the first message: its failed replies are out of view.
    assert_eq!(a.conversation.len(), 2, "{:?}", a.conversation);
    assert_eq!(a.conversation[0].content, "fix it");
    let told = &a.conversation.last().unwrap().content;
    assert!(
        told.contains("a.py is back as at the start") && told.contains("try a different fix"),
        "{told}"
    );
    assert_eq!(decide(&st), Action::Driver(AgentAction::Think));
    // Only once: stuck again on changed files, it stops.
    let a = st.agent.as_mut().unwrap();
    a.on_barrier("mine again");
    a.idle_replies = 2;
    assert!(matches!(
        decide(&st),
        Action::Finish {
            outcome: Outcome::Stalled,
            ..
        }
    ));
    // Not when a version passed (that one is kept instead).
    let mut fresh = st.clone();
    let a = fresh.agent.as_mut().unwrap();
    a.restarted = false;
    a.passed_root = "passed".into();
    assert!(matches!(decide(&fresh), Action::Finish { .. }));
}

#[test]
fn the_last_change_is_checked_before_the_budget_stops_the_task() {
    // The model's last step wrote the fix: the check runs on it, and a pass is finished for.
    let mut st = answered(
        task(Permission::Full),
        &[("write_file", r#"{"path":"a.py","content":"x"}"#)],
    );
    st.agent.as_mut().unwrap().spec.check = Some(check());
    st.last_check = Some(crate::model::state::CheckRun::default());
    let a = st.agent.as_mut().unwrap();
    a.on_observation("u0", "wrote 1 bytes to a.py", false);
    a.on_barrier("fixed");
    a.spent.steps = a.limits.steps;
    assert!(matches!(
        decide(&st),
        Action::Issue {
            purpose: Purpose::Acceptance,
            ..
        }
    ));
    st.agent
        .as_mut()
        .unwrap()
        .on_check_run(&crate::model::state::CheckRun {
            passed: true,
            ..Default::default()
        });
    assert_eq!(
        decide(&st),
        Action::Log(vec![Event::FinishedForModel {
            why: "ran out of its budget".into()
        }])
    );
}

/// `st` as an attempt (or a lone task) whose model wrote a file on which the check, failing
/// (or passing) before it, now passes.
fn passed_after_a_change(attempt: bool, failed_at_start: bool) -> TaskState {
    let mut st = task(Permission::Full);
    if attempt {
        st.attempt_of = Some(crate::model::attempts::AttemptOf {
            parent: TaskId(2),
            index: 1,
        });
    }
    let run = |passed| crate::model::state::CheckRun {
        passed,
        ..Default::default()
    };
    st.last_check = Some(run(!failed_at_start));
    let a = st.agent.as_mut().unwrap();
    a.spec.check = Some(check());
    // Before the model acted.
    a.on_check_run(&run(!failed_at_start));
    a.on_response(
        &answer(&[("write_file", r#"{"path":"a.py","content":"x"}"#)]),
        0.0,
    );
    a.on_observation("u0", "wrote 1 bytes to a.py", false);
    a.on_barrier("pass");
    a.on_check_run(&run(true));
    st
}

#[test]
fn an_attempt_ends_at_its_first_pass_and_a_lone_task_asks_its_model() {
    // An attempt: the brain finishes for it at once, as the check passed on it.
    let st = passed_after_a_change(true, true);
    assert!(st.agent.as_ref().unwrap().failed_at_start);
    assert_eq!(
        decide(&st),
        Action::Log(vec![Event::FinishedForModel {
            why: ATTEMPT_PASSED.into()
        }])
    );
    // A task of its own: its model hears the pass and decides (the goal may ask for more).
    assert_eq!(
        decide(&passed_after_a_change(false, true)),
        Action::Driver(AgentAction::Think)
    );
    // An attempt whose check passed before it acted: the check guards, the model decides.
    let st = passed_after_a_change(true, false);
    assert!(!st.agent.as_ref().unwrap().failed_at_start);
    assert_eq!(decide(&st), Action::Driver(AgentAction::Think));
}

/// `st` with only the assists named (none: `""`).
fn assisted(mut st: TaskState, names: &str) -> TaskState {
    let choice = crate::model::assists::Choice::Preset(names.into());
    st.agent.as_mut().unwrap().spec.assists =
        Some(crate::model::assists::Assists::from_choice(&choice).unwrap());
    st
}

/// Each decision the loop makes for a model is an assist: with it off, the decision is
/// the model's (or nobody's), and what every model gets stays.
#[test]
fn the_decision_assists_each_change_only_their_own_decision() {
    // After a change: the check runs (check_after_changes), or the model is asked.
    let changed = |names: &str| {
        let mut st = answered(
            assisted(task(Permission::Full), names),
            &[("write_file", r#"{"path":"a.py","content":"x"}"#)],
        );
        st.agent.as_mut().unwrap().spec.check = Some(check());
        st.last_check = Some(crate::model::state::CheckRun::default());
        let a = st.agent.as_mut().unwrap();
        a.on_observation("u0", "wrote 1 bytes to a.py", false);
        st
    };
    assert!(matches!(
        decide(&changed("check_after_changes")),
        Action::Issue {
            purpose: Purpose::Acceptance,
            ..
        }
    ));
    assert_eq!(decide(&changed("none")), Action::Driver(AgentAction::Think));
    // Stalled on changes the check never passed on: restart, or stalled.
    let stalled = |names: &str| {
        let mut st = changed(names);
        st.seed_root = "start".into();
        let a = st.agent.as_mut().unwrap();
        a.on_barrier("mine");
        a.changed_since_check = false;
        a.idle_replies = 2;
        st
    };
    assert_eq!(
        decide(&stalled("restart")),
        Action::Driver(AgentAction::UndoChanges { to_start: true })
    );
    assert!(matches!(
        decide(&stalled("native")),
        Action::Finish {
            outcome: Outcome::Stalled,
            ..
        }
    ));
    // Stalled on a version the check passed on: finished for, or stalled.
    let on_a_pass = |names: &str| {
        let mut st = stalled(names);
        let a = st.agent.as_mut().unwrap();
        a.passed_root = "mine".into();
        st
    };
    assert!(matches!(
        decide(&on_a_pass("finish_for_model")),
        Action::Log(e) if matches!(&e[..], [Event::FinishedForModel { .. }])
    ));
    assert!(matches!(
        decide(&on_a_pass("native")),
        Action::Finish {
            outcome: Outcome::Stalled,
            ..
        }
    ));
    // A failing check after a pass: undone, or the model goes on from there.
    let broken = |names: &str| {
        let mut st = changed(names);
        let a = st.agent.as_mut().unwrap();
        a.passed_root = "pass".into();
        a.on_barrier("broken");
        a.changed_since_check = false;
        a.on_check_run(&crate::model::state::CheckRun::default());
        st
    };
    assert_eq!(
        decide(&broken("undo_regression")),
        Action::Driver(AgentAction::UndoChanges { to_start: false })
    );
    let st = broken("native");
    assert!(!st.agent.as_ref().unwrap().undo_due);
    assert_eq!(decide(&st), Action::Driver(AgentAction::Think));
    // A finish beside another call: refused (finish_alone, on for every model), or taken
    // in its turn.
    let beside = |names: &str| {
        let mut st = answered(
            assisted(task(Permission::Full), names),
            &[("read_file", r#"{"path":"a.py"}"#), ("finish", "{}")],
        );
        st.agent
            .as_mut()
            .unwrap()
            .on_observation("u0", "x = 1", false);
        st
    };
    assert!(matches!(
        decide(&beside("native")),
        Action::Log(e) if matches!(&e[..], [Event::Observation { text, .. }] if text.contains("same reply"))
    ));
    assert!(matches!(
        decide(&beside("none")),
        Action::Finish {
            outcome: Outcome::Finished,
            ..
        }
    ));
    // A task from before assists could be switched has them all.
    let mut legacy = stalled("none");
    legacy.agent.as_mut().unwrap().spec.assists = None;
    assert_eq!(
        decide(&legacy),
        Action::Driver(AgentAction::UndoChanges { to_start: true })
    );
}
