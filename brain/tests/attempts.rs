//! Attempts through the real brain and workers and a fake LLM: a task run as N attempts from
//! one base, each a task of its own on a worker of its own, the brain's run of the check
//! picking the winner; escalation to another model when none passes; and a brain killed
//! while attempts run, which goes on without running an attempt twice or picking twice; with
//! fewer workers than attempts, machines provisioned through the offers (within the quota)
//! and released when their attempts end.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use shared::locks::Lock;
use testkit::fake_llm::{FakeLlm, FakeReply, FakeRequest};
use testkit::{BrainOptions, Cluster, assert_failed_saying, text};

const MODEL: &str = "openai:small";
const BIG: &str = "openai:big";
const CHECK: &str = "test \"$(cat answer.txt)\" = 42";

fn cluster(llm: &FakeLlm) -> Cluster {
    cluster_with(llm, "")
}

/// With `extra` config at the end.
fn cluster_with(llm: &FakeLlm, extra: &str) -> Cluster {
    let extra = format!("[agent]\nattempt_temperature = 0.7\n{extra}");
    Cluster::start_with(BrainOptions::with_llm(llm, "sk-attempts-key-1", &extra))
}

/// `brain run --detach` with the check, full permission and `extra` flags; the task id.
fn start(c: &Cluster, extra: &[&str]) -> String {
    start_checked(c, CHECK, extra)
}

/// [`start`] with another check.
fn start_checked(c: &Cluster, check: &str, extra: &[&str]) -> String {
    c.agent()
        .model(MODEL)
        .check(check)
        .args(&["--max-steps", "6"])
        .args(extra)
        .start("write the answer to answer.txt")
}

