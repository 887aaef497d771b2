//! Egress benchmark: what a request costs through the worker's proxy, with the credential
//! injected by the brain (the CONNECT tunnelled over the worker's session, TLS terminated and
//! re-opened in the brain), tunnelled directly by the worker for an allow-listed host, and
//! with no proxy at all, for 1 KiB and 10 MiB responses, side by side in one run. Prints
//! figures and ratios; never fails on a timing.
//!
//!     cargo build --release --workspace && cargo bench -p brain --bench egress
//!
//! The upstream is an HTTPS server on loopback (rustls, a CA of the bench's own that the
//! brain trusts through its config), which closes every connection, so each request is a
//! new connection and TLS handshake (as a build's fetches mostly are); one `curl` per case
//! makes them all, and a request's latency is curl's own `time_total` for it. The proxied cases run as one replayed task's commands on a real worker, the
//! commands in their own network namespace, so the worker must run as root; the baseline is
//! the same `curl` run by the bench on the host. Each case's curl trusts only the CA it needs:
//! with a bundle of the system's roots (what the commands' `SSL_CERT_FILE` holds, and what
//! curl reads by default) curl spends most of a small request loading it, in every case
//! alike; the last row measures that apart. `BENCH_SMALL` (200) and `BENCH_LARGE` (10)
//! set how many requests each case makes.
//!
//! `BENCH_BASELINE=DIR` runs the proxied cases a second time with the `brain` and `worker`
//! in DIR (another commit's `target/release`), in the same run against the same upstream,
//! and prints this build's figures as ratios of that one's:
//!
//!     git worktree add /tmp/base OLD && (cd /tmp/base && cargo build --release -p brain -p worker)
//!     BENCH_BASELINE=/tmp/base/target/release cargo bench -p brain --bench egress

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use testkit::https::{Received, TestCa, Upstream};
use testkit::tasks::set_secret;
use testkit::{BrainOptions, Cluster, text};

const SECRET: &str = "sk-bench-0c5e7a91d2f34b68";
const API: &str = "api.upstream.test";
const DIRECT: &str = "direct.upstream.test";
const SMALL: usize = 1024;
/// Debian's bundle of the system's roots (what curl reads by default there).
const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";
const LARGE: usize = 10 << 20;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One case's request times, in seconds.
struct Case {
    name: &'static str,
    small: Vec<f64>,
    large: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        f64::NAN
    } else {
        s[s.len() / 2]
    }
}

fn p90(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        f64::NAN
    } else {
        s[(s.len() * 9 / 10).min(s.len() - 1)]
    }
}

/// Times curl printed (`200 SECONDS`, one per request); panics if any request failed (a
/// figure of failed requests would be no figure at all).
fn times(out: &str, want: usize, what: &str) -> Vec<f64> {
    let t: Vec<f64> = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("200 ")?.parse().ok())
        .collect();
    assert_eq!(t.len(), want, "{what}: not every request succeeded:\n{out}");
    t
}

/// One curl making `n` requests to `url` with `curl_args` (a new connection each: the
/// upstream closes every one), printing each one's status and time.
fn loop_cmd(n: usize, curl_args: &str, url: &str) -> String {
    format!(
        "curl -sS --max-time 600 -w '%{{stderr}}%{{http_code}} %{{time_total}}\\n' {curl_args} '{url}?n=[1-{n}]' 2>&1 >/dev/null"
    )
}

fn root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The proxied cases as one task: its commands' stdout, in order.
fn run_task(c: &Cluster, worker: &str, args: &[&str], commands: &[String]) -> Vec<String> {
    let out = testkit::tasks::try_start_commands(c, worker, args, commands, Some(1800));
    assert!(out.status.success(), "brain run: {}", text(&out));
    let task = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let end = c.wait_status(
        &task,
        &["finished", "failed", "stuck", "cancelled"],
        Duration::from_secs(3600),
    );
    assert_eq!(end, "finished", "{}", c.brain_log());
    let log = c.task_log_json(&task);
    let mut outs = Vec::new();
    for e in &log {
        if e["kind"] == "tool_output" {
            outs.push(format!(
                "{}\n{}",
                e["stdout"].as_str().unwrap_or_default(),
                e["stderr"].as_str().unwrap_or_default()
            ));
        }
    }
    assert_eq!(outs.len(), commands.len(), "{log:#?}");
    outs
}

