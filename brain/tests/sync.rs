//! Workspace sync and moves with real processes: the brain's mirror follows every call
//! (barriers, root hashes checked), and a task moved between workers mid-run ends with
//! exactly the workspace an unmoved run of the same plan ends with.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use testkit::fake_llm::{FakeLlm, FakeReply};
use testkit::gates::Gates;
use testkit::git_server::init_repo;
use testkit::{BrainOptions, Cluster, assert_failed_saying, text};

/// A plan that builds a small tree step by step: files, directories, an executable, a
/// symlink, a deletion and a rename.
fn tree_plan(c: &Cluster, pause: &str) -> PathBuf {
    let mut steps: Vec<Value> = (0..8)
        .map(|i| {
            json!({"run": ["sh", "-c", format!(
                "sleep {pause}; mkdir -p d{i}/sub; echo content-{i} > d{i}/sub/f.txt; echo {i} >> log.txt; head -c {} /dev/zero > d{i}/blob.bin",
                1000 * (i + 1)
            )]})
        })
        .collect();
    steps.push(json!({"run": ["sh", "-c", "printf '#!/bin/sh\\necho hi\\n' > run.sh; chmod +x run.sh; ln -s d1/sub/f.txt link"]}));
    steps.push(json!({"run": ["sh", "-c", "rm -r d2; mv d3 renamed"]}));
    steps.push(json!({"write": {"path": "notes/done.txt", "content": "done\n"}}));
    plan_file(c, "tree-plan.json", json!({ "steps": steps }))
}

/// A cluster whose brain talks to the fake model server (and clones local repositories).
fn with_model(llm: &FakeLlm) -> Cluster {
    Cluster::start_with(BrainOptions::with_llm(
        llm,
        "sk-test-key-123456",
        "[deliver]\ngit_schemes = [\"https\", \"ssh\", \"file\"]\n",
    ))
}

fn last_root(log: &[Value]) -> String {
    log.iter()
        .rev()
        .find(|r| r["kind"] == "barrier")
        .map(|r| r["root_hash"].as_str().unwrap().to_string())
        .expect("a barrier in the log")
}

/// The records of `kind` in a task's log.
fn of_kind<'a>(log: &'a [Value], kind: &str) -> Vec<&'a Value> {
    log.iter().filter(|r| r["kind"] == kind).collect()
}

/// What the task's commands printed, in order.
fn outputs(log: &[Value]) -> Vec<&str> {
    of_kind(log, "tool_output")
        .into_iter()
        .filter_map(|r| r["stdout"].as_str())
        .collect()
}

/// `brain task move ID --to WORKER`, which must be taken.
fn move_to(c: &Cluster, id: &str, worker: &str) {
    let out = c.brain_cli(&["task", "move", id, "--to", worker]);
    assert!(out.status.success(), "{}", text(&out));
}

/// The workspace root `plan` ends with on `worker`, never moved: the reference.
fn unmoved_root(c: &Cluster, plan: &Path, worker: &str) -> String {
    let plain = c.run_plan(plan, worker);
    c.wait_status(&plain, &["finished"], Duration::from_secs(60));
    last_root(&c.task_log_json(&plain))
}

/// Writes `steps` as the plan `name` in the cluster's directory.
fn plan_file(c: &Cluster, name: &str, steps: Value) -> PathBuf {
    let plan = c.dir.join(name);
    std::fs::write(&plan, steps.to_string()).unwrap();
    plan
}

/// What `brain watch` shows of a plan whose one step runs `script` on worker `w`.
/// What `brain watch` shows of a one-step plan running `script` on worker `w`, to its end.
/// `script` may wait at `gates`; gate `n` of `opens` opens when the watcher shows a line
/// with its text.
fn watched(c: &Cluster, name: &str, script: &str, gates: &Gates, opens: &[(&str, u32)]) -> String {
    use std::io::BufRead;
    let plan = plan_file(c, name, json!({"steps": [{"run": ["sh", "-c", script]}]}));
    let mut watcher = c
        .brain_cli_cmd(&["watch", &c.run_plan(&plan, "w")])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut shown = String::new();
    for line in std::io::BufReader::new(watcher.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        for (text, n) in opens {
            if line.contains(text) {
                gates.open(*n);
            }
        }
        shown.push_str(&line);
        shown.push('\n');
    }
    assert!(watcher.wait().unwrap().success(), "{shown}");
    shown
}

