//! A fleet under load, with the real brain and worker binaries: placement spreads tasks over
//! the workers within each one's capacity and queues the rest in order, and a worker busy
//! with heavy output and large scans on many tasks is never taken for lost.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use testkit::gates::Gates;
use testkit::plans::line_plan;
use testkit::{BrainOptions, Cluster, Worker, assert_failed_saying, text};

/// Joins a worker that takes at most `max_tasks` tasks at once.
fn worker_taking(c: &Cluster, name: &str, max_tasks: u32) -> Worker {
    let (token, ca_hash) = c.token(&[]);
    let mut cmd = c.join_cmd(name, &token, &ca_hash);
    cmd.args(["--max-tasks", &max_tasks.to_string()]);
    c.spawn_worker(name, cmd)
}

fn tasks(c: &Cluster) -> Vec<serde_json::Value> {
    let out = c.brain_cli(&["tasks", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn tasks_spread_within_capacity_and_the_rest_queue_in_order() {
    let c = Cluster::start();
    let workers: Vec<Worker> = (0..3)
        .map(|i| worker_taking(&c, &format!("w{i}"), 2))
        .collect();
    // Each task holds its place until all eight are created and placed or queued.
    let gate = Gates::new();
    let p = line_plan(&c, 1, &gate.wait(1, Duration::from_secs(120)));
    // Eight tasks, no worker named: six places, two queued.
    let mut ids = vec![];
    for _ in 0..8 {
        let out = c.brain_cli(&["run", "--plan", p.to_str().unwrap()]);
        assert!(out.status.success(), "{}", text(&out));
        ids.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    let mut most: HashMap<String, u64> = HashMap::new();
    let mut saw_queue = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let all = tasks(&c);
        let queued: Vec<&serde_json::Value> =
            all.iter().filter(|t| t["status"] == "queued").collect();
        if !queued.is_empty() && saw_queue.is_none() {
            saw_queue = Some((
                queued.len(),
                queued[0]["reason"].as_str().unwrap_or_default().to_string(),
            ));
        }
        let ws = c.workers();
        let mut running = 0;
        for w in &ws {
            let n = w["running_tasks"].as_u64().unwrap_or(0);
            running += n;
            let e = most
                .entry(w["name"].as_str().unwrap().to_string())
                .or_default();
            *e = (*e).max(n);
            assert_eq!(w["max_tasks"], 2, "{w}");
        }
        // Every place taken and the rest queued: the held tasks may go.
        if saw_queue.is_some() && running == 6 {
            gate.open(1);
        }
        if all.iter().all(|t| t["status"] == "finished") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tasks did not finish: {all:#?}\n{}",
            c.brain_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (n, reason) = saw_queue.expect("two tasks beyond capacity were queued");
    assert!(n <= 2, "{n} queued");
    assert_eq!(reason, "no worker with room: 3 workers, all at capacity");
    // Every worker ran tasks, none more than its capacity at once.
    assert_eq!(most.len(), 3, "{most:?}");
    for (w, n) in &most {
        assert!(*n <= 2, "{w} ran {n} at once");
    }
    let mut per_worker: HashMap<String, usize> = HashMap::new();
    for id in &ids {
        let log = c.task_log_json(id);
        let assigned: Vec<&serde_json::Value> = log
            .iter()
            .filter(|r| r["kind"] == "worker_assigned")
            .collect();
        assert_eq!(assigned.len(), 1, "placed once, never moved: {log:#?}");
        *per_worker
            .entry(assigned[0]["worker"].as_str().unwrap().to_string())
            .or_default() += 1;
        assert_eq!(
            log.iter().filter(|r| r["kind"] == "move_started").count(),
            0
        );
    }
    assert_eq!(per_worker.len(), 3, "spread over all three: {per_worker:?}");
    // Queued in order: the first two placed at once were among the first six created.
    let queued_ids: Vec<&String> = ids
        .iter()
        .filter(|id| {
            c.task_log_json(id)
                .iter()
                .any(|r| r["kind"] == "status_changed" && r["status"] == "queued")
        })
        .collect();
    assert_eq!(queued_ids, ids[6..].iter().collect::<Vec<_>>());
    drop(workers);
}

#[test]
fn a_task_no_worker_can_take_is_refused_in_words() {
    let c = Cluster::start();
    let _w = worker_taking(&c, "plain", 2);
    let p = line_plan(&c, 1, "true");
    let out = c.brain_cli(&[
        "run",
        "--plan",
        p.to_str().unwrap(),
        "--require-label",
        "gpu=yes",
    ]);
    assert_failed_saying(&out, "no connected worker has the labels the task requires");
}

#[test]
fn a_busy_worker_is_never_marked_lost() {
    // A short deadline (the default is 30 s), and a worker flooded with output and file
    // changes on many tasks at once: the session's queue is full most of the time, the
    // runtime is busy scanning. 5 s: at 2 s, in CI on two cores right after the I/O-heavy
    // durability and egress tests, the deadline was missed in 3 runs of 8, never alone.
    let lost_after = Duration::from_secs(5);
    let c = Cluster::start_with(BrainOptions {
        lost_after,
        ..Default::default()
    });
    let w = worker_taking(&c, "busy", 16);
    // 800 new files of 4 KiB in 40 directories (a few processes each: the load is the files,
    // not the forks), then 8 MB of output.
    let heavy = "i=0; while [ $i -lt 40 ]; do mkdir -p d$i; head -c 81920 /dev/urandom | split -b 4096 - d$i/f; i=$((i+1)); done; head -c 20000000 /dev/zero | od -v | head -c 8000000";
    let p = line_plan(&c, 3, heavy);
    let ids: Vec<String> = (0..16)
        .map(|_| {
            let out = c.brain_cli(&["run", "--plan", p.to_str().unwrap(), "--worker", "busy"]);
            assert!(out.status.success(), "{}", text(&out));
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let ws = c.workers();
        let me = ws.iter().find(|x| x["id"] == w.id.as_str()).unwrap();
        assert_eq!(
            me["state"],
            "connected",
            "a busy worker was taken for lost: {me}\n{}",
            c.brain_log()
        );
        let all = tasks(&c);
        if all
            .iter()
            .all(|t| t["status"] == "finished" || t["status"] == "failed")
        {
            assert!(all.iter().all(|t| t["status"] == "finished"), "{all:#?}");
            break;
        }
        assert!(Instant::now() < deadline, "not done: {all:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = c.brain_log();
    assert!(
        !log.contains("worker session ended"),
        "the session ended under load:\n{log}"
    );
    for id in &ids {
        let recs = c.task_log_json(id);
        assert_eq!(
            recs.iter().filter(|r| r["kind"] == "move_started").count(),
            0,
            "{id} moved"
        );
    }
    assert!(
        !w.log_text().contains("session with the brain ended"),
        "{}",
        w.log_text()
    );
}
