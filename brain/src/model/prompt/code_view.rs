//! The failing code in view: the source around every place a command's output names
//! (`File "x.py", line 3`, `x.py:3:`, `--> src/lib.rs:3:5`, `(x.js:3:8)`, ...), or, in a small
//! workspace, its files whole. Pure: the engine lists and reads the files, this decides what
//! to show and how.
//!
//! The places are found by a table of patterns ([`PATTERNS`]), one per form the common
//! runners write, and kept only when they name a file of the workspace: a path written
//! absolute, or relative to another directory, is matched by its ending.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;

/// Lines shown above and below a named line.
const AROUND: u32 = 8;
/// How far above a named line the window reaches to start at its enclosing top-level line.
const REACH_UP: u32 = 30;
/// Most bytes of source one view shows.
pub const MAX_VIEW: usize = 6 * 1024;
/// A workspace whose text files together are at most this big is shown whole.
pub const SMALL_WORKSPACE: usize = 6 * 1024;
/// Most files a small workspace may have to be shown whole.
pub const SMALL_FILES: usize = 12;
/// Most files a view reads.
pub const MAX_FILES: usize = 6;

/// A place in a file that a command's output names (line 1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub path: String,
    pub line: u32,
}

/// The forms of `path` + `line` the common runners write: (the runners, the pattern with the
/// path as group 1 and the line as group 2).
pub const PATTERNS: &[(&str, &str)] = &[
    // Python tracebacks (unittest, plain scripts, pytest's --tb=native).
    ("python traceback", r#"File "([^"\n]+)", line (\d+)"#),
    // pytest (`test_x.py:12: AssertionError`), cargo and rustc (`--> src/lib.rs:3:5`,
    // `panicked at src/lib.rs:16:9:`, backtraces `at ./src/lib.rs:16:9`), Node and Jest stack
    // frames (`at f (/w/x.js:3:8)`, `at /w/x.js:3:8`), Go (`x_test.go:12: got 1`,
    // `/w/x.go:12 +0x1d`), gcc and clang (`x.c:3:5: error:`), and most linters.
    (
        "path:line[:column]",
        r#"(?:^|[\s(\[,'"=<>`])((?:[A-Za-z]:)?[\w./\\@+-]*[\w@+-]\.[A-Za-z][A-Za-z0-9]{0,9}):(\d+)(?::\d+)?"#,
    ),
];

static COMPILED: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    PATTERNS
        .iter()
        .map(|(_, p)| Regex::new(&format!("(?m){p}")).expect("a valid pattern"))
        .collect()
});

/// The places `output` names, in the order they first appear, each once.
pub fn locations(output: &str) -> Vec<Location> {
    let mut found: Vec<(usize, Location)> = Vec::new();
    for re in COMPILED.iter() {
        for c in re.captures_iter(output) {
            let (Some(p), Some(l)) = (c.get(1), c.get(2)) else {
                continue;
            };
            let Ok(line) = l.as_str().parse::<u32>() else {
                continue;
            };
            if line == 0 {
                continue;
            }
            found.push((
                p.start(),
                Location {
                    path: p.as_str().to_string(),
                    line,
                },
            ));
        }
    }
    found.sort_by_key(|(at, _)| *at);
    let mut out: Vec<Location> = Vec::new();
    for (_, l) in found {
        if !out.contains(&l) {
            out.push(l);
        }
    }
    out
}

/// The workspace file `written` names: itself, without `./`, or the one file whose path it
/// ends with (an absolute path on the worker, or one relative to another directory). `None`
/// when no file, or more than one equally long, fits.
pub fn resolve(written: &str, files: &[String]) -> Option<String> {
    let p = written.replace('\\', "/");
    let p = p.trim_start_matches("./");
    if files.iter().any(|f| f == p) {
        return Some(p.to_string());
    }
    let mut best: Option<&String> = None;
    let mut tie = false;
    for f in files {
        if p.ends_with(&format!("/{f}")) {
            match best {
                Some(b) if b.len() == f.len() => tie = true,
                Some(b) if b.len() > f.len() => {}
                _ => {
                    best = Some(f);
                    tie = false;
                }
            }
        }
    }
    best.filter(|_| !tie).cloned()
}

