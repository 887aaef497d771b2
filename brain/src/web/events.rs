//! Event streams. A task's events are its log: Server-Sent Events whose `id:` is the
//! record's sequence number, so a browser's `EventSource` (which sends `Last-Event-ID` when it
//! reconnects) or a program (`?since=N`) resumes exactly after N — history from the log,
//! then live, with no gap and no duplicate at the seam (the engine's `follow`). Live command
//! output and file-change hints travel on the same stream as `live` events without an id:
//! not durable, a slow client may miss some. `?follow=false` answers the history as NDJSON.
//! The all-tasks stream sends the list, then each task's summary as it changes.
//!
//! Every stream is held by its credential (see [`super::streams`]): a credential holds a
//! bounded number, and each ends when its credential does, with a last `closed` event (a
//! last NDJSON line `{"error": ...}`) saying why.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::time::Duration;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use super::auth::Authed;
use super::extract::Params;
use super::streams::{Slot, credential_end, until_end};
use super::{ApiError, Web};
use crate::engine::{Followed, Follower};
use futures_util::FutureExt;

/// Items a slow client of the all-tasks stream may have queued before its producer waits.
const CLIENT_QUEUE: usize = 64;
/// What one chunk of a task's stream holds at most, beyond its last item.
const CHUNK: usize = 256 * 1024;
/// A comment line this often keeps proxies from closing a quiet stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct EventsQuery {
    /// Only records after this sequence number (`Last-Event-ID` wins when both are sent).
    pub since: Option<u64>,
    /// false: the history up to now as NDJSON, then the answer ends.
    pub follow: Option<bool>,
}

/// The JSON of one streamed item: a record as `brain task log --json` prints it, a live
/// item marked `"durable": false`, an undecodable record's error, or the end.
fn item_json(f: &Followed) -> (Option<u64>, &'static str, String) {
    match f {
        Followed::End => (None, "end", "{}".into()),
        Followed::Record(r) => (
            Some(r.seq),
            "record",
            r.json_with(crate::api::convert::log::json).to_string(),
        ),
        Followed::Live(o) => {
            // As the wire has it (the call id a string), not the engine's own form.
            let wire = proto::LiveOutput::from(o.clone());
            let mut v = serde_json::to_value(wire).expect("serialises");
            v["durable"] = false.into();
            (None, "live", v.to_string())
        }
        Followed::Broken(e) => (None, "broken", serde_json::json!({"error": e}).to_string()),
    }
}

/// A slot for one more stream of `a`'s credential, and what ends the stream: its
/// credential's end.
fn held(
    web: &Web,
    a: &Authed,
) -> Result<
    (
        Slot,
        impl std::future::Future<Output = String> + Send + 'static,
    ),
    ApiError,
> {
    let slot = web.streams.take(a, web.opts.max_streams_per_credential)?;
    let end = credential_end(web.auth.clone(), a.key.clone(), a.caller.expires_ms);
    Ok((slot, end))
}

/// The JSON of why a stream ends before its task does (its credential ended).
fn closed_json(why: &str) -> String {
    serde_json::json!({"error": {"code": "unauthenticated", "message": why}}).to_string()
}

/// `GET /api/tasks/{id}/events`.
pub async fn task_events(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Params(q): Params<EventsQuery>,
) -> Result<Response, ApiError> {
    let last_event_id = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request("Last-Event-ID must be a record's sequence number")
                })?,
        ),
    };
    let after = last_event_id.or(q.since).unwrap_or(0);
    let follow = q.follow.unwrap_or(true);
    let (slot, end) = held(&web, &a)?;
    let engine = web.services.0.engine.clone();
    let items = engine
        .follow(&id, after, follow)
        .map_err(tonic::Status::from)?;
    if !follow {
        let lines = batched(items, None, |f, out| {
            if !matches!(f, Followed::End) {
                let (_, _, json) = item_json(&f);
                out.push_str(&json);
                out.push('\n');
            }
        });
        let lines = until_end(
            lines,
            end,
            |why| Ok(format!("{}\n", closed_json(why))),
            slot,
        );
        return Ok((
            [(header::CONTENT_TYPE, "application/x-ndjson")],
            Body::from_stream(lines),
        )
            .into_response());
    }
    // Straight from the engine's follower (bounded; it re-reads the log when this client
    // falls behind) to the response: a stream cut ends the follower with it.
    let events = batched(items, Some(KEEP_ALIVE), |f, out| {
        let (seq, kind, json) = item_json(&f);
        if let Some(seq) = seq {
            out.push_str("id: ");
            out.push_str(&seq.to_string());
            out.push('\n');
        }
        out.push_str("event: ");
        out.push_str(kind);
        // Compact JSON has no line breaks, so it is one `data:` line.
        out.push_str("\ndata: ");
        out.push_str(&json);
        out.push_str("\n\n");
    });
    let events = until_end(
        events,
        end,
        |why| Ok(format!("event: closed\ndata: {}\n\n", closed_json(why))),
        slot,
    );
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(events),
    )
        .into_response())
}

