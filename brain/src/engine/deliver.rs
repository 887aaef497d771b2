//! Delivering a task's result as a git branch, and a pull request, through the
//! [`Delivery`](super::ports::Delivery) port. Every step is in the log before the next:
//! `DeliveryStarted` (with the commit's id and date, so the same commit is made again after
//! a crash), `DeliveryPushed`, `PullRequestOpened`, `Delivered` or `DeliveryFailed`. A
//! delivery that a crash interrupted is taken up again when the brain starts; pushing the
//! same commit again changes nothing and an open pull request is found before one is
//! opened, so there is one branch and one pull request, never two.

use std::sync::Arc;

use super::core::Core;
use super::error::Error;
use super::ports::{CommitRequest, PullRequestSpec};
use super::store::Task;
use crate::model::delivery::{Delivery, Mode};
use crate::model::event::Event;
use crate::model::{Status, TaskState};

/// The delivery a task still owes, if any: one a crash interrupted, or the one it asked for
/// at creation once it has finished.
pub(super) fn owed(st: &TaskState) -> Option<Mode> {
    st.origin.as_ref()?;
    match &st.delivery {
        Some(d) if !d.done => Some(d.mode),
        None if st.status == Status::Finished && st.deliver != Mode::None => Some(st.deliver),
        _ => None,
    }
}

/// Delivers what `task` owes, if anything; the log says how it went.
pub(super) async fn owed_delivery(core: &Core, task: &Arc<Task>) {
    if let Some(mode) = owed(&task.state())
        && let Err(e) = run(core, task, mode).await
    {
        tracing::warn!(task = %task.id, error = %e, "delivery failed");
    }
}

/// Delivers the task's last barrier: as `<prefix><id>` when it finished, else as
/// `<prefix><id>-wip`; `Mode::Pr` opens a pull request too.
pub(super) async fn run(core: &Core, task: &Arc<Task>, mode: Mode) -> Result<Delivery, Error> {
    let _one = task.delivering.lock().await;
    let port = &core.ports.delivery;
    let st = task.state();
    if let Some(why) = st.attempts.as_ref().and_then(|a| a.no_result(st.id)) {
        return Err(Error::Invalid(why));
    }
    let origin = st.origin.clone().ok_or_else(|| {
        Error::Invalid(format!(
            "task {} did not start from a git repository, so there is no branch to deliver to: its patch or an export of its workspace gives its result",
            st.id
        ))
    })?;
    let root = match st.barrier_root.as_str() {
        "" => st.seed_root.clone(),
        r => r.to_string(),
    };
    let wip = st.status != Status::Finished;
    let branch = format!(
        "{}{}{}",
        port.branch_prefix(),
        st.id,
        if wip { "-wip" } else { "" }
    );
    let mode = if mode == Mode::None {
        Mode::Branch
    } else {
        mode
    };
    let earlier = st
        .delivery
        .clone()
        .filter(|d| d.root == root && d.branch == branch);
    if let Some(d) = &earlier
        && d.delivered()
        && (mode == Mode::Branch || !d.pr_url.is_empty())
    {
        return Ok(d.clone());
    }
    // The same workspace delivered before makes the same commit (same date).
    let date_s = earlier
        .as_ref()
        .map_or(shared::now_unix_ms() / 1000, |d| d.date_s);
    let req = CommitRequest {
        origin: origin.clone(),
        base_root: st.seed_root.clone(),
        root: root.clone(),
        date_s,
        message: core.redact.apply(&message(&st, wip)),
    };
    let fail = |reason: String| async move {
        let reason = core.redact.apply(&reason);
        let _ = core
            .store
            .append(
                task,
                vec![Event::DeliveryFailed {
                    reason: reason.clone(),
                }],
            )
            .await;
        Error::Delivery(reason)
    };
    let commit = match port.commit(&req).await {
        Ok(c) => c,
        Err(e) => return Err(fail(format!("cannot make the commit of task {}: {e}", st.id)).await),
    };
    let resumed = earlier
        .as_ref()
        .filter(|d| !d.done && d.mode == mode && d.commit == commit);
    if resumed.is_none() {
        core.store
            .append(
                task,
                vec![Event::DeliveryStarted {
                    mode,
                    wip,
                    branch: branch.clone(),
                    root: root.clone(),
                    commit: commit.clone(),
                    date_s,
                }],
            )
            .await?;
    } else {
        tracing::info!(task = %st.id, %branch, "taking up an interrupted delivery");
    }
    let now = task.state().delivery.unwrap_or_default();
    if !now.pushed {
        if let Err(e) = port.push(&origin, &commit, &branch).await {
            return Err(fail(format!("pushing {branch} to {}: {e}", origin.url)).await);
        }
        shared::failpoint("deliver-pushed");
        core.store
            .append(
                task,
                vec![Event::DeliveryPushed {
                    branch: branch.clone(),
                    commit: commit.clone(),
                }],
            )
            .await?;
        tracing::info!(task = %st.id, %branch, %commit, "delivered branch pushed");
    }
    if mode == Mode::Pr && now.pr_url.is_empty() {
        let base = if origin.branch.is_empty() {
            return Err(fail(format!(
                "the repository was imported at a detached commit ({}), so there is no branch for a pull request to merge into",
                origin.commit
            ))
            .await);
        } else {
            origin.branch.clone()
        };
        let spec = PullRequestSpec {
            origin_url: origin.url.clone(),
            head: branch.clone(),
            base,
            title: core.redact.apply(&title(&st, wip)),
            body: core.redact.apply(&pr_body(&st, wip)),
        };
        match port.open_pull_request(&spec).await {
            Ok((url, number)) => {
                shared::failpoint("deliver-pr-opened");
                core.store
                    .append(task, vec![Event::PullRequestOpened { url, number }])
                    .await?;
            }
            Err(e) => return Err(fail(format!("opening a pull request for {branch}: {e}")).await),
        }
    }
    core.store
        .append(
            task,
            vec![Event::Delivered {
                branch: branch.clone(),
            }],
        )
        .await?;
    Ok(task.state().delivery.unwrap_or_default())
}

