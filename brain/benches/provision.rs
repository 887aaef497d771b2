//! Provisioning benchmark: how long the brain takes to bring up a worker and to release it,
//! beside what the same work costs by hand, in one run. Prints figures; never fails on a
//! timing.
//!
//!     cargo build --release --workspace && cargo bench -p brain --bench provision
//!
//! Rows: `brain provision local` until the worker is connected, beside a local spawn of the
//! worker binary (`worker --version`); `brain provision ssh` until connected, beside `ssh
//! HOST true` and copying the worker binary over ssh (`cat > file`), against a throw-away
//! sshd in a network namespace (skipped, with the reason, when sshd or root is missing);
//! `brain provision docker` until connected, beside `docker run --rm IMAGE true` with the same
//! image (built FROM scratch; skipped when there is no engine); `brain provision k8s` against
//! the fake kube-apiserver (`testkit::fake_kube`) beside `provision local`; `brain provision
//! ec2` against moto until the launch is accepted, beside boto3's own `run_instances`; and
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
    cycle_until(c, args, n, "is ready")
}

/// [`cycle`], where provisioning prints `want` when it is done.
fn cycle_until(c: &Cluster, args: &[&str], n: usize, want: &str) -> (Duration, Duration) {
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
        assert!(stdout.contains(want), "{stdout}");
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

    docker_rows(n);
    k8s_rows(n, local_up);
    ec2_rows(n);
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

/// Runs a command; its stdout, trimmed.
fn sh(cmd: &mut Command) -> Result<String, String> {
    let o = cmd.output().map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(testkit::text(&o));
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The docker provider beside a plain `docker run` of the same image.
fn docker_rows(n: usize) {
    let bins = testkit::Bins::locate();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tag = format!("tether-bench-{}", std::process::id());
    let (base, image, net) = (
        format!("{tag}-base"),
        format!("{tag}-worker"),
        format!("{tag}-net"),
    );
    let ctx = std::env::temp_dir().join(&tag);
    let setup = || -> Result<String, String> {
        sh(Command::new("docker").args(["info", "--format", "{{.ServerVersion}}"]))?;
        sh(Command::new("sh")
            .arg(repo.join("deploy/docker/scratch-base.sh"))
            .arg(&base)
            .arg(&bins.worker))?;
        std::fs::create_dir_all(ctx.join("target/release")).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(ctx.join("deploy/docker")).map_err(|e| e.to_string())?;
        std::fs::copy(&bins.worker, ctx.join("target/release/worker"))
            .map_err(|e| e.to_string())?;
        for f in ["Dockerfile.worker", "docker/worker-entrypoint.sh"] {
            std::fs::copy(repo.join("deploy").join(f), ctx.join("deploy").join(f))
                .map_err(|e| e.to_string())?;
        }
        sh(Command::new("docker")
            .env("DOCKER_BUILDKIT", "0")
            .args(["build", "-q", "-f"])
            .arg(ctx.join("deploy/Dockerfile.worker"))
            .args(["--build-arg", &format!("BASE={base}"), "-t", &image])
            .arg(&ctx))?;
        sh(Command::new("docker").args(["network", "create", &net]))?;
        sh(Command::new("docker").args([
            "network",
            "inspect",
            "-f",
            "{{(index .IPAM.Config 0).Gateway}}",
            &net,
        ]))
    };
    let result = setup();
    let _ = std::fs::remove_dir_all(&ctx);
    match result {
        Err(why) => println!("\ndocker rows skipped: {why}"),
        Ok(gw) => {
            let c = Cluster::start_with(BrainOptions {
                listen_host: "0.0.0.0".into(),
                init_args: vec!["--host".into(), gw.clone()],
                config: Some(format!(
                    "[provision]\nreaper_every = \"200ms\"\n[provision.docker]\nimage = \"{image}\"\nnetwork = \"{net}\"\n"
                )),
                ..BrainOptions::default()
            });
            let run = median(
                (0..n)
                    .map(|_| {
                        let t = Instant::now();
                        let ok = Command::new("docker")
                            .args([
                                "run",
                                "--rm",
                                "--network",
                                &net,
                                "--entrypoint",
                                "/bin/true",
                                &image,
                            ])
                            .stdout(Stdio::null())
                            .status()
                            .is_ok_and(|s| s.success());
                        assert!(ok, "docker run failed");
                        t.elapsed()
                    })
                    .collect(),
            );
            let url = format!("https://{gw}:{}", c.port);
            let (up, down) = cycle(&c, &["provision", "docker", "--brain-url", &url], n);
            println!();
            row("docker: provision until the worker is connected", up);
            row("  baseline: docker run --rm IMAGE true", run);
            println!(
                "  ratio provision / docker run: {:.2}×",
                up.as_secs_f64() / run.as_secs_f64()
            );
            row(
                "docker: release (remove container and volume, revoke)",
                down,
            );
        }
    }
    let _ = Command::new("docker")
        .args(["network", "rm", &net])
        .output();
    let _ = Command::new("docker")
        .args(["rmi", "-f", &image, &base])
        .output();
}

/// The k8s provider against the fake kube-apiserver (its kubelet runs pods as local worker
/// processes), so the figure is Tether's own share plus a local spawn: shown beside
/// `provision local`, which is that spawn and join alone.
fn k8s_rows(n: usize, local_up: Duration) {
    const SERVICE: &str = "tether-brain.tether.svc";
    if !rustix::process::geteuid().is_root() {
        println!("\nk8s rows skipped: the fake kubelet needs root (a mount namespace per pod)");
        return;
    }
    let bins = testkit::Bins::locate();
    let fake = match testkit::fake_kube::FakeKube::start(&bins.worker) {
        Ok(f) => f,
        Err(e) => {
            println!("\nk8s rows skipped: {e}");
            return;
        }
    };
    fake.add_dns(SERVICE, "127.0.0.1");
    let c = Cluster::start_with(BrainOptions {
        init_args: vec!["--host".into(), SERVICE.into()],
        config: Some(format!(
            "[provision]\nreaper_every = \"200ms\"\n[provision.k8s]\nkubeconfig = \"{}\"\nimage = \"tether-worker:bench\"\n",
            fake.kubeconfig("tether").display()
        )),
        ..BrainOptions::default()
    });
    let url = format!("https://{SERVICE}:{}", c.port);
    let (up, down) = cycle(&c, &["provision", "k8s", "--brain-url", &url], n);
    println!();
    row("k8s (fake API server): provision until connected", up);
    row("  baseline: local: provision until connected", local_up);
    println!(
        "  ratio k8s / local: {:.2}× (the API calls, the secret and the kubelet's pass: {:.1} ms)",
        up.as_secs_f64() / local_up.as_secs_f64(),
        (up.as_secs_f64() - local_up.as_secs_f64()) * 1e3
    );
    row("k8s: release (delete the pod and its secret)", down);
}

/// The ec2 provider against moto with IAM enforced: launch accepted (`--wait 0s`: moto runs
/// no instance, so no worker joins) and terminate, beside the same RunInstances and
/// TerminateInstances made by boto3 in one Python process (its start-up not counted).
fn ec2_rows(n: usize) {
    use testkit::moto::{AMI, BRAIN_POLICY, Moto};
    let m = match Moto::start() {
        Ok(m) => m,
        Err(why) => {
            println!("\nec2 rows skipped: {why}");
            return;
        }
    };
    let key = m.user("tether-bench", BRAIN_POLICY);
    m.enforce();
    let home = tempfile::tempdir().unwrap();
    let mut opts = BrainOptions {
        config: Some(format!(
            "[provision]\nreaper_every = \"200ms\"\nbrain_url = \"https://brain.example:7443\"\n[provision.ec2]\nendpoint = \"{}\"\nregion = \"us-east-1\"\nami = \"{AMI}\"\ninstance_type = \"t3.micro\"\nworker_url = \"https://downloads.invalid/tether/worker\"\nworker_sha256 = \"{}\"\n",
            m.url,
            "ab".repeat(32)
        )),
        ..BrainOptions::default()
    };
    opts.env = [
        ("AWS_ACCESS_KEY_ID", key.id.as_str()),
        ("AWS_SECRET_ACCESS_KEY", key.secret.as_str()),
        ("AWS_SESSION_TOKEN", ""),
        ("AWS_PROFILE", ""),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("HOME", home.path().to_str().unwrap()),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let c = Cluster::start_with(opts);
    let (up, down) = cycle_until(
        &c,
        &["provision", "ec2", "--wait", "0s"],
        n,
        "its worker is joining",
    );
    let direct = m
        .python(
            &key,
            &format!(
                "import time\nec2 = session.client('ec2', endpoint_url=url)\nrun, term = [], []\nfor i in range({n}):\n    t = time.monotonic()\n    r = ec2.run_instances(ImageId='{AMI}', InstanceType='t3.micro', MinCount=1, MaxCount=1, UserData='x' * 7000)\n    run.append(time.monotonic() - t)\n    t = time.monotonic()\n    ec2.terminate_instances(InstanceIds=[r['Instances'][0]['InstanceId']])\n    term.append(time.monotonic() - t)\nrun.sort(); term.sort()\nprint(json.dumps([run[len(run) // 2], term[len(term) // 2]]))"
            ),
        )
        .unwrap_or_else(|e| panic!("boto3: {e}"));
    let secs = |i: usize| Duration::from_secs_f64(direct[i].as_f64().unwrap_or(0.0));
    println!();
    row("ec2 (moto, IAM enforced): provision until launched", up);
    row("  baseline: boto3 run_instances (7 KB user data)", secs(0));
    println!(
        "  ratio provision / run_instances: {:.2}× (the CLI, the record, the user data, the signing)",
        up.as_secs_f64() / secs(0).as_secs_f64()
    );
    row("ec2: release (terminate)", down);
    row("  baseline: boto3 terminate_instances", secs(1));
}
