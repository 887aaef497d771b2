//! Event-stream benchmark: how long an appended record takes to reach its watchers, with 1,
//! 100 and 1,000 of them on one task, over the web API's Server-Sent Events and over the
//! admin gRPC stream `brain watch` uses, side by side in one run; whether that many watchers
//! slow the task; and the brain's resident memory meanwhile. Prints figures; never fails on
//! a timing.
//!
//!     cargo build --release --workspace && cargo bench -p brain --bench events
//!
//! The task is a scripted plan on a real worker: a pause while the watchers connect (each
//! reads the history first), then `BENCH_STEPS` (200) steps of `true`. A record's latency is
//! the time it arrived at a watcher minus its `at_ms` in the log (the same machine's clock;
//! the log's timestamps are in milliseconds, so figures are ±1 ms). The watchers run in this
//! process on the same two cores; "brain µs/rec" is the brain's own CPU time per delivered
//! record beyond what the task costs with nobody watching, "watchers µs/rec" this process's
//! (the watchers' own reading and parsing, which on a real deployment runs elsewhere).
//! Each case runs `BENCH_REPEAT` (3) times, each right after a run with nobody watching; the
//! pace is the median ratio of those pairs (`BENCH_PAIRS=1` prints each pair's too: on a
//! machine shared with other work a pair's ratio swings with that work). Then the same task on
//! three replicas on one PostgreSQL (where one is installed), with 1 and 1,000 SSE watchers on
//! the replica that drives the task and spread over all three. `BENCH_VIA=sse|grpc|replicas`
//! and `BENCH_WATCHERS=1000` (a list) run only those cases.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use brain::admin::client::Target;
use brain::trust::ca::DataDir;
use serde_json::Value;
use shared::locks::Lock;
use testkit::{BrainOptions, Cluster};

/// Seconds the plan waits before its steps, so every watcher is connected and has read the
/// history when the measured records are appended.
const PAUSE_S: u64 = 6;

/// Since when records count (ms since the epoch, as f64 bits): read by every watcher for
/// every record, so an atomic, not a lock.
struct Since(std::sync::atomic::AtomicU64);

impl Default for Since {
    fn default() -> Self {
        Self(std::sync::atomic::AtomicU64::new(f64::MAX.to_bits()))
    }
}

impl Since {
    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(std::sync::atomic::Ordering::Relaxed))
    }
    fn set(&self, v: f64) {
        self.0
            .store(v.to_bits(), std::sync::atomic::Ordering::Relaxed)
    }
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1e3
}

/// A record's `at_ms`, read without parsing the whole record (a thousand watchers parsing
/// every record would take the CPU the brain is measured on).
fn at_ms(record_json: &str) -> Option<f64> {
    // A 64-bit integer, written as a string on the wire (proto3's JSON mapping).
    let rest = &record_json[record_json.find("\"at_ms\":")? + 8..];
    let rest = rest.strip_prefix('"').unwrap_or(rest);
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

#[derive(Clone, Copy, PartialEq)]
enum Via {
    None,
    Sse,
    Grpc,
}

struct Outcome {
    latencies: Vec<f64>,
    task_ms: f64,
    rss_kb: u64,
    complete: usize,
    /// The brain's CPU time over the run.
    cpu_ms: f64,
    /// This process's (the watchers') CPU time over the run.
    watchers_cpu_ms: f64,
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// The brain's CPU time so far (user + system), in ms.
fn cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // Fields 14 and 15 of stat (utime, stime), counted from after the command name.
    let ticks = f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0);
    // SAFETY: sysconf has no memory-safety requirements.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks * 1000.0 / hz.max(1.0)
}

