//! The README's first command: the demo runs end to end on an embedded default (a brain with
//! a temporary store, local workers, a recorded model) and ends with a verified result
//! delivered as a branch of a throw-away repository.

use std::process::Command;

#[test]
fn the_demo_ends_with_a_verified_fix_delivered_as_a_branch() {
    let out = Command::new(env!("CARGO_BIN_EXE_tether"))
        .arg("demo")
        .output()
        .expect("run tether demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the demo failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("result: verified by `sh test.sh`"),
        "{stdout}"
    );
    assert!(stdout.contains("delivered as tether/t-"), "{stdout}");
    assert!(
        stdout.contains("+    echo $(($1 + $2))"),
        "the delivered fix: {stdout}"
    );
    assert!(stdout.contains("Tether-Task: t-"), "{stdout}");
    assert!(stdout.contains("demo complete"), "{stdout}");
    // It ends with what to try next, in the README's words.
    let tail = &stdout[stdout.find("demo complete").unwrap()..];
    for next in [
        "cargo build --release --workspace",
        "brain token create",
        "A first agent task",
    ] {
        assert!(tail.contains(next), "{tail}");
    }
}

/// `tether demo | head -1`: the demo stops at once, quietly, with 141, and removes its
/// temporary directory on the way out.
#[test]
fn the_demo_into_a_closed_pipe_stops_quietly_and_leaves_no_temp_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .arg("demo")
        .env("TMPDIR", tmp.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run tether demo");
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("tether-demo-"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
