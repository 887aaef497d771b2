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

/// `brain init --model M` writes a config naming the default model, `brain config check`
/// accepts it and says whether the model could be asked; a file with a bad setting exits 78
/// (as `brain serve` would on it) and names the setting; a model that is no model is refused
/// before anything is made.
#[test]
fn init_writes_the_model_and_config_check_says_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let bins = testkit::Bins::locate();
    let data = dir.path().join("data");
    let refused = Command::new(&bins.brain)
        .arg("--data")
        .arg(&data)
        .args(["init", "--model", "nosuch:model"])
        .output()
        .unwrap();
    assert!(!refused.status.success(), "{refused:?}");
    assert!(!data.exists(), "a refused init made {}", data.display());
    let brain = |args: &[&str]| {
        Command::new(&bins.brain)
            .arg("--data")
            .arg(&data)
            .args(args)
            .env_remove("ANTHROPIC_API_KEY")
            .output()
            .expect("run brain")
    };
    let out = brain(&["init", "--model", "anthropic:claude-haiku-4-5"]);
    assert!(out.status.success(), "{out:?}");
    let config = std::fs::read_to_string(data.join("config.toml")).unwrap();
    assert!(
        config.contains("default_model = \"anthropic:claude-haiku-4-5\""),
        "{config}"
    );
    // No key here: init and check both say where it goes.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ANTHROPIC_API_KEY"),
        "{out:?}"
    );
    let out = brain(&["config", "check"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        said.contains("is valid") && said.contains("not ready"),
        "{said}"
    );
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[agent]\nmax_wall = \"soon\"\n").unwrap();
    let out = brain(&["config", "check", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("max_wall"),
        "{out:?}"
    );
    // A second init with a model does not overwrite the config it finds.
    let out = brain(&["init", "--force", "--model", "openai:gpt-4.1"]);
    assert!(!out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(data.join("config.toml")).unwrap(),
        config
    );
}
