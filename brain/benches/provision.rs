//! Provisioning benchmark: how long the brain takes to bring up a worker and to release it,
//! beside what the same work costs by hand, in one run. Prints figures; never fails on a
//! timing.
//!
//!     cargo build --release --workspace && cargo bench -p brain --bench provision
//!
//! Rows: `brain provision local` until the worker is connected, beside a local spawn of the
//! worker binary (`worker --version`); `brain provision ssh` until connected, beside `ssh
//! HOST true` and copying the worker binary over ssh (`cat > file`), against a throw-away
//! sshd in a network namespace (skipped, with the reason, when sshd or root is missing); and
//! `brain machines release` for each. N runs each (`BENCH_N`, default 5); medians.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::sshd::SshHost;
use testkit::{BrainOptions, Cluster};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:>9.1} ms", d.as_secs_f64() * 1e3)
}

fn row(name: &str, d: Duration) {
    println!("{name:<58} {}", ms(d));
}

/// Provisions with `args` and releases, `n` times; returns (provision, release) medians.
fn cycle(c: &Cluster, args: &[&str], n: usize) -> (Duration, Duration) {
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        let out = c.brain_cli(args);
        up.push(t.elapsed());
        assert!(out.status.success(), "{}", testkit::text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let id = stdout
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        assert!(stdout.contains("is ready"), "{stdout}");
        let t = Instant::now();
        let out = c.brain_cli(&["machines", "release", &id]);
        down.push(t.elapsed());
        assert!(out.status.success(), "{}", testkit::text(&out));
    }
    (median(up), median(down))
}

fn main() {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    println!("provisioning, {n} runs each, medians (release binaries)\n");

    let host = SshHost::start();
    let mut opts = BrainOptions {
        config: Some("[provision]\nreaper_every = \"200ms\"\n".into()),
        ..BrainOptions::default()
    };
    let cfg = host.as_ref().ok().map(|h| {
        h.trust();
        h.write_ssh_config("yes")
    });
    if let (Ok(h), Some(cfg)) = (&host, &cfg) {
        opts.listen_host = "0.0.0.0".into();
        opts.init_args = vec!["--host".into(), h.brain_host.clone()];
        opts.config = Some(format!(
            "[provision]\nreaper_every = \"200ms\"\n[provision.ssh]\nconfig_file = \"{}\"\n",
            cfg.display()
        ));
    }
    let c = Cluster::start_with(opts);

    let spawn = median(
        (0..n)
            .map(|_| {
                let t = Instant::now();
                let ok = Command::new(&c.bins.worker)
                    .arg("--version")
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok);
                t.elapsed()
            })
            .collect(),
    );
    let (local_up, local_down) = cycle(&c, &["provision", "local"], n);
    row("local: provision until the worker is connected", local_up);
    row(
        "  baseline: local spawn of the worker binary (--version)",
        spawn,
    );
    println!(
        "  ratio provision / spawn: {:.1}×",
        local_up.as_secs_f64() / spawn.as_secs_f64()
    );
    row("local: release (stop, remove, revoke)", local_down);

    let h = match host {
        Ok(h) => h,
        Err(why) => {
            println!("\nssh rows skipped: {why}");
            return;
        }
    };
    let ssh_true = median(
        (0..n)
            .map(|_| {
                let t = Instant::now();
                let ok = h
                    .sshd
                    .ssh(&[&h.sshd.dest(), "true"])
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok);
                t.elapsed()
            })
            .collect(),
    );
    let size = std::fs::metadata(&c.bins.worker)
        .map(|m| m.len())
        .unwrap_or(0);
    let copy = median(
        (0..n)
            .map(|_| {
                let t = Instant::now();
                let ok = h
                    .sshd
                    .ssh(&[&h.sshd.dest(), "cat > worker.copy"])
                    .stdin(std::fs::File::open(&c.bins.worker).unwrap())
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok);
                t.elapsed()
            })
            .collect(),
    );
    let url = format!("https://{}:{}", h.brain_host, c.port);
    let (ssh_up, ssh_down) = cycle(
        &c,
        &["provision", "ssh", &h.sshd.host, "--brain-url", &url],
        n,
    );
    println!();
    row("ssh: provision until the worker is connected", ssh_up);
    row("  baseline: ssh HOST true (fresh connection)", ssh_true);
    row(
        &format!(
            "  baseline: the worker binary over ssh ({:.1} MB)",
            size as f64 / 1e6
        ),
        copy,
    );
    println!(
        "  ratio provision / (ssh true + copy): {:.2}×",
        ssh_up.as_secs_f64() / (ssh_true + copy).as_secs_f64()
    );
    row("ssh: release (stop, remove, revoke)", ssh_down);
}
