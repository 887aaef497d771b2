//! End-to-end behaviour of real `brain` and `worker` processes on loopback: enrolment,
//! streamed remote execution, concurrency, process-group kills, loss and reconnection.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::{
    BrainOptions, Cluster, assert_failed_stderr_says, assert_said, assert_stderr_says,
    assert_stdout_says, process_gone, text, wait_until,
};

/// `brain exec ARGS -- sh -c SCRIPT` (ARGS: the worker and flags), to run or spawn.
fn sh_cmd(c: &Cluster, args: &[&str], script: &str) -> Command {
    let mut all = vec!["exec"];
    all.extend_from_slice(args);
    all.extend(["--", "sh", "-c", script]);
    c.brain_cli_cmd(&all)
}

/// `brain exec WORKER -- echo WORD` prints WORD: the worker answers.
fn assert_echoes(c: &Cluster, worker: &str, word: &str) {
    let out = c.brain_cli(&["exec", worker, "--", "echo", word]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{word}\n"),
        "{}",
        text(&out)
    );
}

/// A cluster whose brain marks a worker lost after `lost_after` without a heartbeat.
fn losing_after(lost_after: Duration) -> Cluster {
    Cluster::start_with(BrainOptions {
        lost_after,
        ..Default::default()
    })
}

#[test]
fn enrol_then_exec_streams_output_and_returns_the_exit_code() {
    let c = Cluster::start();
    let w = c.join_worker("alpha");
    let out = sh_cmd(&c, &["alpha"], "echo to-out; echo to-err >&2; exit 3")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "to-out\n");
    assert_stderr_says(&out, "to-err");

    // Output arrives while the command still runs: the first line is readable long before
    // the command ends.
    let mut child = sh_cmd(&c, &[&w.id], "echo first; sleep 3; echo second")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    stdout.read_exact(&mut buf).unwrap();
    let first_after = started.elapsed();
    assert_eq!(&buf, b"first\n");
    let status = child.wait().unwrap();
    let total = started.elapsed();
    assert!(status.success());
    assert!(
        total - first_after >= Duration::from_secs(2),
        "first line came only at the end ({first_after:?} of {total:?}): output is not streamed"
    );

    // The capabilities from the hello are visible.
    let workers = c.workers();
    let me = workers.iter().find(|x| x["id"] == w.id.as_str()).unwrap();
    assert_eq!(me["os"], std::env::consts::OS);
    assert!(me["cpus"].as_u64().unwrap() >= 1);
    assert!(me["memory_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn twenty_concurrent_execs_on_one_session() {
    let c = Cluster::start();
    let w = c.join_worker("busy");
    // Each command announces itself, then waits until all twenty have started. If the
    // session ran calls one at a time, none could finish (each gives up after 30 s).
    let script = r#"touch "started.$N"; i=0; while [ "$(ls started.* | wc -l)" -lt 20 ]; do i=$((i+1)); [ $i -gt 600 ] && exit 9; sleep 0.05; done; echo "done $N""#;
    let children: Vec<_> = (0..20)
        .map(|n| {
            sh_cmd(&c, &[&w.id], &script.replace("$N", &n.to_string()))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (n, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "call {n}: {}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("done {n}\n"));
    }
}

#[test]
fn timeout_kills_the_whole_process_group_and_output_is_capped() {
    let c = Cluster::start();
    let w = c.join_worker("killer");
    let out = sh_cmd(
        &c,
        &[&w.id, "--timeout", "1s"],
        "sleep 300 & echo $! >> pids; (sleep 300 & echo $! >> pids; wait) & sleep 300",
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(124), "{}", text(&out));
    assert_stderr_says(&out, "timed out");
    let pids = std::fs::read_to_string(w.workspace().join("pids")).unwrap();
    let pids: Vec<u32> = pids.lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(pids.len(), 2, "{pids:?}");
    for pid in pids {
        assert!(
            wait_until(Duration::from_secs(5), || process_gone(pid)),
            "grandchild sleep {pid} survived the timeout"
        );
    }

    let out = c.brain_cli(&[
        "exec",
        &w.id,
        "--output-cap",
        "1000",
        "--",
        "head",
        "-c",
        "50000",
        "/dev/zero",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(out.stdout.len(), 1000);
    assert_stderr_says(&out, "49000 bytes of output dropped");
}

#[test]
fn a_cancelled_exec_kills_the_command_on_the_worker() {
    let c = Cluster::start();
    let w = c.join_worker("quitter");
    let mut cli = sh_cmd(&c, &[&w.id], "echo $$ > pid; exec sleep 300")
        .spawn()
        .unwrap();
    let pid_file = w.workspace().join("pid");
    assert!(wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n'))
    }));
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!process_gone(pid), "the command should be running");
    // The person running `brain exec` goes away (Ctrl-C, closed terminal, killed).
    cli.kill().unwrap();
    cli.wait().unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || process_gone(pid)),
        "the command outlived its caller"
    );
}