fn read(c: &Cluster, worker: &str, id: &str, path: &str) -> Option<String> {
    let ws = format!("task-{}", id.trim_start_matches("t-"));
    let out = c.brain_cli(&["file", "read", worker, path, "--workspace", &ws]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn a_task_moved_mid_run_ends_with_the_workspace_of_an_unmoved_run() {
    let c = Cluster::start();
    let a = c.join_worker("a");
    // b keeps no fetched content in memory: every blob waits in its staging directory.
    let b = c.join_worker_with("b", &[("TETHER_MATERIALISE_MEMORY", "0")]);
    let plan = tree_plan(&c, "0.2");
    // The reference: the same plan, never moved.
    let want = unmoved_root(&c, &plan, "a");

    let moved = c.run_plan(&plan, "a");
    c.wait_records(&moved, "tool_call_completed", 3, Duration::from_secs(30));
    move_to(&c, &moved, "b");
    c.wait_status(&moved, &["finished"], Duration::from_secs(60));
    let log = c.task_log_json(&moved);
    assert_eq!(last_root(&log), want, "the moved run's workspace differs");
    let kinds: Vec<&str> = log.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    let started = kinds
        .iter()
        .position(|k| *k == "move_started")
        .expect("a move");
    let completed = kinds
        .iter()
        .position(|k| *k == "move_completed")
        .expect("completed");
    assert!(started < completed);
    // Calls before the move ran on a, the rest on b.
    let issued: Vec<(usize, &str)> = log
        .iter()
        .enumerate()
        .filter(|(_, r)| r["kind"] == "tool_call_issued")
        .map(|(i, r)| (i, r["worker"].as_str().unwrap()))
        .collect();
    assert!(
        issued
            .iter()
            .all(|(i, w)| if *i < started { *w == a.id } else { *w == b.id }),
        "{issued:?}"
    );
    assert!(issued.iter().any(|(_, w)| *w == b.id));
    assert!(
        b.log_text().contains("waited on disk"),
        "the move did not stage its blobs"
    );
    assert!(
        std::fs::read_dir(b.state.join("staging"))
            .map(|d| d.count() == 0)
            .unwrap_or(true),
        "staged blobs were left behind"
    );
    // What is on b's disk is the real thing.
    assert_eq!(
        read(&c, &b.id, &moved, "d1/sub/f.txt").as_deref(),
        Some("content-1\n")
    );
    assert_eq!(
        read(&c, &b.id, &moved, "log.txt").unwrap().lines().count(),
        8
    );
    assert_eq!(
        read(&c, &b.id, &moved, "notes/done.txt").as_deref(),
        Some("done\n")
    );
    assert_eq!(read(&c, &b.id, &moved, "d2/sub/f.txt"), None);
    // Moving a finished task is refused.
    let out = c.brain_cli(&["task", "move", &moved, "--to", "a"]);
    assert!(!out.status.success());
}

#[test]
fn an_agent_moved_between_calls_is_told_and_carries_on_with_its_files() {
    let llm = FakeLlm::script(vec![
        FakeReply::run("echo made-on-a > a.txt; sleep 1"),
        FakeReply::tool_call("read_file", json!({"path": "a.txt"})),
        FakeReply::finish("read it back"),
    ]);
    let c = with_model(&llm);
    let a = c.join_worker("a");
    let b = c.join_worker("b");
    let id = c.agent().worker("a").start("move me");
    c.wait_records(&id, "tool_call_issued", 1, Duration::from_secs(30));
    // `--wait` follows the move to its end and says what it sent.
    let out = c.brain_cli(&["task", "move", &id, "--to", "b", "--wait", "30s"]);
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with(&format!("{id} moved to {} (", b.id)) && said.contains("bytes sent"),
        "{}",
        text(&out)
    );
    assert_eq!(
        c.task_log_json(&id)
            .iter()
            .filter(|r| r["kind"] == "move_completed")
            .count(),
        1,
        "the move completed before `--wait` returned"
    );
    c.wait_status(&id, &["finished"], Duration::from_secs(30));
    let reqs = llm.requests();
    let said = reqs[1].body["messages"].to_string();
    assert!(
        said.contains(&format!("moved from machine {} to machine {}", a.id, b.id)),
        "{said}"
    );
    assert!(
        reqs[2].body["messages"].to_string().contains("made-on-a"),
        "the file came along"
    );
    assert_eq!(
        read(&c, &b.id, &id, "a.txt").as_deref(),
        Some("made-on-a\n")
    );
}

#[test]
fn a_brain_killed_during_a_move_completes_it_or_rolls_it_back() {
    let mut c = Cluster::start();
    let _a = c.join_worker("a");
    let _b = c.join_worker("b");
    let plan = tree_plan(&c, "0.2");
    let want = unmoved_root(&c, &plan, "a");
    let id = c.run_plan(&plan, "a");
    c.wait_records(&id, "tool_call_completed", 2, Duration::from_secs(30));
    move_to(&c, &id, "b");
    c.wait_records(&id, "move_started", 1, Duration::from_secs(30));
    c.kill_brain();
    c.start_brain().unwrap();
    c.wait_status(&id, &["finished"], Duration::from_secs(60));
    let log = c.task_log_json(&id);
    assert_eq!(last_root(&log), want);
    let count = |k: &str| log.iter().filter(|r| r["kind"] == k).count();
    assert_eq!(
        count("move_started"),
        count("move_completed") + count("move_aborted"),
        "a half-done move"
    );
}

#[test]
fn a_sigkilled_worker_fails_over_to_another_and_the_task_ends_with_the_same_workspace() {
    let c = Cluster::start_with(BrainOptions {
        extra_args: vec!["--failover-after".into(), "1s".into()],
        ..Default::default()
    });
    let mut a = c.join_worker("a");
    let b = c.join_worker("b");
    let plan = tree_plan(&c, "0.3");
    let want = unmoved_root(&c, &plan, "b");
    let id = c.run_plan(&plan, "a");
    c.wait_records(&id, "tool_call_completed", 3, Duration::from_secs(30));
    a.kill();
    c.wait_status(&id, &["finished"], Duration::from_secs(60));
    let log = c.task_log_json(&id);
    assert_eq!(
        last_root(&log),
        want,
        "the failed-over run's workspace differs"
    );
    let moved = of_kind(&log, "move_completed");
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0]["to"], b.id.as_str());
    assert_eq!(read(&c, &b.id, &id, "log.txt").unwrap().lines().count(), 8);
}

