//! Agent benchmark: the agent on a real local model, beside mini-swe-agent and a one-shot
//! baseline, in the same run, on the same one-bug Python tasks. Prints figures; never fails on
//! a result or a timing, only on a broken setup.
//!
//!     bash /work/shared/llm/setup.sh && bash /work/shared/llm/start.sh   # see README.md
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
//! Environment: `AGENT_BENCH_N` attempts per task (1), `AGENT_BENCH_TASKS` task names
//! (comma-separated; all), `AGENT_BENCH_HARNESSES` (`tether,msa,oneshot`), `AGENT_BENCH_STEPS`
//! model calls per attempt (10), `AGENT_BENCH_WALL` seconds per attempt (600),
//! `AGENT_BENCH_MAX_TOKENS` tokens per model answer (1024), `AGENT_BENCH_LLM_URL`
//! (`http://127.0.0.1:8088/v1`), `AGENT_BENCH_MODEL` (`qwen2.5-coder-1.5b`),
//! `AGENT_BENCH_CTX` (16384), `AGENT_BENCH_MSA_PYTHON` (`/opt/msa-venv/bin/python`),
//! `AGENT_BENCH_OUT` (where logs and trajectories go; `target/agent-bench/<unix time>`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use testkit::{BrainOptions, Cluster};

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
            steps: env_num("AGENT_BENCH_STEPS", 10u32).max(1),
            wall: Duration::from_secs(env_num("AGENT_BENCH_WALL", 600u64).max(30)),
            max_tokens: env_num("AGENT_BENCH_MAX_TOKENS", 1024u32).max(64),
            url: env_or("AGENT_BENCH_LLM_URL", "http://127.0.0.1:8088/v1")
                .trim_end_matches('/')
                .to_string(),
            model: env_or("AGENT_BENCH_MODEL", "qwen2.5-coder-1.5b"),
            ctx: env_num("AGENT_BENCH_CTX", 16384u32),
            msa_python: env_or("AGENT_BENCH_MSA_PYTHON", "/opt/msa-venv/bin/python"),
            out,
            harnesses: env_or("AGENT_BENCH_HARNESSES", "tether,msa,oneshot")
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
    /// The module with the bug (the one `.py` file that is not a test).
    module: String,
    /// The test files (`test_*.py`), put back before every independent check.
    tests: Vec<String>,
    /// The check command, e.g. `python3 test_stats.py`.
    check: String,
}

impl Task {
    fn goal(&self) -> String {
        format!(
            "The check `{}` fails. Find the bug in {} and fix it so that the check passes. \
             Do not change the test file.",
            self.check, self.module
        )
    }
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
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|f| f.ends_with(".py"))
            .collect();
        files.sort();
        let (tests, modules): (Vec<String>, Vec<String>) =
            files.into_iter().partition(|f| f.starts_with("test_"));
        assert!(
            tests.len() == 1 && modules.len() == 1,
            "task {name}: want one module and one test_*.py, found {modules:?} and {tests:?}"
        );
        tasks.push(Task {
            check: format!("python3 {}", tests[0]),
            module: modules[0].clone(),
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

/// Copies the regular files of `from` into `to`, recursively, leaving out `.git` and
/// `__pycache__`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let name = e.file_name();
        if name == ".git" || name == "__pycache__" {
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
        std::fs::copy(task.dir.join(t), tmp.path().join(t)).unwrap();
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

// ---------------------------------------------------------------------------------------------
// The model server

fn http() -> (tokio::runtime::Runtime, reqwest::Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(900))
        .build()
        .expect("http client");
    (rt, client)
}

/// Panics (broken setup) unless the server answers `/models` and serves `model`.
fn check_server(s: &Settings) {
    let (rt, client) = http();
    let url = format!("{}/models", s.url);
    let body = rt
        .block_on(async {
            let r = client
                .get(&url)
                .timeout(Duration::from_secs(10))
                .send()
                .await?;
            r.error_for_status()?.text().await
        })
        .unwrap_or_else(|e| {
            panic!(
                "the model server at {url} does not answer ({e}).\n\
                 Start it: LLM_MODEL=/opt/llm/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
                 LLM_ALIAS={} LLM_CTX={} bash /work/shared/llm/start.sh \
                 (built once by `WITH_QWEN15=1 bash /work/shared/llm/setup.sh`), \
                 or point AGENT_BENCH_LLM_URL at another OpenAI-compatible server.",
                s.model, s.ctx
            )
        });
    assert!(
        body.contains(&format!("\"{}\"", s.model)),
        "the server at {url} does not serve the model {} (AGENT_BENCH_MODEL): {body}",
        s.model
    );
}

/// One chat request; returns (the answer's text, total tokens).
fn chat(s: &Settings, messages: serde_json::Value) -> Result<(String, u64), String> {
    let (rt, client) = http();
    let req = serde_json::json!({
        "model": s.model,
        "messages": messages,
        "max_tokens": s.max_tokens,
    });
    let text = rt
        .block_on(async {
            client
                .post(format!("{}/chat/completions", s.url))
                .header("content-type", "application/json")
                .header("authorization", "Bearer sk-no-key-needed")
                .body(req.to_string())
                .send()
                .await?
                .error_for_status()?
                .text()
                .await
        })
        .map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok((answer, v["usage"]["total_tokens"].as_u64().unwrap_or(0)))
}

/// The first fenced block of `text` (a ```python block if there is one).
fn fenced(text: &str) -> Option<String> {
    let blocks: Vec<(String, String)> = text
        .split("```")
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, b)| {
            let (lang, body) = b.split_once('\n').unwrap_or(("", b));
            (lang.trim().to_lowercase(), body.to_string())
        })
        .collect();
    blocks
        .iter()
        .find(|(l, _)| l == "python" || l == "py")
        .or(blocks.first())
        .map(|(_, b)| b.clone())
}

