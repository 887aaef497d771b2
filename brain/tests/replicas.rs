//! Brains as replicas on one PostgreSQL (a cluster made by the test): the second replica takes
//! the store's CA, so one worker enrols once and may talk to either; when the replica driving
//! a task is killed or frozen, the worker moves to the other, which takes the task over once
//! its lease lapses, and every step still runs exactly once; a frozen replica that wakes up
//! lands nothing more. PostgreSQL itself restarting mid-task loses nothing. A watcher on one
//! replica follows a task another drives, and a change asked through a third is handed to
//! the one driving it and done once.

use std::process::Stdio;
use std::time::Duration;

use testkit::fake_llm::{FakeLlm, FakeReply};
use testkit::plans::{assert_exactly_once, line_plan};
use testkit::{BrainOptions, Cluster, Worker};

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
    let (mut a, mut b, w) = two_replicas(&pg);
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
    let url = pg.url();
    let refused = serve_by_hand(&a, "other", &"a1".repeat(32), &url, "c");
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
    let plan = line_plan(&a, n, "sleep 0.4");
    let id = a.run_plan(&plan, &w.id);
    assert!(
        testkit::wait_until(Duration::from_secs(60), || calls_done(&a, &id) >= 4),
        "the task made no progress on a: {}",
        a.brain_log()
    );
    // One leader for the work there must be only one of: whichever took the lease first
    // (usually a, which started first; under load b's first try can come sooner).
    let leads = |c: &Cluster| c.brain_log().contains("this replica now leads");
    assert!(
        testkit::wait_until(Duration::from_secs(10), || leads(&a) || leads(&b)),
        "no replica leads"
    );
    assert!(leads(&a) != leads(&b), "both replicas lead");
    a.kill_brain();

    assert_finishes(&b, &id);
    assert_exactly_once(&b, &w, &id, n);
    assert!(
        b.brain_log().contains("taking over a task"),
        "b says it took the task over"
    );
    b.wait_brain_says("this replica now leads", Duration::from_secs(30));

    // Task ids are small and sequential whichever replica makes them, and across a restart:
    // t-1 came from a, t-2 comes from b, t-3 from b started again.
    assert_eq!(id, "t-1");
    let id2 = b.run_plan(&line_plan(&b, 1, "true"), &w.id);
    b.kill_brain();
    b.opts.env = pg.replica("b").env;
    b.start_brain().unwrap();
    let id3 = b.run_plan(&line_plan(&b, 1, "true"), &w.id);
    assert_eq!((id2.as_str(), id3.as_str()), ("t-2", "t-3"));
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
    let plan = line_plan(&a, n, "sleep 0.4");
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
    a.wait_brain_says("no longer holds task", Duration::from_secs(30));

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
    let plan = line_plan(&a, n, "sleep 0.3");
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

