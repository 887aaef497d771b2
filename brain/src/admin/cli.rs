//! The `brain` command line: `init` and `serve` act on the data dir; every other command is
//! an admin client that talks to the running brain over mutual TLS.

use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use shared::pki::{self, IdentityFiles};
use tokio_util::sync::CancellationToken;

use super::args::{AdminCmd, Cli, Cmd, MachinesCmd, TaskCmd, TokenCmd, WebCmd, WorkerCmd};
use super::client::{Target, status};
use super::follow::{decide, follow, run_task};
use super::remote::{exec, file, provision};
use crate::admin::render::{print_machines, print_workers};
use crate::trust::ca::{self, DataDir};

/// The brain's async runtime (two threads); says why on stderr if it cannot start.
fn runtime() -> Option<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| eprintln!("error: cannot start the async runtime: {e}"))
        .ok()
}

/// Parses `args` (including the program name), runs the command and returns the exit status.
pub fn main_with<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    hold_keys_close();
    shared::telemetry::init("info");
    let cli = Cli::parse_from(args);
    let Some(rt) = runtime() else {
        return 1;
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit_code(&e)
        }
    }
}

/// What the brain does first, while it has one thread: takes `$TETHER_SECRET_KEY` out of
/// its environment and closes its memory (`/proc/PID/environ`, `mem`) to other processes of
/// its user, such as the commands of a local worker.
fn hold_keys_close() {
    // SAFETY: called first thing in main, before any thread is started.
    unsafe { crate::trust::secrets::take_key_from_env() };
    if let Err(e) = shared::close_memory_to_same_user() {
        eprintln!("warning: cannot close this process's memory to its user's other processes: {e}");
    }
}

