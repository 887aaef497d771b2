//! Agent benchmark: the agent on a real local model, beside mini-swe-agent and a one-shot
//! baseline, in the same run, on the same one-bug Python tasks. Prints figures; never fails on
//! a result or a timing, only on a broken setup.
//!
//!     bash ../shared/llm/setup.sh && bash ../shared/llm/start.sh   # see README.md
//!     cargo build --release --workspace && cargo bench -p brain --bench agent
//!
//! Tasks are the directories under `benches/agent/tasks/`: a module with one bug, its check
//! `test_<x>.py` (fails as shipped) and a README. Each attempt starts from a fresh one-commit
//! git repository of the task. Per task and attempt:
//!
//! - **Tether**: a real brain and a real local worker (testkit's `Cluster`); `brain run --git
//!   REPO --check "python3 test_x.py" --protect "test_*.py" --permission full` with step,
//!   token and wall-time budgets. Its claim is the task's final status (`finished` verified or
//!   not, `stalled`, `stuck`, `budget_exhausted`, `failed`).
//! - **mini-swe-agent**: its text-based config and non-interactive agent driving the same model
//!   through the same server (`benches/agent/msa_driver.py`), on a fresh copy; claim =
//!   submitted. Skipped, with how to install it, when its Python cannot import it.
//! - **one-shot**: one chat request with the module and the failing check's output; the whole
//!   corrected file is written back.
//!
//! Solved is decided here, apart from any claim: the final files (for Tether, the worker's
//! workspace on disk) with the original test files put back over them, and the check run
//! again; exit 0 is solved. A claim of success whose files fail that check is a *false
//! success*.
//!
//! Tasks with a `.bench-check` file (the check command, then `protect GLOB` lines) need not
//! be Python: `jsslug` runs under Node, `rsclamp` under rustc.
//!
//! Rows: `tether-before` (another build's binaries, `AGENT_BENCH_BASELINE=DIR`: Tether as it
//! was), `tether` (this build, free text), `tether-json` (this build, `constrain =
//! "json_schema"`), `msa`, `oneshot`; and, when asked for, `tether-attempts` (this build,
//! `--attempts N` over N workers of its own per job, solved judged on the task's result as
//! `brain task export` gives it; the run prints its solved rate and its median wall time
//! against the `tether` row's, on the same tasks).
//!
//! Environment: `AGENT_BENCH_N` attempts per task (1), `AGENT_BENCH_JOBS` tasks at once (1;
//! each has a worker of its own, and the model server needs as many slots: wall times then
//! include waiting for the shared model), `AGENT_BENCH_TASKS` task names
//! (comma-separated; all), `AGENT_BENCH_HARNESSES`
//! (`tether-before,tether,tether-json,msa,oneshot`; add `tether-attempts` for attempts),
//! `AGENT_BENCH_ATTEMPTS` attempts in that row (4: the model server needs jobs × 4 slots for
//! them to run at once, `LLM_SLOTS`), `AGENT_BENCH_STEPS`
//! model calls per attempt (10), `AGENT_BENCH_WALL` seconds per attempt (600),
//! `AGENT_BENCH_MAX_TOKENS` tokens per model answer (1024), `AGENT_BENCH_ASSISTS` (`brain run
//! --assists` for this build's rows: the ablation of the loop's assists, e.g. `small,-edits`), `AGENT_BENCH_LLM_URL`
//! (`http://127.0.0.1:8088/v1`), `AGENT_BENCH_MODEL` (`qwen2.5-coder-1.5b`),
//! `AGENT_BENCH_CTX` (16384), `AGENT_BENCH_MSA_PYTHON` (`/opt/msa-venv/bin/python`),
//! `AGENT_BENCH_OUT` (where logs and trajectories go; `target/agent-bench/<unix time>`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use testkit::{BrainOptions, Cluster};

#[path = "agent/harness.rs"]
mod harness;
use harness::*;
#[path = "agent/report.rs"]
mod report;
use report::*;

fn env_or(k: &str, d: &str) -> String {
    std::env::var(k)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| d.to_string())
}