#[test]
fn a_task_starts_from_a_git_repository_the_brain_clones() {
    let llm = FakeLlm::script(vec![
        FakeReply::tool_call("list_files", json!({})),
        FakeReply::tool_call("read_file", json!({"path": "src/lib.txt"})),
        FakeReply::finish("read"),
    ]);
    let c = with_model(&llm);
    let w = c.join_worker("w");
    let repo = c.dir.join("repo");
    init_repo(
        &repo,
        &[
            ("src/lib.txt", "from the repository\n"),
            (".gitignore", "*.tmp\n"),
        ],
    )
    .unwrap();
    let id = c
        .agent()
        .worker("w")
        .args(&["--git", repo.to_str().unwrap()])
        .start("read the code");
    c.wait_status(&id, &["finished"], Duration::from_secs(30));
    let reqs = llm.requests();
    let listing = reqs[1].body["messages"].to_string();
    assert!(
        listing.contains("src/lib.txt") && !listing.contains(".git/"),
        "{listing}"
    );
    assert!(
        reqs[2].body["messages"]
            .to_string()
            .contains("from the repository")
    );
    assert_eq!(
        read(&c, &w.id, &id, "src/lib.txt").as_deref(),
        Some("from the repository\n")
    );
    // The two files and the repository's cleaned .git/, at the commit imported.
    let log = c.task_log_json(&id);
    let seeded = log
        .iter()
        .find(|r| r["kind"] == "workspace_seeded")
        .unwrap();
    assert!(testkit::json_u64(&seeded["files"]).unwrap() > 2, "{seeded}");
    assert_eq!(seeded["commit"].as_str().unwrap().len(), 40, "{seeded}");
    assert_eq!(seeded["branch"], "main", "{seeded}");
    assert!(read(&c, &w.id, &id, ".git/HEAD").is_some());
    // Per task: .git/ included, src/ left out.
    let id2 = c
        .agent()
        .worker("w")
        .args(&[
            "--git",
            repo.to_str().unwrap(),
            "--include-git",
            "--exclude",
            "src",
        ])
        .start("read the code");
    c.wait_status(&id2, &["finished", "failed"], Duration::from_secs(30));
    let log = c.task_log_json(&id2);
    let seeded = log
        .iter()
        .find(|r| r["kind"] == "workspace_seeded")
        .unwrap();
    assert!(testkit::json_u64(&seeded["files"]).unwrap() > 3, "{seeded}");
    assert!(
        log.iter()
            .any(|r| r["kind"] == "workspace_rules" && r["rules"]["include_git"] == true)
    );
    assert_eq!(read(&c, &w.id, &id2, "src/lib.txt"), None);
    assert!(read(&c, &w.id, &id2, ".git/HEAD").is_some());
    // A repository that is not there: a clear error, no task.
    let out = c
        .agent()
        .worker("w")
        .args(&["--git", c.dir.join("nope").to_str().unwrap()])
        .try_start("x");
    assert_failed_saying(&out, "git clone of");
}

