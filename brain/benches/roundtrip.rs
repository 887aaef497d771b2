//! Round-trip benchmark: Tether's remote exec against the baselines, measured side by side in
//! one run on loopback, with ratios. Prints figures; never fails on a timing.
//!
//!     cargo build --release --workspace && cargo bench -p brain --bench roundtrip
//!
//! Rows: a local `std::process::Command` spawn of `true`; `true` through brain → worker (the
//! in-brain API the agent uses, confined and started by the workspace's spawner; the same
//! with each command forked and confined on its own; unconfined; and the admin path a person
//! uses); a 1-byte round trip on the
//! open session; a cold connect (TCP + mTLS + HTTP/2); `ssh -p PORT 127.0.0.1 true` against a
//! throw-away sshd, fresh and multiplexed (skipped, with the reason, when sshd is absent or we
//! are not root); the worker's idle RSS and the release binaries' sizes.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use brain::admin::client::Target;
use brain::fleet::hub::ExecSpec;
use brain::trust::ca::{self, DataDir};
use testkit::Bins;

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

    // Baseline: a local spawn of `true`.
    for _ in 0..50 {
        Command::new("true").status().unwrap();
    }
    let local = stats(time_n(n, || {
        Command::new("true").status().unwrap();
    }));
    row("local std::process::Command `true`", &local);

    // Brain in this process, worker as a real process.
    let data = DataDir(tmp.path().join("brain"));
    ca::init(&data, &[], false).unwrap();
    let (ready_shared, url, stop) = rt.block_on(async {
        let ready = brain::app::prepare(brain::app::Options {
            data: data.clone(),
            listen: "127.0.0.1:0".parse().unwrap(),
            lost_after: Duration::from_secs(15),
            tasks: Default::default(),
            require_sandbox: vec![],
            web_listen: None,
            config: Default::default(),
        })
        .await
        .unwrap();
        let url = format!("https://127.0.0.1:{}", ready.addr.port());
        let shared = ready.shared.clone();
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(ready.run(stop.clone().cancelled_owned()));
        (shared, url, stop)
    });
    let (token, _) = rt
        .block_on(
            ready_shared
                .registry
                .create_token(600_000, Default::default()),
        )
        .unwrap();
    let mut worker = Command::new(&bins.worker)
        .args(["join", "--brain", &url, "--token", &token, "--ca-hash"])
        .arg(ready_shared.ca.hash())
        .args(["--name", "bench", "--state"])
        .arg(tmp.path().join("worker"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let hub = ready_shared.hub.clone();
    let worker_id = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ws = ready_shared.registry.workers().unwrap();
            if let Some(w) = ws
                .iter()
                .find(|w| w.name == "bench" && hub.is_connected(&w.id))
            {
                break w.id.clone();
            }
            assert!(Instant::now() < deadline, "worker did not connect");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let spec = ExecSpec {
        workspace: "default".into(),
        argv: vec!["true".into()],
        cwd: String::new(),
        timeout: Duration::from_secs(30),
        output_cap_bytes: 1 << 20,
        limits: Default::default(),
    };
    let hub_exec = || {
        let hub = hub.clone();
        let spec = spec.clone();
        let id = worker_id.clone();
        async move {
            let mut call = hub.exec(&id, spec).await.unwrap();
            while let Some(ev) = call.next().await {
                if matches!(ev.event, Some(proto::exec_event::Event::Exit(_))) {
                    break;
                }
            }
        }
    };
    rt.block_on(async {
        for _ in 0..50 {
            hub_exec().await;
        }
    });
    let tether = stats(rt.block_on(async {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            hub_exec().await;
            v.push(t.elapsed());
        }
        v
    }));
    row("tether `true` brain → worker (in-brain API)", &tether);

    // `true` through another worker joined with `flags` and `env`: n calls after 50 to warm up.
    let other_worker = |name: &str, flags: &[&str], env: &[(&str, &str)]| -> Stats {
        let (token, _) = rt
            .block_on(
                ready_shared
                    .registry
                    .create_token(600_000, Default::default()),
            )
            .unwrap();
        let mut child = Command::new(&bins.worker)
            .arg("join")
            .args(flags)
            .args(["--brain", &url, "--token", &token, "--ca-hash"])
            .arg(ready_shared.ca.hash())
            .args(["--name", name, "--state"])
            .arg(tmp.path().join(name))
            .env("RUST_LOG", "error")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let id = rt.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let ws = ready_shared.registry.workers().unwrap();
                if let Some(w) = ws
                    .iter()
                    .find(|w| w.name == name && hub.is_connected(&w.id))
                {
                    break w.id.clone();
                }
                assert!(Instant::now() < deadline, "worker {name} did not connect");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let s = stats(rt.block_on(async {
            let mut v = Vec::with_capacity(n);
            for i in 0..n + 50 {
                let t = Instant::now();
                let mut call = hub.exec(&id, spec.clone()).await.unwrap();
                while let Some(ev) = call.next().await {
                    if matches!(ev.event, Some(proto::exec_event::Event::Exit(_))) {
                        break;
                    }
                }
                if i >= 50 {
                    v.push(t.elapsed());
                }
            }
            v
        }));
        let _ = child.kill();
        let _ = child.wait();
        s
    };
    // The same confined, but each command forked and confined on its own (no spawner): the
    // path every command took before the spawners.
    let fork_exec = other_worker("bench-fork", &[], &[("TETHER_WORKER_SPAWNER", "off")]);
    row(
        "tether `true` brain → worker, confined, no spawner (fork)",
        &fork_exec,
    );
    // And through a worker started with --no-sandbox, to show what confinement costs.
    let bare_exec = other_worker("bench-bare", &["--no-sandbox"], &[]);
    row(
        "tether `true` brain → worker, unconfined (--no-sandbox)",
        &bare_exec,
    );

    let target = Target {
        url: url.clone(),
        identity_dir: data.admin_identity(),
    };
    let admin_exec = stats(rt.block_on(async {
        let mut admin = target.connect().await.unwrap();
        let mut v = Vec::with_capacity(n);
        for i in 0..n + 50 {
            let t = Instant::now();
            let mut s = admin
                .exec(proto::AdminExecRequest {
                    worker: worker_id.clone(),
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
            while let Some(ev) = s.message().await.unwrap() {
                if matches!(ev.event, Some(proto::exec_event::Event::Exit(_))) {
                    break;
                }
            }
            if i >= 50 {
                v.push(t.elapsed());
            }
        }
        v
    }));
    row("tether `true` admin → brain → worker", &admin_exec);

    let echo = stats(rt.block_on(async {
        let mut v = Vec::with_capacity(n);
        for i in 0..n + 50 {
            let t = Instant::now();
            hub.echo(&worker_id, vec![7], Duration::from_secs(5))
                .await
                .unwrap();
            if i >= 50 {
                v.push(t.elapsed());
            }
        }
        v
    }));
    row("tether 1-byte round trip on the open session", &echo);

    let cold = stats(rt.block_on(async {
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

    let ssh = ssh_rows(tmp.path(), n);

    // Footprint.
    std::thread::sleep(Duration::from_secs(1));
    let rss_kib = std::fs::read_to_string(format!("/proc/{}/status", worker.id()))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .unwrap_or(0);
    let _ = worker.kill();
    let _ = worker.wait();
    stop.cancel();

    println!();
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
    if !cfg!(debug_assertions) {
        return;
    }
    println!("\nnote: this is a debug build; run with `cargo bench` for release figures");
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
