//! A result a user can trust: an acceptance check decides whether a `finish` is done, a
//! `finish` written among other calls is not taken, loops are noticed and stopped, a model
//! that stops calling tools is not reported as finished, and what a task reports says
//! whether it was verified. The real brain and worker, and a fake LLM speaking the real
//! wire formats.

use std::time::Duration;

use serde_json::{Value, json};
use testkit::fake_llm::{FakeLlm, FakeReply, FakeRequest};
use testkit::git_server::init_repo;
use testkit::{BrainOptions, Cluster, assert_failed_saying};

/// The key the brain knows (from its config): it must never appear outside the fake's
/// request headers.
const KEY: &str = "sk-test-SECRET-4b7e1d9c2a";

fn cluster(llm: &FakeLlm) -> Cluster {
    Cluster::start_with(BrainOptions::with_llm(
        llm,
        KEY,
        "[deliver]\ngit_schemes = [\"https\", \"ssh\", \"file\"]\n",
    ))
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Starts an agent task (full permission) on `worker` and returns its id.
fn start(c: &Cluster, worker: &str, extra: &[&str]) -> String {
    c.agent()
        .worker(worker)
        .args(extra)
        .start("make done.txt exist")
}

fn ended(c: &Cluster, id: &str) -> String {
    c.wait_status(
        id,
        &["finished", "failed", "stuck", "stalled", "budget_exhausted"],
        Duration::from_secs(60),
    )
}

/// The text of the first user message of a request.
fn first_message(r: &FakeRequest) -> String {
    let m = r
        .messages()
        .iter()
        .find(|m| m["role"] == "user")
        .expect("a user message");
    match &m["content"] {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

#[test]
fn a_finish_is_checked_and_a_failing_check_keeps_the_task_going_until_it_passes() {
    let llm = FakeLlm::script(vec![
        // Claims done before doing anything.
        FakeReply::finish("All Done already"),
        FakeReply::write("done.txt", "yes\n"),
        FakeReply::finish("Created done.txt"),
    ]);
    let c = cluster(&llm);
    let w = c.join_worker("checked");
    let id = start(&c, &w.id, &["--check", "test -f done.txt && echo found it"]);
    assert_eq!(ended(&c, &id), "finished", "{}", c.brain_log());
    let reqs = llm.requests();
    // Before its first turn the model saw the workspace and where the check stands.
    let first = first_message(&reqs[0]);
    assert!(first.contains("make done.txt exist"), "{first}");
    assert!(
        first.contains("The acceptance check `test -f done.txt && echo found it` now: it fails"),
        "{first}"
    );
    // The early finish was tested and refused, with the check's result.
    let told = reqs[1].last_tool_result_text().unwrap_or_default();
    assert!(
        told.contains("not done: the acceptance check") && told.contains("exit code 1"),
        "{told}"
    );
    assert_eq!(
        reqs.len(),
        3,
        "one more turn after the refusal, then the finish that passed"
    );
    let t = c.task_show(&id);
    assert_eq!(t["verification"], "verified", "{t}");
    assert_eq!(t["verified"], true);
    assert!(
        t["check_output"].as_str().unwrap().contains("found it"),
        "{t}"
    );
    // The summary keeps its case in what people see.
    let log = stdout(&c.brain_cli(&["task", "log", &id]));
    assert!(
        log.contains("finished (verified: the acceptance check passed): Created done.txt"),
        "{log}"
    );
    let tasks = stdout(&c.brain_cli(&["tasks"]));
    let line = tasks.lines().find(|l| l.starts_with(&id)).unwrap();
    assert!(line.contains("verified"), "{tasks}");
    // Its worker by name, as a person calls it.
    assert!(
        line.contains(" checked ") && !line.contains(&w.id),
        "{tasks}"
    );
    let show = stdout(&c.brain_cli(&["task", "show", &id]));
    assert!(
        show.contains(&format!("worker:  checked ({})", w.id)),
        "{show}"
    );
}

/// The check follows the workspace, not the tool: a command that changes files (`sed -i`,
/// `>>`) makes it run again before the model's next turn, as a write does; a command that
/// changes nothing does not.
#[test]
fn a_shell_edit_runs_the_check_again_and_a_command_that_changes_nothing_does_not() {
    let llm = FakeLlm::script(vec![
        FakeReply::write("state.txt", "no\n"),
        FakeReply::run("ls -la"),
        FakeReply::run("sed -i 's/no/yes/' state.txt"),
        FakeReply::run("echo more >> state.txt"),
        FakeReply::finish("flipped it"),
    ]);
    let c = cluster(&llm);
    let w = c.join_worker("sed");
    let id = start(&c, &w.id, &["--check", "grep -q yes state.txt"]);
    assert_eq!(ended(&c, &id), "finished", "{}", c.brain_log());
    let log = c.task_log_json(&id);
    let checks: Vec<bool> = log
        .iter()
        .filter(|r| r["kind"] == "check_after_changes")
        .map(|r| r["passed"].as_bool().unwrap())
        .collect();
    // After the write (it fails), not after `ls`, after the `sed -i` (it passes now) and
    // after the `>>`.
    assert_eq!(checks, [false, true, true], "{log:#?}");
    let reqs = llm.requests();
    let told = reqs[3].body["messages"].to_string();
    assert!(
        told.contains("passes after your changes"),
        "the model was not told the check passes after its sed: {told}"
    );
}

/// A check that cannot run (its command not found, or not executable) would judge nothing:
/// the task fails at once, saying why, and the model is never asked.
#[test]
fn a_check_whose_command_is_not_found_ends_the_task_before_any_model_call() {
    let llm = FakeLlm::script(vec![FakeReply::finish("done")]);
    let c = cluster(&llm);
    let w = c.join_worker("nocheck");
    let id = start(&c, &w.id, &["--check", "no-such-test-runner --all"]);
    assert_eq!(ended(&c, &id), "failed", "{}", c.brain_log());
    assert_eq!(
        llm.count(),
        0,
        "the model was asked against a check that cannot run"
    );
    let t = c.task_show(&id);
    let reason = t["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("cannot run here")
            && reason.contains("exit code 127")
            && reason.contains("no-such-test-runner"),
        "{t}"
    );
}

#[test]
fn a_finish_written_with_other_calls_is_not_taken_and_no_check_means_unverified() {
    let llm = FakeLlm::script(vec![
        FakeReply::tool_calls(vec![
            ("run_command", json!({"command": "echo tests fail; exit 1"})),
            ("finish", json!({"summary": "fixed"})),
        ]),
        FakeReply::finish("Looked again: fine"),
    ]);
    let c = cluster(&llm);
    let w = c.join_worker("eager");
    let id = start(&c, &w.id, &[]);
    assert_eq!(ended(&c, &id), "finished", "{}", c.brain_log());
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "the finish of the first reply ended nothing");
    // Both calls of the first reply were answered: the command ran, the finish was refused.
    let msgs = reqs[1].messages();
    let results: Vec<String> = msgs
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(results.len(), 2, "{msgs:?}");
    assert!(results[0].contains("tests fail"), "{results:?}");
    assert!(
        results[1].contains("not done: `finish` was written in the same reply"),
        "{results:?}"
    );
    let t = c.task_show(&id);
    assert_eq!(t["verification"], "unverified", "{t}");
    assert_eq!(t["verified"], false);
    let tasks = stdout(&c.brain_cli(&["tasks", "--json"]));
    let all: Vec<Value> = serde_json::from_str(&tasks).unwrap();
    assert_eq!(all[0]["verification"], "unverified", "{tasks}");
}

#[test]
fn a_cycle_of_four_calls_earns_a_note_then_stops_the_task_as_stuck() {
    let llm = FakeLlm::start(|req| {
        let calls = [
            ("list_files", json!({})),
            ("search", json!({"pattern": "nothing-here"})),
            ("run_command", json!({"command": "echo same"})),
            ("read_file", json!({"path": "notes.txt"})),
        ];
        let (name, args) = calls[req.assistant_turns() % 4].clone();
        FakeReply::tool_call(name, args)
    });
    let c = cluster(&llm);
    let w = c.join_worker("circles");
    // The note is an assist: on by default in text mode only.
    let id = start(
        &c,
        &w.id,
        &["--max-steps", "40", "--assists", "native,loop_notes"],
    );
    assert_eq!(ended(&c, &id), "stuck", "{}", c.brain_log());
    let reason = c.task_show(&id)["reason"].as_str().unwrap().to_string();
    assert!(
        reason.contains("round in circles") && reason.contains("4 calls"),
        "{reason}"
    );
    // Told first (after three rounds), stopped after the fourth.
    let noted = llm
        .requests()
        .iter()
        .position(|r| {
            r.last_tool_result_text()
                .is_some_and(|t| t.contains("going round in circles"))
        })
        .expect("the model was told it loops");
    assert_eq!(noted, 12, "told after three rounds of four calls");
    assert_eq!(llm.count(), 16, "stopped after the fourth round");
}

#[test]
fn out_of_budget_after_a_failing_check_is_not_finished() {
    let llm = FakeLlm::start(|_| FakeReply::finish("done"));
    let c = cluster(&llm);
    let w = c.join_worker("stubborn");
    let id = start(&c, &w.id, &["--check", "false", "--max-steps", "2"]);
    assert_eq!(ended(&c, &id), "budget_exhausted", "{}", c.brain_log());
    let t = c.task_show(&id);
    assert_eq!(t["verification"], "failing", "{t}");
    assert_eq!(t["verified"], false);
}

#[test]
fn a_slow_answer_does_not_carry_the_task_past_its_wall_time_budget() {
    // The answer would come long after the budget: the budget ends the task first.
    let llm = FakeLlm::start(|_| FakeReply::finish("late").delay(Duration::from_secs(20)));
    let c = cluster(&llm);
    let w = c.join_worker("slow");
    let id = start(&c, &w.id, &["--max-wall", "2s"]);
    c.wait_status(&id, &["budget_exhausted"], Duration::from_secs(15));
    let t = c.task_show(&id);
    assert!(
        t["reason"].as_str().unwrap().contains("wall-time budget"),
        "{t}"
    );
    assert_eq!(
        c.task_log_json(&id)
            .iter()
            .filter(|r| r["kind"] == "llm_response")
            .count(),
        0,
        "the late answer was not taken"
    );
}

#[test]
fn a_model_that_stops_calling_tools_is_stalled_not_finished() {
    let llm = FakeLlm::start(|_| FakeReply::text("Here is the fix:\n```python\nprint(1)\n```"));
    let c = cluster(&llm);
    let w = c.join_worker("talker");
    let id = start(&c, &w.id, &[]);
    assert_eq!(ended(&c, &id), "stalled", "{}", c.brain_log());
    assert!(
        c.task_show(&id)["reason"]
            .as_str()
            .unwrap()
            .contains("stopped calling tools"),
        "{}",
        c.brain_log()
    );
}

#[test]
fn an_empty_answer_from_claude_is_never_sent_back_as_empty_content() {
    // By request number: the empty answer is left out of the next request.
    let llm = FakeLlm::start(|req| match req.seq {
        1 => FakeReply::text(""),
        _ => FakeReply::finish("ok"),
    });
    let c = cluster(&llm);
    let w = c.join_worker("claude");
    let id = c
        .agent()
        .model("anthropic:claude-sonnet-4-5")
        .worker(&w.id)
        .start("say something");
    assert_eq!(ended(&c, &id), "finished", "{}", c.brain_log());
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    // The Messages API refuses an empty message and empty text blocks, and wants the roles
    // to alternate: none of that was sent.
    let msgs = reqs[1].messages();
    let mut last = "";
    for m in msgs {
        let role = m["role"].as_str().unwrap();
        assert_ne!(role, last, "roles alternate: {msgs:?}");
        last = role;
        match &m["content"] {
            Value::String(s) => assert!(!s.trim().is_empty(), "{msgs:?}"),
            Value::Array(blocks) => {
                assert!(!blocks.is_empty(), "{msgs:?}");
                for b in blocks {
                    if b["type"] == "text" {
                        assert!(!b["text"].as_str().unwrap().trim().is_empty(), "{msgs:?}");
                    }
                }
            }
            other => panic!("unexpected content {other}"),
        }
    }
}

#[test]
fn a_key_the_model_writes_is_masked_in_calls_summaries_records_output_and_listings() {
    let llm = FakeLlm::script(vec![
        FakeReply::run(format!("echo {KEY}")),
        // Assembled by the shell, so the key is in the output (in one write), not in the
        // arguments.
        FakeReply::run("k=sk-test-SECRET-; echo \"${k}4b7e1d9c2a\""),
        FakeReply::finish(format!("used {KEY}")),
    ]);
    let c = cluster(&llm);
    let w = c.join_worker("leaky");
    let out = c.agent().worker(&w.id).follow("show the key");
    let followed = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        c.task_status("t-1").as_deref(),
        Some("finished"),
        "{followed}"
    );
    let log = stdout(&c.brain_cli(&["task", "log", "t-1", "--json"]));
    let shown = stdout(&c.brain_cli(&["task", "log", "t-1"]));
    let tasks = stdout(&c.brain_cli(&["tasks", "--json"]));
    let show = stdout(&c.brain_cli(&["task", "show", "t-1"]));
    for (what, t) in [
        ("the followed run (live output)", followed.as_str()),
        ("the stored records", log.as_str()),
        ("the log shown", shown.as_str()),
        ("the task listing", tasks.as_str()),
        ("the task", show.as_str()),
        ("the brain's log", &c.brain_log()),
        ("the worker's log", &w.log_text()),
    ] {
        assert!(!t.contains(KEY), "the key appears in {what}:\n{t}");
    }
    assert!(log.contains("[redacted]"), "{log}");
    // The worker got the masked arguments, never the key.
    let journal = std::fs::read_dir(w.state.join("calls"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| std::fs::read(e.path()).unwrap_or_default())
        .any(|b| String::from_utf8_lossy(&b).contains(KEY));
    assert!(!journal, "the key reached the worker's journal");
}

/// A small repository with a failing test, as a git URL the brain can clone.
fn repo(c: &Cluster) -> String {
    let dir = c.dir.join("repo");
    init_repo(
        &dir,
        &[
            ("calc.sh", "add() { echo $(($1 - $2)); }\n"),
            (
                "test.sh",
                ". ./calc.sh\n[ \"$(add 2 3)\" = 5 ] || { echo 'FAIL add 2 3'; exit 1; }\necho ok\n",
            ),
        ],
    )
    .unwrap();
    dir.display().to_string()
}

#[test]
fn the_checks_own_files_are_protected_and_put_back_before_each_check() {
    let llm = FakeLlm::script(vec![
        // Tries to pass by rewriting the test: refused outright by the file tool…
        FakeReply::write("test.sh", "exit 0\n"),
        // …then through a command, and claims done.
        FakeReply::run("echo 'exit 0' > test.sh"),
        FakeReply::finish("tests pass"),
        // The test was put back and failed: now it fixes the code.
        FakeReply::write("calc.sh", "add() { echo $(($1 + $2)); }\n"),
        FakeReply::finish("fixed add"),
    ]);
    let c = cluster(&llm);
    let w = c.join_worker("honest");
    let url = repo(&c);
    let id = start(
        &c,
        &w.id,
        &[
            "--git",
            &url,
            "--check",
            "sh test.sh",
            "--protect",
            "test.sh",
        ],
    );
    assert_eq!(ended(&c, &id), "finished", "{}", c.brain_log());
    let told: Vec<String> = llm
        .requests()
        .iter()
        .filter_map(FakeRequest::last_tool_result_text)
        .collect();
    assert!(told[0].contains("test.sh is protected"), "{told:?}");
    assert!(
        told[2].contains("not done: the acceptance check `sh test.sh` failed")
            && told[2].contains("FAIL add 2 3"),
        "the edited test was put back before the check: {told:?}"
    );
    let t = c.task_show(&id);
    assert_eq!(t["verification"], "verified", "{t}");
    let log = c.task_log_json(&id);
    let restored: Vec<&Value> = log
        .iter()
        .filter(|r| r["kind"] == "protected_restored")
        .collect();
    assert_eq!(
        restored.len(),
        2,
        "before each of the two checks of a finish"
    );
    assert_eq!(restored[0]["paths"], json!(["test.sh"]));
}

#[test]
fn protect_without_a_check_is_refused_clearly() {
    let llm = FakeLlm::start(|_| FakeReply::text("unused"));
    let c = cluster(&llm);
    let w = c.join_worker("nocheck");
    let out = c
        .agent()
        .worker(&w.id)
        .args(&["--protect", "tests/**"])
        .try_start("do it");
    assert_failed_saying(&out, "protected files need an acceptance check");
}
