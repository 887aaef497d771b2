//! Durability benchmark: durable appends per second for 1 task and for 100 concurrent tasks
//! (group commit), beside a plain `write` + `fdatasync` loop of the same record size in the
//! same run; and recovery time of a task with 1k, 10k and 100k events (snapshot + tail),
//! beside a full replay. Prints figures; never fails on a timing.
//!
//!     cargo bench -p brain --bench durability

#[path = "appends/mod.rs"]
mod appends;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use appends::{appends_hundred_tasks, appends_one_task, completed, per_sec};
use brain::engine::log::{EventLog, SledLog};
use brain::engine::{Store, Task};
use brain::model::TaskId;
use brain::model::event::{Event, Purpose, ToolCall};
use brain::model::ids::CallIds;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    println!(
        "Tether durability benchmark ({} CPUs, temp dir {})\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        tmp.path().display()
    );

    // Record size, for the baseline.
    let sample = serde_json::to_vec(&brain::model::Record {
        v: 1,
        task: brain::model::TaskId(1),
        seq: 1,
        at_ms: 0,
        event: completed(1 << 40),
    })
    .unwrap();
    let base = fdatasync_baseline(&tmp.path().join("baseline.log"), &sample, n);

    let db_dir = tmp.path().join("db");
    let db = sled::open(&db_dir).unwrap();
    let (one, hundred) = rt.block_on(async {
        let log: Arc<dyn EventLog> = Arc::new(SledLog::open(db.clone(), db_dir.clone()).unwrap());
        let one = appends_one_task(log.clone(), n).await;
        (one, appends_hundred_tasks(log, n).await)
    });
    print_appends(sample.len(), base, one, hundred);

    // Opened inside the runtime: the log starts its writer task.
    let times = rt.block_on(async { recovery_rows(SledLog::open(db, db_dir).unwrap()).await });
    println!(
        "  ratio 100k / 1k (snapshot+tail): {:.2}×   (target ≤ 2)",
        times[2].as_secs_f64() / times[0].as_secs_f64()
    );
}

/// The baseline: `n` records of `sample` written to `path`, each followed by an `fdatasync`;
/// records per second.
fn fdatasync_baseline(path: &Path, sample: &[u8], n: usize) -> f64 {
    let mut f = std::fs::File::create(path).unwrap();
    let t = Instant::now();
    for _ in 0..n {
        f.write_all(sample).unwrap();
        f.sync_data().unwrap();
    }
    per_sec(n, t.elapsed())
}

fn print_appends(record_bytes: usize, base: f64, one: f64, hundred: f64) {
    println!("{:<58} {:>12}", "what", "per second");
    println!(
        "{:<58} {:>12.0}",
        format!("write + fdatasync, {record_bytes} B records (baseline)"),
        base
    );
    println!("{:<58} {:>12.0}", "durable appends, 1 task", one);
    println!(
        "{:<58} {:>12.0}",
        "durable appends, 100 concurrent tasks (group commit)", hundred
    );
    println!(
        "  ratio 100 tasks / 1 task: {:.1}×; 1 task / baseline: {:.2}×; 100 tasks / baseline: {:.1}×",
        hundred / one,
        one / base,
        hundred / base
    );
}

/// The recovery rows: a task with 1k, 10k and 100k events loaded from its snapshot and tail,
/// beside a full replay of its log. Returns the snapshot+tail times.
async fn recovery_rows(log: SledLog) -> Vec<Duration> {
    println!(
        "\n{:<40} {:>14} {:>14}",
        "recovery of one task", "snapshot+tail", "full replay"
    );
    let log: Arc<dyn EventLog> = Arc::new(log);
    let m = Store::new(log.clone(), 100, CallIds::starting_above(0, 1));
    let mut times = Vec::new();
    for events in [1_000u64, 10_000, 100_000] {
        let task = task_with_history(&m, events).await;
        let (with_snapshot, replay) = time_recovery(&m, log.as_ref(), task.id, events).await;
        println!(
            "{:<40} {:>11.3} ms {:>11.3} ms",
            format!("{events} events"),
            with_snapshot.as_secs_f64() * 1e3,
            replay.as_secs_f64() * 1e3
        );
        times.push(with_snapshot);
    }
    times
}

/// A new task with `events` events of history (in batches of 99), as a long task would have;
/// no driver runs it.
async fn task_with_history(m: &Store, events: u64) -> Arc<Task> {
    let task = m
        .create(|id| {
            vec![
                Event::Created {
                    goal: "bench".into(),
                    workspace: id.workspace(),
                    plan: Some(
                        brain::model::Plan::parse(r#"{"steps":[{"run":["true"]}]}"#).unwrap(),
                    ),
                    agent: None,
                    egress: None,
                    attempts: None,
                    attempt_of: None,
                },
                Event::WorkerAssigned {
                    worker: "nobody".into(),
                },
            ]
        })
        .await
        .unwrap();
    let mut i = 0u64;
    while i < events {
        let batch: Vec<Event> = (0..99)
            .map(|k| {
                let c = i + k;
                match c % 3 {
                    0 => Event::ToolCallIssued {
                        call_id: c,
                        step: 0,
                        purpose: Purpose::Step,
                        worker: "nobody".into(),
                        call: ToolCall::RunCommand {
                            argv: vec!["true".into()],
                            timeout_ms: 1000,
                            cwd: String::new(),
                        },
                    },
                    1 => Event::ToolOutput {
                        call_id: c - 1,
                        stdout: "ok\n".into(),
                        stderr: String::new(),
                    },
                    _ => completed(c - 2),
                }
            })
            .collect();
        i += batch.len() as u64;
        m.append(&task, batch).await.unwrap();
    }
    task
}

/// (load from the snapshot and the tail, full replay of the log) of task `id`, checked to
/// reach the same state.
async fn time_recovery(
    m: &Store,
    log: &dyn EventLog,
    id: TaskId,
    events: u64,
) -> (Duration, Duration) {
    let t = Instant::now();
    let (st, broken) = m.load(id).await.unwrap();
    let with_snapshot = t.elapsed();
    assert!(broken.is_none());
    assert!(st.last_seq >= events);
    let t = Instant::now();
    let recs = log.read(id, 0).await.unwrap();
    let mut full = brain::model::TaskState::new(id);
    for r in &recs {
        brain::model::apply(&mut full, r.as_ref().unwrap());
    }
    let replay = t.elapsed();
    assert_eq!(full.last_seq, st.last_seq);
    (with_snapshot, replay)
}
