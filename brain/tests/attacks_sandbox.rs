//! The threat model's commands route, tried as an attacker would: what a task's own command
//! can do to the kernel, to another task's commands on the same worker, and where it can
//! send a credential. Real brain and worker processes; each attack is a command a model could
//! write. Where the host lacks what a test needs, the test says why it is skipped.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use testkit::tasks::try_set_secret;
use testkit::{Cluster, Worker, text, wait_until};

fn root() -> bool {
    rustix::process::geteuid().is_root()
}

use testkit::stdout;

fn exec_in(c: &Cluster, w: &Worker, workspace: &str, script: &str) -> std::process::Output {
    c.brain_cli(&[
        "exec",
        w.id.as_str(),
        "--workspace",
        workspace,
        "--",
        "sh",
        "-c",
        script,
    ])
}

/// Raw system calls through Python's ctypes, each printed as `name=OK` or `name=ERRNO`.
/// Every one of them succeeds for an unprivileged process on a stock kernel (or would, but for
/// sysctls some hosts set): user namespaces, the kernel keyring, ptrace of one's own child,
/// file handles, a user-mode userfaultfd, io_uring, and `setns`/`clone3`/`mount` for
/// completeness.
const SYSCALLS: &str = r#"
import ctypes, errno, os, platform, time
libc = ctypes.CDLL(None, use_errno=True)
arch = platform.machine()
NR = {
    "x86_64": dict(add_key=248, keyctl=250, userfaultfd=323, name_to_handle_at=303, clone3=435, setns=308, bpf=321, perf_event_open=298, io_uring_setup=425),
    "aarch64": dict(add_key=217, keyctl=219, userfaultfd=282, name_to_handle_at=264, clone3=435, setns=268, bpf=280, perf_event_open=241, io_uring_setup=425),
}[arch]
def show(name, r):
    e = ctypes.get_errno()
    print(f"{name}={'OK' if r >= 0 else errno.errorcode.get(e, e)}", flush=True)
ctypes.set_errno(0)
show("unshare_user", libc.unshare(0x10000000))
ctypes.set_errno(0)
show("unshare_ns", libc.unshare(0x00020000))
ctypes.set_errno(0)
show("add_key", libc.syscall(NR["add_key"], b"user", b"tether-probe", b"x", 1, ctypes.c_int(-2)))
ctypes.set_errno(0)
show("keyctl", libc.syscall(NR["keyctl"], 0, ctypes.c_int(-2), 1))
child = os.fork()
if child == 0:
    time.sleep(5)
    os._exit(0)
ctypes.set_errno(0)
r = libc.ptrace(16, child, 0, 0)
show("ptrace", r)
os.kill(child, 9)
os.waitpid(child, 0)
class Handle(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int), ("f", ctypes.c_ubyte * 128)]
h = Handle(128, 0)
mount_id = ctypes.c_int()
ctypes.set_errno(0)
show("name_to_handle_at", libc.syscall(NR["name_to_handle_at"], -100, b".", ctypes.byref(h), ctypes.byref(mount_id), 0))
ctypes.set_errno(0)
show("userfaultfd", libc.syscall(NR["userfaultfd"], 1))
ctypes.set_errno(0)
show("setns", libc.syscall(NR["setns"], os.open("/proc/self/ns/mnt", os.O_RDONLY), 0))
ctypes.set_errno(0)
show("clone3", libc.syscall(NR["clone3"], None, 0))
ctypes.set_errno(0)
show("mount", libc.mount(b"none", b".", b"tmpfs", 0, None))
params = (ctypes.c_ubyte * 120)()
ctypes.set_errno(0)
show("io_uring_setup", libc.syscall(NR["io_uring_setup"], 1, ctypes.byref(params)))
"#;

