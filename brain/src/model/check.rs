//! A task's acceptance check: the command that decides whether a `finish` is done, where it
//! comes from (`--check`, the repository's `.tether/check`, the config) and the files it
//! relies on, which the model may not change.

use serde::{Deserialize, Serialize};

/// A task's acceptance check: a shell command run in the workspace on the task's worker,
/// sandboxed and logged like any call; exit status 0 means the goal is met.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub command: String,
    /// 0: the default (10 minutes).
    #[serde(default)]
    pub timeout_ms: u64,
    /// Where it came from.
    #[serde(default, skip_serializing_if = "CheckSource::is_unsaid")]
    pub source: CheckSource,
    /// Files the check relies on (globs over workspace paths, e.g. `test_*.py`): the model's
    /// file tools may not change them, and they are put back as the task started before
    /// every run of the check, so a check cannot be passed by editing it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protect: Vec<String>,
}

/// Where a task's check came from; the precedence is the request's, then the repository's,
/// then the config's. (The names on the wire and in logs stay as they were first written.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckSource {
    /// Not recorded (logs written before the source was).
    #[default]
    #[serde(rename = "")]
    Unsaid,
    /// The task's request (`brain run --check`, the API's `check`).
    #[serde(rename = "--check")]
    Request,
    /// The repository's own `.tether/check`.
    #[serde(rename = ".tether/check")]
    Repository,
    /// The brain's config (`[agent] check`).
    #[serde(rename = "config")]
    Config,
}

impl CheckSource {
    pub fn is_unsaid(&self) -> bool {
        *self == CheckSource::Unsaid
    }
}

impl Check {
    /// How long a run may take.
    pub fn timeout(&self) -> std::time::Duration {
        match self.timeout_ms {
            0 => std::time::Duration::from_secs(600),
            ms => std::time::Duration::from_millis(ms),
        }
    }
}

/// One run of a task's acceptance check.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckRun {
    pub call_id: u64,
    pub passed: bool,
    /// How it ended, in words (`exit code 1`, `timed out`).
    pub result: String,
    /// Its output (stdout then stderr), head and tail.
    pub output: String,
    /// Its exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

impl CheckRun {
    /// Why the check cannot run at all (the shell's 126, not executable, or 127, not
    /// found), in words for the task's end; `None` when it ran, whatever it said.
    pub fn unrunnable(&self, command: &str) -> Option<String> {
        let why = match self.exit_code? {
            126 => "its command is not executable (exit code 126)",
            127 => "its command was not found (exit code 127)",
            _ => return None,
        };
        let said = self.output.trim();
        Some(format!(
            "the acceptance check `{command}` cannot run here: {why}{}. Nothing was asked of the model: fix the check (--check, or .tether/check) or install what it needs on the worker, then run the task again",
            if said.is_empty() {
                String::new()
            } else {
                format!(" ({})", super::text::head_tail(said, 300))
            }
        ))
    }
}

/// The repository file that names a task's acceptance check: its first line that is neither
/// empty, a `#` comment nor a `protect GLOB` line is the command; each `protect GLOB` line
/// names files the check relies on.
pub const CHECK_FILE: &str = ".tether/check";

/// The check command and protected globs a `.tether/check` file names, if it names a command.
pub fn check_from_file(text: &str) -> Option<(String, Vec<String>)> {
    let mut command = None;
    let mut protect = Vec::new();
    for l in text.lines().map(str::trim) {
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        match l.strip_prefix("protect ") {
            Some(glob) if !glob.trim().is_empty() => protect.push(glob.trim().to_string()),
            Some(_) => {}
            None => {
                command.get_or_insert_with(|| l.to_string());
            }
        }
    }
    command.map(|c| (c, protect))
}

/// Whether `path` (workspace-relative) is one a check protects.
pub fn is_protected(check: &Check, path: &str) -> bool {
    let path = path.trim_start_matches("./");
    check.protect.iter().any(|p| {
        globset::GlobBuilder::new(p)
            .literal_separator(true)
            .build()
            .is_ok_and(|g| g.compile_matcher().is_match(path))
    })
}

#[cfg(test)]
mod source_tests {
    use crate::model::check::{Check, CheckRun, CheckSource};

    #[test]
    fn a_checks_source_reads_as_logs_wrote_it_and_writes_it_the_same() {
        for (text, source) in [
            (
                r#"{"command":"t","source":"--check"}"#,
                CheckSource::Request,
            ),
            (
                r#"{"command":"t","source":".tether/check"}"#,
                CheckSource::Repository,
            ),
            (r#"{"command":"t","source":"config"}"#, CheckSource::Config),
            (r#"{"command":"t"}"#, CheckSource::Unsaid),
        ] {
            let c: Check = serde_json::from_str(text).unwrap();
            assert_eq!(c.source, source, "{text}");
            let back = serde_json::to_string(&c).unwrap();
            assert_eq!(back.replace(",\"timeout_ms\":0", ""), text, "{text}");
        }
    }

    #[test]
    fn a_check_that_cannot_run_says_so_and_one_that_ran_does_not() {
        let run = |code: Option<i32>, output: &str| CheckRun {
            exit_code: code,
            output: output.into(),
            ..Default::default()
        };
        let why = run(Some(127), "sh: 1: pytest: not found")
            .unrunnable("pytest -q")
            .unwrap();
        assert!(
            why.contains("`pytest -q` cannot run here")
                && why.contains("not found (exit code 127)")
                && why.contains("pytest: not found"),
            "{why}"
        );
        assert!(
            run(Some(126), "")
                .unrunnable("./t.sh")
                .unwrap()
                .contains("not executable (exit code 126)")
        );
        for code in [Some(0), Some(1), Some(2), None] {
            assert_eq!(run(code, "").unrunnable("make test"), None, "{code:?}");
        }
    }
}
