//! Proves the delivery test peers are real and strict: the git server (`git http-backend`
//! behind HTTP Basic auth) takes clones, fetches and pushes from a stock git client and
//! refuses the ones without the right credentials; the fake GitHub answers in GitHub's
//! wire format and records every request that breaks the documented schema.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};
use testkit::fake_github::{FakeGithub, Fault};
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

/// Alice's credentials, as her credential helper answers them.
const ALICE: Option<(&str, &str)> = Some((USER, PASSWORD));

/// [`git_with`], which must succeed: its output.
fn git_ok(dir: &Path, creds: Option<(&str, &str)>, args: &[&str]) -> String {
    let out = git_with(dir, creds, args);
    assert!(
        out.status.success(),
        "git {args:?} failed: {}",
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
    git_ok(dir, None, &["checkout", "-q", "-b", branch]);
    for (p, content) in files {
        std::fs::write(dir.join(p), content).expect("write file");
    }
    git_ok(dir, None, &["add", "--all"]);
    git_ok(dir, None, &["commit", "-q", "-m", "work for t-1"]);
    git_ok(dir, None, &["rev-parse", "HEAD"])
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
    git_ok(work.path(), ALICE, &["clone", "-q", &url, "clone"]);
    assert_eq!(
        std::fs::read_to_string(clone.join("README.md")).unwrap(),
        "hello\n"
    );
    let sha = commit_on_branch(&clone, "tether/t-1", &[("NOTES.md", b"done\n")]);
    git_ok(&clone, ALICE, &["push", "-q", "origin", "tether/t-1"]);
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
    git_ok(work.path(), ALICE, &["clone", "-q", &url, "other"]);
    git_ok(&other, ALICE, &["fetch", "-q", "origin", "tether/t-1"]);
    assert_eq!(git_ok(&other, None, &["rev-parse", "FETCH_HEAD"]), sha);

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
    git_ok(work.path(), None, &["clone", "-q", &server.url("app"), "c"]);
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
    git_ok(&clone, ALICE, &["push", "-q", "origin", "tether/t-2"]);
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
    git_ok(work.path(), None, &["clone", "-q", &server.url("big"), "c"]);
    // 4 MiB that do not compress: larger than git's 1 MiB http.postBuffer, so the pack goes
    // out chunked.
    let blob = testkit::random::noise(4 << 20);
    let sha = commit_on_branch(&clone, "big-change", &[("blob.bin", &blob)]);
    git_ok(&clone, ALICE, &["push", "-q", "origin", "big-change"]);
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

// ---- the fake GitHub --------------------------------------------------------------------

const TOKEN: &str = "ghp_test_token";

/// A response read by [`http`].
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request over a fresh connection (the fake closes it after answering).
fn http(
    base: &str,
    method: &str,
    target: &str,
    headers: &[(&str, impl AsRef<str>)],
    body: &str,
) -> Response {
    let addr = base.strip_prefix("http://").expect("an http:// base");
    let mut conn = TcpStream::connect(addr).expect("connect to the fake GitHub");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {}\r\n", v.as_ref()));
    }
    req.push_str("\r\n");
    req.push_str(body);
    conn.write_all(req.as_bytes()).expect("send the request");
    let mut raw = Vec::new();
    conn.take(16 << 20)
        .read_to_end(&mut raw)
        .expect("read the response");
    let text = String::from_utf8(raw).expect("a UTF-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("a bad status line: {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let resp = Response {
        status,
        headers,
        body: serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}")),
    };
    assert_eq!(
        resp.header("content-length"),
        Some(body.len().to_string().as_str())
    );
    resp
}

/// The headers a well-behaved GitHub client sends.
fn good_headers(token: &str) -> Vec<(&'static str, String)> {
    vec![
        ("Authorization", format!("Bearer {token}")),
        ("User-Agent", "tether-test".into()),
        ("Accept", "application/vnd.github+json".into()),
        ("X-GitHub-Api-Version", "2022-11-28".into()),
        ("Content-Type", "application/json".into()),
    ]
}

fn call(gh: &FakeGithub, method: &str, target: &str, body: Option<Value>) -> Response {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    http(&gh.url(), method, target, &good_headers(TOKEN), &body)
}

fn create(gh: &FakeGithub, body: Value) -> Response {
    call(gh, "POST", "/repos/acme/app/pulls", Some(body))
}

/// The numbers of the pull requests a list answered.
fn numbers(list: &Value) -> Vec<&Value> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|p| &p["number"])
        .collect()
}

