//! The shared-store benchmark: durable appends per second on PostgreSQL (a cluster the run
//! makes, with fsync and synchronous commit on, as in production) beside the sled log, for 1
//! task and for 100 concurrent tasks, in the same run. Prints figures; never fails on a
//! timing.
//!
//!     cargo bench -p brain --bench ha
//!
//! `BENCH_N` sets the appends of the one-task row (default 2000; the 100-task row makes
//! `BENCH_N / 10` per task, at least 20).
//!
//! Then failover (`ha/failover.rs`): SIGKILL of the replica driving a task to the task's next
//! step on the other replica, beside one sled brain killed and started again at once;
//! `BENCH_FAILOVERS` samples of each (default 5; 0 leaves the rows out). Target: p99 at most
//! twice the lease's time to live.
//!
//! Then scaling (`ha/scale.rs`): steps per second for `BENCH_SCALE_TASKS` plan tasks (default
//! 500; 0 leaves the rows out) driven by 1, 2 and 3 replicas. Target: 3 replicas at least twice
//! one (on a machine with the cores for three). As root, the same rows again with each replica
//! capped at `BENCH_SCALE_CPU` of a CPU (default 0.05; 0 leaves them out), so that three
//! replicas have three times the CPU of one, as on machines of their own.

#[path = "appends/mod.rs"]
mod appends;
#[path = "ha/failover.rs"]
mod failover;
#[path = "ha/scale.rs"]
mod scale;

use std::sync::Arc;

use appends::{appends_hundred_tasks, appends_one_task};
use brain::engine::log::postgres::{PgLog, Timing};
use brain::engine::log::{EventLog, SledLog};

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let pg = match testkit::postgres::Postgres::start() {
        Ok(pg) => pg,
        Err(why) => {
            eprintln!("the ha benchmark needs PostgreSQL's server programs: {why}");
            std::process::exit(2);
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    println!(
        "Tether shared-store benchmark ({} CPUs; PostgreSQL {} on loopback, sled in {})\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        pg.psql("SHOW server_version"),
        tmp.path().display()
    );
    let (sled, postgres) = rt.block_on(async {
        let db_dir = tmp.path().join("db");
        let db = sled::open(&db_dir).unwrap();
        let sled: Arc<dyn EventLog> = Arc::new(SledLog::open(db, db_dir).unwrap());
        let db = brain::storage::postgres::Db::open(&pg.url(), "bench")
            .await
            .unwrap();
        let postgres: Arc<dyn EventLog> = Arc::new(PgLog::open(db, Timing::default()));
        let mut rows = Vec::new();
        for log in [&sled, &postgres] {
            rows.push((
                appends_one_task(log.clone(), n).await,
                appends_hundred_tasks(log.clone(), n).await,
            ));
        }
        (rows[0], rows[1])
    });
    println!(
        "{:<44} {:>12} {:>12} {:>16}",
        "durable appends per second", "sled", "PostgreSQL", "PostgreSQL/sled"
    );
    for (what, s, p) in [
        ("1 task", sled.0, postgres.0),
        ("100 concurrent tasks", sled.1, postgres.1),
    ] {
        println!("{what:<44} {s:>12.0} {p:>12.0} {:>15.2}×", p / s);
    }
    let samples: usize = std::env::var("BENCH_FAILOVERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    if samples > 0 {
        failovers(&pg, samples);
    }
    let tasks: usize = std::env::var("BENCH_SCALE_TASKS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    if tasks > 0 {
        scaling(&pg, tasks);
    }
}

/// The scaling rows: 1, 2 and 3 replicas, on the machine's cores as they are, then (as root)
/// each replica capped at `BENCH_SCALE_CPU` of a CPU.
fn scaling(pg: &testkit::postgres::Postgres, tasks: usize) {
    scaling_rows(pg, tasks, None);
    let cap: f64 = std::env::var("BENCH_SCALE_CPU")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.05);
    if cap > 0.0 {
        if rustix::process::geteuid().is_root() {
            scaling_rows(pg, tasks, Some(cap));
        } else {
            println!("(the capped rows need root for the cgroups: left out)");
        }
    }
}

fn scaling_rows(pg: &testkit::postgres::Postgres, tasks: usize, cap: Option<f64>) {
    let rows: Vec<scale::Row> = (1..=3)
        .filter_map(|n| scale::run(pg, n, tasks, cap))
        .collect();
    let Some(one) = rows.first().map(|r| r.steps as f64 / r.secs) else {
        eprintln!("scale: no row completed");
        return;
    };
    let title = match cap {
        None => "plan tasks, steps per second".to_string(),
        Some(c) => format!("each replica capped at {c} CPU"),
    };
    println!(
        "\n{:<44} {:>12} {:>12} {:>16}",
        title, "seconds", "steps/s", "vs 1 replica"
    );
    for r in &rows {
        let rate = r.steps as f64 / r.secs;
        println!(
            "{:<44} {:>12.1} {:>12.1} {:>15.2}×",
            format!(
                "{} replica(s), {} tasks × {} steps",
                r.replicas,
                r.tasks,
                r.steps / r.tasks
            ),
            r.secs,
            rate,
            rate / one
        );
    }
    if let Some(three) = rows.iter().find(|r| r.replicas == 3) {
        let ratio = three.steps as f64 / three.secs / one;
        println!(
            "(target: 3 replicas ≥ 2× one: {}; {} CPUs for PostgreSQL, the replicas and the workers)",
            if ratio >= 2.0 { "met" } else { "missed" },
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        );
    }
}

/// The failover rows.
fn failovers(pg: &testkit::postgres::Postgres, samples: usize) {
    let restart = failover::restart(samples);
    let replicas = failover::replicas(pg, samples);
    if restart.is_empty() || replicas.is_empty() {
        eprintln!("failover: no sample completed");
        std::process::exit(1);
    }
    let ((r50, r99), (f50, f99)) = (
        failover::percentiles(&restart),
        failover::percentiles(&replicas),
    );
    let ttl = Timing::default().lease_ttl;
    println!(
        "\n{:<44} {:>12} {:>12} {:>16}",
        "kill to the task's next step (s)", "restart", "replica", "replica/restart"
    );
    for (what, r, f) in [("p50", r50, f50), ("p99", r99, f99)] {
        println!(
            "{what:<44} {:>12.2} {:>12.2} {:>15.2}×",
            r.as_secs_f64(),
            f.as_secs_f64(),
            f.as_secs_f64() / r.as_secs_f64()
        );
    }
    println!(
        "({} and {} samples; lease TTL {:?}: target p99 ≤ {:?}, {})",
        restart.len(),
        replicas.len(),
        ttl,
        ttl * 2,
        if f99 <= ttl * 2 { "met" } else { "missed" }
    );
}
