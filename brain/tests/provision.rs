//! Provisioning with the real binaries: the brain creates local worker processes, they join
//! and run commands; release, quotas, the reaper, join deadlines, a brain SIGKILLed between
//! "create started" and "create recorded", and workers that give up on a vanished brain.

use std::time::Duration;

use testkit::{
    BrainOptions, Cluster, assert_failed_saying, assert_said, pids_mentioning,
    processes_started_in, text, wait_until,
};

fn config(extra: &str) -> String {
    format!("[provision]\nreaper_every = \"200ms\"\n{extra}\n")
}

fn cluster(extra: &str) -> Cluster {
    Cluster::start_with(BrainOptions {
        config: Some(config(extra)),
        ..BrainOptions::default()
    })
}

/// `brain provision local` and the id it printed.
fn provision(c: &Cluster, extra: &[&str]) -> String {
    let mut args = vec!["provision", "local"];
    args.extend_from_slice(extra);
    let out = c.brain_cli(&args);
    assert!(
        out.status.success(),
        "brain provision local: {}",
        text(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let id = stdout
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(id.starts_with("m-"), "provision printed: {stdout}");
    id
}

/// Worker processes of machine `id` (found by their state dir on the command line).
/// The worker processes a machine started (not the checks they fork for a moment).
fn machine_pids(c: &Cluster, id: &str) -> Vec<u32> {
    processes_started_in(&c.data.join("machines").join(id))
}

fn exec_on(c: &Cluster, worker: &str, argv: &[&str]) -> std::process::Output {
    let mut args = vec!["exec", "--workspace", "w", worker, "--"];
    args.extend_from_slice(argv);
    c.brain_cli(&args)
}

fn gone(c: &Cluster, id: &str) -> bool {
    pids_mentioning(&c.data.join("machines").join(id)).is_empty()
        && !c.data.join("machines").join(id).exists()
}

#[test]
fn a_local_machine_joins_runs_a_command_and_is_released_without_a_trace() {
    let c = cluster("");
    let id = provision(&c, &["--label", "size=small"]);
    let m = c.machine(&id);
    assert_eq!(m["state"], "ready", "{m}");
    assert_eq!(m["connected"], true, "{m}");
    assert_eq!(m["provider"], "local");
    let worker = m["worker_id"].as_str().unwrap().to_string();
    assert_eq!(machine_pids(&c, &id).len(), 1, "one worker process");

    // It is a worker like any other: labelled, and it runs commands.
    let w = c
        .workers()
        .into_iter()
        .find(|w| w["id"] == worker.as_str())
        .expect("the machine's worker is listed");
    assert_eq!(w["labels"]["size"], "small", "{w}");
    assert_eq!(w["labels"]["tether.machine"], id.as_str(), "{w}");
    let out = exec_on(&c, &worker, &["sh", "-c", "echo hello-from-$((6*7))"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("hello-from-42"));

    // The join token never shows in the process list.
    let pid = machine_pids(&c, &id)[0];
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains("tj_"),
        "the token is on the command line"
    );

    // The table view works too.
    let out = c.brain_cli(&["machines"]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&id));

    let out = c.brain_cli(&["machines", "release", &id]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(gone(&c, &id), "the worker process and its files are gone");
    let m = c.machine(&id);
    assert_eq!(m["state"], "released", "{m}");
    assert!(c.machines(false).iter().all(|m| m["id"] != id.as_str()));
    assert_eq!(c.worker_state(&worker).as_deref(), Some("revoked"));

    // Released twice: a clear refusal.
    let out = c.brain_cli(&["machines", "release", &id]);
    assert_failed_saying(&out, "already released");
    let out = c.brain_cli(&["machines", "release", "m-nope"]);
    assert_failed_saying(&out, "no machine");
}

#[test]
fn quotas_refuse_with_a_clear_error_and_count_only_live_machines() {
    let c = cluster(
        "[provision.providers.local]\nmax_machines = 1\nusd_per_hour = 0.5\nmax_usd_per_hour = 2.0",
    );
    let first = provision(&c, &[]);
    let out = c.brain_cli(&["provision", "local"]);
    assert!(!out.status.success(), "a second machine was allowed");
    let msg = text(&out);
    assert!(
        msg.contains("at most 1 machine") && msg.contains("max_machines"),
        "{msg}"
    );
    assert_eq!(c.machines(false).len(), 1, "the refusal left no record");
    assert!(c.machine(&first)["usd_per_hour"].as_f64() == Some(0.5));

    // Released machines do not count.
    let out = c.brain_cli(&["machines", "release", &first]);
    assert!(out.status.success(), "{}", text(&out));
    let second = provision(&c, &[]);
    assert_ne!(first, second);
}

#[test]
fn cost_quota_refuses_what_would_cost_too_much() {
    let c = cluster(
        "[provision.providers.local]\nmax_machines = 5\nusd_per_hour = 1.5\nmax_usd_per_hour = 2.0",
    );
    provision(&c, &[]);
    let out = c.brain_cli(&["provision", "local"]);
    assert_failed_saying(&out, "$2.00/h");
}

#[test]
fn a_machine_that_never_joins_is_destroyed_after_the_deadline() {
    // Workers dial a port nobody listens on, so they never join.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let c = cluster(&format!(
        "brain_url = \"https://127.0.0.1:{port}\"\njoin_timeout = \"3s\""
    ));
    let out = c.brain_cli(&["provision", "local", "--wait", "0s"]);
    assert!(out.status.success(), "{}", text(&out));
    let id = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert_eq!(c.machine(&id)["state"], "joining");
    c.wait_machine_state(&id, "released", Duration::from_secs(20));
    let m = c.machine(&id);
    assert!(m["note"].as_str().unwrap().contains("did not join"), "{m}");
    assert!(gone(&c, &id), "its process or files are left");
}

