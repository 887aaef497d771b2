//! Exit statuses of the three programs for errors running again will not fix: 78
//! (`EX_CONFIG`), which the systemd units in deploy/ do not restart on, whichever binary
//! (`brain`, `worker`, or `tether brain|worker`) hits them.

use std::process::Command;

fn tether() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tether"))
}

fn code(mut c: Command) -> (Option<i32>, String) {
    let out = c.output().expect("the program starts");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_worker_that_never_joined_exits_78_under_both_names() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let bins = testkit::Bins::locate();
    for mut c in [Command::new(&bins.worker), {
        let mut t = tether();
        t.arg("worker");
        t
    }] {
        c.args(["run", "--state"]).arg(&state);
        // A user's error is words, not a backtrace, even where backtraces are asked for.
        c.env("RUST_BACKTRACE", "1");
        let (status, err) = code(c);
        assert_eq!(status, Some(78), "{err}");
        assert!(err.contains("worker join"), "says what to do: {err}");
        assert!(!err.to_lowercase().contains("backtrace"), "{err}");
    }
}

#[test]
fn a_malformed_brain_url_for_join_exits_78() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = tether();
    c.args([
        "worker",
        "join",
        "--brain",
        "http://plain:1",
        "--token",
        "tj_x",
    ])
    .args(["--ca-hash", &format!("sha256:{}", "0".repeat(64))])
    .arg("--state")
    .arg(dir.path());
    let (status, err) = code(c);
    assert_eq!(status, Some(78), "{err}");
    assert!(err.contains("https"), "{err}");
}

#[test]
fn a_brain_without_a_ca_or_with_a_bad_config_exits_78() {
    let dir = tempfile::tempdir().unwrap();
    let bins = testkit::Bins::locate();
    let mut c = Command::new(&bins.brain);
    c.args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path());
    let (status, err) = code(c);
    assert_eq!(status, Some(78), "{err}");
    assert!(err.contains("brain init"), "{err}");

    let data = dir.path().join("d");
    let init = Command::new(&bins.brain)
        .arg("init")
        .arg("--data")
        .arg(&data)
        .output()
        .unwrap();
    assert!(init.status.success());
    std::fs::write(data.join("config.toml"), "[agent]\nno_such_key = 1\n").unwrap();
    let mut c = tether();
    c.args(["brain", "serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(&data);
    let (status, err) = code(c);
    assert_eq!(status, Some(78), "{err}");
    assert!(err.contains("config.toml"), "{err}");
}

/// `--version` answers on stdout with success under every name, and an unknown word is a
/// usage error (2), not a version.
#[test]
fn every_program_says_its_version() {
    let bins = testkit::Bins::locate();
    let version = env!("CARGO_PKG_VERSION");
    for (name, mut c) in [
        ("tether", tether()),
        ("brain", Command::new(&bins.brain)),
        ("worker", Command::new(&bins.worker)),
    ] {
        let out = c.arg("--version").output().expect("the program starts");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}: {out:?}");
        assert_eq!(said.trim(), format!("{name} {version}"), "{name}");
    }
    let (status, err) = code({
        let mut t = tether();
        t.arg("--verison");
        t
    });
    assert_eq!(status, Some(2), "{err}");
    assert!(err.contains("Usage:"), "{err}");
}
