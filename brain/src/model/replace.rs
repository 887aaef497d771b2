//! `edit_file`'s replacement of one text by another in a file's text: exactly once, or
//! loosely where a model's copy differs only in indent, trailing spaces or `read_file`'s line
//! numbers; and when nothing fits, the file's lines most like what the model meant, so its
//! next try can copy them instead of guessing again.

use super::text::numbered;

/// Why an edit was not applied. The messages are the model's observation.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EditError {
    #[error(
        "error: old_string was not found in {path}; read the file and copy the exact text (whitespace included){}{}",
        new_said(path, *new_at),
        nearest_said(path, nearest.as_deref())
    )]
    NotFound {
        path: String,
        /// The file's lines most like `old_string`, numbered.
        nearest: Option<String>,
        /// The line where `new_string`'s lines already stand: an edit sent again after it
        /// took effect (small models do), or the same lines elsewhere.
        new_at: Option<usize>,
    },
    #[error(
        "error: old_string occurs {n} times in {path}; include more surrounding lines so it occurs once"
    )]
    NotUnique { path: String, n: usize },
}

fn new_said(path: &str, new_at: Option<usize>) -> String {
    match new_at {
        None => String::new(),
        Some(line) => format!(
            ". new_string's lines are already in {path}, at line {line}: if that is this edit, it was made already"
        ),
    }
}

fn nearest_said(path: &str, nearest: Option<&str>) -> String {
    match nearest {
        None => String::new(),
        Some(lines) => format!(
            ". The lines of {path} most like old_string (the numbers are not part of the file):\n{lines}"
        ),
    }
}

/// Most lines of the file, and of `old_string`, compared when looking for the nearest: a
/// bound on the work one failed edit costs.
const MAX_LINES_COMPARED: usize = 20_000;
const MAX_OLD_LINES: usize = 60;
/// Most lines shown as the nearest.
const MAX_SHOWN: usize = 30;
/// How alike (0 to 1, the mean over a window's lines) the nearest lines must be to be shown.
const LEAST_ALIKE: f64 = 0.5;

/// Applies an edit whose `old` occurs exactly once, or says it did not; nothing loose, no
/// nearest lines (the `forgiving_edits` assist off).
pub fn apply_exact(text: &str, old: &str, new: &str, path: &str) -> Result<String, EditError> {
    match text.matches(old).count() {
        1 => Ok(text.replacen(old, new, 1)),
        0 => Err(EditError::NotFound {
            path: path.into(),
            nearest: None,
            new_at: None,
        }),
        n => Err(EditError::NotUnique {
            path: path.into(),
            n,
        }),
    }
}

/// Applies an exact-match edit, or a loose one, or says what the model should do instead.
pub fn apply_edit(text: &str, old: &str, new: &str, path: &str) -> Result<String, EditError> {
    match text.matches(old).count() {
        1 => return Ok(text.replacen(old, new, 1)),
        0 => {}
        n => {
            return Err(EditError::NotUnique {
                path: path.into(),
                n,
            });
        }
    }
    if let Some(edited) = loose_edit(text, old, new) {
        return Ok(edited);
    }
    // `read_file`'s numbers copied with the lines: the edit without them.
    let bare = without_line_numbers(old).map(|bare_old| {
        let bare_new = without_line_numbers(new).unwrap_or_else(|| new.to_string());
        (bare_old, bare_new)
    });
    let (old, new) = match &bare {
        Some((bare_old, bare_new)) => {
            if let Ok(edited) = apply_edit(text, bare_old, bare_new, path) {
                return Ok(edited);
            }
            (bare_old.as_str(), bare_new.as_str())
        }
        None => (old, new),
    };
    Err(EditError::NotFound {
        path: path.into(),
        nearest: nearest_lines(text, old),
        new_at: lines_at(text, new),
    })
}

/// The 1-based line where `needle`'s lines stand in `text` as whole lines (each trimmed
/// alike; blank lines skipped on both sides), the first such place; `None` for a needle
/// without text.
fn lines_at(text: &str, needle: &str) -> Option<usize> {
    let want: Vec<&str> = needle
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if want.is_empty() {
        return None;
    }
    let have: Vec<(usize, &str)> = text
        .lines()
        .take(MAX_LINES_COMPARED)
        .map(str::trim)
        .enumerate()
        .filter(|(_, l)| !l.is_empty())
        .collect();
    have.windows(want.len())
        .find(|w| w.iter().zip(&want).all(|((_, h), n)| h == n))
        .map(|w| w[0].0 + 1)
}

