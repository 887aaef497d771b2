//! Snapshots of the complete request a model receives in representative states, in both tool
//! modes: the body an OpenAI-compatible server gets, as JSON, one file per state and mode
//! under `snapshots/`. A change of wording anywhere shows as a diff of these files in review;
//! `UPDATE_EXPECT=1 cargo test -p brain --lib prompt` writes them anew.

use super::{
    BlockNotApplied, CheckAfterChanges, NudgeExample, block_not_applied, calls_not_run,
    check_after_changes, finish_refused, nudge, request,
};
use crate::llm::{self, Response, ToolUse, Usage};
use crate::model::agent::{AgentSpec, AgentState, Budget, Permission};
use crate::model::check::{Check, CheckSource};

fn spec(permission: Permission, check: bool) -> AgentSpec {
    let mut s = AgentSpec::for_test(
        permission,
        Budget {
            steps: 40,
            ..Default::default()
        },
    );
    s.check = check.then(|| Check {
        command: "python3 -m pytest -q".into(),
        timeout_ms: 0,
        source: CheckSource::Request,
        protect: vec![],
    });
    s
}

/// A task at its first turn: the goal with the workspace's overview, its README and root
/// AGENTS.md, and (`check`) the acceptance check named.
fn first_turn(permission: Permission, check: bool) -> AgentState {
    let mut a = AgentState::new(
        spec(permission, check),
        "Make `mean([])` return 0 instead of raising.",
        0,
    );
    a.on_surveyed(
        &[
            "README.md".into(),
            "stats.py".into(),
            "test_stats.py".into(),
        ],
        false,
        ("README.md", "# stats\nSmall statistics helpers.\n"),
        ("AGENTS.md", "Run the tests with `python3 -m pytest -q`.\n"),
    );
    a
}

/// What each reply of these states used.
fn usage() -> Usage {
    Usage {
        prompt_tokens: 100,
        completion_tokens: 20,
    }
}

/// The model's reply calling `name` with `args`, and the result it was shown (with the
/// repeat guard's and the loop detector's notes, as the engine observes it).
fn turn(a: &mut AgentState, id: &str, name: &str, args: &str, result: &str, failed: bool) {
    let call = ToolUse {
        id: id.into(),
        name: name.into(),
        arguments: args.into(),
    };
    let usage = usage();
    a.on_response(&Response::new("", vec![call.clone()], usage), 0.0);
    let shown = a.with_guard_note(&call, result.to_string(), failed);
    a.on_observation(id, &shown, failed);
}

/// The state after a read of a file below a directory with its own AGENTS.md.
fn after_a_read_with_nested_instructions() -> AgentState {
    let mut a = first_turn(Permission::Full, true);
    turn(
        &mut a,
        "c1",
        "read_file",
        r#"{"path":"pkg/stats.py"}"#,
        "     1\tdef mean(xs):\n     2\t    return sum(xs) / len(xs)\n",
        false,
    );
    a.on_instructions_in_view("pkg/AGENTS.md", "Keep functions pure.\n");
    a
}

/// The state after an edit the acceptance check still fails on, with the code it points at.
fn after_a_failing_check() -> AgentState {
    let mut a = first_turn(Permission::Full, true);
    turn(
        &mut a,
        "c1",
        "edit_file",
        r#"{"path":"stats.py","old":"return sum(xs) / len(xs)","new":"return sum(xs) / max(len(xs), 1)"}"#,
        "edited stats.py",
        false,
    );
    a.on_check_after_changes(&check_after_changes(
        "python3 -m pytest -q",
        CheckAfterChanges::StillFails(
            "exit code 1\nFAILED test_stats.py::test_empty - assert 0.0 == 0",
        ),
    ));
    a
}

/// After a `finish` the acceptance check refused.
fn after_a_refused_finish() -> AgentState {
    let mut a = first_turn(Permission::Full, true);
    turn(
        &mut a,
        "f1",
        "finish",
        r#"{"summary":"mean([]) returns 0"}"#,
        &finish_refused(
            "python3 -m pytest -q",
            "exit code 1\nFAILED test_stats.py::test_empty - ZeroDivisionError",
        ),
        true,
    );
    a
}

/// A long conversation whose old tool outputs were elided to fit the context window.
fn with_old_outputs_elided() -> AgentState {
    let mut a = first_turn(Permission::Full, false);
    for i in 1..=4 {
        turn(
            &mut a,
            &format!("c{i}"),
            "run_command",
            r#"{"command":"python3 -m pytest -q"}"#,
            &format!("run {i}: {}", "x".repeat(200)),
            true,
        );
    }
    a.elide(4);
    a
}

/// The text of `stats.py` as the model is shown it after an undo or a restart.
const SHOWN: &str = "stats.py:\n     1\tdef mean(xs):\n     2\t    return sum(xs) / len(xs)\n";