/// The exit status for an error that reached the top: [`ExitCode::Config`] (78) for a
/// configuration problem that running again will not fix (an unreadable or invalid config
/// file, no CA in the data dir, missing or malformed key material or admin identity, a
/// malformed brain URL), 1 otherwise. The systemd units in deploy/ do not restart the brain
/// on 78.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    use shared::exit::{by, classify};
    classify(
        e,
        &[
            by::<crate::config::Error>,
            by::<ca::Error>,
            by::<crate::app::Error>,
            by::<crate::admin::client::Error>,
            by::<shared::pki::Error>,
            by::<shared::tls::Error>,
        ],
    )
    .code()
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let data = DataDir(
        cli.data
            .clone()
            .unwrap_or_else(|| shared::dirs::data_dir("tether", "TETHER_DATA")),
    );
    let target = Target::resolve(&data, cli.brain.clone(), cli.identity.clone());
    match cli.cmd {
        Cmd::Init { hosts, force } => {
            let out = ca::init(&data, &hosts, force)?;
            out!("initialised {}", data.path().display());
            out!("CA hash: {}", out.ca_hash);
            out!("next: brain serve --data {}", data.path().display());
            Ok(0)
        }
        Cmd::Serve {
            listen,
            lost_after,
            snapshot_every,
            worker_wait,
            failover_after,
            limits,
            network_off,
            disk_quota,
            disk_files,
            require_sandbox,
            config,
            web_listen,
        } => {
            let config_path = config.unwrap_or_else(|| data.path().join("config.toml"));
            let config = std::sync::Arc::new(crate::config::Config::load(&config_path)?);
            let ready = crate::app::prepare(crate::app::Options {
                data: data.clone(),
                listen,
                lost_after,
                tasks: crate::engine::Options {
                    snapshot_every: snapshot_every.max(1),
                    worker_wait,
                    limits: limits.to_proto(network_off).into(),
                    disk_quota: crate::model::ops::DiskQuota {
                        bytes: disk_quota.unwrap_or(0),
                        files: disk_files.unwrap_or(0),
                    },
                    llm: std::sync::Arc::new(config.llm.clone()),
                    failover_after,
                    secrets: vec![],
                    egress: None,
                },
                require_sandbox,
                config,
                web_listen,
            })
            .await?;
            tracing::info!(addr = %ready.addr, data = %data.path().display(), "brain listening on {}", ready.addr);
            let stop = CancellationToken::new();
            spawn_signal_handler(stop.clone());
            ready.run(stop.cancelled_owned()).await?;
            tracing::info!("brain stopped");
            Ok(0)
        }
        Cmd::Secret(cmd) => super::secrets::run(&target, cmd).await,
        Cmd::Token(TokenCmd::Create { ttl, labels }) => {
            let mut c = target.connect().await?;
            let resp = c
                .create_token(proto::CreateTokenRequest {
                    ttl_seconds: ttl.as_secs().max(1),
                    labels: labels.into_iter().collect(),
                })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            out!("{}", resp.token);
            eprintln!(
                "one-time token, valid for {}; on the worker machine run:",
                humantime::format_duration(ttl)
            );
            eprintln!(
                "  worker join --brain {} --token {} --ca-hash {}",
                target.url, resp.token, resp.ca_hash
            );
            Ok(0)
        }
        Cmd::Workers { json } => {
            let mut c = target.connect().await?;
            let list = c
                .list_workers(proto::ListWorkersRequest {})
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            print_workers(&list.workers, json);
            Ok(0)
        }
        Cmd::Machines {
            cmd: Some(MachinesCmd::Release { id }),
            ..
        } => {
            let mut c = target.connect().await?;
            let m = c
                .release_machine(proto::ReleaseMachineRequest { id })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner()
                .machine
                .unwrap_or_default();
            out!(
                "released {} ({}, cost ${:.4}); its worker {} is revoked",
                m.id,
                m.provider,
                m.cost_usd,
                if m.worker_id.is_empty() {
                    "(none joined)"
                } else {
                    &m.worker_id
                }
            );
            Ok(0)
        }
        Cmd::Machines {
            cmd: None,
            json,
            all,
        } => {
            let mut c = target.connect().await?;
            let list = c
                .list_machines(proto::ListMachinesRequest { all })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            print_machines(&list.machines, json);
            Ok(0)
        }
        Cmd::Provision(p) => provision(&target, p).await,
        Cmd::Worker(WorkerCmd::Revoke { worker }) => {
            let mut c = target.connect().await?;
            let r = c
                .revoke_worker(proto::RevokeWorkerRequest { worker })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            out!(
                "revoked {}{}",
                r.worker_id,
                if r.session_closed {
                    " (open session closed)"
                } else {
                    ""
                }
            );
            Ok(0)
        }
        Cmd::Exec(args) => Ok(exec(&target, args).await),
        Cmd::Run(args) => run_task(&target, args).await,
        Cmd::Approve { task } => decide(&target, &task, true, String::new()).await,
        Cmd::Deny { task, reason } => decide(&target, &task, false, reason).await,
        Cmd::Task(TaskCmd::Move {
            task,
            to,
            wait: Some(wait),
        }) => super::follow::move_and_wait(&target, &task, &to, wait).await,
        Cmd::Task(TaskCmd::Move {
            task,
            to,
            wait: None,
        }) => {
            let mut c = target.connect().await?;
            let r = c
                .move_task(proto::MoveTaskRequest {
                    task_id: task.clone(),
                    to,
                })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            out!(
                "{task} will move to {} at its next tool-call boundary (brain watch {task} shows it)",
                r.to
            );
            Ok(0)
        }
        Cmd::Task(TaskCmd::Resume { task, budget }) => {
            let budget = budget.to_proto()?;
            if budget == proto::Budget::default() {
                bail!("say how much more: --budget-usd, --max-tokens, --max-steps or --max-wall");
            }
            let mut c = target.connect().await?;
            c.resume_task(proto::ResumeTaskRequest {
                task_id: task.clone(),
                budget: Some(budget),
            })
            .await
            .map_err(|s| status(s, &target.url))?;
            eprintln!("{task} resumed; following it (Ctrl-C detaches)");
            follow(&target, &task, true, false, 0).await?;
            Ok(0)
        }
        Cmd::Tasks { json } => {
            let mut c = target.connect().await?;
            let list = c
                .list_tasks(proto::ListTasksRequest {})
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            if json {
                let all: Vec<serde_json::Value> = list.tasks.iter().map(task_json).collect();
                out!("{}", serde_json::Value::Array(all));
                return Ok(0);
            }
            out!(
                "{:<10} {:<10} {:<10} {:>9}  {:<16} {:<30} REASON",
                "ID",
                "STATUS",
                "CHECK",
                "STEPS",
                "WORKER",
                "GOAL"
            );
            for t in list.tasks {
                out!(
                    "{:<10} {:<10} {:<10} {:>4}/{:<4}  {:<16} {:<30} {}",
                    t.id,
                    t.status,
                    if t.verification.is_empty() {
                        "-"
                    } else {
                        &t.verification
                    },
                    t.steps_done,
                    t.steps_total,
                    if t.worker.is_empty() { "-" } else { &t.worker },
                    t.goal.chars().take(30).collect::<String>(),
                    t.reason
                );
            }
            Ok(0)
        }
        Cmd::Task(TaskCmd::Show { task, json }) => {
            let mut c = target.connect().await?;
            let list = c
                .list_tasks(proto::ListTasksRequest {})
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            let id: crate::model::TaskId = task.parse().map_err(|e: String| anyhow::anyhow!(e))?;
            let t = list
                .tasks
                .into_iter()
                .find(|t| t.id == id.to_string())
                .ok_or_else(|| anyhow::anyhow!("no task {task}: see `brain tasks`"))?;
            if json {
                out!("{}", task_json(&t));
                return Ok(0);
            }
            out!(
                "id:      {}\nstatus:  {}\ngoal:    {}\nworker:  {}\nsteps:   {}/{}\nreason:  {}",
                t.id,
                t.status,
                t.goal,
                t.worker,
                t.steps_done,
                t.steps_total,
                t.reason
            );
            if !t.model.is_empty() {
                let l = t.limits.unwrap_or_default();
                let limit = |v: String, set: bool| if set { v } else { "no limit".into() };
                out!(
                    "model:   {} (permission {})\ntokens:  {} of {}\ncost:    ${:.4} of {}\nwall:    {}",
                    t.model,
                    t.permission,
                    t.tokens,
                    limit(l.tokens.to_string(), l.tokens > 0),
                    t.spent_usd,
                    limit(format!("${:.4}", l.usd), l.usd > 0.0),
                    limit(
                        humantime::format_duration(Duration::from_millis(l.wall_ms)).to_string(),
                        l.wall_ms > 0
                    ),
                );
            }
            if !t.verification.is_empty() {
                let check = if t.check.is_empty() {
                    "none".to_string()
                } else {
                    format!("`{}`", t.check)
                };
                out!("result:  {} (acceptance check: {check})", t.verification);
                if !t.check_result.is_empty() {
                    out!("last check: {}", t.check_result);
                    for l in t.check_output.lines().take(20) {
                        out!("    | {l}");
                    }
                }
            }
            show_attempts(&t);
            if !t.origin.is_empty() {
                out!("origin:  {}", t.origin);
                out!(
                    "deliver: {}",
                    if t.delivery.is_empty() {
                        format!("{} (not delivered yet)", t.deliver)
                    } else {
                        t.delivery.clone()
                    }
                );
            }
            Ok(0)
        }
        Cmd::Task(TaskCmd::Diff { task, stat, at }) => {
            let form = if stat { "stat" } else { "diff" };
            super::results::diff(&target, &task, form, at.as_deref().unwrap_or("")).await
        }
        Cmd::Task(TaskCmd::Patch { task }) => {
            super::results::diff(&target, &task, "patch", "").await
        }
        Cmd::Task(TaskCmd::Export { task, dir }) => {
            super::results::export(&target, &task, &dir).await
        }
        Cmd::Task(TaskCmd::Deliver { task, pr, json }) => {
            super::results::deliver(&target, &task, pr, json).await
        }
        Cmd::Task(TaskCmd::Wait {
            task,
            until,
            timeout,
            json,
        }) => super::follow::wait(&target, &task, &until, timeout, json).await,
        Cmd::Task(TaskCmd::Log { task, json }) => {
            follow(&target, &task, false, json, 0).await?;
            Ok(0)
        }
        Cmd::Watch { task, since, json } => {
            follow(&target, &task, true, json, since).await?;
            Ok(0)
        }
        Cmd::Task(TaskCmd::Cancel { task }) => {
            let mut c = target.connect().await?;
            c.cancel_task(proto::CancelTaskRequest {
                task_id: task.clone(),
            })
            .await
            .map_err(|s| status(s, &target.url))?;
            out!("cancel requested for {task}");
            Ok(0)
        }
        Cmd::Backup { file } => {
            let mut c = target.connect().await?;
            let mut stream = c
                .backup(proto::BackupRequest {})
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            let mut chunks = Vec::new();
            while let Some(chunk) = stream.message().await.map_err(|s| status(s, &target.url))? {
                chunks.push(chunk.data);
            }
            crate::storage::save(&file, &chunks)
                .with_context(|| format!("writing {}", file.display()))?;
            let lines: usize = chunks
                .iter()
                .map(|c| c.iter().filter(|b| **b == b'\n').count())
                .sum();
            out!("backup of {lines} records written to {}", file.display());
            Ok(0)
        }
        Cmd::Restore { file } => {
            let (n, moved) = crate::storage::restore(&file, &data.db())?;
            out!("restored {n} records into {}", data.db().display());
            if let Some(m) = moved {
                out!("the previous store was moved to {}", m.display());
            }
            Ok(0)
        }
        Cmd::Demo { keep, model } => {
            let worker = crate::provision::local::WorkerProgram::beside_this_program()
                .map_err(|e| anyhow::anyhow!("{e}; or run `cargo run --release -- demo`"))?;
            crate::admin::demo::run(worker, keep, model).await?;
            Ok(0)
        }
        Cmd::File(cmd) => file(&target, cmd).await,
        Cmd::Admin(AdminCmd::Issue { name, out }) => {
            let mut c = target.connect().await?;
            let (key, csr) = pki::new_key_and_csr(&name)?;
            let resp = c
                .issue_admin(proto::IssueAdminRequest {
                    name: name.clone(),
                    csr_der: csr,
                })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            IdentityFiles {
                ca_pem: resp.ca_pem,
                cert_pem: resp.cert_pem,
                key_pem: key.serialize_pem(),
            }
            .save(&out)?;
            out!(
                "admin identity {name} written to {}; use it with --identity {} --brain {}",
                out.display(),
                out.display(),
                target.url
            );
            Ok(0)
        }
        Cmd::Admin(AdminCmd::Revoke { name }) => {
            let mut c = target.connect().await?;
            c.revoke_admin(proto::RevokeAdminRequest { name: name.clone() })
                .await
                .map_err(|s| status(s, &target.url))?;
            out!("admin identity {name} revoked");
            Ok(0)
        }
        Cmd::Admin(AdminCmd::Token(cmd)) => super::web::token(&target, cmd).await,
        Cmd::Web(WebCmd::Login {
            name,
            role,
            ttl,
            json,
        }) => super::web::login(&target, &name, &role, ttl, json).await,
    }
}