#[test]
fn reconcile_running_during_creates_leaves_them_alone() {
    // Reconcile every 10 ms, so passes overlap creates: a record still `creating` because its
    // create is running must not be taken for one a crash interrupted.
    let c = Cluster::start_with(BrainOptions {
        config: Some(
            "[provision]\nreaper_every = \"1ms\"\nreconcile_every = \"1ms\"\n[provision.providers.local]\nmax_machines = 12".into(),
        ),
        ..BrainOptions::default()
    });
    let ids: Vec<String> = std::thread::scope(|s| {
        let creates: Vec<_> = (0..12)
            .map(|_| s.spawn(|| provision(&c, &["--wait", "0s"])))
            .collect();
        creates.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for id in &ids {
        wait_until(Duration::from_secs(30), || {
            !matches!(
                c.machine(id)["state"].as_str(),
                Some("creating" | "joining")
            )
        });
        let m = c.machine(id);
        assert_eq!(m["state"], "ready", "{m}");
    }
}

#[test]
fn the_reaper_releases_an_idle_machine_and_one_past_its_time_to_live() {
    let c = cluster("idle_timeout = \"2s\"\nttl = \"1h\"");
    let idle = provision(&c, &[]);
    released_for(&c, &idle, "no task used it");

    let c = cluster("ttl = \"4s\"\nidle_timeout = \"0s\"");
    let old = provision(&c, &[]);
    released_for(&c, &old, "time to live");
}

/// Waits (20 s at most) for the reaper to release machine `id`, its note saying `why`, and
/// for nothing of it to be left.
fn released_for(c: &Cluster, id: &str, why: &str) {
    c.wait_machine_state(id, "released", Duration::from_secs(20));
    let note = c.machine(id)["note"].as_str().unwrap().to_string();
    assert!(note.contains(why), "{note}");
    assert!(gone(c, id));
}

/// The brain is SIGKILLed after the provider made the machine and before the record says so.
#[test]
fn a_brain_killed_between_create_and_record_finds_the_machine_on_restart() {
    let mut c = cluster("");
    c.kill_brain();
    c.opts.env = vec![("TETHER_FAILPOINT".into(), "provision-created".into())];
    c.start_brain().unwrap();
    let out = c.brain_cli(&["provision", "local", "--wait", "0s"]);
    assert!(
        !out.status.success(),
        "the brain should have died: {}",
        text(&out)
    );
    let brain = c.brain.as_mut().unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || !brain.is_running()),
        "the failpoint did not kill the brain"
    );
    c.kill_brain();
    // The machine exists, and the store only knows it was being created.
    let orphans = processes_started_in(&c.data.join("machines"));
    assert_eq!(orphans.len(), 1, "one worker process was started");

    c.start_brain().unwrap();
    let all = c.machines(true);
    assert_eq!(all.len(), 1, "{all:?}");
    let id = all[0]["id"].as_str().unwrap().to_string();
    // Adopted (it joins with the token it was given and serves), or, when the crash also
    // cost it its token (an enrolment whose answer never arrived), closed with nothing left.
    let m = c.wait_settled(&id, Duration::from_secs(20));
    if m["state"] == "ready" {
        assert!(m["note"].as_str().unwrap().contains("adopted"), "{m}");
        let worker = m["worker_id"].as_str().unwrap();
        let out = exec_on(&c, worker, &["true"]);
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(
            machine_pids(&c, &id),
            orphans,
            "the same process, not a second one"
        );
        let out = c.brain_cli(&["machines", "release", &id]);
        assert!(out.status.success(), "{}", text(&out));
    } else {
        eprintln!("the interrupted machine was closed: {}", m["note"]);
    }
    assert!(wait_until(Duration::from_secs(10), || gone(&c, &id)));
}

