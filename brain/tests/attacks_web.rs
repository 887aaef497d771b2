//! Attacks on the web API (route 8 of the threat model), each against a real brain
//! (`--web-listen`) and, where a task is needed, a real worker. The threat model: a viewer
//! reads tasks, events and diffs, never changes anything, and keeps no stream past its
//! credential; nobody outside the brain's configured proxies can speak for another origin.

mod web_api;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use testkit::{peak_rss, reset_peak};

use serde_json::{Value, json};
use testkit::fake_llm::{FakeLlm, FakeReply};
use testkit::tasks::{results, run_commands, set_secret, start_commands};
use testkit::{BrainOptions, Cluster, stdout, text};
use web_api::{bearer, call, client, get, get_response, open_stream, post, wait_status};

fn cluster_with(llm: Option<&FakeLlm>, web: &str) -> Cluster {
    let mut config = String::new();
    if let Some(llm) = llm {
        config.push_str(&format!(
            "[llm.providers.openai]\nbase_url = \"{}\"\napi_key = \"sk-web-attack\"\n",
            llm.url()
        ));
    }
    if !web.is_empty() {
        config.push_str("[web]\n");
        config.push_str(web);
        config.push('\n');
    }
    Cluster::start_with(BrainOptions {
        config: (!config.is_empty()).then_some(config),
        web: true,
        ..Default::default()
    })
}

/// A viewer's event stream of `path`, open, once it has said `first`.
async fn open_viewing(c: &Cluster, path: &str, auth: &str, first: &str) -> reqwest::Response {
    let mut s = open_stream(c, path, auth, None).await;
    assert_eq!(s.status(), 200);
    read_until(&mut s, first, Duration::from_secs(20)).await;
    s
}

/// A join token asked for (`POST /api/join-tokens`, 10 minutes) with `headers`.
async fn make_join_token(c: &Cluster, headers: &[(&str, &str)]) -> (u16, Value) {
    call(
        c,
        "POST",
        "/api/join-tokens",
        headers,
        Some(json!({"ttl_seconds": 600})),
    )
    .await
}

/// What a stream said until `until`: its text, and whether it ended by then.
async fn read_stream(resp: &mut reqwest::Response, until: Instant) -> (String, bool) {
    let mut seen = String::new();
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (seen, false);
        }
        match tokio::time::timeout(left, resp.chunk()).await {
            Ok(Ok(Some(bytes))) => seen.push_str(&String::from_utf8_lossy(&bytes)),
            Ok(Ok(None)) | Ok(Err(_)) => return (seen, true),
            Err(_) => return (seen, false),
        }
    }
}

/// Reads a stream until its text holds `needle` (or panics after `within`).
async fn read_until(resp: &mut reqwest::Response, needle: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    let mut seen = String::new();
    while !seen.contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no {needle:?} in time: {seen}");
        match tokio::time::timeout(left, resp.chunk()).await {
            Ok(Ok(Some(bytes))) => seen.push_str(&String::from_utf8_lossy(&bytes)),
            other => panic!("the stream ended before {needle:?} ({other:?}): {seen}"),
        }
    }
    seen
}

/// A task that runs one command once approved, waiting for that approval.
async fn waiting_task(c: &Cluster) -> String {
    let id = c
        .agent()
        .permission("ask")
        .worker("laptop")
        .start("wait for approval");
    wait_status(c, &id, "waiting").await;
    id
}

fn approve_then_finish() -> FakeLlm {
    FakeLlm::script(vec![
        FakeReply::run("echo approved-and-ran"),
        FakeReply::finish("done"),
    ])
}