fn pr_body(head: &str) -> Value {
    json!({"title": "Tether: t-1", "head": head, "base": "main", "body": "what changed", "draft": false})
}

#[test]
fn a_valid_pull_request_is_created_and_found_by_its_head() {
    let gh = FakeGithub::start(TOKEN);
    let r = create(&gh, pr_body("tether/t-1"));
    assert_eq!(r.status, 201, "{}", r.body);
    let b = &r.body;
    assert_eq!(b["number"], 1);
    assert_eq!(b["state"], "open");
    assert_eq!(b["title"], "Tether: t-1");
    assert_eq!(b["body"], "what changed");
    assert_eq!(b["draft"], false);
    assert_eq!(b["head"]["ref"], "tether/t-1");
    assert_eq!(b["head"]["label"], "acme:tether/t-1");
    assert_eq!(b["base"]["ref"], "main");
    assert_eq!(b["user"]["login"], testkit::fake_github::LOGIN);
    let html = format!("{}/acme/app/pull/1", gh.url());
    assert_eq!(b["html_url"], html.as_str());
    assert_eq!(
        b["url"],
        format!("{}/repos/acme/app/pulls/1", gh.url()).as_str()
    );
    assert!(b["id"].is_u64() && b["created_at"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert_eq!(r.header("location"), b["url"].as_str());
    assert!(r.header("x-ratelimit-remaining").is_some());

    let pulls = gh.pulls();
    assert_eq!(pulls.len(), 1);
    assert_eq!(
        (
            pulls[0].number,
            pulls[0].head_label.as_str(),
            pulls[0].html_url.as_str()
        ),
        (1, "acme:tether/t-1", html.as_str())
    );
    let req = &gh.requests()[0];
    assert_eq!(req.header("User-Agent"), Some("tether-test"));
    assert_eq!(req.body["head"], "tether/t-1");

    // A second one, then the list filters by head (`user:ref-name`, encoded or not) and base.
    assert_eq!(create(&gh, pr_body("tether/t-2")).body["number"], 2);
    for q in [
        "head=acme:tether/t-1&base=main&state=open",
        "head=acme%3Atether%2Ft-1",
        "head=ACME:tether/t-1",
    ] {
        let l = call(&gh, "GET", &format!("/repos/acme/app/pulls?{q}"), None);
        assert_eq!(l.status, 200);
        assert_eq!(numbers(&l.body), [&json!(1)], "{q}: {}", l.body);
    }
    let none = call(&gh, "GET", "/repos/acme/app/pulls?head=acme:nope", None);
    assert_eq!(none.body, json!([]));
    let other_base = call(
        &gh,
        "GET",
        "/repos/acme/app/pulls?head=acme:tether/t-1&base=dev",
        None,
    );
    assert_eq!(other_base.body, json!([]));
    let all = call(&gh, "GET", "/repos/acme/app/pulls", None);
    assert_eq!(numbers(&all.body), [&json!(2), &json!(1)], "newest first");
    assert!(gh.violations().is_empty(), "{:?}", gh.violations());

    // `token X` is accepted as well as `Bearer X`.
    let h = [
        ("Authorization", "token ghp_test_token"),
        ("User-Agent", "t"),
    ];
    assert_eq!(
        http(&gh.url(), "GET", "/repos/acme/app/pulls", &h, "").status,
        200
    );
}

#[test]
fn a_duplicate_is_refused_with_githubs_message_until_the_first_is_closed() {
    let gh = FakeGithub::start(TOKEN);
    assert_eq!(create(&gh, pr_body("tether/t-1")).status, 201);
    let dup = create(&gh, pr_body("acme:tether/t-1"));
    assert_eq!(dup.status, 422, "{}", dup.body);
    assert_eq!(dup.body["message"], "Validation Failed");
    assert_eq!(dup.body["status"], "422");
    assert_eq!(
        dup.body["errors"],
        json!([{"resource": "PullRequest", "code": "custom",
                "message": "A pull request already exists for acme:tether/t-1."}])
    );
    assert!(dup.body["documentation_url"].is_string());
    assert_eq!(gh.pulls().len(), 1);
    assert!(gh.violations().is_empty(), "{:?}", gh.violations());

    assert!(gh.close_pull(1));
    let again = create(&gh, pr_body("tether/t-1"));
    assert_eq!((again.status, &again.body["number"]), (201, &json!(2)));
    let closed = call(&gh, "GET", "/repos/acme/app/pulls?state=closed", None);
    assert_eq!(closed.body.as_array().map(Vec::len), Some(1));
    assert_eq!(closed.body[0]["number"], 1);
    let all = call(&gh, "GET", "/repos/acme/app/pulls?state=all", None);
    assert_eq!(all.body.as_array().map(Vec::len), Some(2));
}

#[test]
fn bodies_that_break_the_schema_are_recorded_and_refused() {
    let gh = FakeGithub::start(TOKEN);
    let cases = [
        (
            json!({"title": "t", "head": "b", "base": "main", "labels": ["x"]}),
            "\"labels\"",
        ),
        (json!({"title": "t", "base": "main"}), "head"),
        (
            json!({"head": "b", "base": "main", "body": "no title"}),
            "title",
        ),
        (
            json!({"title": "t", "head": "b", "base": "main", "draft": "yes"}),
            "draft",
        ),
        (
            json!({"title": "t", "head": "b", "base": "main", "issue": "7"}),
            "issue",
        ),
        (json!({"title": null, "head": "b", "base": "main"}), "title"),
    ];
    for (i, (body, word)) in cases.iter().enumerate() {
        let r = create(&gh, body.clone());
        assert_eq!(r.status, 422, "{body}: {}", r.body);
        let v = gh.violations();
        assert_eq!(v.len(), i + 1, "one violation per bad body: {v:#?}");
        assert!(
            v[i].contains(word) && v[i].starts_with("POST /repos/acme/app/pulls: "),
            "{v:#?}"
        );
    }
    let missing = create(&gh, json!({"title": "t"}));
    assert_eq!(
        missing.body["message"],
        "Invalid request.\n\n\"head\", \"base\" weren't supplied."
    );
    let untitled = create(&gh, json!({"head": "b", "base": "main"}));
    assert_eq!(
        untitled.body["errors"][0],
        json!({"resource": "PullRequest", "code": "missing_field", "field": "title"})
    );
    assert!(gh.pulls().is_empty(), "{:?}", gh.pulls());

    // Not JSON at all.
    let h = good_headers(TOKEN);
    let r = http(&gh.url(), "POST", "/repos/acme/app/pulls", &h, "{not json");
    assert_eq!(
        (r.status, &r.body["message"]),
        (400, &json!("Problems parsing JSON"))
    );

    // An issue stands in for the title.
    let from_issue = create(&gh, json!({"issue": 5, "head": "b", "base": "main"}));
    assert_eq!(from_issue.status, 201, "{}", from_issue.body);

    // A head filter without `user:` is ignored by GitHub: a violation here.
    let before = gh.violations().len();
    let l = call(&gh, "GET", "/repos/acme/app/pulls?head=b", None);
    assert_eq!(l.status, 200);
    let v = gh.violations();
    assert_eq!(v.len(), before + 1);
    assert!(v[before].contains("user:ref-name"), "{v:#?}");
}

#[test]
fn a_wrong_or_missing_token_is_401_and_a_missing_user_agent_403() {
    let gh = FakeGithub::start(TOKEN);
    let wrong = good_headers("ghp_wrong");
    let body = pr_body("tether/t-1").to_string();
    let r = http(&gh.url(), "POST", "/repos/acme/app/pulls", &wrong, &body);
    assert_eq!(
        (r.status, &r.body["message"]),
        (401, &json!("Bad credentials"))
    );
    let anon = [("User-Agent", "tether-test")];
    let r = http(&gh.url(), "POST", "/repos/acme/app/pulls", &anon, &body);
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(gh.violations().is_empty(), "{:?}", gh.violations());

    let no_agent = [("Authorization", "Bearer ghp_test_token")];
    let r = http(&gh.url(), "POST", "/repos/acme/app/pulls", &no_agent, &body);
    assert_eq!(r.status, 403, "{}", r.body);
    let v = gh.violations();
    assert!(v.len() == 1 && v[0].contains("User-Agent"), "{v:#?}");
    assert!(gh.pulls().is_empty());
    let statuses: Vec<u16> = gh.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [401, 401, 403]);
}

#[test]
fn queued_faults_answer_the_next_requests_in_order() {
    let gh = FakeGithub::start(TOKEN);
    gh.fail_next(Fault::RateLimited {
        retry_after_secs: 7,
    });
    gh.fail_next(Fault::ServerError);
    gh.fail_next(Fault::Unauthorized);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let r = create(&gh, pr_body("tether/t-1"));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(
        r.body["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("API rate limit exceeded for ")),
        "{}",
        r.body
    );
    assert_eq!(r.header("retry-after"), Some("7"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
    assert!(
        (now + 7..now + 10).contains(&reset),
        "reset {reset}, now {now}"
    );
    assert_eq!(create(&gh, pr_body("tether/t-1")).status, 500);
    let r = create(&gh, pr_body("tether/t-1"));
    assert_eq!(
        (r.status, &r.body["message"]),
        (401, &json!("Bad credentials"))
    );
    assert!(gh.pulls().is_empty());
    let r = create(&gh, pr_body("tether/t-1"));
    assert_eq!(r.status, 201, "the queue is empty again: {}", r.body);
}

#[test]
fn a_linked_repository_decides_which_heads_exist_and_their_sha() {
    let server = GitServer::start(USER, PASSWORD, Auth::PushOnly).unwrap();
    server.create_repo("acme/app", &[("a.txt", "a\n")]).unwrap();
    let gh = FakeGithub::start(TOKEN);
    gh.link_repo("acme", "app", server.repo_path("acme/app"));

    let early = create(&gh, pr_body("tether/t-1"));
    assert_eq!(early.status, 422, "no such branch yet: {}", early.body);
    assert_eq!(
        early.body["errors"][0],
        json!({"resource": "PullRequest", "field": "head", "code": "invalid"})
    );
    let same = create(&gh, pr_body("main"));
    assert_eq!(
        same.body["errors"][0]["message"],
        "No commits between main and main"
    );

    let work = tmp();
    let url = server.url("acme/app");
    git_ok(work.path(), None, &["clone", "-q", &url, "c"]);
    let clone = work.path().join("c");
    let sha = commit_on_branch(&clone, "tether/t-1", &[("b.txt", b"b\n")]);
    git_ok(&clone, ALICE, &["push", "-q", "origin", "tether/t-1"]);
    let r = create(&gh, pr_body("tether/t-1"));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["head"]["sha"], sha.as_str());
    assert_eq!(gh.pulls()[0].head_sha.as_deref(), Some(sha.as_str()));
    assert!(gh.violations().is_empty(), "{:?}", gh.violations());
}
