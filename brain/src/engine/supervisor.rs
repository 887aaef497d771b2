//! Runs a task's driver until the task ends or stops: builds the facts, asks the shared
//! [`preamble`] and then the driver what to do, performs it, and asks again. A crash
//! anywhere is just "rebuild the state from the log, ask again". An error appending to the
//! log (disk full, I/O) pauses the task and retries from the log's state.

use std::sync::Arc;
use std::time::Duration;

use super::agent::AgentDriver;
use super::core::{Core, Cx};
use super::driver::{Action, Driver, Facts, preamble};
use super::effects;
use super::error::Error;
use super::plan::PlanDriver;
use super::ports::Occupancy;
use super::store::Task;

/// Drives `task` until it ends or stops for budget.
pub async fn run(core: Arc<Core>, task: Arc<Task>) {
    if task.state().agent.is_some() {
        let mut driver = AgentDriver::new(core.llm.get(), core.redact.clone());
        keep_driving(&core, &task, &mut driver).await;
    } else {
        keep_driving(&core, &task, &mut PlanDriver).await;
    }
}

/// Drives `task` with `driver`; an error writing the log is retried from the log's state.
async fn keep_driving<D: Driver>(core: &Core, task: &Arc<Task>, driver: &mut D) {
    let cx = Cx { core, task };
    let mut delay = Duration::from_secs(1);
    loop {
        let done = drive(&cx, &mut *driver).await;
        // Stopped or ended: it holds no room on any worker.
        let st = task.state();
        if st.status.is_terminal() || st.status == crate::model::event::Status::BudgetExhausted {
            core.ports.placement.occupy(task.id.0, None);
        }
        match done {
            Ok(()) => return,
            Err(Error::Log(super::log::Error::Fenced { task: id, now })) => {
                // Another brain holds the task now and goes on from its log.
                tracing::warn!(task = %id, %now, "this brain no longer drives the task");
                core.ports.placement.occupy(task.id.0, None);
                core.store.forget(task.id);
                return;
            }
            Err(e) => {
                // Nothing was acted on that the log does not show; try again from its state.
                tracing::error!(task = %task.id, error = %e, retry_in = ?delay, "task cannot write its log; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(60));
            }
        }
    }
}

/// What a decision needs from outside the log, now.
fn facts(cx: &Cx<'_>) -> Facts {
    let agent = cx.task.state().agent.is_some();
    Facts {
        cancelled: cx.task.cancelled_why(),
        move_request: cx.task.move_request(),
        now_ms: shared::now_unix_ms(),
        machines_usd: if agent { cx.machines_cost() } else { 0.0 },
        can_move: agent && cx.can_move(),
        disk_quota: cx.core.opts.disk_quota,
    }
}

/// A driver that starts where calls were settled but no barrier followed them (the brain
/// that settled them stopped in between: killed, or its lease moved) takes that barrier
/// first, as the one before it would have: what comes next (the model's view of the
/// workspace, the loop detector, a move) needs the mirror to follow the disk.
async fn catch_up_barrier(cx: &Cx<'_>) -> Result<(), Error> {
    let st = cx.task.state();
    let behind = st.unsynced_calls > 0 || st.unsure_unsynced;
    if st.status.is_terminal() || st.pending.is_some() || !behind {
        return Ok(());
    }
    let Some(worker) = st.worker else {
        return Ok(());
    };
    if cx.ports().workers.is_connected(&worker) {
        tracing::info!(task = %cx.task.id, calls = st.unsynced_calls, "taking the barrier the calls settled before this driver started were owed");
        effects::barrier(cx, &worker, false).await?;
    }
    Ok(())
}

/// Where the task is, as placement counts it: the worker it is moving to (asked or under
/// way), else the one it is on.
fn occupancy(st: &crate::model::state::TaskState, f: &Facts) -> Option<Occupancy> {
    if st.status.is_terminal() || st.status == crate::model::event::Status::BudgetExhausted {
        return None;
    }
    match st.moving_to.clone().or_else(|| f.move_request.clone()) {
        Some(to) => Some(Occupancy {
            worker: to,
            moving: true,
        }),
        None => st.worker.clone().map(|worker| Occupancy {
            worker,
            moving: false,
        }),
    }
}

async fn drive<D: Driver>(cx: &Cx<'_>, driver: &mut D) -> Result<(), Error> {
    catch_up_barrier(cx).await?;
    loop {
        let st = cx.task.state();
        let f = facts(cx);
        cx.ports()
            .placement
            .occupy(cx.task.id.0, occupancy(&st, &f));
        let action = preamble(&st, &f).unwrap_or_else(|| driver.next(&st, &f));
        tracing::trace!(task = %cx.task.id, ?action, "next");
        match action {
            Action::Stop => return Ok(()),
            Action::Finish {
                outcome,
                reason,
                before,
            } => effects::finish(cx, outcome, reason, before).await?,
            Action::Log(events) => cx.store().append(cx.task, events).await?,
            Action::Settle(p) => {
                let (worker, changes) = (p.worker.clone(), !p.call.is_read_only());
                driver.settle(cx, p).await?;
                // The mirror follows the disk after every call that can change it.
                if changes
                    && cx.task.state().pending.is_none()
                    && cx.ports().workers.is_connected(&worker)
                {
                    effects::barrier(cx, &worker, false).await?;
                }
            }
            Action::Move(to) => effects::move_task(cx, &to).await?,
            Action::Seed => effects::seed(cx).await?,
            Action::Place => effects::place(cx).await?,
            Action::Issue {
                call,
                step,
                purpose,
            } => effects::issue(cx, call, step, purpose).await?,
            Action::AwaitDecision => effects::await_decision(cx).await,
            Action::Driver(own) => driver.act(cx, own).await?,
        }
    }
}
