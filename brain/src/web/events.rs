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
use std::fmt::Write as _;
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
use crate::engine::{Followed, Follower, Linger};
use futures_util::FutureExt;

/// Items a slow client of the all-tasks stream may have queued before its producer waits.
const CLIENT_QUEUE: usize = 64;
/// What one chunk of a task's stream holds at most, beyond its last item.
const CHUNK: usize = 256 * 1024;
/// Items one chunk holds at most: as many as a task's live queue (a watcher that fell that
/// far behind re-reads the log, which may hold many more).
const CHUNK_ITEMS: usize = 1024;
/// How long a watcher of a task's stream lingers after a wake, per watcher of the task, before
/// it sends what came meanwhile as one chunk: 100 watchers linger 15 ms, 1,000 watchers 150 ms.
/// A chunk costs the web threads about 16 µs of CPU beyond what its records cost (the `events`
/// bench, 1,000 watchers: 13,270 writes in 518 ms at the default 50 µs, 4,091 in 367 ms at
/// 150 µs), so N watchers cost about a tenth of a core between them, however many they are,
/// and in that bench a task watched by 1,000 kept within 1.5× its pace (at 50 µs, not always).
const LINGER: Linger = Linger {
    per_watcher: Duration::from_micros(150),
    max: Duration::from_millis(250),
};
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

/// Appends the JSON of one streamed item to `out`: a record as `brain task log --json` prints
/// it (made once for all its watchers, copied here without an allocation of its own), a live
/// item marked `"durable": false`, an undecodable record's error, or the end.
fn push_json(f: &Followed, out: &mut String) {
    match f {
        Followed::End => out.push_str("{}"),
        Followed::Record(r) => out.push_str(r.json_with(crate::api::convert::log::json)),
        Followed::Live(o) => {
            // As the wire has it (the call id a string), not the engine's own form.
            let wire = proto::LiveOutput::from(o.clone());
            let mut v = serde_json::to_value(wire).expect("serialises");
            v["durable"] = false.into();
            out.push_str(&v.to_string());
        }
        Followed::Broken(e) => out.push_str(&serde_json::json!({"error": e}).to_string()),
    }
}

/// Appends one item as a Server-Sent Event: `id:` (a record's sequence number), `event:` (its
/// kind) and one `data:` line (compact JSON has no line breaks).
fn push_sse(f: &Followed, out: &mut String) {
    let kind = match f {
        Followed::End => "end",
        Followed::Record(r) => {
            // Writing to a String cannot fail.
            let _ = writeln!(out, "id: {}", r.seq);
            "record"
        }
        Followed::Live(_) => "live",
        Followed::Broken(_) => "broken",
    };
    out.push_str("event: ");
    out.push_str(kind);
    out.push_str("\ndata: ");
    push_json(f, out);
    out.push_str("\n\n");
}

