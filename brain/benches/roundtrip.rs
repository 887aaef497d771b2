//! Round-trip benchmark: Tether's remote exec against the baselines, measured side by side in
//! one run on loopback, with ratios. Prints figures; never fails on a timing.
//!
//!     cargo build --release --workspace && cargo bench -p brain --bench roundtrip
//!
//! Rows: a local `std::process::Command` spawn of `true`; `true` through brain → worker (the
//! in-brain API the agent uses, confined and started by the workspace's spawner; the same
//! with each command forked and confined on its own; unconfined; and the admin path a person
//! uses); the first four timed call by call in turn, so the noise of a shared host falls on
//! them alike; a 1-byte round trip on the
//! open session; a cold connect (TCP + mTLS + HTTP/2); `ssh -p PORT 127.0.0.1 true` against a
//! throw-away sshd, fresh and multiplexed (skipped, with the reason, when sshd is absent or we
//! are not root); the worker's idle RSS and the release binaries' sizes.

use std::future::Future;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brain::admin::client::Target;
use brain::api::Shared;
use brain::fleet::hub::{ExecSpec, Hub};
use brain::trust::ca::{self, DataDir};
use proto::admin_client::AdminClient;
use testkit::Bins;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

struct Stats {
    p50: Duration,
    p99: Duration,
    n: usize,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    Stats {
        p50: at(0.5),
        p99: at(0.99),
        n: v.len(),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn row(name: &str, s: &Stats) {
    println!("{name:<56} {:>12} {:>12} {:>7}", ms(s.p50), ms(s.p99), s.n);
}

fn time_n(n: usize, mut f: impl FnMut()) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

/// What the ratios compare: the p50s of the rows through brain and worker, and the local spawn.
struct Rows {
    local: Stats,
    tether: Stats,
    fork_exec: Stats,
    bare_exec: Stats,
    admin_exec: Stats,
}

fn main() {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let bins = Bins::locate();
    let tmp = tempfile::tempdir().unwrap();
    println!(
        "Tether round-trip benchmark ({n} calls per row, loopback, {} CPUs)\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    println!("{:<56} {:>12} {:>12} {:>7}", "what", "p50", "p99", "n");

    // Brain in this process, workers as real processes: confined with the workspace's
    // spawner (the default); the same with each command forked and confined on its own (the
    // path every command took before the spawners); and started with --no-sandbox, to show
    // what confinement costs.
    let b = Bench::start(&rt, &bins, tmp.path(), n);
    let (worker, worker_id) = b.join_worker("bench", &tmp.path().join("worker"), &[], "warn", &[]);
    let fork = b.join_worker(
        "bench-fork",
        &tmp.path().join("bench-fork"),
        &[],
        "error",
        &[("TETHER_WORKER_SPAWNER", "off")],
    );
    let bare = b.join_worker(
        "bench-bare",
        &tmp.path().join("bench-bare"),
        &["--no-sandbox"],
        "error",
        &[],
    );
    let [local, tether, fork_exec, bare_exec] = b.exec_rows([&worker_id, &fork.1, &bare.1]);
    row("local std::process::Command `true`", &local);
    row("tether `true` brain → worker (in-brain API)", &tether);
    row(
        "tether `true` brain → worker, confined, no spawner (fork)",
        &fork_exec,
    );
    row(
        "tether `true` brain → worker, unconfined (--no-sandbox)",
        &bare_exec,
    );
    drop((fork, bare));
    let target = Target {
        url: b.url.clone(),
        identity_dir: b.data.admin_identity(),
    };
    let admin_exec = b.admin_row(&target, &worker_id);
    b.echo_row(&worker_id);
    b.cold_connect_row(&target);

    let ssh = ssh_rows(tmp.path(), n);

    // Footprint.
    std::thread::sleep(Duration::from_secs(1));
    let rss_kib = resident_kib(worker.0.id());
    drop(worker);
    b.stop.cancel();

    println!();
    print_footprint(rss_kib, &bins);
    let rows = Rows {
        local,
        tether,
        fork_exec,
        bare_exec,
        admin_exec,
    };
    print_ratios(&rows, ssh);
    if !cfg!(debug_assertions) {
        return;
    }
    println!("\nnote: this is a debug build; run with `cargo bench` for release figures");
}

/// `n` calls of `f` after 50 to warm up, each timed.
async fn time_after_warm_up<F: Future<Output = ()>>(
    n: usize,
    mut f: impl FnMut() -> F,
) -> Vec<Duration> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n + 50 {
        let t = Instant::now();
        f().await;
        if i >= 50 {
            v.push(t.elapsed());
        }
    }
    v
}

/// A worker process, killed when dropped: a row that panics leaves none behind.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `spec` run on worker `id` through the hub, to its exit.
async fn exec_true(hub: &Hub, id: &str, spec: ExecSpec) {
    let mut call = hub.exec(id, spec).await.unwrap();
    while let Some(ev) = call.next().await {
        if matches!(ev.event, Some(proto::exec_event::Event::Exit(_))) {
            break;
        }
    }
}

/// `true` run on worker `worker` through the admin API, to its exit.
async fn admin_exec_true(mut admin: AdminClient<Channel>, worker: &str) {
    let mut s = admin
        .exec(proto::AdminExecRequest {
            worker: worker.to_string(),
            workspace: "default".into(),
            argv: vec!["true".into()],
            cwd: String::new(),
            timeout_ms: 30_000,
            output_cap_bytes: 0,
            limits: None,
        })
        .await
        .unwrap()
        .into_inner();
    // Read to the stream's end, as a client of one long connection must: a stream dropped
    // after its last event is reset, and h2 closes a connection that resets more than 1,024.
    let mut exited = false;
    while let Some(ev) = s.message().await.unwrap() {
        exited |= matches!(ev.event, Some(proto::exec_event::Event::Exit(_)));
    }
    assert!(exited, "the admin exec stream ended without an exit");
}

/// The brain, in this process, and what the rows through it share.
struct Bench<'a> {
    rt: &'a tokio::runtime::Runtime,
    bins: &'a Bins,
    n: usize,
    data: DataDir,
    shared: Arc<Shared>,
    url: String,
    stop: CancellationToken,
    /// `true` in the default workspace.
    spec: ExecSpec,
}

impl<'a> Bench<'a> {
    /// A brain with its data under `tmp`, listening on a loopback port.
    fn start(rt: &'a tokio::runtime::Runtime, bins: &'a Bins, tmp: &Path, n: usize) -> Self {
        let data = DataDir(tmp.join("brain"));
        ca::init(&data, &[], false).unwrap();
        let (shared, url, stop) = rt.block_on(async {
            let ready = brain::app::prepare(brain::app::Options {
                data: data.clone(),
                listen: "127.0.0.1:0".parse().unwrap(),
                lost_after: Duration::from_secs(15),
                tasks: Default::default(),
                require_sandbox: vec![],
                web_listen: None,
                store: None,
                config: Default::default(),
                config_path: data.0.join("config.toml"),
            })
            .await
            .unwrap();
            let url = format!("https://127.0.0.1:{}", ready.addr.port());
            let shared = ready.shared.clone();
            let stop = CancellationToken::new();
            tokio::spawn(ready.run(stop.clone().cancelled_owned()));
            (shared, url, stop)
        });
        let spec = ExecSpec {
            workspace: "default".into(),
            argv: vec!["true".into()],
            cwd: String::new(),
            timeout: Duration::from_secs(30),
            output_cap_bytes: 1 << 20,
            limits: Default::default(),
        };
        Self {
            rt,
            bins,
            n,
            data,
            shared,
            url,
            stop,
            spec,
        }
    }

