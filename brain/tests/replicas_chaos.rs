//! Three replicas on one PostgreSQL, four workers, twenty agent tasks (the fake LLM): the
//! replica holding the most leases is SIGKILLed (and started again) thirty times while the
//! tasks run and a person approves what they ask through whichever replica answers. Every
//! task finishes; its log has no gap and no call with two outcomes; no call ran twice (each
//! step's line is in its workspace once); every approval asked is decided once.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shared::locks::Lock;
use testkit::fake_llm::{FakeLlm, FakeReply};
use testkit::gates::Gates;
use testkit::{BrainOptions, Cluster, Worker};

const TASKS: usize = 20;
const WORKERS: usize = 4;
const STEPS: usize = 80;
/// Every this many steps, one that is not on the allow-list: a person approves it.
const GATE_EVERY: usize = 10;
const KILLS: usize = 30;

/// One step's line (a gate's says so).
fn step(i: usize) -> String {
    if i % GATE_EVERY == GATE_EVERY - 1 {
        format!("gate-{i}")
    } else {
        i.to_string()
    }
}

/// The agent's turns: write `step.sh`, run it [`STEPS`] times, finish. While the kills go on
/// each step holds its worker a second, so that thirty kills fit while the tasks run; once
/// `kills_done` is open the rest go at once.
fn script(kills_done: &Gates) -> Vec<FakeReply> {
    let mut turns = vec![FakeReply::write(
        "step.sh",
        format!(
            "printf 'step-%s\\n' \"$1\" >> steps.txt\n[ -e {} ] || sleep 1\n",
            kills_done.path(0).display()
        ),
    )];
    turns.extend((0..STEPS).map(|i| FakeReply::run(format!("sh step.sh {}", step(i)))));
    turns.push(FakeReply::finish("all steps done"));
    turns
}

#[test]
fn three_replicas_lose_the_one_holding_most_leases_thirty_times_and_every_task_finishes_once() {
    let Some(pg) = testkit::postgres::start_or_skip() else {
        return;
    };
    let kills_done = Gates::new();
    let llm = FakeLlm::script(script(&kills_done));
    let (mut replicas, workers) = start(&pg, &llm);
    let ids: Vec<String> = (0..TASKS)
        .map(|i| {
            // Through each replica in turn, at once after the workers enrolled through the
            // first (another replica reads the registry again for a worker it does not know),
            // each task then following its worker to the replica the worker is on.
            replicas[i % 3]
                .agent()
                .permission("auto")
                .worker(&workers[i % WORKERS].id)
                .start(&format!("task {i}"))
        })
        .collect();

    // A person approves what the tasks ask, through whichever replica answers.
    let stop = Arc::new(AtomicBool::new(false));
    let urls: Vec<String> = replicas.iter().map(Cluster::url).collect();
    let cli = replicas[0].brain_cli_cmd(&[]).get_program().to_owned();
    let data = replicas[0].data.clone();
    let approver = {
        let (stop, ids) = (stop.clone(), ids.clone());
        std::thread::spawn(move || approve_until(&stop, &ids, &urls, &cli, &data))
    };

    assert_eq!(kill_most_leased(&pg, &mut replicas), KILLS);
    kills_done.open(0);

    for id in &ids {
        let status = replicas[0].wait_status(
            id,
            &[
                "finished",
                "failed",
                "cancelled",
                "stuck",
                "stalled",
                "budget_exhausted",
            ],
            Duration::from_secs(600),
        );
        assert!(status == "finished", "{}", explain(&replicas, id, &status));
    }
    stop.store(true, Ordering::SeqCst);
    approver.join().unwrap();
    for id in &ids {
        assert_once(&replicas[1], &workers, id);
    }
}

/// Three replicas on `pg` with the fake `llm`, leases of 3 s, and four workers enrolled
/// through the first that know all three.
fn start(pg: &testkit::postgres::Postgres, llm: &FakeLlm) -> (Vec<Cluster>, Vec<Worker>) {
    let config = BrainOptions::with_llm(
        llm,
        "sk-chaos",
        &format!(
            "[agent]\nmax_steps = {}\nallow_commands = [\"sh step.sh [0-9]*\"]\nallow_paths = [\"step.sh\"]\n{}",
            STEPS + 10,
            testkit::postgres::REPLICA_CONFIG
        ),
    )
    .config;
    let replicas: Vec<Cluster> = ["a", "b", "c"]
        .iter()
        .map(|n| {
            Cluster::start_with(BrainOptions {
                config: config.clone(),
                ..pg.replica(n)
            })
        })
        .collect();
    let workers = (0..WORKERS)
        .map(|i| {
            let (token, ca_hash) = replicas[0].token(&[]);
            let mut join = replicas[0].join_cmd(&format!("w{i}"), &token, &ca_hash);
            join.args(["--max-tasks", "6"]);
            for r in &replicas[1..] {
                join.arg("--brain").arg(r.url());
            }
            replicas[0].spawn_worker(&format!("w{i}"), join)
        })
        .collect();
    (replicas, workers)
}

