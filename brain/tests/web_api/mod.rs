//! The web API as the HTTP tests speak to it (`web.rs`, `attacks_web.rs`): requests with
//! their status and JSON, an event stream opened, and a task's status awaited without
//! blocking the runtime.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::Cluster;

pub fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

/// A client that follows no redirect (a login link's answer is the test's to read).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A request's status and JSON (or its text as a JSON string).
pub async fn call(
    c: &Cluster,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = client().request(method.parse().unwrap(), format!("{}{path}", c.web_url()));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    if let Some(b) = body {
        r = r
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let resp = r.send().await.expect("the web API answers");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// [`call`]: a GET with `auth` as its `authorization`.
pub async fn get(c: &Cluster, path: &str, auth: &str) -> (u16, Value) {
    call(c, "GET", path, &[("authorization", auth)], None).await
}

/// [`call`]: a POST without a body, with `auth` as its `authorization`.
pub async fn post(c: &Cluster, path: &str, auth: &str) -> (u16, Value) {
    call(c, "POST", path, &[("authorization", auth)], None).await
}

/// A GET with `auth` as its `authorization`, its response to read (NDJSON history, a diff).
pub async fn get_response(c: &Cluster, path: &str, auth: &str) -> reqwest::Response {
    client()
        .get(format!("{}{path}", c.web_url()))
        .header("authorization", auth)
        .send()
        .await
        .expect("the web API answers")
}

/// Opens an event stream (after `last_id`, if given); the response, whatever its status.
pub async fn open_stream(
    c: &Cluster,
    path: &str,
    auth: &str,
    last_id: Option<u64>,
) -> reqwest::Response {
    let mut r = client()
        .get(format!("{}{path}", c.web_url()))
        .header("authorization", auth)
        .header("accept", "text/event-stream")
        .timeout(Duration::from_secs(120));
    if let Some(id) = last_id {
        r = r.header("last-event-id", id.to_string());
    }
    r.send().await.expect("the web API answers")
}

/// Waits (asking `brain tasks`, without blocking the runtime) until task `id` is `want`.
pub async fn wait_status(c: &Cluster, id: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.task_status(id).unwrap_or_default() != want {
        assert!(
            Instant::now() < deadline,
            "{id} never {want}: {}",
            c.brain_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