/// After changes that broke a check that had passed were undone.
fn after_an_undo() -> AgentState {
    let mut a = after_a_failing_check();
    a.on_changes_undone(&["stats.py".into()], &[], SHOWN);
    a
}

/// After the model stopped making progress and its changes were undone to the start.
fn after_a_restart() -> AgentState {
    let mut a = after_a_failing_check();
    a.on_restarted(&["stats.py".into()], &["notes.txt".into()], SHOWN);
    a
}

/// After a reply that only talked (no call), and one whose call could not be read.
fn after_replies_without_a_call() -> AgentState {
    let mut a = first_turn(Permission::Full, true);
    let usage = usage();
    a.on_response(
        &Response::new("I will change stats.py to return 0.", vec![], usage),
        0.0,
    );
    let mut bad = Response::new("", vec![], usage);
    bad.malformed_calls = vec![r#"{"tool": "read_file", "arguments": {"path": }"#.into()];
    a.on_response(&bad, 0.0);
    a
}

/// After a reply that wrote its fix as a block of code no file in view could take, and made no
/// call: the reason is the placer's own (`edits::resolve`).
fn after_an_unplaceable_block() -> AgentState {
    use crate::model::edits::{Resolved, resolve};
    let mut a = first_turn(Permission::Full, true);
    let block = llm::CodeBlock {
        path: None,
        lang: "python".into(),
        body: "def median(xs):\n    return sorted(xs)[len(xs) // 2]\n".into(),
    };
    let texts = std::collections::BTreeMap::from([(
        "stats.py".to_string(),
        "def mean(xs):\n    return sum(xs) / len(xs)\n".to_string(),
    )]);
    let Resolved::NotApplied(why) = resolve(&block, &texts, &|_| false) else {
        panic!("a block that defines what no file holds is not placed");
    };
    let usage = usage();
    let mut r = Response::new(
        "Here is the fix:\n```python\ndef median(xs):\n    return sorted(xs)[len(xs) // 2]\n```",
        vec![],
        usage,
    );
    r.malformed_calls = vec![block_not_applied(BlockNotApplied::Alone {
        why: &why,
        files: &["stats.py"],
    })];
    a.on_response(&r, 0.0);
    a
}

/// After the task moved to another worker with a call in flight.
fn after_a_move() -> AgentState {
    let mut a = first_turn(Permission::Full, false);
    turn(
        &mut a,
        "c1",
        "run_command",
        r#"{"command":"ls"}"#,
        "README.md\nstats.py\ntest_stats.py\n",
        false,
    );
    a.on_moved("w-laptop", "w-cloud", 1);
    a
}

/// The model going round in circles: the same edit and the same failing run, over and over.
fn going_round_in_circles() -> AgentState {
    let mut a = first_turn(Permission::Full, false);
    for round in 0..3 {
        turn(
            &mut a,
            &format!("e{round}"),
            "write_file",
            r#"{"path":"stats.py","content":"def mean(xs):\n    return 0\n"}"#,
            "wrote stats.py (24 bytes)",
            false,
        );
        turn(
            &mut a,
            &format!("r{round}"),
            "run_command",
            r#"{"command":"python3 -m pytest -q"}"#,
            "exit code 1\nFAILED test_stats.py::test_mean - assert 0 == 2",
            true,
        );
    }
    a
}

/// A task that may ask for another machine, and one whose request for one was refused
/// (the tool is withdrawn).
fn may_move(refused: bool) -> AgentState {
    let mut a = first_turn(Permission::Full, false);
    a.environment_refused = refused;
    a
}

/// Each state by name, and whether its task can move.
fn states() -> Vec<(&'static str, AgentState, bool)> {
    vec![
        ("first_turn", first_turn(Permission::Full, true), false),
        ("first_turn_ask", first_turn(Permission::Ask, false), false),
        (
            "first_turn_read_only",
            first_turn(Permission::ReadOnly, false),
            false,
        ),
        (
            "after_read_nested_agents_md",
            after_a_read_with_nested_instructions(),
            false,
        ),
        ("after_failing_check", after_a_failing_check(), false),
        ("after_refused_finish", after_a_refused_finish(), false),
        ("old_outputs_elided", with_old_outputs_elided(), false),
        ("after_undo", after_an_undo(), false),
        ("after_restart", after_a_restart(), false),
        (
            "replies_without_a_call",
            after_replies_without_a_call(),
            false,
        ),
        ("after_move", after_a_move(), true),
        (
            "after_unplaceable_block",
            after_an_unplaceable_block(),
            false,
        ),
        ("going_round_in_circles", going_round_in_circles(), false),
        ("may_ask_for_a_machine", may_move(false), true),
        ("machine_request_withdrawn", may_move(true), true),
    ]
}

#[test]
fn the_whole_request_in_each_state_and_tool_mode_is_as_snapshotted() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/model/prompt/snapshots");
    for (name, a, can_move) in states() {
        for (mode, text) in [("native", false), ("text", true)] {
            let req = request(&a, can_move, None);
            let how = if text {
                llm::ToolsSent::Text
            } else {
                llm::ToolsSent::Native
            };
            let body = llm::openai_body("qwen2.5-coder-1.5b", &super::as_sent(&req, how));
            let got = serde_json::to_string_pretty(&body).unwrap() + "\n";
            expect_test::expect_file![dir.join(format!("{name}.{mode}.json"))].assert_eq(&got);
        }
    }
}

