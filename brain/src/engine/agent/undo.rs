//! Keeping the version the check passed on: when the model's changes make the acceptance
//! check fail after it had passed, the files they changed are written back as they were then
//! (from the mirror), and the model hears what happened with the files as they now are. A
//! small model often breaks what it had just fixed; the check, not the model, is the judge.
//! The same, back to the task's start, for a model that stopped making progress on its own
//! failed changes (it anchors on them and writes them again and again).

use super::super::core::Cx;
use super::super::effects;
use super::super::error::Error;
use super::super::redact::Redactor;
use super::MAX_PROTECTED;
use crate::model::code_view;
use crate::model::event::Event;
use crate::model::ops::{FileAnswer, FileOp};

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
        let Some(data) = ws.read_file(&kept, &path, MAX_PROTECTED).await else {
            tracing::warn!(task = %cx.task.id, %path, "a file the check passed on is not in the mirror");
            continue;
        };
        if !data.contains(&0) {
            texts.push((path.clone(), String::from_utf8_lossy(&data).into_owned()));
        }
        let op = FileOp::Write {
            path: path.clone(),
            data,
            mode: if exec { 0o755 } else { 0o644 },
            create_dirs: true,
        };
        match effects::file_call(cx, &worker, op).await {
            Ok(FileAnswer::Done) => restored.push(path),
            Ok(other) => {
                tracing::warn!(task = %cx.task.id, %path, answer = ?other, "a file could not be written back");
            }
            Err(_) => return Ok(()),
        }
    }
    // The mirror follows what was written, so the next round compares with it.
    effects::barrier(cx, &worker, false).await?;
    let shown = redact.apply(&code_view::render_files(
        "The files written back, as they are now:",
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