/// Route 8, streams: a viewer whose token is revoked keeps no stream. Both event streams end
/// within two seconds of the revocation, and what happens after it (an approval, the command
/// it lets run) reaches neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_viewer_keeps_no_stream() {
    let llm = approve_then_finish();
    let c = cluster_with(Some(&llm), "");
    let _w = c.join_worker("laptop");
    let viewer = c.web_token("watcher", "viewer", "1h");
    let operator = c.web_token("ci", "operator", "1h");
    let id = waiting_task(&c).await;

    let task_events = format!("/api/tasks/{id}/events");
    let mut task_stream =
        open_viewing(&c, &task_events, &bearer(&viewer), "approval_requested").await;
    let mut all_stream = open_viewing(&c, "/api/events", &bearer(&viewer), "event: tasks").await;

    let out = c.brain_cli(&["admin", "token", "revoke", "watcher"]);
    assert!(out.status.success(), "{}", text(&out));
    let revoked = Instant::now();
    // Something worth seeing happens right after.
    let (s, body) = post(&c, &format!("/api/tasks/{id}/approve"), &bearer(&operator)).await;
    assert_eq!(s, 200, "{body}");
    wait_status(&c, &id, "finished").await;

    let until = revoked + Duration::from_secs(2);
    let (after_task, task_ended) = read_stream(&mut task_stream, until).await;
    let (after_all, all_ended) = read_stream(&mut all_stream, until).await;
    assert!(
        !after_task.contains("approval_decided") && !after_task.contains("approved-and-ran"),
        "a revoked viewer still received the task's events: {after_task}"
    );
    assert!(
        !after_all.contains("\"finished\"") && !after_all.contains("event: task\n"),
        "a revoked viewer still received task changes: {after_all}"
    );
    assert!(
        task_ended && all_ended,
        "streams still open 2 s after the revocation (task stream ended: {task_ended}, all-tasks stream ended: {all_ended})"
    );
    // It says why before it ends.
    assert!(after_task.contains("revoked"), "{after_task}");
    // And cannot come back.
    let again = open_stream(&c, "/api/events", &bearer(&viewer), None).await;
    assert_eq!(again.status(), 401);
}

/// Route 8, streams: a viewer's stream ends when its credential expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_viewer_keeps_no_stream() {
    let c = cluster_with(None, "");
    let viewer = c.web_token("brief", "viewer", "3s");
    let created = Instant::now();
    let mut s = open_viewing(&c, "/api/events", &bearer(&viewer), "event: tasks").await;
    let (said, ended) = read_stream(&mut s, created + Duration::from_secs(6)).await;
    assert!(
        ended,
        "the stream of a 3 s token is still open 6 s after it was made: {said}"
    );
    assert!(said.contains("expired"), "{said}");
}

/// Route 8, streams: one credential holds at most eight streams (the default); the ninth is
/// refused with 429 and says why, another credential is not affected, and a stream closed
/// makes room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_credential_holds_at_most_eight_streams() {
    let c = cluster_with(None, "");
    let greedy = c.web_token("greedy", "viewer", "1h");
    let other = c.web_token("other", "viewer", "1h");
    let mut open = Vec::new();
    for i in 0..8 {
        let mut s = open_stream(&c, "/api/events", &bearer(&greedy), None).await;
        assert_eq!(s.status(), 200, "stream {i}");
        read_until(&mut s, "event: tasks", Duration::from_secs(10)).await;
        open.push(s);
    }
    let ninth = open_stream(&c, "/api/events", &bearer(&greedy), None).await;
    let status = ninth.status().as_u16();
    let body = if status == 200 {
        String::new()
    } else {
        ninth.text().await.unwrap()
    };
    assert_eq!(status, 429, "a ninth stream of one credential: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "too_many_streams", "{body}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains('8'),
        "{body}"
    );
    // The task stream counts too.
    let (s, _) = get(&c, "/api/tasks/nope/events", &bearer(&greedy)).await;
    assert_eq!(s, 429);
    let mut theirs = open_stream(&c, "/api/events", &bearer(&other), None).await;
    assert_eq!(theirs.status(), 200, "another credential is not affected");
    read_until(&mut theirs, "event: tasks", Duration::from_secs(10)).await;

    // One closed: room for one more (once the brain has seen it go).
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = open_stream(&c, "/api/events", &bearer(&greedy), None).await;
        if s.status() == 200 {
            break;
        }
        assert_eq!(s.status(), 429);
        assert!(Instant::now() < deadline, "a closed stream never made room");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Route 8, diffs: the diff a viewer asks for is cut at `[web] max_diff_bytes`, with a last