#[test]
fn watchers_see_file_changes_as_they_happen() {
    let c = Cluster::start();
    let _w = c.join_worker("w");
    // Each change once the watcher has shown the one before it.
    let g = Gates::new();
    let wait = |n| g.wait(n, Duration::from_secs(60));
    let shown = watched(
        &c,
        "live-plan.json",
        &format!(
            "{}; mkdir -p src; echo one > src/live.txt; mkdir -p target; echo x > target/ignored.o; {}; rm src/live.txt; {}",
            wait(1),
            wait(2),
            wait(3)
        ),
        &g,
        &[("created", 1), ("~ src/live.txt", 2), ("- src/live.txt", 3)],
    );
    assert!(shown.contains("    ~ src/live.txt"), "{shown}");
    assert!(shown.contains("    - src/live.txt"), "{shown}");
    assert!(
        !shown.contains("~ target"),
        "build outputs are not shown: {shown}"
    );
}

#[test]
fn watchers_are_told_when_more_changed_than_is_listed() {
    let c = Cluster::start();
    let _w = c.join_worker("w");
    // A directory of 700 files moved in at once: inotify names the directory, the worker
    // lists its files up to what one message holds and says the list is cut.
    let g = Gates::new();
    let shown = watched(
        &c,
        "many-plan.json",
        &format!(
            "{}; t=$(mktemp -d); mkdir \"$t/gen\"; for i in $(seq 700); do echo x > \"$t/gen/f$i\"; done; mv \"$t/gen\" gen; rmdir \"$t\"; {}",
            g.wait(1, Duration::from_secs(60)),
            g.wait(2, Duration::from_secs(60))
        ),
        &g,
        &[("created", 1), ("more files changed than are listed", 2)],
    );
    assert!(shown.contains("    ~ gen/f"), "{shown}");
    assert!(
        shown.contains("    … more files changed than are listed here"),
        "{shown}"
    );
}

#[test]
fn a_task_starts_from_a_directory_on_its_worker_without_resending_it() {
    let llm = FakeLlm::script(vec![
        FakeReply::tool_call("read_file", json!({"path": "app/main.txt"})),
        FakeReply::write("app/main.txt", "changed by the agent\n"),
        FakeReply::finish("done"),
    ]);
    let c = with_model(&llm);
    // The worker's owner lets the brain import below the test's directory.
    let roots = c.dir.display().to_string();
    let w = c.join_worker_with("laptop", &[("TETHER_WORKER_IMPORT_ROOTS", &roots)]);
    let project = c.dir.join("project");
    std::fs::create_dir_all(project.join("app")).unwrap();
    std::fs::write(project.join("app/main.txt"), "original\n").unwrap();
    // 200 KB that does not compress: sending it would show.
    std::fs::write(project.join("data.bin"), testkit::random::noise(200_000)).unwrap();
    let id = c
        .agent()
        .worker("laptop")
        .args(&["--dir", project.to_str().unwrap()])
        .start("change main");
    c.wait_status(&id, &["finished"], Duration::from_secs(30));
    assert!(
        llm.requests()[1].body["messages"]
            .to_string()
            .contains("original")
    );
    // The agent changed its copy; the project directory is untouched.
    assert_eq!(
        read(&c, &w.id, &id, "app/main.txt").as_deref(),
        Some("changed by the agent\n")
    );
    assert_eq!(
        std::fs::read_to_string(project.join("app/main.txt")).unwrap(),
        "original\n"
    );
    let log = c.task_log_json(&id);
    let seeded = log.iter().find(|r| r["kind"] == "barrier").unwrap();
    assert!(
        testkit::json_u64(&seeded["wire_bytes"]).unwrap() < 20_000,
        "the copy on the same machine re-sent the files: {seeded}"
    );
    // The worker's own state (its key) cannot be imported.
    let out = c
        .agent()
        .worker("laptop")
        .args(&["--dir", c.dir.join("laptop").to_str().unwrap()])
        .try_start("steal");
    assert_failed_saying(&out, "refusing to import");
}