fn env_num<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(d)
}

/// The run's settings, from the environment.
struct Settings {
    /// (task, attempt) units run at once.
    jobs: usize,
    n: usize,
    steps: u32,
    wall: Duration,
    max_tokens: u32,
    url: String,
    model: String,
    ctx: u32,
    msa_python: String,
    out: PathBuf,
    harnesses: Vec<String>,
    /// Attempts per task in the `tether-attempts` row, each on a worker of its own.
    attempts: u32,
    /// `brain run --assists` for this build's rows (`AGENT_BENCH_ASSISTS`, e.g. `small,-edits`
    /// for the ablation); unset: the model's default.
    assists: Option<String>,
}

impl Settings {
    fn from_env() -> Self {
        let out = std::env::var_os("AGENT_BENCH_OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs();
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../target/agent-bench")
                    .join(secs.to_string())
            });
        Self {
            n: env_num("AGENT_BENCH_N", 1usize).max(1),
            jobs: env_num("AGENT_BENCH_JOBS", 1usize).clamp(1, 16),
            steps: env_num("AGENT_BENCH_STEPS", 10u32).max(1),
            wall: Duration::from_secs(env_num("AGENT_BENCH_WALL", 600u64).max(30)),
            max_tokens: env_num("AGENT_BENCH_MAX_TOKENS", 1024u32).max(64),
            url: env_or("AGENT_BENCH_LLM_URL", "http://127.0.0.1:8088/v1")
                .trim_end_matches('/')
                .to_string(),
            model: env_or("AGENT_BENCH_MODEL", "qwen2.5-coder-1.5b"),
            ctx: env_num("AGENT_BENCH_CTX", 16384u32),
            msa_python: env_or("AGENT_BENCH_MSA_PYTHON", "/opt/msa-venv/bin/python"),
            attempts: env_num("AGENT_BENCH_ATTEMPTS", 4u32).clamp(2, 16),
            assists: std::env::var("AGENT_BENCH_ASSISTS")
                .ok()
                .filter(|a| !a.trim().is_empty()),
            out,
            harnesses: env_or(
                "AGENT_BENCH_HARNESSES",
                "tether-before,tether,tether-json,msa,oneshot",
            )
            .split(',')
            .map(|s| s.trim().to_lowercase())
            .filter(|s| !s.is_empty())
            .collect(),
        }
    }

    fn wants(&self, h: &str) -> bool {
        self.harnesses.iter().any(|x| x == h)
    }
}

/// One task: its shipped files.
struct Task {
    name: String,
    dir: PathBuf,
    /// The source files (text files that are not tests, nor the README nor `.bench-check`).
    sources: Vec<String>,
    /// The test files, put back before every independent check.
    tests: Vec<String>,
    /// What `--protect` is given (globs).
    protect: Vec<String>,
    /// The check command, e.g. `python3 test_stats.py`.
    check: String,
}

impl Task {
    fn goal(&self) -> String {
        match &self.sources[..] {
            // The first tasks name their one module, as they always have.
            [one] if one.ends_with(".py") && self.protect == ["test_*.py"] => format!(
                "The check `{}` fails. Find the bug in {one} and fix it so that the check passes. \
                 Do not change the test file.",
                self.check
            ),
            _ => format!(
                "The check `{}` fails. Find the bug and fix it so that the check passes. Do not \
                 change the tests.",
                self.check
            ),
        }
    }
}

/// The files under `dir`, relative, sorted (no `.git`, no `__pycache__`).
fn files_of(dir: &Path, rel: &str, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir.join(rel)).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == ".git" || name == "__pycache__" {
            continue;
        }
        let path = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            files_of(dir, &path, out);
        } else {
            out.push(path);
        }
    }
    out.sort();
}

