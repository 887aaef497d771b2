//! Workspace sync benchmark: Tether's import, barriers and moves against rsync, side by side
//! in one run on a seeded synthetic tree, with ratios. Prints figures; never fails on a timing.
//!
//!     cargo build --release --workspace && cargo bench -p brain --bench sync
//!
//! The tree (10,000 files, ~200 MB, mixed sizes, some duplicate contents; and 100,000 small
//! files for the barrier row) goes on a tmpfs when one can be mounted (we are root), since
//! disk write-back makes full-copy timings too noisy to compare. The brain and two workers are
//! the release binaries, as processes on loopback; the timings of barriers and moves come from
//! the task's own log (ms resolution). The rsync baseline is local `rsync -a` (no sshd here);
//! rows are skipped, with the reason, when rsync is missing.

use shared::locks::Lock;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use testkit::{BrainOptions, Cluster};

/// Writes `files` files under `root` totalling about `total` bytes: mostly small text-like
/// files, some large, one in twenty a duplicate of an earlier one.
fn generate(root: &Path, files: usize, total: u64, seed: u64) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut written = 0u64;
    let mut samples: Vec<Vec<u8>> = Vec::new();
    // The size mix below averages 1.8 × `avg`.
    let avg = total * 10 / 18 / files as u64;
    for i in 0..files {
        let dir = root.join(format!("d{:03}/s{:02}", i % 250, (i / 250) % 40));
        std::fs::create_dir_all(&dir).unwrap();
        let data = if i % 20 == 19 && !samples.is_empty() {
            samples[rng.random_range(0..samples.len())].clone()
        } else {
            // Sizes spread around the average: many small, a few up to 16x.
            let size = match rng.random_range(0..10) {
                0 => avg * 8 + rng.random_range(0..avg * 8),
                1..=3 => avg + rng.random_range(0..avg),
                _ => rng.random_range(0..=avg / 2),
            } as usize;
            let mut v = Vec::with_capacity(size);
            // Half text-like (compressible), half noise.
            if i % 2 == 0 {
                while v.len() < size {
                    v.extend_from_slice(
                        format!("line {} value {}\n", v.len(), rng.random_range(0..1000))
                            .as_bytes(),
                    );
                }
            } else {
                while v.len() < size {
                    v.extend_from_slice(&rng.random::<u64>().to_le_bytes());
                }
            }
            v.truncate(size);
            if samples.len() < 64 {
                samples.push(v.clone());
            }
            v
        };
        written += data.len() as u64;
        std::fs::write(dir.join(format!("f{i:06}.dat")), &data).unwrap();
    }
    written
}

fn tmpfs(dir: &Path) -> bool {
    std::fs::create_dir_all(dir).unwrap();
    Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=3g", "tmpfs"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success())
}

fn have(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The baseline: `rsync -a` over ssh to a throw-away loopback sshd, or local when there is
/// none.
static SSHD: std::sync::Mutex<Option<testkit::sshd::Sshd>> = std::sync::Mutex::new(None);

fn baseline() -> &'static str {
    if SSHD.locked().is_some() {
        "rsync -a over ssh (loopback sshd)"
    } else {
        "rsync -a (local)"
    }
}

/// `rsync -a --stats SRC/ DST/`: (time, bytes sent).
fn rsync(src: &Path, dst: &Path) -> (Duration, u64) {
    std::fs::create_dir_all(dst).unwrap();
    let mut cmd = Command::new("rsync");
    cmd.arg("-a")
        .arg("--stats")
        .arg(format!("{}/", src.display()));
    match SSHD.locked().as_ref() {
        Some(sshd) => {
            sshd.chown(dst);
            let e = std::iter::once("ssh".to_string())
                .chain(sshd.ssh_args())
                .collect::<Vec<_>>()
                .join(" ");
            cmd.arg("-e")
                .arg(e)
                .arg(format!("{}:{}/", sshd.dest(), dst.display()));
        }
        None => {
            cmd.arg(format!("{}/", dst.display()));
        }
    }
    let t = Instant::now();
    let out = cmd.output().unwrap();
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "rsync: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Total bytes sent: "))
        .map(|n| n.replace(',', "").trim().parse().unwrap_or(0))
        .unwrap_or(0);
    (took, sent)
}

fn ms(d: Duration) -> String {
    format!("{:9.1} ms", d.as_secs_f64() * 1e3)
}

fn mb(b: u64) -> String {
    if b >= 1_000_000 {
        format!("{:8.2} MB", b as f64 / 1e6)
    } else {
        format!("{:8.2} kB", b as f64 / 1e3)
    }
}