/// Appends one item as a line of NDJSON (the end is not a line).
fn push_ndjson(f: &Followed, out: &mut String) {
    if !matches!(f, Followed::End) {
        push_json(f, out);
        out.push('\n');
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
        .follow_with(&id, after, follow, LINGER)
        .map_err(tonic::Status::from)?;
    if !follow {
        let lines = batched(items, None, push_ndjson);
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
    let events = batched(items, Some(KEEP_ALIVE), push_sse);
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
/// ready behind it, so a watcher that wakes late (it lingers after a wake when many watch;
/// its thread runs only on CPU time the engine leaves) sends what piled up as one body frame
/// and one write, not one each. A chunk is bounded: at most [`CHUNK_ITEMS`] items and
/// [`CHUNK`] bytes beyond its last item; what is left waits, in the follower's bounded queue,
/// for the next. With `keep_alive`, a comment line after that long without an item keeps
/// proxies from closing a quiet stream.
fn batched(
    items: Follower,
    keep_alive: Option<Duration>,
    write: fn(&Followed, &mut String),
) -> impl futures_util::Stream<Item = Result<String, Infallible>> + Send {
    // The ticker is made at the first poll, on the web's runtime (the handler runs on the
    // engine's), so resetting it after every chunk never touches the engine's timers.
    let state: (Follower, Option<tokio::time::Interval>) = (items, None);
    futures_util::stream::unfold(state, move |(mut items, mut ticker)| async move {
        let Some(period) = keep_alive else {
            let out = chunk(items.next().await?, &mut items, write);
            return Some((Ok(out), (items, ticker)));
        };
        let t = ticker.get_or_insert_with(|| {
            let mut t = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        let out = tokio::select! {
            item = items.next() => chunk(item?, &mut items, write),
            _ = t.tick() => ":\n\n".to_string(),
        };
        t.reset();
        Some((Ok(out), (items, ticker)))
    })
}

/// `first` and the items ready behind it, written as one chunk (within the bounds above).
fn chunk(first: Followed, items: &mut Follower, write: fn(&Followed, &mut String)) -> String {
    let mut out = String::new();
    write(&first, &mut out);
    let mut n = 1;
    while n < CHUNK_ITEMS && out.len() < CHUNK {
        match items.next().now_or_never() {
            Some(Some(item)) => write(&item, &mut out),
            _ => break,
        }
        n += 1;
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Shown;
    use crate::model::event::{Event, RECORD_VERSION, Record};
    use crate::model::task::TaskId;

    fn record(seq: u64) -> Followed {
        Followed::Record(Shown::new(Record {
            v: RECORD_VERSION,
            task: TaskId(7),
            seq,
            at_ms: 1_000 + seq as i64,
            event: Event::Snapshot { upto: seq },
        }))
    }

    /// A record whose JSON is `bytes` long (made once, as its watchers share it).
    fn big_record(seq: u64, bytes: usize) -> Followed {
        let f = record(seq);
        if let Followed::Record(r) = &f {
            let pad = "x".repeat(bytes.saturating_sub(30));
            r.json_with(|_| format!(r#"{{"seq":"{seq}","pad":"{pad}"}}"#));
        }
        f
    }

    fn follower(items: Vec<Followed>) -> Follower {
        Box::pin(futures_util::stream::iter(items))
    }

    async fn chunks(items: Follower) -> Vec<String> {
        batched(items, None, push_sse)
            .map(|c| c.unwrap())
            .collect()
            .await
    }

    /// The `id:` of every record in `chunks`, in the order sent.
    fn ids(chunks: &[String]) -> Vec<u64> {
        chunks
            .iter()
            .flat_map(|c| c.lines())
            .filter_map(|l| l.strip_prefix("id: "))
            .map(|n| n.parse().unwrap())
            .collect()
    }

    #[tokio::test]
    async fn records_ready_at_once_go_out_as_one_chunk() {
        let mut items: Vec<Followed> = (1..=5).map(record).collect();
        items.push(Followed::End);
        let chunks = chunks(follower(items)).await;
        assert_eq!(chunks.len(), 1, "{chunks:?}");
        assert_eq!(ids(&chunks), vec![1, 2, 3, 4, 5]);
        assert_eq!(chunks[0].matches("event: record\ndata: {").count(), 5);
        assert!(
            chunks[0].ends_with("event: end\ndata: {}\n\n"),
            "{}",
            chunks[0]
        );
    }

    #[tokio::test]
    async fn what_piles_up_while_the_stream_waits_goes_out_together() {
        let (tx, rx) = mpsc::unbounded_channel();
        let items: Follower = Box::pin(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
        let mut s = Box::pin(batched(items, None, push_sse));
        for seq in 1..=3 {
            tx.send(record(seq)).unwrap();
        }
        let first = s.next().await.unwrap().unwrap();
        assert_eq!(ids(&[first]), vec![1, 2, 3]);
        tx.send(record(4)).unwrap();
        let second = s.next().await.unwrap().unwrap();
        assert_eq!(ids(&[second]), vec![4]);
        for seq in 5..=9 {
            tx.send(record(seq)).unwrap();
        }
        tx.send(Followed::End).unwrap();
        drop(tx);
        let rest: Vec<String> = s.map(|c| c.unwrap()).collect().await;
        assert_eq!(rest.len(), 1, "{rest:?}");
        assert_eq!(ids(&rest), vec![5, 6, 7, 8, 9]);
    }

    #[tokio::test]
    async fn a_chunk_holds_at_most_its_items_and_every_record_arrives_once_in_order() {
        let n = 3 * CHUNK_ITEMS as u64 + 5;
        let chunks = chunks(follower((1..=n).map(record).collect())).await;
        assert_eq!(chunks.len(), 4);
        for c in &chunks {
            assert!(c.matches("event: record").count() <= CHUNK_ITEMS);
        }
        assert_eq!(ids(&chunks), (1..=n).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_chunk_holds_at_most_its_bytes_beyond_its_last_item() {
        let item = 40 * 1024;
        let n = 40;
        let chunks = chunks(follower((1..=n).map(|s| big_record(s, item)).collect())).await;
        assert!(
            chunks.len() >= n as usize * item / (CHUNK + item),
            "{}",
            chunks.len()
        );
        for c in &chunks {
            assert!(c.len() < CHUNK + item + 100, "a chunk of {} bytes", c.len());
        }
        assert_eq!(ids(&chunks), (1..=n).collect::<Vec<_>>());
    }

    #[test]
    fn items_are_written_as_server_sent_events_and_ndjson() {
        let mut out = String::new();
        push_sse(&record(3), &mut out);
        let json = crate::api::convert::log::json(&Record {
            v: RECORD_VERSION,
            task: TaskId(7),
            seq: 3,
            at_ms: 1_003,
            event: Event::Snapshot { upto: 3 },
        });
        assert_eq!(out, format!("id: 3\nevent: record\ndata: {json}\n\n"));
        let live = Followed::Live(crate::engine::LiveOutput {
            kind: "live_output",
            call_id: 9,
            stream: "stdout",
            text: "hi".into(),
        });
        let mut out = String::new();
        push_sse(&live, &mut out);
        assert!(out.starts_with("event: live\ndata: {"), "{out}");
        assert!(!out.contains("id:"), "a live item has no id: {out}");
        let data: serde_json::Value =
            serde_json::from_str(out.trim_end().strip_prefix("event: live\ndata: ").unwrap())
                .unwrap();
        assert_eq!(data["durable"], false);
        let mut out = String::new();
        for f in [record(3), Followed::Broken("bad".into()), Followed::End] {
            push_ndjson(&f, &mut out);
        }
        assert_eq!(out, format!("{json}\n{{\"error\":\"bad\"}}\n"));
    }
}