/// A marked process no record names is destroyed on start; recorded machines are kept.
#[test]
fn reconcile_closes_empty_intents_and_destroys_orphans() {
    let mut c = cluster("");
    let id = provision(&c, &[]);
    let pid = machine_pids(&c, &id)[0];
    c.kill_brain();
    let data = c.data.clone();
    std::fs::create_dir_all(data.join("machines").join("m-0000feedbeef")).unwrap();
    // A process carrying the marker of a machine no record names.
    let mut orphan = std::process::Command::new("python3")
        .args(["-c", "import time; time.sleep(300)"])
        .arg("--state")
        .arg(data.join("machines").join("m-0000feedbeef"))
        .spawn()
        .unwrap();
    let orphan_pid = orphan.id();
    c.start_brain().unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || orphan
            .try_wait()
            .unwrap()
            .is_some()),
        "the unrecorded machine {orphan_pid} was not destroyed"
    );
    assert!(
        wait_until(Duration::from_secs(5), || !data
            .join("machines")
            .join("m-0000feedbeef")
            .exists()),
        "the orphan's files are left"
    );
    // The recorded one was left alone and reconnected.
    assert!(!testkit::process_gone(pid));
    assert!(
        wait_until(Duration::from_secs(20), || c.machine(&id)["connected"]
            == true),
        "{}",
        c.machine(&id)
    );
}

/// The dead-man switch: a brain SIGKILLed and kept down past `worker_exit_after` leaves no
/// machine behind — the worker process exits and removes its files.
#[test]
fn a_provisioned_worker_exits_and_removes_its_files_when_the_brain_stays_unreachable() {
    let mut c = cluster("worker_exit_after = \"2s\"");
    let id = provision(&c, &[]);
    let pid = machine_pids(&c, &id)[0];
    let dir = c.data.join("machines").join(&id);
    assert!(dir.join("worker.log").exists());
    c.kill_brain();
    assert!(
        wait_until(Duration::from_secs(30), || testkit::process_gone(pid)),
        "the worker kept running without a brain"
    );
    assert!(
        wait_until(Duration::from_secs(5), || !dir.exists()),
        "the machine's files are left: {:?}",
        std::fs::read_dir(&dir).map(|d| d.count())
    );
    assert!(testkit::processes_started_in(&dir).is_empty());
}

/// `request_environment` refusals reach the model as observations it can act on: a person's
/// denial (the offer costs more than the approval threshold), then the provider's quota.
#[test]
fn request_environment_refusals_come_back_to_the_model() {
    let c = cluster(
        "approval_above_usd_per_hour = 1.0\n\
         [provision.providers.local]\nmax_machines = 1\nusd_per_hour = 1.5\n\
         [[provision.offers]]\nprovider = \"local\"\ncpu = 1\nmemory_gb = 1\nlabels = { size = \"large\" }",
    );
    let small = provision(&c, &[]);
    let worker = c.machine(&small)["worker_id"].as_str().unwrap().to_string();
    let ask = |reason: &str| {
        let args = serde_json::json!({"labels": {"size": "large"}, "reason": reason});
        ("request_environment", args)
    };
    let task = c
        .agent()
        .replay(&[
            ask("first try"),
            ask("second try"),
            ("finish", serde_json::json!({"summary": "stayed"})),
        ])
        .worker(&worker)
        .start("try to grow");
    let waiting = |c: &Cluster| {
        c.wait_status(
            &task,
            &["waiting", "finished", "failed"],
            Duration::from_secs(30),
        )
    };
    assert_eq!(waiting(&c), "waiting");
    let out = c.brain_cli(&["deny", &task, "--reason", "too dear"]);
    assert!(out.status.success(), "{}", text(&out));
    // The second ask: approved, but the quota (one local machine, in use) refuses.
    c.wait_records(&task, "approval_requested", 2, Duration::from_secs(30));
    let out = c.brain_cli(&["approve", &task]);
    assert!(out.status.success(), "{}", text(&out));
    c.wait_status(&task, &["finished"], Duration::from_secs(30));
    let log = String::from_utf8_lossy(&c.brain_cli(&["task", "log", &task, "--json"]).stdout)
        .into_owned();
    assert!(log.contains("denied this call (too dear)"), "{log}");
    assert!(
        log.contains("no environment") && log.contains("at most 1 machine"),
        "{log}"
    );
    // Nothing was created, and the task never left its machine.
    assert_eq!(c.machines(true).len(), 1);
    assert_eq!(c.machine(&small)["state"], "ready");
}