/// `text` without `read_file`'s line numbers (`   12\t`), when every line that is not blank
/// begins with one; else `None`.
fn without_line_numbers(text: &str) -> Option<String> {
    let strip = |l: &str| -> Option<String> {
        let (num, rest) = l.split_once('\t')?;
        let num = num.trim_start();
        (!num.is_empty() && num.bytes().all(|b| b.is_ascii_digit())).then(|| rest.to_string())
    };
    let mut out = Vec::new();
    let mut any = false;
    for l in text.split('\n') {
        if l.trim().is_empty() {
            out.push(String::new());
        } else {
            out.push(strip(l)?);
            any = true;
        }
    }
    any.then(|| out.join("\n"))
}

fn lead(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The edit when `old` is not in `text` exactly but its lines are, once, whole, with
/// trailing spaces aside and all indented alike by the same amount (a model that copied a
/// method's lines without their indent): those lines replaced by `new`'s, indented alike.
fn loose_edit(text: &str, old: &str, new: &str) -> Option<String> {
    let want: Vec<&str> = old.trim_matches('\n').lines().collect();
    if want.iter().all(|l| l.trim().is_empty()) {
        return None;
    }
    let have: Vec<&str> = text.split_inclusive('\n').collect();
    let fits = |s: usize| -> Option<isize> {
        let mut shift: Option<isize> = None;
        for (i, w) in want.iter().enumerate() {
            let h = have[s + i].trim_end_matches(['\n', '\r']);
            if w.trim().is_empty() || h.trim().is_empty() {
                if w.trim().is_empty() && h.trim().is_empty() {
                    continue;
                }
                return None;
            }
            if h.trim() != w.trim() {
                return None;
            }
            let d = lead(h) as isize - lead(w) as isize;
            match shift {
                None => shift = Some(d),
                Some(x) if x == d => {}
                Some(_) => return None,
            }
        }
        shift
    };
    if have.len() < want.len() {
        return None;
    }
    let found: Vec<(usize, isize)> = (0..=have.len() - want.len())
        .filter_map(|s| fits(s).map(|d| (s, d)))
        .collect();
    let [(s, shift)] = found[..] else {
        return None;
    };
    let pad = if shift > 0 {
        let first = have[s..s + want.len()]
            .iter()
            .find(|l| !l.trim().is_empty())?;
        first[..shift as usize].to_string()
    } else {
        String::new()
    };
    let mut out: String = have[..s].concat();
    let ends_nl = have[s + want.len() - 1].ends_with('\n');
    let new_lines: Vec<String> = new
        .trim_matches('\n')
        .lines()
        .map(|l| {
            if l.trim().is_empty() {
                String::new()
            } else if shift >= 0 {
                format!("{pad}{l}")
            } else {
                l[(-shift as usize).min(lead(l))..].to_string()
            }
        })
        .collect();
    out.push_str(&new_lines.join("\n"));
    if ends_nl && !new_lines.is_empty() {
        out.push('\n');
    }
    out.push_str(&have[s + want.len()..].concat());
    Some(out)
}

/// A line's words (runs of letters, digits and `_`) and its other marks, as a 64-bit set.
fn marks(line: &str) -> u64 {
    let bit = |s: &str| {
        // FNV-1a: a stable, cheap hash; a collision only makes two lines look more alike.
        let h = s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        1u64 << (h % 64)
    };
    let mut set = 0;
    let mut word = String::new();
    for c in line.chars() {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            set |= bit(&word);
            word.clear();
        }
        if !c.is_whitespace() {
            set |= bit(c.encode_utf8(&mut [0; 4]));
        }
    }
    if !word.is_empty() {
        set |= bit(&word);
    }
    set
}

/// How alike two lines are, 0 to 1: the share of their words and marks they have in common;
/// lines equal once trimmed are 1.
fn alike(a: &(&str, u64), b: &(&str, u64)) -> f64 {
    if a.0 == b.0 {
        return 1.0;
    }
    let all = (a.1 | b.1).count_ones();
    if all == 0 {
        return 0.0;
    }
    f64::from((a.1 & b.1).count_ones()) / f64::from(all)
}

