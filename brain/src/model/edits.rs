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

use super::code_view::is_closer;
use crate::llm::CodeBlock;

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
) -> Result<Vec<(usize, usize, usize)>, String> {
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
                0 => return Err(format!("no definition begins with `{}`", l.trim())),
                1 if opens_block(flines, m[0]) => starts.push((k, m[0])),
                1 => {
                    return Err(format!(
                        "`{}` is not the first line of a definition",
                        l.trim()
                    ));
                }
                n => {
                    return Err(format!(
                        "`{}` begins {n} definitions, so which one is meant is not clear",
                        l.trim()
                    ));
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
) -> Result<Vec<(String, String)>, String> {
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
            return Err("its definitions overlap in the file".into());
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
        return Err(format!("it is what {path} already holds"));
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
            Err(e) if e.contains("begins") && e.contains("definitions") => why = e,
            Err(e) if why.is_empty() || e.contains("already holds") => why = e,
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
mod tests {
    use super::*;

    const STATS: &str = "import math\n\n\ndef mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / (len(xs) + 1)\n\n\ndef spread(xs):\n    return max(xs) - min(xs)\n";

    fn block(path: Option<&str>, lang: &str, body: &str) -> CodeBlock {
        CodeBlock {
            path: path.map(String::from),
            lang: lang.into(),
            body: body.into(),
        }
    }

    fn files(list: &[(&str, &str)]) -> BTreeMap<String, String> {
        list.iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect()
    }

    fn none(_: &str) -> bool {
        false
    }

    /// Applies the calls to the files as the tools would.
    fn apply(calls: &[(String, String)], texts: &mut BTreeMap<String, String>) {
        for (name, args) in calls {
            let a: serde_json::Value = serde_json::from_str(args).unwrap();
            let p = a["path"].as_str().unwrap().to_string();
            if name == "write_file" {
                texts.insert(p, a["content"].as_str().unwrap().into());
            } else {
                let t = texts.get(&p).unwrap().clone();
                let new = crate::model::tools::apply_edit(
                    &t,
                    a["old_string"].as_str().unwrap(),
                    a["new_string"].as_str().unwrap(),
                    &p,
                )
                .unwrap();
                texts.insert(p, new);
            }
        }
    }

    #[test]
    fn a_block_beginning_with_one_definitions_first_line_replaces_that_definition() {
        let mut t = files(&[
            ("stats.py", STATS),
            ("test_stats.py", "def test_mean():\n    pass\n"),
        ]);
        let b = block(
            None,
            "python",
            "def mean(xs):\n    if not xs:\n        return 0\n    return sum(xs) / len(xs)\n",
        );
        let Resolved::Calls(calls, what) = resolve(&b, &t, &|p| p.starts_with("test_")) else {
            panic!("resolved")
        };
        assert_eq!(what, "definitions in stats.py");
        apply(&calls, &mut t);
        assert_eq!(
            t["stats.py"],
            "import math\n\n\ndef mean(xs):\n    if not xs:\n        return 0\n    return sum(xs) / len(xs)\n\n\ndef spread(xs):\n    return max(xs) - min(xs)\n"
        );
    }

    #[test]
    fn a_method_written_at_column_zero_is_indented_to_its_place_and_braces_close() {
        let class = "class Stats:\n    def mean(self, xs):\n        return 0\n\n    def n(self):\n        return 1\n";
        let mut t = files(&[("s.py", class)]);
        let b = block(
            None,
            "",
            "def mean(self, xs):\n    return sum(xs) / len(xs)",
        );
        let Resolved::Calls(calls, _) = resolve(&b, &t, &none) else {
            panic!()
        };
        apply(&calls, &mut t);
        assert_eq!(
            t["s.py"],
            "class Stats:\n    def mean(self, xs):\n        return sum(xs) / len(xs)\n\n    def n(self):\n        return 1\n"
        );

        let js =
            "function slug(s) {\n  return s.replace(/ /, '-');\n}\n\nmodule.exports = { slug };\n";
        let mut t = files(&[("slug.js", js)]);
        let b = block(
            None,
            "javascript",
            "function slug(s) {\n  return s.toLowerCase().replace(/ /g, '-');\n}\n",
        );
        let Resolved::Calls(calls, _) = resolve(&b, &t, &none) else {
            panic!()
        };
        apply(&calls, &mut t);
        assert_eq!(
            t["slug.js"],
            "function slug(s) {\n  return s.toLowerCase().replace(/ /g, '-');\n}\n\nmodule.exports = { slug };\n"
        );
    }

    #[test]
    fn a_named_file_is_written_whole_when_the_block_is_the_whole_file() {
        let t = files(&[("stats.py", STATS)]);
        let whole = "import math\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n\n\ndef spread(xs):\n    return max(xs) - min(xs)\n";
        let Resolved::Calls(calls, what) =
            resolve(&block(Some("stats.py"), "python", whole), &t, &none)
        else {
            panic!()
        };
        assert_eq!(what, "the whole of stats.py");
        assert_eq!(calls[0].0, "write_file");
        // A new file is written whole.
        let Resolved::Calls(calls, _) =
            resolve(&block(Some("util.py"), "python", "X = 1"), &t, &none)
        else {
            panic!()
        };
        assert_eq!(
            calls,
            vec![(
                "write_file".into(),
                json!({"path": "util.py", "content": "X = 1\n"}).to_string()
            )]
        );
        // A named file with one definition in the block: that definition only.
        let mut t2 = t.clone();
        let Resolved::Calls(calls, _) = resolve(
            &block(
                Some("stats.py"),
                "python",
                "def spread(xs):\n    return max(xs) - min(xs) if xs else 0\n",
            ),
            &t2,
            &none,
        ) else {
            panic!()
        };
        apply(&calls, &mut t2);
        assert!(t2["stats.py"].starts_with("import math\n\n\ndef mean(xs):\n    total = 0"));
        assert!(
            t2["stats.py"]
                .ends_with("def spread(xs):\n    return max(xs) - min(xs) if xs else 0\n")
        );
    }

    #[test]
    fn ambiguous_or_foreign_blocks_are_not_applied_and_say_why_in_one_line() {
        let t = files(&[
            ("a.py", "def f():\n    return 1\n"),
            ("b.py", "def f():\n    return 2\n"),
        ]);
        let r = resolve(
            &block(None, "python", "def f():\n    return 3\n"),
            &t,
            &none,
        );
        let Resolved::NotApplied(why) = r else {
            panic!("{r:?}")
        };
        assert!(why.contains("several files (a.py, b.py)"), "{why}");
        assert!(!why.contains('\n'));
        let r = resolve(
            &block(None, "python", "def g():\n    return 3\n"),
            &t,
            &none,
        );
        let Resolved::NotApplied(why) = r else {
            panic!("{r:?}")
        };
        assert!(
            why.contains("no definition begins with `def g():`"),
            "{why}"
        );
        // A fragment that is not a definition's first line is not spliced in.
        let t = files(&[("m.py", STATS)]);
        let r = resolve(
            &block(None, "python", "    total = 0\n    total = 1\n"),
            &t,
            &none,
        );
        assert!(
            matches!(r, Resolved::NotApplied(ref w) if w.contains("not the first line of a definition")),
            "{r:?}"
        );
        // Commands and output are not edits; the same code again changes nothing.
        assert_eq!(
            resolve(&block(None, "sh", "python3 test.py"), &t, &none),
            Resolved::NotAnEdit
        );
        let same = "def spread(xs):\n    return max(xs) - min(xs)\n";
        let r = resolve(&block(None, "python", same), &t, &none);
        assert!(
            matches!(r, Resolved::NotApplied(ref w) if w.contains("already holds")),
            "{r:?}"
        );
        // A protected file is never written, named or not, and the model is told why.
        let t = files(&[("test_m.py", "def test():\n    assert False\n")]);
        for path in [Some("test_m.py"), None] {
            let r = resolve(
                &block(path, "python", "def test():\n    pass\n"),
                &t,
                &|p| p.starts_with("test_"),
            );
            assert!(
                matches!(r, Resolved::NotApplied(ref w) if w.contains("test_m.py, which the acceptance check relies on")),
                "{r:?}"
            );
        }
    }

    #[test]
    fn an_unnamed_block_that_is_the_whole_of_one_file_in_view_rewrites_it() {
        let cart = "\"\"\"A cart.\"\"\"\n\nfrom pricing import discount\n\n\ndef total(lines):\n    return 1\n";
        let t = files(&[
            ("cart.py", cart),
            ("pricing.py", "def discount(s):\n    return 0\n"),
        ]);
        let body = "\"\"\"A cart.\"\"\"\n\nfrom pricing import discount\n\n\ndef total(lines):\n    return 2\n";
        let r = resolve(&block(None, "python", body), &t, &none);
        let Resolved::Calls(calls, what) = r else {
            panic!("{r:?}")
        };
        // The lines it only copied are left as they are: the change is the definition's.
        assert_eq!(what, "definitions in cart.py");
        let mut t = t;
        apply(&calls, &mut t);
        assert_eq!(t["cart.py"], body);
        // A rewrite that moves things about is written whole.
        let moved = "\"\"\"A cart.\"\"\"\n\nfrom pricing import discount\n\nTAX = 0\n\n\ndef total(lines):\n    return 2 + TAX\n";
        let r = resolve(&block(None, "python", moved), &t, &none);
        let Resolved::Calls(calls, what) = r else {
            panic!("{r:?}")
        };
        assert_eq!(what, "the whole of cart.py");
        assert_eq!(calls[0].0, "write_file");
    }

    #[test]
    fn a_whole_file_that_also_looks_like_another_is_the_one_it_begins_like() {
        // From a real 1.5B run: cart.py rewritten with pricing's constants moved in, so it
        // holds most of pricing.py's top lines too; its first line says which it is.
        let cart = "\"\"\"A cart of (price, quantity) lines.\"\"\"\n\nfrom pricing import discount\n\n\ndef subtotal(lines):\n    return sum(p * q for p, q in lines)\n\n\ndef total(lines):\n    s = subtotal(lines)\n    return round(s - discount(s), 2)\n\n\ndef discount(subtotal):\n    return 0\n";
        let pricing = "\"\"\"Discount rules.\"\"\"\n\nTHRESHOLD = 100\nRATE = 0.10\n\n\ndef discount(subtotal):\n    if subtotal > THRESHOLD:\n        return round(subtotal * RATE, 2)\n    return 0\n";
        let t = files(&[("cart.py", cart), ("pricing.py", pricing)]);
        let body = "\"\"\"A cart of (price, quantity) lines.\"\"\"\n\nTHRESHOLD = 100\nRATE = 0.10\n\n\ndef subtotal(lines):\n    return sum(p * q for p, q in lines)\n\n\ndef total(lines):\n    s = subtotal(lines)\n    return round(s - discount(s), 2)\n\n\ndef discount(subtotal):\n    if subtotal > THRESHOLD:\n        return round(subtotal * RATE, 2)\n    return 0\n";
        let r = resolve(&block(None, "python", body), &t, &none);
        let Resolved::Calls(calls, what) = r else {
            panic!("{r:?}")
        };
        assert_eq!(what, "the whole of cart.py");
        assert_eq!(calls[0].0, "write_file");
    }

    #[test]
    fn a_block_that_begins_like_the_file_and_changes_a_definition_line_is_the_whole_file() {
        // From a real 1.5B run: the fix changes the one definition's first line, so only
        // half the file's top lines are in the block, but it begins with the file's docstring.
        let greet = "\"\"\"Greetings.\"\"\"\n\n\ndef greet(name, greeting=\"Hi\"):\n    return f\"{greeting}, {name}!\"\n";
        let fixed = "\"\"\"Greetings.\"\"\"\n\ndef greet(name, greeting=\"Hello\"):\n    return f\"{greeting}, {name}!\"\n";
        let t = files(&[("greet.py", greet)]);
        for path in [Some("greet.py"), None] {
            let r = resolve(&block(path, "python", fixed), &t, &none);
            let Resolved::Calls(calls, what) = r else {
                panic!("{r:?}")
            };
            assert_eq!(what, "the whole of greet.py");
            assert_eq!(calls[0].0, "write_file");
        }
        // The imports and one of two definitions are not the whole file (the other would be
        // lost): that definition is replaced.
        let t = files(&[("stats.py", STATS)]);
        let part = "import math\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n";
        for path in [Some("stats.py"), None] {
            let r = resolve(&block(path, "python", part), &t, &none);
            assert!(
                matches!(r, Resolved::Calls(ref c, _) if c.iter().all(|c| c.0 == "edit_file")),
                "{r:?}"
            );
        }
    }

    #[test]
    fn two_definitions_in_one_block_replace_theirs() {
        let mut t = files(&[("stats.py", STATS)]);
        let b = "def mean(xs):\n    return sum(xs) / len(xs)\n\n\ndef spread(xs):\n    return 0\n";
        let Resolved::Calls(calls, _) = resolve(&block(None, "python", b), &t, &none) else {
            panic!()
        };
        assert_eq!(calls.len(), 2);
        apply(&calls, &mut t);
        assert_eq!(
            t["stats.py"],
            "import math\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n\n\ndef spread(xs):\n    return 0\n"
        );
    }

    #[test]
    fn a_block_that_changes_nothing_is_not_applied_and_says_so() {
        let t = files(&[("stats.py", STATS)]);
        // The file as it is, named or not, with blank lines and trailing spaces changed.
        let same = STATS.replace("\n\n\n", "\n\n").replace("(xs):", "(xs):  ");
        for named in [Some("stats.py"), None] {
            let r = resolve(&block(named, "python", &same), &t, &none);
            assert_eq!(r, Resolved::Unchanged("stats.py".into()), "{named:?}");
        }
        // One changed line is a change.
        let changed = STATS.replace("(len(xs) + 1)", "len(xs)");
        assert!(matches!(
            resolve(&block(Some("stats.py"), "python", &changed), &t, &none),
            Resolved::Calls(..)
        ));
    }

    #[test]
    fn lines_after_the_definition_that_the_file_holds_are_not_added_again() {
        // What a 1.5B model wrote for a Node module: the function, fixed, and the export.
        let slug = "\"use strict\";\n\nfunction slug(title) {\n  return title.toLowerCase().replace(/ +/, \"-\");\n}\n\nmodule.exports = { slug };\n";
        let mut t = files(&[("slug.js", slug)]);
        let fixed = "function slug(title) {\n  return title.trim().toLowerCase().replace(/ +/g, \"-\");\n}\n\nmodule.exports = { slug };\n";
        let Resolved::Calls(calls, _) = resolve(&block(None, "javascript", fixed), &t, &none)
        else {
            panic!()
        };
        apply(&calls, &mut t);
        assert_eq!(
            t["slug.js"],
            "\"use strict\";\n\nfunction slug(title) {\n  return title.trim().toLowerCase().replace(/ +/g, \"-\");\n}\n\nmodule.exports = { slug };\n"
        );
    }

    #[test]
    fn a_first_line_that_only_names_the_file_is_not_written_into_it() {
        let texts = files(&[
            ("stats.py", STATS),
            ("web/slug.js", "function slug(s) {\n  return s;\n}\n"),
        ]);
        for first in [
            "# stats.py",
            "# stats.py (the whole file)",
            "`stats.py` (the whole file):",
        ] {
            let body = format!("{first}\n{}", STATS.replace("(len(xs) + 1)", "len(xs)"));
            let Resolved::Calls(calls, _) =
                resolve(&block(Some("stats.py"), "python", &body), &texts, &none)
            else {
                panic!("{first}: not applied");
            };
            let mut t = texts.clone();
            apply(&calls, &mut t);
            assert_eq!(
                t["stats.py"],
                STATS.replace("(len(xs) + 1)", "len(xs)"),
                "{first}"
            );
        }
        let js = "// slug.js\nfunction slug(s) {\n  return s.toLowerCase();\n}\n";
        let Resolved::Calls(calls, _) = resolve(&block(None, "javascript", js), &texts, &none)
        else {
            panic!("not applied");
        };
        let mut t = texts.clone();
        apply(&calls, &mut t);
        assert!(
            t["web/slug.js"].starts_with("function slug(s) {\n  return s.toLowerCase();"),
            "{}",
            t["web/slug.js"]
        );
        // A file that begins with such a line keeps it; other comments stay.
        let headed = files(&[("a.py", "# a.py\nX = 1\n")]);
        let Resolved::Calls(calls, _) = resolve(
            &block(Some("a.py"), "python", "# a.py\nX = 2\n"),
            &headed,
            &none,
        ) else {
            panic!("not applied");
        };
        let mut t = headed.clone();
        apply(&calls, &mut t);
        assert_eq!(t["a.py"], "# a.py\nX = 2\n");
        assert!(!names_a_file("# the mean of a list", &["stats.py"]));
    }
}