#[test]
fn failover_and_moves_go_only_to_workers_with_the_required_labels() {
    let c = Cluster::start_with(BrainOptions {
        extra_args: vec!["--failover-after".into(), "1s".into()],
        ..Default::default()
    });
    let mut gpu1 = c.join_worker_labeled("gpu1", &["gpu=yes"]);
    let _cpu = c.join_worker_labeled("cpu", &["gpu=no"]);
    let gpu2 = c.join_worker_labeled("gpu2", &["gpu=yes"]);
    let plan = tree_plan(&c, "0.3");
    // No worker named: one with the label is picked.
    let out = c.brain_cli(&[
        "run",
        "--plan",
        plan.to_str().unwrap(),
        "--require-label",
        "gpu=yes",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let on = c
        .task_log_json(&id)
        .iter()
        .find(|r| r["kind"] == "worker_assigned")
        .map(|r| r["worker"].as_str().unwrap().to_string())
        .unwrap();
    assert!(on == gpu1.id || on == gpu2.id, "placed on {on}");
    // A move to a worker without the label is refused.
    let out = c.brain_cli(&["task", "move", &id, "--to", "cpu"]);
    assert_failed_saying(&out, "does not have the labels");
    // Killing the worker it runs on fails it over to the other gpu worker, never to cpu.
    c.wait_records(&id, "tool_call_completed", 2, Duration::from_secs(30));
    let other = if on == gpu1.id {
        gpu1.kill();
        gpu2.id.clone()
    } else {
        let mut g2 = gpu2;
        g2.kill();
        gpu1.id.clone()
    };
    c.wait_status(&id, &["finished"], Duration::from_secs(60));
    let log = c.task_log_json(&id);
    let moved = of_kind(&log, "move_completed");
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0]["to"], other.as_str());
}

/// `cp -p`, `tar x` and `rsync -t` rewrite a file and put its old mtime back: the same size,
/// mtime and inode. The change must still reach the mirror (the scanner's stamp holds the
/// ctime, which nothing can set back) through the full walk a move's last barrier makes, and
/// the target must get the new bytes.
#[test]
fn a_same_size_rewrite_with_its_old_mtime_put_back_reaches_the_mirror_and_survives_a_move() {
    let c = Cluster::start();
    let mut a = c.join_worker("a");
    let b = c.join_worker("b");
    // The second step is settled by its check when its worker dies under it.
    let steps = json!({"steps": [
        {"run": ["sh", "-c", "printf 'version 1' > f.txt; touch -d @1000000000 f.txt"]},
        {"run": ["sleep", "3"], "check": ["true"]},
        {"run": ["sleep", "3"]},
        {"run": ["cat", "f.txt"]},
    ]});
    let plan = plan_file(&c, "rewrite-plan.json", steps);
    let id = c.run_plan(&plan, "a");
    c.wait_records(&id, "barrier", 1, Duration::from_secs(30));
    // While a is down (nothing watches the workspace, so only a whole walk can tell):
    // rewritten in place, its mtime put back.
    a.kill();
    let file = a.state.join(format!(
        "workspaces/task-{}/f.txt",
        id.trim_start_matches("t-")
    ));
    let old = std::fs::metadata(&file).unwrap();
    std::fs::write(&file, "version 2").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(old.modified().unwrap())
        .unwrap();
    let new = std::fs::metadata(&file).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (new.len(), new.mtime(), new.mtime_nsec(), new.ino()),
        (old.len(), old.mtime(), old.mtime_nsec(), old.ino())
    );
    // Back, a walks the whole tree at its next barrier: the ctime gives the rewrite away.
    c.restart_worker(&mut a);
    c.wait_records(&id, "barrier", 2, Duration::from_secs(60));
    assert!(
        a.log_text().contains("barrier full=true"),
        "the barrier after the restart did not walk: {}",
        a.log_text()
    );
    move_to(&c, &id, "b");
    c.wait_status(&id, &["finished"], Duration::from_secs(60));
    assert_eq!(read(&c, &b.id, &id, "f.txt").as_deref(), Some("version 2"));
    let log = c.task_log_json(&id);
    let printed = outputs(&log);
    assert!(
        printed.iter().any(|o| o.contains("version 2")),
        "the last step ran on the moved workspace: {printed:?}"
    );
    assert!(log.iter().any(|r| r["kind"] == "move_completed"));
}

