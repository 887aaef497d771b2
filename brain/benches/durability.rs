//! Durability benchmark: durable appends per second for 1 task and for 100 concurrent tasks
//! (group commit), beside a plain `write` + `fdatasync` loop of the same record size in the
//! same run; and recovery time of a task with 1k, 10k and 100k events (snapshot + tail),
//! beside a full replay. Prints figures; never fails on a timing.
//!
//!     cargo bench -p brain --bench durability

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use brain::engine::Store;
use brain::engine::log::{EventLog, SledLog};
use brain::model::event::{Event, Purpose, ToolCall, ToolResult};
use brain::model::ids::CallIds;

fn completed(i: u64) -> Event {
    Event::ToolCallCompleted {
        call_id: i,
        result: ToolResult {
            exit_code: Some(0),
            ..Default::default()
        },
    }
}

fn per_sec(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

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

    // Baseline: write + fdatasync per record.
    let mut f = std::fs::File::create(tmp.path().join("baseline.log")).unwrap();
    let t = Instant::now();
    for _ in 0..n {
        f.write_all(&sample).unwrap();
        f.sync_data().unwrap();
    }
    let base = per_sec(n, t.elapsed());

    let db_dir = tmp.path().join("db");
    let db = sled::open(&db_dir).unwrap();
    let (one, hundred) = rt.block_on(async {
        let log = Arc::new(SledLog::open(db.clone(), db_dir.clone()).unwrap());
        let task = log.new_task_id().unwrap();
        let t = Instant::now();
        for i in 0..n as u64 {
            log.append(task, vec![completed(i)]).await.unwrap();
        }
        let one = per_sec(n, t.elapsed());

        let tasks = 100;
        let each = (n / 10).max(20);
        let t = Instant::now();
        let mut hs = Vec::new();
        for _ in 0..tasks {
            let log = log.clone();
            let id = log.new_task_id().unwrap();
            hs.push(tokio::spawn(async move {
                for i in 0..each as u64 {
                    log.append(id, vec![completed(i)]).await.unwrap();
                }
            }));
        }
        for h in hs {
            h.await.unwrap();
        }
        (one, per_sec(tasks * each, t.elapsed()))
    });
    println!("{:<58} {:>12}", "what", "per second");
    println!(
        "{:<58} {:>12.0}",
        format!("write + fdatasync, {} B records (baseline)", sample.len()),
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

    // Recovery.
    println!(
        "\n{:<40} {:>14} {:>14}",
        "recovery of one task", "snapshot+tail", "full replay"
    );
    let mut times = Vec::new();
    rt.block_on(async {
        let log: Arc<dyn EventLog> = Arc::new(SledLog::open(db.clone(), db_dir.clone()).unwrap());
        let m = Store::new(log.clone(), 100, CallIds::starting_above(0, 1));
        for events in [1_000u64, 10_000, 100_000] {
            let task = m
                .create(|id| {
                    vec![
                        Event::Created {
                            goal: "bench".into(),
                            workspace: id.workspace(),
                            plan: Some(
                                brain::model::Plan::parse(r#"{"steps":[{"run":["true"]}]}"#)
                                    .unwrap(),
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
            let id = task.id;
            // No driver runs it; add history as a long task would have.
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
            let t = Instant::now();
            let (st, broken) = m.load(id).unwrap();
            let with_snapshot = t.elapsed();
            assert!(broken.is_none());
            assert!(st.last_seq >= events);
            let t = Instant::now();
            let recs = log.read(id, 0).unwrap();
            let mut full = brain::model::TaskState::new(id);
            for r in &recs {
                brain::model::apply(&mut full, r.as_ref().unwrap());
            }
            let replay = t.elapsed();
            assert_eq!(full.last_seq, st.last_seq);
            println!(
                "{:<40} {:>11.3} ms {:>11.3} ms",
                format!("{events} events"),
                with_snapshot.as_secs_f64() * 1e3,
                replay.as_secs_f64() * 1e3
            );
            times.push(with_snapshot);
        }
    });
    println!(
        "  ratio 100k / 1k (snapshot+tail): {:.2}×   (target ≤ 2)",
        times[2].as_secs_f64() / times[0].as_secs_f64()
    );
}