/// Most characters of a commit's first line.
const TITLE: usize = 72;

/// The commit's first line.
fn title(st: &TaskState, wip: bool) -> String {
    let first = |s: &str| {
        s.lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_string)
    };
    let t = if wip {
        format!(
            "Work in progress ({}): {}",
            st.status.as_str(),
            first(&st.goal).unwrap_or_default()
        )
    } else {
        first(&st.reason)
            .or_else(|| first(&st.goal))
            .unwrap_or_else(|| format!("Tether task {}", st.id))
    };
    let t = t.trim();
    if t.is_empty() {
        return format!("Tether task {}", st.id);
    }
    if t.chars().count() <= TITLE {
        return t.to_string();
    }
    // Cut at a word, and say it was cut.
    let head: String = t.chars().take(TITLE - 1).collect();
    let cut = head
        .rfind(' ')
        .filter(|&i| i > TITLE / 2)
        .unwrap_or(head.len());
    format!("{}…", head[..cut].trim_end())
}

/// Whether and how the result was verified, in a sentence.
fn verification(st: &TaskState) -> String {
    let check = st
        .agent
        .as_ref()
        .and_then(|a| a.spec.check.as_ref())
        .map(|c| c.command.clone());
    match (check, &st.last_check) {
        (Some(c), Some(r)) if r.passed && st.verified() => {
            format!("Verified: the acceptance check `{c}` passed on these files.")
        }
        (Some(c), Some(r)) => format!(
            "Not verified: the acceptance check `{c}` did not pass ({}).",
            r.result
        ),
        (Some(c), None) => format!("Not verified: the acceptance check `{c}` never ran."),
        (None, _) => "Not verified: the task had no acceptance check.".into(),
    }
}

/// The message of the commit a delivery of the task makes now.
pub fn commit_message(st: &TaskState) -> String {
    message(st, st.status != Status::Finished)
}

/// The commit message: the summary, the goal, whether it was verified, and the trailer.
fn message(st: &TaskState, wip: bool) -> String {
    let mut m = title(st, wip);
    m.push_str("\n\n");
    // The summary's other lines, or all of it when its first line had to be cut.
    let first_whole = st
        .reason
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .is_some_and(|l| l.chars().count() <= TITLE);
    let rest: Vec<&str> = if first_whole {
        st.reason.trim().lines().skip(1).collect()
    } else {
        st.reason.lines().collect()
    };
    let rest = rest.join("\n");
    if !wip && !rest.trim().is_empty() {
        m.push_str(rest.trim());
        m.push_str("\n\n");
    }
    if wip {
        m.push_str(&format!(
            "The task ended as {} ({}); this is the work it had done.\n\n",
            st.status.as_str(),
            st.reason
        ));
    }
    m.push_str(&format!("Goal: {}\n\n", st.goal.trim()));
    m.push_str(&verification(st));
    m.push_str(&format!("\n\nTether-Task: {}\n", st.id));
    m
}

