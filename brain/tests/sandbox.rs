//! Confinement of what the agent's commands can read, write and consume, checked with the
//! real worker binary. Each test first asks `worker doctor` whether its mechanism works on
//! this host; where it does not, the test says why it is skipped and checks that doctor says
//! the same.

use std::io::Read;
use std::time::Duration;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use serde_json::json;
use testkit::fake_llm::{FakeLlm, FakeReply};
use testkit::{
    BrainOptions, Cluster, Worker, assert_said, assert_stderr_says, process_gone, text, wait_until,
};

/// The cluster, if the mechanism works here; otherwise None, saying why the test is skipped.
fn having(c: Cluster, mechanism: &str) -> Option<Cluster> {
    let (active, line) = c.doctor(mechanism);
    if !active {
        assert!(line.contains("MISSING"), "{line}");
        testkit::skip(
            mechanism,
            &format!("the test needs it, and worker doctor says: {line}"),
        );
    }
    active.then_some(c)
}

/// Makes a test dir world-writable and traversable, so file permissions stop nothing.
fn open_up(dir: &std::path::Path) {
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
}

/// A cluster whose temp dir is outside /tmp: with mount namespaces, commands see a private
/// /tmp, so files a test puts for them to find must live elsewhere.
fn outside_tmp() -> Cluster {
    Cluster::start_with(BrainOptions {
        parent: Some(PathBuf::from("/var/tmp")),
        ..Default::default()
    })
}

/// The uid a root worker gives the first task (workspace) it sees: the first of its default
/// `--task-uids`.
const FIRST_TASK_UID: &str = "1800000";

fn root() -> bool {
    rustix::process::geteuid().is_root()
}

use testkit::stdout;

fn exec(c: &Cluster, w: &Worker, extra: &[&str], script: &str) -> std::process::Output {
    let mut args = vec!["exec", w.id.as_str()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    c.brain_cli(&args)
}

#[test]
fn writes_outside_the_workspace_fail_and_change_nothing() {
    let Some(c) = having(outside_tmp(), "landlock") else {
        return;
    };
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
    let Some(c) = having(outside_tmp(), "landlock") else {
        return;
    };
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
    let Some(c) = having(Cluster::start(), "cgroup") else {
        return;
    };
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
    // The next command under the same limits (the same spawner and cgroup leaves) runs,
    // and the bomb's refused forks are not counted against it.
    let out = exec(&c, &w, &["--pids", "64"], "echo alive");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "alive\n",
        "{}",
        text(&out)
    );
    assert!(!text(&out).contains("limit"), "{}", text(&out));
    // Nothing of the bomb is left.
    assert!(
        wait_until(Duration::from_secs(5), || {
            let o = std::process::Command::new("pgrep")
                .args(["-u", FIRST_TASK_UID, "-c", "sh"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&o.stdout).trim() == "0"
        }),
        "processes of the fork bomb survived"
    );
}

#[test]
fn a_memory_hog_is_killed_with_a_clear_memory_limit_result() {
    let Some(c) = having(Cluster::start(), "cgroup") else {
        return;
    };
    let w = c.join_worker("hog");
    let out = exec(
        &c,
        &w,
        &["--memory", "64MiB", "--timeout", "60s"],
        "awk 'BEGIN { s = \"xxxxxxxx\"; while (1) s = s s }'",
    );
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert_stderr_says(&out, "memory limit of 64 MiB exceeded");
    // The next command under the same limit is not said to have hit it.
    let out = exec(&c, &w, &["--memory", "64MiB"], "echo fine");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!text(&out).contains("limit"), "{}", text(&out));
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
    let Some(c) = having(Cluster::start(), "netns") else {
        return;
    };
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
    let (user_active, line) = c.doctor("user");
    assert!(user_active, "{line}");
    if rustix::process::geteuid().is_root() {
        assert_eq!(shown.lines().next(), Some(FIRST_TASK_UID), "{shown}");
    }
}

#[test]
fn policy_refuses_a_worker_without_the_required_confinement() {
    let c = Cluster::start_with(BrainOptions {
        extra_args: vec!["--require-sandbox".into(), "landlock,selinux".into()],
        ..Default::default()
    });
    let w = c.join_worker("weak");
    let plan = c.dir.join("p.json");
    std::fs::write(&plan, r#"{"steps":[{"run":["true"]}]}"#).unwrap();
    let out = c.brain_cli(&["run", "--plan", plan.to_str().unwrap(), "--worker", &w.id]);
    assert!(!out.status.success(), "{}", text(&out));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("lacks") && e.contains("selinux") && e.contains("worker doctor"),
        "{e}"
    );
}