/// The files a view reads, in order of first mention, and the lines named in each: the
/// places of `locs` that are files of the workspace, at most [`MAX_FILES`] files.
pub fn named_files(locs: &[Location], files: &[String]) -> Vec<(String, Vec<u32>)> {
    let mut out: Vec<(String, Vec<u32>)> = Vec::new();
    for l in locs {
        let Some(f) = resolve(&l.path, files) else {
            continue;
        };
        let room = out.len() < MAX_FILES;
        match out.iter_mut().find(|(p, _)| *p == f) {
            Some((_, lines)) if !lines.contains(&l.line) => lines.push(l.line),
            Some(_) => {}
            None if room => out.push((f, vec![l.line])),
            None => {}
        }
    }
    out
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// A line that only closes a block (`}`, `end`, `});`): not the start of anything.
pub(crate) fn is_closer(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty() && (t == "end" || t.chars().all(|c| matches!(c, '}' | ')' | ']' | ';' | ',')))
}

/// The line ranges (1-based, inclusive) to show of a file of `lines` around `named`: from
/// the top-level line above each (within reach) or a few lines above, to a few below;
/// overlapping ranges merged.
pub fn windows(lines: &[&str], named: &[u32]) -> Vec<(u32, u32)> {
    let n = lines.len() as u32;
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for &l in named {
        if l == 0 || l > n {
            continue;
        }
        let mut start = l.saturating_sub(AROUND).max(1);
        let lowest = l.saturating_sub(REACH_UP).max(1);
        for k in (lowest..=l).rev() {
            let text = lines[(k - 1) as usize];
            if !text.trim().is_empty() && indent(text) == 0 && !is_closer(text) {
                start = start.min(k);
                break;
            }
        }
        ranges.push((start, (l + AROUND).min(n)));
    }
    ranges.sort();
    let mut merged: Vec<(u32, u32)> = Vec::new();
    for (s, e) in ranges {
        match merged.last_mut() {
            Some((_, pe)) if s <= *pe + 1 => *pe = (*pe).max(e),
            _ => merged.push((s, e)),
        }
    }
    merged
}

/// The language name for a fence, from a path's extension (empty when unknown).
pub fn fence_lang(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
    match ext {
        "py" => "python",
        "rs" => "rust",
        "js" | "mjs" | "cjs" => "javascript",
        "ts" => "typescript",
        "go" => "go",
        "c" | "h" => "c",
        "cc" | "cpp" | "hpp" => "cpp",
        "java" => "java",
        "rb" => "ruby",
        "sh" => "sh",
        "toml" => "toml",
        "json" => "json",
        _ => "",
    }
}

fn fence_for(body: &str) -> &'static str {
    if body.contains("```") { "~~~~" } else { "```" }
}

/// One file's part of a view: a header naming it and its lines, then the lines in a fence.
fn block(path: &str, header: &str, body: &str) -> String {
    let fence = fence_for(body);
    let mut body = body.to_string();
    if !body.ends_with('\n') {
        body.push('\n');
    }
    format!(
        "`{path}` {header}:\n{fence}{}\n{body}{fence}\n",
        fence_lang(path)
    )
}

/// The view of the places named in `named` (path, lines), given the files' texts: their
/// windows, at most [`MAX_VIEW`] bytes in all. Empty when there is nothing to show.
pub fn render_windows(named: &[(String, Vec<u32>)], texts: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (path, lines_named) in named {
        let Some(text) = texts.get(path) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        for (s, e) in windows(&lines, lines_named) {
            let body = lines[(s - 1) as usize..e as usize].join("\n");
            let header = if s == 1 && e as usize == lines.len() {
                "(the whole file)".to_string()
            } else {
                format!("lines {s}-{e} of {}", lines.len())
            };
            let part = block(path, &header, &body);
            if out.len() + part.len() > MAX_VIEW {
                if out.is_empty() {
                    out.push_str(&crate::model::text::head_tail(&part, MAX_VIEW));
                }
                return finish(POINTED_AT, out, true);
            }
            out.push_str(&part);
        }
    }
    finish(POINTED_AT, out, false)
}

/// The title of a view of the code an output points at.
const POINTED_AT: &str = "The code it points at, as the files are now:";

/// A small workspace's text files, whole (`texts` in the order to show them).
pub fn render_whole(texts: &[(String, String)]) -> String {
    render_files(POINTED_AT, texts)
}

/// Files whole under `title`, at most [`MAX_VIEW`] bytes in all.
pub fn render_files(title: &str, texts: &[(String, String)]) -> String {
    let mut out = String::new();
    for (path, text) in texts {
        let part = block(path, "(the whole file)", text);
        if out.len() + part.len() > MAX_VIEW {
            return finish(title, out, true);
        }
        out.push_str(&part);
    }
    finish(title, out, false)
}

fn finish(title: &str, out: String, cut: bool) -> String {
    if out.is_empty() {
        return out;
    }
    let mut s = format!("{title}\n{out}");
    if cut {
        s.push_str("(more was named than fits here: read_file shows the rest)\n");
    }
    s.trim_end().to_string()
}

