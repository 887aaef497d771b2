//! Credentials a task's commands use but never read: the real brain and worker binaries, a
//! task whose commands run behind the worker's egress proxy, and HTTPS upstreams on loopback
//! (rustls, a CA of the test's own that the brain trusts through its config). The worker
//! needs root for the commands' network namespaces; where it has none the tests say so.

use std::sync::Arc;
use std::time::Duration;

use testkit::https::{Handler, Received, TestCa, Upstream};
use testkit::tasks::{
    egress_cluster, environs_holding, files_holding, have_netns, results, run_commands,
    set_api_secret, set_secret,
};
use testkit::{assert_stdout_says, text};

const SECRET: &str = "sk-live-7f3a9c2e51d84b06a1e2";
const API: &str = "api.upstream.test";
const OTHER: &str = "other.upstream.test";

/// 200 "granted" only with the secret as a bearer token; `/echo` answers the request back.
fn api_handler() -> Handler {
    Arc::new(|r: &Received| {
        if r.path.starts_with("/echo") {
            return (200, r.text().into_bytes());
        }
        if r.header("authorization") == Some(&format!("Bearer {SECRET}")) {
            (200, b"granted".to_vec())
        } else {
            (401, b"no".to_vec())
        }
    })
}

#[test]
fn a_command_uses_a_secret_it_never_sees() {
    if !have_netns() {
        return;
    }
    let ca = TestCa::new().unwrap();
    let api = Upstream::start(&ca, &[API], api_handler()).unwrap();
    let other = Upstream::answering(&ca, &[OTHER], "other says hi").unwrap();
    let c = egress_cluster(&ca, &[API, OTHER], "");
    let w = c.join_worker("egress");
    set_api_secret(&c, SECRET, API, api.port);
    let list = c.brain_cli(&["secret", "list", "--json"]);
    assert!(list.status.success(), "{}", text(&list));
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(
        listed.contains("\"api\"") && listed.contains(API),
        "{listed}"
    );
    assert!(!listed.contains(SECRET), "{listed}");

    let (pa, pb) = (api.port, other.port);
    let curl = "curl -sS --max-time 30 --fail-with-body";
    let commands = vec![
        // 0: the placeholder in the header, swapped for the value on the way out.
        format!(
            "printf 'env=%s\\n' \"$API_TOKEN\"; {curl} -H \"Authorization: Bearer $API_TOKEN\" https://{API}:{pa}/ok"
        ),
        // 1: no header at all: the brain adds the credential.
        format!("{curl} https://{API}:{pa}/ok"),
        // 2: the upstream echoes the request: the command sees the value masked.
        format!("{curl} -H \"Authorization: Bearer $API_TOKEN\" https://{API}:{pa}/echo"),
        // 3: the placeholder sent to a host it is not bound to (which is on the list).
        format!("{curl} -H \"Authorization: Bearer $API_TOKEN\" https://{OTHER}:{pb}/steal"),
        // 4: an unknown placeholder.
        format!(
            "{curl} -H \"Authorization: Bearer tether-secret:nosuch:00112233445566778899aabbccddeeff\" https://{API}:{pa}/ok"
        ),
        // 5: off the allow-list.
        format!("{curl} https://offlist.upstream.test:{pa}/"),
        // 6: a method the allow-list does not allow; 7: one it does.
        format!("{curl} -X POST -d x=1 https://{OTHER}:{pb}/post"),
        format!("{curl} https://{OTHER}:{pb}/get"),
        // 8: around the proxy: the command's network is only the proxy.
        format!("{curl} --noproxy '*' --connect-timeout 5 -k https://127.0.0.1:{pa}/ok"),
        // 9: what the command's own environment holds.
        "env | sort".to_string(),
    ];
    let allow = format!("{OTHER}:{pb} GET");
    let (task, ran) = run_commands(
        &c,
        &w.id,
        &["--secret", "api", "--allow", &allow],
        &commands,
    );
    assert_eq!(ran.len(), commands.len(), "{ran:#?}");
    let show = |i: usize| format!("command {i} ({}): {:#?}", ran[i].command, ran[i]);

    assert_eq!(ran[0].exit, Some(0), "{}", show(0));
    assert!(
        ran[0].stdout.contains("env=tether-secret:api:"),
        "{}",
        show(0)
    );
    assert!(ran[0].stdout.ends_with("granted"), "{}", show(0));
    assert_eq!(ran[1].exit, Some(0), "{}", show(1));
    assert_eq!(ran[1].stdout, "granted", "{}", show(1));
    assert_eq!(ran[2].exit, Some(0), "{}", show(2));
    assert!(
        ran[2]
            .stdout
            .to_ascii_lowercase()
            .contains("authorization: bearer ****"),
        "{}",
        show(2)
    );
    assert!(!ran[2].stdout.contains("tether-secret"), "{}", show(2));

    for (i, why) in [(3, "api"), (4, "nosuch"), (5, "allow-list"), (6, "POST")] {
        assert_ne!(ran[i].exit, Some(0), "{}", show(i));
        assert!(
            ran[i].stderr.contains("tether: egress refused")
                || ran[i].stdout.contains("tether egress refused"),
            "{}",
            show(i)
        );
        let told = format!("{}{}", ran[i].stdout, ran[i].stderr);
        assert!(told.contains(why), "{why}: {}", show(i));
    }
    assert_eq!(ran[7].exit, Some(0), "{}", show(7));
    assert_eq!(ran[7].stdout, "other says hi", "{}", show(7));
    assert_ne!(ran[8].exit, Some(0), "{}", show(8));
    assert!(
        ran[9].stdout.contains("HTTPS_PROXY=http://127.0.0.1:"),
        "{}",
        show(9)
    );
    assert!(ran[9].stdout.contains("SSL_CERT_FILE="), "{}", show(9));

    // The upstreams: the value reached the bound host and only it, and only over requests
    // that carried it rightly.
    let api_seen = api.seen();
    let granted = api_seen
        .iter()
        .filter(|r| r.header("authorization") == Some(&format!("Bearer {SECRET}")))
        .count();
    assert_eq!(granted, 3, "{api_seen:#?}");
    assert!(
        api_seen.iter().all(|r| !r.text().contains("tether-secret")),
        "{api_seen:#?}"
    );
    let other_seen = other.seen();
    assert!(
        other_seen.iter().all(|r| !r.text().contains(SECRET)),
        "{other_seen:#?}"
    );
    assert!(
        other_seen.iter().all(|r| r.path == "/get"),
        "only the allowed GET reaches the other host: {other_seen:#?}"
    );

    // The refusals are in the task's log, as events.
    let log = c.task_log_json(&task);
    let refused: Vec<&serde_json::Value> = log
        .iter()
        .filter(|r| r["kind"] == "egress_refused")
        .collect();
    assert!(refused.len() >= 4, "{refused:#?}");
    assert!(
        refused.iter().any(|r| r["host"] == "offlist.upstream.test"),
        "{refused:#?}"
    );
    let watch = c.brain_cli(&["task", "log", &task]);
    assert_stdout_says(&watch, "egress refused: offlist.upstream.test");

    // The value is nowhere on the worker, nor in any log.
    let secret = SECRET.as_bytes();
    assert_eq!(files_holding(&w.state, secret), Vec::<String>::new());
    assert_eq!(environs_holding(secret), Vec::<String>::new());
    assert!(!w.log_text().contains(SECRET));
    assert!(!c.brain_log().contains(SECRET));
    let log_text = serde_json::to_string(&log).unwrap();
    assert!(!log_text.contains(SECRET));
    // Not in the brain's store in clear either, nor in a backup of it.
    assert_eq!(files_holding(&c.data, secret), Vec::<String>::new());
    let backup = c.dir.join("backup.jsonl");
    let out = c.brain_cli(&["backup", &backup.display().to_string()]);
    assert!(out.status.success(), "backup: {}", text(&out));
    let dump = std::fs::read_to_string(&backup).unwrap();
    assert!(
        dump.contains("secrets"),
        "the backup holds the sealed secrets"
    );
    assert!(
        !dump.contains(SECRET),
        "a backup holds the value only sealed"
    );
}