/// What the issue's new user ran: a shell `cd`, git, a virtualenv, `realpath`, all of which
/// resolve the workspace's absolute path.
const TOOLS: &str = "set -e
mkdir -p a && cd a && pwd
git init -q . && echo hi > f && git add f
git -c user.name=t -c user.email=t@example.com commit -q -m first
git status --short && git log --oneline | wc -l
cd ..
python3 -m venv venv --without-pip
venv/bin/python -c 'import os, pathlib, sys; os.stat(os.getcwd()); print(sys.prefix); print(pathlib.Path.cwd().resolve())'
realpath .
touch \"$TMPDIR/scratch\" && echo tmp-ok";

#[test]
fn real_tools_work_at_a_fixed_workspace_path_under_a_private_state_dir() {
    let Some(c) = having(Cluster::start(), "mountns") else {
        return;
    };
    // The state dir is under the test dir, which only its owner (root) may traverse: the
    // case of the default state dir in /root (mode 0700).
    std::fs::set_permissions(&c.dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let w = c.join_worker("tools");
    let script = format!("{TOOLS}\ntouch \"$HOME/.dotfile\" && echo \"$HOME $TMPDIR\"");
    let out = exec(&c, &w, &[], &script);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        stdout(&out),
        "/workspace/a\n1\n/workspace/venv\n/workspace\n/workspace\ntmp-ok\n/tmp /tmp\n",
        "{}",
        text(&out)
    );
    // The worker sees the same files at its own path; the mount point on the host stays
    // empty (nothing leaked out of the command's namespace).
    assert!(w.workspace().join("a/.git/HEAD").is_file());
    assert!(w.workspace().join("venv/pyvenv.cfg").is_file());
    assert_eq!(std::fs::read_dir("/workspace").unwrap().count(), 0);
    // The worker's identity, its other workspaces and their contents stay out of reach,
    // for reading and for writing.
    std::fs::create_dir_all(w.state.join("workspaces/other")).unwrap();
    std::fs::write(w.state.join("workspaces/other/secret.txt"), "OTHER-SECRET").unwrap();
    let state = w.state.display();
    for probe in [
        format!("cat {state}/identity/key.pem"),
        format!("cat {state}/workspaces/other/secret.txt"),
        format!("ls {state}/workspaces"),
        format!("echo pwned > {state}/workspaces/other/pwned"),
        "ls /workspace/../tether-nothing-here".to_string(),
    ] {
        let out = exec(&c, &w, &[], &probe);
        assert_ne!(out.status.code(), Some(0), "{probe}: {}", text(&out));
        assert!(!stdout(&out).contains("PRIVATE KEY") && !stdout(&out).contains("OTHER-SECRET"));
    }
    assert!(!w.state.join("workspaces/other/pwned").exists());
    // The host's /tmp is not the commands' /tmp.
    let marker = std::env::temp_dir().join(format!("tether-host-{}", std::process::id()));
    std::fs::write(&marker, "host").unwrap();
    let out = exec(&c, &w, &[], &format!("cat {}", marker.display()));
    let _ = std::fs::remove_file(&marker);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
}

/// Commands see only the command user's processes in /proc: the worker's and the brain's
/// command lines (and every other user's) are not there to read, while their own processes
/// and /proc/cpuinfo still are. The worker's /proc lives in its own mount namespace: the
/// host's mounts do not change.
#[test]
fn a_command_cannot_read_other_processes_in_proc() {
    let proc_mounts = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.split(' ').nth(4) == Some("/proc"))
            .map(|l| l.split(" - ").nth(1).unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    let before = proc_mounts();
    let Some(c) = having(Cluster::start(), "proc") else {
        return;
    };
    let w = c.join_worker("proc");
    let brain = c.brain.as_ref().unwrap().pid();
    let worker = w.proc.as_ref().unwrap().pid();
    // The host's /proc has them, to show what is being hidden.
    assert!(std::fs::read(format!("/proc/{worker}/cmdline")).is_ok_and(|b| !b.is_empty()));
    for pid in [worker, brain, 1] {
        let out = exec(&c, &w, &[], &format!("cat /proc/{pid}/cmdline"));
        assert_ne!(out.status.code(), Some(0), "pid {pid}: {}", text(&out));
        assert!(stdout(&out).is_empty(), "pid {pid}: {}", text(&out));
    }
    // Every process the command can see is the command user's.
    let out = exec(
        &c,
        &w,
        &[],
        "for p in /proc/[0-9]*; do stat -c %u \"$p\" 2>/dev/null; done | sort -u; \
         tr '\\0' ' ' < /proc/self/cmdline; echo; grep -c ^processor /proc/cpuinfo",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = stdout(&out);
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 3, "{}", text(&out));
    assert_eq!(
        lines[0],
        FIRST_TASK_UID,
        "other users' processes are visible: {}",
        text(&out)
    );
    // Its own processes are there (the redirect opens /proc/self before `tr` runs: the
    // shell's command line).
    assert!(
        lines[1].starts_with("tr ") || lines[1].starts_with("sh -c "),
        "{}",
        text(&out)
    );
    assert!(
        lines[2].parse::<u32>().is_ok_and(|n| n > 0),
        "{}",
        text(&out)
    );
    assert_eq!(proc_mounts(), before, "the worker's /proc reached the host");
}