/// The calls every confined command is refused, with the errno it must see: EPERM (the
/// filter answers, the program goes on), or ENOSYS for clone3, whose flags a filter cannot
/// read (so the C library falls back to clone, whose flags it can).
const REFUSED: &[(&str, &str)] = &[
    ("unshare_user", "EPERM"),
    ("unshare_ns", "EPERM"),
    ("add_key", "EPERM"),
    ("keyctl", "EPERM"),
    ("ptrace", "EPERM"),
    ("name_to_handle_at", "EPERM"),
    ("userfaultfd", "EPERM"),
    ("setns", "EPERM"),
    ("clone3", "ENOSYS"),
    ("mount", "EPERM"),
    ("io_uring_setup", "EPERM"),
];

/// Runs [`SYSCALLS`] and the everyday tools on a worker started with `env`, and checks that
/// every dangerous call was refused with its errno while the tools still work.
fn syscalls_are_refused(env: &[(&str, &str)], name: &str) {
    let c = Cluster::start();
    let (active, line) = c.doctor("seccomp");
    if !active {
        assert!(line.contains("MISSING"), "{line}");
        testkit::skip("seccomp", &format!("worker doctor says: {line}"));
        return;
    }
    let w = c.join_worker_with(name, env);
    std::fs::create_dir_all(w.workspace()).unwrap();
    std::fs::write(w.workspace().join("probe.py"), SYSCALLS).unwrap();
    // Twice: a spawner serves the second call where spawners are on.
    for round in 0..2 {
        let out = exec_in(&c, &w, "default", "python3 probe.py");
        assert_eq!(out.status.code(), Some(0), "round {round}: {}", text(&out));
        let said = stdout(&out);
        for (call, errno) in REFUSED {
            assert!(
                said.lines().any(|l| l == format!("{call}={errno}")),
                "round {round}: {call} was not refused with {errno}: {}",
                text(&out)
            );
        }
    }
    // What commands need still works: threads (clone without namespace flags), a shell's
    // pipes and children, git, a virtualenv.
    let out = exec_in(
        &c,
        &w,
        "default",
        "set -e
         python3 -c 'import threading; t = threading.Thread(target=print, args=(\"thread-ok\",)); t.start(); t.join()'
         echo hi | tr h H
         git init -q repo && cd repo && echo x > f && git add f
         git -c user.name=t -c user.email=t@example.com commit -q -m one && git log --oneline | wc -l
         cd .. && python3 -m venv venv --without-pip && venv/bin/python -c 'print(\"venv-ok\")'",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        stdout(&out),
        "thread-ok\nHi\n1\nvenv-ok\n",
        "{}",
        text(&out)
    );
}

/// A command cannot reach the kernel's riskier interfaces (user namespaces, keyrings, ptrace,
/// file handles, userfaultfd, mounts) when its spawner started it.
#[test]
fn a_command_started_by_a_spawner_is_refused_dangerous_syscalls() {
    syscalls_are_refused(&[], "seccomp-spawner");
}

/// The same when each command is forked and confined on its own.
#[test]
fn a_command_forked_and_confined_is_refused_dangerous_syscalls() {
    syscalls_are_refused(&[("TETHER_WORKER_SPAWNER", "off")], "seccomp-fork");
}

