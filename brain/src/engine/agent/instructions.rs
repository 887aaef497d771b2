//! The repository's own instructions for agents: its root `AGENTS.md` (or `CLAUDE.md` where
//! there is none), read with the survey before the model's first turn, and the nearest one
//! above each file the model's calls touch, shown once after the call that touched it. Read
//! from the worker, bounded, masked; the words the model reads around them are the prompt's
//! (`model::prompt::repository_instructions`).

use super::super::core::Cx;
use super::super::effects;
use super::super::redact::Redactor;
use crate::model::agent::MAX_NESTED_INSTRUCTIONS;
use crate::model::event::{Event, ToolCall};
use crate::model::ops::{FileAnswer, FileOp};

/// Most bytes of an AGENTS.md shown to the model (Codex reads 32 KiB).
const MAX_BYTES: u64 = 16 * 1024;
/// The files looked for in a directory, in order: the first that exists is read.
const AGENTS_MD: [&str; 2] = ["AGENTS.md", "CLAUDE.md"];
/// Most directory levels looked through above a touched file.
const MAX_DEPTH: usize = 8;

/// The repository's instructions for agents at the workspace's root (path, text): the
/// first of [`AGENTS_MD`] that is a readable text file, its head when it is longer than the
/// model is shown, masked; empty when there is none.
pub(super) async fn at_root(cx: &Cx<'_>, worker: &str, redact: &Redactor) -> (String, String) {
    for path in AGENTS_MD {
        if let Some(text) = read(cx, worker, path, redact).await {
            return (path.to_string(), text);
        }
    }
    Default::default()
}

/// The instructions nearest above the file `call` touched, below the root (whose are in
/// the survey), as the record that shows them to the model; `None` when there are none, the
/// model has been shown them, or the task turned them off. Each directory is looked in once
/// per task in this process.
pub(super) async fn nearest(
    cx: &Cx<'_>,
    worker: &str,
    call: &ToolCall,
    redact: &Redactor,
) -> Option<Event> {
    let path = match call {
        ToolCall::ReadFile { path, .. }
        | ToolCall::WriteFile { path, .. }
        | ToolCall::EditFile { path, .. } => path,
        _ => return None,
    };
    let st = cx.task.state();
    let a = st.agent.as_deref()?;
    if a.spec.no_agents_md || a.instructions_shown.len() >= MAX_NESTED_INSTRUCTIONS {
        return None;
    }
    for dir in dirs_above(path) {
        if !cx.task.first_look_for_instructions(&dir) {
            // Looked in before: the nearest when it had some (shown then), else go up.
            let here = |p: &String| p.rsplit_once('/').is_some_and(|(d, _)| d == dir);
            if a.instructions_shown.iter().any(here) {
                return None;
            }
            continue;
        }
        for name in AGENTS_MD {
            let file = format!("{dir}/{name}");
            if let Some(text) = read(cx, worker, &file, redact).await {
                // The nearest file speaks for the directory; one shown already is not again.
                if a.instructions_shown.contains(&file) {
                    return None;
                }
                return Some(Event::InstructionsInView { path: file, text });
            }
        }
    }
    None
}

/// The directories above `path` (relative to the workspace's root), nearest first, the root
/// left out; none for a path that leaves the root or names none.
fn dirs_above(path: &str) -> Vec<String> {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") || parts.len() < 2 {
        return vec![];
    }
    let dirs = &parts[..parts.len() - 1];
    (1..=dirs.len())
        .rev()
        .take(MAX_DEPTH)
        .map(|n| dirs[..n].join("/"))
        .collect()
}

/// The text of `path` when it is a readable text file with something in it: its head when
/// longer than [`MAX_BYTES`], masked.
async fn read(cx: &Cx<'_>, worker: &str, path: &str, redact: &Redactor) -> Option<String> {
    let op = FileOp::Read {
        path: path.to_string(),
        offset: 0,
        length: MAX_BYTES,
    };
    let Ok(FileAnswer::Data { data, file_size }) = effects::file_call(cx, worker, op).await else {
        return None;
    };
    if data.contains(&0) || data.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let mut text = redact.apply(&String::from_utf8_lossy(&data));
    if file_size > MAX_BYTES {
        text.push_str(&format!(
            "\n[… cut: the file is {file_size} bytes, the first {MAX_BYTES} are shown]"
        ));
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::dirs_above;

    #[test]
    fn directories_above_a_path_nearest_first_without_the_root() {
        assert_eq!(dirs_above("a/b/c.rs"), ["a/b", "a"]);
        assert_eq!(dirs_above("./a//b/c.rs"), ["a/b", "a"]);
        assert!(dirs_above("c.rs").is_empty());
        assert!(dirs_above("a/../../etc/passwd").is_empty());
        assert!(dirs_above("").is_empty());
        let deep = "1/2/3/4/5/6/7/8/9/10/f";
        let d = dirs_above(deep);
        assert_eq!(d.len(), 8);
        assert_eq!(d[0], "1/2/3/4/5/6/7/8/9/10");
    }
}