#[test]
fn a_worker_run_by_a_normal_user_gives_commands_a_workspace_they_can_use() {
    let c = Cluster::start();
    if !root() {
        eprintln!(
            "skipped a_worker_run_by_a_normal_user_gives_commands_a_workspace_they_can_use: it starts the worker as uid 1000 with setpriv, which needs root"
        );
        return;
    }
    // uid 1000 may traverse the test dir and owns its state dir.
    std::fs::set_permissions(&c.dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    let state = c.dir.join("plain");
    std::fs::create_dir(&state).unwrap();
    std::os::unix::fs::chown(&state, Some(1000), Some(1000)).unwrap();
    let (token, ca) = c.token(&[]);
    let join = c.join_cmd("plain", &token, &ca);
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args(["--reuid=1000", "--regid=1000", "--clear-groups"])
        .arg(join.get_program())
        .args(join.get_args())
        .env("HOME", &state)
        .env("RUST_LOG", "info");
    let w = c.spawn_worker("plain", cmd);
    let out = exec(&c, &w, &[], "id -u");
    assert_eq!(stdout(&out), "1000\n", "{}", text(&out));
    let out = exec(&c, &w, &[], TOOLS);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let ws = w.workspace();
    let want = format!("{a}/a\n1\n{a}/venv\n{a}\n{a}\ntmp-ok\n", a = ws.display());
    assert_eq!(stdout(&out), want, "{}", text(&out));
    // Landlock still keeps its own key from it.
    if c.doctor("landlock").0 {
        let out = exec(
            &c,
            &w,
            &[],
            &format!("cat {}/identity/key.pem", state.display()),
        );
        assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    }
}

#[test]
fn without_a_mount_namespace_a_workspace_its_commands_cannot_reach_is_refused_at_start() {
    let c = Cluster::start();
    if !root() {
        eprintln!(
            "skipped without_a_mount_namespace_a_workspace_its_commands_cannot_reach_is_refused_at_start: only a root worker runs commands as another user"
        );
        return;
    }
    // The state dir under a private parent, and no mount namespace to show it elsewhere.
    std::fs::set_permissions(&c.dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (token, ca) = c.token(&[]);
    let out = c
        .join_cmd("stuck", &token, &ca)
        .env("TETHER_WORKER_MOUNTNS", "off")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains(&format!(
            "{} (mode 0700) is not traversable",
            c.dir.display()
        )) && e.contains("--state /var/lib/tether-worker"),
        "{e}"
    );
    // The token was not spent: a worker with a usable state dir joins with it.
    let doctor = std::process::Command::new(&c.bins.worker)
        .args(["doctor", "--state"])
        .arg(c.dir.join("stuck"))
        .env("TETHER_WORKER_MOUNTNS", "off")
        .output()
        .unwrap();
    assert_eq!(doctor.status.code(), Some(78), "{}", text(&doctor));
    assert!(
        stdout(&doctor).contains("workspace BROKEN"),
        "{}",
        text(&doctor)
    );
    std::fs::set_permissions(&c.dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    let mut cmd = c.join_cmd("stuck", &token, &ca);
    cmd.env("TETHER_WORKER_MOUNTNS", "off");
    let w = c.spawn_worker("stuck", cmd);
    // There, commands see the workspace at its real path, and can resolve it.
    let out = exec(&c, &w, &[], "realpath . && id -u");
    assert_eq!(
        stdout(&out),
        format!(
            "{}\n{FIRST_TASK_UID}\n",
            w.workspace().canonicalize().unwrap().display()
        ),
        "{}",
        text(&out)
    );
}

#[test]
fn commands_ended_by_a_limit_say_which_limit() {
    let llm = FakeLlm::script(vec![
        FakeReply::run("truncate -s 10G big.bin"),
        FakeReply::finish("tried"),
    ]);
    let c = Cluster::start_with(BrainOptions {
        extra_args: vec!["--file-size".into(), "1GiB".into()],
        ..BrainOptions::with_llm(&llm, "sk-test-key-123456", "")
    });
    let w = c.join_worker("limited");
    // The file size limit, told to the model and kept in the log.
    let id = c.agent().worker("limited").start("make a big file");
    c.wait_status(&id, &["finished", "failed"], Duration::from_secs(30));
    let told = llm.requests()[1].body["messages"].to_string();
    assert!(told.contains("file size limit of 1 GiB exceeded"), "{told}");
    let log = c.task_log_json(&id);
    assert!(
        log.iter().any(|r| r["kind"] == "tool_call_completed"
            && r["result"]["limit"]
                .as_str()
                .is_some_and(|l| l.contains("file size limit of 1 GiB"))),
        "{log:?}"
    );
    // The same through `brain exec`: a write that stops at the limit, and a shell whose
    // child died of SIGXFSZ because it asked for the signal back.
    let out = exec(
        &c,
        &w,
        &["--file-size", "1MiB"],
        "head -c 2000000 /dev/zero > big.bin; echo wrote",
    );
    assert_stderr_says(&out, "file size limit of 1 MiB exceeded");
    assert_eq!(
        std::fs::metadata(w.workspace().join("big.bin"))
            .unwrap()
            .len(),
        1 << 20
    );
    let out = exec(
        &c,
        &w,
        &["--file-size", "1MiB"],
        "python3 -c 'import signal; signal.signal(signal.SIGXFSZ, signal.SIG_DFL); open(\"b2\", \"wb\").write(bytes(2000000))'",
    );
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGXFSZ),
        "{}",
        text(&out)
    );
    assert_stderr_says(&out, "killed: file size limit of 1 MiB exceeded");
    // CPU time: the shell itself spins and is ended by SIGXCPU.
    let out = exec(&c, &w, &["--cpu-time", "1s"], "while :; do :; done");
    assert_stderr_says(&out, "killed: CPU time limit of 1s exceeded");
}