// ---------------------------------------------------------------------------------------------
// One-shot

fn oneshot(s: &Settings, task: &Task, i: usize, work: &Path) -> Attempt {
    let repo = work.join(format!("oneshot-{}-{i}", task.name));
    make_repo(task, &repo);
    let (_, failing) = verify(task, &repo);
    let source = std::fs::read_to_string(repo.join(&task.module)).unwrap();
    let tail: String = {
        let lines: Vec<&str> = failing.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    };
    let prompt = format!(
        "This is {m}:\n\n```python\n{source}```\n\nIts check `{c}` fails:\n\n```\n{tail}\n```\n\n\
         Fix the bug in {m}. Reply with the whole corrected {m} in one ```python fenced block.",
        m = task.module,
        c = task.check,
    );
    let t = Instant::now();
    let r = chat(
        s,
        serde_json::json!([
            {"role": "system", "content": "You are a careful Python programmer."},
            {"role": "user", "content": prompt},
        ]),
    );
    let wall = t.elapsed();
    if let Ok((answer, _)) = &r {
        let _ = std::fs::write(s.out.join(format!("oneshot-{}-{i}.txt", task.name)), answer);
    }
    let (claim, solved, tokens, note) = match r {
        Err(e) => ("error".to_string(), false, 0, e),
        Ok((answer, tokens)) => match fenced(&answer) {
            None => ("no code block".into(), false, tokens, String::new()),
            Some(code) => {
                std::fs::write(repo.join(&task.module), code).unwrap();
                let (ok, _) = verify(task, &repo);
                ("answered".into(), ok, tokens, String::new())
            }
        },
    };
    Attempt {
        task: task.name.clone(),
        claimed: false,
        claim,
        solved,
        calls: 1,
        tokens,
        wall,
        note,
    }
}

// ---------------------------------------------------------------------------------------------
// Tether

fn brain_config(s: &Settings) -> String {
    format!(
        r#"[llm]
default_model = "openai:{m}"
timeout = "600s"
[llm.providers.openai]
base_url = "{url}"
api_key = "sk-bench-local-server-needs-no-key-7f3a9c"
[llm.models."openai:{m}"]
tool_mode = "text"
context_window = {ctx}
max_tokens = {mt}
"#,
        m = s.model,
        url = s.url,
        ctx = s.ctx,
        mt = s.max_tokens
    )
}

