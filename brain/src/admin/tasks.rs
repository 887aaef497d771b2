//! `brain tasks` and `brain task ...`: a task's state, log, result and control, each
//! subcommand a function of its own over one admin call (`Target::rpc`).

use std::time::Duration;

use anyhow::bail;

use super::args::TaskCmd;
use super::client::Target;
use super::follow::{View, follow};

/// `brain task SUBCOMMAND`.
pub async fn run(t: &Target, cmd: TaskCmd) -> anyhow::Result<i32> {
    match cmd {
        TaskCmd::Show { task, json } => show(t, &task, json).await,
        TaskCmd::Log {
            task,
            call,
            json,
            full,
        } => {
            follow(
                t,
                &task,
                false,
                View::pick(json, full || call.is_some()),
                0,
                call,
            )
            .await?;
            Ok(0)
        }
        TaskCmd::Wait {
            task,
            until,
            timeout,
            json,
        } => super::follow::wait(t, &task, &until, timeout, json).await,
        TaskCmd::Prompt {
            task,
            at,
            seq,
            json,
        } => super::sent::show(t, &task, at, seq, json).await,
        TaskCmd::Cancel { task } => cancel(t, task).await,
        TaskCmd::Move {
            task,
            to,
            wait: Some(wait),
        } => super::follow::move_and_wait(t, &task, &to, wait).await,
        TaskCmd::Move {
            task,
            to,
            wait: None,
        } => move_at_boundary(t, task, to).await,
        TaskCmd::Resume { task, budget } => resume(t, task, budget).await,
        TaskCmd::Diff { task, stat, at } => {
            let form = if stat { "stat" } else { "diff" };
            super::results::diff(t, &task, form, at.as_deref().unwrap_or("")).await
        }
        TaskCmd::Patch { task } => super::results::diff(t, &task, "patch", "").await,
        TaskCmd::Export { task, dir } => super::results::export(t, &task, &dir).await,
        TaskCmd::Deliver { task, pr, json } => super::results::deliver(t, &task, pr, json).await,
    }
}

/// Every task, as the brain has them now.
async fn all(t: &Target) -> anyhow::Result<Vec<proto::TaskSummary>> {
    let req = proto::ListTasksRequest {};
    Ok(t.rpc(async |mut c| c.list_tasks(req).await).await?.tasks)
}

/// `brain tasks`.
pub async fn list(t: &Target, json: bool) -> anyhow::Result<i32> {
    let tasks = all(t).await?;
    if json {
        let all: Vec<serde_json::Value> = tasks.iter().map(task_json).collect();
        out!("{}", serde_json::Value::Array(all));
        return Ok(0);
    }
    // Workers by name where they have one (`--json` keeps the ids programs use).
    let names = super::follow::worker_names(t).await;
    out!(
        "{:<10} {:<10} {:<10} {:>9}  {:<16} {:<30} REASON",
        "ID",
        "STATUS",
        "CHECK",
        "STEPS",
        "WORKER",
        "GOAL"
    );
    for t in tasks {
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
            match names.get(&t.worker) {
                Some(name) => name.as_str(),
                None if t.worker.is_empty() => "-",
                None => &t.worker,
            },
            t.goal.chars().take(30).collect::<String>(),
            // One line a task: the whole reason is `task show`'s.
            super::glance::one_line(&t.reason, 100)
        );
    }
    Ok(0)
}

/// `brain task show`.
async fn show(target: &Target, task: &str, json: bool) -> anyhow::Result<i32> {
    let id: crate::model::TaskId = task.parse()?;
    let t = all(target)
        .await?
        .into_iter()
        .find(|t| t.id == id.to_string())
        .ok_or_else(|| anyhow::anyhow!("no task {task}: see `brain tasks`"))?;
    if json {
        out!("{}", task_json(&t));
        return Ok(0);
    }
    let worker = match super::follow::worker_names(target).await.get(&t.worker) {
        Some(name) => format!("{name} ({})", t.worker),
        None => t.worker.clone(),
    };
    out!(
        "id:      {}\nstatus:  {}\ngoal:    {}\nworker:  {}\nsteps:   {}/{}\nreason:  {}",
        t.id,
        t.status,
        t.goal,
        worker,
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
        out!(
            "assists: {}",
            if t.assists.is_empty() {
                "none"
            } else {
                t.assists.as_str()
            }
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

/// `brain task cancel`.
async fn cancel(t: &Target, task: String) -> anyhow::Result<i32> {
    let req = proto::CancelTaskRequest {
        task_id: task.clone(),
    };
    t.rpc(async |mut c| c.cancel_task(req).await).await?;
    out!("cancel requested for {task}");
    Ok(0)
}

/// `brain task move` without `--wait`: asked for, taken at the next boundary.
async fn move_at_boundary(t: &Target, task: String, to: String) -> anyhow::Result<i32> {
    let req = proto::MoveTaskRequest {
        task_id: task.clone(),
        to,
    };
    let r = t.rpc(async |mut c| c.move_task(req).await).await?;
    out!(
        "{task} will move to {} at its next tool-call boundary (brain watch {task} shows it)",
        r.to
    );
    Ok(0)
}

/// `brain task resume`: more budget, then follows it.
async fn resume(t: &Target, task: String, budget: super::args::BudgetArgs) -> anyhow::Result<i32> {
    let budget = budget.to_proto()?;
    if budget == proto::Budget::default() {
        bail!("say how much more: --budget-usd, --max-tokens, --max-steps or --max-wall");
    }
    let req = proto::ResumeTaskRequest {
        task_id: task.clone(),
        budget: Some(budget),
    };
    t.rpc(async |mut c| c.resume_task(req).await)
        .await
        .map_err(|e| {
            if e.to_string().contains("would stop again") {
                e.context("not resumed: give more of what ran out (--budget-usd, --max-tokens, --max-steps or --max-wall)")
            } else {
                e
            }
        })?;
    err!("{task} resumed; following it (Ctrl-C detaches)");
    follow(t, &task, true, View::Glance, 0, None).await?;
    Ok(0)
}

/// A task as `--json` shows it; field names are stable.
fn task_json(t: &proto::TaskSummary) -> serde_json::Value {
    let l = t.limits.unwrap_or_default();
    serde_json::json!({
        "id": t.id, "status": t.status, "goal": t.goal, "worker": t.worker,
        "steps_done": t.steps_done, "steps_total": t.steps_total,
        "created_unix_ms": t.created_unix_ms, "updated_unix_ms": t.updated_unix_ms,
        "reason": t.reason, "model": t.model, "permission": t.permission,
        "assists": t.assists,
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