fn load_tasks() -> Vec<Task> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/agent/tasks");
    let want: Vec<String> = env_or("AGENT_BENCH_TASKS", "")
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("reading {}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let mut tasks = Vec::new();
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if !want.is_empty() && !want.contains(&name) {
            continue;
        }
        let mut files = Vec::new();
        files_of(&dir, "", &mut files);
        // `.bench-check`: the check command, then `protect GLOB` lines (as `.tether/check`);
        // without it, a Python task: `python3 test_x.py`, the tests `test_*.py`.
        let (check, protect) = match std::fs::read_to_string(dir.join(".bench-check")) {
            Ok(text) => {
                let mut check = String::new();
                let mut protect = Vec::new();
                for l in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                    match l.strip_prefix("protect ") {
                        Some(g) => protect.push(g.trim().to_string()),
                        None if check.is_empty() => check = l.to_string(),
                        None => {}
                    }
                }
                (check, protect)
            }
            Err(_) => {
                let tests: Vec<&String> = files
                    .iter()
                    .filter(|f| f.starts_with("test_") && f.ends_with(".py"))
                    .collect();
                assert!(
                    tests.len() == 1,
                    "task {name}: want one test_*.py or a .bench-check"
                );
                (
                    format!("python3 {}", tests[0]),
                    vec!["test_*.py".to_string()],
                )
            }
        };
        let globs: Vec<globset::GlobMatcher> = protect
            .iter()
            .map(|g| globset::Glob::new(g).expect("a glob").compile_matcher())
            .collect();
        let (tests, sources): (Vec<String>, Vec<String>) = files
            .into_iter()
            .filter(|f| f != ".bench-check" && !f.to_ascii_lowercase().starts_with("readme"))
            .partition(|f| globs.iter().any(|g| g.is_match(f)));
        assert!(
            !check.is_empty() && !tests.is_empty() && !sources.is_empty(),
            "task {name}: a check, tests and sources"
        );
        tasks.push(Task {
            check,
            protect,
            sources,
            tests,
            name,
            dir,
        });
    }
    for w in &want {
        assert!(
            tasks.iter().any(|t| &t.name == w),
            "AGENT_BENCH_TASKS names {w}, which is not under {}",
            root.display()
        );
    }
    assert!(!tasks.is_empty(), "no tasks under {}", root.display());
    tasks
}