#[test]
fn request_environment_is_offered_only_where_the_task_can_move() {
    let a = first_turn(Permission::Full, false);
    let names = |can_move| -> Vec<String> {
        request(&a, can_move, None)
            .tools
            .into_iter()
            .map(|t| t.name)
            .collect()
    };
    assert!(names(true).iter().any(|n| n == "request_environment"));
    assert!(!names(false).iter().any(|n| n == "request_environment"));
    let mut refused = a.clone();
    refused.environment_refused = true;
    assert!(
        !request(&refused, true, None)
            .tools
            .iter()
            .any(|t| t.name == "request_environment")
    );
}

/// The words of `prompt::VERSION`: the version, and a digest of every snapshot rendered with
/// it. A change of wording changes the snapshots, and so the digest; raise `VERSION` with it,
/// so `brain task prompt` can say which words a request that no longer renders alike was
/// sent with. (A new state changes the digest too: raising the version costs nothing.)
const WORDS: (u32, &str) = (2, "6a1cce44b2f04aa9e4ee7dabddab84e5");

#[test]
fn the_words_version_is_raised_when_the_words_change() {
    use sha2::Digest;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/model/prompt/snapshots");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut h = sha2::Sha256::new();
    for n in &names {
        h.update(n.as_bytes());
        h.update([0]);
        h.update(std::fs::read(dir.join(n)).unwrap());
        h.update([0]);
    }
    let digest = hex::encode(&h.finalize()[..16]);
    assert!(names.len() >= 28, "{names:?}");
    let next = super::VERSION.max(WORDS.0 + 1);
    assert_eq!(
        (super::VERSION, digest.as_str()),
        WORDS,
        "the words a model reads changed (the snapshots under {}): raise prompt::VERSION to {next} and set WORDS in model/prompt/tests.rs to ({next}, \"{digest}\")",
        dir.display(),
    );
}

/// The nudge with the example of a task without a check.
fn nudge_for(reply: &str) -> String {
    nudge(reply, NudgeExample::ReadFile, true)
}

#[test]
fn the_nudge_shows_real_calls_that_parse_and_says_code_in_a_reply_is_written_nowhere() {
    let plain = nudge_for("The goal is met.");
    assert!(!plain.contains("not written to any file"), "{plain}");
    assert!(
        !plain.contains("NAME") && !plain.contains("{...}"),
        "no placeholder to copy: {plain}"
    );
    let with_code = nudge_for("Fixed:\n```python\ndef f():\n    return 1\n```");
    assert!(with_code.contains("code in your reply is not written to any file"));
    assert!(with_code.contains(super::EDIT_FORMAT), "{with_code}");
    let described = nudge_for("The bug is the + 1: it should be len(xs).");
    assert!(
        described.contains("described a change without making it"),
        "{described}"
    );
    // The examples in it are calls the parser reads, the way the model should copy them.
    let p = llm::parse_reply(&with_code, 0);
    let names: Vec<&str> = p.calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["read_file", "finish"], "{with_code}");
}

#[test]
fn a_nudge_can_show_the_step_worth_copying() {
    let n = nudge(
        "I fixed it.",
        NudgeExample::RunCheck("python3 test_x.py"),
        true,
    );
    let plain = nudge("```py\nx = 1\n```", NudgeExample::ReadFile, false);
    assert!(
        !plain.contains("SEARCH") && plain.contains("`write_file`"),
        "{plain}"
    );
    let p = llm::parse_reply(&n, 0);
    assert_eq!(p.calls[0].name, "run_command", "{n}");
    assert_eq!(p.calls[0].arguments, r#"{"command":"python3 test_x.py"}"#);
    assert!(n.contains("For example, to run the check:"), "{n}");
}

#[test]
fn several_calls_in_a_text_reply_are_told_which_one_ran() {
    let t = calls_not_run("run_command", &["read_file".into(), "finish".into()]);
    assert!(
        t.starts_with(
            "Only the first call of your reply (run_command) was run; the other 2 (read_file, finish) were not."
        ),
        "{t}"
    );
}