fn log(c: &Cluster, id: &str) -> Vec<Value> {
    c.task_log_json(id)
}

fn wait_kind(c: &Cluster, id: &str, kind: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let l = log(c, id);
        if l.iter().filter(|r| r["kind"] == kind).count() >= n {
            return l;
        }
        assert!(
            Instant::now() < deadline,
            "no {kind} in time:\n{}",
            c.brain_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// (at_ms of the nth `a`, at_ms of the first `b` after it) in ms.
fn span(l: &[Value], a: &str, nth: usize, b: &str) -> (u64, Value) {
    let start = l.iter().filter(|r| r["kind"] == a).nth(nth).expect(a);
    let t0 = testkit::json_u64(&start["at_ms"]).unwrap();
    let seq = testkit::json_u64(&start["seq"]).unwrap();
    let end = l
        .iter()
        .find(|r| r["kind"] == b && testkit::json_u64(&r["seq"]).unwrap() > seq)
        .expect(b);
    (testkit::json_u64(&end["at_ms"]).unwrap() - t0, end.clone())
}

/// A replayed model: `n` commands that each append to one file, then finish.
fn transcript(n: usize) -> String {
    let mut lines: Vec<String> = (0..n)
        .map(|i| {
            json!({"message": {"role": "assistant", "content": "", "tool_calls": [{
                "id": format!("c{i}"), "name": "run_command",
                "arguments": json!({"command": format!("echo change-{i} >> d000/s00/f000000.dat")}).to_string()
            }]}, "usage": {"prompt_tokens": 0, "completion_tokens": 0}})
            .to_string()
        })
        .collect();
    lines.push(
        json!({"message": {"role": "assistant", "content": "", "tool_calls": [{
            "id": "fin", "name": "finish", "arguments": "{\"summary\":\"done\"}"
        }]}, "usage": {"prompt_tokens": 0, "completion_tokens": 0}})
        .to_string(),
    );
    lines.join("\n") + "\n"
}

fn approve(c: &Cluster, id: &str, n: usize) {
    wait_kind(c, id, "approval_requested", n);
    let out = c.brain_cli(&["approve", id]);
    assert!(out.status.success(), "{}", testkit::text(&out));
}

/// Where the run's trees are, and whether rsync rows run.
struct Setup {
    base: PathBuf,
    on_tmpfs: bool,
    /// The 10,000-file tree.
    tree: PathBuf,
    rsync_ok: bool,
    /// The replayed model's transcript, and the model that replays it.
    transcript: PathBuf,
    model: String,
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("sync: bench");
        return;
    }
    let s = setup();
    let barrier_10k = tree_10k_rows(&s);
    // (b) again on 100,000 small files: the barrier's cost with the tree's size.
    barrier_100k_row(&s, barrier_10k);
    // Stops the sshd and removes its user.
    drop(SSHD.locked().take());
    if s.on_tmpfs {
        let _ = Command::new("umount").arg("-l").arg(&s.base).status();
    }
    let _ = std::fs::remove_dir_all(&s.base);
}

/// The 10,000-file tree (on a tmpfs when one can be mounted) and the rsync baseline: over ssh
/// to a throw-away sshd when one can be started, else local; none without rsync.
fn setup() -> Setup {
    let base = std::env::temp_dir().join(format!("tether-sync-bench-{}", std::process::id()));
    let on_tmpfs = tmpfs(&base);
    println!(
        "tree on {}",
        if on_tmpfs {
            "a tmpfs"
        } else {
            "disk (no tmpfs could be mounted: timings are noisier)"
        }
    );
    let tree = base.join("tree");
    let t = Instant::now();
    let bytes = generate(&tree, 10_000, 200_000_000, 42);
    println!(
        "generated 10,000 files, {} in {:?}",
        mb(bytes).trim(),
        t.elapsed()
    );
    let rsync_ok = have("rsync");
    if !rsync_ok {
        println!("rsync rows skipped: rsync is not installed (apt-get install rsync)");
    }
    let sshd = testkit::sshd::Sshd::start(&base.join("ssh"));
    if let Err(why) = &sshd {
        println!("rsync over ssh skipped ({why}): the baseline is local rsync");
    }
    *SSHD.locked() = sshd.ok();
    // The tree must be readable by the throw-away user too.
    let _ = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&tree)
        .status();
    println!("baseline: {}", baseline());
    let transcript = base.join("run.jsonl");
    let model = format!("replay:{}", transcript.display());
    Setup {
        base,
        on_tmpfs,
        tree,
        rsync_ok,
        transcript,
        model,
    }
}

