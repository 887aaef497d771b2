//! The agent state's tests: the repeat guard, budgets, nudges, stalls and cycles.

use super::*;
use crate::llm::{Response, Usage};

fn spec() -> AgentSpec {
    AgentSpec::for_test(
        Permission::Full,
        Budget {
            steps: 3,
            ..Default::default()
        },
    )
}

fn call(id: &str, name: &str, args: &str) -> Response {
    let call = ToolUse {
        id: id.into(),
        name: name.into(),
        arguments: args.into(),
    };
    let usage = Usage {
        prompt_tokens: 10,
        completion_tokens: 5,
    };
    Response::new("", vec![call], usage)
}

#[test]
fn a_check_file_names_its_command_and_what_it_protects() {
    let (cmd, protect) = check_from_file(
        "# how this repository is checked\nprotect tests/**\n\npython3 -m pytest -q\nprotect conftest.py\nignored second command\n",
    )
    .unwrap();
    assert_eq!(cmd, "python3 -m pytest -q");
    assert_eq!(protect, ["tests/**", "conftest.py"]);
    assert_eq!(check_from_file("# nothing\nprotect x\n"), None);
    let c = Check {
        command: cmd,
        timeout_ms: 0,
        source: crate::model::check::CheckSource::Repository,
        protect,
    };
    assert!(is_protected(&c, "tests/test_a.py"));
    assert!(is_protected(&c, "./conftest.py"));
    assert!(!is_protected(&c, "src/conftest.py"), "globs are anchored");
    assert!(!is_protected(&c, "src/app.py"));
}

#[test]
fn the_repeat_guard_counts_identical_failures_in_a_row() {
    let mut a = AgentState::new(spec(), "goal", 0);
    for (i, failed) in [(1, true), (2, true), (3, false), (4, true), (5, true)] {
        a.on_response(
            &call(&format!("c{i}"), "run_command", "{\"command\":\"x\"}"),
            0.0,
        );
        a.on_observation(&format!("c{i}"), "out", failed);
    }
    assert_eq!(a.repeat.as_ref().map(|r| r.1), Some(2));
    assert!(a.stuck().is_none());
    for i in 6..8 {
        a.on_response(
            &call(&format!("c{i}"), "run_command", "{\"command\":\"x\"}"),
            0.0,
        );
        a.on_observation(&format!("c{i}"), "out", true);
    }
    assert!(a.stuck().is_some(), "limit 2 + 2 more identical failures");
    // 1 goal + 7 × (assistant + tool)
    assert_eq!(a.conversation.len(), 15);
    assert_eq!(a.spent.tokens, 7 * 15);
}

/// Runs one call: the model's reply, what it was told, and the barrier after it.
fn turn(a: &mut AgentState, id: &str, name: &str, args: &str, told: &str, root: &str) {
    a.on_response(&call(id, name, args), 0.0);
    a.on_observation(id, told, name == "finish");
    a.on_barrier(root);
}

