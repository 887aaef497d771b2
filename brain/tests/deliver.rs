//! A result a user can take: a finished `--git` task delivered as a branch (and a pull
//! request) with credentials only the brain holds, exactly once even when the brain is
//! SIGKILLed mid-delivery; any task's work salvaged as a `-wip` branch; its diff, a patch
//! `git am` applies, and its files. The real brain and worker, a real git server (`git
//! http-backend` behind Basic auth) and a fake GitHub API that checks every request against
//! the documented create-pull-request operation.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::fake_github::{FakeGithub, Fault};
use testkit::fake_llm::{FakeLlm, FakeReply};
use testkit::git_server::{Auth, GitServer, git};
use testkit::https::TestCa;
use testkit::{BrainOptions, Cluster, assert_failed_saying, text};

/// The token the brain pushes with, and the one it opens pull requests with: neither may
/// appear anywhere but the brain's own environment and the servers' requests.
const PUSH_TOKEN: &str = "push-SECRET-7c1e5a9b3d";
const API_TOKEN: &str = "ghapi-SECRET-2f8d4b6a0e";
const KEY: &str = "sk-test-SECRET-4b7e1d9c2a";

/// The repository: a value that is wrong and the check that says so.
const FILES: &[(&str, &str)] = &[
    ("value.txt", "41\n"),
    ("check.sh", "test \"$(cat value.txt)\" = 42\n"),
    ("README.md", "The answer.\n"),
];
const CHECK: &str = "sh check.sh";

/// A model that fixes the value, looks at git, and finishes.
fn fixer() -> FakeLlm {
    FakeLlm::script(vec![
        FakeReply::write("value.txt", "42\n"),
        FakeReply::run("git status --porcelain; git diff --stat; cat .git/config; env"),
        FakeReply::finish("Fix the value\n\nIt was 41; the check wants 42."),
    ])
}

fn env() -> Vec<(String, String)> {
    vec![
        ("TETHER_GIT_TOKEN".into(), PUSH_TOKEN.into()),
        ("TETHER_GITHUB_TOKEN".into(), API_TOKEN.into()),
        // The brain's git trusts the git servers' TLS fronts.
        ("GIT_SSL_CAINFO".into(), git_ca().1.display().to_string()),
    ]
}

/// The CA of the git servers' TLS fronts, and the file the brain's git trusts it from.
fn git_ca() -> &'static (TestCa, std::path::PathBuf) {
    static CA: std::sync::OnceLock<(TestCa, std::path::PathBuf)> = std::sync::OnceLock::new();
    CA.get_or_init(|| {
        let ca = TestCa::new().unwrap();
        let file =
            std::env::temp_dir().join(format!("tether-deliver-ca-{}.pem", std::process::id()));
        std::fs::write(&file, ca.pem()).unwrap();
        (ca, file)
    })
}

/// A git server behind HTTPS: the brain gives its token only to an https remote.
fn git_server(auth: Auth) -> GitServer {
    let mut server = GitServer::start("bot", PUSH_TOKEN, auth).unwrap();
    server.serve_tls(&git_ca().0).unwrap();
    server
}

fn cluster(llm: &FakeLlm, mode: &str, github: &str, git: &GitServer) -> Cluster {
    cluster_with(llm, mode, github, git, None)
}

/// With `failpoint` set in the brain's environment. The tokens are for `git`'s host and
/// `github`'s; both are on loopback, which the config allows.
fn cluster_with(
    llm: &FakeLlm,
    mode: &str,
    github: &str,
    git: &GitServer,
    failpoint: Option<&str>,
) -> Cluster {
    Cluster::start_with(options_with(llm, mode, github, git, failpoint))
}