fn main() {
    if !root() {
        eprintln!(
            "egress bench: needs root (the worker gives each command its own network namespace); skipped"
        );
        return;
    }
    let (n_small, n_large) = (env_usize("BENCH_SMALL", 200), env_usize("BENCH_LARGE", 10));
    let ca = TestCa::new().unwrap();
    let small = Arc::new(vec![b'a'; SMALL]);
    let large = Arc::new(vec![b'b'; LARGE]);
    let up = Upstream::start(
        &ca,
        &[API, DIRECT, "127.0.0.1"],
        Arc::new(move |r: &Received| match r.path.split('?').next() {
            Some("/1k") => (200, small.to_vec()),
            Some("/10m") => (200, large.to_vec()),
            _ => (404, b"no".to_vec()),
        }),
    )
    .unwrap();
    let port = up.port;
    let tmp = tempfile::tempdir().unwrap();
    let ca_file = tmp.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    // The host's curl trusts the system's roots and the upstream's CA.
    let system = std::fs::read_to_string(SYSTEM_ROOTS).unwrap_or_default();
    let host_bundle = tmp.path().join("all-ca.pem");
    std::fs::write(&host_bundle, format!("{system}\n{}", ca.pem())).unwrap();

    println!(
        "egress bench: {n_small} × 1 KiB and {n_large} × 10 MiB HTTPS requests per case, each a new connection and TLS handshake"
    );
    let runs = Runs {
        up: &up,
        ca: &ca,
        ca_file: &ca_file,
        n_small,
        n_large,
    };
    let (injected, allowed) = runs.proxied(None, DIRECT);
    // The same cases with the brain and worker of another build, side by side.
    let baseline = std::env::var_os("BENCH_BASELINE").map(|dir| {
        let dir = std::path::PathBuf::from(dir);
        println!("baseline: the brain and worker in {}", dir.display());
        // Direct egress never dials a loopback address unless `[egress.resolve]` pins the
        // name: the baseline, as this build, is told the pinned name.
        let (mut i, mut a) = runs.proxied(Some(dir), DIRECT);
        i.name = "injected (baseline)";
        a.name = "direct (baseline)";
        (i, a)
    });

    // No proxy: the same curl from the host, straight to the upstream.
    let host = |path: &str, n: usize, cacert: &std::path::Path| {
        let out = Command::new("sh")
            .arg("-c")
            .arg(loop_cmd(
                n,
                &format!("--cacert {}", cacert.display()),
                &format!("https://127.0.0.1:{port}{path}"),
            ))
            .output()
            .unwrap();
        assert!(out.status.success(), "host curl: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    host("/1k", 1, &ca_file);
    let none = Case {
        name: "no proxy (host)",
        small: times(&host("/1k", n_small, &ca_file), n_small, "host 1 KiB"),
        large: times(&host("/10m", n_large, &ca_file), n_large, "host 10 MiB"),
    };
    // What every case would add with a whole bundle of roots to load per request.
    let bundled = times(
        &host("/1k", n_small, &host_bundle),
        n_small,
        "host 1 KiB, system roots",
    );

    let base_small = median(&none.small);
    let base_mbs = LARGE as f64 / median(&none.large) / 1e6;
    println!(
        "{:<22} {:>11} {:>11} {:>9} {:>11} {:>9}",
        "case", "1K p50 ms", "1K p90 ms", "× none", "10M MB/s", "× none"
    );
    let mut rows = vec![&none, &allowed, &injected];
    if let Some((i, a)) = &baseline {
        rows.extend([a, i]);
    }
    for case in rows {
        let p50 = median(&case.small);
        let mbs = LARGE as f64 / median(&case.large) / 1e6;
        println!(
            "{:<22} {:>11.2} {:>11.2} {:>9.2} {:>11.1} {:>9.2}",
            case.name,
            p50 * 1e3,
            p90(&case.small) * 1e3,
            p50 / base_small,
            mbs,
            mbs / base_mbs
        );
    }
    println!(
        "{:<22} {:>11.2} {:>11.2} {:>9.2}   (curl loading the system's roots and the CA each request)",
        "no proxy, all roots",
        median(&bundled) * 1e3,
        p90(&bundled) * 1e3,
        median(&bundled) / base_small
    );
    let hop = median(&injected.small) - median(&allowed.small);
    println!(
        "brain hop: +{:.2} ms per 1 KiB request over the direct tunnel; 10 MiB at {:.2}× the direct tunnel's throughput",
        hop * 1e3,
        median(&allowed.large) / median(&injected.large)
    );
    if let Some((i, a)) = &baseline {
        let base_hop = median(&i.small) - median(&a.small);
        println!(
            "baseline brain hop: +{:.2} ms, 10 MiB at {:.2}× its direct tunnel; this build's hop is {:.2}× the baseline's, its injected 1 KiB p50 {:.2}× and 10 MiB throughput {:.2}×",
            base_hop * 1e3,
            median(&a.large) / median(&i.large),
            hop / base_hop,
            median(&injected.small) / median(&i.small),
            median(&i.large) / median(&injected.large)
        );
    }
}

/// What the proxied cases share.
struct Runs<'a> {
    up: &'a Upstream,
    ca: &'a TestCa,
    ca_file: &'a std::path::Path,
    n_small: usize,
    n_large: usize,
}

impl Runs<'_> {
    /// The injected and the direct cases on a brain and worker of their own (from `bin_dir`,
    /// or this build's), the direct one to `direct_host`.
    fn proxied(&self, bin_dir: Option<std::path::PathBuf>, direct_host: &str) -> (Case, Case) {
        let (port, n_small, n_large) = (self.up.port, self.n_small, self.n_large);
        let c = Cluster::start_with(BrainOptions {
            config: Some(format!(
                "[egress]\nupstream_ca = [{:?}]\n[egress.resolve]\n\"{API}\" = \"127.0.0.1\"\n\"{DIRECT}\" = \"127.0.0.1\"\n",
                self.ca_file.display().to_string()
            )),
            bin_dir,
            ..Default::default()
        });
        let w = c.join_worker("bench");
        let egress_ca = std::fs::read_to_string(c.data.join("egress-ca.pem")).unwrap();
        set_secret(
            &c,
            "api",
            SECRET,
            &["--host", API, "--port", &port.to_string()],
        );
        // The brain's own TLS to the upstream verifies it against the bench CA; the
        // commands' curl verifies the brain's certificate against the egress CA.
        let inject = |path: &str, n: usize| {
            loop_cmd(
                n,
                "--cacert egress-ca.pem",
                &format!("https://{API}:{port}{path}"),
            )
        };
        // The allow-listed host is tunnelled untouched: curl sees the upstream's own
        // certificate. The worker dials the address `[egress.resolve]` pins the name to
        // (direct egress never goes to a loopback address otherwise).
        let direct = |path: &str, n: usize| {
            loop_cmd(
                n,
                // `--noproxy ''`: even an address (the baseline's) goes through the proxy.
                "--noproxy '' --cacert upstream-ca.pem",
                &format!("https://{direct_host}:{port}{path}"),
            )
        };
        let commands = vec![
            // Each case's curl trusts only the CA it needs: the upstream's, or for the
            // injected case the egress CA (the last certificate of the commands' bundle).
            // How long loading the whole bundle takes is measured apart.
            format!(
                "printf '%s' '{}' > upstream-ca.pem && printf '%s' '{}' > egress-ca.pem",
                self.ca.pem(),
                egress_ca.trim()
            ),
            // One warm-up request each, not counted.
            inject("/1k", 1),
            direct("/1k", 1),
            inject("/1k", n_small),
            direct("/1k", n_small),
            inject("/10m", n_large),
            direct("/10m", n_large),
        ];
        let before = self.granted();
        let allow = format!("{direct_host}:{port}");
        let outs = run_task(
            &c,
            &w.id,
            &["--secret", "api", "--allow", &allow],
            &commands,
        );
        assert_eq!(
            self.granted() - before,
            1 + n_small + n_large,
            "every injected request carries the credential"
        );
        (
            Case {
                name: "injected via brain",
                small: times(&outs[3], n_small, "injected 1 KiB"),
                large: times(&outs[5], n_large, "injected 10 MiB"),
            },
            Case {
                name: "direct allow-listed",
                small: times(&outs[4], n_small, "direct 1 KiB"),
                large: times(&outs[6], n_large, "direct 10 MiB"),
            },
        )
    }

    /// Requests the upstream received with the credential put in.
    fn granted(&self) -> usize {
        self.up
            .seen()
            .iter()
            .filter(|r| r.header("authorization") == Some(&format!("Bearer {SECRET}")))
            .count()
    }
}
