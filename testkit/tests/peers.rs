//! Proves the delivery test peers are real and strict: the git server (`git http-backend`
//! behind HTTP Basic auth) takes clones, fetches and pushes from a stock git client and
//! refuses the ones without the right credentials; the fake GitHub answers in GitHub's
//! wire format and records every request that breaks the documented schema.

use std::path::Path;
use std::process::Output;

use testkit::git_server::{Auth, GitServer, git};

const USER: &str = "alice";
const PASSWORD: &str = "s3cret-pw";

/// `git -c credential.helper=… ARGS` in `dir`: the helper answers `user`/`password`; the
/// empty helper first drops any the machine configures.
fn git_with(dir: &Path, creds: Option<(&str, &str)>, args: &[&str]) -> Output {
    let mut cmd = git();
    cmd.current_dir(dir).arg("-c").arg("credential.helper=");
    if let Some((u, p)) = creds {
        cmd.arg("-c").arg(format!(
            "credential.helper=!f() {{ test \"$1\" = get && echo username={u} && echo password={p}; }}; f"
        ));
    }
    cmd.args(args).output().expect("run git")
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        testkit::text(&out)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tether-peers-")
        .tempdir()
        .expect("temp dir")
}

/// Commits `files` on a new branch `branch` in the clone `dir`; returns the commit's sha.
fn commit_on_branch(dir: &Path, branch: &str, files: &[(&str, &[u8])]) -> String {
    ok(
        git_with(dir, None, &["checkout", "-q", "-b", branch]),
        "checkout",
    );
    for (p, content) in files {
        std::fs::write(dir.join(p), content).expect("write file");
    }
    ok(git_with(dir, None, &["add", "--all"]), "add");
    ok(
        git_with(dir, None, &["commit", "-q", "-m", "work for t-1"]),
        "commit",
    );
    ok(git_with(dir, None, &["rev-parse", "HEAD"]), "rev-parse")
}

#[test]
fn a_clone_commit_and_push_with_a_credential_helper_lands_on_the_server() {
    let server = GitServer::start(USER, PASSWORD, Auth::All).unwrap();
    server
        .create_repo("acme/app", &[("README.md", "hello\n"), ("src/lib.rs", "")])
        .unwrap();
    let url = server.url("acme/app");
    assert!(!url.contains(USER) && !url.contains('@'), "{url}");
    let work = tmp();
    let clone = work.path().join("clone");
    ok(
        git_with(
            work.path(),
            Some((USER, PASSWORD)),
            &["clone", "-q", &url, "clone"],
        ),
        "clone",
    );
    assert_eq!(
        std::fs::read_to_string(clone.join("README.md")).unwrap(),
        "hello\n"
    );
    let sha = commit_on_branch(&clone, "tether/t-1", &[("NOTES.md", b"done\n")]);
    ok(
        git_with(
            &clone,
            Some((USER, PASSWORD)),
            &["push", "-q", "origin", "tether/t-1"],
        ),
        "push",
    );
    let branches = server.branches("acme/app");
    let names: Vec<&str> = branches.iter().map(|(b, _)| b.as_str()).collect();
    assert_eq!(names, ["main", "tether/t-1"], "{branches:?}");
    assert_eq!(branches[1].1, sha);
    assert_eq!(
        server
            .file_at("acme/app", "tether/t-1", "NOTES.md")
            .as_deref(),
        Some("done\n")
    );
    assert_eq!(
        server.commit_subjects("acme/app", "tether/t-1"),
        ["work for t-1", "initial commit"]
    );

    // A second clone fetches the pushed branch.
    let other = work.path().join("other");
    ok(
        git_with(
            work.path(),
            Some((USER, PASSWORD)),
            &["clone", "-q", &url, "other"],
        ),
        "second clone",
    );
    ok(
        git_with(
            &other,
            Some((USER, PASSWORD)),
            &["fetch", "-q", "origin", "tether/t-1"],
        ),
        "fetch",
    );
    assert_eq!(
        ok(
            git_with(&other, None, &["rev-parse", "FETCH_HEAD"]),
            "rev-parse"
        ),
        sha
    );

    let reqs = server.requests();
    // git asks without credentials first, is told 401, then asks its helper.
    assert_eq!(reqs[0].status, 401, "{reqs:#?}");
    assert_eq!(reqs[0].authorization, None);
    assert!(
        reqs.iter()
            .any(|r| r.is_push() && r.method == "POST" && r.status == 200 && r.authenticated),
        "{reqs:#?}"
    );
    for r in reqs.iter().filter(|r| r.status != 401) {
        assert!(r.authenticated, "answered without credentials: {r:?}");
        assert_eq!(r.user.as_deref(), Some(USER));
    }
    let auths = server.authorizations();
    assert!(!auths.is_empty());
    assert!(auths.iter().all(|a| a.starts_with("Basic ")), "{auths:?}");
}