/// The files and line ranges a view shows (its headers), for people reading the log.
pub fn headers(view: &str) -> Vec<String> {
    view.lines()
        .filter(|l| l.starts_with('`') && l.ends_with(':'))
        .map(|l| l.trim_end_matches(':').replace('`', ""))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real outputs of each runner, as they print them (paths as on the machine that ran
    /// them), and the places in each that are the workspace's.
    const PYTHON_UNITTEST: &str = r#".F
======================================================================
FAIL: test_mean (__main__.T.test_mean)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/tmp/rt/test_stats.py", line 6, in test_mean
    self.assertEqual(mean([1, 2, 3]), 2)
AssertionError: 1.5 != 2

----------------------------------------------------------------------
Ran 2 tests in 0.001s

FAILED (failures=1)
"#;
    const PYTHON_SCRIPT: &str = r#"Traceback (most recent call last):
  File "/tmp/rt/test_s2.py", line 2, in <module>
    assert mean([]) == 0
           ^^^^^^^^
  File "/tmp/rt/stats2.py", line 5, in mean
    return total / len(xs)
           ~~~~~~^~~~~~~~~
ZeroDivisionError: division by zero
"#;
    const PYTEST: &str = r#".F                                                                       [100%]
=================================== FAILURES ===================================
_________________________________ T.test_mean __________________________________

self = <test_stats.T testMethod=test_mean>

    def test_mean(self):
>       self.assertEqual(mean([1, 2, 3]), 2)
E       AssertionError: 1.5 != 2

test_stats.py:6: AssertionError
=========================== short test summary info ============================
FAILED test_stats.py::T::test_mean - AssertionError: 1.5 != 2
1 failed, 1 passed in 0.03s
"#;
    const CARGO_PANIC: &str = r#"
running 1 test
tests::low --- FAILED

failures:

---- tests::low stdout ----

thread 'tests::low' (15425) panicked at src/lib.rs:16:9:
assertion `left == right` failed
  left: 10
 right: 0
stack backtrace:
   0: __rustc::rust_begin_unwind
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/panicking.rs:689:5
   4: rs::tests::low
             at ./src/lib.rs:16:9
"#;
    const RUSTC_ERROR: &str = r#"error[E0308]: mismatched types
  --> src/lib.rs:19:21
   |
19 | pub fn f() -> i32 { "x" }
   |               ---   ^^^ expected `i32`, found `&str`
"#;
    const NODE: &str = r#"node:assert:90
  throw new AssertionError(obj);
  ^

AssertionError [ERR_ASSERTION]: Expected values to be strictly equal:
+ actual - expected

+ 'a-b c'
- 'a-b-c'
      ^
    at Object.<anonymous> (/tmp/rt/js/test.js:3:8)
    at Module._compile (node:internal/modules/cjs/loader:1521:14)
    at node:internal/main/run_main_module:28:49 {
  generatedMessage: true,
"#;
    const JEST: &str = r#"FAIL src/slug.test.js
  ● slug › joins words

    expect(received).toBe(expected) // Object.is equality

    Expected: "a-b-c"
    Received: "a-b c"

      3 | test("joins words", () => {
    > 4 |   expect(slug("a b c")).toBe("a-b-c");
        |                         ^
      5 | });

      at Object.toBe (src/slug.test.js:4:25)
"#;
    const GO_TEST: &str = r#"--- FAIL: TestMean (0.00s)
    stats_test.go:9: Mean([1 2 3]) = 1.5, want 2
FAIL
FAIL	example.com/stats	0.002s
"#;
    const GO_PANIC: &str = r#"panic: runtime error: integer divide by zero [recovered]
goroutine 7 [running]:
example.com/stats.Mean(...)
	/home/u/stats/stats.go:7 +0x1d
"#;

    fn files() -> Vec<String> {
        [
            "test_stats.py",
            "stats.py",
            "test_s2.py",
            "stats2.py",
            "src/lib.rs",
            "js/test.js",
            "src/slug.test.js",
            "stats_test.go",
            "stats.go",
        ]
        .map(String::from)
        .to_vec()
    }

    fn places(output: &str) -> Vec<(String, u32)> {
        named_files(&locations(output), &files())
            .into_iter()
            .flat_map(|(p, ls)| ls.into_iter().map(move |l| (p.clone(), l)))
            .collect()
    }

    #[test]
    fn the_places_each_runner_names_are_found_and_kept_to_the_workspace() {
        let p = |s: &str, l: u32| (s.to_string(), l);
        type Row<'a> = (&'a str, &'a str, Vec<(String, u32)>);
        let table: &[Row] = &[
            ("unittest", PYTHON_UNITTEST, vec![p("test_stats.py", 6)]),
            (
                "python script",
                PYTHON_SCRIPT,
                vec![p("test_s2.py", 2), p("stats2.py", 5)],
            ),
            ("pytest", PYTEST, vec![p("test_stats.py", 6)]),
            ("cargo test panic", CARGO_PANIC, vec![p("src/lib.rs", 16)]),
            ("rustc error", RUSTC_ERROR, vec![p("src/lib.rs", 19)]),
            ("node", NODE, vec![p("js/test.js", 3)]),
            ("jest", JEST, vec![p("src/slug.test.js", 4)]),
            ("go test", GO_TEST, vec![p("stats_test.go", 9)]),
            ("go panic", GO_PANIC, vec![p("stats.go", 7)]),
            ("nothing", "all good\nRan 3 tests in 0.1s\nOK", vec![]),
        ];
        for (runner, output, want) in table {
            assert_eq!(&places(output), want, "{runner}");
        }
        // Places outside the workspace (the standard library, the runtime) are dropped.
        assert!(
            locations(CARGO_PANIC)
                .iter()
                .any(|l| l.path.contains("panicking.rs"))
        );
    }

    #[test]
    fn paths_resolve_by_their_ending_and_ties_resolve_to_nothing() {
        let files = ["a/x.py", "b/x.py", "x.py", "src/lib.rs"].map(String::from);
        assert_eq!(resolve("./x.py", &files).as_deref(), Some("x.py"));
        assert_eq!(resolve("/w/a/x.py", &files).as_deref(), Some("a/x.py"));
        assert_eq!(
            resolve("/w/src/lib.rs", &files).as_deref(),
            Some("src/lib.rs")
        );
        assert_eq!(resolve("/w/c/x.py", &files).as_deref(), Some("x.py"));
        assert_eq!(resolve("/w/lib.rs", &files), None);
        let two = ["a/x.py", "b/a/x.py"].map(String::from);
        assert_eq!(resolve("/w/b/a/x.py", &two).as_deref(), Some("b/a/x.py"));
    }

    #[test]
    fn a_window_starts_at_the_enclosing_top_level_line_and_windows_merge() {
        let src: Vec<String> = (1..=60)
            .map(|i| match i {
                10 => "def f(x):".to_string(),
                40 => "def g(x):".to_string(),
                _ => format!("    line {i}"),
            })
            .collect();
        let lines: Vec<&str> = src.iter().map(String::as_str).collect();
        assert_eq!(windows(&lines, &[14]), vec![(6, 22)]);
        assert_eq!(windows(&lines, &[30]), vec![(10, 38)]);
        assert_eq!(windows(&lines, &[14, 20]), vec![(6, 28)]);
        assert_eq!(windows(&lines, &[45, 14]), vec![(6, 22), (37, 53)]);
        assert_eq!(windows(&lines, &[0, 61]), vec![]);
    }

    #[test]
    fn a_view_shows_the_named_code_within_its_cap() {
        let mut texts = BTreeMap::new();
        texts.insert(
            "stats2.py".to_string(),
            "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n".to_string(),
        );
        let named = named_files(&locations(PYTHON_SCRIPT), &files());
        let v = render_windows(&named, &texts);
        assert!(
            v.contains("`stats2.py` (the whole file):\n```python\ndef mean(xs):"),
            "{v}"
        );
        assert!(v.contains("return total / len(xs)\n```"), "{v}");
        assert!(
            !v.contains("test_s2.py"),
            "a file not read is not shown: {v}"
        );
        let big: String = (1..=2000).map(|i| format!("x = {i}\n")).collect();
        texts.insert("stats2.py".into(), big);
        let many: Vec<(String, Vec<u32>)> =
            vec![("stats2.py".into(), (1..200).map(|i| i * 10).collect())];
        let v = render_windows(&many, &texts);
        assert!(v.len() <= MAX_VIEW + 200, "{}", v.len());
        assert!(v.contains("read_file shows the rest"), "{v}");
        assert_eq!(render_windows(&[], &texts), "");
    }

    #[test]
    fn a_small_workspace_is_shown_whole_and_code_with_fences_gets_a_longer_fence() {
        let v = render_whole(&[
            ("a.py".into(), "x = 1\n".into()),
            ("README.md".into(), "```sh\nrun\n```\n".into()),
        ]);
        assert!(
            v.contains("`a.py` (the whole file):\n```python\nx = 1\n```"),
            "{v}"
        );
        assert!(v.contains("~~~~\n```sh\nrun\n```\n~~~~"), "{v}");
    }
}
