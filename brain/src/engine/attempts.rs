//! The driver of a task run as attempts: it starts each attempt as a task of its own from the
//! parent's base, records how each ended, picks the winner by the brain's own run of the
//! check, stops the rest, and ends with the winner's result. What it does next is
//! [`decide`]d from the parent's log and its attempts' states, so a brain killed at any point
//! goes on where it was: an attempt made before its start was logged is adopted, not made
//! twice, and the pick is logged once.

use std::sync::Arc;
use std::time::Duration;

use super::Engine;
use super::error::Error;
use super::store::Task;
use crate::model::attempts::{
    AttemptEnd, AttemptOf, Attempts, Child, Next, Spend, WALL_GRACE_MS, decide,
};
use crate::model::event::{Event, TaskId};
use crate::model::state::{Status, TaskState};

/// Drives the parent `task` until it ends. An error appending to a log pauses it and it
/// goes on from the log's state.
pub(super) async fn run(engine: Engine, task: Arc<Task>) {
    let mut delay = Duration::from_secs(1);
    loop {
        match drive(&engine, &task).await {
            Ok(()) => return,
            Err(e) => {
                tracing::error!(task = %task.id, error = %e, retry_in = ?delay, "attempts cannot write their log; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(60));
            }
        }
    }
}

async fn drive(engine: &Engine, task: &Arc<Task>) -> Result<(), Error> {
    loop {
        let st = task.state();
        let Some(a) = st.attempts.as_deref() else {
            return Ok(());
        };
        if !st.status.goes_on() {
            return Ok(());
        }
        let children = children(engine, a);
        let (spent, budget) = spend(engine, &st, a, &children);
        let next = decide(a, &children, task.cancel.is_cancelled(), spent, budget);
        tracing::trace!(task = %task.id, ?next, "attempts: next");
        let store = engine.store();
        match next {
            Next::Start {
                index,
                model,
                escalation,
            } => {
                let child = match adopt(engine, task.id, index) {
                    Some(id) => id,
                    None => {
                        let left = left(spent, budget);
                        create(engine, &st, a, index, &model, escalation, left).await?
                    }
                };
                tracing::info!(task = %task.id, attempt = index + 1, child = %child, %model, escalation, "attempt started");
                let running = a.list.iter().filter(|x| x.end.is_none()).count() + 1;
                store
                    .append(
                        task,
                        vec![
                            Event::AttemptStarted {
                                index,
                                attempt: child,
                                model,
                                escalation,
                            },
                            status(running, a.list.len() + 1),
                        ],
                    )
                    .await?;
            }
            Next::Record(indexes) => {
                let mut events = vec![];
                for index in indexes {
                    let Some(at) = a.get(index) else { continue };
                    let end = ended(engine, &st, at.task).await;
                    tracing::info!(task = %task.id, attempt = index + 1, child = %at.task, status = %end.status, verified = end.verified, lines = end.lines_changed, "attempt ended");
                    events.push(Event::AttemptEnded { index, end });
                }
                let running = a.list.iter().filter(|x| x.end.is_none()).count() - events.len();
                events.push(status(running, a.list.len()));
                let ended: Vec<TaskId> = events
                    .iter()
                    .filter_map(|e| match e {
                        Event::AttemptEnded { index, .. } => a.get(*index).map(|x| x.task),
                        _ => None,
                    })
                    .collect();
                store.append(task, events).await?;
                release(engine, task.id, &ended).await;
            }
            Next::Pick { index, why } => {
                let Some(at) = a.get(index) else {
                    return Ok(());
                };
                let root = at.end.as_ref().map(|e| e.root.clone()).unwrap_or_default();
                let check = store
                    .task(at.task)
                    .and_then(|c| c.state().last_check)
                    .unwrap_or_default();
                tracing::info!(task = %task.id, attempt = index + 1, child = %at.task, %why, "attempt picked");
                store
                    .append(
                        task,
                        vec![Event::AttemptPicked {
                            index,
                            attempt: at.task,
                            why,
                            root_hash: root,
                            check,
                        }],
                    )
                    .await?;
            }
            Next::Cancel { tasks, why } => {
                for id in tasks {
                    if let Some(c) = store.task(id)
                        && !c.cancel.is_cancelled()
                    {
                        tracing::info!(task = %task.id, child = %id, %why, "stopping an attempt");
                        c.cancel_for(&format!("stopped by {}: {why}", task.id));
                    }
                }
                wait(task, &st, budget).await;
            }
            Next::Finish { outcome, reason } => {
                // Again for all: a crash may have come between an attempt's end and its
                // release (what a crash after this leaves, the reaper takes).
                let all: Vec<TaskId> = a.list.iter().map(|x| x.task).collect();
                release(engine, task.id, &all).await;
                tracing::info!(task = %task.id, ?outcome, %reason, "task ended");
                store
                    .append(
                        task,
                        vec![Event::Finished {
                            outcome,
                            reason,
                            verified: None,
                        }],
                    )
                    .await?;
                return Ok(());
            }
            Next::Wait => wait(task, &st, budget).await,
        }
    }
}

/// Releases the machines provisioned for `ended` attempts.
async fn release(engine: &Engine, parent: TaskId, ended: &[TaskId]) {
    let envs = &engine.inner.core.ports.environments;
    for child in ended {
        for m in envs.release_for_task(&child.to_string()).await {
            tracing::info!(task = %parent, %child, machine = %m, "released the machine of an attempt that ended");
        }
    }
}

/// How the parent stands, as its status reason.
fn status(running: usize, started: usize) -> Event {
    Event::StatusChanged {
        status: Status::Running,
        reason: format!("{running} of {started} attempts"),
    }
}

/// The parent's attempts as they stand now.
fn children(engine: &Engine, a: &Attempts) -> Vec<Child> {
    a.list
        .iter()
        .map(|x| {
            let st = engine.store().task(x.task).map(|t| t.state());
            let spent = st.as_ref().and_then(|s| s.agent.as_ref()).map(|g| g.spent);
            Child {
                index: x.index,
                task: x.task,
                // A task that is not there any more will not go on either.
                stopped: st.as_ref().is_none_or(|s| !s.status.goes_on()),
                tokens: spent.map_or(0, |s| s.tokens),
                usd: spent.map_or(0.0, |s| s.usd),
            }
        })
        .collect()
}

/// What all attempts have spent (models and machines), and the budget over all of them.
fn spend(engine: &Engine, st: &TaskState, a: &Attempts, children: &[Child]) -> (Spend, Spend) {
    let machines: f64 = children
        .iter()
        .map(|c| {
            engine
                .inner
                .core
                .ports
                .environments
                .task_cost(&c.task.to_string())
        })
        .sum();
    let spent = Spend {
        tokens: children.iter().map(|c| c.tokens).sum(),
        usd: children.iter().map(|c| c.usd).sum::<f64>() + machines,
        wall_ms: (shared::now_unix_ms() - st.created_ms).max(0) as u64,
    };
    let b = a.template.budget;
    let budget = Spend {
        tokens: b.tokens,
        usd: b.usd,
        wall_ms: b.wall_ms,
    };
    (spent, budget)
}

/// What is left of the budget over all attempts: an attempt starts with no more than that
/// (each limit at least 1, so 0 still means "no limit"), so one that runs to its own wall
/// budget stops, and checks its last change, by the time the parent's runs out.
fn left(spent: Spend, budget: Spend) -> Spend {
    let cut = |b: u64, s: u64| {
        if b == 0 {
            0
        } else {
            b.saturating_sub(s).max(1)
        }
    };
    Spend {
        tokens: cut(budget.tokens, spent.tokens),
        usd: if budget.usd > 0.0 {
            (budget.usd - spent.usd).max(1e-6)
        } else {
            0.0
        },
        wall_ms: cut(budget.wall_ms, spent.wall_ms),
    }
}

/// Waits for an attempt to change, the parent to be cancelled, or its wall budget to run
/// out. An attempt's append wakes the parent (the store does), so no change is missed.
async fn wait(task: &Task, st: &TaskState, budget: Spend) {
    let wall = async {
        if budget.wall_ms == 0 {
            return std::future::pending().await;
        }
        let end = st.created_ms + (budget.wall_ms + WALL_GRACE_MS) as i64;
        let left = (end - shared::now_unix_ms()).max(0) as u64;
        tokio::time::sleep(Duration::from_millis(left + 1)).await;
    };
    let cancel = async {
        // Once cancelled, the parent waits for its attempts to end, not for the token.
        if task.cancel.is_cancelled() {
            std::future::pending::<()>().await;
        }
        task.cancel.cancelled().await;
    };
    tokio::select! {
        _ = task.wake.notified() => {}
        _ = cancel => {}
        _ = wall => {}
    }
}

/// The attempt the store already holds for `index` of `parent` (made before a crash
/// stopped its start from being logged).
fn adopt(engine: &Engine, parent: TaskId, index: u32) -> Option<TaskId> {
    let want = Some(AttemptOf { parent, index });
    engine
        .store()
        .all()
        .into_iter()
        .find(|t| t.state().attempt_of == want)
        .map(|t| t.id)
}

/// Makes attempt `index` of the parent `st`: a task of its own from the parent's base, and
/// starts its driver.
async fn create(
    engine: &Engine,
    st: &TaskState,
    a: &Attempts,
    index: u32,
    model: &str,
    escalation: bool,
    left: Spend,
) -> Result<TaskId, Error> {
    let mut spec = a.template.clone();
    if model != spec.model {
        // Another model gets its own default assists, unless the run chose others.
        use crate::model::assists::Assists;
        let llm = engine.inner.core.llm.get();
        let default = |m: &str| Assists::for_model(m, &llm, None).ok();
        if spec.assists.is_some() && spec.assists == default(&spec.model) {
            spec.assists = default(model).or(spec.assists);
        }
    }
    spec.model = model.to_string();
    spec.budget.tokens = left.tokens;
    spec.budget.usd = left.usd;
    spec.budget.wall_ms = left.wall_ms;
    spec.sampling = Some(a.spec.sampling_of(st.id, index));
    let goal = if escalation {
        a.escalation_goal(&st.goal)
    } else {
        st.goal.clone()
    };
    let parent = st.id;
    let task = engine
        .store()
        .create(|id| {
            let mut events = vec![Event::Created {
                goal,
                workspace: id.workspace(),
                plan: None,
                agent: Some(Box::new(spec)),
                egress: None,
                attempts: None,
                attempt_of: Some(AttemptOf { parent, index }),
            }];
            if !a.spec.worker.is_empty() {
                events.push(Event::WorkerAssigned {
                    worker: a.spec.worker.clone(),
                });
            }
            if !st.require_labels.is_empty() {
                events.push(Event::Placement {
                    require_labels: st.require_labels.clone(),
                });
            }
            if !st.sync_rules.is_default() {
                events.push(Event::WorkspaceRules {
                    rules: st.sync_rules.clone(),
                });
            }
            if !st.seed_root.is_empty() {
                let origin = st.origin.clone().unwrap_or_default();
                events.push(Event::WorkspaceSeeded {
                    root_hash: st.seed_root.clone(),
                    source: a.base_source.clone(),
                    files: a.base_files,
                    bytes: a.base_bytes,
                    commit: origin.commit,
                    branch: origin.branch,
                });
            }
            events
        })
        .await?;
    engine.spawn_driver(task.clone());
    Ok(task.id)
}

/// How attempt `child` ended, measured against the parent's base.
async fn ended(engine: &Engine, st: &TaskState, child: TaskId) -> AttemptEnd {
    let Some(c) = engine.store().task(child).map(|t| t.state()) else {
        return AttemptEnd {
            status: Status::Failed,
            verified: false,
            reason: format!("its task {child} is not in the store"),
            root: String::new(),
            check: String::new(),
            check_output: String::new(),
            files_changed: 0,
            lines_changed: 0,
            steps: 0,
            tokens: 0,
            usd: 0.0,
        };
    };
    let root = match c.barrier_root.as_str() {
        "" => c.seed_root.clone(),
        r => r.to_string(),
    };
    let (files_changed, lines_changed) = engine
        .inner
        .core
        .ports
        .workspaces
        .diff_size(&st.seed_root, &root)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(task = %st.id, %child, error = %e, "cannot measure an attempt's change");
            (0, u64::MAX)
        });
    let spent = c.agent.as_ref().map(|g| g.spent).unwrap_or_default();
    let check = c.last_check.as_ref();
    AttemptEnd {
        status: c.status,
        verified: c.verified(),
        reason: c.reason.clone(),
        root,
        check: check
            .map(|k| {
                if k.passed {
                    "the check passes".to_string()
                } else {
                    format!("the check fails ({})", k.result)
                }
            })
            .unwrap_or_default(),
        check_output: check.map(|k| k.output.clone()).unwrap_or_default(),
        files_changed,
        lines_changed,
        steps: spent.steps,
        tokens: spent.tokens,
        usd: spent.usd,
    }
}
