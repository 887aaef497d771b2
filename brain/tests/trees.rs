//! Trees a task's own commands leave behind, moved there and back: a virtualenv, links out
//! of the workspace, a name that is not UTF-8, a FIFO, a socket, and a realistic project of
//! 50,000 entries. Every barrier goes through, odd entries are named once, and the root hash
//! is the same after the round trip.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use testkit::gates::Gates;
use testkit::{Cluster, assert_stdout_says};

/// Moves task `id` to `to` while its second step waits at gate 1, and back to `back` while
/// its third waits at gate 2 (a move happens at the next tool-call boundary: after the
/// gated step); returns its log once it has finished.
fn there_and_back(c: &Cluster, id: &str, gates: &Gates, to: &str, back: &str) -> Vec<Value> {
    c.move_at_gate(id, 2, to, gates, 1);
    c.wait_records(id, "move_completed", 1, Duration::from_secs(180));
    c.move_at_gate(id, 3, back, gates, 2);
    c.wait_status(id, &["finished"], Duration::from_secs(240));
    let log = c.task_log_json(id);
    let count = |k: &str| log.iter().filter(|r| r["kind"] == k).count();
    assert_eq!(
        (count("move_completed"), count("move_aborted")),
        (2, 0),
        "{}",
        c.brain_log()
    );
    assert!(
        !c.brain_log().contains("barrier failed"),
        "a barrier failed:\n{}",
        c.brain_log()
    );
    log
}

/// The root of every barrier logged (the first is the tree the first step made).
fn barrier_roots(log: &[Value]) -> Vec<String> {
    log.iter()
        .filter(|r| r["kind"] == "barrier")
        .map(|r| r["root_hash"].as_str().unwrap().to_string())
        .collect()
}

fn task_ws(w: &testkit::Worker, id: &str) -> PathBuf {
    w.state
        .join("workspaces")
        .join(format!("task-{}", id.trim_start_matches("t-")))
}