/// line and a header that say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diff_is_cut_at_its_cap_and_says_so() {
    let c = cluster_with(None, "max_diff_bytes = 65536");
    let w = c.join_worker("laptop");
    // About 1.3 MB of new lines.
    let (id, ran) = run_commands(&c, &w.id, &[], &["seq 1 200000 > big.txt".to_string()]);
    assert_eq!(ran[0].exit, Some(0), "{ran:?}");
    let viewer = c.web_token("reader", "viewer", "1h");
    let resp = get_response(&c, &format!("/api/tasks/{id}/diff"), &bearer(&viewer)).await;
    assert_eq!(resp.status(), 200);
    let limit = resp
        .headers()
        .get("x-tether-diff-limit")
        .map(|v| v.to_str().unwrap().to_string());
    let body = resp.text().await.unwrap();
    assert!(
        body.len() <= 65536 + 300,
        "a diff of {} bytes was answered whole, over the 65536-byte cap",
        body.len()
    );
    assert_eq!(limit.as_deref(), Some("65536"));
    let last = body.lines().last().unwrap_or_default();
    assert!(
        last.contains("cut at 65536 bytes") && last.contains("brain task diff"),
        "the last line says the diff was cut: {last:?}"
    );
    assert!(
        body.starts_with("diff --git"),
        "{}",
        &body[..200.min(body.len())]
    );
    // A short one is whole.
    let (s, stat) = get(
        &c,
        &format!("/api/tasks/{id}/diff?form=stat"),
        &bearer(&viewer),
    )
    .await;
    assert_eq!(s, 200);
    let stat = stat.as_str().unwrap();
    assert!(
        stat.contains("big.txt") && !stat.contains("cut at"),
        "{stat}"
    );
}

/// Route 8, diffs (memory): the cap used to be checked after git's whole output was read, so
/// each viewer's request held all of it: +244 MiB for one, +903 MiB for six at once. Now the
/// diff streams from git as the viewer reads it, stops at the cap, and few are made at once:
/// six viewers asking together for the diff of 50 MiB of changes cost the brain a bounded
/// few MiB each, and each gets its cut diff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_viewers_of_a_large_diff_cost_the_brain_little_memory() {
    let c = cluster_with(None, "");
    let w = c.join_worker("laptop");
    // 48 files of about 1 MiB of new lines each: git's diff of them is over 50 MiB.
    let make = "for i in $(seq 1 48); do seq $((i*1000000)) $((i*1000000+140000)) > f$i.txt; done";
    let (id, ran) = run_commands(&c, &w.id, &[], &[make.to_string()]);
    assert_eq!(ran[0].exit, Some(0), "{ran:?}");
    let viewer = c.web_token("reader", "viewer", "1h");
    let pid = c.brain.as_ref().unwrap().pid();
    // One diff first, so that what every diff costs once (git's first run, the page cache of
    // the mirror) is not counted below.
    let first = get_response(&c, &format!("/api/tasks/{id}/diff"), &bearer(&viewer)).await;
    assert_eq!(first.status(), 200);
    let _ = first.text().await.unwrap();
    reset_peak(pid);
    let before = peak_rss(pid);
    let asks = (0..6).map(|_| {
        let c = &c;
        let (id, viewer) = (&id, &viewer);
        async move {
            let resp = get_response(c, &format!("/api/tasks/{id}/diff"), &bearer(viewer)).await;
            let status = resp.status();
            // A body that could not be read says why in place of the diff.
            let body = resp
                .text()
                .await
                .unwrap_or_else(|e| format!("(the body could not be read: {e})"));
            (status, body)
        }
    });
    let answers = futures_util::future::join_all(asks).await;
    let grew = peak_rss(pid).saturating_sub(before);
    eprintln!(
        "six viewers' diffs: the brain's peak memory grew by {} MiB",
        grew >> 20
    );
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{}", &body[..body.len().min(300)]);
        assert!(
            body.len() <= (8 << 20) + 300 && body.lines().last().unwrap_or("").contains("cut at"),
            "a diff of {} bytes, not cut at the 8 MiB cap: …{}",
            body.len(),
            body.get(body.len().saturating_sub(200)..)
                .unwrap_or_default()
        );
    }
    assert!(
        grew < 100 << 20,
        "six viewers' diffs took the brain's memory up by {} MiB",
        grew >> 20
    );
}

/// Whether the server closed `conn` by `until` (EOF or a reset); bytes it sent are kept.
fn closed_by(conn: &mut TcpStream, until: Instant, got: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        conn.set_read_timeout(Some(left.min(Duration::from_millis(200))))
            .unwrap();
        match conn.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
}

fn web_addr(c: &Cluster) -> String {
    c.web_url().trim_start_matches("http://").to_string()
}