#[test]
fn git_clones_and_pushes_over_https_with_an_injected_basic_credential() {
    use testkit::git_server::{Auth, GitServer};
    const HOST: &str = "git.upstream.test";
    if !have_netns() {
        return;
    }
    let ca = TestCa::new().unwrap();
    let git = GitServer::start("alice", SECRET, Auth::All).unwrap();
    git.create_repo("app", &[("README.md", "hello\n")]).unwrap();
    let backend: std::net::SocketAddr = git
        .base_url()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let port = testkit::https::tls_front(&ca, &[HOST], backend).unwrap();
    let c = egress_cluster(&ca, &[HOST], "");
    let w = c.join_worker("git-egress");
    let p = port.to_string();
    set_secret(
        &c,
        "gitpw",
        SECRET,
        &[
            "--host",
            HOST,
            "--port",
            &p,
            "--inject",
            "basic:alice",
            "--env",
            "GIT_PASSWORD",
        ],
    );
    let url = format!("https://{HOST}:{port}/app.git");
    let git_cmd = "git -c user.name=agent -c user.email=agent@example.test";
    let commands = vec![
        format!("{git_cmd} clone -q {url} app && cat app/README.md"),
        format!(
            "cd app && echo change > CHANGE.md && {git_cmd} add CHANGE.md && {git_cmd} commit -qm 'from the sandbox' && {git_cmd} push -q origin HEAD:refs/heads/agent 2>&1; echo pushed=$?"
        ),
    ];
    let (_, ran) = run_commands(&c, &w.id, &["--secret", "gitpw"], &commands);
    assert_eq!(ran[0].exit, Some(0), "{ran:#?}\n{:#?}", git.requests());
    assert_eq!(ran[0].stdout, "hello\n", "{ran:#?}");
    assert!(
        ran[1].stdout.contains("pushed=0"),
        "{ran:#?}\n{:#?}",
        git.requests()
    );
    assert_eq!(
        git.file_at("app", "agent", "CHANGE.md").as_deref(),
        Some("change\n")
    );
    let reqs = git.requests();
    assert!(
        reqs.iter().any(|r| r.is_push() && r.authenticated),
        "{reqs:#?}"
    );
    assert!(reqs.iter().all(|r| r.status != 401), "{reqs:#?}");
    assert_eq!(
        files_holding(&w.state, SECRET.as_bytes()),
        Vec::<String>::new()
    );
    assert!(!w.log_text().contains(SECRET));
}