/// Runs a command to completion; panics (broken setup) if it cannot be started.
fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Runs a command with a deadline, killing it after `timeout`. Returns (exit code or None if
/// killed, stdout+stderr).
fn run_timeout(cmd: &mut Command, timeout: Duration) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (o, e) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&o).unwrap())
        .stderr(std::fs::File::create(&e).unwrap())
        .spawn()
        .unwrap_or_else(|err| panic!("cannot run {cmd:?}: {err}"));
    let deadline = Instant::now() + timeout;
    let code = loop {
        if let Ok(Some(st)) = child.try_wait() {
            break st.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut text = std::fs::read_to_string(&o).unwrap_or_default();
    text.push_str(&std::fs::read_to_string(&e).unwrap_or_default());
    (code, text)
}

/// Copies the regular files of `from` into `to`, recursively, leaving out `.git`,
/// `__pycache__` and the bench's own `.bench-check`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let name = e.file_name();
        if name == ".git" || name == "__pycache__" || name == ".bench-check" {
            continue;
        }
        let (src, dst) = (e.path(), to.join(&name));
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            copy_tree(&src, &dst);
        } else if ft.is_file() {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// A fresh one-commit git repository of the task at `dest`.
fn make_repo(task: &Task, dest: &Path) {
    let _ = std::fs::remove_dir_all(dest);
    copy_tree(&task.dir, dest);
    let git = |args: &[&str]| {
        let out = run(Command::new("git")
            .args([
                "-c",
                "user.name=bench",
                "-c",
                "user.email=bench@localhost",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(dest));
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            testkit::text(&out)
        );
    };
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", &format!("{}: one bug", task.name)]);
}

/// The independent check: `files` copied aside, the task's original tests put back over
/// them, the check run. Returns (passed, the check's output).
fn verify(task: &Task, files: &Path) -> (bool, String) {
    let tmp = tempfile::tempdir().expect("temp dir");
    if files.is_dir() {
        copy_tree(files, tmp.path());
    }
    for t in &task.tests {
        let to = tmp.path().join(t);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(task.dir.join(t), to).unwrap();
    }
    let (code, out) = run_timeout(
        Command::new("sh")
            .args(["-c", &task.check])
            .current_dir(tmp.path())
            .env("PYTHONDONTWRITEBYTECODE", "1"),
        Duration::from_secs(60),
    );
    (code == Some(0), out)
}

/// Run as root, the worker runs a task's commands as an unprivileged user of its own: a
/// check whose tools that user cannot reach (rustup's `rustc` under a `/root` of mode 700)
/// fails under Tether for a reason that is not the agent's. Returns, per such task, the
/// check's output run as `nobody` on the shipped files, so the run says so up front.
fn unreachable_checks(tasks: &[Task]) -> Vec<(String, String)> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for t in tasks {
        let tmp = tempfile::tempdir().expect("temp dir");
        copy_tree(&t.dir, tmp.path());
        let _ = run(Command::new("chmod").args(["-R", "a+rwX"]).arg(tmp.path()));
        let _ = run(Command::new("chmod").arg("a+rx").arg(tmp.path()));
        let (code, text) = run_timeout(
            Command::new("setpriv")
                .args([
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    "sh",
                    "-c",
                ])
                .arg(&t.check)
                .current_dir(tmp.path())
                .env("TMPDIR", tmp.path())
                .env("PYTHONDONTWRITEBYTECODE", "1"),
            Duration::from_secs(60),
        );
        if matches!(code, Some(126 | 127))
            || text.contains("Permission denied")
            || text.contains("not found")
        {
            out.push((t.name.clone(), text.trim().to_string()));
        }
    }
    out
}

/// One attempt of one harness on one task.
#[derive(Clone, Debug)]
struct Attempt {
    task: String,
    /// What the harness said happened, e.g. `finished/verified`, `submitted`, `stuck`.
    claim: String,
    /// The harness claimed the task done.
    claimed: bool,
    solved: bool,
    calls: u64,
    tokens: u64,
    wall: Duration,
    note: String,
}

impl Attempt {
    fn false_success(&self) -> bool {
        self.claimed && !self.solved
    }
}

fn progress(h: &str, i: usize, a: &Attempt) {
    println!(
        "[{h:<8}] {:<10} #{i}: {:<26} solved={:<3} calls={:<3} tokens={:<6} wall={:>6.1}s{}{}",
        a.task,
        a.claim,
        if a.solved { "yes" } else { "no" },
        a.calls,
        a.tokens,
        a.wall.as_secs_f64(),
        if a.false_success() {
            "  FALSE SUCCESS"
        } else {
            ""
        },
        if a.note.is_empty() {
            String::new()
        } else {
            format!(
                "  ({})",
                a.note.split_whitespace().collect::<Vec<_>>().join(" ")
            )
        }
    );
}

/// The brains and workers of the Tether rows. (Fields drop in this order: workers before
/// their brains.)
struct Fleet {
    /// Per job, a pool of workers of its own for the attempts row (label `pool=aJ`), one per
    /// attempt.
    pools: Vec<testkit::Worker>,
    /// One worker per job on each brain, so attempts that run at once never share one.
    base_workers: Vec<testkit::Worker>,
    now_workers: Vec<testkit::Worker>,
    /// Tether as it was: another build's binaries (`AGENT_BENCH_BASELINE=DIR`, e.g. the commit
    /// before this work built into its own target/release), on a brain of its own.
    baseline: Option<Cluster>,
    /// This build's brain.
    cluster: Option<Cluster>,
}

impl Fleet {
    fn start(s: &Settings) -> Self {
        let cluster = (s.wants("tether") || s.wants("tether-json") || s.wants("tether-attempts"))
            .then(|| {
                Cluster::start_with(BrainOptions {
                    config: Some(brain_config(s, true)),
                    lost_after: Duration::from_secs(30),
                    ..BrainOptions::default()
                })
            });
        let baseline = std::env::var_os("AGENT_BENCH_BASELINE")
            .filter(|_| s.wants("tether-before"))
            .map(|dir| {
                Cluster::start_with(BrainOptions {
                    config: Some(brain_config(s, false)),
                    lost_after: Duration::from_secs(30),
                    bin_dir: Some(PathBuf::from(dir)),
                    ..BrainOptions::default()
                })
            });
        let workers = |c: &Option<Cluster>, name: &str| -> Vec<testkit::Worker> {
            c.as_ref()
                .map(|c| {
                    (0..s.jobs)
                        .map(|j| c.join_worker(&format!("{name}-{j}")))
                        .collect()
                })
                .unwrap_or_default()
        };
        let (now_workers, base_workers) = (
            workers(&cluster, "bench-worker"),
            workers(&baseline, "bench-before"),
        );
        let pools: Vec<testkit::Worker> = match &cluster {
            Some(c) if s.wants("tether-attempts") => (0..s.jobs)
                .flat_map(|j| (0..s.attempts).map(move |k| (j, k)))
                .map(|(j, k)| {
                    c.join_worker_labeled(&format!("bench-pool{j}-{k}"), &[&format!("pool=a{j}")])
                })
                .collect(),
            _ => vec![],
        };
        Self {
            pools,
            base_workers,
            now_workers,
            baseline,
            cluster,
        }
    }
}

/// What every job runs its units with.
struct Job<'a> {
    s: &'a Settings,
    fleet: &'a Fleet,
    work: &'a Path,
    /// The model as free text, and constrained to the JSON schema.
    plain: String,
    json: String,
    /// Whether the mini-swe-agent row runs.
    msa: bool,
}

