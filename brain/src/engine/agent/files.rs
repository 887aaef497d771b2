//! The agent's file tools, run on the task's worker: read (numbered lines, a range), write,
//! edit (one exact match), list and search. Each answers the observation for the model and
//! whether the call failed; `Err` means it has no answer (cancelled, worker gone).

use super::super::core::Cx;
use super::super::effects::{NoAnswer, file_call};
use crate::model::agent::Assist;
use crate::model::event::ToolCall;
use crate::model::ops::{FileAnswer, FileOp};
use crate::model::tools;

fn file_error(a: FileAnswer) -> String {
    match a {
        FileAnswer::Error(message) => format!("error: {message}"),
        _ => "error: unexpected answer from the worker".into(),
    }
}

fn read(path: &str) -> FileOp {
    FileOp::Read {
        path: path.to_string(),
        offset: 0,
        length: 0,
    }
}

fn write(path: &str, data: Vec<u8>, mode: u32) -> FileOp {
    FileOp::Write {
        path: path.to_string(),
        data,
        mode,
        create_dirs: true,
    }
}

/// Runs a file tool; Ok((observation, failed)), or Err(why it has no answer).
pub(super) async fn run(
    cx: &Cx<'_>,
    worker: &str,
    call: &ToolCall,
) -> Result<(String, bool), NoAnswer> {
    Ok(match call {
        ToolCall::ReadFile {
            path,
            start_line,
            end_line,
        } => match file_call(cx, worker, read(path)).await? {
            FileAnswer::Data { data, .. } if data[..data.len().min(8192)].contains(&0) => {
                (format!("error: {path} is a binary file"), true)
            }
            FileAnswer::Data { data, file_size } => {
                let mut text =
                    tools::numbered(&String::from_utf8_lossy(&data), *start_line, *end_line);
                if file_size > data.len() as u64 {
                    text.push_str(&format!(
                        "[only the first {} of {file_size} bytes were read]\n",
                        data.len(),
                    ));
                }
                (text, false)
            }
            other => (file_error(other), true),
        },
        ToolCall::WriteFile {
            path,
            content,
            mode,
        } => match file_call(cx, worker, write(path, content.clone().into_bytes(), *mode)).await? {
            FileAnswer::Done => (format!("wrote {} bytes to {path}", content.len()), false),
            other => (file_error(other), true),
        },
        ToolCall::EditFile { path, old, new } => {
            let text = match file_call(cx, worker, read(path)).await? {
                FileAnswer::Data { file_size, .. }
                    if file_size as usize > tools::MAX_EDIT_BYTES =>
                {
                    return Ok((
                        format!(
                            "error: {path} is over {} bytes; edit it with a command instead",
                            tools::MAX_EDIT_BYTES
                        ),
                        true,
                    ));
                }
                FileAnswer::Data { data, .. } => match String::from_utf8(data) {
                    Ok(t) => t,
                    Err(_) => return Ok((format!("error: {path} is not UTF-8 text"), true)),
                },
                other => return Ok((file_error(other), true)),
            };
            // Forgiving matching (indent, trailing spaces, line numbers, the nearest lines
            // told) is an assist; without it an edit applies exactly or not at all.
            let edited = if cx.task.assisted(Assist::ForgivingEdits) {
                tools::apply_edit(&text, old, new, path)
            } else {
                tools::apply_exact(&text, old, new, path)
            };
            match edited {
                Err(e) => (e.to_string(), true),
                Ok(edited) => {
                    match file_call(cx, worker, write(path, edited.into_bytes(), 0o644)).await? {
                        FileAnswer::Done => {
                            (format!("edited {path}: replaced 1 occurrence"), false)
                        }
                        other => (file_error(other), true),
                    }
                }
            }
        }
        ToolCall::ListFiles { glob } => {
            let op = FileOp::Find {
                glob: glob.clone(),
                max_results: 0,
            };
            match file_call(cx, worker, op).await? {
                FileAnswer::Paths { paths, .. } if paths.is_empty() => {
                    (tools::no_files_match(glob), false)
                }
                FileAnswer::Paths { paths, truncated } => {
                    let mut t = paths.join("\n");
                    if truncated {
                        t.push_str(&format!(
                            "\n[more files match; only the first {} are listed: narrow the glob]",
                            paths.len()
                        ));
                    }
                    (t, false)
                }
                other => (file_error(other), true),
            }
        }
        ToolCall::Search { pattern, glob } => {
            let op = FileOp::Search {
                pattern: pattern.clone(),
                glob: glob.clone(),
                max_matches: 0,
            };
            match file_call(cx, worker, op).await? {
                FileAnswer::Matches {
                    matches,
                    files_searched,
                    ..
                } if matches.is_empty() => (format!("no matches in {files_searched} files"), false),
                FileAnswer::Matches {
                    matches, truncated, ..
                } => {
                    let mut t: String = matches
                        .iter()
                        .map(|h| format!("{}:{}: {}\n", h.path, h.line, h.text))
                        .collect();
                    if truncated {
                        t.push_str("[more matches; narrow the pattern or the glob]\n");
                    }
                    (t, false)
                }
                other => (file_error(other), true),
            }
        }
        ToolCall::RunCommand { .. } => {
            return Err(NoAnswer::NotFileTool);
        }
    })
}
