//! Confinement of what the agent's commands can read, write and consume, checked with the
//! real worker binary. Each test first asks `worker doctor` whether its mechanism works on
//! this host; where it does not, the test says why it is skipped and checks that doctor says
//! the same.

use std::io::Read;
use std::time::Duration;

use testkit::{BrainOptions, Cluster, Worker, process_gone, text, wait_until};

/// `worker doctor`'s line for a mechanism, and whether it is active.
fn doctor(c: &Cluster, mechanism: &str) -> (bool, String) {
    let out = std::process::Command::new(&c.bins.worker)
        .args(["doctor", "--state"])
        .arg(c.dir.join("doctor"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.split_whitespace().next() == Some(mechanism))
        .unwrap_or_else(|| panic!("doctor says nothing of {mechanism}: {}", text(&out)))
        .to_string();
    (line.contains(" active "), line)
}

/// True if the mechanism works here; otherwise prints why the test is skipped.
fn have(c: &Cluster, mechanism: &str, test: &str) -> bool {
    let (active, line) = doctor(c, mechanism);
    if !active {
        assert!(line.contains("MISSING"), "{line}");
        testkit::skip(
            mechanism,
            &format!("{test} needs it, and worker doctor says: {line}"),
        );
    }
    active
}

/// Makes a test dir world-writable and traversable, so file permissions stop nothing.
fn open_up(dir: &std::path::Path) {
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
}

fn exec(c: &Cluster, w: &Worker, extra: &[&str], script: &str) -> std::process::Output {
    let mut args = vec!["exec", w.id.as_str()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    c.brain_cli(&args)
}

#[test]
fn writes_outside_the_workspace_fail_and_change_nothing() {
    let c = Cluster::start();
    if !have(
        &c,
        "landlock",
        "writes_outside_the_workspace_fail_and_change_nothing",
    ) {
        return;
    }
    let w = c.join_worker("jailed");
    // Open the file permissions wide, so only Landlock stands in the way.
    open_up(&c.dir);
    let victim = c.dir.join("victim.txt");
    std::fs::write(&victim, "original").unwrap();
    std::fs::set_permissions(&victim, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let fresh = c.dir.join("fresh.txt");
    let out = exec(
        &c,
        &w,
        &[],
        &format!(
            "echo pwned > {}; echo pwned > {}; rm -f {}",
            victim.display(),
            fresh.display(),
            victim.display()
        ),
    );
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "original");
    assert!(!fresh.exists());
    // Inside the workspace and the call's temp dir, writing works.
    let out = exec(
        &c,
        &w,
        &[],
        "echo ok > inside.txt && echo ok > \"$TMPDIR/t\" && cat inside.txt",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ok\n",
        "{}",
        text(&out)
    );
}

#[test]
fn home_secrets_and_the_worker_key_are_unreadable() {
    let c = Cluster::start();
    if !have(
        &c,
        "landlock",
        "home_secrets_and_the_worker_key_are_unreadable",
    ) {
        return;
    }
    open_up(&c.dir);
    let home = c.dir.join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh/id_ed25519"), "FAKE-PRIVATE-KEY").unwrap();
    std::fs::write(home.join("notes.txt"), "public notes").unwrap();
    for p in [&home, &home.join(".ssh")] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(
        home.join(".ssh/id_ed25519"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let w = c.join_worker_with("keyholder", &[("HOME", home.to_str().unwrap())]);
    let out = exec(
        &c,
        &w,
        &[],
        &format!("cat {}/.ssh/id_ed25519", home.display()),
    );
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("FAKE-PRIVATE-KEY"));
    // The rest of the home directory stays readable.
    let out = exec(&c, &w, &[], &format!("cat {}/notes.txt", home.display()));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "public notes",
        "{}",
        text(&out)
    );
    // The worker's own private key.
    let key = w.state.join("identity/key.pem");
    // Even readable by everyone, the key stays out of reach.
    std::fs::set_permissions(
        w.state.join("identity"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let out = exec(&c, &w, &[], &format!("cat {}", key.display()));
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("PRIVATE KEY"));
}

#[test]
fn a_fork_bomb_is_contained_and_the_worker_keeps_answering() {
    let c = Cluster::start();
    if !have(
        &c,
        "cgroup",
        "a_fork_bomb_is_contained_and_the_worker_keeps_answering",
    ) {
        return;
    }
    let w = c.join_worker("bombed");
    let out = exec(
        &c,
        &w,
        &["--pids", "64", "--timeout", "3s"],
        "b() { b | b & }; b; sleep 10",
    );
    assert!(
        matches!(out.status.code(), Some(124) | Some(0) | Some(2)),
        "{}",
        text(&out)
    );
    let out = exec(&c, &w, &[], "echo alive");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "alive\n",
        "{}",
        text(&out)
    );
    // Nothing of the bomb is left.
    assert!(
        wait_until(Duration::from_secs(5), || {
            let o = std::process::Command::new("pgrep")
                .args(["-u", "65534", "-c", "sh"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&o.stdout).trim() == "0"
        }),
        "processes of the fork bomb survived"
    );
}

#[test]
fn a_memory_hog_is_killed_with_a_clear_memory_limit_result() {
    let c = Cluster::start();
    if !have(
        &c,
        "cgroup",
        "a_memory_hog_is_killed_with_a_clear_memory_limit_result",
    ) {
        return;
    }
    let w = c.join_worker("hog");
    let out = exec(
        &c,
        &w,
        &["--memory", "64MiB", "--timeout", "60s"],
        "awk 'BEGIN { s = \"xxxxxxxx\"; while (1) s = s s }'",
    );
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("memory limit of 64 MiB exceeded"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_setsid_child_that_ignores_sigterm_is_killed_at_the_timeout() {
    let c = Cluster::start();
    let w = c.join_worker("escapee");
    let out = exec(
        &c,
        &w,
        &["--timeout", "1s"],
        "setsid sh -c 'trap \"\" TERM; echo $$ > inner.pid; while :; do sleep 1; done' & echo $! > outer.pid; sleep 300",
    );
    assert_eq!(out.status.code(), Some(124), "{}", text(&out));
    for f in ["inner.pid", "outer.pid"] {
        let mut s = String::new();
        std::fs::File::open(w.workspace().join(f))
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        let pid: u32 = s.trim().parse().unwrap();
        assert!(
            wait_until(Duration::from_secs(5), || process_gone(pid)),
            "{f} {pid} survived the timeout"
        );
    }
}

#[test]
fn with_the_network_off_a_loopback_listener_is_unreachable() {
    let c = Cluster::start();
    if !have(
        &c,
        "netns",
        "with_the_network_off_a_loopback_listener_is_unreachable",
    ) {
        return;
    }
    let w = c.join_worker("offline");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = format!("bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' && echo connected");
    let out = exec(&c, &w, &[], &probe);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "connected\n",
        "network on by default: {}",
        text(&out)
    );
    let out = exec(&c, &w, &["--network-off"], &probe);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("connected"));
}

#[test]
fn commands_run_unprivileged_with_a_scrubbed_environment() {
    let c = Cluster::start();
    let w = c.join_worker_with("plain", &[("AWS_SECRET_ACCESS_KEY", "hunter2")]);
    let out = exec(&c, &w, &[], "id -u; env");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(!shown.contains("hunter2"), "{shown}");
    let (user_active, line) = doctor(&c, "user");
    assert!(user_active, "{line}");
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(shown.lines().next(), Some("65534"), "{shown}");
    }
}

#[test]
fn policy_refuses_a_worker_without_the_required_confinement() {
    let c = Cluster::start_with(BrainOptions {
        extra_args: vec!["--require-sandbox".into(), "landlock,seccomp".into()],
        ..Default::default()
    });
    let w = c.join_worker("weak");
    let plan = c.dir.join("p.json");
    std::fs::write(&plan, r#"{"steps":[{"run":["true"]}]}"#).unwrap();
    let out = c.brain_cli(&["run", "--plan", plan.to_str().unwrap(), "--worker", &w.id]);
    assert!(!out.status.success(), "{}", text(&out));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("lacks") && e.contains("seccomp") && e.contains("worker doctor"),
        "{e}"
    );
}