/// A task that keeps more on its worker's disk than `--disk-quota` / `--disk-files` allow —
/// in its workspace or in its temp dir — is stopped at the barrier after the call that went
/// over, with the reason, before its next call runs; what is outside its workspace and temp
/// dir is not touched.
#[test]
fn a_task_over_its_disk_quota_is_stopped_with_the_reason() {
    let c = Cluster::start_with(BrainOptions {
        extra_args: vec![
            "--disk-quota".into(),
            "1MiB".into(),
            "--disk-files".into(),
            "50".into(),
        ],
        ..Default::default()
    });
    let _w = c.join_worker("q");
    let outside = c.dir.join("outside.txt");
    std::fs::write(&outside, "untouched").unwrap();
    let cases = [
        ("head -c 2000000 /dev/zero > big.bin", "the quota is 1 MiB"),
        (
            "head -c 2000000 /dev/zero > \"$TMPDIR/big.bin\"",
            "the quota is 1 MiB",
        ),
        (
            "mkdir d && for i in $(seq 1 80); do : > d/f$i; done",
            "the quota is 50",
        ),
    ];
    for (i, (fill, says)) in cases.iter().enumerate() {
        let steps = json!({"steps": [
            {"run": ["sh", "-c", "head -c 1000 /dev/zero > small.bin"]},
            {"run": ["sh", "-c", fill]},
            {"run": ["sh", "-c", "echo ran > after.txt"]},
        ]});
        let plan = c.dir.join(format!("quota-{i}.json"));
        std::fs::write(&plan, steps.to_string()).unwrap();
        let id = c.run_plan(&plan, "q");
        assert_eq!(
            c.wait_status(&id, &["finished", "failed"], Duration::from_secs(60)),
            "failed",
            "{fill}"
        );
        let log = c.task_log_json(&id);
        let end = log.last().unwrap();
        let reason = end["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("over its disk quota") && reason.contains(says),
            "{fill}: {reason}"
        );
        // The third step never ran.
        let issued = log
            .iter()
            .filter(|r| r["kind"] == "tool_call_issued")
            .count();
        assert_eq!(issued, 2, "{fill}: {log:?}");
        let out = c.brain_cli(&["task", "show", &id]);
        assert_said(&out, "over its disk quota");
    }
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "untouched");
}