#[test]
fn what_a_task_leaves_in_its_workspace_never_stops_a_barrier_or_a_move() {
    let c = Cluster::start();
    let a = c.join_worker("a");
    let b = c.join_worker("b");
    let gates = Gates::new();
    // A virtualenv named `venv` (its interpreter is a symlink out of the workspace), a link
    // to /etc/passwd, a name that is not UTF-8, a FIFO and a socket.
    let make = "python3 -m venv venv --without-pip && ln -s /etc/passwd pw \
        && printf latin > \"$(printf 'caf\\351.txt')\" && mkfifo pipe \
        && python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\" \
        && echo made > made.txt";
    let plan = c.dir.join("odd-plan.json");
    let steps = vec![
        json!({"run": ["sh", "-c", make]}),
        gates.step(1, "true"),
        gates.step(
            2,
            "venv/bin/python -c 'import sys; print(\"prefix\", sys.prefix)'",
        ),
        json!({"run": ["sh", "-c", "venv/bin/python -c 'print(\"back on a\")' && head -c 4 pw"]}),
    ];
    std::fs::write(&plan, json!({ "steps": steps }).to_string()).unwrap();
    let id = c.run_plan(&plan, "a");
    let log = there_and_back(&c, &id, &gates, "b", "a");
    // Every barrier went through, and the tree did not change across the round trip.
    let roots = barrier_roots(&log);
    assert!(!roots.is_empty());
    assert!(
        roots.iter().all(|r| *r == roots[0]),
        "the root hash changed: {roots:?}"
    );
    // The venv's interpreter ran on b, at the same absolute path.
    let outputs: Vec<String> = log
        .iter()
        .filter(|r| r["kind"] == "tool_output")
        .map(|r| r["stdout"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        outputs.iter().any(|o| o.contains("prefix /workspace/venv")),
        "{outputs:?}"
    );
    assert!(
        outputs.iter().any(|o| o.contains("back on a\nroot")),
        "{outputs:?}"
    );
    let ran_on = |needle: &str, worker: &str| {
        log.iter().any(|r| {
            r["kind"] == "tool_call_issued"
                && r["worker"] == worker
                && r["call"].to_string().contains(needle)
                && log.iter().any(|o| {
                    o["kind"] == "tool_output"
                        && o["call_id"] == r["call_id"]
                        && o["stdout"].as_str().is_some_and(|s| {
                            s.contains("prefix /workspace/venv") || s.contains("back on a")
                        })
                })
        })
    };
    assert!(
        ran_on("prefix", &b.id),
        "the venv did not run on b: {log:?}"
    );
    assert!(ran_on("back on a", &a.id), "not back on a: {log:?}");
    // On b: the links as links, the odd entries not at all.
    let on_b = task_ws(&b, &id);
    assert_eq!(
        std::fs::read_link(on_b.join("pw")).unwrap(),
        PathBuf::from("/etc/passwd")
    );
    assert!(
        std::fs::symlink_metadata(on_b.join("venv/bin/python"))
            .unwrap()
            .is_symlink()
    );
    for gone in ["pipe", "sock"] {
        assert!(!on_b.join(gone).exists(), "{gone} was carried");
    }
    // Each left-out entry is named once, with why.
    let named: Vec<(String, String)> = log
        .iter()
        .filter(|r| r["kind"] == "left_out")
        .flat_map(|r| r["entries"].as_array().cloned().unwrap_or_default())
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_string(),
                e["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut paths: Vec<&str> = named.iter().map(|(p, _)| p.as_str()).collect();
    paths.sort();
    assert_eq!(paths, ["caf\\xe9.txt", "pipe", "sock"], "{named:?}");
    assert!(named.iter().any(|(p, r)| p == "pipe" && r.contains("FIFO")));
    let shown = c.brain_cli(&["task", "log", &id]);
    assert_stdout_says(&shown, "! caf\\xe9.txt: its name is not UTF-8");
}

#[test]
fn a_realistic_tree_of_fifty_thousand_entries_moves_there_and_back_unchanged() {
    let c = Cluster::start();
    let a = c.join_worker("a");
    let _b = c.join_worker("b");
    let gates = Gates::new();
    // Nested directories, internal and external symlinks (one dangling), executables, empty
    // files, a large sparse file within the size limit, 50,000 entries in all.
    let generate = r##"
import os
n = 0
def mk(p, data=b"", x=False):
    global n
    with open(p, "wb") as f:
        f.write(data)
    if x:
        os.chmod(p, 0o755)
    n += 1
os.makedirs("src")
n += 1
for i in range(100):
    d = f"src/pkg{i:03}/sub{i % 7}/deep"
    os.makedirs(d)
    n += 3
    for j in range(240):
        p = f"{d}/m{j:03}.py"
        if j % 5 == 0:
            mk(p)
        else:
            mk(p, f"# {i} {j}\nvalue = {i * j}\n".encode() * (1 + j % 9), x=(j % 50 == 1))
    os.symlink(f"m001.py", f"{d}/alias.py"); n += 1
    os.symlink("../../../../README.md", f"{d}/readme"); n += 1
os.symlink("/etc/hostname", "hostname"); n += 1
os.symlink("/usr/bin/env", "env"); n += 1
os.symlink("nowhere/at/all", "dangling"); n += 1
mk("README.md", b"# generated\n")
with open("sparse.bin", "wb") as f:
    f.truncate(64 << 20)
n += 1
i = 0
while n < 50000:
    mk(f"src/pad{i:05}")
    i += 1
print("entries", n)
"##;
    let plan = c.dir.join("tree-plan.json");
    let steps = vec![
        json!({"run": ["python3", "-c", generate], "timeout": "5m"}),
        gates.step(1, "true"),
        gates.step(2, "true"),
        json!({"run": ["true"]}),
    ];
    std::fs::write(&plan, json!({ "steps": steps }).to_string()).unwrap();
    let id = c.run_plan(&plan, "a");
    let log = there_and_back(&c, &id, &gates, "b", "a");
    let made = log
        .iter()
        .find(|r| r["kind"] == "tool_output")
        .and_then(|r| r["stdout"].as_str())
        .unwrap_or_default()
        .to_string();
    assert_eq!(made.trim(), "entries 50000", "{log:?}");
    let roots = barrier_roots(&log);
    assert!(
        roots.iter().all(|r| *r == roots[0]),
        "the root hash changed: {roots:?}"
    );
    let first = log.iter().find(|r| r["kind"] == "barrier").unwrap();
    assert!(
        testkit::json_u64(&first["files"]).unwrap() > 24_000,
        "{first}"
    );
    // What is on a's disk after the round trip is that tree, by an independent scan.
    let here = shared::scan::Scanner::new(&task_ws(&a, &id), Default::default())
        .scan()
        .unwrap();
    assert_eq!(here.entries().len(), 50_000);
    assert_eq!(here.root_hash(), roots[0]);
    assert_eq!(
        here.entries()["hostname"].target,
        "/etc/hostname",
        "an external link"
    );
    assert!(here.entries()["src/pkg000/sub0/deep/m001.py"].exec);
    assert_eq!(here.entries()["sparse.bin"].size, 64 << 20);
    assert!(
        !log.iter().any(|r| r["kind"] == "left_out"),
        "nothing of this tree is left out"
    );
}