#[test]
fn worker_sigkill_is_seen_as_lost_and_it_comes_back_with_its_identity() {
    let lost_after = Duration::from_secs(2);
    let c = losing_after(lost_after);
    let mut w = c.join_worker("phoenix");

    // A call in flight when the worker dies ends with the worker-lost status.
    let exec = sh_cmd(&c, &[&w.id], "touch started; exec sleep 30")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || w
            .workspace()
            .join("started")
            .exists()),
        "the command never started: {}",
        w.log_text()
    );
    let killed_at = Instant::now();
    w.kill();
    let out = exec.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert_stderr_says(&out, "lost");
    c.wait_for_state(&w.id, "lost", lost_after + Duration::from_secs(3))
        .unwrap();
    assert!(killed_at.elapsed() < lost_after + Duration::from_secs(3));

    // Exec against a lost worker fails fast with the same status.
    let out = c.brain_cli(&["exec", &w.id, "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));

    c.restart_worker(&mut w);
    let id = c
        .wait_for_state(&w.id, "connected", Duration::from_secs(20))
        .unwrap();
    assert_eq!(
        id, w.id,
        "the worker must come back with its stored identity"
    );
    assert_echoes(&c, &w.id, "back");
}

#[test]
fn a_frozen_worker_is_marked_lost_by_heartbeat_timeout_and_recovers() {
    // SIGSTOP keeps the TCP connection open: only the heartbeat deadline can notice.
    let lost_after = Duration::from_secs(2);
    let c = losing_after(lost_after);
    let mut w = c.join_worker("frozen");
    let pid = w.proc.as_ref().unwrap().pid() as i32;
    testkit::signal(pid as u32, rustix::process::Signal::STOP);
    let stopped = Instant::now();
    c.wait_for_state(&w.id, "lost", lost_after + Duration::from_secs(3))
        .unwrap();
    let took = stopped.elapsed();
    assert!(
        took >= lost_after - Duration::from_millis(200),
        "lost too early: {took:?}"
    );
    testkit::signal(pid as u32, rustix::process::Signal::CONT);
    c.wait_for_state(&w.id, "connected", Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}\nworker log:\n{}", w.log_text()));
    assert_echoes(&c, &w.id, "thawed");
    w.kill();
}

#[test]
fn brain_restart_and_the_worker_reconnects_by_itself() {
    let mut c = Cluster::start();
    let w = c.join_worker("loyal");
    c.kill_brain();
    // The worker sees its session end before the brain is back.
    w.wait_says("session with the brain ended", Duration::from_secs(20));
    c.start_brain().unwrap();
    c.wait_for_state(&w.id, "connected", Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}\nworker log:\n{}", w.log_text()));
    assert_echoes(&c, &w.id, "again");
    assert_eq!(c.workers().len(), 1, "no duplicate enrolment after restart");
}

/// A worker given several brains (brains sharing one store, as replicas do) remembers the
/// others it joined with, and dials the next when one does not answer.
#[test]
fn a_worker_given_several_brains_skips_one_that_is_down() {
    let c = Cluster::start();
    // An address where nothing listens.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("https://127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let (token, ca_hash) = c.token(&[]);
    let mut join = c.join_cmd("several", &token, &ca_hash);
    join.arg("--brain").arg(&dead);
    let mut w = c.spawn_worker("several", join);
    let membership = std::fs::read_to_string(w.state.join("worker.json")).unwrap();
    assert!(membership.contains(&dead), "{membership}");
    // Started again with the dead one first: it moves on to the one that answers.
    w.kill();
    let mut run = std::process::Command::new(&c.bins.worker);
    run.arg("run")
        .arg("--state")
        .arg(&w.state)
        .arg("--brain")
        .arg(&dead)
        .arg("--brain")
        .arg(c.url())
        .env("RUST_LOG", "info");
    w.proc = Some(testkit::Proc::spawn(run, &w.state.with_extension("run.log")).unwrap());
    assert!(
        wait_until(Duration::from_secs(30), || {
            let log =
                std::fs::read_to_string(w.state.with_extension("run.log")).unwrap_or_default();
            log.contains("cannot connect to the brain") && log.contains(&dead)
        }),
        "the dead brain was not tried first"
    );
    assert_echoes(&c, &w.id, "skipped");
    // The brain stays the one the identity was issued by.
    assert_eq!(c.workers().len(), 1);
}

#[test]
fn brain_shuts_down_cleanly_on_sigterm() {
    let mut c = Cluster::start();
    let _w = c.join_worker("calm");
    let mut brain = c.brain.take().unwrap();
    let status = brain
        .terminate(Duration::from_secs(10))
        .expect("brain did not stop within 10s of SIGTERM");
    assert!(status.success(), "{status:?}\n{}", brain.log_text());
    assert!(brain.log_text().contains("brain stopped"));
}

#[test]
fn file_operations_round_trip() {
    let c = Cluster::start();
    let w = c.join_worker("files");
    let src = c.dir.join("payload.bin");
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&src, &payload).unwrap();
    let out = c.brain_cli(&[
        "file",
        "write",
        &w.id,
        "dir/sub/p.bin",
        "--from",
        src.to_str().unwrap(),
        "-p",
        "--mode",
        "755",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read(w.workspace().join("dir/sub/p.bin")).unwrap(),
        payload
    );

    let out = c.brain_cli(&[
        "file",
        "read",
        &w.id,
        "dir/sub/p.bin",
        "--offset",
        "1000",
        "--length",
        "10",
    ]);
    assert_eq!(out.stdout, payload[1000..1010], "{}", text(&out));

    let out = c.brain_cli(&["file", "stat", &w.id, "dir/sub/p.bin"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.starts_with("- 0755     200000 dir/sub/p.bin"), "{s}");

    let out = c.brain_cli(&["file", "ls", &w.id, "dir"]);
    assert_stdout_says(&out, "d 0755");

    let out = c.brain_cli(&["file", "rm", &w.id, "dir", "-r"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!w.workspace().join("dir").exists());

    let out = c.brain_cli(&["file", "read", &w.id, "dir/sub/p.bin"]);
    assert_failed_stderr_says(&out, "dir/sub/p.bin");
}

/// `brain workers | head -0`: every command whose output pipe closes ends quietly (141, as a
/// Unix tool killed by SIGPIPE), never with a panic or an error message: the listings, their
/// `--json`, a task's log, a file's bytes, a remote command's output, the worker's doctor.
#[test]
fn cli_output_into_a_closed_pipe_ends_quietly() {
    let c = Cluster::start();
    let w = c.join_worker("piped");
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    std::fs::write(
        &plan,
        r#"{"steps": [{"write": {"path": "big.txt", "content": "x\n"}}]}"#,
    )
    .unwrap();
    let task = c.run_plan(&plan, "piped");
    c.wait_status(&task, &["finished"], Duration::from_secs(30));
    let ws = format!("task-{}", task.trim_start_matches("t-"));
    let brain_runs: Vec<Vec<&str>> = vec![
        vec!["workers"],
        vec!["workers", "--json"],
        vec!["machines"],
        vec!["machines", "--json"],
        vec!["tasks"],
        vec!["tasks", "--json"],
        vec!["task", "show", &task],
        vec!["task", "log", &task],
        vec!["task", "log", &task, "--json"],
        vec!["watch", &task],
        vec!["task", "diff", &task],
        vec!["token", "create"],
        vec!["admin", "token", "list"],
        vec!["file", "read", "piped", "big.txt", "--workspace", &ws],
        vec!["file", "ls", "piped", ".", "--workspace", &ws],
        vec!["exec", "piped", "--", "echo", "hello"],
    ];
    let mut runs: Vec<(String, std::process::Command)> = brain_runs
        .iter()
        .map(|a| (format!("brain {a:?}"), c.brain_cli_cmd(a)))
        .collect();
    let mut doctor = std::process::Command::new(&c.bins.worker);
    doctor.arg("doctor").arg("--state").arg(&w.state);
    runs.push(("worker doctor".into(), doctor));
    for (what, mut cmd) in runs {
        testkit::assert_quiet_into_a_closed_pipe(&what, &mut cmd);
    }
}

#[test]
fn task_wait_follows_a_task_to_the_status_asked_for_and_says_when_it_cannot() {
    let c = Cluster::start();
    let w = c.join_worker("wait");
    let plan = c.dir.join("slow.json");
    std::fs::write(
        &plan,
        serde_json::json!({"steps": [{"run": ["sleep", "60"], "timeout": "2m"}]}).to_string(),
    )
    .unwrap();
    let id = c.run_plan(&plan, &w.id);
    let wait = |args: &[&str]| {
        let mut all = vec!["task", "wait", id.as_str()];
        all.extend_from_slice(args);
        c.brain_cli(&all)
    };
    // Running: reached (as it is now, not a status it passed through).
    let out = wait(&["--until", "running", "--timeout", "30s"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "running");
    // Not finished in time: 124, and says what it waited for.
    let out = wait(&["--until", "finished", "--timeout", "300ms"]);
    assert_eq!(out.status.code(), Some(124), "{}", text(&out));
    assert_said(&out, "did not reach finished");
    // A waiter started before the end hears of it: by default it waits for any end.
    let waiter = c
        .brain_cli_cmd(&["task", "wait", &id, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = c.brain_cli(&["task", "cancel", &id]);
    assert!(out.status.success(), "{}", text(&out));
    let out = waiter.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(said["status"], "cancelled", "{said}");
    assert_eq!(said["reached"], true, "{said}");
    // Ended otherwise: 1 at once, with the status it ended in.
    let out = wait(&["--until", "finished,failed"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "cancelled");
    assert_said(&out, "ended cancelled");
    assert_said(&out, "not finished or failed");
    // A status that does not exist is a usage error that lists those that do.
    let out = wait(&["--until", "done"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_said(&out, "budget_exhausted");
}
