//! The brain never forgets: a scripted task keeps going through SIGKILLs of the brain, of the
//! worker and of both, and every step's effect happens exactly once, in order. A task whose
//! log cannot be decoded fails alone.

use std::time::Duration;

use rand::Rng;
use testkit::gates::Gates;
use testkit::plans::{assert_exactly_once, line_plan};
use testkit::{BrainOptions, Cluster, assert_failed_stderr_says, assert_stdout_says, text};

/// Waits until a task has ended, and returns how.
fn wait_terminal(c: &Cluster, id: &str, timeout: Duration) -> String {
    c.wait_status(id, &["finished", "failed", "cancelled"], timeout)
}

/// Two tasks of `plan` on worker `w`, once both are `status`.
fn two_tasks(c: &Cluster, plan: &std::path::Path, w: &str, status: &str) -> (String, String) {
    let (a, b) = (c.run_plan(plan, w), c.run_plan(plan, w));
    for t in [&a, &b] {
        c.wait_status(t, &[status], Duration::from_secs(20));
    }
    (a, b)
}

/// Waits until task `id` has failed because a record cannot be decoded, and `task show`
/// says so naming `what`.
fn failed_undecodable(c: &Cluster, id: &str, what: &str) {
    assert_eq!(wait_terminal(c, id, Duration::from_secs(20)), "failed");
    let out = c.brain_cli(&["task", "show", id]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("cannot be decoded") && shown.contains(what),
        "{shown}"
    );
}

/// With the brain down, changes task `id`'s stored records through `damage` (given the tree
/// and the prefix of the task's keys), as a disk or a bug might; then starts the brain.
fn damage_records(c: &mut Cluster, id: &str, damage: impl FnOnce(&sled::Tree, [u8; 8])) {
    c.kill_brain();
    {
        let db = sled::open(c.data.join("db")).unwrap();
        let events = db.open_tree("events").unwrap();
        let num: u64 = id.trim_start_matches("t-").parse().unwrap();
        damage(&events, num.to_be_bytes());
        db.flush().unwrap();
    }
    c.start_brain().unwrap();
}

#[test]
fn a_task_survives_fifty_brain_kills_with_every_effect_exactly_once() {
    let mut c = Cluster::start_with(BrainOptions {
        lost_after: Duration::from_secs(3),
        ..Default::default()
    });
    let w = c.join_worker("steady");
    // Long enough that all fifty kills land while it runs (asserted below): each step holds
    // its worker 0.15 s until the kills are done (gate 1).
    let n = 100;
    let kills_done = Gates::new();
    let plan = line_plan(&c, n, &kills_done.unless_open(1, "sleep 0.15"));
    let id = c.run_plan(&plan, &w.id);
    let mut rng = testkit::random::seeded();
    let mut kills = 0;
    while kills < 50 {
        std::thread::sleep(Duration::from_millis(30 + rng.random_range(0..250)));
        c.kill_brain();
        kills += 1;
        c.start_brain().unwrap();
    }
    // Not ended yet: running, or waiting for the worker to reconnect after the last kill.
    let during = c.task_status(&id);
    assert!(
        matches!(during.as_deref(), Some("running" | "waiting")),
        "the kills must land while the task runs (it is {during:?})"
    );
    kills_done.open(1);
    let status = wait_terminal(&c, &id, Duration::from_secs(120));
    assert_eq!(status, "finished", "brain log:\n{}", c.brain_log());
    let interrupted = assert_exactly_once(&c, &w, &id, n);
    eprintln!(
        "brain SIGKILLed {kills} times; {interrupted} calls were interrupted and settled by their checks"
    );
}

#[test]
fn a_task_survives_worker_kills_and_kills_of_both() {
    let mut c = Cluster::start_with(BrainOptions {
        lost_after: Duration::from_secs(3),
        ..Default::default()
    });
    let mut w = c.join_worker("sturdy");
    let n = 40;
    let plan = line_plan(&c, n, "sleep 0.05");
    let id = c.run_plan(&plan, &w.id);
    let mut rng = testkit::random::seeded();
    let (mut worker_kills, mut brain_kills) = (0, 0);
    for round in 0..30 {
        std::thread::sleep(Duration::from_millis(50 + rng.random_range(0..300)));
        let both = round >= 15;
        if both && rng.random_bool(0.5) {
            c.kill_brain();
            brain_kills += 1;
        }
        w.kill();
        worker_kills += 1;
        if c.brain.is_none() {
            c.start_brain().unwrap();
        }
        c.restart_worker(&mut w);
    }
    let status = wait_terminal(&c, &id, Duration::from_secs(120));
    assert_eq!(
        status,
        "finished",
        "brain log:\n{}\nworker log:\n{}",
        c.brain_log(),
        w.log_text()
    );
    let interrupted = assert_exactly_once(&c, &w, &id, n);
    eprintln!(
        "worker SIGKILLed {worker_kills} times (together with the brain {brain_kills} times); {interrupted} calls were interrupted and settled by their checks"
    );
}