fn options_with(
    llm: &FakeLlm,
    mode: &str,
    github: &str,
    git: &GitServer,
    failpoint: Option<&str>,
) -> BrainOptions {
    let mut env = env();
    env.push(("GIT_SSL_CAINFO".into(), git_ca().1.display().to_string()));
    if let Some(f) = failpoint {
        env.push(("TETHER_FAILPOINT".into(), f.into()));
    }
    let api_host = github.split_once("://").map_or(github, |(_, a)| a);
    let deliver = format!(
        "[deliver]\nmode = \"{mode}\"\ngit_username = \"bot\"\n\
         git_token_env = \"TETHER_GIT_TOKEN\"\ngithub_token_env = \"TETHER_GITHUB_TOKEN\"\n\
         github_api = \"{github}\"\ngit_internal_hosts = true\n\
         hosts = [\"{}\", \"{api_host}\"]\n",
        git.authority()
    );
    BrainOptions {
        env,
        ..BrainOptions::with_llm(llm, KEY, &deliver)
    }
}

use testkit::stdout;

fn start(c: &Cluster, worker: &str, url: &str, extra: &[&str]) -> String {
    c.agent()
        .worker(worker)
        .args(&["--git", url])
        .check(CHECK)
        .args(extra)
        .start("make the check pass")
}

/// Waits until the task's delivery has ended (delivered or failed) and returns the task.
fn delivered(c: &Cluster, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if c.task_status(id).is_some() {
            let t = c.task_show(id);
            let d = t["delivery"].as_str().unwrap_or_default();
            if !d.is_empty() && !d.contains("in progress") && !d.contains("pending") {
                return t;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no delivery of {id} within 60 s:\n{}",
            c.brain_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run_git(dir: &Path, args: &[&str]) -> String {
    let out = git().arg("-C").arg(dir).args(args).output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", text(&out));
    stdout(&out)
}

/// Every file under `dir`, recursively, that holds `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t)
                    if t.is_file()
                        && std::fs::read(&p).is_ok_and(|b| {
                            b.windows(needle.len()).any(|w| w == needle.as_bytes())
                        }) =>
                {
                    found.push(p.display().to_string());
                }
                _ => {}
            }
        }
    }
    found
}

/// The environment of `pid` and of every process under it.
fn environments_under(pid: u32) -> Vec<(u32, String)> {
    let mut pids = vec![pid];
    let mut i = 0;
    while i < pids.len() {
        let parent = pids[i];
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            // pid (comm) state ppid ...: the comm may hold spaces, so split after the last ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|s| s.parse::<u32>().ok());
            if ppid == Some(parent) && !pids.contains(&p) {
                pids.push(p);
            }
        }
        i += 1;
    }
    pids.into_iter()
        .map(|p| {
            let env = std::fs::read(format!("/proc/{p}/environ")).unwrap_or_default();
            (p, String::from_utf8_lossy(&env).into_owned())
        })
        .collect()
}