/// Waits (two minutes at most) for task `id` to end, which must be as `want`; the task
/// (`task show --json`) then.
fn ended_as(c: &Cluster, id: &str, want: &str) -> Value {
    let ended = c.wait_status(
        id,
        &[
            "finished",
            "failed",
            "stuck",
            "stalled",
            "cancelled",
            "budget_exhausted",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(ended, want, "{}", c.brain_log());
    c.task_show(id)
}

/// The parent's log tells the story once: `n` attempts started and ended, one picked.
fn told_once(c: &Cluster, id: &str, n: usize) {
    let log = c.task_log_json(id);
    let count = |k: &str| log.iter().filter(|r| r["kind"] == k).count();
    assert_eq!(count("attempt_started"), n, "{log:?}");
    assert_eq!(count("attempt_ended"), n, "{log:?}");
    assert_eq!(count("attempt_picked"), 1, "{log:?}");
}

fn write(content: &str) -> FakeReply {
    FakeReply::tool_call(
        "write_file",
        json!({"path": "answer.txt", "content": content}),
    )
}

fn finish() -> FakeReply {
    FakeReply::finish("wrote the answer")
}

/// Which attempt a request is from, by its seed: 0 for the first seed the server saw, 1 for
/// the next, ...
fn role(seen: &Mutex<Vec<u64>>, req: &FakeRequest) -> usize {
    let seed = req.body["seed"]
        .as_u64()
        .expect("every attempt sends a seed");
    let mut s = seen.locked();
    if !s.contains(&seed) {
        s.push(seed);
    }
    s.iter().position(|x| *x == seed).unwrap()
}

/// What the attempt asking `req` wrote to `answer.txt` in its first turn, if it did.
fn wrote(req: &FakeRequest) -> Option<String> {
    req.messages()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["function"]["arguments"].as_str().map(str::to_string))
        .filter_map(|a| serde_json::from_str::<Value>(&a).ok())
        .find_map(|a| a["content"].as_str().map(str::to_string))
}

#[test]
fn the_attempt_the_check_passes_on_wins_on_a_worker_of_its_own_and_the_others_stop() {
    let llm = FakeLlm::start(move |req| {
        if req.assistant_turns() == 0 {
            return match (req.body.get("n"), req.choice) {
                // The first attempt, alone at the server's temperature: a wrong answer.
                (None, _) => write("41\n"),
                // The other two, asked together: the right answer, once the wrong one has
                // had its first go, and a slow one still at it when another wins.
                (Some(_), 0) => write("42\n").delay(Duration::from_millis(300)),
                (Some(_), _) => FakeReply::run("true"),
            };
        }
        match wrote(req) {
            Some(_) => finish(),
            None => FakeReply::run("true").delay(Duration::from_millis(1500)),
        }
    });
    let c = cluster(&llm);
    let workers: Vec<testkit::Worker> = (0..3).map(|i| c.join_worker(&format!("w{i}"))).collect();
    let id = start(&c, &["--attempts", "3"]);
    let t = ended_as(&c, &id, "finished");
    assert_eq!(t["verification"], "verified", "{t}");
    let attempts = t["attempts"].as_array().unwrap().clone();
    assert_eq!(attempts.len(), 3, "{t}");
    // Its steps are out of all the attempts may take (6 each).
    assert_eq!(t["steps_total"], 18, "{t}");
    // Each attempt on a worker of its own.
    let on: BTreeSet<&str> = attempts
        .iter()
        .map(|a| a["worker"].as_str().unwrap())
        .collect();
    let ids: BTreeSet<&str> = workers.iter().map(|w| w.id.as_str()).collect();
    assert_eq!(on, ids, "{t}");
    // The winner is the verified one; the parent's result is its workspace.
    let won: Vec<&Value> = attempts.iter().filter(|a| a["verified"] == true).collect();
    assert_eq!(won.len(), 1, "{t}");
    assert_eq!(t["picked"], won[0]["task"], "{t}");
    let diff = c.brain_cli(&["task", "diff", &id]);
    assert!(diff.status.success(), "{}", text(&diff));
    let diff = String::from_utf8_lossy(&diff.stdout);
    assert!(diff.contains("+42") && !diff.contains("+41"), "{diff}");
    // The others ended before the parent did: one on its wrong answer, one stopped.
    let status: BTreeSet<&str> = attempts
        .iter()
        .map(|a| a["status"].as_str().unwrap())
        .collect();
    assert!(status.contains("cancelled"), "{t}");
    for a in &attempts {
        let st = c.task_show(a["task"].as_str().unwrap());
        assert_eq!(st["attempt_of"], id.as_str(), "{st}");
        assert_ne!(st["status"], "running", "{st}");
        // The one stopped says why: another won, not that a person cancelled it.
        if st["status"] == "cancelled" {
            let why = st["reason"].as_str().unwrap();
            let winner = format!("({}) won", won[0]["task"].as_str().unwrap());
            assert!(why.contains(&winner) && !why.contains("admin"), "{why}");
        }
    }
    // The first attempt sampled alone at the server's temperature with a seed of its own;
    // the other two started alike at the configured temperature, so their first turns were
    // one request for two answers (each sampled with its own seed by the server), and their
    // later turns have seeds of their own.
    let reqs = llm.requests();
    let together: Vec<&FakeRequest> = reqs.iter().filter(|r| r.body.get("n").is_some()).collect();
    assert_eq!(together.len(), 1, "{reqs:?}");
    assert_eq!(together[0].body["n"], 2);
    assert!(together[0].body.get("seed").is_none(), "{:?}", together[0]);
    // Both answers came from it (streamed): no first turn was asked again.
    let first_turns = reqs.iter().filter(|r| r.assistant_turns() == 0).count();
    assert_eq!(first_turns, 2, "{reqs:?}");
    // The winner ended at its first pass: its model was not asked again after the write the
    // check passed on, and the brain says it finished for it there.
    assert!(
        !reqs.iter().any(|r| wrote(r).as_deref() == Some("42\n")),
        "{reqs:?}"
    );
    let why = won[0]["reason"].as_str().unwrap_or_default();
    assert!(why.contains("first pass"), "{t}");
    let at_07 = |r: &FakeRequest| {
        r.body["temperature"]
            .as_f64()
            .is_some_and(|v| (v - 0.7).abs() < 1e-6)
    };
    assert!(at_07(together[0]), "{:?}", together[0]);
    let mut seeds: HashMap<u64, bool> = HashMap::new();
    for r in reqs.iter().filter(|r| r.body.get("n").is_none()) {
        let seed = r.body["seed"]
            .as_u64()
            .expect("a seed on every other request");
        let default = r.body.get("temperature").is_none();
        assert!(default || at_07(r), "{r:?}");
        assert_eq!(
            *seeds.entry(seed).or_insert(default),
            default,
            "one seed, one attempt"
        );
    }
    assert_eq!(seeds.values().filter(|d| **d).count(), 1, "{seeds:?}");
    assert!(seeds.len() >= 2, "{seeds:?}");
    told_once(&c, &id, 3);
    // `task show` lists the attempts in words.
    let out = c.brain_cli(&["task", "show", &id]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("attempts: 3 (pick first; won by"), "{shown}");
}

/// An attempt stopped because another won after it changed its workspace, but before the
/// check ran on that change, does not show the verdict on its earlier version as its own.
#[test]
fn a_loser_stopped_before_its_check_ran_again_says_its_verdict_is_of_an_earlier_version() {
    let llm = FakeLlm::start(move |req| {
        if req.assistant_turns() > 0 {
            return finish();
        }
        // The first attempt asks at the server's temperature: the right answer, late; the
        // second the wrong one at once, whose check then hangs until it is stopped.
        match req.body.get("temperature") {
            None => write("42\n").delay(Duration::from_millis(1500)),
            Some(_) => write("41\n"),
        }
    });
    let c = cluster(&llm);
    let _workers: Vec<testkit::Worker> = (0..2).map(|i| c.join_worker(&format!("w{i}"))).collect();
    let check =
        "if [ -f answer.txt ]; then test \"$(cat answer.txt)\" = 42 || sleep 60; else exit 1; fi";
    let id = start_checked(&c, check, &["--attempts", "2"]);
    let t = ended_as(&c, &id, "finished");
    let attempts = t["attempts"].as_array().unwrap();
    let won = attempts.iter().find(|a| a["verified"] == true).unwrap();
    assert_eq!(won["check"], "passes", "{t}");
    let lost = attempts.iter().find(|a| a["verified"] != true).unwrap();
    assert_eq!(lost["status"], "cancelled", "{t}");
    assert_eq!(
        lost["check"], "fails (exit code 1) on an earlier version (the workspace changed after it)",
        "{t}"
    );
    let loser = c.task_show(lost["task"].as_str().unwrap());
    assert_eq!(loser["verification"], "unverified", "{loser}");
    assert!(
        loser["check_result"]
            .as_str()
            .unwrap()
            .ends_with("on an earlier version (the workspace changed after it)"),
        "{loser}"
    );
}

#[test]
fn when_no_attempt_passes_the_next_model_gets_a_go_told_how_the_check_failed() {
    let llm = FakeLlm::start(|req| {
        let turns = req.assistant_turns();
        match (req.body["model"].as_str(), turns) {
            (Some("big"), 0) => write("42\n"),
            (Some("big"), _) => finish(),
            (_, 0) => write("7\n"),
            _ => finish(),
        }
    });
    let c = cluster(&llm);
    let _w = c.join_worker("w");
    // The check prints the brain's API key when it fails (as a server echoing a secret
    // might): the next model is told how the check ended, never the key.
    let leaky = format!("{CHECK} || {{ printf 'sk-attempts'; printf -- '-key-1\\n'; exit 1; }}");
    let id = start_checked(&c, &leaky, &["--attempts", "2", "--escalate-model", BIG]);
    let t = ended_as(&c, &id, "finished");
    let attempts = t["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "{t}");
    assert_eq!(attempts[2]["escalation"], true, "{t}");
    assert_eq!(attempts[2]["model"], BIG, "{t}");
    assert_eq!(t["picked"], attempts[2]["task"], "{t}");
    assert!(attempts[..2].iter().all(|a| a["verified"] == false), "{t}");
    // The big model's first message says how the check ended on the small one's answers.
    let first = llm
        .requests()
        .into_iter()
        .find(|r| r.body["model"] == "big")
        .expect("the big model was asked");
    let goal = first
        .messages()
        .iter()
        .find(|m| m["role"] == "user")
        .unwrap()["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        goal.contains("Earlier attempts at this task did not pass the acceptance check")
            && goal.contains("Attempt 1 (openai:small)")
            && goal.contains("Attempt 2 (openai:small)"),
        "{goal}"
    );
    assert!(
        !goal.contains("sk-attempts-key-1"),
        "a secret reached the next model: {goal}"
    );
}

#[test]
fn with_no_attempt_passing_the_task_fails_with_each_reason() {
    let llm = FakeLlm::script(vec![write("7\n"), finish()]);
    let c = cluster(&llm);
    let _w = c.join_worker("w");
    let id = start(&c, &["--attempts", "2", "--pick", "smallest"]);
    let t = ended_as(&c, &id, "failed");
    let reason = t["reason"].as_str().unwrap();
    let attempts = t["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{t}");
    for a in attempts {
        assert!(reason.contains(a["task"].as_str().unwrap()), "{reason}");
    }
    assert!(
        reason.contains("one of them can be delivered as it stands"),
        "{reason}"
    );
    assert_eq!(t["picked"], "", "{t}");
    // Nothing is the parent's result: asked for its diff, it names its attempts instead.
    let diff = c.brain_cli(&["task", "diff", &id]);
    assert_failed_saying(&diff, "no attempt has won");
}

#[test]
fn a_brain_killed_while_attempts_run_goes_on_without_running_one_twice_or_picking_twice() {
    // Both attempts pass; the smaller change wins. Every answer takes a while, so the brain
    // is killed with both in flight.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let llm = FakeLlm::start(move |req| {
        let slow = Duration::from_millis(700);
        match (role(&s, req), req.assistant_turns()) {
            (_, 0) => write("42\n").delay(slow),
            (0, 1) => FakeReply::write("notes.txt", "one\ntwo\nthree\n").delay(slow),
            _ => finish().delay(slow),
        }
    });
    let mut c = cluster(&llm);
    let _w: Vec<testkit::Worker> = (0..2).map(|i| c.join_worker(&format!("w{i}"))).collect();
    let id = start(&c, &["--attempts", "2", "--pick", "smallest"]);
    // Killed once both attempts started, and again once one has ended.
    c.wait_records(&id, "attempt_started", 2, Duration::from_secs(60));
    c.kill_brain();
    c.start_brain().expect("brain restarts");
    c.wait_records(&id, "attempt_ended", 1, Duration::from_secs(90));
    c.kill_brain();
    c.start_brain().expect("brain restarts");
    let t = ended_as(&c, &id, "finished");
    assert_eq!(t["verification"], "verified", "{t}");
    // Two attempts, no more: none was made twice.
    let out = c.brain_cli(&["tasks", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let children: Vec<&Value> = all
        .iter()
        .filter(|x| x["attempt_of"] == id.as_str())
        .collect();
    assert_eq!(children.len(), 2, "{all:?}");
    told_once(&c, &id, 2);
    // The smaller change won: the answer alone, not the answer and the notes.
    let attempts = t["attempts"].as_array().unwrap();
    let small = attempts
        .iter()
        .min_by_key(|a| a["lines_changed"].as_u64().unwrap())
        .unwrap();
    assert_eq!(t["picked"], small["task"], "{t}");
    assert_eq!(small["files_changed"], 1, "{t}");
    // No call of any attempt was sent twice: each issued call completed or was interrupted
    // once, and no call id repeats.
    for a in attempts {
        let log = c.task_log_json(a["task"].as_str().unwrap());
        let issued: Vec<u64> = log
            .iter()
            .filter(|r| r["kind"] == "tool_call_issued")
            .map(|r| testkit::json_u64(&r["call_id"]).unwrap())
            .collect();
        let unique: BTreeSet<u64> = issued.iter().copied().collect();
        assert_eq!(unique.len(), issued.len(), "{log:?}");
    }
}

#[test]
fn attempt_flags_that_cannot_apply_are_refused() {
    let llm = FakeLlm::start(|_| finish());
    let c = cluster(&llm);
    let _w = c.join_worker("w");
    for (args, says) in [
        (&["--pick", "smallest"][..], "need --attempts"),
        (&["--attempt-model", BIG][..], "need --attempts"),
        (&["--attempts", "17"][..], "17"),
        (
            &["--attempts", "2", "--attempt-model", "nosuch:model"][..],
            "nosuch",
        ),
    ] {
        let mut a = vec!["run", "--detach", "--model", MODEL];
        a.extend_from_slice(args);
        a.push("goal");
        let out = c.brain_cli(&a);
        assert!(!out.status.success(), "{args:?} was taken");
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
    }
    let plan = c.dir.join("plan.json");
    std::fs::write(&plan, r#"{"steps": [{"run": ["true"]}]}"#).unwrap();
    let out = c.brain_cli(&["run", "--plan", plan.to_str().unwrap(), "--attempts", "2"]);
    assert_failed_saying(&out, "--attempts");
}

#[test]
fn with_fewer_workers_than_attempts_an_offer_makes_machines_within_the_quota_and_they_go() {
    // Every attempt writes the answer after a while: the first to end wins.
    let llm = FakeLlm::script(vec![
        write("42\n").delay(Duration::from_millis(800)),
        finish(),
    ]);
    let c = cluster_with(
        &llm,
        "[provision]\nreaper_every = \"200ms\"\napproval_above_usd_per_hour = 1.0\n\
         [provision.providers.local]\nmax_machines = 1\nusd_per_hour = 0.25\n\
         [[provision.offers]]\nprovider = \"local\"\ncpu = 1\nmemory_gb = 1\n",
    );
    let home = c.join_worker("home");
    let id = start(&c, &["--attempts", "3"]);
    let t = ended_as(&c, &id, "finished");
    assert_eq!(t["verification"], "verified", "{t}");
    let attempts = t["attempts"].as_array().unwrap().clone();
    assert_eq!(attempts.len(), 3, "{t}");
    let ids: BTreeSet<&str> = attempts
        .iter()
        .map(|a| a["task"].as_str().unwrap())
        .collect();
    // The quota allows one machine: one attempt on it, the other two on the worker there was.
    let made: Vec<Value> = c
        .machines(true)
        .into_iter()
        .filter(|m| ids.contains(m["task_id"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(made.len(), 1, "{made:?}\n{}", c.brain_log());
    let machine_worker = made[0]["worker_id"].as_str().unwrap().to_string();
    let on: Vec<&str> = attempts
        .iter()
        .map(|a| a["worker"].as_str().unwrap())
        .collect();
    assert_eq!(
        on.iter().filter(|w| **w == machine_worker).count(),
        1,
        "{on:?}"
    );
    assert_eq!(on.iter().filter(|w| **w == home.id).count(), 2, "{on:?}");
    // Its attempt ended (won, or stopped for the winner): the machine is released.
    let m = made[0]["id"].as_str().unwrap().to_string();
    c.wait_machine_state(&m, "released", Duration::from_secs(30));
    assert!(
        c.brain_log()
            .contains("released the machine of an attempt that ended"),
        "{}",
        c.brain_log()
    );
}