#[test]
fn an_undecodable_record_fails_only_its_task() {
    let mut c = Cluster::start();
    let w = c.join_worker("two-tasks");
    let plan = line_plan(&c, 30, "sleep 0.1");
    let (a, b) = two_tasks(&c, &plan, &w.id, "running");
    // Damage one record of task A.
    damage_records(&mut c, &a, |events, task| {
        let mut key = task.to_vec();
        key.extend(2u64.to_be_bytes());
        assert!(events.get(&key).unwrap().is_some());
        events.insert(key, b"\xff not a record".to_vec()).unwrap();
    });
    failed_undecodable(&c, &a, "events/");
    c.wait_status(&b, &["finished"], Duration::from_secs(60));
    // Nothing was deleted: the damaged record is still there, shown as an error.
    let out = c.brain_cli(&["task", "log", &a, "--json"]);
    assert_stdout_says(&out, "cannot be decoded");
}

/// A status this code does not know (written by a newer brain, or damaged) is a record that
/// cannot be decoded: its task fails with the key and the reason, and nothing else changes.
#[test]
fn an_unknown_stored_status_fails_only_its_task() {
    let mut c = Cluster::start();
    let mut w = c.join_worker("away");
    w.kill();
    c.wait_for_state(&w.id, "lost", Duration::from_secs(30))
        .unwrap();
    let plan = line_plan(&c, 2, "true");
    let (a, b) = two_tasks(&c, &plan, &w.id, "waiting");
    damage_records(&mut c, &a, |events, task| {
        let (key, value) = events
            .scan_prefix(task)
            .map(|kv| kv.unwrap())
            .find(|(_, v)| String::from_utf8_lossy(v).contains(r#""status":"waiting""#))
            .expect("task A logged that it waits");
        let changed = String::from_utf8_lossy(&value)
            .replace(r#""status":"waiting""#, r#""status":"on_holiday""#);
        events.insert(key, changed.as_bytes()).unwrap();
    });
    failed_undecodable(&c, &a, "on_holiday");
    // The other task waits on, and finishes once its worker is back.
    assert_eq!(c.task_status(&b).as_deref(), Some("waiting"));
    c.restart_worker(&mut w);
    c.wait_status(&b, &["finished"], Duration::from_secs(60));
    assert_eq!(c.task_status(&a).as_deref(), Some("failed"));
}

#[test]
fn cancel_backup_restore_and_a_second_brain() {
    let mut c = Cluster::start();
    let w = c.join_worker("keeper");
    let plan = line_plan(&c, 200, "sleep 0.05");
    let id = c.run_plan(&plan, &w.id);
    // Under way: a few steps done.
    c.wait_records(&id, "tool_call_completed", 3, Duration::from_secs(30));

    // A second brain on the same data dir refuses to start, clearly.
    let out = c.brain_cli(&["serve", "--listen", "127.0.0.1:0"]);
    assert_failed_stderr_says(&out, "another `brain serve`");

    let out = c.brain_cli(&["task", "cancel", &id]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(wait_terminal(&c, &id, Duration::from_secs(30)), "cancelled");

    let backup = c.dir.join("backup.jsonl");
    let out = c.brain_cli(&["backup", backup.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let out = c.brain_cli(&["restore", backup.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "restore must refuse while the brain runs: {}",
        text(&out)
    );

    c.kill_brain();
    let out = c.brain_cli(&["restore", backup.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_stdout_says(&out, "moved to");
    c.start_brain().unwrap();
    assert_eq!(c.task_status(&id).as_deref(), Some("cancelled"));
    c.wait_for_state(&w.id, "connected", Duration::from_secs(20))
        .unwrap();
}

#[test]
fn watch_follows_a_task_to_its_end_and_interrupting_it_only_detaches() {
    let c = Cluster::start();
    let w = c.join_worker("watched");
    // Each step waits at gate 1 until a watcher has started, shown a line and been
    // interrupted.
    let gates = Gates::new();
    let plan = line_plan(&c, 8, &gates.wait(1, Duration::from_secs(60)));
    let id = c.run_plan(&plan, &w.id);

    // Ctrl-C on a watcher leaves the task running. (A shell that started these tests in the
    // background leaves SIGINT ignored, and an ignored signal is inherited: the watcher gets
    // it as a terminal would give it.)
    let mut watch = c.brain_cli_cmd(&["watch", &id]);
    // SAFETY: between fork and exec, only signal(2), which is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut watch, || {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut watcher = watch.stdout(std::process::Stdio::piped()).spawn().unwrap();
    // It is following once it has shown the first record.
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(watcher.stdout.as_mut().unwrap()),
        &mut first,
    )
    .unwrap();
    assert!(first.contains("created"), "{first}");
    testkit::signal(watcher.id(), rustix::process::Signal::INT);
    let gone = testkit::wait_until(Duration::from_secs(20), || {
        watcher.try_wait().unwrap().is_some()
    });
    if !gone {
        let _ = watcher.kill();
    }
    assert!(gone, "the watcher did not stop at Ctrl-C");
    // Not cancelled: still running.
    assert_eq!(c.task_status(&id).as_deref(), Some("running"));
    gates.open(1);

    // A watcher sees events live and exits by itself when the task ends.
    let out = c.brain_cli_cmd(&["watch", &id, "--full"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("issued") && shown.contains("done"),
        "{shown}"
    );
    assert!(
        shown.trim_end().ends_with("finished: all 8 steps done"),
        "{shown}"
    );
    assert_eq!(c.task_status(&id).as_deref(), Some("finished"));
}

#[test]
fn a_long_call_outlives_a_brain_restart_and_its_result_arrives() {
    let mut c = Cluster::start();
    let w = c.join_worker("patient");
    let plan = c.dir.join("long.json");
    // The call runs until the brain is back (gate 1).
    let gates = Gates::new();
    let run = format!(
        "touch started; {}; echo slow >> out.txt",
        gates.wait(1, Duration::from_secs(60))
    );
    let steps = serde_json::json!({"steps": [
        {"run": ["sh", "-c", run], "check": ["grep", "-qx", "slow", "out.txt"]}
    ]});
    std::fs::write(&plan, steps.to_string()).unwrap();
    let id = c.run_plan(&plan, &w.id);
    let num = id.trim_start_matches("t-");
    let started = w.state.join(format!("workspaces/task-{num}/started"));
    assert!(
        testkit::wait_until(Duration::from_secs(20), || started.exists()),
        "the call never started: {}",
        c.brain_log()
    );
    c.kill_brain();
    c.start_brain().unwrap();
    gates.open(1);
    // The call kept running on the worker; its result comes over the new session as soon as
    // it ends, with no further reconnect needed.
    c.wait_status(&id, &["finished"], Duration::from_secs(15));
    let out =
        std::fs::read_to_string(w.state.join(format!("workspaces/task-{num}/out.txt"))).unwrap();
    assert_eq!(out, "slow\n");
    let log = c.task_log_json(&id);
    assert!(
        log.iter().all(|r| r["kind"] != "tool_call_interrupted"),
        "{log:?}"
    );
}

#[test]
fn watch_shows_a_running_calls_output_as_it_is_produced() {
    use std::io::BufRead;
    let c = Cluster::start();
    let w = c.join_worker("chatty");
    let plan = c.dir.join("chatty.json");
    // The second chunk waits until the watcher has seen the first (gate 1).
    let gates = Gates::new();
    let run = format!(
        "echo first-chunk; {}; echo second-chunk",
        gates.wait(1, Duration::from_secs(60))
    );
    let steps = serde_json::json!({"steps": [{"run": ["sh", "-c", run]}]});
    std::fs::write(&plan, steps.to_string()).unwrap();
    let id = c.run_plan(&plan, &w.id);
    let mut watcher = c
        .brain_cli_cmd(&["watch", &id, "--full"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(watcher.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line.contains("first-chunk") {
            break;
        }
    }
    // The call is still running (it waits at the gate after the first line): the output
    // was live.
    assert!(
        seen.iter().all(|l| !l.contains("done ")),
        "first-chunk only arrived with the result: {seen:?}"
    );
    assert_eq!(c.task_status(&id).as_deref(), Some("running"));
    gates.open(1);
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(rest.iter().any(|l| l.contains("second-chunk")), "{rest:?}");
    assert!(
        rest.last().is_some_and(|l| l.contains("finished")),
        "{rest:?}"
    );
    assert!(watcher.wait().unwrap().success());
    assert_eq!(wait_terminal(&c, &id, Duration::from_secs(20)), "finished");
}
