//! Load benchmark: a fleet of real `worker` processes joined to one real `brain` on
//! loopback, then plan tasks of 3 steps each started without `--worker`, every row beside
//! the last in one run:
//!
//! - 100 workers × 100 tasks, 1,000 × 1,000, and 1,000 × 5,000 (queued beyond capacity:
//!   each worker takes 2 tasks at once, and in this row each step holds its worker 10 s, so
//!   tasks are created faster than they end);
//! - the same with 10% of the workers SIGKILLed mid-run (`/10` rows; their steps hold the
//!   worker a second each, so the kill lands while tasks run; failover after 5 s).
//!
//! Each row checks what must hold — every task finished with each of its lines exactly once
//! in its workspace, no worker ever held more tasks than its capacity, no move when no
//! worker died, each task of a killed worker moved once — and measures steps per second
//! (from the first task created to the last finished), the brain's peak RSS and CPU time,
//! and the placement decision's p99 (from the brain's own log). Prints figures and ratios;
//! never fails on a timing.
//!
//!     cargo build --release -p brain -p worker && cargo bench -p brain --bench load
//!
//! `BENCH_ROWS` picks rows (default `100x100,1000x1000,1000x5000,100x100/10,1000x1000/10`);
//! `BENCH_ROW_TIMEOUT` (seconds, default 900) bounds each. `BENCH_BASELINE=DIR` runs the rows
//! first with the `brain` and `worker` in DIR (another commit's `target/release`; a worker
//! without `--max-tasks` runs without it) and prints them beside this build's;
//! `BENCH_BASELINE_ROWS` gives it other rows (an old build that piles every task on one
//! worker takes long at 1,000).
//! Each worker is a process with two connections; 1,000 of them need about 10 GiB of memory
//! and 4,000 file descriptors in the brain.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::{BrainOptions, Cluster, Proc, text};

const STEPS: usize = 3;
const CAPACITY: u32 = 2;
const THREADS: usize = 6;

#[derive(Clone, Copy, Debug)]
struct Row {
    workers: usize,
    tasks: usize,
    kill_pct: usize,
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}×{}", self.workers, self.tasks)?;
        if self.kill_pct > 0 {
            write!(f, " kill {}%", self.kill_pct)?;
        }
        Ok(())
    }
}

fn parse_rows(s: &str) -> Vec<Row> {
    s.split(',')
        .filter(|r| !r.trim().is_empty())
        .map(|r| {
            let (size, kill) = r.trim().split_once('/').unwrap_or((r.trim(), "0"));
            let (w, t) = size
                .split_once('x')
                .expect("rows look like 100x100 or 100x100/10");
            Row {
                workers: w.parse().expect("workers"),
                tasks: t.parse().expect("tasks"),
                kill_pct: kill.parse().expect("kill percent"),
            }
        })
        .collect()
}

/// What one row measured.
#[derive(Default)]
struct Figures {
    finished: usize,
    failed: usize,
    lines_ok: usize,
    secs: f64,
    steps_per_sec: f64,
    rss_mb: f64,
    cpu_secs: f64,
    placement_p99_us: Option<u64>,
    placement_p50_us: Option<u64>,
    /// Ids `brain run` printed that the brain does not list.
    missing: usize,
    /// The most tasks seen queued at once.
    most_queued: usize,
    /// Tasks that moved more than once.
    moved_twice: usize,
    /// Of the tasks unfinished on a killed worker just after the kill, how many moved.
    killed_moved: usize,
    placement_decisions: usize,
    workers_used: usize,
    most_placed_on_one: usize,
    peak_over_capacity: usize,
    moves: usize,
    killed: usize,
    tasks_on_killed: usize,
    timed_out: bool,
}