#[test]
fn a_write_that_changes_nothing_and_a_refused_finish_are_a_cycle_whatever_the_bytes() {
    let mut a = AgentState::new(spec(), "goal", 0);
    a.spec.budget.steps = 0;
    a.limits.steps = 0;
    a.on_barrier("r0");
    let refused = |secs: u32| {
        format!("not done: the check failed.\nFAIL: test_mean\nRan 2 tests in 0.00{secs}s")
    };
    // Rounds of `round` until the guard stops the task (at most six).
    let until_stuck = |a: &mut AgentState, round: &dyn Fn(&mut AgentState, usize)| {
        (0..6)
            .take_while(|i| {
                round(a, *i);
                a.stuck().is_none()
            })
            .count()
            + 1
    };
    // The same wrong file each time, written with different spacing, then `finish`.
    let rounds = until_stuck(&mut a, &|a, i| {
        let args = format!(
            "{{\"path\": \"stats.py\",{} \"content\": \"x\"}}",
            " ".repeat(i)
        );
        let wrote = "wrote stats.py (1 bytes)";
        turn(a, &format!("w{i}"), "write_file", &args, wrote, "r1");
        turn(
            a,
            &format!("f{i}"),
            "finish",
            "{}",
            &refused(i as u32),
            "r1",
        );
    });
    let why = a.stuck().expect("a two-call cycle is stuck");
    assert!(why.contains("2 calls"), "{why}");
    assert_eq!(
        rounds, 3,
        "noted after two rounds (limit 2), stopped after the third"
    );

    // Three calls: read, a write that changes nothing, a refused finish.
    let mut a = AgentState::new(spec(), "goal", 0);
    a.limits.steps = 0;
    a.on_barrier("r0");
    let rounds = until_stuck(&mut a, &|a, i| {
        let read = "{\"path\":\"stats.py\"}";
        turn(a, &format!("r{i}"), "read_file", read, "1 | x", "r0");
        let edit = "{\"path\":\"stats.py\",\"old_string\":\"x\",\"new_string\":\"x\"}";
        turn(
            a,
            &format!("e{i}"),
            "edit_file",
            edit,
            "edited stats.py",
            "r0",
        );
        turn(
            a,
            &format!("f{i}"),
            "finish",
            "{}",
            &refused(i as u32),
            "r0",
        );
    });
    let why = a.stuck().expect("a three-call cycle is stuck");
    assert!(why.contains("3 calls"), "{why}");
    assert_eq!(rounds, 3);

    // Writes that do change the workspace are progress, not a cycle.
    let mut a = AgentState::new(spec(), "goal", 0);
    a.limits.steps = 0;
    for i in 0..8 {
        let root = format!("r{i}");
        turn(
            &mut a,
            &format!("w{i}"),
            "write_file",
            "{}",
            "wrote stats.py (1 bytes)",
            &root,
        );
        turn(&mut a, &format!("f{i}"), "finish", "{}", &refused(1), &root);
    }
    assert_eq!(a.stuck(), None);
}

