//! The loop a small model can finish, through the real brain and worker and a fake LLM in
//! text tool mode: the failing code is in the first message, the edits small models write
//! (SEARCH/REPLACE, a block that begins a definition) become ordinary logged calls, and a
//! cycle whose calls differ only in their bytes ends the task as stuck; the check runs after
//! every change and the model hears how it went.

use std::time::Duration;

use serde_json::Value;
use testkit::fake_llm::{FakeLlm, FakeReply, FakeRequest};
use testkit::git_server::init_repo;
use testkit::{BrainOptions, Cluster, text};

const MODEL: &str = "openai:small-coder";

fn cluster(llm: &FakeLlm) -> Cluster {
    let extra = format!(
        "[llm.models.\"{MODEL}\"]\ntool_mode = \"text\"\n[deliver]\ngit_schemes = [\"file\"]\n"
    );
    Cluster::start_with(BrainOptions::with_llm(llm, "sk-test", &extra))
}

/// A repository whose test fails on a bug in a module the test does not name: `test_stats`
/// imports `stats`, whose `mean` calls `helpers.total`... the bug is in `stats.py`.
fn repo(c: &Cluster) -> String {
    let dir = c.dir.join("repo");
    init_repo(
        &dir,
        &[
            (
                "stats.py",
                "import helpers\n\n\ndef mean(xs):\n    if not xs:\n        return 0\n    return helpers.total(xs) / (len(xs) + 1)\n",
            ),
            (
                "helpers.py",
                "def total(xs):\n    s = 0\n    for x in xs:\n        s += x\n    return s\n",
            ),
            (
                "test_stats.py",
                "from stats import mean\n\nassert mean([]) == 0\nassert mean([2, 4]) == 3, mean([2, 4])\nprint('ok')\n",
            ),
        ],
    )
    .unwrap();
    dir.display().to_string()
}

