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

/// Route: an export carried git directories that run code as the person who looks at it.
/// A task made `sub/.git/config` with `core.fsmonitor` set to a command (and a bare
/// repository, and a `.GIT` spelled for a case-insensitive disk): `task export` wrote them,
/// `task diff` never showed them, and `git status` in the export ran the command as the
/// operator. Now what git would take for a repository is left out of the export (and of the
/// diff and the commit, which already could not hold it), the export says what it left out,
/// and everything exported is in the diff.
#[test]
fn an_export_holds_no_git_directory_and_shows_all_it_writes_in_the_diff() {
    use testkit::tasks::start_commands;
    let c = Cluster::start();
    let w = c.join_worker("exporter");
    let pwned = c.dir.join("pwned");
    let hook = format!("touch {}", pwned.display());
    let make = format!(
        "mkdir -p sub/.git/objects sub/.git/refs bare.git/objects bare.git/refs up/.GIT && \
         printf 'ref: refs/heads/main\\n' > sub/.git/HEAD && \
         printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = \"{hook}\"\\n' > sub/.git/config && \
         cp sub/.git/HEAD bare.git/HEAD && touch bare.git/objects/.keep bare.git/refs/.keep && \
         printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n\\tworktree = ..\\n\\tfsmonitor = \"{hook}\"\\n' > bare.git/config && \
         cp sub/.git/config up/.GIT/config && \
         echo visible > sub/file.txt"
    );
    // With --include-git the workspace's git directories are mirrored, nested ones too.
    let id = start_commands(&c, &w.id, &["--include-git"], &[make]);
    c.wait_status(&id, &["finished"], Duration::from_secs(60));

    let export = c.dir.join("export");
    let out = c.brain_cli(&["task", "export", &id, export.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(export.join("sub/file.txt")).unwrap(),
        "visible\n"
    );
    // Looking at the export with git runs nothing.
    for dir in [
        export.join("sub"),
        export.join("bare.git"),
        export.join("up"),
    ] {
        let _ = testkit::git_server::git()
            .args(["status"])
            .current_dir(&dir)
            .output();
    }
    assert!(
        !pwned.exists(),
        "git status in the export ran the task's command"
    );

    for gone in ["sub/.git", "bare.git/config", "bare.git/HEAD", "up/.GIT"] {
        assert!(
            !export.join(gone).exists(),
            "the export holds {gone}: {}",
            text(&out)
        );
    }
    assert!(
        ["left out sub/.git", "left out bare.git", "left out up/.GIT"]
            .iter()
            .all(|w| text(&out).contains(w)),
        "the export does not say what it left out: {}",
        text(&out)
    );
    // Every file exported is in the diff.
    let diff = c.brain_cli(&["task", "diff", &id]);
    assert!(diff.status.success(), "{}", text(&diff));
    let diff = stdout(&diff);
    let mut exported = Vec::new();
    let mut stack = vec![export.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                exported.push(p.strip_prefix(&export).unwrap().display().to_string());
            }
        }
    }
    assert!(!exported.is_empty());
    for f in &exported {
        assert!(
            diff.contains(&format!("b/{f}")),
            "{f} is exported but not in the diff:\n{diff}"
        );
    }
}