#[test]
fn push_only_lets_anyone_clone_but_refuses_a_push_without_credentials() {
    let server = GitServer::start(USER, PASSWORD, Auth::PushOnly).unwrap();
    server.create_repo("app", &[("a.txt", "a\n")]).unwrap();
    let work = tmp();
    let clone = work.path().join("c");
    ok(
        git_with(work.path(), None, &["clone", "-q", &server.url("app"), "c"]),
        "anonymous clone",
    );
    assert!(
        server
            .requests()
            .iter()
            .all(|r| r.status == 200 && r.user.is_none())
    );
    commit_on_branch(&clone, "tether/t-2", &[("b.txt", b"b\n")]);
    let out = git_with(&clone, None, &["push", "origin", "tether/t-2"]);
    assert!(!out.status.success(), "{}", testkit::text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Authentication failed") || err.contains("could not read Username"),
        "{err}"
    );
    assert_eq!(
        server.branches("app").len(),
        1,
        "{:?}",
        server.branches("app")
    );
    let refused: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.is_push())
        .collect();
    assert!(
        !refused.is_empty() && refused.iter().all(|r| r.status == 401),
        "{refused:#?}"
    );

    // With credentials the same push goes through.
    ok(
        git_with(
            &clone,
            Some((USER, PASSWORD)),
            &["push", "-q", "origin", "tether/t-2"],
        ),
        "push",
    );
    assert!(
        server
            .branches("app")
            .iter()
            .any(|(b, _)| b == "tether/t-2")
    );
}

#[test]
fn a_wrong_password_is_refused() {
    let server = GitServer::start(USER, PASSWORD, Auth::All).unwrap();
    server.create_repo("app", &[("a.txt", "a\n")]).unwrap();
    let work = tmp();
    let out = git_with(
        work.path(),
        Some((USER, "wrong")),
        &["clone", &server.url("app"), "c"],
    );
    assert!(!out.status.success(), "{}", testkit::text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Authentication failed"),
        "{}",
        testkit::text(&out)
    );
    let reqs = server.requests();
    assert!(reqs.iter().all(|r| r.status == 401), "{reqs:#?}");
    assert!(
        reqs.iter()
            .any(|r| r.user.as_deref() == Some(USER) && !r.authenticated),
        "{reqs:#?}"
    );
    assert!(!work.path().join("c/a.txt").exists());
}

#[test]
fn a_large_push_goes_through_with_a_chunked_body() {
    let server = GitServer::start(USER, PASSWORD, Auth::PushOnly).unwrap();
    server.create_repo("big", &[("a.txt", "a\n")]).unwrap();
    let work = tmp();
    let clone = work.path().join("c");
    ok(
        git_with(work.path(), None, &["clone", "-q", &server.url("big"), "c"]),
        "clone",
    );
    // 4 MiB that do not compress: larger than git's 1 MiB http.postBuffer, so the pack goes
    // out chunked.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let blob: Vec<u8> = (0..4 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let sha = commit_on_branch(&clone, "big-change", &[("blob.bin", &blob)]);
    ok(
        git_with(
            &clone,
            Some((USER, PASSWORD)),
            &["push", "-q", "origin", "big-change"],
        ),
        "large push",
    );
    assert!(
        server
            .branches("big")
            .contains(&("big-change".to_string(), sha)),
        "{:?}",
        server.branches("big")
    );
    let reqs = server.requests();
    assert!(
        reqs.iter()
            .any(|r| r.chunked && r.is_push() && r.status == 200),
        "no chunked push in {reqs:#?}"
    );
}