fn task_show(c: &Cluster, id: &str) -> Option<serde_json::Value> {
    let out = c.brain_cli(&["task", "show", id, "--json"]);
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

fn tether(
    s: &Settings,
    c: &Cluster,
    worker: &testkit::Worker,
    task: &Task,
    i: usize,
    work: &Path,
) -> Attempt {
    let repo = work.join(format!("tether-{}-{i}", task.name));
    make_repo(task, &repo);
    let steps = s.steps.to_string();
    let wall = format!("{}s", s.wall.as_secs());
    let max_tokens = (u64::from(s.steps) * u64::from(s.ctx)).to_string();
    let goal = task.goal();
    let t = Instant::now();
    let out = c.brain_cli(&[
        "run",
        "--detach",
        "--worker",
        &worker.name,
        "--git",
        repo.to_str().unwrap(),
        "--check",
        &task.check,
        "--check-timeout",
        "60s",
        "--protect",
        "test_*.py",
        "--model",
        &format!("openai:{}", s.model),
        "--permission",
        "full",
        "--max-steps",
        &steps,
        "--max-wall",
        &wall,
        "--max-tokens",
        &max_tokens,
        &goal,
    ]);
    assert!(
        out.status.success(),
        "brain run failed (broken setup): {}",
        testkit::text(&out)
    );
    let id = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    // The brain's own wall budget stops it; past that and a grace period it ran away.
    let deadline = Instant::now() + s.wall + Duration::from_secs(180);
    let mut ran_away = false;
    let show = loop {
        let v = task_show(c, &id);
        if let Some(v) = &v {
            let st = v["status"].as_str().unwrap_or_default();
            if matches!(
                st,
                "finished" | "failed" | "cancelled" | "stuck" | "stalled" | "budget_exhausted"
            ) {
                break v.clone();
            }
        }
        if Instant::now() > deadline {
            ran_away = true;
            let _ = c.brain_cli(&["task", "cancel", &id]);
            std::thread::sleep(Duration::from_secs(2));
            break task_show(c, &id).unwrap_or_default();
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let wall = t.elapsed();
    let log = c.task_log_json(&id);
    let calls = log.iter().filter(|r| r["kind"] == "llm_response").count() as u64;
    let workspace = log
        .iter()
        .find(|r| r["kind"] == "created")
        .and_then(|r| r["workspace"].as_str())
        .unwrap_or("default")
        .to_string();
    let human = c.brain_cli(&["task", "log", &id]);
    let logfile = s.out.join(format!("tether-{}-{i}.log", task.name));
    let _ = std::fs::write(
        &logfile,
        format!(
            "{}\n\n{}\n",
            serde_json::to_string_pretty(&show).unwrap_or_default(),
            testkit::text(&human)
        ),
    );
    let status = show["status"].as_str().unwrap_or("unknown").to_string();
    let verification = show["verification"].as_str().unwrap_or_default();
    let claim = if ran_away {
        format!("RAN AWAY ({status})")
    } else if status == "finished" {
        format!("finished/{verification}")
    } else {
        status.clone()
    };
    let files = worker.state.join("workspaces").join(&workspace);
    let (solved, _) = verify(task, &files);
    let mut note = String::new();
    if !files.is_dir() {
        note = format!("no workspace at {}", files.display());
    }
    if status != "finished" {
        let reason = show["reason"].as_str().unwrap_or_default();
        let reason: String = reason.chars().take(90).collect();
        if !reason.is_empty() {
            if !note.is_empty() {
                note.push_str("; ");
            }
            note.push_str(&reason);
        }
    }
    Attempt {
        task: task.name.clone(),
        claimed: status == "finished",
        claim,
        solved,
        calls,
        tokens: show["tokens"].as_u64().unwrap_or(0),
        wall,
        note,
    }
}

// ---------------------------------------------------------------------------------------------
// mini-swe-agent

/// None if mini-swe-agent can be used; else why not and how to install it.
fn msa_missing(s: &Settings) -> Option<String> {
    let out = Command::new(&s.msa_python)
        .args([
            "-c",
            "import minisweagent, litellm; print(minisweagent.__version__)",
        ])
        .env("MSWEA_SILENT_STARTUP", "1")
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .output();
    match out {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(testkit::text(&o).lines().last().unwrap_or("").to_string()),
        Err(e) => Some(format!("{}: {e}", s.msa_python)),
    }
    .map(|why| {
        format!(
            "mini-swe-agent rows skipped: {why}\n  install it: python3 -m venv /opt/msa-venv && \
             /opt/msa-venv/bin/pip install mini-swe-agent (or set AGENT_BENCH_MSA_PYTHON)"
        )
    })
}

fn msa_version(s: &Settings) -> String {
    let out = run(Command::new(&s.msa_python)
        .args(["-c", "import minisweagent; print(minisweagent.__version__)"])
        .env("MSWEA_SILENT_STARTUP", "1"));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn msa(s: &Settings, task: &Task, i: usize, work: &Path) -> Attempt {
    let repo = work.join(format!("msa-{}-{i}", task.name));
    make_repo(task, &repo);
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/agent/msa_driver.py");
    let traj = s.out.join(format!("msa-{}-{i}.traj.json", task.name));
    let cfg_dir = work.join("msa-config");
    let t = Instant::now();
    let (code, out) = run_timeout(
        Command::new(&s.msa_python)
            .arg(&driver)
            .arg(&repo)
            .arg(task.goal())
            .args(["--steps", &s.steps.to_string()])
            .args(["--wall", &s.wall.as_secs().to_string()])
            .args(["--api-base", &s.url])
            .args(["--model", &format!("openai/{}", s.model)])
            .args(["--max-tokens", &s.max_tokens.to_string()])
            .arg("--traj")
            .arg(&traj)
            .env("MSWEA_GLOBAL_CONFIG_DIR", &cfg_dir)
            .env("PYTHONDONTWRITEBYTECODE", "1"),
        s.wall + Duration::from_secs(180),
    );
    let wall = t.elapsed();
    let _ = std::fs::write(s.out.join(format!("msa-{}-{i}.log", task.name)), &out);
    let result = out
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("MSA_RESULT "))
        .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok());
    let (solved, _) = verify(task, &repo);
    let Some(r) = result else {
        let last: String = out
            .lines()
            .last()
            .unwrap_or_default()
            .chars()
            .take(90)
            .collect();
        return Attempt {
            task: task.name.clone(),
            claim: if code.is_none() {
                "RAN AWAY (killed)".into()
            } else {
                format!("crashed (exit {code:?})")
            },
            claimed: false,
            solved,
            calls: 0,
            tokens: 0,
            wall,
            note: last,
        };
    };
    let submitted = r["submitted"].as_bool().unwrap_or(false);
    let status = r["exit_status"].as_str().unwrap_or_default();
    Attempt {
        task: task.name.clone(),
        claim: if submitted {
            "submitted".into()
        } else {
            status.to_string()
        },
        claimed: submitted,
        solved,
        calls: r["model_calls"].as_u64().unwrap_or(0),
        tokens: r["tokens"].as_u64().unwrap_or(0),
        wall,
        note: r["error"]
            .as_str()
            .unwrap_or_default()
            .chars()
            .take(90)
            .collect(),
    }
}

// ---------------------------------------------------------------------------------------------
// Report

fn median_u64(mut v: Vec<u64>) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

fn median_dur(mut v: Vec<Duration>) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    v[v.len() / 2]
}

fn summary_row(name: &str, a: &[Attempt]) -> String {
    if a.is_empty() {
        return format!("{name:<16} (not run)");
    }
    let solved = a.iter().filter(|x| x.solved).count();
    let claimed = a.iter().filter(|x| x.claimed).count();
    let fs = a.iter().filter(|x| x.false_success()).count();
    format!(
        "{name:<16} {:>8} {:>9} {:>8} {:>13} {:>10} {:>11} {:>11.1}s",
        a.len(),
        format!("{solved}/{}", a.len()),
        claimed,
        fs,
        median_u64(a.iter().map(|x| x.calls).collect()),
        median_u64(a.iter().map(|x| x.tokens).collect()),
        median_dur(a.iter().map(|x| x.wall).collect()).as_secs_f64(),
    )
}

fn report(tasks: &[Task], n: usize, rows: &[(&str, &Vec<Attempt>)]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nper task ({n} attempt(s) each): claim → solved by the independent check (+ yes, - no, ! false success)"
    );
    let mut head = format!("{:<10}", "task");
    for (h, _) in rows {
        let _ = write!(head, " | {h:<40}");
    }
    let _ = writeln!(s, "{head}");
    for t in tasks {
        let mut line = format!("{:<10}", t.name);
        for (_, atts) in rows {
            let cell: Vec<String> = atts
                .iter()
                .filter(|a| a.task == t.name)
                .map(|a| {
                    let mark = if a.false_success() {
                        '!'
                    } else if a.solved {
                        '+'
                    } else {
                        '-'
                    };
                    format!("{}{mark}", a.claim)
                })
                .collect();
            let _ = write!(line, " | {:<40}", cell.join(" "));
        }
        let _ = writeln!(s, "{line}");
    }
    let _ = writeln!(
        s,
        "\n{:<16} {:>8} {:>9} {:>8} {:>13} {:>10} {:>11} {:>12}",
        "harness",
        "attempts",
        "solved",
        "claimed",
        "false success",
        "med calls",
        "med tokens",
        "med wall"
    );
    for (h, atts) in rows {
        let _ = writeln!(s, "{}", summary_row(h, atts));
    }
    s
}