#[test]
fn a_finished_task_is_delivered_as_a_branch_with_the_brains_credentials_only() {
    let server = git_server(Auth::All);
    server.create_repo("acme/app", FILES).unwrap();
    let main = server.branches("acme/app")[0].1.clone();
    let llm = fixer();
    let c = cluster(&llm, "branch", "http://127.0.0.1:9", &server);
    let w = c.join_worker("w");
    // A URL with a credential in it: used for the clone, kept nowhere.
    let with_token =
        server
            .url("acme/app")
            .replacen("https://", &format!("https://bot:{PUSH_TOKEN}@"), 1);
    let id = start(&c, &w.id, &with_token, &[]);
    let t = delivered(&c, &id);
    assert_eq!(t["status"], "finished", "{t}");
    assert_eq!(
        t["origin"].as_str().unwrap().split(" at ").next(),
        Some(server.url("acme/app").as_str()),
        "{t}"
    );
    assert_eq!(t["verification"], "verified", "{t}");
    let branch = format!("tether/{id}");
    assert!(t["delivery"].as_str().unwrap().starts_with(&branch), "{t}");

    // The branch holds the final barrier, on top of the imported commit.
    let branches = server.branches("acme/app");
    let pushed = branches
        .iter()
        .find(|(b, _)| *b == branch)
        .unwrap_or_else(|| panic!("no {branch} in {branches:?}"))
        .1
        .clone();
    assert_eq!(
        server.file_at("acme/app", &pushed, "value.txt").as_deref(),
        Some("42\n")
    );
    let bare = server.repo_path("acme/app");
    assert_eq!(
        run_git(&bare, &["rev-parse", &format!("{pushed}^")]).trim(),
        main
    );
    let message = run_git(&bare, &["log", "-1", "--format=%an <%ae>%n%B", &pushed]);
    assert!(
        message.starts_with("Tether <tether@localhost>\nFix the value\n"),
        "{message}"
    );
    assert!(
        message.contains("It was 41; the check wants 42."),
        "{message}"
    );
    assert!(message.contains(&format!("Tether-Task: {id}")), "{message}");
    assert!(
        message.contains("Verified: the acceptance check `sh check.sh` passed"),
        "{message}"
    );
    // Only value.txt changed: no .git/, nothing else.
    let changed = run_git(&bare, &["diff", "--name-only", &main, &pushed]);
    assert_eq!(changed.trim(), "value.txt");
    // The tree is what `brain task export` gives, file for file.
    let export = c.dir.join("export");
    let out = c.brain_cli(&["task", "export", &id, export.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let checkout = c.dir.join("checkout");
    run_git(
        &c.dir,
        &[
            "clone",
            "-q",
            "--branch",
            &branch,
            bare.to_str().unwrap(),
            checkout.to_str().unwrap(),
        ],
    );
    std::fs::remove_dir_all(checkout.join(".git")).unwrap();
    let diff = std::process::Command::new("diff")
        .arg("-r")
        .arg(&export)
        .arg(&checkout)
        .output()
        .unwrap();
    assert!(
        diff.status.success(),
        "export and branch differ: {}",
        text(&diff)
    );

    // The agent saw the repository's metadata: git status works, the config is the brain's
    // own, with no credential, and no token is in the command's environment.
    let seen = llm.requests()[2]
        .last_tool_result_text()
        .unwrap_or_default();
    assert!(
        seen.contains(" M value.txt"),
        "git status in the workspace: {seen}"
    );
    assert!(
        seen.contains(&format!("url = {}", server.url("acme/app"))),
        "{seen}"
    );
    assert!(
        !seen.contains("credential") && !seen.contains("bot@"),
        "{seen}"
    );

    // Pushed with the token (the server saw it in Basic auth), which is nowhere else.
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.is_push() && r.authenticated && r.user.as_deref() == Some("bot")),
        "{:?}",
        server.requests()
    );
    let log: String = c.task_log_json(&id).iter().map(|r| r.to_string()).collect();
    let tasks = stdout(&c.brain_cli(&["tasks", "--json"]));
    for (what, hay) in [
        ("the task log", log.as_str()),
        ("the brain's log", &c.brain_log()),
        ("the worker's log", &w.log_text()),
        ("brain tasks", &tasks),
        (
            "the model's requests",
            &format!(
                "{:?}",
                llm.requests()
                    .iter()
                    .map(|r| r.body.to_string())
                    .collect::<Vec<_>>()
            ),
        ),
    ] {
        assert!(!hay.contains(PUSH_TOKEN), "the push token is in {what}");
        assert!(!hay.contains(API_TOKEN), "the API token is in {what}");
    }
    assert_eq!(files_holding(&w.state, PUSH_TOKEN), Vec::<String>::new());
    let pid = w.proc.as_ref().unwrap().pid();
    for (p, e) in environments_under(pid) {
        assert!(
            !e.contains(PUSH_TOKEN),
            "the push token is in the environment of worker process {p}"
        );
    }

    // Delivering the same work again changes nothing.
    let out = c.brain_cli(&["task", "deliver", &id, "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let again: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again["commit"], pushed.as_str(), "{again}");
    assert_eq!(again["wip"], false);
    assert_eq!(server.branches("acme/app"), branches);
}

#[test]
fn a_pull_request_is_opened_once_though_the_brain_dies_after_the_push_and_after_opening_it() {
    let server = git_server(Auth::PushOnly);
    let bare = server.create_repo("acme/app", FILES).unwrap();
    let gh = FakeGithub::start(API_TOKEN);
    gh.link_repo("acme", "app", bare);
    // GitHub asks to wait once: the brain waits and goes on.
    gh.fail_next(Fault::RateLimited {
        retry_after_secs: 1,
    });
    let llm = fixer();
    let mut c = cluster_with(&llm, "none", &gh.url(), &server, Some("deliver-pushed"));
    let w = c.join_worker("w");
    let id = start(&c, &w.id, &server.url("acme/app"), &["--deliver", "pr"]);
    // The brain kills itself right after the push, before the log says so.
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.brain.as_mut().is_some_and(|b| b.is_running()) {
        assert!(
            Instant::now() < deadline,
            "the failpoint was never reached:\n{}",
            c.brain_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let branch = format!("tether/{id}");
    assert!(
        server
            .branches("acme/app")
            .iter()
            .any(|(b, _)| *b == branch)
    );
    assert!(gh.pulls().is_empty());
    // Again, dying right after GitHub opened the pull request.
    c.kill_brain();
    let mut brain_env = env();
    brain_env.push(("TETHER_FAILPOINT".into(), "deliver-pr-opened".into()));
    c.opts.env = brain_env;
    c.start_brain().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.brain.as_mut().is_some_and(|b| b.is_running()) {
        assert!(
            Instant::now() < deadline,
            "the second failpoint was never reached:\n{}",
            c.brain_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(gh.pulls().len(), 1);
    // A brain without failpoints finishes the delivery: one branch, one pull request. Its
    // first look finds no pull request (GitHub's list lags), so it meets GitHub's 422 for
    // the one that exists, and finds it.
    gh.fail_next(Fault::StaleList);
    c.kill_brain();
    c.opts.env = env();
    c.start_brain().unwrap();
    let t = delivered(&c, &id);
    assert_eq!(t["delivery_url"], gh.pulls()[0].html_url, "{t}");
    let pulls = gh.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    let p = &pulls[0];
    assert_eq!(
        (p.head_ref.as_str(), p.base.as_str()),
        (branch.as_str(), "main")
    );
    assert!(p.draft);
    assert_eq!(p.title, "Fix the value");
    let body = p.body.clone().unwrap_or_default();
    assert!(
        body.contains("Verified: the acceptance check `sh check.sh` passed"),
        "{body}"
    );
    assert!(
        body.contains("| steps | tokens | cost | model | ran on | moves |"),
        "{body}"
    );
    assert_eq!(
        server
            .branches("acme/app")
            .iter()
            .filter(|(b, _)| b.starts_with("tether/"))
            .count(),
        1
    );
    assert_eq!(gh.violations(), Vec::<String>::new());
    // The rate limit was met and waited out; the existing pull request was refused as such.
    assert!(
        gh.requests().iter().any(|r| r.status == 403),
        "{:?}",
        gh.requests()
    );
    assert!(
        gh.requests()
            .iter()
            .any(|r| r.method == "POST" && r.status == 422),
        "{:?}",
        gh.requests()
    );
    let log = c.task_log_json(&id);
    let kinds: Vec<&str> = log.iter().filter_map(|r| r["kind"].as_str()).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "pull_request_opened")
            .count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| **k == "delivered").count(),
        1,
        "{kinds:?}"
    );
}

#[test]
fn github_refusals_end_the_delivery_with_the_reason_and_no_token() {
    let server = git_server(Auth::PushOnly);
    server.create_repo("acme/app", FILES).unwrap();
    let gh = FakeGithub::start(API_TOKEN);
    gh.fail_next(Fault::Unauthorized);
    let llm = fixer();
    let c = cluster(&llm, "pr", &gh.url(), &server);
    let w = c.join_worker("w");
    // Followed to its end, `brain run` waits for the delivery and says how it went.
    let url = server.url("acme/app");
    let out = c
        .agent()
        .worker(&w.id)
        .check(CHECK)
        .args(&["--git", &url])
        .follow("make the check pass");
    let shown = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed delivery fails the run: {}",
        text(&out)
    );
    let id = shown.lines().next().unwrap().trim().to_string();
    assert!(
        shown.contains("delivery: failed:") && shown.contains("401"),
        "{shown}"
    );
    assert!(!shown.contains(API_TOKEN));
    let t = delivered(&c, &id);
    let d = t["delivery"].as_str().unwrap();
    assert!(d.starts_with("failed:") && d.contains("401"), "{t}");
    let log = stdout(&c.brain_cli(&["task", "log", &id]));
    assert!(log.contains(&format!("pushed   tether/{id} at")), "{log}");
    assert!(
        log.contains("delivery failed: opening a pull request"),
        "{log}"
    );
    assert!(!t.to_string().contains(API_TOKEN));
    // The branch was pushed; asking again opens the pull request.
    let out = c.brain_cli(&["task", "deliver", &id, "--pr"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains("pull request: "), "{}", text(&out));
    assert_eq!(gh.pulls().len(), 1);
    assert_eq!(gh.violations(), Vec::<String>::new());
}

#[test]
fn any_task_is_salvaged_as_a_wip_branch_and_its_patch_applies_with_git_am() {
    let server = git_server(Auth::PushOnly);
    server.create_repo("app", FILES).unwrap();
    // Changes the value, not to what the check wants, then runs out of steps (a change the
    // check passed on would be kept and finished for).
    let llm = FakeLlm::script(vec![
        FakeReply::write("value.txt", "43\n"),
        FakeReply::write("notes/todo.txt", "more\n"),
    ]);
    let c = cluster(&llm, "branch", "http://127.0.0.1:9", &server);
    let w = c.join_worker("w");
    let id = start(&c, &w.id, &server.url("app"), &["--max-steps", "2"]);
    c.wait_status(&id, &["budget_exhausted"], Duration::from_secs(60));
    // Not finished: nothing delivered by itself.
    assert_eq!(c.task_show(&id)["delivery"], "");
    let out = c.brain_cli(&["task", "deliver", &id]);
    assert!(out.status.success(), "{}", text(&out));
    let wip = format!("tether/{id}-wip");
    assert!(stdout(&out).contains(&wip), "{}", text(&out));
    assert_eq!(
        server.file_at("app", &wip, "value.txt").as_deref(),
        Some("43\n")
    );
    assert_eq!(
        server.file_at("app", &wip, "notes/todo.txt").as_deref(),
        Some("more\n")
    );
    let subjects = server.commit_subjects("app", &wip);
    assert!(
        subjects[0].starts_with("Work in progress (budget_exhausted)"),
        "{subjects:?}"
    );

    // The diff, its stat, and a patch that `git am` applies to a fresh clone.
    let out = c.brain_cli(&["task", "diff", &id, "--stat"]);
    assert!(out.status.success(), "{}", text(&out));
    let stat = stdout(&out);
    assert!(
        stat.contains("value.txt")
            && stat.contains("notes/todo.txt")
            && stat.contains("2 files changed"),
        "{stat}"
    );
    let out = c.brain_cli(&["task", "diff", &id]);
    let diff = stdout(&out);
    assert!(
        diff.contains("-41\n+43\n") && !diff.contains(".git/"),
        "{diff}"
    );
    let out = c.brain_cli(&["task", "patch", &id]);
    assert!(out.status.success(), "{}", text(&out));
    let patch = c.dir.join("t.patch");
    std::fs::write(&patch, &out.stdout).unwrap();
    let clone = c.dir.join("fresh");
    run_git(
        &c.dir,
        &[
            "clone",
            "-q",
            &format!("{}/app.git", server.plain_url()),
            clone.to_str().unwrap(),
        ],
    );
    run_git(&clone, &["am", "-q", patch.to_str().unwrap()]);
    let check = std::process::Command::new("sh")
        .arg("check.sh")
        .current_dir(&clone)
        .output()
        .unwrap();
    // The clone holds what the task left, on which the check fails as it did there.
    assert_eq!(
        std::fs::read_to_string(clone.join("value.txt")).unwrap(),
        "43\n"
    );
    assert!(
        !check.status.success(),
        "the check passes on the patched clone: {}",
        text(&check)
    );
    let subject = run_git(&clone, &["log", "-1", "--format=%s"]);
    assert!(subject.starts_with("Work in progress"), "{subject}");

    // A task that did not start from git: no branch, but a clear word and its diff.
    let out = c
        .agent()
        .worker(&w.id)
        .args(&["--deliver", "branch"])
        .try_start("x");
    assert_failed_saying(&out, "--git");
    // An export never writes over a directory that holds something.
    let full = c.dir.join("full");
    std::fs::create_dir_all(&full).unwrap();
    std::fs::write(full.join("mine"), "keep\n").unwrap();
    let out = c.brain_cli(&["task", "export", &id, full.to_str().unwrap()]);
    assert_failed_saying(&out, "not empty");
    assert_eq!(
        std::fs::read_to_string(full.join("mine")).unwrap(),
        "keep\n"
    );
}

#[test]
fn attempts_deliver_the_winners_result_and_with_no_winner_the_attempt_the_caller_names() {
    let server = git_server(Auth::PushOnly);
    server.create_repo("app", FILES).unwrap();
    // Attempts tell themselves apart by their seeds: the first seen writes a wrong value,
    // the second the right one (while the first has had its go); with `lost` in the goal
    // both write wrong values and run out of steps.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let s = seen.clone();
    let llm = FakeLlm::start(move |req| {
        let seed = req.body["seed"].as_u64().expect("attempts send a seed");
        let role = {
            let mut s = shared::locks::Lock::locked(&*s);
            if !s.contains(&seed) {
                s.push(seed);
            }
            s.iter().position(|x| *x == seed).unwrap()
        };
        let lost = req.body.to_string().contains("lost");
        match (role % 2, req.assistant_turns()) {
            (r, 0) => FakeReply::tool_call(
                "write_file",
                json!({"path": "value.txt", "content": match (r, lost) {
                    (1, false) => "42\n",
                    (0, _) => "40\n",
                    _ => "44\n",
                }}),
            )
            .delay(Duration::from_millis(if r == 1 { 300 } else { 0 })),
            (_, _) if lost => FakeReply::write("notes.txt", "still lost\n"),
            _ => FakeReply::finish("Set the value"),
        }
    });
    let c = cluster(&llm, "branch", "http://127.0.0.1:9", &server);
    let _workers: Vec<testkit::Worker> = (0..2).map(|i| c.join_worker(&format!("w{i}"))).collect();
    let url = server.url("app");
    let run = |goal: &str, extra: &[&str]| -> String {
        c.agent()
            .args(&["--attempts", "2", "--git", &url])
            .check(CHECK)
            .args(extra)
            .start(goal)
    };

    // `--deliver branch` on the parent delivers the winner's workspace under the parent's id.
    let id = run("make the check pass", &["--deliver", "branch"]);
    let t = delivered(&c, &id);
    assert_eq!(t["status"], "finished", "{t}");
    assert_eq!(t["verification"], "verified", "{t}");
    let branch = format!("tether/{id}");
    assert!(t["delivery"].as_str().unwrap().starts_with(&branch), "{t}");
    assert_eq!(
        server.file_at("app", &branch, "value.txt").as_deref(),
        Some("42\n"),
        "{}",
        c.brain_log()
    );
    // No attempt delivered itself: the parent's is the one result.
    for a in t["attempts"].as_array().unwrap() {
        let at = a["task"].as_str().unwrap();
        assert!(
            !server.branches("app").iter().any(|(b, _)| b.contains(at)),
            "{at} delivered itself"
        );
        assert_eq!(c.task_show(at)["delivery"], "", "{at}");
    }

    // No winner: the parent has no result of its own and says which to name instead.
    let id = run("make the check pass, lost", &["--max-steps", "2"]);
    c.wait_status(&id, &["failed"], Duration::from_secs(60));
    let t = c.task_show(&id);
    let attempts: Vec<String> = t["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["task"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(attempts.len(), 2, "{t}");
    // Ended without a winner: its result is unverified, not "pending" for ever.
    assert_eq!(t["verification"], "unverified", "{t}");
    for verb in [vec!["task", "deliver", &id], vec!["task", "diff", &id]] {
        let out = c.brain_cli(&verb);
        assert!(!out.status.success(), "{verb:?}: {}", text(&out));
        let said = text(&out);
        assert!(
            said.contains("no attempt has won") && said.contains(&attempts[1]),
            "{said}"
        );
    }
    // The caller salvages the attempt of their choice, as it stands, as a -wip branch.
    let pick = &attempts[1];
    let value = c.task_show(pick)["attempt_number"].as_u64().unwrap();
    let out = c.brain_cli(&["task", "deliver", pick]);
    assert!(out.status.success(), "{}", text(&out));
    let wip = format!("tether/{pick}-wip");
    assert!(stdout(&out).contains(&wip), "{}", text(&out));
    let got = server.file_at("app", &wip, "value.txt").unwrap();
    assert!(got == "40\n" || got == "44\n", "attempt {value}: {got}");
    assert_eq!(
        server.file_at("app", &wip, "notes.txt").as_deref(),
        Some("still lost\n")
    );
    let diff = stdout(&c.brain_cli(&["task", "diff", pick]));
    assert!(diff.contains(&format!("+{got}")), "{diff}");
}

/// Replicas on one PostgreSQL: a task imported through replica a, whose git objects are in a's
/// data dir only, is taken over by b when a dies, and b delivers it: it fetches the imported
/// commit again from the task's URL.
#[test]
fn a_task_imported_by_a_replica_that_died_is_delivered_by_the_replica_that_took_it_over() {
    let Some(pg) = testkit::postgres::start_or_skip() else {
        return;
    };
    let server = git_server(Auth::All);
    server.create_repo("acme/app", FILES).unwrap();
    let main = server.branches("acme/app")[0].1.clone();
    let llm = fixer();
    let replica = |name: &str| {
        let mut o = options_with(&llm, "branch", "http://127.0.0.1:9", &server, None);
        let r = pg.replica(name);
        o.extra_args.extend(r.extra_args);
        o.env.extend(r.env);
        o.config = o.config.map(|c| c + testkit::postgres::REPLICA_CONFIG);
        Cluster::start_with(o)
    };
    let mut a = replica("a");
    let b = replica("b");
    let (token, ca_hash) = a.token(&[]);
    let mut join = a.join_cmd("w", &token, &ca_hash);
    join.arg("--brain").arg(b.url());
    let w = a.spawn_worker("w", join);
    let id = a
        .agent()
        .worker(&w.id)
        .args(&["--git", &server.url("acme/app")])
        .check(CHECK)
        .permission("ask")
        .start("make the check pass");
    // Imported on a; its first call waits there for approval. Then a dies.
    a.wait_status(&id, &["waiting"], Duration::from_secs(60));
    a.kill_brain();
    // b takes the task over (its worker moves there), and every call is approved there.
    assert!(
        testkit::wait_until(Duration::from_secs(120), || {
            let status = b.task_status(&id);
            if status.as_deref() == Some("waiting") {
                b.brain_cli(&["approve", &id]);
            }
            status.as_deref() == Some("finished")
        }),
        "the task did not finish on b: {:?}\n{}",
        b.task_status(&id),
        b.brain_log()
    );
    let t = delivered(&b, &id);
    let branch = format!("tether/{id}");
    assert!(
        t["delivery"]
            .as_str()
            .unwrap_or_default()
            .starts_with(&branch),
        "{t}\n{}",
        b.brain_log()
    );
    assert_eq!(
        server.file_at("acme/app", &branch, "value.txt").as_deref(),
        Some("42\n")
    );
    // On top of the commit a imported.
    let parent = git()
        .args(["rev-parse", &format!("{branch}~1")])
        .current_dir(server.repo_path("acme/app"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&parent.stdout).trim(), main);
}
