//! `worker doctor` from the built binary: it names every confinement mechanism and the
//! workspace check, and exits 0 or 78. (This integration test also makes `cargo test
//! --workspace` build the `worker` binary, which the brain's integration tests run.)

use std::process::Command;

#[test]
fn doctor_names_every_mechanism_and_checks_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_worker"))
        .args(["doctor", "--state"])
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for m in [
        "landlock",
        "rlimits",
        "cgroup",
        "netns",
        "user",
        "mountns",
        "workspace",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(m)),
            "doctor does not mention {m}:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        matches!(out.status.code(), Some(0 | 78)),
        "{:?}\n{text}",
        out.status
    );
}