#[test]
fn budgets_stop_and_resume_raises_them() {
    let mut a = AgentState::new(spec(), "goal", 0);
    for i in 0..3 {
        a.on_response(&call(&format!("c{i}"), "finish", "{}"), 0.0);
    }
    assert!(a.exhausted(1).unwrap().contains("step budget"));
    assert!(a.raised(Budget::default()).is_err());
    let new = a
        .raised(Budget {
            steps: 2,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(new.steps, 5);
    a.limits = new;
    assert_eq!(a.exhausted(1), None);
}

#[test]
fn a_reply_without_a_tool_call_is_nudged_and_elision_keeps_recent_outputs() {
    let mut a = AgentState::new(spec(), "goal", 0);
    let mut r = call("c1", "read_file", "{}");
    r.message.tool_calls.clear();
    r.message.content = "thinking".into();
    a.on_response(&r, 0.0);
    assert_eq!(a.idle_replies, 1);
    assert_eq!(a.conversation.last().unwrap().content, NUDGE);
    a.on_response(&call("c2", "read_file", "{}"), 0.0);
    a.on_observation("c2", &"x".repeat(500), false);
    a.on_response(&call("c3", "read_file", "{}"), 0.0);
    a.on_observation("c3", &"y".repeat(500), false);
    a.elide(6);
    assert_eq!(a.conversation[4].content, ELIDED);
    assert_eq!(a.conversation[6].content.len(), 500);
}

#[test]
fn a_model_alternating_unreadable_calls_and_no_calls_is_stalled_on_the_third_reply() {
    let idle = || {
        let mut r = call("x", "read_file", "{}");
        r.message.tool_calls.clear();
        r.message.content = "I fixed it.".into();
        r
    };
    let unreadable = || {
        let mut r = idle();
        r.malformed_calls = vec!["not JSON: {\"tool\": \"NAME\", ...}".into()];
        r
    };
    // No call twice: the nudge did not help.
    let mut a = AgentState::new(spec(), "goal", 0);
    a.on_response(&idle(), 0.0);
    assert!(!a.stalled());
    a.on_response(&idle(), 0.0);
    assert!(a.stalled());
    // No call, then a try that cannot be read, then no call: stalled at the third.
    let mut a = AgentState::new(spec(), "goal", 0);
    a.on_response(&idle(), 0.0);
    a.on_response(&unreadable(), 0.0);
    assert!(
        !a.stalled(),
        "its last reply tried to call: one more chance"
    );
    assert!(
        a.conversation
            .last()
            .unwrap()
            .content
            .contains("could not be read")
    );
    a.on_response(&idle(), 0.0);
    assert!(a.stalled());
    // A call that runs starts the count again.
    let mut a = AgentState::new(spec(), "goal", 0);
    a.on_response(&unreadable(), 0.0);
    a.on_response(&call("c1", "read_file", "{}"), 0.0);
    assert_eq!(a.idle_replies, 0);
}

/// The spec with a check, `python3 test_x.py`.
fn checked_spec() -> AgentSpec {
    let mut s = spec();
    s.check = Some(Check {
        command: "python3 test_x.py".into(),
        timeout_ms: 0,
        source: crate::model::check::CheckSource::Request,
        protect: vec![],
    });
    s
}

#[test]
fn a_change_asks_for_the_check_and_talk_after_a_passing_check_is_a_finish() {
    let s = checked_spec();
    let talk = |text: &str| {
        let mut r = call("x", "read_file", "{}");
        r.message.tool_calls.clear();
        r.message.content = text.into();
        r
    };
    let mut a = AgentState::new(s.clone(), "goal", 0);
    // A read changes nothing; a failed write changes nothing; a write does.
    a.on_response(&call("r", "read_file", "{\"path\":\"x.py\"}"), 0.0);
    a.on_observation("r", "text", false);
    assert!(!a.changed_since_check);
    a.on_response(&call("w", "write_file", "{\"path\":\"x.py\"}"), 0.0);
    a.on_observation("w", "refused: outside the workspace", true);
    assert!(!a.changed_since_check);
    a.on_response(&call("e", "edit_file", "{\"path\":\"x.py\"}"), 0.0);
    a.on_observation("e", "edited x.py", false);
    assert!(a.changed_since_check);

    // While the check fails, talk is nudged, never a finish.
    a.changed_since_check = false;
    a.check_passes = false;
    a.on_response(&talk("It should work now."), 0.0);
    assert!(a.queue.is_empty());
    assert_eq!(a.idle_replies, 1);

    // Once it passes, talk is the finish, with the talk as its summary, and the assistant
    // message carries the call (its observation has a call to answer).
    a.check_passes = true;
    a.on_response(&talk("Fixed the divisor."), 0.0);
    let u = a.queue.front().expect("a finish").clone();
    assert_eq!(u.name, "finish");
    assert!(
        u.arguments.contains("Fixed the divisor."),
        "{}",
        u.arguments
    );
    assert_eq!(a.idle_replies, 0);
    assert_eq!(a.reply_calls, 1);
    let last = a.conversation.last().unwrap();
    assert_eq!(last.tool_calls, std::slice::from_ref(&u));

    // Any other call after the pass means the model went on: talk later is nudged again.
    let mut a = AgentState::new(s, "goal", 0);
    a.check_passes = true;
    a.on_response(&call("r", "run_command", "{\"command\":\"ls\"}"), 0.0);
    a.on_observation("r", "x.py", false);
    assert!(!a.check_passes);
    a.on_response(&talk("Done."), 0.0);
    assert!(a.queue.is_empty());

    // A check that passes before the model acted is not a finish for talk: the goal may
    // ask for more than the check. One that passes after it acted is.
    let s2 = checked_spec();
    let mut a = AgentState::new(s2, "goal", 0);
    let passed = CheckRun {
        passed: true,
        ..CheckRun::default()
    };
    a.on_check_run(&passed);
    assert!(!a.check_passes);
    assert!(a.conversation[0].content.contains("it passes already"));
    a.on_response(&talk("Let me look first."), 0.0);
    assert!(a.queue.is_empty(), "nudged, not finished");
    a.on_response(&call("w", "write_file", "{\"path\":\"x.py\"}"), 0.0);
    a.on_observation("w", "wrote", false);
    assert!(a.changed_since_check);
    a.on_check_run(&passed);
    assert!(a.check_passes && !a.changed_since_check);
    a.on_response(&talk("Done."), 0.0);
    assert_eq!(a.queue.front().map(|u| u.name.as_str()), Some("finish"));

    // The model ran the check itself after its change: not run again; its pass counts.
    let s3 = checked_spec();
    let mut a = AgentState::new(s3, "goal", 0);
    a.on_response(&call("w", "write_file", "{\"path\":\"x.py\"}"), 0.0);
    a.on_observation("w", "wrote", false);
    let run = "{\"command\":\" python3 test_x.py\",\"cwd\":\".\"}";
    a.on_response(&call("c", "run_command", run), 0.0);
    a.on_observation("c", "exit code 1", true);
    assert!(!a.changed_since_check && !a.check_passes);
    a.on_response(&call("w2", "write_file", "{\"path\":\"x.py\"}"), 0.0);
    a.on_observation("w2", "wrote", false);
    a.on_response(&call("c2", "run_command", run), 0.0);
    a.on_observation("c2", "OK", false);
    assert!(!a.changed_since_check && a.check_passes);
    // Another command, or the check elsewhere, is not the check.
    a.on_response(&call("w3", "write_file", "{\"path\":\"x.py\"}"), 0.0);
    a.on_observation("w3", "wrote", false);
    let elsewhere = "{\"command\":\"python3 test_x.py\",\"cwd\":\"sub\"}";
    a.on_response(&call("c3", "run_command", elsewhere), 0.0);
    a.on_observation("c3", "OK", false);
    assert!(a.changed_since_check && !a.check_passes);

    // Without a check there is nothing to judge talk by.
    let mut a = AgentState::new(spec(), "goal", 0);
    a.check_passes = true;
    a.on_response(&talk("Done."), 0.0);
    assert!(a.queue.is_empty());
}

#[test]
fn a_failing_command_run_again_on_the_same_files_is_told_at_once() {
    let mut a = AgentState::new(spec(), "goal", 0);
    a.spec.repeat_limit = 3;
    a.spec.budget.steps = 0;
    a.limits.steps = 0;
    a.on_barrier("r0");
    let args = r#"{"command": "python3 test_freq.py"}"#;
    let failing = |secs: u32| {
        format!("exit code 1\nNameError: name 're' is not defined\nRan 2 tests in 0.00{secs}s")
    };
    // Runs the command; what the model is told.
    let run = |a: &mut AgentState, id: &str, told: &str, root: &str| -> String {
        a.on_response(&call(id, "run_command", args), 0.0);
        let u = a.queue.front().unwrap().clone();
        let text = a.with_guard_note(&u, told.to_string(), true);
        a.on_observation(id, &text, true);
        a.on_barrier(root);
        text
    };
    const SAID: &str = "no file has changed since you last ran this command";
    assert!(
        !run(&mut a, "c1", &failing(1), "r1").contains(SAID),
        "the first run"
    );
    let again = run(&mut a, "c2", &failing(2), "r1");
    assert!(
        again.contains(SAID),
        "the same files, the same failure: {again}"
    );
    // A change in between: running it again is how to see what the change did.
    turn(
        &mut a,
        "w",
        "write_file",
        r#"{"path": "freq.py", "content": "x"}"#,
        "wrote",
        "r2",
    );
    assert!(!run(&mut a, "c3", &failing(3), "r2").contains(SAID));
    // The same files, another result (a flaky test): not the same.
    assert!(!run(&mut a, "c4", "exit code 1\nAssertionError", "r2").contains(SAID));
}

#[test]
fn a_refused_request_for_another_machine_withdraws_the_tool() {
    let mut a = AgentState::new(spec(), "goal", 0);
    let env = r#"{"cpu": 4, "reason": "more memory"}"#;
    a.on_response(&call("e1", "request_environment", env), 0.0);
    a.on_observation("e1", "moved to worker w-2 (4 cpu)", false);
    assert!(!a.environment_refused, "a move leaves it offered");
    a.on_response(&call("e2", "request_environment", env), 0.0);
    a.on_observation("e2", &format!("{ALREADY_FITS}: worker w-2"), false);
    assert!(a.environment_refused, "this machine fits already");
    a.environment_refused = false;
    a.on_response(&call("e2", "request_environment", env), 0.0);
    a.on_observation("e2", "error: no environment: nothing fits", true);
    assert!(a.environment_refused);
    // A snapshot of the state keeps it.
    let back: AgentState = serde_json::from_value(serde_json::to_value(&a).unwrap()).unwrap();
    assert!(back.environment_refused);
}