/// The follower's items as response chunks: each chunk holds one item and every item that is
/// ready behind it (up to [`CHUNK`] bytes), so a watcher that wakes late writes what piled up
/// in one write, not one each. With `keep_alive`, a comment line after that long without an
/// item keeps proxies from closing a quiet stream.
fn batched(
    items: Follower,
    keep_alive: Option<Duration>,
    write: impl FnMut(Followed, &mut String) + Send + 'static,
) -> impl futures_util::Stream<Item = Result<String, Infallible>> + Send {
    let period = keep_alive.unwrap_or(Duration::from_secs(86_400 * 365));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    futures_util::stream::unfold(
        (items, ticker, write),
        |(mut items, mut ticker, mut write)| async move {
            let out = tokio::select! {
                item = items.next() => {
                    let mut out = String::new();
                    write(item?, &mut out);
                    while out.len() < CHUNK {
                        match items.next().now_or_never() {
                            Some(Some(item)) => write(item, &mut out),
                            _ => break,
                        }
                    }
                    out
                }
                _ = ticker.tick() => ":\n\n".to_string(),
            };
            ticker.reset();
            Some((Ok(out), (items, ticker, write)))
        },
    )
}

/// `GET /api/events`: `tasks` (every task's summary, at the start and whenever this client
/// fell behind), then `task` (one task's summary) as tasks change.
pub async fn all_tasks(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
) -> Result<Response, ApiError> {
    let (slot, end) = held(&web, &a)?;
    let engine = web.services.0.engine.clone();
    // Subscribed before the first list, so no change falls between them.
    let mut changes = engine.store().changes();
    let (tx, rx) = mpsc::channel::<Event>(CLIENT_QUEUE);
    tokio::spawn(async move {
        let list = |engine: &crate::engine::Engine| {
            let tasks: Vec<proto::TaskSummary> = engine
                .list()
                .into_iter()
                .map(|t| crate::api::convert::summary_in(engine, t))
                .collect();
            Event::default()
                .event("tasks")
                .data(serde_json::json!({ "tasks": tasks }).to_string())
        };
        if tx.send(list(&engine)).await.is_err() {
            return;
        }
        loop {
            let first = tokio::select! {
                c = changes.recv() => c,
                _ = tx.closed() => return,
            };
            let mut ids = BTreeSet::new();
            match first {
                Ok(id) => {
                    ids.insert(id);
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    if tx.send(list(&engine)).await.is_err() {
                        return;
                    }
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
            // Several appends to one task in a burst make one summary.
            while let Ok(id) = changes.try_recv() {
                ids.insert(id);
            }
            // An attempt's change is its parent's too.
            let parents: Vec<_> = ids
                .iter()
                .filter_map(|id| engine.store().task(*id)?.state().attempt_of)
                .map(|a| a.parent)
                .collect();
            ids.extend(parents);
            for id in ids {
                let Some(t) = engine.store().task(id) else {
                    continue;
                };
                let summary = crate::api::convert::summary_in(&engine, t.state());
                let e = Event::default()
                    .event("task")
                    .data(serde_json::to_string(&summary).expect("serialises"));
                if tx.send(e).await.is_err() {
                    return;
                }
            }
        }
    });
    let stream = until_end(
        ReceiverStream::new(rx),
        end,
        |why| Event::default().event("closed").data(closed_json(why)),
        slot,
    )
    .map(Ok::<_, Infallible>);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response())
}
