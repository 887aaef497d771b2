//! The HTTP API end to end: a real brain (with `--web-listen`) and a real worker as
//! processes, a fake LLM on loopback, and plain HTTP requests. Who may do what (401, 403,
//! CSRF, origins, revoked and expired credentials), the event stream resuming exactly after
//! a cut and after a brain SIGKILL, the workspace endpoints, and that no secret is logged.

mod web_api;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::fake_llm::{FakeLlm, FakeReply};
use testkit::{BrainOptions, Cluster, assert_stderr_says, stdout, text};
use web_api::{bearer, call, client, get, get_response, open_stream, post, wait_status};

fn cluster(llm: &FakeLlm) -> Cluster {
    Cluster::start_with(BrainOptions::web_with_llm(llm, "sk-web-test"))
}

fn status_of(c: &Cluster, id: &str) -> String {
    c.task_status(id).unwrap_or_default()
}

/// The log as `brain task log --json` prints it: each record's sequence number and kind.
fn log_seqs(c: &Cluster, id: &str) -> Vec<(u64, String)> {
    c.task_log_json(id)
        .into_iter()
        .filter(|v| v.get("seq").is_some())
        .map(|v| {
            (
                testkit::json_u64(&v["seq"]).unwrap(),
                v["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// One Server-Sent Event.
#[derive(Debug, Clone)]
struct Sse {
    event: String,
    id: Option<u64>,
    data: Value,
}

/// Opens an event stream of `path` (after `last_id`, if given) and reads its events until
/// `stop` says so, the stream ends, or `timeout` passes; then cuts the connection.
async fn read_sse(
    c: &Cluster,
    (path, auth, last_id): (&str, &str, Option<u64>),
    mut stop: impl FnMut(&Sse) -> bool,
    timeout: Duration,
) -> Vec<Sse> {
    let mut resp = open_sse(c, path, auth, last_id).await;
    let mut buf = String::new();
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let mut e = Sse {
                event: "message".into(),
                id: None,
                data: Value::Null,
            };
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    e.event = v.trim().into();
                } else if let Some(v) = line.strip_prefix("id:") {
                    e.id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if data.is_empty() {
                continue; // a keep-alive comment
            }
            e.data = serde_json::from_str(&data).unwrap_or(Value::String(data));
            let done = stop(&e);
            out.push(e);
            if done {
                return out;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no end of the stream in time: {out:#?}");
        match tokio::time::timeout(left, resp.chunk()).await {
            Ok(Ok(Some(bytes))) => buf.push_str(&String::from_utf8_lossy(&bytes)),
            Ok(Ok(None)) | Ok(Err(_)) => return out,
            Err(_) => panic!("no end of the stream in time: {out:#?}"),
        }
    }
}

/// An event stream (after `last_id`, if given), open and answering as one.
async fn open_sse(c: &Cluster, path: &str, auth: &str, last_id: Option<u64>) -> reqwest::Response {
    let resp = open_stream(c, path, auth, last_id).await;
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    resp
}

/// The error message of a refusal.
fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_may_do_what_and_nothing_changes_when_refused() {
    let llm = FakeLlm::script(vec![
        FakeReply::run("echo ran > proof.txt"),
        FakeReply::finish("done"),
    ]);
    let c = cluster(&llm);
    let _w = c.join_worker("laptop");
    let viewer = c.web_token("watcher", "viewer", "1h");
    let operator = c.web_token("ci", "operator", "1h");
    let id = c
        .agent()
        .permission("ask")
        .worker("laptop")
        .start("approve me");
    wait_status(&c, &id, "waiting").await;
    let approve = format!("/api/tasks/{id}/approve");

    tokens_without_the_right_are_refused(&c, &id, &approve, &viewer, &operator).await;
    let (link, session, csrf) = a_session_without_its_csrf_is_refused(&c, &approve).await;
    // Nothing of that changed anything.
    assert_eq!(status_of(&c, &id), "waiting");
    assert_eq!(llm.count(), 1);
    let log = log_seqs(&c, &id);
    assert!(!log.iter().any(|(_, k)| k == "approval_decided"), "{log:?}");

    // The page's own request goes through, and the task goes on.
    let (s, body) = call(
        &c,
        "POST",
        &approve,
        &[
            ("cookie", &session),
            ("x-tether-csrf", &csrf),
            ("origin", &c.web_url()),
            ("sec-fetch-site", "same-origin"),
        ],
        None,
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert!(
        body["what"].as_str().unwrap().contains("echo ran"),
        "{body}"
    );
    wait_status(&c, &id, "finished").await;
    let log = stdout(&c.brain_cli(&["task", "log", &id, "--json"]));
    assert!(log.contains("\"by\":\"web:ann\""), "{log}");

    let short = credentials_that_ended_are_refused(&c, &viewer, &session, &csrf).await;

    // The list says what exists, never a secret.
    let list = stdout(&c.brain_cli(&["admin", "token", "list", "--all", "--json"]));
    assert!(
        list.contains("\"name\":\"ci\"") && list.contains("\"kind\":\"session\""),
        "{list}"
    );
    // No secret in any log, the list or the store's files.
    let secrets = [
        viewer.as_str(),
        operator.as_str(),
        short.as_str(),
        &session[session.find('=').unwrap() + 1..],
        &link[link.find("code=").unwrap() + 5..],
    ];
    for s in secrets {
        assert!(
            !c.brain_log().contains(s),
            "a credential is in the brain's log"
        );
        assert!(!list.contains(s));
    }
}

/// No credential, a wrong one, a viewer's approval and an operator's from another origin:
/// refused, each as what it is; a viewer still reads.
async fn tokens_without_the_right_are_refused(
    c: &Cluster,
    id: &str,
    approve: &str,
    viewer: &str,
    operator: &str,
) {
    let (s, body) = call(c, "GET", "/api/tasks", &[], None).await;
    assert_eq!(s, 401, "{body}");
    assert!(message(&body).contains("brain web login"));
    let (s, _) = get(c, "/api/tasks", "Bearer tw_nope").await;
    assert_eq!(s, 401);

    // A viewer reads, and may not approve.
    let (s, body) = get(c, "/api/tasks", &bearer(viewer)).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["tasks"][0]["id"], id);
    assert_eq!(body["tasks"][0]["status"], "waiting");
    let (s, body) = post(c, approve, &bearer(viewer)).await;
    assert_eq!(s, 403, "{body}");
    assert!(message(&body).contains("operator"));
    // An operator's change from another origin.
    let (s, body) = call(
        c,
        "POST",
        approve,
        &[
            ("authorization", &bearer(operator)),
            ("origin", "http://evil.test"),
        ],
        None,
    )
    .await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (403, Some("cross_origin"))
    );
}

/// A browser: the one-time link sets the session cookie, once; without the CSRF header,
/// with a wrong one, or cross-site, the session's approval is refused. The link, the
/// session cookie and the CSRF token.
async fn a_session_without_its_csrf_is_refused(
    c: &Cluster,
    approve: &str,
) -> (String, String, String) {
    let link = c.web_login("ann", "operator");
    assert!(link.starts_with(&c.web_url()), "{link}");
    let resp = client().get(&link).send().await.unwrap();
    assert_eq!(resp.status(), 303);
    let cookie_line = resp.headers()["set-cookie"].to_str().unwrap().to_string();
    for attr in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
        assert!(cookie_line.contains(attr), "{cookie_line}");
    }
    let session = cookie_line.split(';').next().unwrap().to_string();
    assert_eq!(
        client().get(&link).send().await.unwrap().status(),
        401,
        "a link works once"
    );
    let (s, me) = call(c, "GET", "/api/session", &[("cookie", &session)], None).await;
    assert_eq!(s, 200, "{me}");
    assert_eq!(
        (me["name"].as_str(), me["role"].as_str()),
        (Some("ann"), Some("operator"))
    );
    let csrf = me["csrf"].as_str().unwrap().to_string();
    assert!(!csrf.is_empty());
    for headers in [
        vec![("cookie", session.as_str())],
        vec![("cookie", session.as_str()), ("x-tether-csrf", "0000")],
        vec![
            ("cookie", session.as_str()),
            ("x-tether-csrf", csrf.as_str()),
            ("sec-fetch-site", "cross-site"),
        ],
    ] {
        let (s, body) = call(c, "POST", approve, &headers, None).await;
        assert_eq!(s, 403, "{headers:?}: {body}");
    }
    (link, session, csrf)
}

/// A revoked token, an expired one and a logged-out session are refused, saying why; the
/// short-lived token made for it.
async fn credentials_that_ended_are_refused(
    c: &Cluster,
    viewer: &str,
    session: &str,
    csrf: &str,
) -> String {
    let out = c.brain_cli(&["admin", "token", "revoke", "watcher"]);
    assert!(out.status.success(), "{}", text(&out));
    let (s, body) = get(c, "/api/tasks", &bearer(viewer)).await;
    assert_eq!(s, 401);
    assert!(message(&body).contains("revoked"));
    let short = c.web_token("short", "viewer", "1s");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (s, body) = get(c, "/api/tasks", &bearer(&short)).await;
        if s == 401 {
            assert!(message(&body).contains("expired"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "a 1 s token still works");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (s, _) = call(
        c,
        "POST",
        "/api/logout",
        &[("cookie", session), ("x-tether-csrf", csrf)],
        None,
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = call(c, "GET", "/api/session", &[("cookie", session)], None).await;
    assert_eq!(s, 401, "a logged-out session is over");
    short
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_exists_and_asks_for_its_role() {
    let llm = FakeLlm::start(|_| FakeReply::finish("done"));
    let mut c = cluster(&llm);
    let viewer = bearer(&c.web_token("v", "viewer", "1h"));
    let (s, doc) = call(&c, "GET", "/api/openapi.json", &[], None).await;
    assert_eq!(s, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 15, "{paths:?}");
    for (path, ops) in paths {
        for (method, op) in ops.as_object().unwrap() {
            let concrete = path.replace("{id}", "t-999");
            if path == "/api/events" {
                // A stream that does not end: its answer's status is the check.
                assert_eq!(get_response(&c, &concrete, &viewer).await.status(), 200);
                continue;
            }
            let (s, body) = call(
                &c,
                &method.to_uppercase(),
                &concrete,
                &[("authorization", &viewer)],
                (method == "post").then(|| json!({})),
            )
            .await;
            let fallback = body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("no such endpoint"));
            assert!(!fallback, "{method} {path} is documented but not routed");
            if op["x-tether-role"] == "operator" {
                assert_eq!(s, 403, "{method} {path}: a viewer got {s} {body}");
            } else {
                assert_ne!(s, 403, "{method} {path}: {body}");
                assert_ne!(s, 401, "{method} {path}: {body}");
            }
        }
    }
    let (s, body) = get(&c, "/api/nothing-here", &viewer).await;
    assert_eq!(s, 404);
    assert!(message(&body).contains("openapi.json"));
    // Bad input is refused in JSON, naming what is wrong.
    let op = bearer(&c.web_token("o", "operator", "1h"));
    let (s, body) = call(
        &c,
        "POST",
        "/api/tasks",
        &[("authorization", &op), ("content-type", "application/json")],
        Some(json!({"goal": 5})),
    )
    .await;
    assert_eq!(s, 422, "{body}");
    assert!(message(&body).contains("goal"), "{body}");
    let (s, body) = call(
        &c,
        "POST",
        "/api/tasks",
        &[("authorization", &op)],
        Some(json!({"goal": "  "})),
    )
    .await;
    assert_eq!(s, 400, "{body}");

    // Plain HTTP off loopback is refused as bad configuration.
    c.kill_brain();
    let out = c.brain_cli(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--web-listen",
        "0.0.0.0:0",
    ]);
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    assert_stderr_says(&out, "loopback only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_resumes_exactly_after_a_cut_and_a_brain_kill() {
    let llm = FakeLlm::script(vec![
        FakeReply::run("echo one > a.txt"),
        FakeReply::run("echo two >> a.txt; echo '<script>x()</script>'"),
        FakeReply::run("cat a.txt"),
        FakeReply::finish("done"),
    ]);
    let mut c = cluster(&llm);
    let _w = c.join_worker("laptop");
    let auth = bearer(&c.web_token("reader", "viewer", "1h"));
    let id = c
        .agent()
        .permission("ask")
        .worker("laptop")
        .start("write a");
    wait_status(&c, &id, "waiting").await;

    let seen = follow_across_cuts_and_a_brain_kill(&mut c, &id, &auth).await;
    // Exactly the log: no gap, no duplicate, across two cuts and a brain kill.
    let log: Vec<u64> = log_seqs(&c, &id).into_iter().map(|(s, _)| s).collect();
    assert_eq!(seen, log);
    assert_eq!(status_of(&c, &id), "finished");

    // `brain watch --since` resumes the same way over gRPC.
    let mid = log[log.len() / 2];
    let out = c.brain_cli(&["watch", &id, "--since", &mid.to_string(), "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let watched: Vec<u64> = stdout(&out)
        .lines()
        .filter_map(|l| testkit::json_u64(&serde_json::from_str::<Value>(l).ok()?["seq"]))
        .collect();
    assert_eq!(
        watched,
        log.iter().copied().filter(|s| *s > mid).collect::<Vec<_>>()
    );

    // History as NDJSON: the same records.
    let path = format!("/api/tasks/{id}/events");
    let resp = get_response(&c, &format!("{path}?follow=false"), &auth).await;
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let body = resp.text().await.unwrap();
    let lines: Vec<u64> = body
        .lines()
        .map(|l| testkit::json_u64(&serde_json::from_str::<Value>(l).unwrap()["seq"]).unwrap())
        .collect();
    assert_eq!(lines, log);
    assert!(
        body.contains("<script>x()</script>"),
        "the output is carried as it is, in JSON"
    );

    the_workspace_is_read_at_its_barriers(&c, &id, &auth).await;

    // The all-tasks stream starts with the list.
    let list = read_sse(
        &c,
        ("/api/events", &auth, None),
        |e| e.event == "tasks",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(list.last().unwrap().data["tasks"][0]["id"], id.as_str());
}

/// Follows task `id`'s event stream to its end (approving what is asked) across a cut, a
/// brain SIGKILL and another cut, resuming each time after the last id seen (by
/// `Last-Event-ID` and by `?since=`); the ids seen.
async fn follow_across_cuts_and_a_brain_kill(c: &mut Cluster, id: &str, auth: &str) -> Vec<u64> {
    let path = format!("/api/tasks/{id}/events");
    // Read what there is, then cut the connection.
    let first = read_sse(
        c,
        (&path, auth, None),
        |e| e.data["kind"] == "approval_requested",
        Duration::from_secs(20),
    )
    .await;
    let mut seen: Vec<u64> = first.iter().filter_map(|e| e.id).collect();
    assert!(seen.len() >= 3, "{first:#?}");
    for e in &first {
        assert_eq!(e.event, "record", "{e:?}");
        assert_eq!(
            e.id,
            testkit::json_u64(&e.data["seq"]),
            "the id is the sequence number"
        );
    }

    // The brain dies; while it is down the stream cannot be reopened; it comes back on the
    // same port and the stream resumes after the last id seen.
    c.kill_brain();
    c.start_brain().unwrap();
    let out = c.brain_cli(&["approve", id]);
    assert!(out.status.success(), "{}", text(&out));
    // Cut again in the middle of the second command's records.
    let second = read_sse(
        c,
        (&path, auth, seen.last().copied()),
        |e| e.data["kind"] == "tool_call_issued",
        Duration::from_secs(30),
    )
    .await;
    seen.extend(second.iter().filter_map(|e| e.id));
    // ?since=N resumes the same way; follow to the end, approving what is asked.
    let since = format!("{path}?since={}", seen.last().unwrap());
    let rest = read_sse(
        c,
        (&since, auth, None),
        |e| {
            if e.data["kind"] == "approval_requested" {
                let out = c.brain_cli(&["approve", id]);
                assert!(out.status.success(), "{}", text(&out));
            }
            e.event == "end"
        },
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(rest.last().unwrap().event, "end", "{rest:#?}");
    seen.extend(rest.iter().filter_map(|e| e.id));
    // Live output came on the same stream, marked as not durable, and as text.
    let live: Vec<&Sse> = rest
        .iter()
        .chain(&second)
        .filter(|e| e.event == "live")
        .collect();
    for e in &live {
        assert_eq!(e.data["durable"], false);
        assert!(e.id.is_none());
    }
    seen
}

/// The workspace of finished task `id` (which wrote `a.txt` in two steps): its tree, a
/// file and the diff at the last barrier and at the first one after `a.txt` was written;
/// a path out of it and a root the task never had are not found.
async fn the_workspace_is_read_at_its_barriers(c: &Cluster, id: &str, auth: &str) {
    let (s, tree) = get(c, &format!("/api/tasks/{id}/files"), auth).await;
    assert_eq!(s, 200, "{tree}");
    let entries: HashMap<String, Value> = tree["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap().to_string(), e.clone()))
        .collect();
    assert_eq!(entries["a.txt"]["kind"], "file");
    let content_path = format!("/api/tasks/{id}/files/content?path=a.txt");
    let (s, content) = get(c, &content_path, auth).await;
    assert_eq!((s, content.as_str()), (200, Some("one\ntwo\n")));
    let (s, _) = get(
        c,
        &format!("/api/tasks/{id}/files/content?path=../etc/passwd"),
        auth,
    )
    .await;
    assert_eq!(s, 404);
    let never = format!("/api/tasks/{id}/files?root={}", "ab".repeat(32));
    let (s, _) = get(c, &never, auth).await;
    assert_eq!(s, 404, "a root the task never had");
    let (s, diff) = get(c, &format!("/api/tasks/{id}/diff"), auth).await;
    assert_eq!(s, 200);
    assert!(diff.as_str().unwrap().contains("+two"), "{diff}");

    // The workspace at an earlier barrier: the first one after `a.txt` was written.
    let first_root = c
        .task_log_json(id)
        .into_iter()
        .find(|r| r["kind"] == "barrier" && testkit::json_u64(&r["files"]) > Some(0))
        .map(|r| r["root_hash"].as_str().unwrap().to_string())
        .expect("a barrier with a.txt");
    let (s, content) = get(c, &format!("{content_path}&root={first_root}"), auth).await;
    assert_eq!((s, content.as_str()), (200, Some("one\n")));
    let (s, early) = get(c, &format!("/api/tasks/{id}/diff?root={first_root}"), auth).await;
    assert_eq!(s, 200);
    let early = early.as_str().unwrap();
    assert!(early.contains("+one") && !early.contains("+two"), "{early}");
    let out = c.brain_cli(&["task", "diff", id, "--at", &first_root]);
    assert_eq!(stdout(&out).trim(), early.trim_end());
}