/// Two tasks on one root worker: a command in one cannot see, read or signal the other's
/// processes, nor read its workspace even by its path on the host.
#[test]
fn a_command_cannot_touch_another_tasks_processes_or_files() {
    if !root() {
        testkit::skip(
            "user",
            "a_command_cannot_touch_another_tasks_processes_or_files needs a root worker, which gives each task a user of its own",
        );
        return;
    }
    let c = Cluster::start();
    let w = c.join_worker("two-tasks");
    // Task B: a long call that says its pid and waits for the test to let it go.
    let b_ws = w.state.join("workspaces/task-b");
    let out = exec_in(&c, &w, "task-b", "echo B-SECRET > secret.txt");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let victim = c
        .brain_cli_cmd(&[
            "exec",
            w.id.as_str(),
            "--workspace",
            "task-b",
            "--timeout",
            "60s",
            "--",
            "sh",
            "-c",
            "echo $$ > pid; exec env B_MARK=victim-environ sh -c \
             'while [ ! -e stop ]; do sleep 0.1; done; echo survived'",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid_file = b_ws.join("pid");
    assert!(
        wait_until(Duration::from_secs(20), || {
            std::fs::read_to_string(&pid_file).is_ok_and(|s| s.trim().parse::<u32>().is_ok())
        }),
        "task B's command did not start"
    );
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_string();
    // Task A: look for B's process, read what it holds, kill it; read B's files by path.
    let attack = format!(
        "ls /proc | grep -qx {pid} && echo SEEN; \
         cat /proc/{pid}/environ 2>/dev/null | tr '\\0' '\\n' | grep -q B_MARK && echo ENVIRON; \
         kill -9 {pid} 2>/dev/null && echo KILLED; \
         cat {}/secret.txt 2>/dev/null; cat /proc/{pid}/cwd/secret.txt 2>/dev/null; true",
        b_ws.display()
    );
    let out = exec_in(&c, &w, "task-a", &attack);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = stdout(&out);
    std::fs::write(b_ws.join("stop"), "").unwrap();
    let b = victim.wait_with_output().unwrap();
    assert!(
        !said.contains("SEEN")
            && !said.contains("ENVIRON")
            && !said.contains("KILLED")
            && !said.contains("B-SECRET"),
        "task A reached task B: {}; B: {}",
        text(&out),
        text(&b)
    );
    assert_eq!(b.status.code(), Some(0), "task B's command: {}", text(&b));
    assert_eq!(stdout(&b), "survived\n", "{}", text(&b));
    // Each task's files are its own user's, and the two users differ.
    let owner = |p: &Path| std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(p).unwrap());
    let (a, bu) = (
        owner(&w.state.join("workspaces/task-a")),
        owner(&b_ws.join("secret.txt")),
    );
    assert_ne!(a, bu, "both tasks run as uid {a}");
    assert!(a != 0 && bu != 0 && a != 65534 && bu != 65534, "{a} {bu}");
    let (active, line) = c.doctor("user");
    assert!(active && line.contains("a user of its own"), "{line}");
    // A removed workspace frees its uid for the next task; one made again under the old
    // name gets another uid, and a temp dir of its own it can write.
    std::fs::remove_dir_all(w.state.join("workspaces/task-a")).unwrap();
    let out = exec_in(&c, &w, "task-c", "id -u");
    assert_eq!(stdout(&out).trim(), a.to_string(), "{}", text(&out));
    let out = exec_in(&c, &w, "task-a", "id -u; echo ok > /tmp/t && cat /tmp/t");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = stdout(&out);
    let mut lines = said.lines();
    let again: u32 = lines.next().unwrap().parse().unwrap();
    assert!(again != a && again != bu, "{said}");
    assert_eq!(lines.next(), Some("ok"), "{}", text(&out));
}

/// A secret may not be bound to every name under a public suffix: anyone can register a name
/// under `herokuapp.com`, `github.io` or `co.uk` and receive the credential there.
#[test]
fn a_secret_cannot_be_bound_to_a_whole_public_suffix() {
    let c = Cluster::start();
    for host in [
        "*.herokuapp.com",
        "*.co.uk",
        "*.github.io",
        "*.s3.amazonaws.com",
    ] {
        let out = try_set_secret(&c, "wide", "value", &["--host", host]);
        assert!(!out.status.success(), "{host} was accepted: {}", text(&out));
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(
            e.contains(host) && e.contains("public suffix"),
            "{host}: {e}"
        );
    }
    // A registrable domain's names are fine, at any depth.
    for host in [
        "*.example.com",
        "*.myapp.herokuapp.com",
        "*.example.co.uk",
        "api.github.io",
    ] {
        let out = try_set_secret(&c, "narrow", "value", &["--host", host]);
        assert!(out.status.success(), "{host}: {}", text(&out));
    }
}
