//! Brains as replicas on one PostgreSQL (a cluster made by the test): the second replica takes
//! the store's CA, so one worker enrols once and may talk to either; when the replica driving
//! a task is killed, the worker moves to the other, which takes the task over once its lease
//! lapses, and every step still runs exactly once.

use std::time::Duration;

use testkit::plans::{assert_exactly_once, line_plan};
use testkit::{BrainOptions, Cluster};

/// A brain on `url` as replica `name`, with the secrets key every replica shares.
fn replica(url: &str, name: &str) -> BrainOptions {
    BrainOptions {
        extra_args: vec![
            "--store".into(),
            url.into(),
            "--replica".into(),
            name.into(),
        ],
        env: vec![("TETHER_SECRET_KEY".into(), "5e".repeat(32))],
        ..Default::default()
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn a_task_goes_on_on_another_replica_when_the_one_driving_it_is_killed() {
    let Some(pg) = testkit::postgres::start_or_skip() else {
        return;
    };
    let mut a = Cluster::start_with(replica(&pg.url(), "a"));
    let b = Cluster::start_with(replica(&pg.url(), "b"));
    // b took the store's CA (a's) and left its own aside, with the admin identity it made.
    let ca = |c: &Cluster| std::fs::read_to_string(c.data.join("ca.pem")).unwrap();
    assert_eq!(ca(&a), ca(&b), "both replicas serve under one CA");
    assert!(
        !b.data.join("ca.key").exists(),
        "the CA key is in the store only"
    );
    assert!(!b.data.join("admin").exists());
    copy_dir(&a.data.join("admin"), &b.data.join("admin"));
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
    let out = b.brain_cli(&["workers", "--json"]);
    assert!(
        out.status.success(),
        "a's admin on b: {}",
        testkit::text(&out)
    );

    // One worker, enrolled through a, knowing both.
    let (token, ca_hash) = a.token(&[]);
    let mut join = a.join_cmd("w", &token, &ca_hash);
    join.arg("--brain").arg(b.url());
    let w = a.spawn_worker("w", join);
    let n = 12;
    let plan = line_plan(&a, n, "0.4");
    let id = a.run_plan(&plan, &w.id);
    let steps_done = |c: &Cluster| {
        c.task_log_json(&id)
            .iter()
            .filter(|r| r["kind"] == "tool_call_completed")
            .count()
    };
    assert!(
        testkit::wait_until(Duration::from_secs(60), || steps_done(&a) >= 4),
        "the task made no progress on a: {}",
        a.brain_log()
    );
    a.kill_brain();

    let status = b.wait_status(
        &id,
        &["finished", "failed", "cancelled"],
        Duration::from_secs(120),
    );
    assert_eq!(status, "finished", "on b:\n{}", b.brain_log());
    assert_exactly_once(&b, &w, &id, n);
    assert!(
        b.brain_log().contains("taking over a task"),
        "b says it took the task over"
    );
}