fn main() {
    let rows = parse_rows(
        &std::env::var("BENCH_ROWS")
            .unwrap_or_else(|_| "100x100,1000x1000,1000x5000,100x100/10,1000x1000/10".into()),
    );
    let timeout = Duration::from_secs(
        std::env::var("BENCH_ROW_TIMEOUT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(900),
    );
    println!(
        "Tether load benchmark ({} CPUs): {STEPS} steps per task, capacity {CAPACITY} per worker\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    let mut builds: Vec<(String, Option<PathBuf>)> = vec![];
    if let Some(dir) = std::env::var_os("BENCH_BASELINE") {
        builds.push(("baseline".into(), Some(PathBuf::from(dir))));
    }
    builds.push(("this build".into(), None));
    let mut results: Vec<(String, Row, Figures)> = vec![];
    // The baseline may run fewer rows (`BENCH_BASELINE_ROWS`): one that piles every task on
    // one worker takes long at 1,000.
    let baseline_rows = std::env::var("BENCH_BASELINE_ROWS")
        .map(|s| parse_rows(&s))
        .unwrap_or_else(|_| rows.clone());
    for (name, dir) in &builds {
        let rows = if dir.is_some() { &baseline_rows } else { &rows };
        for row in rows {
            eprintln!("-- {name}: {row}");
            let f = run_row(*row, dir.clone(), timeout);
            print_row(name, row, &f);
            results.push((name.clone(), *row, f));
        }
    }
    println!("\nsummary");
    println!(
        "{:<11} {:<18} {:>9} {:>9} {:>8} {:>8} {:>9} {:>7} {:>6} {:>9} {:>6}",
        "build",
        "row",
        "finished",
        "steps/s",
        "RSS MB",
        "CPU s",
        "p99 µs",
        "used",
        "most",
        "over cap",
        "moves"
    );
    for (name, row, f) in &results {
        println!(
            "{:<11} {:<18} {:>9} {:>9.1} {:>8.0} {:>8.1} {:>9} {:>7} {:>6} {:>9} {:>6}",
            name,
            row.to_string(),
            format!("{}/{}", f.finished, row.tasks),
            f.steps_per_sec,
            f.rss_mb,
            f.cpu_secs,
            f.placement_p99_us
                .map_or("n/a".to_string(), |v| v.to_string()),
            f.workers_used,
            f.most_placed_on_one,
            f.peak_over_capacity,
            f.moves
        );
    }
    for (name, _) in &builds {
        let get = |w: usize, t: usize| {
            results
                .iter()
                .find(|(n, r, _)| n == name && r.workers == w && r.tasks == t && r.kill_pct == 0)
                .map(|(_, _, f)| f.steps_per_sec)
        };
        if let (Some(small), Some(big)) = (get(100, 100), get(1000, 1000)) {
            println!(
                "{name}: steps/s at 1000×1000 is {:.2}× that at 100×100 (target ≥ 0.8)",
                big / small
            );
        }
        if let Some((_, _, f)) = results
            .iter()
            .find(|(n, r, _)| n == name && r.workers == 1000 && r.tasks == 5000)
        {
            println!(
                "{name}: brain peak RSS at 1000×5000 is {:.0} MB (target ≤ 500)",
                f.rss_mb
            );
        }
    }
    if builds.len() == 2 {
        for row in &rows {
            let pick = |n: &str| {
                results
                    .iter()
                    .find(|(b, r, _)| b == n && r.to_string() == row.to_string())
                    .map(|(_, _, f)| f.steps_per_sec)
            };
            if let (Some(base), Some(now)) = (pick("baseline"), pick("this build")) {
                println!("{row}: steps/s {:.2}× the baseline's", now / base);
            }
        }
    }
}

fn print_row(name: &str, row: &Row, f: &Figures) {
    println!(
        "{name} {row}: {}/{} finished ({} failed), lines exactly once in {}, {:.1} s, {:.1} steps/s, brain RSS {:.0} MB, CPU {:.1} s, placement p50/p99 {}/{} over {} decisions, {} workers used, most placed on one {}, workers over capacity {}, most queued at once {}, moves {}{}{}",
        f.finished,
        row.tasks,
        f.failed,
        f.lines_ok,
        f.secs,
        f.steps_per_sec,
        f.rss_mb,
        f.cpu_secs,
        f.placement_p50_us
            .map_or("n/a".to_string(), |v| v.to_string()),
        f.placement_p99_us
            .map_or("n/a".to_string(), |v| format!("{v} µs")),
        f.placement_decisions,
        f.workers_used,
        f.most_placed_on_one,
        f.peak_over_capacity,
        f.most_queued,
        f.moves,
        if f.killed > 0 {
            format!(
                " (killed {} workers holding {} tasks)",
                f.killed, f.tasks_on_killed
            )
        } else {
            String::new()
        },
        if f.timed_out { "; TIMED OUT" } else { "" }
    );
    // What must hold, said plainly (a benchmark does not fail on it, but it is no figure
    // when it does not hold).
    let mut broken = vec![];
    if f.missing > 0 {
        broken.push(format!(
            "{} task ids that `brain run` printed are not in `brain tasks`",
            f.missing
        ));
    }
    if f.finished != row.tasks {
        broken.push(format!("{} of {} tasks finished", f.finished, row.tasks));
    }
    if f.lines_ok != row.tasks {
        broken.push(format!(
            "{} of {} workspaces hold each line exactly once",
            f.lines_ok, row.tasks
        ));
    }
    if f.peak_over_capacity > 0 {
        broken.push(format!(
            "{} workers went over capacity",
            f.peak_over_capacity
        ));
    }
    if row.kill_pct == 0 && f.moves > 0 {
        broken.push(format!("{} moves with no worker lost", f.moves));
    }
    if f.moved_twice > 0 {
        broken.push(format!("{} tasks moved more than once", f.moved_twice));
    }
    if row.kill_pct > 0 {
        println!(
            "  of {} tasks unfinished on the killed workers just after the kill, {} moved (once each); {} moves in all",
            f.tasks_on_killed, f.killed_moved, f.moves
        );
    }
    for b in broken {
        println!("  NOT AS IT MUST BE: {b}");
    }
}

/// Whether this `worker` knows `--max-tasks`.
fn worker_has_max_tasks(worker: &Path) -> bool {
    Command::new(worker)
        .args(["run", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("--max-tasks"))
        .unwrap_or(false)
}

fn json(out: &std::process::Output) -> Vec<Value> {
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// Whether a task, as `brain tasks --json` lists it, has ended.
fn has_ended(t: &Value) -> bool {
    matches!(
        t["status"].as_str(),
        Some("finished" | "failed" | "cancelled")
    )
}

/// Worker names by id, from `brain workers --json`.
fn names_by_id(workers: &[Value]) -> HashMap<String, String> {
    workers
        .iter()
        .map(|w| {
            (
                w["id"].as_str().unwrap_or_default().to_string(),
                w["name"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn run_row(row: Row, bin_dir: Option<PathBuf>, timeout: Duration) -> Figures {
    let mut f = Figures::default();
    let c = Cluster::start_with(BrainOptions {
        lost_after: Duration::from_secs(15),
        extra_args: vec!["--failover-after".into(), "5s".into()],
        env: vec![("RUST_LOG".into(), "info,tether::placement=debug".into())],
        bin_dir,
        ..Default::default()
    });
    let mut procs = join_fleet(&c, row);

    let plan = write_plan(&c, row);
    let t0 = Instant::now();
    let ids = create_tasks(&c, &plan, row);
    eprintln!(
        "   {} tasks created in {:.1} s",
        ids.len(),
        t0.elapsed().as_secs_f64()
    );

    let (last, killed, killed_ids) = wait_for_tasks(&c, row, &mut procs, t0 + timeout, &mut f);
    f.secs = t0.elapsed().as_secs_f64();
    f.killed = killed.len();
    f.tasks_on_killed = killed_ids.len();
    f.finished = last.iter().filter(|t| t["status"] == "finished").count();
    f.failed = last.iter().filter(|t| t["status"] == "failed").count();
    f.steps_per_sec = (f.finished * STEPS) as f64 / f.secs;
    let listed: HashSet<&str> = last.iter().filter_map(|t| t["id"].as_str()).collect();
    f.missing = ids
        .iter()
        .filter(|id| !listed.contains(id.as_str()))
        .count();

    brain_usage(&c, &mut f);
    placements(&c, &last, &mut f);
    from_brain_log(&c, &killed_ids, &mut f);
    drop(procs);
    f
}

/// The fleet: tokens minted in parallel, workers started at once, then wait for all. A
/// worker that knows `--max-tasks` is given the capacity.
fn join_fleet(c: &Cluster, row: Row) -> HashMap<String, Proc> {
    let max_tasks = worker_has_max_tasks(&c.bins.worker);
    let started = Instant::now();
    let names: Vec<String> = (0..row.workers).map(|i| format!("w{i:04}")).collect();
    let tokens: Vec<(String, String)> = std::thread::scope(|s| {
        let chunks: Vec<_> = names
            .chunks(names.len().div_ceil(THREADS))
            .map(|chunk| s.spawn(|| chunk.iter().map(|_| c.token(&[])).collect::<Vec<_>>()))
            .collect();
        chunks.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut procs: HashMap<String, Proc> = HashMap::new();
    for (name, (token, ca)) in names.iter().zip(&tokens) {
        let mut cmd = c.join_cmd(name, token, ca);
        cmd.arg("--no-sandbox").env("RUST_LOG", "warn");
        if max_tasks {
            cmd.args(["--max-tasks", &CAPACITY.to_string()]);
        }
        let p = Proc::spawn(cmd, &c.dir.join(name).with_extension("log")).expect("spawn worker");
        procs.insert(name.clone(), p);
    }
    let joined = testkit::wait_until(Duration::from_secs(900), || {
        json(&c.brain_cli(&["workers", "--json"]))
            .iter()
            .filter(|w| w["state"] == "connected")
            .count()
            == row.workers
    });
    assert!(joined, "the fleet did not join:\n{}", c.brain_log());
    eprintln!(
        "   {} workers joined in {:.1} s",
        row.workers,
        started.elapsed().as_secs_f64()
    );
    procs
}

/// The plan every task runs: `STEPS` steps, each appending its line to `out.txt` and checking
/// it is there.
fn write_plan(c: &Cluster, row: Row) -> PathBuf {
    let plan = c.dir.join("plan.json");
    // Rows that kill workers hold each step a second, so the kill lands mid-run; rows with
    // more tasks than the fleet has room for hold each step 10 s, so tasks are created faster
    // than they end and the rest must queue.
    let pause = if row.tasks > row.workers * CAPACITY as usize {
        "sleep 10; "
    } else if row.kill_pct > 0 {
        "sleep 1; "
    } else {
        ""
    };
    let steps: Vec<Value> = (0..STEPS)
        .map(|i| {
            serde_json::json!({
                "run": ["sh", "-c", format!("{pause}echo line-{i} >> out.txt")],
                "check": ["grep", "-qx", format!("line-{i}"), "out.txt"],
            })
        })
        .collect();
    std::fs::write(&plan, serde_json::json!({ "steps": steps }).to_string()).unwrap();
    plan
}

/// The row's tasks, each started by `brain run --plan` (`THREADS` at once); the ids printed.
fn create_tasks(c: &Cluster, plan: &Path, row: Row) -> Vec<String> {
    std::thread::scope(|s| {
        let per = row.tasks.div_ceil(THREADS);
        let handles: Vec<_> = (0..THREADS)
            .map(|k| {
                s.spawn(move || {
                    let n = per.min(row.tasks.saturating_sub(k * per));
                    (0..n)
                        .map(|_| {
                            let out = c.brain_cli(&["run", "--plan", plan.to_str().unwrap()]);
                            assert!(out.status.success(), "brain run: {}", text(&out));
                            String::from_utf8_lossy(&out.stdout).trim().to_string()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

/// Until every task has ended (or `deadline`); kills workers mid-run in a row that does.
/// Returns the tasks as last listed, the killed workers' names, and the tasks unfinished on
/// them just after the kill.
fn wait_for_tasks(
    c: &Cluster,
    row: Row,
    procs: &mut HashMap<String, Proc>,
    deadline: Instant,
    f: &mut Figures,
) -> (Vec<Value>, HashSet<String>, HashSet<String>) {
    let mut killed: HashSet<String> = HashSet::new();
    let mut killed_ids: HashSet<String> = HashSet::new();
    loop {
        let tasks = json(&c.brain_cli(&["tasks", "--json"]));
        let ended = tasks.iter().filter(|t| has_ended(t)).count();
        f.most_queued = f
            .most_queued
            .max(tasks.iter().filter(|t| t["status"] == "queued").count());
        let steps_done: u64 = tasks
            .iter()
            .map(|t| t["steps_done"].as_u64().unwrap_or(0))
            .sum();
        if row.kill_pct > 0 && killed.is_empty() && steps_done as usize >= row.tasks * STEPS / 3 {
            (killed, killed_ids) = kill_busy_workers(c, row, &tasks, procs);
        }
        // Every task was created before this loop: when all it lists have ended, the row is
        // done (a task it does not list would never end; it is counted as missing).
        let listed = tasks.len();
        if (listed > 0 && ended == listed) || Instant::now() > deadline {
            f.timed_out = ended < listed;
            return (tasks, killed, killed_ids);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Kills `row.kill_pct`% of the fleet among the workers holding `tasks` now; returns their
/// names and the tasks unfinished on them, as the brain lists them just after the kill.
fn kill_busy_workers(
    c: &Cluster,
    row: Row,
    tasks: &[Value],
    procs: &mut HashMap<String, Proc>,
) -> (HashSet<String>, HashSet<String>) {
    let name_of = names_by_id(&json(&c.brain_cli(&["workers", "--json"])));
    let mut busy: Vec<String> = tasks
        .iter()
        .filter(|t| matches!(t["status"].as_str(), Some("running" | "created")))
        .filter_map(|t| t["worker"].as_str())
        .filter_map(|w| name_of.get(w).cloned())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    busy.sort();
    let n = (row.workers * row.kill_pct / 100).max(1).min(busy.len());
    let mut killed: HashSet<String> = HashSet::new();
    for name in busy.into_iter().take(n) {
        if let Some(mut p) = procs.remove(&name) {
            p.kill();
        }
        killed.insert(name);
    }
    // Which tasks the kill caught, as the brain lists them just after it.
    let tasks = json(&c.brain_cli(&["tasks", "--json"]));
    let ids_of_killed: HashSet<String> = name_of
        .iter()
        .filter(|(_, n)| killed.contains(*n))
        .map(|(id, _)| id.clone())
        .collect();
    let killed_ids: HashSet<String> = tasks
        .iter()
        .filter(|t| !has_ended(t))
        .filter(|t| {
            t["worker"]
                .as_str()
                .is_some_and(|w| ids_of_killed.contains(w))
        })
        .filter_map(|t| t["id"].as_str().map(String::from))
        .collect();
    eprintln!(
        "   killed {} workers holding {} unfinished tasks",
        killed.len(),
        killed_ids.len()
    );
    (killed, killed_ids)
}

/// The brain's peak RSS and CPU time, from /proc.
fn brain_usage(c: &Cluster, f: &mut Figures) {
    let Some(pid) = c.brain.as_ref().map(|p| p.pid()) else {
        return;
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    f.rss_mb = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
    f.cpu_secs = (ticks(11) + ticks(12)) / 100.0;
}

/// Where the tasks ran (workers used, the most on one, workers over capacity), and what each
/// workspace holds.
fn placements(c: &Cluster, last: &[Value], f: &mut Figures) {
    let workers = json(&c.brain_cli(&["workers", "--json"]));
    let name_of = names_by_id(&workers);
    f.peak_over_capacity = workers
        .iter()
        .filter(|w| {
            let cap = w["max_tasks"].as_u64().unwrap_or(0);
            cap > 0 && w["peak_tasks"].as_u64().unwrap_or(0) > cap
        })
        .count();
    let mut placed: HashMap<String, usize> = HashMap::new();
    let want: String = (0..STEPS).map(|i| format!("line-{i}\n")).collect();
    for t in last {
        let worker = t["worker"].as_str().unwrap_or_default();
        *placed.entry(worker.to_string()).or_default() += 1;
        let (Some(id), Some(name)) = (t["id"].as_str(), name_of.get(worker)) else {
            continue;
        };
        let Ok(task) = id.parse::<brain::model::TaskId>() else {
            continue;
        };
        let file = c
            .dir
            .join(name)
            .join("workspaces")
            .join(task.workspace())
            .join("out.txt");
        if std::fs::read_to_string(file).is_ok_and(|s| s == want) {
            f.lines_ok += 1;
        }
    }
    f.workers_used = placed.len();
    f.most_placed_on_one = placed.values().copied().max().unwrap_or(0);
}

/// From the brain's log: moves (and of `killed_ids`, how many moved) and placement decisions.
fn from_brain_log(c: &Cluster, killed_ids: &HashSet<String>, f: &mut Figures) {
    let log = c.brain_log();
    let mut moved: HashMap<&str, usize> = HashMap::new();
    for l in log.lines().filter(|l| l.contains("move started")) {
        if let Some(t) = l.split_whitespace().find_map(|w| w.strip_prefix("task=")) {
            *moved.entry(t).or_default() += 1;
        }
    }
    f.moves = moved.values().sum();
    f.moved_twice = moved.values().filter(|n| **n > 1).count();
    f.killed_moved = killed_ids
        .iter()
        .filter(|id| moved.contains_key(id.as_str()))
        .count();
    let mut micros: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("placement decision"))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("micros="))
                .and_then(|v| v.parse().ok())
        })
        .collect();
    micros.sort_unstable();
    f.placement_decisions = micros.len();
    if !micros.is_empty() {
        f.placement_p99_us = Some(micros[(micros.len() * 99 / 100).min(micros.len() - 1)]);
        f.placement_p50_us = Some(micros[micros.len() / 2]);
    }
}
