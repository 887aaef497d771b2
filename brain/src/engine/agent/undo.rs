//! Files put back from the mirror: the ones the check relies on, before each `finish`; and
//! the version the check passed on: when the model's changes make the acceptance
//! check fail after it had passed, the files they changed are written back as they were then
//! (from the mirror), and the model hears what happened with the files as they now are. A
//! small model often breaks what it had just fixed; the check, not the model, is the judge.
//! The same, back to the task's start, for a model that stopped making progress on its own
//! failed changes (it anchors on them and writes them again and again).

use super::super::core::Cx;
use super::super::effects;
use super::super::error::Error;
use super::super::redact::Redactor;
use crate::llm::ToolUse;
use crate::model::event::Event;
use crate::model::ops::{FileAnswer, FileOp};
use crate::model::prompt::code_view;

/// Largest file put back.
const MAX_PUT_BACK: u64 = 4 << 20;

/// The worker could not be asked (the task was cancelled, or the worker is away): the
/// action is tried again as a whole (each write is whole and repeatable).
struct Away;

/// Writes `path` on the worker as it is in the mirror's version `root`, returning what was
/// written; `None` when the mirror does not hold it or the worker refused (logged).
async fn put_back(
    cx: &Cx<'_>,
    worker: &str,
    root: &str,
    path: &str,
    exec: bool,
) -> Result<Option<Vec<u8>>, Away> {
    let ws = &cx.ports().workspaces;
    let Some(data) = ws.read_file(root, path, MAX_PUT_BACK).await else {
        tracing::warn!(task = %cx.task.id, %path, "a file to put back is not in the mirror");
        return Ok(None);
    };
    let op = FileOp::Write {
        path: path.to_string(),
        data: data.clone(),
        mode: if exec { 0o755 } else { 0o644 },
        create_dirs: true,
    };
    match effects::file_call(cx, worker, op).await {
        Ok(FileAnswer::Done) => Ok(Some(data)),
        Ok(other) => {
            tracing::warn!(task = %cx.task.id, %path, answer = ?other, "a file could not be put back");
            Ok(None)
        }
        Err(_) => Err(Away),
    }
}

/// Puts the files the acceptance check relies on back as the task started, so the check
/// cannot be passed by editing them.
pub(super) async fn restore(cx: &Cx<'_>, u: &ToolUse) -> Result<(), Error> {
    let st = cx.task.state();
    let (Some(check), worker) = (st.check().cloned(), st.worker.clone().unwrap_or_default()) else {
        return Ok(());
    };
    let mut paths = Vec::new();
    for (path, exec) in cx.ports().workspaces.list_files(&st.seed_root).await {
        if !crate::model::agent::is_protected(&check, &path) {
            continue;
        }
        match put_back(cx, &worker, &st.seed_root, &path, exec).await {
            Ok(Some(_)) => paths.push(path),
            Ok(None) => {}
            Err(Away) => return Ok(()),
        }
    }
    cx.store()
        .append(
            cx.task,
            vec![Event::ProtectedRestored {
                tool_use_id: u.id.clone(),
                paths,
            }],
        )
        .await
}

/// Undoes the changes since the check last passed and logs [`Event::ChangesUndone`]. The
/// files the check relies on are left alone (they are put back from the task's start before
/// each `finish`), and no file is deleted: those made since are named. A worker that goes
/// away part way leaves it to the next try (each write is whole and repeatable).
pub(super) async fn undo_changes(
    cx: &Cx<'_>,
    to_start: bool,
    redact: &Redactor,
) -> Result<(), Error> {
    let st = cx.task.state();
    let (Some(a), Some(check), Some(worker)) = (st.agent.as_deref(), st.check(), st.worker.clone())
    else {
        return Ok(());
    };
    let kept = if to_start {
        st.seed_root.clone()
    } else {
        a.passed_root.clone()
    };
    let now = a.root.clone();
    let ws = &cx.ports().workspaces;
    let (mut restored, mut left, mut texts) = (Vec::new(), Vec::new(), Vec::new());
    for (path, before) in ws.changed_files(&kept, &now).await {
        if crate::model::agent::is_protected(check, &path) {
            continue;
        }
        let Some(exec) = before else {
            left.push(path);
            continue;
        };
        match put_back(cx, &worker, &kept, &path, exec).await {
            Ok(Some(data)) => {
                if !data.contains(&0) {
                    texts.push((path.clone(), String::from_utf8_lossy(&data).into_owned()));
                }
                restored.push(path);
            }
            Ok(None) => {}
            Err(Away) => return Ok(()),
        }
    }
    // The mirror follows what was written, so the next round compares with it.
    effects::barrier(cx, &worker, false).await?;
    let shown = redact.apply(&code_view::render_files(
        crate::model::prompt::FILES_WRITTEN_BACK,
        &texts,
    ));
    let why = if to_start {
        "the model's changes were undone back to the task's start"
    } else {
        "changes on which the check failed were undone"
    };
    tracing::info!(task = %cx.task.id, restored = restored.len(), left = left.len(), "{why}");
    cx.store()
        .append(
            cx.task,
            vec![Event::ChangesUndone {
                root: kept,
                to_start,
                restored,
                left,
                shown,
            }],
        )
        .await
}
