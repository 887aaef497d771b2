//! Assertions on what a finished command said, which show all of its output when they fail.

use std::process::Output;

use crate::text;

/// Asserts that `out`'s standard output or error holds `words`.
#[track_caller]
pub fn assert_said(out: &Output, words: &str) {
    assert!(text(out).contains(words), "no {words:?} in: {}", text(out));
}

/// Asserts that `out`'s standard error holds `words`.
#[track_caller]
pub fn assert_stderr_says(out: &Output, words: &str) {
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(words),
        "no {words:?} on stderr: {}",
        text(out)
    );
}

/// Asserts that `out`'s standard output holds `words`.
#[track_caller]
pub fn assert_stdout_says(out: &Output, words: &str) {
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(words),
        "no {words:?} on stdout: {}",
        text(out)
    );
}

/// Asserts that `out` failed, and that its output holds `words`.
#[track_caller]
pub fn assert_failed_saying(out: &Output, words: &str) {
    assert!(!out.status.success(), "it succeeded: {}", text(out));
    assert_said(out, words);
}

/// Asserts that `out` failed, and that its standard error holds `words`.
#[track_caller]
pub fn assert_failed_stderr_says(out: &Output, words: &str) {
    assert!(!out.status.success(), "it succeeded: {}", text(out));
    assert_stderr_says(out, words);
}
