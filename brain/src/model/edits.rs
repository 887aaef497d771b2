//! Edits a small model can write: a fenced block of code becomes a `write_file` or
//! `edit_file` call when it is clear what it replaces. Pure: given the block and the texts
//! of the files in view, it answers the calls, or why the block was not applied.
//!
//! - A block that names a file (` ```python stats.py`, or "In `stats.py`:" just above it):
//!   the whole file when it looks like one (the file does not exist yet, or the block holds
//!   most of the file's top-level lines), else as below within that file.
//! - A block whose first line is the first line of exactly one definition in the files in
//!   view (`def mean(xs):`): that definition is replaced, from its first line to the line
//!   before the next one at the same or a lower indent (with a closing `}` at that indent
//!   when the block ends with one). Further definitions in the block replace theirs in the
//!   same file.

use std::collections::BTreeMap;

use serde_json::json;

use super::prompt::code_view::is_closer;
use crate::llm::CodeBlock;

/// Why a block does not replace definitions in a file (the model is told, after what the
/// block was matched against).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum NotPlaced {
    #[error("no definition begins with `{0}`")]
    NoDefinition(String),
    #[error("`{0}` is not the first line of a definition")]
    NotFirstLine(String),
    #[error("`{line}` begins {n} definitions, so which one is meant is not clear")]
    Ambiguous { line: String, n: usize },
    #[error("its definitions overlap in the file")]
    Overlap,
    #[error("it is what {0} already holds")]
    AlreadyHeld(String),
}

/// What a code block comes to.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolved {
    /// Calls to make: (tool name, JSON arguments), and what they do in words.
    Calls(Vec<(String, String)>, String),
    /// It looked like an edit but was not applied: why, in one line.
    NotApplied(String),
    /// Not an edit (a shell snippet, an example, output).
    NotAnEdit,
    /// It is what this file already holds (blank lines and trailing spaces aside): applying
    /// it would change nothing.
    Unchanged(String),
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn norm(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn is_comment(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with('#') || t.starts_with("//") || t.starts_with("/*") || t.starts_with('*')
}

/// Languages whose blocks are commands or output, never a file's code.
fn is_shell_or_output(lang: &str) -> bool {
    matches!(
        lang,
        "sh" | "bash" | "shell" | "console" | "terminal" | "text" | "txt" | "output" | "diff"
    )
}

/// The top-level lines of a text (indent 0, not blank, not a closer or a comment).
fn tops(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && indent(l) == 0 && !is_closer(l) && !is_comment(l))
        .map(norm)
        .collect()
}

/// Whether `body` looks like the whole of `old`: it holds most of its top-level lines, each
/// by what it names (`def greet(name, greeting="Hi"):` is held by `def greet(name,
/// greeting="Hello"):`, `RATE = 0.10` by `RATE = 0.2`).
fn looks_whole(body: &str, old: &str) -> bool {
    let old_tops = tops(old);
    if old_tops.is_empty() {
        return body.lines().count() * 2 >= old.lines().count();
    }
    let body_tops: Vec<&str> = body.lines().map(str::trim).map(head).collect();
    let held = old_tops
        .iter()
        .filter(|t| body_tops.contains(&head(t)))
        .count();
    held * 10 >= old_tops.len() * 7
}

/// What a top-level line names: the part before its parameters, value or body.
fn head(line: &str) -> &str {
    line.split(['(', '=', ':', '{', '<'])
        .next()
        .unwrap_or(line)
        .trim_end()
}

/// Where line `m` of `lines` opens a block: the next non-blank line is indented deeper, or
/// the line ends with `{`.
fn opens_block(lines: &[&str], m: usize) -> bool {
    if lines[m].trim_end().ends_with('{') {
        return true;
    }
    lines[m + 1..]
        .iter()
        .find(|l| !l.trim().is_empty())
        .is_some_and(|l| indent(l) > indent(lines[m]))
}

/// The lines (start, end exclusive) of the definition that starts at line `m`; the closer at
/// its indent is included when `with_closer`.
fn region(lines: &[&str], m: usize, with_closer: bool) -> (usize, usize) {
    let ind = indent(lines[m]);
    let mut end = m + 1;
    let mut j = m + 1;
    while j < lines.len() {
        let l = lines[j];
        if !l.trim().is_empty() {
            if indent(l) <= ind {
                break;
            }
            end = j + 1;
        }
        j += 1;
    }
    if with_closer && j < lines.len() && indent(lines[j]) == ind && is_closer(lines[j]) {
        end = j + 1;
    }
    // Decorators just above belong to it.
    let mut start = m;
    while start > 0 && indent(lines[start - 1]) == ind && lines[start - 1].trim().starts_with('@') {
        start -= 1;
    }
    (start, end)
}