#[test]
fn a_brain_killed_mid_request_fails_that_request_and_the_next_one_works() {
    if !have_netns() {
        return;
    }
    let ca = TestCa::new().unwrap();
    // `/slow` answers only once the test lets it (after the brain is gone).
    let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let held = gate.clone();
    let inner = api_handler();
    let api = Upstream::start(
        &ca,
        &[API],
        Arc::new(move |r: &Received| {
            if r.path == "/slow" {
                let (open, cv) = &*held;
                let mut g = shared::locks::Lock::locked(open);
                while !*g {
                    g = cv.wait(g).unwrap();
                }
                return (200, vec![b'x'; 1 << 20]);
            }
            inner(r)
        }),
    )
    .unwrap();
    let mut c = egress_cluster(&ca, &[API, OTHER], "");
    let w = c.join_worker("egress-kill");
    set_api_secret(&c, SECRET, API, api.port);
    let curl = "curl -sS --max-time 60 --fail-with-body";
    let commands = [
        format!(
            "{curl} -o /dev/null https://{API}:{}/slow; echo slow=$?",
            api.port
        ),
        format!("{curl} https://{API}:{}/ok", api.port),
    ];
    let task = testkit::tasks::start_commands(&c, &w.id, &["--secret", "api"], &commands);
    assert!(
        testkit::wait_until(Duration::from_secs(60), || api
            .seen()
            .iter()
            .any(|r| r.path == "/slow")),
        "the slow request never arrived: {}",
        c.brain_log()
    );
    c.kill_brain();
    {
        let (open, cv) = &*gate;
        *shared::locks::Lock::locked(open) = true;
        cv.notify_all();
    }
    c.start_brain().unwrap();
    let end = c.wait_status(
        &task,
        &["finished", "failed", "stuck"],
        Duration::from_secs(120),
    );
    assert_eq!(end, "finished", "{}", c.brain_log());
    let ran = results(&c, &task);
    assert_eq!(ran.len(), 2, "{ran:#?}");
    assert!(
        ran[0].stdout.contains("slow=") && !ran[0].stdout.contains("slow=0"),
        "the request cut by the brain's death fails: {ran:#?}"
    );
    assert_eq!(ran[1].stdout, "granted", "{ran:#?}");
    assert!(!w.log_text().contains(SECRET));
    assert_eq!(
        files_holding(&w.state, SECRET.as_bytes()),
        Vec::<String>::new()
    );
    assert!(!c.brain_log().contains(SECRET));
}