impl Job<'_> {
    /// Attempt `i` at `task` by each row in turn, on job `j`'s workers; each attempt is given
    /// to `keep` with its row's name and the name its progress line shows.
    fn run_unit(
        &self,
        j: usize,
        task: &Task,
        i: usize,
        keep: impl Fn(&'static str, &str, Attempt),
    ) {
        let (s, work) = (self.s, self.work);
        let (cluster, baseline) = (&self.fleet.cluster, &self.fleet.baseline);
        let (w_now, w_base) = (
            self.fleet.now_workers.get(j),
            self.fleet.base_workers.get(j),
        );
        let (plain, json) = (&self.plain, &self.json);
        // Each row starts on an idle model server.
        let keep = |row: &'static str, shown: &str, a: Attempt| {
            keep(row, shown, a);
            harness::wait_idle(s);
        };
        harness::wait_idle(s);
        if let (Some(c), Some(w)) = (baseline, w_base) {
            let a = tether("tether-before", s, c, On::Worker(w), plain, task, i, work);
            keep("before", "before", a);
        }
        if let (Some(c), Some(w), true) = (cluster, w_now, s.wants("tether")) {
            let a = tether("tether", s, c, On::Worker(w), plain, task, i, work);
            keep("tether", "tether", a);
        }
        if let (Some(c), Some(w), true) = (cluster, w_now, s.wants("tether-json")) {
            let a = tether("tether-json", s, c, On::Worker(w), json, task, i, work);
            keep("json", "t-json", a);
        }
        if let (Some(c), true) = (cluster, s.wants("tether-attempts")) {
            let pool = format!("a{j}");
            let on = On::Attempts(&pool, s.attempts);
            let a = tether("tether-attempts", s, c, on, plain, task, i, work);
            keep("attempts", "t-att", a);
        }
        if self.msa {
            keep("msa", "msa", msa(s, task, i, work));
        }
        if s.wants("oneshot") {
            keep("oneshot", "oneshot", oneshot(s, task, i, work));
        }
    }

    /// Each (task, attempt) runs its rows in turn; `AGENT_BENCH_JOBS` of them at once (the
    /// model server needs as many slots, `LLM_SLOTS`). Returns (unit, row, attempt), sorted by
    /// unit.
    fn run_all(&self, tasks: &[Task]) -> Vec<(usize, &'static str, Attempt)> {
        let units: Vec<(&Task, usize)> = tasks
            .iter()
            .flat_map(|t| (1..=self.s.n).map(move |i| (t, i)))
            .collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let done = std::sync::Mutex::new(Vec::<(usize, &str, Attempt)>::new());
        std::thread::scope(|scope| {
            for j in 0..self.s.jobs {
                let (units, next, done) = (&units, &next, &done);
                scope.spawn(move || {
                    loop {
                        let u = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let Some(&(task, i)) = units.get(u) else {
                            return;
                        };
                        self.run_unit(j, task, i, |row, shown, a| {
                            progress(shown, i, &a);
                            shared::locks::Lock::locked(done).push((u, row, a));
                        });
                    }
                });
            }
        });
        let mut done = done
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        done.sort_by_key(|(u, _, _)| *u);
        done
    }
}

