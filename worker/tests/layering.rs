//! The layering rules of ARCHITECTURE.md, checked mechanically with `cargo tree`: the worker
//! never links sled or the brain, and `shared` stays free of brain-only dependencies.

use std::process::Command;

fn deps_of(package: &str) -> Vec<String> {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "-p",
            package,
        ])
        .args(["--manifest-path", manifest])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let names: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    assert!(names.len() > 10, "cargo tree printed too little:\n{text}");
    names
}

#[test]
fn worker_does_not_depend_on_sled_or_brain() {
    let names = deps_of("worker");
    assert!(
        names.iter().any(|n| n == "shared"),
        "sanity: worker uses shared"
    );
    for banned in ["sled", "brain"] {
        assert!(
            !names.iter().any(|n| n == banned),
            "worker depends on {banned}; move what it needs into `shared`"
        );
    }
}

#[test]
fn shared_does_not_depend_on_brain_only_crates() {
    let names = deps_of("shared");
    for banned in ["sled", "brain", "worker", "openssh"] {
        assert!(
            !names.iter().any(|n| n == banned),
            "shared depends on {banned}"
        );
    }
}