/// The run of the file's lines, as long as `old`'s, whose lines are most like `old`'s (the
/// first such run), numbered as `read_file` numbers them; `None` when none is at least half
/// alike or `old` has no text.
pub fn nearest_lines(text: &str, old: &str) -> Option<String> {
    fn key(l: &str) -> (&str, u64) {
        let t = l.trim();
        (t, marks(t))
    }
    let want: Vec<(&str, u64)> = old
        .trim_matches('\n')
        .lines()
        .take(MAX_OLD_LINES)
        .map(key)
        .collect();
    if want.iter().all(|(t, _)| t.is_empty()) {
        return None;
    }
    let have: Vec<(&str, u64)> = text.lines().take(MAX_LINES_COMPARED).map(key).collect();
    if have.is_empty() {
        return None;
    }
    let k = want.len().min(have.len());
    let score = |s: usize| -> f64 {
        let pairs = (0..k).filter(|j| !(want[*j].0.is_empty() && have[s + j].0.is_empty()));
        let (sum, n) = pairs.fold((0.0, 0u32), |(sum, n), j| {
            (sum + alike(&want[j], &have[s + j]), n + 1)
        });
        if n == 0 { 0.0 } else { sum / f64::from(n) }
    };
    let (best, s) = (0..=have.len() - k)
        .map(|s| (score(s), s))
        .fold((f64::MIN, 0), |b, x| if x.0 > b.0 { x } else { b });
    if best < LEAST_ALIKE {
        return None;
    }
    // A line either side, so the model sees where the run sits.
    let first = s.max(1);
    let last = (s + k.min(MAX_SHOWN) + 1).min(have.len());
    Some(numbered(text, first as u32, last as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_whose_lines_match_but_for_indent_and_trailing_spaces_applies_once() {
        let text = "class S:\n    def mean(self, xs):  \n        return 0\n\n    def n(self):\n        return 1\n";
        let got = apply_edit(
            text,
            "def mean(self, xs):\n    return 0",
            "def mean(self, xs):\n    return sum(xs) / len(xs)",
            "s.py",
        )
        .unwrap();
        assert_eq!(
            got,
            "class S:\n    def mean(self, xs):\n        return sum(xs) / len(xs)\n\n    def n(self):\n        return 1\n"
        );
        // Twice, or not at all: not applied.
        let twice = "def f():\n    return 0\n\ndef g():\n    return 0\n";
        assert!(apply_edit(twice, "  return 0", "  return 1", "t.py").is_err());
        assert!(apply_edit(text, "return 2", "return 1", "s.py").is_err());
        // Lines indented unevenly against the file's are not a match.
        assert!(apply_edit(text, "def mean(self, xs):\nreturn 0", "x", "s.py").is_err());
    }

    #[test]
    fn exact_edits_need_one_match() {
        assert_eq!(apply_edit("x = 1", "1", "2", "f").unwrap(), "x = 2");
        assert!(
            apply_edit("1 1", "1", "2", "f")
                .unwrap_err()
                .to_string()
                .contains("occurs 2 times")
        );
        assert_eq!(apply_exact("x = 1", "1", "2", "f").unwrap(), "x = 2");
        // What the forgiving match applies, the exact one does not, and says no more.
        let text = "class S:\n    def mean(self, xs):  \n        return 0\n";
        let old = "def mean(self, xs):\n    return 0";
        assert!(apply_edit(text, old, "x", "s.py").is_ok());
        assert_eq!(
            apply_exact(text, old, "x", "s.py"),
            Err(EditError::NotFound {
                path: "s.py".into(),
                nearest: None,
                new_at: None
            })
        );
        let e = apply_edit("x", "y", "z", "f").unwrap_err();
        assert!(e.to_string().contains("not found"), "{e}");
        assert_eq!(
            e,
            EditError::NotFound {
                path: "f".into(),
                nearest: None,
                new_at: None,
            }
        );
    }

    #[test]
    fn an_edit_made_already_is_said_to_be() {
        let text =
            "def total(lines):\n    s = subtotal(lines)\n    d = discount(s)\n    return s - d\n";
        // The model sends again an edit that took effect: its old text is gone, its new is there.
        let new_at = |old: &str, new: &str| match apply_edit(text, old, new, "cart.py") {
            Err(EditError::NotFound { new_at, .. }) => new_at,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            new_at("    d = discount(total)", "    d = discount(s)"),
            Some(3)
        );
        let said = apply_edit(
            text,
            "    d = discount(total)",
            "    d = discount(s)",
            "cart.py",
        )
        .unwrap_err()
        .to_string();
        assert!(said.contains("already in cart.py, at line 3"), "{said}");
        assert!(said.contains("made already"), "{said}");
        // Whole lines, blank lines and indent aside.
        assert_eq!(
            new_at("x = 1", "\n\n  d = discount(s)\n\nreturn s - d"),
            Some(3)
        );
        // A part of a line is not the edit's lines; nor is an empty new text (a deletion).
        for new in ["discount", "", "\n  \n"] {
            let err = apply_edit(text, "    e = 2\n", new, "cart.py").unwrap_err();
            assert!(
                matches!(err, EditError::NotFound { new_at: None, .. }),
                "{new:?}: {err:?}"
            );
            assert!(!err.to_string().contains("made already"));
        }
    }

    #[test]
    fn lines_copied_with_read_files_numbers_are_edited_without_them() {
        let text = "def f(x):\n    return x\n\n\ndef g(x):\n    return 2 * x\n";
        let got = apply_edit(
            text,
            "     5\tdef g(x):\n     6\t    return 2 * x",
            "     5\tdef g(x):\n     6\t    return 3 * x",
            "m.py",
        )
        .unwrap();
        assert_eq!(
            got,
            "def f(x):\n    return x\n\n\ndef g(x):\n    return 3 * x\n"
        );
        // New text without numbers is taken as it is.
        let got = apply_edit(text, "     2\t    return x", "    return -x", "m.py").unwrap();
        assert!(got.starts_with("def f(x):\n    return -x\n"), "{got}");
        // Numbered lines that do not fit are answered with the nearest lines, compared
        // without their numbers.
        let err = apply_edit(text, "     6\t    return 4 * x", "x", "m.py").unwrap_err();
        assert!(
            matches!(&err, EditError::NotFound { nearest: Some(n), .. } if n.contains("     6\t    return 2 * x")),
            "{err:?}"
        );
        // Numbers on some lines only: not numbers read_file wrote.
        assert!(without_line_numbers("1\tone\ntwo").is_none());
        assert!(without_line_numbers("  \n").is_none());
        assert_eq!(without_line_numbers("  7\ta\n\n 12\tb").unwrap(), "a\n\nb");
    }

    #[test]
    fn an_edit_that_does_not_fit_is_told_the_lines_most_like_it() {
        let text: String = (1..=40)
            .map(|i| format!("def f{i}(xs):\n    return helper_{i}(xs)\n"))
            .collect();
        let text = format!(
            "{text}def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n"
        );
        // Lines the model remembered wrong: `+=` written `=+`, `len` as `length`.
        let old = "def mean(xs):\n    total = 0\n    for x in xs:\n        total =+ x\n    return total / length(xs)";
        let err = apply_edit(&text, old, "x", "stats.py").unwrap_err();
        let EditError::NotFound {
            nearest: Some(lines),
            ..
        } = &err
        else {
            panic!("no nearest lines: {err:?}");
        };
        // The run itself, numbered as read_file numbers it, with a line before it.
        assert_eq!(
            lines,
            "    80\t    return helper_40(xs)\n    81\tdef mean(xs):\n    82\t    total = 0\n    83\t    for x in xs:\n    84\t        total += x\n    85\t    return total / len(xs)\n"
        );
        let said = err.to_string();
        assert!(said.contains("most like old_string"), "{said}");
        assert!(said.ends_with(lines.as_str()), "{said}");
        // Nothing in the file like it: nothing shown.
        assert_eq!(
            nearest_lines(&text, "class Banana:\n    colour = 'yellow'"),
            None
        );
        assert_eq!(nearest_lines(&text, "\n  \n"), None);
        assert_eq!(nearest_lines("", "x"), None);
        // Longer than the file: the whole file is compared.
        assert!(nearest_lines("a = 1\n", "a = 1\nb = 2\nc = 3").is_some());
    }

    #[test]
    fn the_nearest_lines_are_cut_to_a_readable_run() {
        let text: String = (0..200).map(|i| format!("value_{i} = {i}\n")).collect();
        let old: String = (0..100).map(|i| format!("value_{i} = {i}.0\n")).collect();
        let lines = nearest_lines(&text, &old).unwrap();
        assert_eq!(lines.lines().count(), MAX_SHOWN + 1, "{lines}");
        assert!(lines.starts_with("     1\tvalue_0 = 0\n"), "{lines}");
    }
}
