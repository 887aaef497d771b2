//! The pre-confined spawner, checked with the real worker binary: a workspace's commands are
//! started by one process confined once, and each still gets its own process group, the
//! call's cgroup, the command user, its exact exit status and output, and is killed as a
//! whole at its end, its timeout, or when it kills the spawner itself.

use std::time::Duration;

use testkit::{Cluster, Worker, assert_stderr_says, process_gone, text, wait_until};

fn exec(c: &Cluster, w: &Worker, extra: &[&str], script: &str) -> std::process::Output {
    let mut args = vec!["exec", w.id.as_str()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    c.brain_cli(&args)
}

fn root() -> bool {
    rustix::process::geteuid().is_root()
}

/// `worker doctor`'s verdict on a mechanism.
fn active(c: &Cluster, mechanism: &str) -> bool {
    let out = std::process::Command::new(&c.bins.worker)
        .args(["doctor", "--state"])
        .arg(c.dir.join("doctor"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.split_whitespace().next() == Some(mechanism) && l.contains(" active "))
}

/// The command line of a process, as seen from outside every sandbox.
fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Fields a command reports about itself: its pid, its parent, its process group, its uid,
/// and its cgroups (one line).
const SELF_REPORT: &str =
    "echo $$; echo $PPID; cut -d' ' -f5 /proc/$$/stat; id -u; tr '\\n' ' ' < /proc/$$/cgroup; echo";

struct Report {
    pid: u32,
    parent: u32,
    group: u32,
    uid: u32,
    cgroups: String,
}

fn report(out: &std::process::Output) -> Report {
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    let l: Vec<&str> = s.lines().collect();
    assert!(l.len() >= 5, "{}", text(out));
    let n = |i: usize| l[i].trim().parse::<u32>().unwrap();
    Report {
        pid: n(0),
        parent: n(1),
        group: n(2),
        uid: n(3),
        cgroups: l[4].to_string(),
    }
}

#[test]
fn commands_are_started_by_a_pre_confined_spawner_with_every_guarantee() {
    let c = Cluster::start();
    let w = c.join_worker("spawned");
    let (cgroup, proc_private) = (active(&c, "cgroup"), active(&c, "proc"));
    let mut parents = Vec::new();
    for i in 0..3 {
        let out = exec(
            &c,
            &w,
            &[],
            &format!("{SELF_REPORT}; echo to-stderr-{i} >&2; exit {}", 3 + i),
        );
        // Exit status and both streams, exactly.
        assert_eq!(out.status.code(), Some(3 + i), "{}", text(&out));
        assert_stderr_says(&out, &format!("to-stderr-{i}"));
        let r = report(&out);
        // Started by the workspace's spawner, which outlives the call and serves the next.
        let spawner = cmdline(r.parent);
        assert!(
            spawner.contains("__spawner"),
            "call {i}: the parent {} is {spawner:?}, not a spawner",
            r.parent
        );
        parents.push(r.parent);
        // Its own process group (killed as a whole), apart from the spawner's.
        assert_eq!(
            r.group, r.pid,
            "call {i}: not in a process group of its own"
        );
        if root() {
            assert_eq!(
                r.uid, 1_800_000,
                "call {i}: commands run as the first task's own user"
            );
        }
        if cgroup {
            assert!(
                r.cgroups.contains("tether-"),
                "call {i}: not in a call cgroup: {}",
                r.cgroups
            );
        }
    }
    assert!(
        parents.windows(2).all(|p| p[0] == p[1]),
        "one spawner serves the workspace: {parents:?}"
    );
    // The command cannot look into its spawner (which holds the socket to the worker).
    if proc_private {
        let out = exec(
            &c,
            &w,
            &[],
            "cat /proc/$PPID/cmdline && echo READABLE; ls /proc/$PPID/fd && echo LISTED; true",
        );
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(
            !s.contains("READABLE") && !s.contains("LISTED"),
            "{}",
            text(&out)
        );
    }
    // What a call leaves running is killed when it ends; the spawner is not.
    let out = exec(&c, &w, &[], "sleep 300 & echo $!; echo $PPID");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut l = s.lines().map(|x| x.trim().parse::<u32>().unwrap());
    let (left, parent) = (l.next().unwrap(), l.next().unwrap());
    assert!(
        wait_until(Duration::from_secs(5), || process_gone(left)),
        "background child {left} survived its call"
    );
    assert_eq!(parent, parents[0], "{}", text(&out));
    assert!(!process_gone(parent), "the spawner died with the call");
    // A timeout kills the command and what it started, setsid or not, and the spawner
    // serves the next call.
    let out = exec(
        &c,
        &w,
        &["--timeout", "1s"],
        "setsid sh -c 'trap \"\" TERM; echo $$ > inner.pid; while :; do sleep 1; done' & echo $PPID > parent.pid; sleep 300",
    );
    assert_eq!(out.status.code(), Some(124), "{}", text(&out));
    let inner: u32 = std::fs::read_to_string(w.workspace().join("inner.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    if cgroup {
        assert!(
            wait_until(Duration::from_secs(5), || process_gone(inner)),
            "the setsid child {inner} survived the timeout"
        );
    }
    let out = exec(&c, &w, &[], SELF_REPORT);
    assert_eq!(report(&out).parent, parents[0], "{}", text(&out));
}

#[test]
fn a_command_that_kills_its_spawner_gets_a_clear_error_and_the_next_call_works() {
    let c = Cluster::start();
    let w = c.join_worker("regicide");
    let first = report(&exec(&c, &w, &[], SELF_REPORT)).parent;
    assert!(cmdline(first).contains("__spawner"), "{}", cmdline(first));
    let out = exec(
        &c,
        &w,
        &[],
        "echo ran >> runs.txt; kill -9 $PPID; sleep 2; echo survived",
    );
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("spawner ended"),
        "the error does not say what happened: {}",
        text(&out)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("survived"));
    // Whether the spawner died before or after it said the command started, the command
    // ran once: it is never started a second time.
    assert_eq!(
        std::fs::read_to_string(w.workspace().join("runs.txt")).unwrap(),
        "ran\n",
        "{}",
        text(&out)
    );
    assert!(wait_until(Duration::from_secs(5), || process_gone(first)));
    let out = exec(&c, &w, &[], &format!("{SELF_REPORT}; echo fine"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("fine"));
    let next = report(&out).parent;
    assert_ne!(next, first, "the dead spawner cannot have started it");
    assert!(cmdline(next).contains("__spawner"), "{}", cmdline(next));
}

#[test]
fn with_spawners_off_each_command_is_forked_by_the_worker() {
    let c = Cluster::start();
    let w = c.join_worker_with("forked", &[("TETHER_WORKER_SPAWNER", "off")]);
    for _ in 0..2 {
        let out = exec(&c, &w, &[], "echo $PPID; exit 5");
        assert_eq!(out.status.code(), Some(5), "{}", text(&out));
        let parent: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let line = cmdline(parent);
        assert!(
            !line.contains("__spawner") && line.contains("worker"),
            "the parent {parent} is {line:?}, not the worker"
        );
    }
}