    /// A worker process named `name` joined with `flags`, its state in `state`, logging at
    /// `log`, with `env`; returns it and its id once the hub has it connected.
    fn join_worker(
        &self,
        name: &str,
        state: &Path,
        flags: &[&str],
        log: &str,
        env: &[(&str, &str)],
    ) -> (Killed, String) {
        let (token, _) = self
            .rt
            .block_on(
                self.shared
                    .registry
                    .create_token(600_000, Default::default()),
            )
            .unwrap();
        let child = Command::new(&self.bins.worker)
            .arg("join")
            .args(flags)
            .args(["--brain", &self.url, "--token", &token, "--ca-hash"])
            .arg(self.shared.ca.hash())
            .args(["--name", name, "--state"])
            .arg(state)
            .env("RUST_LOG", log)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let id = self.rt.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let ws = self.shared.registry.workers().unwrap();
                if let Some(w) = ws
                    .iter()
                    .find(|w| w.name == name && self.shared.hub.is_connected(&w.id))
                {
                    break w.id.clone();
                }
                assert!(Instant::now() < deadline, "worker {name} did not connect");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        (Killed(child), id)
    }

    /// The exec rows, timed call by call in turn so that the machine's noise (which moves
    /// from second to second on a shared host) falls on every row alike: a local spawn of
    /// `true`, then `true` through the in-brain API the agent uses on each worker of
    /// `workers`; `n` rounds after 50 to warm up.
    fn exec_rows(&self, workers: [&str; 3]) -> [Stats; 4] {
        let hub = &self.shared.hub;
        let mut times: [Vec<Duration>; 4] = Default::default();
        self.rt.block_on(async {
            for i in 0..self.n + 50 {
                let t = Instant::now();
                Command::new("true").status().unwrap();
                let mut took = [t.elapsed(); 4];
                for (k, id) in workers.iter().enumerate() {
                    let t = Instant::now();
                    exec_true(hub, id, self.spec.clone()).await;
                    took[k + 1] = t.elapsed();
                }
                if i >= 50 {
                    for (v, d) in times.iter_mut().zip(took) {
                        v.push(d);
                    }
                }
            }
        });
        times.map(stats)
    }

    /// `true` on the worker `id` through the admin path a person uses, on one connection.
    fn admin_row(&self, target: &Target, id: &str) -> Stats {
        let admin_exec = stats(self.rt.block_on(async {
            let admin = target.connect().await.unwrap();
            time_after_warm_up(self.n, || admin_exec_true(admin.clone(), id)).await
        }));
        row("tether `true` admin → brain → worker", &admin_exec);
        admin_exec
    }