fn start(c: &Cluster, worker: &str, url: &str) -> String {
    let out = c
        .agent()
        .model(MODEL)
        .worker(worker)
        .args(&[
            "--git",
            url,
            "--check",
            "python3 test_stats.py",
            "--protect",
            "test_stats.py",
            "--max-steps",
            "30",
        ])
        .try_start("fix the failing test");
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The cluster, its worker and the task on the repository of [`repo`], started.
fn started(llm: &FakeLlm) -> (Cluster, testkit::Worker, String) {
    let c = cluster(llm);
    let w = c.join_worker("small");
    let url = repo(&c);
    let id = start(&c, &w.id, &url);
    (c, w, id)
}

fn ended(c: &Cluster, id: &str) -> String {
    c.wait_status(
        id,
        &["finished", "failed", "stuck", "stalled", "budget_exhausted"],
        Duration::from_secs(90),
    )
}

/// The text of the `n`th user message of a request (text mode sends plain strings).
fn user_text(r: &FakeRequest, n: usize) -> String {
    r.messages()
        .iter()
        .filter(|m| m["role"] == "user")
        .nth(n)
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn last_user_text(r: &FakeRequest) -> String {
    r.messages()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn the_failing_code_is_in_view_and_a_search_replace_block_fixes_it() {
    let llm = FakeLlm::start(|req| match req.seq - 1 {
        // The model describes the fix in prose first: told how to make it, not yet stalled.
        0 => FakeReply::text("The bug is the + 1 in the divisor; it should be len(xs)."),
        1 => FakeReply::text(
            "stats.py\n```python\n<<<<<<< SEARCH\n    return helpers.total(xs) / (len(xs) + 1)\n=======\n    return helpers.total(xs) / len(xs)\n>>>>>>> REPLACE\n```",
        ),
        _ => FakeReply::text(
            "```json\n{\"tool\": \"finish\", \"arguments\": {\"summary\": \"fixed the divisor\"}}\n```",
        ),
    });
    let (c, _w, id) = started(&llm);
    assert_eq!(ended(&c, &id), "finished", "{}", c.brain_log());
    assert_eq!(c.task_show(&id)["verification"], "verified");

    let reqs = llm.requests();
    // The first message: the check's failing output and every file of this small
    // workspace whole, the one the test does not name among them.
    let first = user_text(&reqs[0], 0);
    assert!(first.contains("AssertionError"), "{first}");
    assert!(
        first.contains("`stats.py` (the whole file):")
            && first.contains("return helpers.total(xs) / (len(xs) + 1)"),
        "{first}"
    );
    assert!(first.contains("`helpers.py` (the whole file):"), "{first}");
    // The prompt shows the edit format once.
    let system = reqs[0].body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(system.matches("<<<<<<< SEARCH").count(), 1, "{system}");
    // Prose without an edit is told the format.
    let told = last_user_text(&reqs[1]);
    assert!(
        told.contains("described a change without making it") && told.contains("<<<<<<< SEARCH"),
        "{told}"
    );
    // Its example is the step worth copying: running the check.
    assert!(
        told.contains(
            r#"{"tool": "run_command", "arguments": {"command":"python3 test_stats.py"}}"#
        ),
        "{told}"
    );
    // The block became an ordinary logged edit_file call.
    let log = c.task_log_json(&id);
    let edits: Vec<&Value> = log
        .iter()
        .filter(|r| r["kind"] == "tool_call_issued" && r["call"]["tool"] == "edit_file")
        .collect();
    assert_eq!(edits.len(), 1, "{log:?}");
    assert_eq!(edits[0]["call"]["path"], "stats.py");
}

#[test]
fn a_block_that_begins_a_definition_in_view_replaces_it() {
    let llm = FakeLlm::start(|req| match req.seq - 1 {
        // A tool's name in another case: the tool it means runs.
        0 => FakeReply::text(
            "```json\n{\"tool\": \"Read_File\", \"arguments\": {\"path\": \"helpers.py\"}}\n```",
        ),
        1 => FakeReply::text(
            "Here is the corrected function:\n```python\ndef mean(xs):\n    if not xs:\n        return 0\n    return helpers.total(xs) / len(xs)\n```",
        ),
        _ => FakeReply::text(
            "```json\n{\"tool\": \"finish\", \"arguments\": {\"summary\": \"fixed mean\"}}\n```",
        ),
    });
    let (c, w, id) = started(&llm);
    assert_eq!(ended(&c, &id), "finished", "{}", c.brain_log());
    assert_eq!(c.task_show(&id)["verification"], "verified");
    let read = last_user_text(&llm.requests()[1]);
    assert!(
        read.contains("read_file") && read.contains("s += x"),
        "the file was read: {read}"
    );
    let num = id.trim_start_matches("t-");
    let file =
        std::fs::read_to_string(w.state.join(format!("workspaces/task-{num}/stats.py"))).unwrap();
    assert_eq!(
        file,
        "import helpers\n\n\ndef mean(xs):\n    if not xs:\n        return 0\n    return helpers.total(xs) / len(xs)\n",
        "the definition was replaced, the import kept"
    );
}

#[test]
fn a_write_that_changes_nothing_and_a_refused_finish_end_the_task_as_stuck() {
    // The same wrong file each time (the bytes of the call differ), then `finish`.
    let llm = FakeLlm::start(|req| {
        let n = req.seq - 1;
        if n % 2 == 0 {
            let pad = " ".repeat(n);
            FakeReply::text(format!(
                "```json\n{{\"tool\": \"write_file\",{pad} \"arguments\": {{\"path\": \"stats.py\", \"content\": \"import helpers\\n\\ndef mean(xs):\\n    return 0\\n\"}}}}\n```"
            ))
        } else {
            FakeReply::text(
                "```json\n{\"tool\": \"finish\", \"arguments\": {\"summary\": \"done\"}}\n```",
            )
        }
    });
    let (c, _w, id) = started(&llm);
    assert_eq!(ended(&c, &id), "stuck", "{}", c.brain_log());
    let reason = c.task_show(&id)["reason"].as_str().unwrap().to_string();
    assert!(
        reason.contains("round in circles") && reason.contains("2 calls"),
        "{reason}"
    );
    // Once, it began again from the start; then the same cycle stopped it.
    let restarts = c
        .task_log_json(&id)
        .iter()
        .filter(|r| r["kind"] == "changes_undone" && r["to_start"] == true)
        .count();
    assert_eq!(restarts, 1);
    assert!(
        llm.count() <= 24,
        "stopped within a few rounds each time, not at the step budget: {} requests",
        llm.count()
    );
}

#[test]
fn a_fix_written_as_a_block_beside_a_finish_is_applied_before_the_check() {
    // What a 1.5B model really wrote: the fixed definition as a block, and `finish` in the
    // same reply. The block is the part that matters: it runs first, then the check.
    let llm = FakeLlm::start(|_| {
        FakeReply::text(
            "Here is the fix:\n```python\ndef mean(xs):\n    if not xs:\n        return 0\n    return helpers.total(xs) / len(xs)\n```\n```json\n{\"tool\": \"finish\", \"arguments\": {\"summary\": \"fixed mean\"}}\n```",
        )
    });
    let (c, _w, id) = started(&llm);
    assert_eq!(ended(&c, &id), "finished", "{}", c.brain_log());
    assert_eq!(c.task_show(&id)["verification"], "verified");
    assert_eq!(
        llm.count(),
        1,
        "one reply: the edit, then the finish and its check"
    );
}

#[test]
fn the_check_runs_after_a_change_and_a_reply_that_only_talks_after_it_passes_finishes() {
    // What a 1.5B model did on its own: a "fix" that breaks the module (a name it dropped),
    // then, told nothing, the same write again and again. Now it hears the check after each
    // change; once the check passes, a reply with no call is its finish.
    let llm = FakeLlm::start(|req| match req.seq - 1 {
        0 => FakeReply::text(
            "```python stats.py\ndef mean(xs):\n    if not xs:\n        return 0\n    return total(xs) / len(xs)\n```",
        ),
        1 => FakeReply::text(
            "```python stats.py\nimport helpers\n\n\ndef mean(xs):\n    if not xs:\n        return 0\n    return helpers.total(xs) / len(xs)\n```",
        ),
        _ => FakeReply::text("The divisor is fixed; the test passes now."),
    });
    let (c, _w, id) = started(&llm);
    assert_eq!(ended(&c, &id), "finished", "{}", c.brain_log());
    assert_eq!(c.task_show(&id)["verification"], "verified");
    assert_eq!(
        llm.count(),
        3,
        "two changes, then the reply that only talks"
    );

    let reqs = llm.requests();
    // After the broken change: the check's failure and the code it points at.
    let told = last_user_text(&reqs[1]);
    assert!(
        told.contains("after your changes: it still fails") && told.contains("NameError"),
        "{told}"
    );
    assert!(told.contains("return total(xs) / len(xs)"), "{told}");
    // After the right one: it passes, and the model is told what to do.
    let told = last_user_text(&reqs[2]);
    assert!(
        told.contains("passes after your changes") && told.contains("`finish`"),
        "{told}"
    );
    // Each change was followed by a run of the check, and the finish by the brain's own.
    let log = c.task_log_json(&id);
    let checks = log
        .iter()
        .filter(|r| r["kind"] == "check_after_changes")
        .map(|r| r["passed"].as_bool().unwrap())
        .collect::<Vec<_>>();
    assert_eq!(checks, [false, true], "{log:?}");
    let finishes = log
        .iter()
        .filter(|r| r["kind"] == "finished" && r["verified"] == true)
        .count();
    assert_eq!(finishes, 1, "{log:?}");
}

#[test]
fn a_reply_that_only_talks_while_the_check_fails_is_not_a_finish() {
    // Without a passing check, talk is nudged and then stalls, as before: never finished.
    let llm = FakeLlm::start(|_| FakeReply::text("I think the code is fine."));
    let (c, _w, id) = started(&llm);
    assert_eq!(ended(&c, &id), "stalled", "{}", c.brain_log());
    assert_eq!(c.task_show(&id)["verification"], "failing");
}

#[test]
fn a_failed_fix_is_told_as_what_was_done_and_writing_it_again_changes_nothing() {
    let wrong = "```python stats.py\nimport helpers\n\n\ndef mean(xs):\n    if not xs:\n        return 0\n    return helpers.total(xs) / (len(xs) + 2)\n```";
    let right = "```python stats.py\nimport helpers\n\n\ndef mean(xs):\n    if not xs:\n        return 0\n    return helpers.total(xs) / len(xs)\n```";
    let llm = FakeLlm::start(move |req| match req.seq - 1 {
        0 => FakeReply::text(format!("My fix, in words only here:\n{wrong}")),
        1 => FakeReply::text(format!("Again:\n{wrong}")),
        _ => FakeReply::text(format!("Now:\n{right}")),
    });
    let (c, _w, id) = started(&llm);
    assert_eq!(ended(&c, &id), "finished", "{}", c.brain_log());
    assert_eq!(c.task_show(&id)["verification"], "verified");
    let reqs = llm.requests();
    // After the failed fix: what it did, in the user's voice; not its own words to copy.
    let second = serde_json::to_string(&reqs[1].messages()).unwrap();
    assert!(
        second.contains("(You changed stats.py with blocks of code.)"),
        "{second}"
    );
    assert!(!second.contains("in words only here"), "{second}");
    assert!(
        !reqs[1].messages().iter().any(|m| m["role"] == "assistant"),
        "{second}"
    );
    // The same fix again is not written; the model hears that it changes nothing.
    let third = last_user_text(&reqs[2]);
    assert!(
        third.contains("stats.py already holds exactly that code"),
        "{third}"
    );
    let writes = c
        .task_log_json(&id)
        .iter()
        .filter(|r| r["kind"] == "tool_call_issued" && r["call"]["tool"] == "write_file")
        .count();
    assert_eq!(writes, 2, "the wrong fix once, the right one once");
}

#[test]
fn a_change_that_breaks_a_passing_fix_is_undone_and_a_model_that_stops_there_is_finished_for() {
    // What a 1.5B model did on `head`: the check passed on its fix, then it wrote the bug
    // back and failed. Now the version that passed is kept, and when the model stops on it
    // the brain calls `finish` in its place.
    let wrong = "```python stats.py\nimport helpers\n\n\ndef mean(xs):\n    if not xs:\n        return 0\n    return helpers.total(xs) / (len(xs) + 2)\n```";
    let right = "```python stats.py\nimport helpers\n\n\ndef mean(xs):\n    if not xs:\n        return 0\n    return helpers.total(xs) / len(xs)\n```";
    let llm = FakeLlm::start(move |req| match req.seq - 1 {
        0 => FakeReply::text(right),
        1 => FakeReply::text(format!("Better:\n{wrong}")),
        2 => FakeReply::text(
            "```json\n{\"tool\": \"run_command\", \"arguments\": {\"command\": \"ls\"}}\n```",
        ),
        _ => FakeReply::text("I am not sure what else to do."),
    });
    let (c, _w, id) = started(&llm);
    assert_eq!(ended(&c, &id), "finished", "{}", c.brain_log());
    assert_eq!(c.task_show(&id)["verification"], "verified");
    let reqs = llm.requests();
    assert_eq!(
        reqs.len(),
        5,
        "fix, break, ls, then two replies without a call"
    );
    // After the break: what happened, and the file as the check passed on it.
    let told = last_user_text(&reqs[2]);
    assert!(
        told.contains("so those changes were undone: stats.py is back"),
        "{told}"
    );
    assert!(
        told.contains("return helpers.total(xs) / len(xs)\n"),
        "{told}"
    );
    assert!(!told.contains("(len(xs) + 2)"), "{told}");
    let log = c.task_log_json(&id);
    let kinds: Vec<&str> = log.iter().filter_map(|r| r["kind"].as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "changes_undone").count(),
        1,
        "{kinds:?}"
    );
    let concluded = log
        .iter()
        .find(|r| r["kind"] == "finished_for_model")
        .expect("the brain finished for the model");
    assert_eq!(concluded["why"], "stopped calling tools");
    // The diff the task delivers is the fix, not the break.
    let out = c.brain_cli(&["task", "diff", &id]);
    let diff = String::from_utf8_lossy(&out.stdout);
    assert!(
        diff.contains("+    return helpers.total(xs) / len(xs)"),
        "{diff}"
    );
    assert!(!diff.contains("len(xs) + 2"), "{diff}");
}

#[test]
fn a_model_that_writes_its_failed_fix_again_and_again_starts_again_from_the_start() {
    // What a 1.5B model did on `passmark`: its first change broke the module (a name it
    // made up), and it then wrote that same broken file again and again until it stalled.
    // Its changes are undone back to the start once, and it tries again from there.
    let broken = "```python stats.py\nimport helpers\n\n\ndef mean(xs):\n    if not xs:\n        return 0\n    return helpers.total(xs) / count\n```";
    let right = "```python stats.py\nimport helpers\n\n\ndef mean(xs):\n    if not xs:\n        return 0\n    return helpers.total(xs) / len(xs)\n```";
    let llm = FakeLlm::start(move |req| {
        let restarted = req.messages().iter().any(|m| {
            m["content"]
                .as_str()
                .is_some_and(|t| t.contains("back as at the start"))
        });
        if restarted {
            FakeReply::text(right)
        } else {
            FakeReply::text(format!("The fix:\n{broken}"))
        }
    });
    let (c, _w, id) = started(&llm);
    assert_eq!(ended(&c, &id), "finished", "{}", c.brain_log());
    assert_eq!(c.task_show(&id)["verification"], "verified");
    let log = c.task_log_json(&id);
    let undone: Vec<&Value> = log
        .iter()
        .filter(|r| r["kind"] == "changes_undone")
        .collect();
    assert_eq!(undone.len(), 1, "{log:?}");
    assert_eq!(undone[0]["to_start"], true);
    assert_eq!(undone[0]["restored"], serde_json::json!(["stats.py"]));
    // The model was shown the file as it was at the start.
    let reqs = llm.requests();
    let told = reqs
        .iter()
        .map(last_user_text)
        .find(|t| t.contains("back as at the start"))
        .expect("told");
    assert!(told.contains("(len(xs) + 1)"), "{told}");
    assert!(!told.contains("/ count"), "{told}");
}
