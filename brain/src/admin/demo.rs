//! `demo`: the whole foundation on one machine with nothing to set up. A brain with a
//! temporary store, two local worker processes that enrol with one-time tokens over mutual
//! TLS, streamed remote execution, file operations, a refused path escape, a worker killed
//! and brought back under a durable task, and the agent replaying a recorded model
//! transcript (no API key) to write code, run its test and fix the bug.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use proto::admin_client::AdminClient;
use proto::{FileCall, exec_event, file_call, file_response};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::admin::client::Target;
use crate::provision::local::WorkerProgram;
use crate::trust::ca::{self, DataDir};

/// The model answers the demo's agent task replays (see `brain run --record`).
const DEMO_TRANSCRIPT: &str = include_str!("../../demo/fix-calc.jsonl");

struct DemoWorker {
    name: String,
    state: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl DemoWorker {
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for DemoWorker {
    fn drop(&mut self) {
        self.kill();
    }
}

fn bold(text: &str) -> String {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        format!("\x1b[1m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

/// A chapter's title: the demo's own words, in bold on a terminal (the one place the CLI
/// writes control sequences of its own).
fn step(text: &str) {
    shared::outln!(
        "\n{}",
        bold(&shared::visible::visible(&format!("▸ {text}")))
    );
}

/// Runs the demo; `keep` leaves the temp dir; `model` runs the agent chapter on a real model
/// (its key from the usual environment variables) instead of the recorded transcript.
pub async fn run(launcher: WorkerProgram, keep: bool, model: Option<String>) -> anyhow::Result<()> {
    let tmp = tempfile_dir()?;
    if !keep {
        shared::stdout::remove_on_closed_pipe(tmp.clone());
    }
    let data = DataDir(tmp.join("brain"));
    step(&format!(
        "starting a brain with a temporary store in {}",
        tmp.display()
    ));
    let init = ca::init(&data, &[], false)?;
    out!("  CA created: {}", init.ca_hash);
    let ready = crate::app::prepare(crate::app::Options {
        data: data.clone(),
        listen: "127.0.0.1:0".parse().expect("address"),
        lost_after: Duration::from_secs(3),
        tasks: Default::default(),
        require_sandbox: vec![],
        web_listen: None,
        store: None,
        config_path: data.path().join("config.toml"),
        // The sample repository is a local path: the demo allows those.
        config: {
            let mut c = crate::config::Config::default();
            c.deliver.git_schemes.push("file".into());
            c.into()
        },
    })
    .await?;
    let url = format!("https://127.0.0.1:{}", ready.addr.port());
    out!("  listening on {url} (mutual TLS)");
    let stop = CancellationToken::new();
    let server = tokio::spawn(ready.run(stop.clone().cancelled_owned()));
    let result = scenario(&launcher, &tmp, &data, &url, model).await;
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    if keep {
        out!("\nkept {}", tmp.display());
    } else {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result?;
    shared::outln!("\n{}", bold("demo complete"));
    out!(
        "next: your own brain and worker (README, \"Quickstart on one machine\"):\n  cargo build --release --workspace && export PATH=\"$PWD/target/release:$PATH\"\n  brain init && brain serve &\n  brain token create    # prints the line that joins a worker\nthen a first agent task on your code (README, \"A first agent task\")."
    );
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "tether-demo-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

async fn scenario(
    launcher: &WorkerProgram,
    tmp: &std::path::Path,
    data: &DataDir,
    url: &str,
    model: Option<String>,
) -> anyhow::Result<()> {
    let target = Target {
        url: url.to_string(),
        identity_dir: data.admin_identity(),
    };
    let mut admin = target.connect().await?;
    let mut workers = enroll(&mut admin, launcher, tmp, data, url).await?;
    first_calls(&mut admin, &workers).await?;
    durable_plan(&mut admin, launcher, data, &mut workers[0]).await?;
    agent_chapter(admin.clone(), tmp, &workers, model).await?;
    concurrency(&mut admin, &workers[0].name).await?;
    kill_and_return(&mut admin, launcher, data, &mut workers[1]).await?;
    for w in &mut workers {
        w.kill();
    }
    Ok(())
}

/// Two local workers enrolled with one-time join tokens, connected.
async fn enroll(
    admin: &mut AdminClient<Channel>,
    launcher: &WorkerProgram,
    tmp: &std::path::Path,
    data: &DataDir,
    url: &str,
) -> anyhow::Result<Vec<DemoWorker>> {
    step("enrolling two local workers with one-time join tokens");
    let mut workers = Vec::new();
    for name in ["demo-1", "demo-2"] {
        let tok = admin
            .create_token(proto::CreateTokenRequest {
                ttl_seconds: 600,
                labels: [("demo".to_string(), "true".to_string())].into(),
            })
            .await?
            .into_inner();
        out!(
            "  TETHER_JOIN_TOKEN=tj_… worker join --brain {url} --ca-hash {}… --name {name}",
            &tok.ca_hash[..19]
        );
        let state = tmp.join(name);
        let log = tmp.join(format!("{name}.log"));
        let mut cmd = launcher.command();
        cmd.args(["join", "--brain", url, "--token", &tok.token])
            .args(["--ca-hash", &tok.ca_hash, "--name", name])
            .arg("--state")
            .arg(&state)
            .arg("--deny-read")
            .arg(data.path());
        let child = spawn_logged(cmd, &log)?;
        workers.push(DemoWorker {
            name: name.to_string(),
            state,
            log,
            child: Some(child),
        });
    }
    for w in &workers {
        wait_state(admin, &w.name, proto::WorkerState::Connected, w).await?;
    }
    let list = admin
        .list_workers(proto::ListWorkersRequest {})
        .await?
        .into_inner();
    crate::admin::render::print_workers(&list.workers, false);

    Ok(workers)
}

/// Commands and file operations on the workers, and a path that tries to leave.
async fn first_calls(
    admin: &mut AdminClient<Channel>,
    workers: &[DemoWorker],
) -> anyhow::Result<()> {
    step("running commands on each worker, output streamed back live");
    for w in workers {
        exec(
            admin,
            &w.name,
            &["sh", "-c", "echo \"hello from $(uname -sm), pid $$, in $(pwd)\"; for i in 1 2 3; do echo \"tick $i\"; sleep 0.2; done"],
        )
        .await?;
    }

    step("file operations inside the workspace (atomic write, ranged read, list)");
    let w1 = &workers[0].name;
    file(
        admin,
        w1,
        file_call::Op::Write(proto::WriteFile {
            path: "notes/hello.txt".into(),
            data: b"written by the brain, read back over the session\n".to_vec(),
            mode: 0o644,
            create_dirs: true,
        }),
    )
    .await?;
    let r = file(
        admin,
        w1,
        file_call::Op::Read(proto::ReadFile {
            path: "notes/hello.txt".into(),
            offset: 0,
            length: 0,
        }),
    )
    .await?;
    if let Some(file_response::Result::Data(d)) = r {
        shared::outp!(
            "  notes/hello.txt: {}",
            shared::visible::visible(&String::from_utf8_lossy(&d.data))
        );
    }
    exec(admin, w1, &["ls", "-l", "notes"]).await?;

    step("a path that tries to leave the workspace is refused");
    let r = file(
        admin,
        w1,
        file_call::Op::Read(proto::ReadFile {
            path: "../../../etc/passwd".into(),
            offset: 0,
            length: 0,
        }),
    )
    .await?;
    match r {
        Some(file_response::Result::Error(e)) => out!("  refused: {}", e.message),
        other => bail!("the escape was not refused: {other:?}"),
    }

    Ok(())
}

/// A scripted plan on the first worker, which is killed and started again midway.
async fn durable_plan(
    admin: &mut AdminClient<Channel>,
    launcher: &WorkerProgram,
    data: &DataDir,
    worker: &mut DemoWorker,
) -> anyhow::Result<()> {
    let w1 = &worker.name.clone();
    step("a durable task: a scripted plan keeps going when its worker is killed mid-run");
    let steps: Vec<serde_json::Value> = (0..6)
        .map(|i| {
            serde_json::json!({
                "run": ["sh", "-c", format!("sleep 0.3; echo step-{i} >> progress.txt")],
                "check": ["grep", "-qx", format!("step-{i}"), "progress.txt"],
            })
        })
        .collect();
    let task_id = admin
        .run_plan(proto::RunPlanRequest {
            plan_json: serde_json::json!({ "steps": steps }).to_string(),
            worker: w1.clone(),
            goal: "append six lines, one per step".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .task_id;
    out!("  started {task_id} on {w1}");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    worker.kill();
    out!("  SIGKILLed {w1} in the middle of the task");
    let mut cmd = launcher.command();
    cmd.arg("run").arg("--state").arg(&worker.state);
    cmd.arg("--deny-read").arg(data.path());
    worker.child = Some(spawn_logged(cmd, &worker.log)?);
    let deadline = Instant::now() + Duration::from_secs(60);
    let summary = loop {
        let list = admin
            .list_tasks(proto::ListTasksRequest {})
            .await?
            .into_inner();
        if let Some(t) = list.tasks.into_iter().find(|t| t.id == task_id)
            && matches!(t.status.as_str(), "finished" | "failed" | "cancelled")
        {
            break t;
        }
        if Instant::now() > deadline {
            bail!("{task_id} did not end within 60s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut log = admin
        .task_log(proto::TaskLogRequest {
            task_id: task_id.clone(),
            follow: false,
            after_seq: 0,
        })
        .await?
        .into_inner();
    while let Some(r) = log.message().await? {
        if let Some(rec) = crate::admin::render::logged(&r)
            && !matches!(rec.event, proto::log::Event::ToolOutput { .. })
        {
            out!("  {}", crate::admin::render::describe_record(&rec));
        }
    }
    let workspace = task_id
        .parse::<crate::model::TaskId>()
        .map_err(|e| anyhow::anyhow!(e))?
        .workspace();
    let r = admin
        .file(proto::AdminFileRequest {
            worker: w1.clone(),
            call: Some(FileCall {
                call_id: 0,
                workspace: workspace.clone(),
                op: Some(file_call::Op::Read(proto::ReadFile {
                    path: "progress.txt".into(),
                    offset: 0,
                    length: 0,
                })),
            }),
        })
        .await?
        .into_inner();
    if let Some(file_response::Result::Data(d)) = r.result {
        let text = String::from_utf8_lossy(&d.data).into_owned();
        out!(
            "  {task_id} {}; progress.txt: {}",
            summary.status,
            text.lines().collect::<Vec<_>>().join(", ")
        );
    }

    Ok(())
}

/// Twenty commands at once on one session, and its round trip.
async fn concurrency(admin: &mut AdminClient<Channel>, w1: &str) -> anyhow::Result<()> {
    step("twenty commands at once on one session, and the session's round trip");
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..20 {
        let mut a = admin.clone();
        let name = w1.to_string();
        set.spawn(async move {
            quiet_exec(&mut a, &name, &["sh", "-c", &format!("exit {}", i % 3)]).await
        });
    }
    let mut codes = Vec::new();
    while let Some(r) = set.join_next().await {
        codes.push(r??);
    }
    out!(
        "  20 concurrent execs finished in {:?}; exit codes seen: {:?}",
        started.elapsed(),
        {
            codes.sort();
            codes.dedup();
            codes
        }
    );
    let mut rtts = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        admin
            .echo(proto::AdminEchoRequest {
                worker: w1.to_string(),
                payload: vec![1],
            })
            .await?;
        rtts.push(t.elapsed());
    }
    rtts.sort();
    out!(
        "  1-byte round trip admin → brain → worker → back: p50 {:?}",
        rtts[100]
    );

    Ok(())
}

/// The second worker killed, marked lost, started again and back with its identity.
async fn kill_and_return(
    admin: &mut AdminClient<Channel>,
    launcher: &WorkerProgram,
    data: &DataDir,
    w2: &mut DemoWorker,
) -> anyhow::Result<()> {
    step("SIGKILL one worker: the brain notices, then the worker comes back with its identity");
    w2.kill();
    let t = Instant::now();
    wait_state(admin, &w2.name.clone(), proto::WorkerState::Lost, w2).await?;
    out!("  {} marked lost after {:?}", w2.name, t.elapsed());
    let mut cmd = launcher.command();
    cmd.arg("run").arg("--state").arg(&w2.state);
    cmd.arg("--deny-read").arg(data.path());
    w2.child = Some(spawn_logged(cmd, &w2.log)?);
    wait_state(admin, &w2.name.clone(), proto::WorkerState::Connected, w2).await?;
    out!("  {} reconnected", w2.name);
    let list = admin
        .list_workers(proto::ListWorkersRequest {})
        .await?
        .into_inner();
    crate::admin::render::print_workers(&list.workers, false);
    Ok(())
}

fn spawn_logged(mut cmd: Command, log: &std::path::Path) -> anyhow::Result<Child> {
    let f = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .spawn()
        .context("starting a worker process")
}

async fn wait_state(
    admin: &mut AdminClient<Channel>,
    name: &str,
    want: proto::WorkerState,
    w: &DemoWorker,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = admin
            .list_workers(proto::ListWorkersRequest {})
            .await?
            .into_inner();
        if list
            .workers
            .iter()
            .any(|x| x.name == name && x.state == want as i32)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "worker {name} did not become {want:?} within 20s; its log:\n{}",
                std::fs::read_to_string(&w.log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn exec(
    admin: &mut AdminClient<Channel>,
    worker: &str,
    argv: &[&str],
) -> anyhow::Result<i32> {
    let mut stream = admin.exec(exec_request(worker, argv)).await?.into_inner();
    let mut pending = String::new();
    while let Some(ev) = stream.message().await? {
        match ev.event {
            Some(exec_event::Event::Output(o)) => {
                pending.push_str(&String::from_utf8_lossy(&o.data));
                while let Some(i) = pending.find('\n') {
                    out!("  [{worker}] {}", &pending[..i]);
                    pending.drain(..=i);
                }
            }
            Some(exec_event::Event::Exit(x)) => {
                if !pending.is_empty() {
                    out!("  [{worker}] {pending}");
                }
                return Ok(x.code.unwrap_or(-1));
            }
            None => {}
        }
    }
    bail!("the stream ended without an exit")
}

async fn quiet_exec(
    admin: &mut AdminClient<Channel>,
    worker: &str,
    argv: &[&str],
) -> anyhow::Result<i32> {
    let mut stream = admin.exec(exec_request(worker, argv)).await?.into_inner();
    while let Some(ev) = stream.message().await? {
        if let Some(exec_event::Event::Exit(x)) = ev.event {
            return Ok(x.code.unwrap_or(-1));
        }
    }
    bail!("the stream ended without an exit")
}

fn exec_request(worker: &str, argv: &[&str]) -> proto::AdminExecRequest {
    proto::AdminExecRequest {
        worker: worker.to_string(),
        workspace: "default".into(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: String::new(),
        timeout_ms: 30_000,
        output_cap_bytes: 0,
        limits: None,
    }
}

async fn file(
    admin: &mut AdminClient<Channel>,
    worker: &str,
    op: file_call::Op,
) -> anyhow::Result<Option<file_response::Result>> {
    Ok(admin
        .file(proto::AdminFileRequest {
            worker: worker.to_string(),
            call: Some(FileCall {
                call_id: 0,
                workspace: "default".into(),
                op: Some(op),
            }),
        })
        .await?
        .into_inner()
        .result)
}

/// The demo's sample project (`samples/calc`, also the README's first agent task): a shell
/// library with a bug and the test that catches it.
const SAMPLE: &[(&str, &str)] = &[
    ("README.md", include_str!("../../../samples/calc/README.md")),
    ("calc.sh", include_str!("../../../samples/calc/calc.sh")),
    ("test.sh", include_str!("../../../samples/calc/test.sh")),
];

fn git(dir: &std::path::Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=Tether demo",
            "-c",
            "user.email=demo@localhost",
        ])
        .args(args)
        .output()
        .context("running git (is it installed?)")?;
    if !out.status.success() {
        bail!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The agent on a replayed transcript: the brain clones a sample repository, the task runs
/// on the first worker, asks for approval of each change, moves to the second worker
/// midway, fixes the bug there, and the result is shown as a diff.
async fn agent_chapter(
    mut admin: AdminClient<Channel>,
    tmp: &std::path::Path,
    workers: &[DemoWorker],
    model: Option<String>,
) -> anyhow::Result<()> {
    step(
        "the agent: a sample project with a failing test, a recorded model (replay: no API key), moved between workers midway",
    );
    let origin = sample_origin(tmp)?;
    let (w1, w2) = (workers[0].name.clone(), workers[1].name.clone());
    let goal = "make the tests in test.sh pass";
    let (model, transcript, shown) = match model {
        Some(m) => (m.clone(), String::new(), m),
        None => (
            "replay:fix-calc.jsonl".to_string(),
            DEMO_TRANSCRIPT.to_string(),
            "replay:brain/demo/fix-calc.jsonl".to_string(),
        ),
    };
    out!(
        "  brain run --git {} --check \"sh test.sh\" --deliver branch --worker {w1} --model {shown} --permission ask \"{goal}\"",
        origin.display()
    );
    let task = admin
        .run_agent(proto::RunAgentRequest {
            goal: goal.into(),
            worker: w1.clone(),
            model,
            permission: "ask".into(),
            budget: None,
            transcript,
            git_url: origin.display().to_string(),
            git_ref: String::new(),
            dir: String::new(),
            // The brain, not the model's word, decides when it is done.
            check: "sh test.sh".into(),
            // And the result goes back as a branch.
            deliver: "branch".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .task_id;
    let (outcome, synced, move_bytes) = follow_agent(&mut admin, &task, &w2).await?;
    if !outcome.starts_with("finished") {
        bail!("the agent task did not finish: {outcome}");
    }
    out!(
        "  sync: {synced} bytes (compressed) crossed the wire for the brain's mirror; the move sent {move_bytes} bytes"
    );
    show_result(&mut admin, &task, &origin).await
}

/// A sample repository with a failing test, cloned bare as the task's origin.
fn sample_origin(tmp: &std::path::Path) -> anyhow::Result<PathBuf> {
    let sample = tmp.join("sample");
    std::fs::create_dir_all(&sample)?;
    for (path, text) in SAMPLE {
        std::fs::write(sample.join(path), text)?;
    }
    git(&sample, &["init", "-q", "-b", "main"])?;
    git(&sample, &["add", "."])?;
    git(&sample, &["commit", "-q", "-m", "calc: add and mul"])?;
    // The repository the task comes from and its result goes back to (a throw-away one).
    let origin = tmp.join("sample.git");
    git(
        tmp,
        &[
            "clone",
            "-q",
            "--bare",
            &sample.display().to_string(),
            &origin.display().to_string(),
        ],
    )?;
    Ok(origin)
}

/// Follows the agent's log, printing it with workers by name: moves the task to `w2` at the
/// second approval it asks for and approves each. The outcome, the bytes the mirror's syncs
/// sent and the bytes the move sent.
async fn follow_agent(
    admin: &mut AdminClient<Channel>,
    task: &str,
    w2: &str,
) -> anyhow::Result<(String, u64, u64)> {
    let list = admin
        .list_workers(proto::ListWorkersRequest {})
        .await?
        .into_inner();
    let names: Vec<(String, String)> = list
        .workers
        .iter()
        .map(|w| (w.id.clone(), w.name.clone()))
        .collect();
    let named = |text: String| {
        names
            .iter()
            .fold(text, |t, (id, name)| t.replace(id.as_str(), name.as_str()))
    };
    let mut log = admin
        .task_log(proto::TaskLogRequest {
            task_id: task.to_string(),
            follow: true,
            after_seq: 0,
        })
        .await?
        .into_inner();
    let mut outcome = String::new();
    let mut moved = false;
    let (mut synced, mut move_bytes) = (0u64, 0u64);
    let mut in_move = false;
    let follow = async {
        while let Some(r) = log.message().await? {
            let Some(rec) = crate::admin::render::logged(&r) else {
                continue; // live output: the observation shows it
            };
            use proto::log::Event as E;
            match &rec.event {
                E::ToolOutput { .. }
                | E::ToolCallCompleted { .. }
                | E::LlmRequest { .. }
                | E::StatusChanged { .. } => continue,
                E::Barrier { wire_bytes, .. } => {
                    synced += wire_bytes;
                }
                E::MoveStarted { .. } => in_move = true,
                E::MoveCompleted { wire_bytes, .. } => {
                    in_move = false;
                    move_bytes += wire_bytes;
                }
                E::Finished {
                    outcome: o, reason, ..
                } => outcome = format!("{o}: {reason}"),
                _ => {}
            }
            if in_move && let E::Barrier { wire_bytes, .. } = &rec.event {
                move_bytes += wire_bytes;
            }
            out!(
                "  {}",
                named(crate::admin::render::describe_record(&rec)).replace('\n', "\n  ")
            );
            if let E::ApprovalRequested { approval_id, .. } = &rec.event {
                let mut a = admin.clone();
                // Midway: at the second change it asks for.
                if *approval_id == 2 && !moved {
                    moved = true;
                    out!("  ▸ brain task move {task} --to {w2}   (while it waits for approval)");
                    a.move_task(proto::MoveTaskRequest {
                        task_id: task.to_string(),
                        to: w2.to_string(),
                    })
                    .await?;
                }
                // Approve once the task is where it should be (the move is logged first).
                let t = task.to_string();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let _ = a
                        .decide(proto::DecideRequest {
                            task_id: t,
                            approve: true,
                            ..Default::default()
                        })
                        .await;
                });
                out!("  ▸ brain approve {task}");
            }
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(900), follow)
        .await
        .context("the agent task did not end within 15 minutes")??;
    Ok((outcome, synced, move_bytes))
}

/// The task's result, delivered as a branch of its origin: shown, and verified.
async fn show_result(
    admin: &mut AdminClient<Channel>,
    task: &str,
    origin: &std::path::Path,
) -> anyhow::Result<()> {
    // The result: verified by the check, delivered as a branch of the repository.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let t = loop {
        let list = admin
            .list_tasks(proto::ListTasksRequest {})
            .await?
            .into_inner();
        let t = list
            .tasks
            .into_iter()
            .find(|t| t.id == task)
            .context("the task is gone from the brain")?;
        if !t.delivery.is_empty() && !t.delivery.contains("in progress") {
            break t;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the result of {task} was not delivered within 2 minutes");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if t.delivery.starts_with("failed") {
        bail!("the delivery of {task} {}", t.delivery);
    }
    out!(
        "  result: {} by `{}` ({}); delivered as {}",
        t.verification,
        t.check,
        t.check_result,
        t.delivery
    );
    let branch = format!("tether/{task}");
    out!("  git -C {} show {branch}:", origin.display());
    for l in git(
        origin,
        &["show", "--no-color", "--format=%h %s%n%n%b", &branch],
    )?
    .lines()
    {
        out!("    {l}");
    }
    if t.verification != "verified" {
        bail!("the result of {task} was not verified: {}", t.verification);
    }
    Ok(())
}
