//! Brains as replicas on one PostgreSQL (a cluster made by the test): the second replica takes
//! the store's CA, so one worker enrols once and may talk to either; when the replica driving
//! a task is killed or frozen, the worker moves to the other, which takes the task over once
//! its lease lapses, and every step still runs exactly once; a frozen replica that wakes up
//! lands nothing more. PostgreSQL itself restarting mid-task loses nothing.

use std::time::Duration;

use testkit::plans::{assert_exactly_once, line_plan};
use testkit::{Cluster, Worker};

/// Waits for task `id` to end on replica `c`, and checks it finished.
fn assert_finishes(c: &Cluster, id: &str) {
    let status = c.wait_status(
        id,
        &["finished", "failed", "cancelled"],
        Duration::from_secs(120),
    );
    assert_eq!(status, "finished", "{}", c.brain_log());
}

#[test]
fn a_task_goes_on_on_another_replica_when_the_one_driving_it_is_killed() {
    let Some(pg) = testkit::postgres::start_or_skip() else {
        return;
    };
    // One worker, enrolled through a, knowing both.
    let (mut a, b, w) = two_replicas(&pg);
    // b took the store's CA (a's) and left its own aside, with the admin identity it made;
    // it has one of its own under the store's CA.
    let ca = |c: &Cluster| std::fs::read_to_string(c.data.join("ca.pem")).unwrap();
    assert_eq!(ca(&a), ca(&b), "both replicas serve under one CA");
    assert!(
        !b.data.join("ca.key").exists(),
        "the CA key is in the store only"
    );
    let cert = |c: &Cluster| std::fs::read_to_string(c.data.join("admin/cert.pem")).unwrap();
    assert_ne!(cert(&a), cert(&b));
    // A replica with another secrets key cannot open the store's CA: refused, in words.
    let other = a.dir.join("other");
    let brain = |args: &[&str], key: &str| {
        std::process::Command::new(&a.bins.brain)
            .arg("--data")
            .arg(&other)
            .args(args)
            .env("TETHER_SECRET_KEY", key)
            .output()
            .unwrap()
    };
    assert!(brain(&["init"], "").status.success());
    let url = pg.url();
    let refused = brain(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            &url,
            "--replica",
            "c",
        ],
        &"a1".repeat(32),
    );
    assert!(!refused.status.success());
    let said = testkit::text(&refused);
    assert!(said.contains("sealed with another secrets key"), "{said}");
    assert!(
        !said.contains(&url),
        "the URL (and its password) stays out: {said}"
    );
    // b's admin identity works on b and on a.
    let out = b.brain_cli(&["workers", "--json"]);
    assert!(
        out.status.success(),
        "b's admin on b: {}",
        testkit::text(&out)
    );
    // (a reads the registry again each second: b's admin counts there within one.)
    let mut said = String::new();
    let on_a = testkit::wait_until(Duration::from_secs(10), || {
        let out = b.brain_cli(&["--brain", &a.url(), "workers"]);
        said = testkit::text(&out);
        out.status.success()
    });
    assert!(on_a, "b's admin on a: {said}");

    let n = 12;
    let plan = line_plan(&a, n, "0.4");
    let id = a.run_plan(&plan, &w.id);
    assert!(
        testkit::wait_until(Duration::from_secs(60), || calls_done(&a, &id) >= 4),
        "the task made no progress on a: {}",
        a.brain_log()
    );
    // One leader for the work there must be only one of: a, which started first.
    assert!(a.brain_log().contains("this replica now leads"));
    assert!(!b.brain_log().contains("this replica now leads"));
    a.kill_brain();

    assert_finishes(&b, &id);
    assert_exactly_once(&b, &w, &id, n);
    assert!(
        b.brain_log().contains("taking over a task"),
        "b says it took the task over"
    );
    assert!(
        testkit::wait_until(Duration::from_secs(30), || b
            .brain_log()
            .contains("this replica now leads")),
        "b leads once a's leader lease lapsed"
    );
}

/// Replicas a and b on `pg` (a's admin identity copied to b) and a worker enrolled through a
/// that knows both.
fn two_replicas(pg: &testkit::postgres::Postgres) -> (Cluster, Cluster, Worker) {
    let a = Cluster::start_with(pg.replica("a"));
    let b = Cluster::start_with(pg.replica("b"));
    let (token, ca_hash) = a.token(&[]);
    let mut join = a.join_cmd("w", &token, &ca_hash);
    join.arg("--brain").arg(b.url());
    let w = a.spawn_worker("w", join);
    (a, b, w)
}

/// Calls of task `id` completed, as replica `c` shows its log.
fn calls_done(c: &Cluster, id: &str) -> usize {
    c.task_log_json(id)
        .iter()
        .filter(|r| r["kind"] == "tool_call_completed")
        .count()
}

#[test]
fn a_frozen_replica_lands_nothing_after_its_lease_lapsed_and_says_so() {
    let Some(pg) = testkit::postgres::start_or_skip() else {
        return;
    };
    let (a, b, w) = two_replicas(&pg);
    let n = 12;
    let plan = line_plan(&a, n, "0.4");
    let id = a.run_plan(&plan, &w.id);
    assert!(testkit::wait_until(Duration::from_secs(60), || calls_done(
        &a, &id
    ) >= 3));
    let pid = a.brain.as_ref().unwrap().pid();
    testkit::signal(pid, rustix::process::Signal::STOP);
    // Past a's lease, b has the task and moves it on.
    let moved_on = testkit::wait_until(Duration::from_secs(60), || {
        b.brain_log().contains("taking over a task") && calls_done(&b, &id) >= 6
    });
    testkit::signal(pid, rustix::process::Signal::CONT);
    assert!(moved_on, "b did not take the task over:\n{}", b.brain_log());
    assert_finishes(&b, &id);
    // Nothing a wrote after waking up landed: every line once, the log without a gap.
    assert_exactly_once(&b, &w, &id, n);
    assert!(
        testkit::wait_until(Duration::from_secs(30), || a
            .brain_log()
            .contains("no longer holds task")),
        "a says it lost the task:\n{}",
        a.brain_log()
    );

    // Attack: an admin revoked on one replica keeps using another. Refused there within the
    // registry's one-second read.
    let out = a.brain_cli(&["admin", "revoke", "admin-b"]);
    assert!(out.status.success(), "{}", testkit::text(&out));
    assert!(
        testkit::wait_until(Duration::from_secs(10), || !b
            .brain_cli(&["workers"])
            .status
            .success()),
        "b still takes an admin revoked on a"
    );
}

#[test]
fn a_task_goes_on_when_postgresql_restarts_under_it() {
    let Some(pg) = testkit::postgres::start_or_skip() else {
        return;
    };
    let a = Cluster::start_with(pg.replica("a"));
    let w = a.join_worker("w");
    let n = 10;
    let plan = line_plan(&a, n, "0.3");
    let id = a.run_plan(&plan, &w.id);
    assert!(testkit::wait_until(Duration::from_secs(60), || calls_done(
        &a, &id
    ) >= 3));
    pg.stop();
    // Down for a while: the task's next appends wait and retry.
    std::thread::sleep(Duration::from_secs(2));
    pg.restart();
    assert!(pg.wait_ready(Duration::from_secs(30)));
    assert_finishes(&a, &id);
    assert_exactly_once(&a, &w, &id, n);
}