fn main() {
    let s = Settings::from_env();
    let tasks = load_tasks();
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
    for t in &tasks {
        let (ok, out) = verify(t, &t.dir);
        assert!(
            !ok,
            "task {}: its check passes on the shipped files:\n{out}",
            t.name
        );
    }
    check_server(&s);
    let msa_skip = if s.wants("msa") {
        msa_missing(&s)
    } else {
        None
    };
    println!(
        "agent benchmark: {} task(s) × {} attempt(s); model {} at {}; at most {} model calls, \
         {} s and {} tokens an answer per attempt; logs in {}",
        tasks.len(),
        s.n,
        s.model,
        s.url,
        s.steps,
        s.wall.as_secs(),
        s.max_tokens,
        s.out.display()
    );
    if let Some(why) = &msa_skip {
        println!("{why}");
    } else if s.wants("msa") {
        println!("mini-swe-agent {} ({})", msa_version(&s), s.msa_python);
    }
    println!();

    let cluster = s.wants("tether").then(|| {
        Cluster::start_with(BrainOptions {
            config: Some(brain_config(&s)),
            lost_after: Duration::from_secs(30),
            ..BrainOptions::default()
        })
    });
    let worker = cluster.as_ref().map(|c| c.join_worker("bench-worker"));
    let work = tempfile::Builder::new()
        .prefix("agent-bench-")
        .tempdir()
        .expect("temp dir");

    let (mut t_rows, mut m_rows, mut o_rows) = (Vec::new(), Vec::new(), Vec::new());
    for task in &tasks {
        for i in 1..=s.n {
            if let (Some(c), Some(w)) = (&cluster, &worker) {
                let a = tether(&s, c, w, task, i, work.path());
                progress("tether", i, &a);
                t_rows.push(a);
            }
            if s.wants("msa") && msa_skip.is_none() {
                let a = msa(&s, task, i, work.path());
                progress("msa", i, &a);
                m_rows.push(a);
            }
            if s.wants("oneshot") {
                let a = oneshot(&s, task, i, work.path());
                progress("oneshot", i, &a);
                o_rows.push(a);
            }
        }
    }

    let mut rows: Vec<(&str, &Vec<Attempt>)> = Vec::new();
    if cluster.is_some() {
        rows.push(("tether", &t_rows));
    }
    if s.wants("msa") && msa_skip.is_none() {
        rows.push(("mini-swe-agent", &m_rows));
    }
    if s.wants("oneshot") {
        rows.push(("one-shot", &o_rows));
    }
    print!("{}", report(&tasks, s.n, &rows));
    if s.wants("oneshot") {
        println!(
            "one-shot: fixed {} of {}",
            o_rows.iter().filter(|a| a.solved).count(),
            o_rows.len()
        );
    }
    let fs: Vec<&Attempt> = t_rows.iter().filter(|a| a.false_success()).collect();
    if !fs.is_empty() {
        println!(
            "\nTETHER FALSE SUCCESS ({}): {} — a harness bug; see the logs in {}",
            fs.len(),
            fs.iter()
                .map(|a| a.task.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            s.out.display()
        );
    }
    if let Some(why) = &msa_skip {
        println!("\n{why}");
    }
    println!("\nlogs and trajectories: {}", s.out.display());
}