/// Route 8, connections: a connection that never finishes its headers (silent, or sending a
/// header line now and then: slowloris) is closed once `[web] header_read_timeout` (5 s by
/// default) has passed, and an honest request still works meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_finishes_its_headers_is_closed() {
    let c = cluster_with(None, "");
    let addr = web_addr(&c);
    // An answer that takes longer than the timeout (an event stream) is not cut by it.
    let viewer = c.web_token("reader", "viewer", "1h");
    let mut stream = open_viewing(&c, "/api/events", &bearer(&viewer), "event: tasks").await;
    let stream_opened = Instant::now();
    let opened = Instant::now();
    let mut silent = TcpStream::connect(&addr).unwrap();
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.write_all(b"GET /api/openapi.json HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let until = opened + Duration::from_secs(9);
    let mut slow_closed = false;
    let mut got = Vec::new();
    // A header line every half second, for longer than the timeout.
    while Instant::now() < until {
        if slow.write_all(b"X-Slow: 1\r\n").is_err() {
            slow_closed = true;
            break;
        }
        if closed_by(
            &mut slow,
            Instant::now() + Duration::from_millis(500),
            &mut got,
        ) {
            slow_closed = true;
            break;
        }
    }
    let slow_after = opened.elapsed();
    let mut nothing = Vec::new();
    let silent_closed = closed_by(&mut silent, until, &mut nothing);
    assert!(
        slow_closed,
        "a connection trickling header lines is still open after {slow_after:?}"
    );
    assert!(
        silent_closed,
        "a connection that sent nothing is still open after {:?}",
        opened.elapsed()
    );
    assert!(
        slow_after >= Duration::from_secs(4),
        "closed too early ({slow_after:?}): the timeout is 5 s"
    );
    let (s, _) = call(&c, "GET", "/api/openapi.json", &[], None).await;
    assert_eq!(s, 200);
    // Open well past the 5 s timeout.
    let (_, ended) = read_stream(&mut stream, stream_opened + Duration::from_secs(7)).await;
    assert!(
        !ended,
        "an event stream open for {:?} was cut",
        stream_opened.elapsed()
    );
}

/// Route 8, connections: past `[web] max_connections`, a connection is answered 503 with
/// words and closed; when the others go, it is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_refused() {
    let c = cluster_with(None, "max_connections = 4");
    let addr = web_addr(&c);
    let held: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    // Give the brain time to take them (a condition: the fifth is answered at all).
    let mut fifth = TcpStream::connect(&addr).unwrap();
    fifth
        .write_all(b"GET /api/openapi.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let closed = closed_by(
        &mut fifth,
        Instant::now() + Duration::from_secs(3),
        &mut got,
    );
    let answer = String::from_utf8_lossy(&got).to_string();
    assert!(
        answer.starts_with("HTTP/1.1 503"),
        "a fifth connection past a limit of 4: {answer:.300}"
    );
    assert!(answer.contains("max_connections"), "{answer}");
    assert!(closed, "the refused connection is closed");
    drop(held);
    // Until the brain has seen the held connections close, a new one may still be refused
    // (answered 503 before its request is read, which the client reports as an error).
    let deadline = Instant::now() + Duration::from_secs(5);
    let url = format!("{}/api/openapi.json", c.web_url());
    loop {
        let s = match client().get(&url).send().await {
            Ok(r) => r.status().as_u16().to_string(),
            Err(e) => e.to_string(),
        };
        if s == "200" {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Route 8, proxies: `X-Forwarded-Host` from a peer that is not a configured proxy cannot
/// make another origin look like the brain's own: an operator's change from evil.test is
/// refused and nothing is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_host_from_an_untrusted_peer_is_ignored() {
    let c = cluster_with(None, "");
    let operator = c.web_token("ci", "operator", "1h");
    let (s, body) = make_join_token(
        &c,
        &[
            ("authorization", &bearer(&operator)),
            ("origin", "http://evil.test"),
            ("x-forwarded-host", "evil.test"),
            ("x-forwarded-proto", "http"),
            ("x-forwarded-for", "127.0.0.1"),
        ],
    )
    .await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (403, Some("cross_origin")),
        "a cross-origin change passed with X-Forwarded-Host from an untrusted peer: {body}"
    );
    assert!(
        body.get("token").is_none(),
        "no join token was made: {body}"
    );
    // The brain's own origin still passes.
    let (s, body) = make_join_token(
        &c,
        &[
            ("authorization", &bearer(&operator)),
            ("origin", &c.web_url()),
        ],
    )
    .await;
    assert_eq!(s, 201, "{body}");
    assert!(
        body["token"].as_str().is_some_and(|t| !t.is_empty()),
        "{body}"
    );
}