    /// A 1-byte echo to the worker `id` and back on its open session.
    fn echo_row(&self, id: &str) {
        let hub = &self.shared.hub;
        let echo = stats(self.rt.block_on(time_after_warm_up(self.n, || async move {
            hub.echo(id, vec![7], Duration::from_secs(5)).await.unwrap();
        })));
        row("tether 1-byte round trip on the open session", &echo);
    }

    /// 100 fresh admin connections, each dropped after it is timed.
    fn cold_connect_row(&self, target: &Target) {
        let cold = stats(self.rt.block_on(async {
            let mut v = Vec::new();
            for _ in 0..100 {
                let t = Instant::now();
                let c = target.connect().await.unwrap();
                v.push(t.elapsed());
                drop(c);
            }
            v
        }));
        row("tether cold connect (TCP + mTLS + HTTP/2)", &cold);
    }
}

/// The resident set of process `pid` in KiB (0 when it cannot be read).
fn resident_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .unwrap_or(0)
}

fn print_footprint(rss_kib: u64, bins: &Bins) {
    let size =
        |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0) as f64 / (1 << 20) as f64;
    println!(
        "worker idle RSS                                {:>9.1} MiB   (target ≤ 20 MiB)",
        rss_kib as f64 / 1024.0
    );
    println!(
        "worker binary (release, stripped)              {:>9.1} MiB   (target ≤ 15 MiB)  {}",
        size(&bins.worker),
        bins.worker.display()
    );
    println!(
        "brain binary (release, stripped)               {:>9.1} MiB",
        size(&bins.brain)
    );
}

fn print_ratios(rows: &Rows, ssh: Option<(Stats, Stats)>) {
    let Rows {
        local,
        tether,
        fork_exec,
        bare_exec,
        admin_exec,
    } = rows;
    println!("\nratios (p50)");
    let r = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "  tether in-brain exec / local spawn           {:>8.2}×   (target ≤ 1.5×)",
        r(tether.p50, local.p50)
    );
    println!(
        "  confined fork (no spawner) / local spawn     {:>8.2}×   (the spawner saves {:.3} ms per command)",
        r(fork_exec.p50, local.p50),
        (fork_exec.p50.as_secs_f64() - tether.p50.as_secs_f64()) * 1e3
    );
    println!(
        "  tether admin exec / local spawn              {:>8.2}×",
        r(admin_exec.p50, local.p50)
    );
    println!(
        "  tether unconfined exec / local spawn         {:>8.2}×   (confinement costs {:.3} ms per command)",
        r(bare_exec.p50, local.p50),
        (tether.p50.as_secs_f64() - bare_exec.p50.as_secs_f64()) * 1e3
    );
    match ssh {
        Some((fresh, mux)) => {
            println!(
                "  fresh ssh / tether in-brain exec             {:>8.1}×   (target ≥ 100×)",
                r(fresh.p50, tether.p50)
            );
            println!(
                "  multiplexed ssh / tether in-brain exec       {:>8.1}×   (target ≥ 10×)",
                r(mux.p50, tether.p50)
            );
            println!(
                "  fresh / multiplexed ssh / tether unconfined  {:>8.1}× / {:.1}×",
                r(fresh.p50, bare_exec.p50),
                r(mux.p50, bare_exec.p50)
            );
        }
        None => println!("  ssh ratios skipped (see above)"),
    }
}

/// Starts a throw-away sshd on a loopback port with a throw-away user and key; returns the
/// (fresh, multiplexed) rows, or `None` with the reason printed.
fn ssh_rows(tmp: &Path, n: usize) -> Option<(Stats, Stats)> {
    let sshd = match testkit::sshd::Sshd::start(tmp) {
        Ok(s) => s,
        Err(why) => {
            println!("{:<46} skipped: {why}", "ssh -p PORT 127.0.0.1 true");
            return None;
        }
    };
    let dest = sshd.dest();
    let fresh_n = (n / 10).clamp(20, 200);
    let fresh = stats(time_n(fresh_n, || {
        assert!(sshd.ssh(&[&dest, "true"]).status().unwrap().success());
    }));
    row("ssh -p PORT 127.0.0.1 true (fresh connection)", &fresh);
    let sock = tmp.join("mux.sock");
    let sock_s = sock.to_string_lossy().to_string();
    let st = sshd
        .ssh(&["-M", "-S", &sock_s, "-f", "-N", &dest])
        .status()
        .unwrap();
    assert!(st.success(), "ssh ControlMaster failed");
    for _ in 0..20 {
        sshd.ssh(&["-S", &sock_s, &dest, "true"]).status().unwrap();
    }
    let mux = stats(time_n(n.min(500), || {
        assert!(
            sshd.ssh(&["-S", &sock_s, &dest, "true"])
                .status()
                .unwrap()
                .success()
        );
    }));
    row("ssh 127.0.0.1 true (multiplexed, ControlMaster)", &mux);
    let _ = sshd.ssh(&["-S", &sock_s, "-O", "exit", &dest]).status();
    Some((fresh, mux))
}
