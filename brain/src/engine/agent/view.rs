//! The failing code in view, read from the task's worker: after a failing run of the check
//! or of a command, the source around the places its output names, or a small workspace's
//! files whole ([`crate::model::prompt::code_view`] decides what, this reads the files).

use std::collections::BTreeMap;

use super::super::core::Cx;
use super::super::effects::file_call;
use super::super::redact::Redactor;
use crate::model::agent::Assist;
use crate::model::ops::{FileAnswer, FileOp};
use crate::model::prompt::code_view::{self, MAX_FILES, SMALL_FILES, SMALL_WORKSPACE};
use crate::model::prompt::{self, BlockNotApplied, NudgeExample};

/// Most files listed to resolve the places an output names.
const LIST_MAX: u32 = 2000;
/// Largest file read for a window.
const READ_MAX: u64 = 512 * 1024;

async fn read(cx: &Cx<'_>, worker: &str, path: &str, max: u64) -> Option<(String, u64)> {
    let op = FileOp::Read {
        path: path.to_string(),
        offset: 0,
        length: max,
    };
    match file_call(cx, worker, op).await {
        Ok(FileAnswer::Data { data, file_size }) if !data.contains(&0) => {
            Some((String::from_utf8_lossy(&data).into_owned(), file_size))
        }
        _ => None,
    }
}

/// The view for a failing run whose output is `output`: empty when it names no file of the
/// workspace (and the workspace is not small or this is not the check), or the files cannot
/// be read. A small workspace is shown whole for the `check`, and for a command whose
/// output names one of its files.
pub(super) async fn failing_code(
    cx: &Cx<'_>,
    worker: &str,
    output: &str,
    check: bool,
    redact: &Redactor,
) -> String {
    if !cx.task.assisted(Assist::CodeInView) {
        return String::new();
    }
    let list = FileOp::Find {
        glob: String::new(),
        max_results: LIST_MAX,
    };
    let files = match file_call(cx, worker, list).await {
        Ok(FileAnswer::Paths { paths, .. }) => paths,
        _ => return String::new(),
    };
    let named = code_view::named_files(&code_view::locations(output), &files);
    // A small workspace: every text file, whole; the ones the output names first.
    if files.len() <= SMALL_FILES && (check || !named.is_empty()) {
        let mut order: Vec<&String> = named.iter().map(|(p, _)| p).collect();
        for f in &files {
            if !order.contains(&f) && !f.to_ascii_lowercase().starts_with("readme") {
                order.push(f);
            }
        }
        let mut texts = Vec::new();
        let mut total = 0usize;
        let mut small = true;
        for f in order {
            match read(cx, worker, f, SMALL_WORKSPACE as u64 + 1).await {
                Some((text, size)) => {
                    total += size as usize;
                    if total > SMALL_WORKSPACE {
                        small = false;
                        break;
                    }
                    texts.push((f.clone(), text));
                }
                None => continue,
            }
        }
        if small && !texts.is_empty() {
            return redact.apply(&code_view::render_whole(&texts));
        }
    }
    let mut texts = BTreeMap::new();
    for (path, _) in named.iter().take(MAX_FILES) {
        if let Some((text, _)) = read(cx, worker, path, READ_MAX).await {
            texts.insert(path.clone(), text);
        }
    }
    redact.apply(&code_view::render_windows(&named, &texts))
}

/// Text mode: the blocks of code in an answer without calls, taken as edits where it is
/// clear what they replace (`model::edits`): the calls are added to the answer before it
/// is logged, so they are ordinary logged, durable, approvable calls; a block that cannot
/// be applied is told to the model in one line.
pub(super) async fn edits_from_blocks(
    cx: &Cx<'_>,
    a: &crate::model::agent::AgentState,
    r: &mut crate::llm::Response,
) {
    use crate::model::edits::{self, Resolved};
    let blocks = std::mem::take(&mut r.code_blocks);
    if let Some((first, others)) = r.calls_not_run.take() {
        r.skipped_calls
            .insert(0, prompt::calls_not_run(&first, &others));
    }
    // A text-mode answer without a call is nudged; with a check, the example is running it.
    if r.no_call && a.spec.assisted(Assist::CallFormatNudge) {
        let example = match &a.spec.check {
            Some(c) => NudgeExample::RunCheck(&c.command),
            None => NudgeExample::ReadFile,
        };
        r.nudge = prompt::nudge(
            &r.message.content,
            example,
            a.spec.assisted(Assist::BlockEdits),
        );
    }
    if blocks.is_empty() {
        return;
    }
    // Beside a call, a block is taken only when it places cleanly; it runs first.
    let Some(worker) = cx.task.state().worker else {
        return;
    };
    let beside = std::mem::take(&mut r.message.tool_calls);
    let mut paths = a.files_in_view();
    for b in &blocks {
        if let Some(p) = &b.path
            && !paths.contains(p)
        {
            paths.push(p.clone());
        }
    }
    let mut texts = BTreeMap::new();
    for p in &paths {
        if let Some((text, size)) = read(cx, worker.as_str(), p, READ_MAX).await
            && size <= READ_MAX
        {
            texts.insert(p.clone(), text);
        }
    }
    let protected = |p: &str| {
        a.spec
            .check
            .as_ref()
            .is_some_and(|c| crate::model::agent::is_protected(c, p))
    };
    let turn = a
        .conversation
        .iter()
        .filter(|m| m.role == crate::llm::Role::Assistant)
        .count();
    let mut refused = Vec::new();
    let mut unchanged: Vec<String> = Vec::new();
    for b in &blocks {
        match edits::resolve(b, &texts, &protected) {
            Resolved::Calls(calls, what) => {
                tracing::info!(task = %cx.task.id, %what, calls = calls.len(), "a block of code taken as an edit");
                for (name, arguments) in calls {
                    let id = format!(
                        "{}{turn}_{}",
                        crate::llm::EDIT_ID,
                        r.message.tool_calls.len()
                    );
                    r.message.tool_calls.push(crate::llm::ToolUse {
                        id,
                        name,
                        arguments,
                    });
                }
            }
            Resolved::NotApplied(why) => refused.push(why),
            Resolved::Unchanged(path) => unchanged.push(path),
            Resolved::NotAnEdit => {}
        }
    }
    let edits = r.message.tool_calls.len();
    r.message.tool_calls.extend(beside.iter().cloned());
    if !beside.is_empty() {
        // The calls beside run; the model hears after them what became of its blocks.
        for why in &refused {
            r.skipped_calls
                .push(prompt::block_not_applied(BlockNotApplied::BesideCalls {
                    why,
                }));
        }
    }
    if !unchanged.is_empty() {
        unchanged.sort();
        unchanged.dedup();
        r.skipped_calls
            .push(prompt::block_not_applied(BlockNotApplied::Unchanged {
                paths: &unchanged,
            }));
    }
    if edits > 0 {
        r.nudge.clear();
    } else if beside.is_empty()
        && let Some(why) = refused.first()
    {
        let mine: Vec<&str> = texts
            .keys()
            .map(String::as_str)
            .filter(|p| !protected(p))
            .collect();
        r.malformed_calls
            .push(prompt::block_not_applied(BlockNotApplied::Alone {
                why,
                files: &mine,
            }));
    }
}