/// This process's CPU time so far (user + system), in ms.
fn own_cpu_ms() -> f64 {
    // SAFETY: getrusage fills a local struct.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(u.ru_utime) + ms(u.ru_stime)
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

/// Raises this process's open-file limit to its hard limit (children inherit it): a thousand
/// watchers are a thousand sockets on each side.
fn raise_nofile() {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max.min(65536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

async fn sse_watcher(
    url: String,
    token: String,
    ready: Arc<tokio::sync::Barrier>,
    lat: Arc<Mutex<Vec<f64>>>,
    from_ms: Arc<Since>,
) -> bool {
    let client = reqwest::Client::new();
    let Ok(mut resp) = client
        .get(&url)
        .header("authorization", format!("Bearer {token}"))
        .send()
        .await
    else {
        ready.wait().await;
        return false;
    };
    // Blocks are read in place, without a copy or an allocation each: a thousand watchers
    // in this process take CPU from the brain they measure.
    let mut buf: Vec<u8> = Vec::new();
    let mut waited = false;
    let mut mine = Vec::new();
    let mut ended = false;
    while let Ok(Some(chunk)) = resp.chunk().await {
        let t = now_ms();
        buf.extend_from_slice(&chunk);
        let mut pos = 0;
        while let Some(end) = buf[pos..].windows(2).position(|w| w == b"\n\n") {
            let block = &buf[pos..pos + end];
            pos += end + 2;
            if block.starts_with(b"event: end") {
                ended = true;
            } else if let Some(at) = std::str::from_utf8(block).ok().and_then(at_ms)
                && at >= from_ms.get()
            {
                mine.push(t - at);
            }
        }
        buf.drain(..pos);
        if !waited {
            waited = true;
            ready.wait().await;
        }
        if ended {
            break;
        }
    }
    if !waited {
        ready.wait().await;
    }
    lat.locked().extend(mine);
    ended
}

async fn grpc_watcher(
    mut client: proto::admin_client::AdminClient<tonic::transport::Channel>,
    task: String,
    ready: Arc<tokio::sync::Barrier>,
    lat: Arc<Mutex<Vec<f64>>>,
    from_ms: Arc<Since>,
) -> bool {
    let Ok(stream) = client
        .task_log(proto::TaskLogRequest {
            task_id: task,
            follow: true,
            after_seq: 0,
        })
        .await
    else {
        ready.wait().await;
        return false;
    };
    let mut stream = stream.into_inner();
    let mut waited = false;
    let mut mine = Vec::new();
    let mut last_kind_finished = false;
    while let Ok(Some(r)) = stream.message().await {
        let t = now_ms();
        if let Some(proto::task_record::Item::Record(json)) = r.item {
            if let Some(at) = at_ms(&json)
                && at >= from_ms.get()
            {
                mine.push(t - at);
            }
            last_kind_finished = json.contains("\"kind\":\"finished\"");
        }
        if !waited {
            waited = true;
            ready.wait().await;
        }
    }
    if !waited {
        ready.wait().await;
    }
    lat.locked().extend(mine);
    last_kind_finished
}

/// Where a run's task is driven and where its watchers connect.
struct Setup<'a> {
    /// The brain the task is started through, which drives it (its worker is there).
    drive: &'a Cluster,
    /// Brains the watchers connect to, in turn (the first watcher to the first).
    watch: Vec<&'a Cluster>,
    /// Every brain process: their CPU time and memory are the run's.
    brains: Vec<&'a Cluster>,
}

impl<'a> Setup<'a> {
    fn one(c: &'a Cluster) -> Self {
        Self {
            drive: c,
            watch: vec![c],
            brains: vec![c],
        }
    }

    fn pids(&self) -> Vec<u32> {
        self.brains
            .iter()
            .map(|c| c.brain.as_ref().unwrap().pid())
            .collect()
    }
}

fn run_once(s: &Setup, rt: &tokio::runtime::Runtime, via: Via, n: usize, steps: usize) -> Outcome {
    let c = s.drive;
    let mut plan = vec![serde_json::json!({"run": ["sleep", PAUSE_S.to_string()]})];
    plan.extend((0..steps).map(|_| serde_json::json!({"run": ["true"]})));
    let file = c.dir.join(format!("plan-{n}.json"));
    std::fs::write(&file, serde_json::json!({ "steps": plan }).to_string()).unwrap();
    let out = c.brain_cli(&["run", "--plan", file.to_str().unwrap(), "--worker", "bench"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // One web API token for each brain watched (each brain's admin makes its own).
    let tokens: Vec<String> = s
        .watch
        .iter()
        .map(|w| {
            let out = w.brain_cli(&["admin", "token", "create", "--name", "bench", "--ttl", "1h"]);
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        })
        .collect();
    let lat = Arc::new(Mutex::new(Vec::new()));
    // Records appended before every watcher is in are not counted.
    let from_ms = Arc::new(Since::default());
    let ready = Arc::new(tokio::sync::Barrier::new(n + 1));
    let target = Target::resolve(&DataDir(c.data.clone()), None, None);
    let pids = s.pids();
    let rss = |pids: &[u32]| pids.iter().map(|p| rss_kb(*p)).sum::<u64>();
    let cpu = |pids: &[u32]| pids.iter().map(|p| cpu_ms(*p)).sum::<f64>();
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let cpu_before = cpu(&pids);
    let own_before = own_cpu_ms();
    let complete = rt.block_on(async {
        let mut handles = Vec::new();
        let mut clients = Vec::new();
        if via == Via::Grpc {
            // A channel per 100 streams: HTTP/2 bounds the streams on one connection.
            for _ in 0..n.div_ceil(100) {
                clients.push(target.connect().await.expect("admin connection"));
            }
        }
        for i in 0..n {
            let (lat, from, ready) = (lat.clone(), from_ms.clone(), ready.clone());
            handles.push(match via {
                Via::Sse => tokio::spawn(sse_watcher(
                    format!(
                        "{}/api/tasks/{id}/events",
                        s.watch[i % s.watch.len()].web_url()
                    ),
                    tokens[i % s.watch.len()].clone(),
                    ready,
                    lat,
                    from,
                )),
                Via::Grpc => tokio::spawn(grpc_watcher(
                    clients[i / 100].clone(),
                    id.clone(),
                    ready,
                    lat,
                    from,
                )),
                Via::None => unreachable!(),
            });
        }
        ready.wait().await;
        from_ms.set(now_ms());
        let sampler = {
            let (peak, pids) = (peak.clone(), pids.clone());
            tokio::spawn(async move {
                loop {
                    peak.fetch_max(rss(&pids), std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        let mut complete = 0;
        for h in handles {
            if h.await.unwrap_or(false) {
                complete += 1;
            }
        }
        if via == Via::None {
            from_ms.set(now_ms());
        }
        sampler.abort();
        complete
    });
    // The task's own pace: from the end of the pause to its last record.
    let deadline = Instant::now() + Duration::from_secs(600);
    let log = loop {
        let out = c.brain_cli(&["task", "log", &id, "--json"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if text.contains("\"kind\":\"finished\"") {
            break text;
        }
        assert!(Instant::now() < deadline, "the plan did not finish");
        std::thread::sleep(Duration::from_millis(200));
    };
    let recs: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let completed: Vec<f64> = recs
        .iter()
        .filter(|r| r["kind"] == "tool_call_completed")
        .filter_map(|r| testkit::json_u64(&r["at_ms"]).map(|ms| ms as f64))
        .collect();
    let end = recs
        .last()
        .and_then(|r| testkit::json_u64(&r["at_ms"]))
        .map_or(0.0, |ms| ms as f64);
    let task_ms = end - completed.first().copied().unwrap_or(end);
    let cpu = cpu(&pids) - cpu_before;
    let watchers_cpu_ms = own_cpu_ms() - own_before;
    let mut latencies = lat.locked().clone();
    latencies.retain(|l| l.is_finite());
    Outcome {
        latencies,
        task_ms,
        rss_kb: peak
            .load(std::sync::atomic::Ordering::Relaxed)
            .max(rss(&pids)),
        complete,
        cpu_ms: cpu,
        watchers_cpu_ms,
    }
}

/// How many times each case runs, each right after a run with nobody watching.
fn repeat() -> usize {
    std::env::var("BENCH_REPEAT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1)
}

/// Runs one case `repeat()` times, each right after a run nobody watches on the same setup,
/// and prints its row; the runs nobody watched go into `bases`.
fn case(
    s: &Setup,
    rt: &tokio::runtime::Runtime,
    (via, name): (Via, &str),
    n: usize,
    steps: usize,
    bases: &mut Vec<Outcome>,
) {
    let (mut latencies, mut ratios, mut times) = (Vec::new(), Vec::new(), Vec::new());
    let (mut brain_us, mut watchers_us) = (Vec::new(), Vec::new());
    let (mut complete, mut rss, mut records) = (usize::MAX, 0, 0);
    for _ in 0..repeat() {
        let base = run_once(s, rt, Via::None, 0, steps);
        let o = run_once(s, rt, via, n, steps);
        let delivered = o.latencies.len().max(1) as f64;
        ratios.push(o.task_ms / base.task_ms.max(1.0));
        times.push(o.task_ms);
        // What each delivered record cost the brain, beyond running the task.
        brain_us.push((o.cpu_ms - base.cpu_ms).max(0.0) * 1000.0 / delivered);
        // And the watchers themselves (this process), who share the cores.
        watchers_us.push(o.watchers_cpu_ms * 1000.0 / delivered);
        complete = complete.min(o.complete);
        rss = rss.max(o.rss_kb);
        records = o.latencies.len();
        latencies.extend(o.latencies);
        bases.push(base);
    }
    let (p50, p99) = (pct(&mut latencies, 0.5), pct(&mut latencies, 0.99));
    // In the order run (the median below sorts them).
    let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}×")).collect();
    println!(
        "{:<24} {:>8} {:>8.1}ms {:>8.1}ms {:>9} {:>8} {:>9.0}ms {:>7.2}× {:>8}MB {:>12.1} {:>14.1}",
        name,
        n,
        p50,
        p99,
        records,
        complete,
        pct(&mut times, 0.5),
        pct(&mut ratios, 0.5),
        rss / 1024,
        pct(&mut brain_us, 0.5),
        pct(&mut watchers_us, 0.5),
    );
    if std::env::var_os("BENCH_PAIRS").is_some() {
        println!("{:<24} each pair, in order: {}", "", each.join(" "));
    }
}

fn header() {
    println!(
        "{:<24} {:>8} {:>10} {:>10} {:>9} {:>8} {:>11} {:>8} {:>10} {:>12} {:>14}",
        "append → watcher",
        "watchers",
        "p50",
        "p99",
        "records",
        "saw end",
        "task time",
        "vs none",
        "brain RSS",
        "brain µs/rec",
        "watchers µs/rec"
    );
}

fn none_row(bases: &[Outcome]) {
    let mut base_times: Vec<f64> = bases.iter().map(|b| b.task_ms).collect();
    println!(
        "{:<24} {:>8} {:>10} {:>10} {:>9} {:>8} {:>9.0}ms {:>8} {:>8}MB {:>12} {:>14}",
        "nobody watching",
        0,
        "-",
        "-",
        "-",
        "-",
        pct(&mut base_times, 0.5),
        "1.00×",
        bases.iter().map(|b| b.rss_kb).max().unwrap_or(0) / 1024,
        "-",
        "-"
    );
}

/// The web API's limits raised past the largest case: by default a credential holds up to 8
/// streams and the web API 256 connections, and one token serves every SSE watcher of a brain.
const WEB_LIMITS: &str = "[web]\nmax_streams_per_credential = 1000\nmax_connections = 1100\n";

/// The same task watched over SSE through replicas on PostgreSQL: 1 and 1,000 watchers all on
/// the replica driving the task, and spread over all three (the first on another replica):
/// what reaches a watcher on another replica comes through the database (NOTIFY, then a read
/// of the log).
fn replicas(rt: &tokio::runtime::Runtime, steps: usize, counts: &[usize]) {
    let Some(pg) = testkit::postgres::start_or_skip() else {
        println!("\nreplicas: skipped (no PostgreSQL here: apt-get install postgresql)");
        return;
    };
    let replicas: Vec<Cluster> = (0..3)
        .map(|i| {
            let mut o = pg.replica(&format!("r{i}"));
            o.web = true;
            o.config = Some(WEB_LIMITS.into());
            Cluster::start_with(o)
        })
        .collect();
    let _w = replicas[0].join_worker("bench");
    println!(
        "\nThe same over 3 replicas on one PostgreSQL (the task driven by r0, its worker's; brain RSS and µs/rec are the three replicas' together)\n"
    );
    header();
    let all: Vec<&Cluster> = replicas.iter().collect();
    let on_driver = Setup {
        drive: &replicas[0],
        watch: vec![&replicas[0]],
        brains: all.clone(),
    };
    let spread = Setup {
        drive: &replicas[0],
        watch: vec![&replicas[1], &replicas[2], &replicas[0]],
        brains: all.clone(),
    };
    let mut bases = Vec::new();
    for &n in counts {
        case(
            &on_driver,
            rt,
            (Via::Sse, "SSE, on the driver"),
            n,
            steps,
            &mut bases,
        );
        case(
            &spread,
            rt,
            (Via::Sse, "SSE, over 3 replicas"),
            n,
            steps,
            &mut bases,
        );
    }
    none_row(&bases);
}

fn main() {
    raise_nofile();
    let steps: usize = std::env::var("BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // BENCH_WATCHERS=1000 (a comma-separated list) runs only those counts.
    let counts: Vec<usize> = std::env::var("BENCH_WATCHERS")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 100, 1000]);
    // BENCH_VIA=sse, grpc or replicas runs only that part.
    let only = std::env::var("BENCH_VIA").unwrap_or_default();
    println!(
        "Tether event-stream benchmark ({steps} steps of `true` per run, loopback, {} CPUs; the brain, the worker and every watcher share them)\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    if only != "replicas" {
        let c = Cluster::start_with(BrainOptions {
            web: true,
            config: Some(WEB_LIMITS.into()),
            ..Default::default()
        });
        let _w = c.join_worker("bench");
        header();
        let s = Setup::one(&c);
        let mut bases: Vec<Outcome> = Vec::new();
        for (via, name) in [
            (Via::Sse, "SSE (web API)"),
            (Via::Grpc, "gRPC (brain watch)"),
        ]
        .into_iter()
        .filter(|(v, _)| only.is_empty() || (only == "sse") == (*v == Via::Sse))
        {
            for &n in &counts {
                case(&s, &rt, (via, name), n, steps, &mut bases);
            }
        }
        none_row(&bases);
    }
    if only.is_empty() || only == "replicas" {
        // On the replicas: one watcher and the most.
        let most = counts.iter().copied().max().unwrap_or(1000);
        let mut few = vec![1, most];
        few.dedup();
        replicas(&rt, steps, &few);
    }
    println!(
        "\n(medians of {} runs; \"vs none\" is the median ratio to a run with nobody watching on the same brains made just before each)",
        repeat()
    );
}