/// The block's lines shifted by `shift` columns (`lead`: what to add when deeper).
fn reindent(lines: &[&str], base: usize, target_lead: &str) -> String {
    lines
        .iter()
        .map(|l| {
            if l.trim().is_empty() {
                String::new()
            } else {
                let rest = &l[base.min(indent(l))..];
                format!("{target_lead}{rest}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where each definition of `block` lies in `text`: (chunk of block lines, file line).
fn place_definitions(
    blines: &[&str],
    base: usize,
    flines: &[&str],
) -> Result<Vec<(usize, usize, usize)>, NotPlaced> {
    let matches = |b: &str| -> Vec<usize> {
        let n = norm(b);
        flines
            .iter()
            .enumerate()
            .filter(|(_, l)| norm(l) == n)
            .map(|(i, _)| i)
            .collect()
    };
    // Chunk starts: lines at the block's base indent that begin something in the file.
    let mut starts: Vec<(usize, usize)> = Vec::new();
    for (k, l) in blines.iter().enumerate() {
        if l.trim().is_empty()
            || indent(l) != base
            || is_closer(l)
            || is_comment(l)
            || l.trim().starts_with('@')
        {
            continue;
        }
        let m = matches(l);
        if starts.is_empty() {
            // The first definition decides; everything above it goes with it.
            match m.len() {
                0 => return Err(NotPlaced::NoDefinition(l.trim().to_string())),
                1 if opens_block(flines, m[0]) => starts.push((k, m[0])),
                1 => return Err(NotPlaced::NotFirstLine(l.trim().to_string())),
                n => {
                    return Err(NotPlaced::Ambiguous {
                        line: l.trim().to_string(),
                        n,
                    });
                }
            }
        } else if m.len() == 1 && opens_block(flines, m[0]) {
            starts.push((k, m[0]));
        }
    }
    let mut out = Vec::new();
    for (i, &(k, m)) in starts.iter().enumerate() {
        let k_from = if i == 0 { 0 } else { k };
        let k_end = starts.get(i + 1).map_or(blines.len(), |s| s.0);
        out.push((k_from, k_end, m));
    }
    Ok(out)
}

/// Replaces the definitions of `body` in the file `path` of `text`: the `edit_file` calls.
fn replace_definitions(
    path: &str,
    text: &str,
    body: &str,
) -> Result<Vec<(String, String)>, NotPlaced> {
    let all: Vec<&str> = body.trim_end().lines().collect();
    // Lines before its first definition that the file holds already (imports, a docstring
    // the model copied along) are not part of the change.
    let held: std::collections::HashSet<String> = text.lines().map(norm).collect();
    let skip = (0..all.len())
        .find(|&k| {
            let copied = indent(all[k]) == 0 && held.contains(&norm(all[k]));
            !(all[k].trim().is_empty() || copied && !opens_block(&all, k))
        })
        .unwrap_or(all.len());
    // So are lines after its last definition that the file holds already (a JavaScript
    // module's `module.exports = ...`, copied along): kept, they would be there twice.
    let mut end = all.len();
    while end > skip
        && (all[end - 1].trim().is_empty()
            || indent(all[end - 1]) == 0
                && held.contains(&norm(all[end - 1]))
                && !is_closer(all[end - 1])
                && !opens_block(&all, end - 1))
    {
        end -= 1;
    }
    let blines: Vec<&str> = all[skip..end].to_vec();
    let base = blines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| indent(l))
        .min()
        .unwrap_or(0);
    let flines: Vec<&str> = text.lines().collect();
    let chunks = place_definitions(&blines, base, &flines)?;
    let mut calls = Vec::new();
    let mut last_end = 0usize;
    for (k_from, k_end, m) in chunks {
        let mut chunk: Vec<&str> = blines[k_from..k_end].to_vec();
        while chunk.last().is_some_and(|l| l.trim().is_empty()) {
            chunk.pop();
        }
        while chunk.first().is_some_and(|l| l.trim().is_empty()) {
            chunk.remove(0);
        }
        let ends_with_closer = chunk.last().is_some_and(|l| is_closer(l));
        let (s, e) = region(&flines, m, ends_with_closer);
        if s < last_end {
            return Err(NotPlaced::Overlap);
        }
        last_end = e;
        let lead = &flines[m][..indent(flines[m])];
        let old = flines[s..e].join("\n");
        let new = reindent(&chunk, base, lead);
        if old != new {
            calls.push((
                "edit_file".to_string(),
                json!({"path": path, "old_string": old, "new_string": new}).to_string(),
            ));
        }
    }
    if calls.is_empty() {
        return Err(NotPlaced::AlreadyHeld(path.to_string()));
    }
    Ok(calls)
}

/// What `block` comes to, given the texts of the files in view (and of the file it names, if
/// it exists). `protected` files are never candidates.
pub fn resolve(
    block: &CodeBlock,
    texts: &BTreeMap<String, String>,
    protected: &dyn Fn(&str) -> bool,
) -> Resolved {
    match place(block, texts, protected) {
        Resolved::Calls(calls, _)
            if let Some(p) = calls
                .iter()
                .map(|(n, a)| unchanged(n, a, texts))
                .collect::<Option<Vec<String>>>()
                .and_then(|ps| ps.into_iter().next()) =>
        {
            // A small model writes the file it was shown, or its own failed fix, again: it
            // hears that this changes nothing instead of "wrote 233 bytes".
            Resolved::Unchanged(p)
        }
        r => r,
    }
}

/// The file a call leaves as it is, if it is one of `texts` and the call changes nothing
/// in it but blank lines and trailing spaces.
fn unchanged(name: &str, args: &str, texts: &BTreeMap<String, String>) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(args).ok()?;
    let path = v["path"].as_str()?;
    let same = |a: &str, b: &str| {
        let lines = |t: &str| -> Vec<String> {
            t.lines()
                .map(|l| l.trim_end().to_string())
                .filter(|l| !l.is_empty())
                .collect()
        };
        lines(a) == lines(b)
    };
    let is_same = match name {
        "write_file" => same(texts.get(path)?, v["content"].as_str()?),
        "edit_file" => {
            texts.contains_key(path) && same(v["old_string"].as_str()?, v["new_string"].as_str()?)
        }
        _ => false,
    };
    is_same.then(|| path.to_string())
}

/// Whether `line` only names a file (`# stats.py`, `// slug.js (the whole file)`, or a
/// view's own header copied): a line small models put atop a file's code, not the code.
fn names_a_file(line: &str, paths: &[&str]) -> bool {
    let t = line.trim();
    let t = ["#", "//", "--", "/*", ";"]
        .iter()
        .find_map(|m| t.strip_prefix(m))
        .unwrap_or(t);
    let t = t.trim().trim_end_matches("*/").trim().trim_end_matches(':');
    let t = t.trim_end().trim_end_matches("(the whole file)").trim();
    let t = t.trim_matches('`').trim();
    !t.is_empty()
        && paths
            .iter()
            .any(|p| t == *p || p.rsplit('/').next() == Some(t))
}

/// The block without a first line that only names a file, unless a file in view begins with
/// that very line.
fn without_name_line(block: &CodeBlock, texts: &BTreeMap<String, String>) -> Option<CodeBlock> {
    let first = block.body.lines().find(|l| !l.trim().is_empty())?;
    let mut paths: Vec<&str> = texts.keys().map(String::as_str).collect();
    paths.extend(block.path.as_deref());
    let held = texts
        .values()
        .any(|t| t.lines().find(|l| !l.trim().is_empty()) == Some(first));
    if held || !names_a_file(first, &paths) {
        return None;
    }
    let at = block.body.find(first)? + first.len();
    let rest = block.body[at..].trim_start_matches(['\r', '\n']);
    Some(CodeBlock {
        body: rest.to_string(),
        ..block.clone()
    })
}

/// Where a block goes, before asking whether it changes anything.
fn place(
    block: &CodeBlock,
    texts: &BTreeMap<String, String>,
    protected: &dyn Fn(&str) -> bool,
) -> Resolved {
    let cleaned = without_name_line(block, texts);
    let block = cleaned.as_ref().unwrap_or(block);
    let lang = block.lang.to_ascii_lowercase();
    if is_shell_or_output(&lang) || block.body.trim().is_empty() {
        return Resolved::NotAnEdit;
    }
    if let Some(p) = block.path.as_deref().filter(|p| protected(p)) {
        return Resolved::NotApplied(guarded(p));
    }
    let named = block.path.as_deref();
    if let Some(p) = named {
        match texts.get(p) {
            None => {
                let args = json!({"path": p, "content": with_newline(&block.body)});
                return Resolved::Calls(
                    vec![("write_file".into(), args.to_string())],
                    format!("a new file {p}"),
                );
            }
            Some(old) if looks_whole(&block.body, old) => {
                let args = json!({"path": p, "content": with_newline(&block.body)});
                return Resolved::Calls(
                    vec![("write_file".into(), args.to_string())],
                    format!("the whole of {p}"),
                );
            }
            Some(old) => {
                if let Ok(calls) = replace_definitions(p, old, &block.body) {
                    return Resolved::Calls(calls, format!("definitions in {p}"));
                }
            }
        }
    }
    // The whole of one file in view, rewritten (a model that names no file and rewrites
    // the one it was shown).
    let whole: Vec<&String> = texts
        .iter()
        .filter(|(p, old)| {
            !protected(p)
                && looks_whole(&block.body, old)
                && block.body.lines().count() * 2 >= old.lines().count()
        })
        .map(|(p, _)| p)
        .collect();
    // Several look whole (a module and the one it imports share names): the one whose
    // first line the block begins with, if only one.
    let first = |t: &str| t.lines().find(|l| !l.trim().is_empty()).map(norm);
    let whole = match whole[..] {
        [_, _, ..] => {
            let same: Vec<&String> = whole
                .iter()
                .copied()
                .filter(|p| first(&texts[*p]).is_some() && first(&texts[*p]) == first(&block.body))
                .collect();
            if same.len() == 1 { same } else { whole }
        }
        _ => whole,
    };
    if let [p] = whole[..]
        && replace_definitions(p, &texts[p], &block.body).is_err()
    {
        let args = json!({"path": p, "content": with_newline(&block.body)});
        return Resolved::Calls(
            vec![("write_file".into(), args.to_string())],
            format!("the whole of {p}"),
        );
    }
    // The one file in view whose definition the block's first line begins.
    let mut found: Vec<(String, Vec<(String, String)>)> = Vec::new();
    let mut why = String::new();
    for (p, text) in texts.iter().filter(|(p, _)| !protected(p)) {
        match replace_definitions(p, text, &block.body) {
            Ok(calls) => found.push((p.clone(), calls)),
            Err(e @ NotPlaced::Ambiguous { .. }) => why = e.to_string(),
            Err(e) if why.is_empty() || matches!(e, NotPlaced::AlreadyHeld(_)) => {
                why = e.to_string()
            }
            Err(_) => {}
        }
    }
    // A definition of the check's own files (a model that blames the test).
    let guarded_match = texts
        .iter()
        .filter(|(p, _)| protected(p))
        .find(|(p, text)| replace_definitions(p, text, &block.body).is_ok());
    match found.len() {
        1 => {
            let (p, calls) = found.pop().expect("one");
            Resolved::Calls(calls, format!("definitions in {p}"))
        }
        0 if let Some((p, _)) = guarded_match => Resolved::NotApplied(guarded(p)),
        0 if texts.is_empty() => Resolved::NotApplied(
            "no file is in view to find its definition in: name the file on the line above the block".into(),
        ),
        0 => Resolved::NotApplied(format!(
            "{} in the files in view ({})",
            if why.is_empty() { "it matches no definition".to_string() } else { why },
            texts.keys().filter(|p| !protected(p)).cloned().collect::<Vec<_>>().join(", ")
        )),
        _ => Resolved::NotApplied(format!(
            "its first line begins a definition in several files ({}): name the file on the line above the block",
            found.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// What a model that changes the check's own files is told.
fn guarded(path: &str) -> String {
    format!(
        "it changes {path}, which the acceptance check relies on and which may not be changed: the bug is in the code it tests, so change that"
    )
}

fn with_newline(s: &str) -> String {
    if s.ends_with('\n') {
        s.to_string()
    } else {
        format!("{s}\n")
    }
}

#[cfg(test)]
#[path = "edits_tests.rs"]
mod tests;