fn spawn_signal_handler(stop: CancellationToken) {
    tokio::spawn(async move {
        shared::signals::terminated().await;
        stop.cancel();
    });
}

/// `tether demo`: runs the demo with workers started as `<this program> worker ...`.
pub fn run_demo(keep: bool, model: Option<String>) -> i32 {
    hold_keys_close();
    // The demo narrates on stdout; the brain's own log would only interleave with it.
    shared::telemetry::init("error");
    let worker = match crate::provision::local::WorkerProgram::beside_this_program() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    };
    let Some(rt) = runtime() else {
        return 1;
    };
    match rt.block_on(crate::admin::demo::run(worker, keep, model)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

/// A task as `--json` shows it; field names are stable.
fn task_json(t: &proto::TaskSummary) -> serde_json::Value {
    let l = t.limits.unwrap_or_default();
    serde_json::json!({
        "id": t.id, "status": t.status, "goal": t.goal, "worker": t.worker,
        "steps_done": t.steps_done, "steps_total": t.steps_total,
        "created_unix_ms": t.created_unix_ms, "updated_unix_ms": t.updated_unix_ms,
        "reason": t.reason, "model": t.model, "permission": t.permission,
        "tokens": t.tokens, "spent_usd": t.spent_usd,
        "limits": {"usd": l.usd, "tokens": l.tokens, "steps": l.steps, "wall_ms": l.wall_ms},
        "verification": t.verification, "verified": t.verification == "verified",
        "check": t.check, "check_result": t.check_result, "check_output": t.check_output,
        "origin": t.origin, "deliver": t.deliver, "delivery": t.delivery,
        "delivery_url": t.delivery_url,
        "attempts": t.attempts.iter().map(|a| serde_json::json!({
            "number": a.number, "task": a.task_id, "model": a.model, "escalation": a.escalation,
            "status": a.status, "worker": a.worker, "check": a.check, "verified": a.verified,
            "steps": a.steps, "tokens": a.tokens, "spent_usd": a.spent_usd,
            "files_changed": a.files_changed, "lines_changed": a.lines_changed,
            "reason": a.reason,
        })).collect::<Vec<_>>(),
        "picked": t.picked, "pick": t.pick,
        "attempt_of": t.attempt_of, "attempt_number": t.attempt_number,
    })
}

/// A task's attempts as `brain task show` lists them.
fn show_attempts(t: &proto::TaskSummary) {
    if !t.attempt_of.is_empty() {
        out!("attempt: {} of {}", t.attempt_number, t.attempt_of);
    }
    if t.attempts.is_empty() {
        return;
    }
    let winner = if t.picked.is_empty() {
        String::new()
    } else {
        format!("; won by {}", t.picked)
    };
    out!("attempts: {} (pick {}{winner})", t.attempts.len(), t.pick);
    out!(
        "  {:>2}  {:<8} {:<12} {:<16} {:<24} {:>5} {:>8}  change",
        "#",
        "task",
        "worker",
        "status",
        "check",
        "steps",
        "tokens"
    );
    for a in &t.attempts {
        let change = if a.status.is_empty() || a.files_changed + a.lines_changed == 0 {
            "-".to_string()
        } else {
            format!("{} files, {} lines", a.files_changed, a.lines_changed)
        };
        let mark = if a.task_id == t.picked { "*" } else { " " };
        out!(
            "{mark} {:>2}  {:<8} {:<12} {:<16} {:<24} {:>5} {:>8}  {change}{}",
            a.number,
            a.task_id,
            a.worker,
            a.status,
            a.check,
            a.steps,
            a.tokens,
            if a.escalation {
                format!(" (escalated to {})", a.model)
            } else {
                String::new()
            }
        );
    }
}