#[test]
fn a_watcher_on_one_replica_follows_a_task_another_drives_and_an_approval_through_a_third_counts_once()
 {
    let Some(pg) = testkit::postgres::start_or_skip() else {
        return;
    };
    let llm = FakeLlm::script(vec![
        FakeReply::run(
            "echo ran >> proof.txt; for i in 1 2 3 4 5 6; do echo live-$i; sleep 0.2; done",
        ),
        FakeReply::finish("done"),
    ]);
    let replica = |name: &str| {
        Cluster::start_with(BrainOptions {
            config: BrainOptions::with_llm(&llm, "sk-replicas", testkit::postgres::REPLICA_CONFIG)
                .config,
            ..pg.replica(name)
        })
    };
    let (a, b, c) = (replica("a"), replica("b"), replica("c"));
    let (token, ca_hash) = a.token(&[]);
    let mut join = a.join_cmd("w", &token, &ca_hash);
    join.arg("--brain").arg(b.url()).arg("--brain").arg(c.url());
    let w = a.spawn_worker("w", join);

    // a drives the task (it was asked there, and the worker is on a).
    let id = a
        .agent()
        .permission("ask")
        .worker(&w.id)
        .start("print some lines");
    // b shows it, and a watcher there follows it from its first record.
    assert!(
        testkit::wait_until(Duration::from_secs(20), || b
            .brain_cli(&["task", "log", &id, "--json"])
            .status
            .success()),
        "b never showed task {id}: {}",
        b.brain_log()
    );
    let watch = b
        .brain_cli_cmd(&["watch", &id, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.wait_status(&id, &["waiting"], Duration::from_secs(30));
    // a sends the task's live output once it reads that b watches it.
    a.wait_brain_says(
        &format!("another replica watches task {id}"),
        Duration::from_secs(30),
    );
    // Approved through c and through b at once: the replica driving it decides once.
    let (on_c, on_b) = std::thread::scope(|s| {
        let on_c = s.spawn(|| c.brain_cli(&["approve", &id]));
        let on_b = s.spawn(|| b.brain_cli(&["approve", &id]));
        (on_c.join().unwrap(), on_b.join().unwrap())
    });
    let approved: Vec<&std::process::Output> = [&on_c, &on_b]
        .into_iter()
        .filter(|o| o.status.success())
        .collect();
    assert_eq!(
        approved.len(),
        1,
        "c: {}\nb: {}",
        testkit::text(&on_c),
        testkit::text(&on_b)
    );
    assert!(
        testkit::stdout(approved[0]).contains("echo ran >> proof.txt"),
        "{}",
        testkit::text(approved[0])
    );
    let refused = if on_c.status.success() { &on_b } else { &on_c };
    assert!(
        testkit::text(refused).contains("not waiting for an approval"),
        "{}",
        testkit::text(refused)
    );
    assert_finishes(&c, &id);

    // The watcher on b ends with the task, having seen every record a stored, in order, and
    // the command's live output as it ran on a.
    let mut watch = watch;
    assert!(
        testkit::wait_until(Duration::from_secs(30), || watch
            .try_wait()
            .unwrap()
            .is_some()),
        "the watcher on b did not end with the task"
    );
    let out = watch.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", testkit::text(&out));
    let lines: Vec<serde_json::Value> = testkit::stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seen: Vec<(u64, String)> = lines
        .iter()
        .filter(|l| l.get("seq").is_some())
        .map(|l| (seq(l), l["kind"].to_string()))
        .collect();
    let stored: Vec<(u64, String)> = a
        .task_log_json(&id)
        .iter()
        .map(|l| (seq(l), l["kind"].to_string()))
        .collect();
    assert_eq!(seen, stored, "the watcher on b saw the log as a stored it");
    let live: String = lines
        .iter()
        .filter(|l| l.get("seq").is_none())
        .filter_map(|l| l["text"].as_str())
        .collect();
    let mut at = 0;
    for i in 1..=6 {
        let line = format!("live-{i}");
        let found = live[at..].find(&line);
        assert!(found.is_some(), "{line} not seen live, in order: {live:?}");
        at += found.unwrap();
    }
    let decided = stored
        .iter()
        .filter(|(_, k)| k == "\"approval_decided\"")
        .count();
    assert_eq!(decided, 1, "one decision in the log");
    let ws = format!("task-{}", id.trim_start_matches("t-"));
    let proof = a.brain_cli(&["file", "read", &w.id, "proof.txt", "--workspace", &ws]);
    assert_eq!(
        testkit::stdout(&proof),
        "ran\n",
        "the approved command ran once"
    );

    // A task started through b for the worker on a follows its worker to a.
    let other = b.agent().worker(&w.id).start("through b");
    assert_finishes(&c, &other);
    assert!(
        b.brain_log()
            .contains("the task's worker is connected to another replica"),
        "{}",
        b.brain_log()
    );
}

/// A record's sequence number, as the JSON has it (a number, or a string for 64 bits).
fn seq(l: &serde_json::Value) -> u64 {
    match &l["seq"] {
        serde_json::Value::String(s) => s.parse().unwrap(),
        v => v.as_u64().unwrap_or_else(|| panic!("no seq in {l}")),
    }
}

#[test]
fn a_replica_that_cannot_talk_with_a_live_one_refuses_to_start_and_says_which_to_upgrade() {
    let Some(pg) = testkit::postgres::start_or_skip() else {
        return;
    };
    let a = Cluster::start_with(pg.replica("a"));
    let url = pg.url();
    let serve = || serve_by_hand(&a, "b", &"5e".repeat(32), &url, "b");
    let refused = |says: &str| {
        let out = serve();
        assert_eq!(out.status.code(), Some(78), "{}", testkit::text(&out));
        assert!(
            testkit::text(&out).contains(says),
            "{}",
            testkit::text(&out)
        );
    };
    // A live replica of a newer brain that no longer understands this one.
    pg.psql("INSERT INTO replicas VALUES ('z', 99, 99, '9.0.0', now())");
    refused("upgrade this brain to 9.0.0");
    // A live replica older than this brain understands.
    pg.psql("UPDATE replicas SET protocol = 0, oldest = 0, version = '0.0.1' WHERE name = 'z'");
    refused("upgrade z before starting this brain");
    // a, of this brain's own protocol, is no obstacle, and says it is alive.
    let alive = pg.psql("SELECT protocol FROM replicas WHERE name = 'a'");
    assert_eq!(alive, "1");
}

#[test]
fn a_sled_store_copies_into_postgresql_and_back_and_a_brain_goes_on_from_either() {
    let Some(pg) = testkit::postgres::start_or_skip() else {
        return;
    };
    let mut c = Cluster::start();
    let w = c.join_worker("w");
    let id = c.run_plan(&line_plan(&c, 3, "true"), &w.id);
    assert_finishes(&c, &id);
    let log = |c: &Cluster| -> Vec<(u64, String)> {
        c.task_log_json(&id)
            .iter()
            .map(|l| (seq(l), l.to_string()))
            .collect()
    };
    let before = log(&c);
    let diff_before = testkit::stdout(&c.brain_cli(&["task", "diff", &id]));
    assert!(diff_before.contains("line-2"), "{diff_before}");
    c.kill_brain();

    let url = pg.url();
    let out = c.brain_cli(&["store", "copy", "--to", &url, "--json"]);
    assert!(out.status.success(), "{}", testkit::text(&out));
    let copied: serde_json::Value = serde_json::from_str(&testkit::stdout(&out)).unwrap();
    assert_eq!(copied["tasks"], 1, "{copied}");
    assert_eq!(copied["records"].as_u64(), Some(before.len() as u64));
    assert!(copied["blobs"].as_u64() >= Some(1), "{copied}");
    assert!(
        !testkit::text(&out).contains(&url),
        "the URL (and its password) stays out"
    );
    // Once only: a database that holds a store is not copied into.
    let again = c.brain_cli(&["store", "copy", "--to", &url]);
    assert!(!again.status.success());
    assert!(
        testkit::text(&again).contains("copy into an empty database"),
        "{}",
        testkit::text(&again)
    );

    // The same data dir as a replica on PostgreSQL (its own secrets key, as the copy said):
    // the task, its log, its workspace, and the worker under the same CA.
    c.opts = BrainOptions {
        env: vec![],
        ..pg.replica("a")
    };
    c.start_brain().unwrap();
    assert_eq!(log(&c), before, "the log on PostgreSQL is the log on sled");
    assert_eq!(
        testkit::stdout(&c.brain_cli(&["task", "diff", &id])),
        diff_before
    );
    let id2 = c.run_plan(&line_plan(&c, 2, "true"), &w.id);
    assert_finishes(&c, &id2);
    assert_ne!(id2, id, "new tasks get new ids");
    c.kill_brain();

    // And back, into a data dir without a store, which then serves it on sled. The store's
    // secrets key is asked for first.
    let back = c.dir.join("back");
    let copy_back = || {
        std::process::Command::new(&c.bins.brain)
            .arg("--data")
            .arg(&back)
            .args(["store", "copy", "--from", &url])
            .output()
            .unwrap()
    };
    let out = copy_back();
    assert!(!out.status.success());
    assert!(
        testkit::text(&out).contains("needs the store's secrets key"),
        "{}",
        testkit::text(&out)
    );
    std::fs::create_dir_all(&back).unwrap();
    std::fs::copy(c.data.join("secrets.key"), back.join("secrets.key")).unwrap();
    let out = copy_back();
    assert!(out.status.success(), "{}", testkit::text(&out));
    assert!(
        testkit::stdout(&out).contains("copied 2 tasks"),
        "{}",
        testkit::text(&out)
    );
    // Copying into it again is refused: it holds a store now.
    let out = copy_back();
    assert!(!out.status.success());
    assert!(testkit::text(&out).contains("already holds a store"));
    c.data = back;
    c.opts = BrainOptions::default();
    c.start_brain().unwrap();
    assert_eq!(
        log(&c),
        before,
        "the log back on sled is the log it started as"
    );
    assert_eq!(
        c.wait_status(&id2, &["finished"], Duration::from_secs(10)),
        "finished"
    );
}

#[test]
fn a_task_follows_its_worker_to_the_replica_it_reconnects_to() {
    let Some(pg) = testkit::postgres::start_or_skip() else {
        return;
    };
    let (a, b, mut w) = two_replicas(&pg);
    let n = 10;
    let id = a.run_plan(&line_plan(&a, n, "sleep 0.4"), &w.id);
    assert!(
        testkit::wait_until(Duration::from_secs(60), || calls_done(&a, &id) >= 3),
        "the task made no progress on a: {}",
        a.brain_log()
    );
    // b lists the worker as connected, through a.
    let on = |c: &Cluster| {
        c.workers()
            .into_iter()
            .find(|x| x["id"] == w.id.as_str())
            .map(|x| (x["state"].clone(), x["replica"].clone()))
    };
    assert!(
        testkit::wait_until(Duration::from_secs(10), || on(&b)
            == Some(("connected".into(), "a".into()))),
        "b lists the worker as {:?}",
        on(&b)
    );
    assert_eq!(on(&a), Some(("connected".into(), serde_json::Value::Null)));
    // The worker comes back on b; a stays up and would keep the task's lease for ever.
    a.restart_worker_with(&mut w, &["--brain", &b.url(), "--brain", &a.url()]);
    assert_finishes(&b, &id);
    assert_exactly_once(&b, &w, &id, n);
    assert!(
        a.brain_log().contains(
            "the task's worker is connected to another replica: letting the task go there"
        ),
        "{}",
        a.brain_log()
    );
    assert!(
        b.brain_log().contains("taking over a task"),
        "{}",
        b.brain_log()
    );
    // a shows the task as b drove it, to its end.
    assert_eq!(
        a.wait_status(&id, &["finished"], Duration::from_secs(20)),
        "finished"
    );
}

/// `brain serve` on `url` as replica `name` from data dir `dir` beside `a`'s (made by `brain
/// init` when new), with secrets key `key`; what it said when it exited.
fn serve_by_hand(a: &Cluster, dir: &str, key: &str, url: &str, name: &str) -> std::process::Output {
    let data = a.dir.join(dir);
    let brain = |args: &[&str]| {
        std::process::Command::new(&a.bins.brain)
            .arg("--data")
            .arg(&data)
            .args(args)
            .env("TETHER_SECRET_KEY", key)
            .output()
            .unwrap()
    };
    if !data.exists() {
        let init = brain(&["init"]);
        assert!(init.status.success(), "{}", testkit::text(&init));
    }
    brain(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--store",
        url,
        "--replica",
        name,
    ])
}
