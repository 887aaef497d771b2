//! Failover: the time from SIGKILL of the brain driving a task to the task's next completed
//! step, for a task on two replicas on PostgreSQL (the other replica takes it over once its
//! lease lapses) beside one brain on sled started again at once (the baseline: a restart on
//! the same machine). Real brains, a real worker, a plan of short steps.

use std::time::{Duration, Instant};

use testkit::Cluster;
use testkit::plans::line_plan;

/// Completed calls of task `id` as brain `c` shows its log (`None`: it does not answer or
/// does not hold the task).
fn calls_done(c: &Cluster, id: &str) -> Option<usize> {
    let out = c.brain_cli(&["task", "log", id, "--json"]);
    if !out.status.success() {
        return None;
    }
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("\"tool_call_completed\""))
            .count(),
    )
}

/// Waits until one of `brains` shows more than `before` completed calls; which one, and when.
fn next_step(brains: &[&Cluster], id: &str, before: usize, limit: Duration) -> Option<usize> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        for (i, c) in brains.iter().enumerate() {
            if calls_done(c, id).is_some_and(|n| n > before) {
                return Some(i);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Failover times on two replicas: each sample kills the replica that drives the task and
/// starts it again once the other has taken over.
pub fn replicas(pg: &testkit::postgres::Postgres, samples: usize) -> Vec<Duration> {
    let mut brains = [
        Cluster::start_with(pg.replica("a")),
        Cluster::start_with(pg.replica("b")),
    ];
    let (token, ca_hash) = brains[0].token(&[]);
    let mut join = brains[0].join_cmd("w", &token, &ca_hash);
    join.arg("--brain").arg(brains[1].url());
    let w = brains[0].spawn_worker("w", join);
    let plan = line_plan(&brains[0], 5_000, "0.05");
    let id = brains[0].run_plan(&plan, &w.id);
    let mut holder = 0;
    let mut times = Vec::new();
    // Counted in the database once the driving replica is dead: every view shows the task,
    // and a view catching up on what the dead replica stored is not a step taken over.
    let num = id.trim_start_matches("t-").to_string();
    let stored = || -> usize {
        pg.psql(&format!(
            "SELECT count(*) FROM events WHERE task = {num} AND convert_from(event, 'UTF8') LIKE '%\"tool_call_completed\"%'"
        ))
        .parse()
        .unwrap_or(0)
    };
    for _ in 0..samples {
        let t = Instant::now();
        brains[holder].kill_brain();
        let before = stored();
        let other = 1 - holder;
        let deadline = Instant::now() + Duration::from_secs(120);
        while stored() <= before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if stored() <= before {
            eprintln!("replica {other} did not take the task over within 120 s");
            break;
        }
        times.push(t.elapsed());
        brains[holder].opts.env = pg.replica("").env;
        brains[holder]
            .start_brain()
            .expect("the killed replica starts again");
        holder = other;
    }
    times
}

/// The baseline: one brain on sled, killed and started again at once.
pub fn restart(samples: usize) -> Vec<Duration> {
    let mut c = Cluster::start();
    let w = c.join_worker("w");
    let plan = line_plan(&c, 5_000, "0.05");
    let id = c.run_plan(&plan, &w.id);
    let mut times = Vec::new();
    for _ in 0..samples {
        let Some(before) = calls_done(&c, &id) else {
            break;
        };
        let t = Instant::now();
        c.kill_brain();
        c.start_brain().expect("the brain starts again");
        if next_step(&[&c], &id, before, Duration::from_secs(120)).is_none() {
            eprintln!("the restarted brain made no step within 120 s");
            break;
        }
        times.push(t.elapsed());
    }
    times
}

/// (p50, p99) of `times`, nearest rank.
pub fn percentiles(times: &[Duration]) -> (Duration, Duration) {
    let mut t = times.to_vec();
    t.sort();
    let rank = |p: f64| t[((p * t.len() as f64).ceil() as usize).clamp(1, t.len()) - 1];
    (rank(0.50), rank(0.99))
}