/// SIGKILLs the replica holding the most leases and starts it again, [`KILLS`] times, the
/// tasks making progress in between; how many times it did.
fn kill_most_leased(pg: &testkit::postgres::Postgres, replicas: &mut [Cluster]) -> usize {
    let stored = || {
        pg.psql("SELECT count(*) FROM events")
            .parse::<u64>()
            .unwrap()
    };
    let mut kills = 0;
    while kills < KILLS {
        let holder = pg.psql(
            "SELECT holder FROM leases WHERE expires_at > now() GROUP BY holder ORDER BY count(*) DESC, holder LIMIT 1",
        );
        let Some(r) = replicas
            .iter()
            .position(|r| r.opts.extra_args.contains(&holder))
        else {
            // Nobody holds a lease this moment (a replica just died): look again.
            assert!(
                testkit::wait_until(Duration::from_secs(30), || !pg
                    .psql("SELECT holder FROM leases WHERE expires_at > now() LIMIT 1")
                    .is_empty()),
                "no replica holds any lease: the tasks ended before {KILLS} kills (only {kills})"
            );
            continue;
        };
        let before = stored();
        replicas[r].kill_brain();
        kills += 1;
        // (The secrets key every replica shares is given to each start.)
        replicas[r].opts.env = pg.replica("-").env;
        replicas[r].start_brain().unwrap();
        // The tasks go on before the next kill.
        assert!(
            testkit::wait_until(Duration::from_secs(60), || stored() >= before + 20),
            "no progress after kill {kills} of replica {holder}"
        );
    }
    kills
}

/// Task `id`'s log as replica `c` shows it: no gap, one outcome per call, each approval
/// decided once; and each step's line once, in order, in the workspace it ran in.
fn assert_once(c: &Cluster, workers: &[Worker], id: &str) {
    let log = c.task_log_json(id);
    // A 64-bit field of a record (a string in the JSON).
    let u64_of = |r: &serde_json::Value, field: &str| {
        testkit::json_u64(&r[field]).unwrap_or_else(|| panic!("no {field} in {r}"))
    };
    let seqs: Vec<u64> = log.iter().map(|r| u64_of(r, "seq")).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "task {id}"
    );
    let mut outcomes: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &log {
        if r["kind"] == "tool_call_completed" || r["kind"] == "tool_call_interrupted" {
            *outcomes.entry(u64_of(r, "call_id")).or_default() += 1;
        }
    }
    assert!(
        outcomes.values().all(|n| *n == 1),
        "task {id}: a call with two outcomes: {outcomes:?}"
    );
    let of = |kind: &str| -> Vec<u64> {
        log.iter()
            .filter(|r| r["kind"] == kind)
            .map(|r| u64_of(r, "approval_id"))
            .collect()
    };
    let asked = of("approval_requested");
    assert_eq!(asked.len(), STEPS / GATE_EVERY, "task {id}");
    assert_eq!(
        of("approval_decided"),
        asked,
        "task {id}: each approval decided once, in order"
    );
    let num = id.trim_start_matches("t-");
    let lines = workers
        .iter()
        .find_map(|w| {
            std::fs::read_to_string(w.state.join(format!("workspaces/task-{num}/steps.txt"))).ok()
        })
        .unwrap_or_else(|| panic!("task {id}: no steps.txt"));
    let want: Vec<String> = (0..STEPS).map(|i| format!("step-{}", step(i))).collect();
    assert_eq!(
        lines.lines().collect::<Vec<_>>(),
        want,
        "task {id}: a step ran twice or not at all"
    );
}

/// Why task `id` ended `status`: its records and what the replicas warned of.
fn explain(replicas: &[Cluster], id: &str, status: &str) -> String {
    let records: Vec<String> = replicas[0]
        .task_log_json(id)
        .iter()
        .map(|r| r.to_string().chars().take(300).collect())
        .collect();
    let warned: Vec<String> = replicas
        .iter()
        .flat_map(|r| {
            r.brain_log()
                .lines()
                .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
                .map(|l| l.chars().take(300).collect::<String>())
                .collect::<Vec<_>>()
        })
        .collect();
    format!(
        "task {id} ended {status}; its records:\n{}\nthe replicas warned:\n{}",
        records.join("\n"),
        warned.join("\n")
    )
}

/// Approves every task that waits for an approval, through the replicas in turn (one that is
/// down is skipped), until `stop`. Each approval runs on a thread of its own: one handed to
/// a replica that dies may wait for its answer.
fn approve_until(
    stop: &AtomicBool,
    ids: &[String],
    urls: &[String],
    cli: &std::ffi::OsStr,
    data: &std::path::Path,
) {
    let busy: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut turn = 0;
    while !stop.load(Ordering::SeqCst) {
        turn += 1;
        let url = &urls[turn % urls.len()];
        let out = std::process::Command::new(cli)
            .arg("--data")
            .arg(data)
            .args(["--brain", url, "tasks", "--json"])
            .output()
            .unwrap();
        if out.status.success()
            && let Ok(tasks) = serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout)
        {
            for t in tasks {
                let id = t["id"].as_str().unwrap_or_default().to_string();
                if t["status"] != "waiting" || !ids.contains(&id) {
                    continue;
                }
                if !busy.locked().insert(id.clone()) {
                    continue;
                }
                let (busy, cli, data, url) = (
                    busy.clone(),
                    cli.to_owned(),
                    data.to_path_buf(),
                    url.clone(),
                );
                std::thread::spawn(move || {
                    let _ = std::process::Command::new(&cli)
                        .arg("--data")
                        .arg(&data)
                        .args(["--brain", &url, "approve", &id])
                        .output();
                    busy.locked().remove(&id);
                });
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