/// A brain restarted while a task's `request_environment` waits for approval: the resumed
/// task is given its machine once approved. (Tasks used to be resumed before the brain's
/// machines were wired in, so a resumed request could find "no other machines".)
#[test]
fn a_task_resumed_with_a_pending_request_environment_gets_its_machine() {
    let mut c = cluster(
        "approval_above_usd_per_hour = 1.0\n\
         [provision.providers.local]\nmax_machines = 2\nusd_per_hour = 1.5\n\
         [[provision.offers]]\nprovider = \"local\"\ncpu = 1\nmemory_gb = 1\nlabels = { size = \"large\" }",
    );
    let home = c.join_worker("home");
    let task = c
        .agent()
        .replay(&[
            (
                "request_environment",
                serde_json::json!({"labels": {"size": "large"}, "reason": "bigger"}),
            ),
            (
                "run_command",
                serde_json::json!({"command": "echo grown > where.txt"}),
            ),
            ("finish", serde_json::json!({"summary": "grew"})),
        ])
        .worker(&home.id)
        .start("grow");
    c.wait_status(&task, &["waiting"], Duration::from_secs(30));
    let reason = c.brain_cli(&["task", "show", &task]);
    assert_said(&reason, "approval");
    c.kill_brain();
    c.start_brain().unwrap();
    // The request is still waiting after the restart; approving it gets the machine.
    c.wait_status(&task, &["waiting"], Duration::from_secs(30));
    let out = c.brain_cli(&["approve", &task]);
    assert!(out.status.success(), "{}", text(&out));
    c.wait_status(&task, &["finished"], Duration::from_secs(60));
    let log = String::from_utf8_lossy(&c.brain_cli(&["task", "log", &task, "--json"]).stdout)
        .into_owned();
    assert!(log.contains("now running on machine"), "{log}");
    assert!(!log.contains("no other machines"), "{log}");
    let made: Vec<serde_json::Value> = c
        .machines(true)
        .into_iter()
        .filter(|m| m["task_id"] == task.as_str())
        .collect();
    assert_eq!(made.len(), 1, "{made:?}");
    let worker = made[0]["worker_id"].as_str().unwrap();
    let out = c.brain_cli(&[
        "exec",
        "--workspace",
        &format!("task-{}", task.trim_start_matches("t-")),
        worker,
        "--",
        "cat",
        "where.txt",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "grown",
        "{}",
        text(&out)
    );
}

/// `brain provision` on a terminal shows what it waits for as it goes (one line redrawn on
/// stderr); with `--json`, or into a pipe, it prints only the answer.
#[test]
fn provisioning_shows_progress_on_a_terminal_and_json_prints_only_the_machine() {
    let c = cluster("");
    // A real terminal: util-linux's `script` runs the command on a pty.
    let on_a_terminal = |args: &str| {
        let line = format!(
            "{} --data {} {args}",
            c.bins.brain.display(),
            c.data.display()
        );
        let out = std::process::Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env_remove("TETHER_BRAIN")
            .env_remove("TETHER_IDENTITY")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run script (util-linux)");
        assert!(out.status.success(), "{args}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shown = on_a_terminal("provision local");
    assert!(
        shown.contains("provisioning a local machine") && shown.contains("\r\x1b[2K"),
        "no progress line: {shown:?}"
    );
    assert!(shown.contains(" is ready: worker "), "{shown:?}");

    let shown = on_a_terminal("provision local --json");
    assert!(
        !shown.contains("\x1b[2K"),
        "progress under --json: {shown:?}"
    );
    let m: serde_json::Value = serde_json::from_str(shown.trim()).expect("JSON alone");
    assert_eq!(m[0]["state"], "ready", "{m}");

    // Into a pipe: the JSON on stdout and nothing on stderr.
    let out = c.brain_cli(&["provision", "local", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(out.stderr.is_empty(), "{}", text(&out));
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = m[0]["id"].as_str().unwrap();
    assert_eq!(m[0]["provider"], "local");
    assert!(!m[0]["worker_id"].as_str().unwrap().is_empty(), "{m}");
    assert_eq!(c.machine(id)["state"], "ready");
}