/// The pull request's description.
fn pr_body(st: &TaskState, wip: bool) -> String {
    let mut b = String::new();
    if wip {
        b.push_str(&format!(
            "**Work in progress**: the task ended as `{}` ({}).\n\n",
            st.status.as_str(),
            st.reason
        ));
    } else {
        b.push_str(&format!("{}\n\n", st.reason.trim()));
    }
    b.push_str(&format!("**Goal:** {}\n\n", st.goal.trim()));
    b.push_str(&format!("**{}**\n\n", verification(st)));
    if let Some(r) = &st.last_check {
        let out: String = r.output.chars().take(3000).collect();
        b.push_str(&format!(
            "<details><summary>Last check output ({})</summary>\n\n```\n{}\n```\n</details>\n\n",
            r.result,
            out.replace("```", "` ` `")
        ));
    }
    let (steps, tokens, usd, model) = match &st.agent {
        Some(a) => (
            a.spent.steps,
            a.spent.tokens,
            a.spent.usd,
            a.spec.model.clone(),
        ),
        None => (st.next_step, 0, 0.0, String::new()),
    };
    b.push_str("| steps | tokens | cost | model | ran on | moves |\n|---|---|---|---|---|---|\n");
    b.push_str(&format!(
        "| {steps} | {tokens} | ${usd:.4} | {} | {} | {} |\n\n",
        if model.is_empty() { "-" } else { &model },
        st.worker.as_deref().unwrap_or("-"),
        st.moves
    ));
    b.push_str(&format!("Tether-Task: {}\n", st.id));
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::delivery::Origin;
    use crate::model::event::TaskId;

    fn finished(reason: &str) -> TaskState {
        let mut st = TaskState::new(TaskId(3));
        st.status = Status::Finished;
        st.reason = reason.into();
        st.goal = "make it pass".into();
        st
    }

    #[test]
    fn only_git_tasks_that_asked_for_it_or_were_interrupted_owe_a_delivery() {
        let mut st = finished("done");
        st.deliver = Mode::Branch;
        assert_eq!(owed(&st), None, "no origin: nothing to deliver to");
        st.origin = Some(Origin::default());
        assert_eq!(owed(&st), Some(Mode::Branch));
        st.delivery = Some(Delivery {
            mode: Mode::Pr,
            ..Default::default()
        });
        assert_eq!(owed(&st), Some(Mode::Pr), "interrupted: taken up again");
        st.delivery.as_mut().unwrap().done = true;
        assert_eq!(owed(&st), None);
        let mut failed = finished("x");
        failed.status = Status::Failed;
        failed.deliver = Mode::Branch;
        failed.origin = Some(Origin::default());
        assert_eq!(
            owed(&failed),
            None,
            "only a finished task is delivered by itself"
        );
    }

    #[test]
    fn titles_are_the_summary_cut_at_a_word_and_messages_carry_the_trailer() {
        assert_eq!(
            title(&finished("Fix the value\nmore"), false),
            "Fix the value"
        );
        let long = "word ".repeat(30);
        let t = title(&finished(&long), false);
        assert!(t.ends_with('…') && t.chars().count() <= TITLE, "{t}");
        assert!(!t.contains("wor…"), "cut at a word: {t}");
        assert_eq!(title(&finished(""), false), "make it pass");
        let m = message(&finished(&long), false);
        assert!(
            m.contains(long.trim()),
            "a cut title keeps the whole summary: {m}"
        );
        assert!(m.ends_with("Tether-Task: t-3\n"), "{m}");
        assert!(
            m.contains("Not verified: the task had no acceptance check."),
            "{m}"
        );
        let mut wip = finished("");
        wip.status = Status::Stuck;
        wip.reason = "a loop".into();
        assert!(title(&wip, true).starts_with("Work in progress (stuck): make it pass"));
    }
}