/// The same headers through a configured proxy (`[web] trusted_proxies`) are believed: the
/// page served as `tether.example.com` by the proxy may change things.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_host_from_a_trusted_proxy_is_believed() {
    let c = cluster_with(None, "trusted_proxies = [\"127.0.0.1\"]");
    let operator = c.web_token("ci", "operator", "1h");
    let forwarded = [
        ("authorization", bearer(&operator)),
        ("origin", "https://tether.example.com".to_string()),
        ("x-forwarded-host", "tether.example.com".to_string()),
    ];
    let headers: Vec<(&str, &str)> = forwarded.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (s, body) = make_join_token(&c, &headers).await;
    assert_eq!(s, 201, "{body}");
    // Another origin is still another origin.
    let (s, body) = make_join_token(
        &c,
        &[
            ("authorization", &bearer(&operator)),
            ("origin", "http://evil.test"),
            ("x-forwarded-host", "tether.example.com"),
        ],
    )
    .await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (403, Some("cross_origin"))
    );
}

/// `text` (JSON lines, or SSE whose `data:` lines are JSON) without the replayed model's
/// transcript that the `created` record carries: that is this test's own input, stored as
/// given, and it names the value; what the model answers is masked on arrival (the
/// `llm_response` and `tool_call_issued` records, which stay in).
fn without_transcript(text: &str) -> String {
    text.lines()
        .map(|l| {
            let (prefix, json) = l.strip_prefix("data: ").map_or(("", l), |j| ("data: ", j));
            match serde_json::from_str::<Value>(json) {
                Ok(mut v) if v["kind"] == "created" => {
                    if let Some(agent) = v.get_mut("agent").and_then(Value::as_object_mut) {
                        agent.remove("transcript");
                    }
                    format!("{prefix}{v}")
                }
                _ => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Route 8, redaction: a secret set with `brain secret set` while the brain runs is masked
/// at once in what leaves the brain: the task log (`brain task log`), the web API's events
/// (history and live output) — whether the command names the value or builds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_set_while_the_brain_runs_is_masked_at_once() {
    const VALUE: &str = "late-secret-7f3a9c21e5";
    let c = cluster_with(None, "");
    let w = c.join_worker("laptop");
    let viewer = c.web_token("reader", "viewer", "1h");
    set_secret(&c, "late", VALUE, &["--host", "api.example.com"]);
    let commands = vec![
        // Gives the event stream time to be open for the live output below.
        "sleep 2".to_string(),
        format!("printf '%s\\n' '{VALUE}'"),
        // Built from two halves, so the command itself never names it.
        format!("printf '%s%s\\n' '{}' '{}'", &VALUE[..8], &VALUE[8..]),
    ];
    let id = start_commands(&c, &w.id, &[], &commands);
    let mut live = open_stream(
        &c,
        &format!("/api/tasks/{id}/events"),
        &bearer(&viewer),
        None,
    )
    .await;
    assert_eq!(live.status(), 200);
    let streamed = read_until(&mut live, "event: end", Duration::from_secs(120)).await;
    wait_status(&c, &id, "finished").await;
    let ran = results(&c, &id);
    assert_eq!(ran.len(), 3, "{ran:#?}");
    assert!(
        ran[2].stdout.contains("[redacted]"),
        "the value built by the command is masked in its output: {:#?}",
        ran[2]
    );
    let log = c.brain_cli(&["task", "log", &id]);
    let log_json = c.brain_cli(&["task", "log", &id, "--json"]);
    let history = get_response(
        &c,
        &format!("/api/tasks/{id}/events?follow=false"),
        &bearer(&viewer),
    )
    .await
    .text()
    .await
    .unwrap();
    for (what, text) in [
        ("brain task log", stdout(&log)),
        (
            "brain task log --json",
            without_transcript(&stdout(&log_json)),
        ),
        ("the web API's history", without_transcript(&history)),
        ("the web API's live stream", without_transcript(&streamed)),
    ] {
        assert!(
            !text.contains(VALUE),
            "{what} shows a secret set after the brain started: {text}"
        );
    }
    assert!(streamed.contains("[redacted]"), "{streamed}");
}
