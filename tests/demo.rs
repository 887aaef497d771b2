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
    assert!(stdout.trim_end().ends_with("demo complete"), "{stdout}");
}
