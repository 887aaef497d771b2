//! Scaling: steps per second for many plan tasks driven by 1, 2 and 3 replicas on one
//! PostgreSQL (each its own database, made fresh), the workers spread over the replicas
//! (each worker's session on one replica, knowing all), the tasks started through the replica
//! their worker is on. Real brains and workers; the clock runs from the first task started to
//! the last one finished, as every replica shows them.
//!
//! On two cores three replicas, PostgreSQL and the workers share what one replica alone had,
//! so the rows can also run with each replica capped at a share of a CPU (a cgroup of its own,
//! `BENCH_SCALE_CPU`, as root): each replica then has as much CPU as the others, as on
//! machines of their own, and the rows show what more replicas add while the brains are what
//! is short.

use std::time::{Duration, Instant};

use testkit::plans::line_plan;
use testkit::{Cluster, Worker};

/// Steps of each task's plan (each a command and its check).
const STEPS: usize = 4;
/// Workers, spread over the replicas.
const WORKERS: usize = 12;

/// One row: replicas, tasks, steps done, seconds.
pub struct Row {
    pub replicas: usize,
    pub tasks: usize,
    pub steps: usize,
    pub secs: f64,
}

/// A cgroup holding one process, at most `share` of a CPU; removed on drop (after the
/// process has gone).
pub struct Capped(std::path::PathBuf);

impl Capped {
    /// Caps `pid` at `share` of a CPU (cgroup v2's `cpu.max`, else v1's CFS quota).
    pub fn new(pid: u32, name: &str, share: f64) -> Result<Self, String> {
        let period = 100_000u64;
        let quota = ((share * period as f64) as u64).max(1000);
        let write = |p: std::path::PathBuf, v: String| {
            std::fs::write(&p, v).map_err(|e| format!("writing {}: {e}", p.display()))
        };
        let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let dir = if v2 {
            let _ = std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+cpu");
            std::path::PathBuf::from(format!("/sys/fs/cgroup/tether-bench-{name}"))
        } else {
            std::path::PathBuf::from(format!("/sys/fs/cgroup/cpu/tether-bench-{name}"))
        };
        std::fs::create_dir_all(&dir).map_err(|e| format!("making {}: {e}", dir.display()))?;
        let capped = Self(dir.clone());
        if v2 {
            write(dir.join("cpu.max"), format!("{quota} {period}"))?;
        } else {
            write(dir.join("cpu.cfs_period_us"), period.to_string())?;
            write(dir.join("cpu.cfs_quota_us"), quota.to_string())?;
        }
        write(dir.join("cgroup.procs"), pid.to_string())?;
        Ok(capped)
    }
}

impl Drop for Capped {
    fn drop(&mut self) {
        // The process is gone by now, or this fails and the group stays (named for the run).
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Runs `tasks` plan tasks on `n` replicas of a fresh database on `pg`, each replica capped
/// at `cap` of a CPU if given.
pub fn run(
    pg: &testkit::postgres::Postgres,
    n: usize,
    tasks: usize,
    cap: Option<f64>,
) -> Option<Row> {
    // Declared first, so dropped last: after the replicas' processes are gone.
    let mut caps: Vec<Capped> = Vec::new();
    let db = format!("scale{n}{}", if cap.is_some() { "capped" } else { "" });
    pg.psql(&format!("CREATE DATABASE {db}"));
    let url = pg
        .url()
        .rsplit_once('/')
        .map(|(base, _)| format!("{base}/{db}"))?;
    let replicas: Vec<Cluster> = (0..n)
        .map(|i| {
            let mut o = pg.replica(&format!("r{i}"));
            o.extra_args[1] = url.clone();
            Cluster::start_with(o)
        })
        .collect();
    if let Some(share) = cap {
        for (i, r) in replicas.iter().enumerate() {
            let pid = r.brain.as_ref()?.pid();
            match Capped::new(pid, &format!("{}-{n}-{i}", std::process::id()), share) {
                Ok(c) => caps.push(c),
                Err(e) => {
                    eprintln!("scale: cannot cap the replicas' CPU here: {e}");
                    return None;
                }
            }
        }
    }
    let workers: Vec<(usize, Worker)> = (0..WORKERS)
        .map(|i| {
            let home = i % n;
            let c = &replicas[home];
            let (token, ca_hash) = c.token(&[]);
            let mut join = c.join_cmd(&format!("w{i}"), &token, &ca_hash);
            join.args(["--max-tasks", "64"]);
            for (j, r) in replicas.iter().enumerate() {
                if j != home {
                    join.arg("--brain").arg(r.url());
                }
            }
            (home, c.spawn_worker(&format!("w{i}"), join))
        })
        .collect();
    let plan = line_plan(&replicas[0], STEPS, "0");
    let t = Instant::now();
    // Started from a few threads at once, each through its worker's replica.
    let ids: Vec<String> = std::thread::scope(|s| {
        let per = tasks.div_ceil(8);
        let handles: Vec<_> = (0..8)
            .map(|k| {
                let (replicas, workers, plan) = (&replicas, &workers, &plan);
                s.spawn(move || {
                    (k * per..((k + 1) * per).min(tasks))
                        .map(|i| {
                            let (home, w) = &workers[i % WORKERS];
                            replicas[*home].run_plan(plan, &w.id)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    // Polled twice a second: a `brain tasks` of every task is not free, and the figure is
    // steps per second over a minute or more.
    let deadline = Instant::now() + Duration::from_secs(1800);
    let mut done = false;
    while Instant::now() < deadline {
        if finished(&replicas[0]) >= ids.len() {
            done = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let secs = t.elapsed().as_secs_f64();
    if !done {
        eprintln!("scale: {n} replicas did not finish {tasks} tasks within 30 min");
        return None;
    }
    Some(Row {
        replicas: n,
        tasks,
        steps: tasks * STEPS,
        secs,
    })
}

/// How many tasks replica `c` shows finished.
fn finished(c: &Cluster) -> usize {
    let out = c.brain_cli(&["tasks", "--json"]);
    serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout)
        .map(|ts| ts.iter().filter(|t| t["status"] == "finished").count())
        .unwrap_or(0)
}
