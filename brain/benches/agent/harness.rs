//! The three harnesses of the agent benchmark: the one-shot request, Tether (a real brain and
//! worker) and mini-swe-agent, each turning one attempt at a task into an [`Attempt`].

use super::*;

pub(super) fn http() -> (tokio::runtime::Runtime, reqwest::Client) {
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

/// The body of a GET of `url` (10 s at most).
fn get(url: &str) -> Result<String, reqwest::Error> {
    let (rt, client) = http();
    rt.block_on(async {
        let r = client
            .get(url)
            .timeout(Duration::from_secs(10))
            .send()
            .await?;
        r.error_for_status()?.text().await
    })
}

/// Panics (broken setup) unless the server answers `/models` and serves `model`.
pub(super) fn check_server(s: &Settings) {
    let url = format!("{}/models", s.url);
    let body = get(&url).unwrap_or_else(|e| {
        panic!(
            "the model server at {url} does not answer ({e}).\n\
                 Start it: LLM_MODEL=/opt/llm/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
                 LLM_ALIAS={} LLM_CTX={} bash ../shared/llm/start.sh \
                 (built once by `WITH_QWEN15=1 bash ../shared/llm/setup.sh`), \
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

/// Waits (at most 5 minutes) until the model server works on no request, so that a row's
/// clock does not start while the last row's abandoned answers are still being written.
/// Only llama.cpp's `/slots` says so; another server, or `AGENT_BENCH_JOBS` above 1 (the
/// others' rows are meant to share the server), is not waited for.
pub(super) fn wait_idle(s: &Settings) {
    if s.jobs > 1 {
        return;
    }
    let url = format!(
        "{}/slots",
        s.url.trim_end_matches('/').trim_end_matches("/v1")
    );
    let busy = || -> Option<bool> {
        let text = get(&url).ok()?;
        let body: serde_json::Value = serde_json::from_str(&text).ok()?;
        let slots = body.as_array()?;
        Some(slots.iter().any(|s| s["is_processing"] == true))
    };
    let end = std::time::Instant::now() + Duration::from_secs(300);
    while busy() == Some(true) && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// One chat request; returns (the answer's text, total tokens).
pub(super) fn chat(s: &Settings, messages: serde_json::Value) -> Result<(String, u64), String> {
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
pub(super) fn fenced(text: &str) -> Option<String> {
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

/// The fenced blocks of `text` that name a file after their language (```python a.py).
fn named_blocks(text: &str) -> Vec<(String, String)> {
    text.split("```")
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .filter_map(|(_, b)| {
            let (info, body) = b.split_once('\n')?;
            let path = info
                .split_whitespace()
                .nth(1)?
                .trim_matches('`')
                .to_string();
            Some((path, body.to_string()))
        })
        .collect()
}

pub(super) fn oneshot(s: &Settings, task: &Task, i: usize, work: &Path) -> Attempt {
    let repo = work.join(format!("oneshot-{}-{i}", task.name));
    make_repo(task, &repo);
    let (_, failing) = verify(task, &repo);
    let tail: String = {
        let lines: Vec<&str> = failing.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    };
    let lang = |p: &str| match p.rsplit_once('.').map(|x| x.1) {
        Some("py") => "python",
        Some("js") => "javascript",
        Some("rs") => "rust",
        _ => "",
    };
    let mut shown = String::new();
    for f in task.sources.iter().chain(&task.tests) {
        let text = std::fs::read_to_string(repo.join(f)).unwrap_or_default();
        shown.push_str(&format!("{f}:\n```{} {f}\n{text}```\n\n", lang(f)));
    }
    let one = (task.sources.len() == 1).then(|| task.sources[0].clone());
    let prompt = match &one {
        Some(m) => format!(
            "{shown}The check `{c}` fails:\n\n```\n{tail}\n```\n\nFix the bug in {m}. Reply \
             with the whole corrected {m} in one fenced block.",
            c = task.check,
        ),
        None => format!(
            "{shown}The check `{c}` fails:\n\n```\n{tail}\n```\n\nFix the bug (not in the \
             tests). Reply with each file you change, whole, in a fenced block whose first line \
             names its language and path, like ```python path/to/file.py",
            c = task.check,
        ),
    };
    let t = Instant::now();
    let r = chat(
        s,
        serde_json::json!([
            {"role": "system", "content": "You are a careful programmer."},
            {"role": "user", "content": prompt},
        ]),
    );
    let wall = t.elapsed();
    if let Ok((answer, _)) = &r {
        let _ = std::fs::write(s.out.join(format!("oneshot-{}-{i}.txt", task.name)), answer);
    }
    let (claim, solved, tokens, note) = match r {
        Err(e) => ("error".to_string(), false, 0, e),
        Ok((answer, tokens)) => {
            let mut writes: Vec<(String, String)> = named_blocks(&answer)
                .into_iter()
                .filter(|(p, _)| task.sources.contains(p))
                .collect();
            if writes.is_empty()
                && let (Some(m), Some(code)) = (&one, fenced(&answer))
            {
                writes.push((m.clone(), code));
            }
            if writes.is_empty() {
                ("no code block".into(), false, tokens, String::new())
            } else {
                for (p, code) in writes {
                    std::fs::write(repo.join(p), code).unwrap();
                }
                let (ok, _) = verify(task, &repo);
                ("answered".into(), ok, tokens, String::new())
            }
        }
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

/// The brain's config; `json`: with the constrained variant of the model (a build from
/// before `constrain` refuses the key).
pub(super) fn brain_config(s: &Settings, json: bool) -> String {
    let mut c = format!(
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
[deliver]
# Each attempt clones a local one-commit repository.
git_schemes = ["https", "ssh", "file"]
"#,
        m = s.model,
        url = s.url,
        ctx = s.ctx,
        mt = s.max_tokens
    );
    if json {
        c.push_str(&format!(
            "# The same model, its replies constrained to one call by the tools' schemas.\n\
             [llm.models.\"openai:{m}-json\"]\ntool_mode = \"text\"\nconstrain = \"json_schema\"\n\
             context_window = {ctx}\nmax_tokens = {mt}\n",
            m = s.model,
            ctx = s.ctx,
            mt = s.max_tokens
        ));
    }
    c
}

pub(super) fn task_show(c: &Cluster, id: &str) -> Option<serde_json::Value> {
    let out = c.brain_cli(&["task", "show", id, "--json"]);
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// Writes `show` (the task's `task show --json`), its story and each of its attempts' after
/// it to `file`.
fn write_story(c: &Cluster, id: &str, show: &serde_json::Value, file: &Path) {
    let mut stories = testkit::text(&c.brain_cli(&["task", "log", id]));
    for a in show["attempts"].as_array().into_iter().flatten() {
        if let Some(t) = a["task"].as_str() {
            let story = testkit::text(&c.brain_cli(&["task", "log", t]));
            stories.push_str(&format!("\n\n# attempt {t}\n{story}"));
        }
    }
    let show = serde_json::to_string_pretty(show).unwrap_or_default();
    let _ = std::fs::write(file, format!("{show}\n\n{stories}\n"));
}

/// Where a Tether row runs a task.
pub(super) enum On<'a> {
    /// On this worker, once.
    Worker(&'a testkit::Worker),
    /// As this many attempts over the workers labelled `pool=LABEL`.
    Attempts(&'a str, u32),
}

/// One attempt of Tether with `model` (`openai:NAME`) on `task`, as the bench's row `row`
/// (which names its files).
#[allow(clippy::too_many_arguments)]
pub(super) fn tether(
    row: &str,
    s: &Settings,
    c: &Cluster,
    on: On<'_>,
    model: &str,
    task: &Task,
    i: usize,
    work: &Path,
) -> Attempt {
    let repo = work.join(format!("{row}-{}-{i}", task.name));
    make_repo(task, &repo);
    let steps = s.steps.to_string();
    let wall = format!("{}s", s.wall.as_secs());
    let max_tokens = (u64::from(s.steps) * u64::from(s.ctx)).to_string();
    let goal = task.goal();
    let t = Instant::now();
    let (pool, count) = match &on {
        On::Worker(_) => (String::new(), String::new()),
        On::Attempts(label, n) => (format!("pool={label}"), n.to_string()),
    };
    let mut args: Vec<&str> = vec!["run", "--detach"];
    match &on {
        On::Worker(w) => args.extend(["--worker", w.name.as_str()]),
        On::Attempts(..) => args.extend(["--require-label", &pool, "--attempts", &count]),
    }
    args.extend([
        "--git",
        repo.to_str().unwrap(),
        "--check",
        &task.check,
        "--check-timeout",
        "60s",
    ]);
    for g in &task.protect {
        args.extend(["--protect", g.as_str()]);
    }
    // Another build's binaries may not know the switch: its row runs with its own defaults.
    if let Some(a) = s.assists.as_deref().filter(|_| row != "tether-before") {
        args.extend(["--assists", a]);
    }
    args.extend([
        "--model",
        model,
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
    let out = c.brain_cli(&args);
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
    // The brain's own wall budget stops it between model calls; one slow call may go past it.
    // Past the budget and a grace period the attempt is cancelled, and the line says so.
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
    let responses = |log: &[serde_json::Value]| {
        log.iter().filter(|r| r["kind"] == "llm_response").count() as u64
    };
    // A task run as attempts calls the model in its attempts.
    let calls = responses(&log)
        + show["attempts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["task"].as_str())
            .map(|t| responses(&c.task_log_json(t)))
            .sum::<u64>();
    let workspace = log
        .iter()
        .find(|r| r["kind"] == "created")
        .and_then(|r| r["workspace"].as_str())
        .unwrap_or("default")
        .to_string();
    let logfile = s.out.join(format!("{row}-{}-{i}.log", task.name));
    write_story(c, &id, &show, &logfile);
    let status = show["status"].as_str().unwrap_or("unknown").to_string();
    let verification = show["verification"].as_str().unwrap_or_default();
    let claim = if ran_away {
        format!("past wall+180s, cancelled ({status})")
    } else if status == "finished" {
        format!("finished/{verification}")
    } else {
        status.clone()
    };
    // One run: the worker's workspace as it is. Attempts: the task's result (the winner's
    // workspace, nothing without one), exported.
    let exported = tempfile::tempdir().expect("temp dir");
    let files = match &on {
        On::Worker(w) => w.state.join("workspaces").join(&workspace),
        On::Attempts(..) => {
            let dir = exported.path().join("result");
            let out = c.brain_cli(&["task", "export", &id, dir.to_str().unwrap()]);
            if !out.status.success() {
                let _ = std::fs::remove_dir_all(&dir);
            }
            dir
        }
    };
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
pub(super) fn msa_missing(s: &Settings) -> Option<String> {
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

pub(super) fn msa_version(s: &Settings) -> String {
    let out = run(Command::new(&s.msa_python)
        .args(["-c", "import minisweagent; print(minisweagent.__version__)"])
        .env("MSWEA_SILENT_STARTUP", "1"));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

pub(super) fn msa(s: &Settings, task: &Task, i: usize, work: &Path) -> Attempt {
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
                "past wall+180s, killed".into()
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