/// A brain whose store, and its workers' workspaces, are on the same tmpfs as rsync's copy.
fn cluster(s: &Setup) -> Cluster {
    Cluster::start_with(BrainOptions {
        parent: Some(s.base.clone()),
        ..BrainOptions::default()
    })
}

/// `brain run --detach` of `dir` on worker a with the replayed model; the task's id.
fn run_detached(c: &Cluster, s: &Setup, permission: &str, dir: &Path) -> String {
    let out = c.brain_cli(&[
        "run",
        "--detach",
        "--worker",
        "a",
        "--model",
        &s.model,
        "--permission",
        permission,
        "--dir",
        dir.to_str().unwrap(),
        "bench",
    ]);
    assert!(out.status.success(), "{}", testkit::text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// One row: what, how long, how many bytes.
fn print_row(what: &str, d: Duration, bytes: u64) {
    println!("{what:<58} {} {}", ms(d), mb(bytes));
}

/// The first command's barrier: from the call that wrote a file to the mirror holding it;
/// (time, bytes on the wire).
fn first_barrier(c: &Cluster, id: &str) -> (Duration, u64) {
    let l = wait_kind(c, id, "barrier", 2);
    let (barrier_ms, ev) = span(&l, "tool_call_completed", 0, "barrier");
    (
        Duration::from_millis(barrier_ms),
        testkit::json_u64(&ev["wire_bytes"]).unwrap_or(0),
    )
}

/// The baseline of a barrier: `rsync` of `tree` to `copy` after one file changed in it, its
/// row printed as `what`; its time.
fn rsync_after_one_change(tree: &Path, copy: &Path, what: &str) -> Duration {
    std::fs::write(tree.join("d000/s00/f000000.dat"), b"changed for rsync\n").unwrap();
    let (d, sent) = rsync(tree, copy);
    print_row(what, d, sent);
    d
}

/// Rows (a), (b) and (c) on the 10,000-file tree, with two workers; returns the barrier's
/// time, for the 100,000-file row's ratio.
fn tree_10k_rows(s: &Setup) -> Duration {
    let c = cluster(s);
    // Worker a imports the trees (`brain run --dir`): its owner allows it anywhere.
    let _a = c.join_worker_with("a", &[("TETHER_WORKER_IMPORT_ROOTS", "/")]);
    let _b = c.join_worker("b");
    std::fs::write(&s.transcript, transcript(4)).unwrap();
    let (id, rs_full) = import_row(&c, s);
    let barrier_10k = barrier_10k_row(&c, &id, s);
    move_rows(&c, &id, rs_full);
    c.wait_status(&id, &["finished", "failed"], Duration::from_secs(120));
    // The processes' logs (each barrier's and materialisation's phase timings), if asked for.
    if let Some(dir) = std::env::var_os("TETHER_BENCH_LOGS") {
        let dir = std::path::PathBuf::from(dir);
        let _ = std::fs::create_dir_all(&dir);
        for f in ["brain.log", "a.log", "b.log"] {
            let _ = std::fs::copy(c.dir.join(f), dir.join(f));
        }
    }
    barrier_10k
}

/// (a) Initial import of the tree vs a full rsync to an empty directory. The baseline runs
/// first, while the cluster is idle: after the import, the worker copies the tree into the
/// task's workspace and starts watching it, which would slow rsync down beside it. Returns
/// the task's id and the baseline's (time, bytes sent).
fn import_row(c: &Cluster, s: &Setup) -> (String, Option<(Duration, u64)>) {
    let rs_full = s
        .rsync_ok
        .then(|| rsync(&s.tree, &s.base.join("rsync-copy")));
    let t = Instant::now();
    let id = run_detached(c, s, "ask", &s.tree);
    let import = t.elapsed();
    println!("\n{:<58} {:>12} {:>11}", "", "time", "on the wire");
    let brain_blobs = du(&c.data.join("blobs"));
    print_row(
        "(a) import of the tree into the brain (brain run --dir)",
        import,
        brain_blobs,
    );
    if let Some((d, sent)) = rs_full {
        print_row("    baseline: the tree to an empty directory", d, sent);
        println!(
            "    ratio import / rsync: {:.2}×",
            import.as_secs_f64() / d.as_secs_f64()
        );
    }
    (id, rs_full)
}

/// (b) One changed file: from the call that wrote it to the mirror holding it.
fn barrier_10k_row(c: &Cluster, id: &str, s: &Setup) -> Duration {
    approve(c, id, 1);
    let (barrier, wire) = first_barrier(c, id);
    print_row(
        "(b) one file changed → mirror holds it (barrier, 10k files)",
        barrier,
        wire,
    );
    if s.rsync_ok {
        let d = rsync_after_one_change(
            &s.tree,
            &s.base.join("rsync-copy"),
            "    baseline: incremental, after one change (10k files)",
        );
        println!(
            "    ratio rsync / barrier: {:.1}× (target ≥ 10×)",
            d.as_secs_f64() / barrier.as_secs_f64().max(1e-4)
        );
    }
    barrier
}

/// (c) Move to a cold worker, then back to the warm one holding an older version.
fn move_rows(c: &Cluster, id: &str, rs_full: Option<(Duration, u64)>) {
    approve(c, id, 2);
    wait_kind(c, id, "approval_requested", 3);
    let out = c.brain_cli(&["task", "move", id, "--to", "b"]);
    assert!(out.status.success(), "{}", testkit::text(&out));
    let l = wait_kind(c, id, "move_completed", 1);
    let (cold_ms, ev) = span(&l, "move_started", 0, "move_completed");
    let cold = Duration::from_millis(cold_ms);
    let cold_wire = testkit::json_u64(&ev["wire_bytes"]).unwrap_or(0);
    print_row(
        "(c) move to a cold worker (final barrier + materialise)",
        cold,
        cold_wire,
    );
    if let Some((d, sent)) = rs_full {
        println!(
            "    baseline, the tree to an empty directory: {} {}",
            ms(d).trim(),
            mb(sent).trim()
        );
        println!(
            "    ratio move / rsync: {:.2}× (target ≤ 1.2×)",
            cold.as_secs_f64() / d.as_secs_f64()
        );
    }
    approve(c, id, 3);
    // Back to a, which holds the version from before the last change made on b.
    wait_kind(c, id, "approval_requested", 4);
    let out = c.brain_cli(&["task", "move", id, "--to", "a"]);
    if !out.status.success() {
        println!(
            "    (the task ended before the move back: {})",
            testkit::text(&out).trim()
        );
        return;
    }
    let l = wait_kind(c, id, "move_completed", 2);
    let (warm_ms, ev) = span(&l, "move_started", 1, "move_completed");
    let warm_wire = testkit::json_u64(&ev["wire_bytes"]).unwrap_or(0);
    print_row(
        "    move back to the warm worker (older version there)",
        Duration::from_millis(warm_ms),
        warm_wire,
    );
    println!(
        "    bytes changed since that version: one appended line in one file (target ≤ 100 ms, a few kB)"
    );
    println!(
        "    ratio cold move / warm move: {:.1}× in time, {:.0}× on the wire",
        cold_ms as f64 / (warm_ms as f64).max(1.0),
        cold_wire as f64 / (warm_wire as f64).max(1.0)
    );
    approve(c, id, 4);
}

/// (b) on a tree of 100,000 small files, beside the 10,000-file barrier and rsync.
fn barrier_100k_row(s: &Setup, barrier_10k: Duration) {
    let big = s.base.join("tree100k");
    let t = Instant::now();
    let bytes = generate(&big, 100_000, 200_000_000, 7);
    println!(
        "\ngenerated 100,000 files, {} in {:?}",
        mb(bytes).trim(),
        t.elapsed()
    );
    let c = cluster(s);
    // Worker a imports the trees (`brain run --dir`): its owner allows it anywhere.
    let _a = c.join_worker_with("a", &[("TETHER_WORKER_IMPORT_ROOTS", "/")]);
    std::fs::write(&s.transcript, transcript(1)).unwrap();
    let id = run_detached(&c, s, "full", &big);
    let (barrier, wire) = first_barrier(&c, &id);
    print_row(
        "(b) one file changed → mirror holds it (barrier, 100k files)",
        barrier,
        wire,
    );
    println!(
        "    ratio barrier 100k / barrier 10k: {:.2}× (target ≤ 1.2×)",
        barrier.as_secs_f64() / barrier_10k.as_secs_f64().max(1e-4)
    );
    if s.rsync_ok {
        let copy = s.base.join("rsync-copy100k");
        rsync(&big, &copy);
        let d = rsync_after_one_change(
            &big,
            &copy,
            "    baseline: incremental, after one change (100k files)",
        );
        println!(
            "    ratio rsync / barrier: {:.1}×",
            d.as_secs_f64() / barrier.as_secs_f64().max(1e-4)
        );
    }
}

fn du(dir: &Path) -> u64 {
    fn walk(p: &PathBuf, n: &mut u64) {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                match e.file_type() {
                    Ok(t) if t.is_dir() => walk(&e.path(), n),
                    Ok(_) => *n += e.metadata().map_or(0, |m| m.len()),
                    Err(_) => {}
                }
            }
        }
    }
    let mut n = 0;
    walk(&dir.to_path_buf(), &mut n);
    n
}