/// Panics (broken setup) unless git and python3 run, every task's check fails on its shipped
/// files, and the model server serves the model. Returns why the mini-swe-agent row is
/// skipped, if it is.
fn check_setup(s: &Settings, tasks: &[Task]) -> Option<String> {
    std::fs::create_dir_all(&s.out).expect("output dir");
    for tool in ["git", "python3"] {
        assert!(
            Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success()),
            "{tool} is needed on this machine"
        );
    }
    for t in tasks {
        let (ok, out) = verify(t, &t.dir);
        assert!(
            !ok,
            "task {}: its check passes on the shipped files:\n{out}",
            t.name
        );
    }
    check_server(s);
    if s.wants("msa") { msa_missing(s) } else { None }
}

/// What the run is, and what may keep a row from its figures.
fn print_header(s: &Settings, tasks: &[Task], msa_skip: &Option<String>) {
    println!(
        "agent benchmark: {} task(s) × {} attempt(s), {} at once; model {} at {}; at most {} \
         model calls, {} s and {} tokens an answer per attempt; logs in {}",
        tasks.len(),
        s.n,
        s.jobs,
        s.model,
        s.url,
        s.steps,
        s.wall.as_secs(),
        s.max_tokens,
        s.out.display()
    );
    if let Some(a) = &s.assists {
        println!("this build's rows run with --assists {a}");
    }
    if let Some(why) = msa_skip {
        println!("{why}");
    } else if s.wants("msa") {
        println!("mini-swe-agent {} ({})", msa_version(s), s.msa_python);
    }
    println!();

    if s.wants("tether") || s.wants("tether-json") || s.wants("tether-before") {
        for (name, text) in unreachable_checks(tasks) {
            println!(
                "WARNING task {name}: its check cannot run as an unprivileged user here, and \
                 the worker runs commands as one, so Tether rows fail it for a reason not the \
                 agent's (install the tools where every user can run them, e.g. Debian's \
                 `rustc` for rsclamp):\n  {}",
                text.lines().take(3).collect::<Vec<_>>().join("\n  ")
            );
        }
    }
}

fn main() {
    let s = Settings::from_env();
    let tasks = load_tasks();
    let msa_skip = check_setup(&s, &tasks);
    print_header(&s, &tasks, &msa_skip);
    let mut fleet = Fleet::start(&s);
    let work = tempfile::Builder::new()
        .prefix("agent-bench-")
        .tempdir()
        .expect("temp dir");
    let job = Job {
        s: &s,
        fleet: &fleet,
        work: work.path(),
        plain: format!("openai:{}", s.model),
        json: format!("openai:{}-json", s.model),
        msa: s.wants("msa") && msa_skip.is_none(),
    };
    let results = Results::of(&job.run_all(&tasks));
    let msa_ran = job.msa;
    drop(std::mem::take(&mut fleet.pools));

    print_report(&s, &tasks, &fleet, msa_ran, &results);
    print_attempts_against_once(&s, &results);
    print_false_successes(&s, &results);
    if let Some(why) = &msa_skip {
        println!("\n{why}");
    }
    println!("\nlogs and trajectories: {}", s.out.display());
}
