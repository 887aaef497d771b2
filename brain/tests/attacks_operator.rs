//! The threat model's operator line, tried as an attacker would: an operator (an admin
//! identity, or a web token with the operator role) may start, steer and deliver tasks, but
//! may never get files on a worker's host that the task's own commands could not read, nor
//! reach a repository on an internal address, nor hand a person code that runs when they
//! look at an export. Real brain and worker processes on loopback.

use std::time::Duration;

use testkit::fake_llm::{FakeLlm, FakeReply};
use testkit::{BrainOptions, Cluster, assert_failed_saying, stdout, text};

fn root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Route: `brain run --dir` read the worker's host with the worker's rights (root), not its
/// commands'. On a root worker a command of the task cannot read `/etc/shadow`; an import of
/// `/etc` put it in the mirror, readable through `task export`. Now a worker imports only
/// below the roots its owner names (`--import-root`), never through a symlink out of them,
/// and with none it imports nothing.
#[test]
fn an_import_reads_only_below_the_roots_the_workers_owner_allows() {
    if !root() {
        testkit::skip(
            "user",
            "a worker's commands run as a user of their own only on a root worker",
        );
        return;
    }
    let llm = FakeLlm::script(vec![FakeReply::finish("read it")]);
    let c = Cluster::start_with(BrainOptions::with_llm(&llm, "sk-operator-test", ""));
    let project = c.dir.join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("README"), "a project\n").unwrap();
    std::os::unix::fs::symlink("/etc", project.join("etc")).unwrap();
    let roots = project.display().to_string();
    let w = c.join_worker_with("laptop", &[("TETHER_WORKER_IMPORT_ROOTS", &roots)]);

    // What the task's own commands get.
    let cat = c.brain_cli(&[
        "exec",
        &w.id,
        "--workspace",
        "probe",
        "--",
        "cat",
        "/etc/shadow",
    ]);
    assert!(
        !cat.status.success() && text(&cat).contains("Permission denied"),
        "a command read /etc/shadow: {}",
        text(&cat)
    );

    // An operator asks for more, directly or through a symlink below the root.
    for dir in [
        "/etc".to_string(),
        project.join("etc").display().to_string(),
    ] {
        let out = c
            .agent()
            .worker("laptop")
            .args(&["--dir", &dir])
            .try_start("copy it");
        assert_failed_saying(&out, "not below this worker's import roots");
        assert!(!text(&out).contains("root:"), "{}", text(&out));
    }
    // Whether a path outside the roots exists is not told either.
    let out = c
        .agent()
        .worker("laptop")
        .args(&["--dir", "/root/.no-such-dir"])
        .try_start("probe");
    assert_failed_saying(&out, "not below this worker's import roots");
    // No task was made for any of them: nothing to export.
    let tasks = c.brain_cli(&["tasks", "--json"]);
    assert!(tasks.status.success(), "{}", text(&tasks));
    assert!(
        !stdout(&tasks).contains("copy it"),
        "a refused import made a task: {}",
        stdout(&tasks)
    );

    // What the owner allowed is imported.
    let id = c
        .agent()
        .worker("laptop")
        .args(&["--dir", &roots])
        .start("read the project");
    c.wait_status(&id, &["finished"], Duration::from_secs(30));
    let export = c.dir.join("export");
    let out = c.brain_cli(&["task", "export", &id, export.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(export.join("README")).unwrap(),
        "a project\n"
    );

    // A worker with no import root imports nothing, and says how to allow it.
    let _bare = c.join_worker("bare");
    let out = c
        .agent()
        .worker("bare")
        .args(&["--dir", &roots])
        .try_start("copy it");
    assert_failed_saying(&out, "this worker allows no imports");
    let doctor = std::process::Command::new(&c.bins.worker)
        .args(["doctor", "--state"])
        .arg(c.dir.join("doctor"))
        .env("TETHER_WORKER_IMPORT_ROOTS", &roots)
        .output()
        .unwrap();
    assert!(
        stdout(&doctor).contains(&format!("imports: only below {roots}")),
        "{}",
        text(&doctor)
    );
}

/// Route: a redirect walked around the check of a `--git` URL's address. The brain checks the
/// host it is given (no internal address, unless allowed) and pins it, but git followed the
/// server's first redirect wherever it led: a public `--git` URL answering 301 with a loopback
/// `git http-backend` cloned that private repository into the task. Now the brain's git
/// follows no redirect (clone, fetch and push alike), and the task is refused saying so: the
/// operator names the repository's final URL, which is checked as any other. Here both
/// servers are on loopback, so the brain allows internal hosts; what is tried is that the
/// second one, named by nobody but the first, is never reached.
#[test]
fn the_brains_git_follows_no_redirect() {
    use testkit::git_server::{Auth, GitServer};
    use testkit::http::{Options, Response, Server};
    use testkit::tasks::try_start_commands;
    let private = GitServer::start("x", "unused", Auth::PushOnly).unwrap();
    private
        .create_repo("private", &[("PRIVATE.md", "internal only\n")])
        .unwrap();
    let target = private.url("private");
    let redirector = Server::start(Options::plain("redirector"), move |req| {
        let rest = req.target.split_once(".git").map_or("", |(_, r)| r);
        Response::new(301, "").header("Location", format!("{target}{rest}"))
    })
    .unwrap();
    let c = Cluster::start_with(BrainOptions {
        config: Some(
            "[deliver]\ngit_schemes = [\"https\", \"http\"]\ngit_internal_hosts = true\n".into(),
        ),
        ..Default::default()
    });
    let w = c.join_worker("git-redirect");
    let url = format!("http://{}/public.git", redirector.addr());
    let out = try_start_commands(
        &c,
        &w.id,
        &["--git", &url],
        &["cat PRIVATE.md".into()],
        None,
    );
    let mut seen = text(&out);
    if out.status.success() {
        let task = stdout(&out).trim().to_string();
        c.wait_status(
            &task,
            &["finished", "failed", "stuck", "cancelled"],
            Duration::from_secs(60),
        );
        seen.push_str(&stdout(&c.brain_cli(&["task", "log", &task, "--json"])));
    }
    assert!(
        !seen.contains("internal only"),
        "the redirect's target was cloned: {seen}"
    );
    assert_eq!(
        private.requests().len(),
        0,
        "the brain's git followed the redirect to {}",
        private.url("private")
    );
    assert!(seen.contains("redirect"), "not told why: {seen}");
}