#[test]
fn a_move_back_to_a_warm_worker_sends_only_what_changed_there() {
    let c = Cluster::start();
    let a = c.join_worker("a");
    let _b = c.join_worker("b");
    // 300 files of 2 kB of noise (so nothing compresses them away), then, on b, a few
    // changes of every kind; the task ends back on a. Each move is asked while a step
    // waits at a gate, and happens when that step ends.
    let g = Gates::new();
    let steps = json!({"steps": [
        {"run": ["sh", "-c", "for d in 0 1 2; do mkdir -p d$d/sub; for i in $(seq 1 100); do head -c 2000 /dev/urandom > d$d/sub/f$i.bin; done; done; echo one > notes.txt; echo gone > old.txt"]},
        g.step(1, "true"),
        {"run": ["sh", "-c", "echo two >> notes.txt; rm old.txt; rm -r d2; mkdir -p new/deep; echo n > new/deep/n.txt; printf '#!/bin/sh\\n' > run.sh; chmod +x run.sh; ln -s notes.txt link"]},
        g.step(2, "true"),
        {"run": ["sh", "-c", "cat notes.txt new/deep/n.txt; test -x run.sh; test -L link; test ! -e old.txt; test ! -e d2; ls d0/sub | wc -l"]}
    ]});
    let plan = plan_file(&c, "warm-plan.json", steps);
    let id = c.run_plan(&plan, "a");
    c.move_at_gate(&id, 2, "b", &g, 1);
    c.wait_records(&id, "move_completed", 1, Duration::from_secs(60));
    c.move_at_gate(&id, 4, "a", &g, 2);
    c.wait_status(&id, &["finished"], Duration::from_secs(60));
    let log = c.task_log_json(&id);
    let moves = of_kind(&log, "move_completed");
    assert_eq!(moves.len(), 2, "{log:?}");
    let (cold, warm) = (
        testkit::json_u64(&moves[0]["wire_bytes"]).unwrap(),
        testkit::json_u64(&moves[1]["wire_bytes"]).unwrap(),
    );
    assert!(cold > 500_000, "the cold move sent the tree: {cold} bytes");
    assert!(
        warm < 4_000,
        "the warm move sent {warm} bytes for a few small changes"
    );
    assert!(
        a.log_text().contains("warm=true"),
        "a did not take the delta: {}",
        a.log_text()
    );
    // The last call ran on a and saw b's changes, and a's disk is what the mirror holds.
    let last = log
        .iter()
        .rev()
        .find(|r| r["kind"] == "tool_call_completed")
        .unwrap();
    assert_eq!(last["result"]["exit_code"], 0, "{last}");
    let said: String = outputs(&log).concat();
    assert!(said.ends_with("one\ntwo\nn\n100\n"), "{said:?}");
    assert_eq!(
        read(&c, &a.id, &id, "notes.txt").as_deref(),
        Some("one\ntwo\n")
    );
    assert_eq!(read(&c, &a.id, &id, "old.txt"), None);
    assert_eq!(read(&c, &a.id, &id, "d2/sub/f1.bin"), None);
    assert_eq!(
        read(&c, &a.id, &id, "new/deep/n.txt").as_deref(),
        Some("n\n")
    );
    let ws = a
        .state
        .join(format!("workspaces/task-{}", id.trim_start_matches("t-")));
    let mut s = shared::scan::Scanner::new(&ws, shared::manifest::Rules::default());
    assert_eq!(
        s.scan().unwrap().root_hash(),
        last_root(&log),
        "a full walk of a's workspace disagrees with the mirror"
    );
}
