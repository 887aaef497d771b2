//! Attempts that start together ask their first turn together. Their first requests are the
//! same but for the seed (one base, one goal, one model and temperature), so a server would
//! read the same prompt once per attempt; on a model server that shares its compute between
//! them (llama.cpp on a CPU), that is most of what N attempts cost over one. Requests of one
//! group ([`Share`]) that are the same but for the seed go out as one request for that many
//! answers (OpenAI's `n`; llama.cpp reads the prompt once and samples each answer with a
//! seed of its own), and each caller gets one answer with its share of the usage.
//!
//! Nothing here can lose an answer: a caller that waited for the group's request and got
//! nothing from it (the request failed, the server sent fewer answers than asked, the caller
//! that sent it was cancelled) asks alone, as it would have without the group.

use std::collections::HashMap;
use std::future::Future;

use futures_util::{Stream, StreamExt};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use shared::locks::Lock;
use tokio::sync::{Notify, oneshot};

use super::types::{Error, Share};

/// How long the first of a group waits for the rest before it asks without them.
const GATHER: Duration = Duration::from_secs(5);
/// Most answers asked in one request (OpenAI takes up to 128).
const MAX_ANSWERS: usize = 16;

/// The groups being gathered, one per server URL and group, shared by every task's provider.
#[derive(Default)]
pub struct Together {
    pending: Mutex<HashMap<(String, u64), Vec<Gathering>>>,
}

/// A group being gathered: the body its members share (without a seed), and how to answer
/// the members that joined the first.
struct Gathering {
    body: Vec<u8>,
    joined: Vec<oneshot::Sender<Option<Value>>>,
    full: Arc<Notify>,
}

/// Takes the first's group out of the map if it is still there (when the first is dropped
/// while it gathers, the joined members' answers are dropped with it and they ask alone).
struct Leave<'a> {
    together: &'a Together,
    key: (String, u64),
    body: Vec<u8>,
}

impl Leave<'_> {
    fn take(&self) -> Vec<oneshot::Sender<Option<Value>>> {
        let mut pending = self.together.pending.locked();
        let Some(list) = pending.get_mut(&self.key) else {
            return Vec::new();
        };
        let taken = list
            .iter()
            .position(|g| g.body == self.body)
            .map(|i| list.swap_remove(i).joined)
            .unwrap_or_default();
        if list.is_empty() {
            pending.remove(&self.key);
        }
        taken
    }
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        drop(self.take());
    }
}

/// What joining a group came to.
enum Joined {
    /// The first: it gathers the others and asks.
    First(Arc<Notify>),
    /// Another: its answer comes from the first.
    Member(oneshot::Receiver<Option<Value>>),
    /// The group is as large as one request may be: ask alone.
    Alone,
}

impl Together {
    fn join(&self, key: &(String, u64), bytes: Vec<u8>, want: usize) -> Joined {
        let mut pending = self.pending.locked();
        let list = pending.entry(key.clone()).or_default();
        match list.iter_mut().find(|g| g.body == bytes) {
            Some(g) if g.joined.len() + 1 >= MAX_ANSWERS => Joined::Alone,
            Some(g) => {
                let (tx, rx) = oneshot::channel();
                g.joined.push(tx);
                if g.joined.len() + 1 >= want {
                    g.full.notify_one();
                }
                Joined::Member(rx)
            }
            None => {
                let full = Arc::new(Notify::new());
                list.push(Gathering {
                    body: bytes,
                    joined: Vec::new(),
                    full: full.clone(),
                });
                Joined::First(full)
            }
        }
    }

    /// Answers `body` (a Chat Completions request without its seed) as one of `share`'s
    /// group: the first to come gathers the others for a moment, then sends one streamed
    /// request with `send` for all of them (`n`), and hands each its answer, as a one-answer
    /// response, as soon as that answer is complete. `None`: ask alone.
    pub async fn ask<F, Fut>(&self, url: &str, share: Share, body: Value, send: F) -> Option<Value>
    where
        F: FnOnce(Value) -> Fut,
        Fut: Future<Output = Result<Events, Error>>,
    {
        if share.of < 2 {
            return None;
        }
        let bytes = serde_json::to_vec(&body).ok()?;
        let key = (url.to_string(), share.group);
        let want = (share.of as usize).min(MAX_ANSWERS);
        let full = match self.join(&key, bytes.clone(), want) {
            Joined::Member(rx) => return rx.await.ok().flatten(),
            Joined::Alone => return None,
            Joined::First(full) => full,
        };
        let estimate = bytes.len() as u64 / 4;
        let leave = Leave {
            together: self,
            key,
            body: bytes,
        };
        let _ = tokio::time::timeout(GATHER, full.notified()).await;
        let joined = leave.take();
        if joined.is_empty() {
            return None;
        }
        let (own, mine) = oneshot::channel();
        let callers: Vec<_> = std::iter::once(own).chain(joined).collect();
        let mut body = body;
        body["n"] = json!(callers.len());
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        // A failed request drops the callers' senders: each asks alone.
        let events = send(body).await.ok()?;
        // The answers are handed out by a task of their own, so that the others get theirs
        // when this caller is dropped; it stops when the stream ends.
        tokio::spawn(hand_out(events, callers, estimate));
        mine.await.ok().flatten()
    }
}

/// A streamed answer's events: each `data:` line of the server's event stream, as JSON.
pub type Events = std::pin::Pin<Box<dyn Stream<Item = Result<Value, Error>> + Send>>;

/// Most tool calls kept from one streamed answer.
const MAX_CALLS: usize = 64;

/// One answer being put together from the stream's pieces.
#[derive(Default)]
struct Building {
    content: String,
    /// Tool calls by their index: id, name, arguments.
    calls: Vec<(String, String, String)>,
    /// Pieces received: each is about a token (llama.cpp and OpenAI send one a piece).
    pieces: u64,
    finish: Option<String>,
}

impl Building {
    fn add(&mut self, delta: &Value) {
        let mut any = false;
        if let Some(t) = delta["content"].as_str() {
            self.content.push_str(t);
            any = true;
        }
        for c in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap_or(0) as usize;
            if i >= MAX_CALLS {
                continue;
            }
            if self.calls.len() <= i {
                self.calls.resize_with(i + 1, Default::default);
            }
            let call = &mut self.calls[i];
            if let Some(id) = c["id"].as_str() {
                call.0.push_str(id);
            }
            if let Some(name) = c["function"]["name"].as_str() {
                call.1.push_str(name);
            }
            if let Some(a) = c["function"]["arguments"].as_str() {
                call.2.push_str(a);
            }
            any = true;
        }
        self.pieces += u64::from(any);
    }

    /// The answer as a one-answer Chat Completions response. Its tokens: the pieces, and at
    /// least its length / 4.
    fn answer(&self, index: usize, prompt_tokens: u64) -> Value {
        let calls: Vec<Value> = self
            .calls
            .iter()
            .filter(|c| !c.1.is_empty())
            .map(|(id, name, args)| {
                json!({"id": id, "type": "function",
                       "function": {"name": name, "arguments": args}})
            })
            .collect();
        let length = self.content.len() + self.calls.iter().map(|c| c.2.len()).sum::<usize>();
        let mut message = json!({"role": "assistant", "content": self.content});
        if !calls.is_empty() {
            message["tool_calls"] = json!(calls);
        }
        json!({
            "choices": [{"index": index, "message": message, "finish_reason": self.finish}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": self.pieces.max(length as u64 / 4),
            },
        })
    }
}

/// Reads the stream and hands each caller its answer once the server says it is complete
/// (its `finish_reason`), with the prompt's tokens shared out evenly (read once for all;
/// from the usage the server reports, else `estimate`). A caller whose answer never came is
/// dropped, and so asks alone.
async fn hand_out(mut events: Events, callers: Vec<oneshot::Sender<Option<Value>>>, estimate: u64) {
    let n = callers.len();
    let mut callers: Vec<Option<oneshot::Sender<Option<Value>>>> =
        callers.into_iter().map(Some).collect();
    let mut answers: Vec<Building> = (0..n).map(|_| Building::default()).collect();
    let mut prompt: Option<u64> = None;
    // A complete answer waits for the next event: llama.cpp reports the usage right after.
    let mut ready: Vec<usize> = Vec::new();
    let give = |callers: &mut [Option<oneshot::Sender<Option<Value>>>],
                ready: &mut Vec<usize>,
                prompt: Option<u64>,
                answers: &[Building]| {
        let each = prompt.unwrap_or(estimate) / n as u64;
        for i in ready.drain(..) {
            if let Some(tx) = callers[i].take() {
                let _ = tx.send(Some(answers[i].answer(i, each)));
            }
        }
    };
    loop {
        // Every caller still waiting is gone (their tasks were cancelled): the stream is
        // dropped, so the server stops writing answers nobody reads.
        if callers.iter().flatten().all(oneshot::Sender::is_closed) {
            return;
        }
        let Some(Ok(event)) = events.next().await else {
            break;
        };
        if let Some(p) = event["usage"]["prompt_tokens"].as_u64() {
            prompt = Some(p);
        }
        give(&mut callers, &mut ready, prompt, &answers);
        for c in event["choices"].as_array().into_iter().flatten() {
            let Some(i) = c["index"].as_u64().map(|i| i as usize).filter(|i| *i < n) else {
                continue;
            };
            let a = &mut answers[i];
            if a.finish.is_some() {
                continue;
            }
            a.add(&c["delta"]);
            if let Some(f) = c["finish_reason"].as_str() {
                a.finish = Some(f.to_string());
                ready.push(i);
            }
        }
    }
    give(&mut callers, &mut ready, prompt, &answers);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(i: u64, delta: Value, finish: Option<&str>) -> Result<Value, Error> {
        Ok(json!({"choices": [{"index": i, "delta": delta, "finish_reason": finish}]}))
    }

    /// Hands out `events` to three callers; what each got.
    async fn hand_out_to_three(events: Vec<Result<Value, Error>>) -> Vec<Option<Value>> {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..3).map(|_| oneshot::channel()).unzip();
        hand_out(futures_util::stream::iter(events).boxed(), txs, 4000).await;
        let mut got = Vec::new();
        for rx in rxs {
            got.push(rx.await.ok().flatten());
        }
        got
    }

    #[tokio::test]
    async fn each_answer_goes_to_its_own_as_soon_as_it_is_complete() {
        let (txs, mut rxs): (Vec<_>, Vec<_>) = (0..2).map(|_| oneshot::channel()).unzip();
        let (feed, events) = tokio::sync::mpsc::unbounded_channel();
        let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(events).boxed();
        let task = tokio::spawn(hand_out(stream, txs, 4000));
        feed.send(piece(1, json!({"content": "b"}), None)).unwrap();
        feed.send(piece(1, json!({}), Some("stop"))).unwrap();
        feed.send(Ok(json!({"choices": [], "usage": {"prompt_tokens": 1000}})))
            .unwrap();
        // The second answer is complete: its caller has it while the first is still coming.
        let second = (&mut rxs[1]).await.unwrap().unwrap();
        assert_eq!(second["choices"][0]["message"]["content"], "b");
        assert_eq!(
            second["usage"]["prompt_tokens"], 500,
            "the prompt counted once in all"
        );
        assert!(rxs[0].try_recv().is_err(), "the first is not complete yet");
        feed.send(piece(0, json!({"content": "a"}), Some("length")))
            .unwrap();
        drop(feed);
        task.await.unwrap();
        let first = (&mut rxs[0]).await.unwrap().unwrap();
        assert_eq!(first["choices"][0]["message"]["content"], "a");
        assert_eq!(first["choices"][0]["finish_reason"], "length");
    }

    #[tokio::test]
    async fn the_stream_is_let_go_once_nobody_waits_for_an_answer() {
        let (txs, mut rxs): (Vec<_>, Vec<_>) = (0..2).map(|_| oneshot::channel()).unzip();
        let (feed, events) = tokio::sync::mpsc::unbounded_channel();
        let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(events).boxed();
        let task = tokio::spawn(hand_out(stream, txs, 4000));
        feed.send(piece(0, json!({"content": "a"}), Some("stop")))
            .unwrap();
        feed.send(piece(1, json!({"content": "b"}), None)).unwrap();
        let first = (&mut rxs[0]).await.unwrap().unwrap();
        assert_eq!(first["choices"][0]["message"]["content"], "a");
        // The second's caller is cancelled while its answer is still coming; the stream
        // stays open, but nothing more is read from it.
        drop(rxs);
        feed.send(piece(1, json!({"content": "c"}), None)).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("hand_out lets the stream go")
            .unwrap();
        assert!(
            feed.send(Ok(json!({}))).is_err(),
            "the stream was dropped with its reader"
        );
    }

    #[tokio::test]
    async fn tool_calls_are_put_together_from_their_pieces() {
        let got = hand_out_to_three(vec![
            piece(2, json!({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "run", "arguments": "{\"cmd\":"}}]}), None),
            piece(2, json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"ls\"}"}}]}), None),
            piece(2, json!({}), Some("tool_calls")),
        ])
        .await;
        let third = got[2].as_ref().unwrap();
        let call = &third["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["id"], "call_1");
        assert_eq!(call["function"]["name"], "run");
        assert_eq!(call["function"]["arguments"], "{\"cmd\":\"ls\"}");
        // No usage came: the prompt is estimated (4000 tokens, a third each).
        assert_eq!(third["usage"]["prompt_tokens"], 1333);
        assert_eq!(third["usage"]["completion_tokens"], 3);
    }

    #[tokio::test]
    async fn callers_whose_answer_never_came_ask_alone() {
        let got = hand_out_to_three(vec![
            piece(0, json!({"content": "only"}), Some("stop")),
            piece(1, json!({"content": "cut off"}), None),
            Err(Error::Transport("reset".into())),
            piece(2, json!({"content": "after the error"}), Some("stop")),
        ])
        .await;
        assert!(got[0].is_some());
        assert!(got[1].is_none(), "an answer cut off is not an answer");
        assert!(got[2].is_none(), "nothing is read past an error");
    }

    #[tokio::test]
    async fn members_ask_alone_when_the_first_is_dropped_while_it_asks() {
        use futures_util::FutureExt;
        let t = Arc::new(Together::default());
        let share = Share { group: 1, of: 2 };
        let never = |_| std::future::pending::<Result<Events, Error>>();
        let mut first = Box::pin(t.ask("u", share, json!({"a": 1}), never));
        assert!((&mut first).now_or_never().is_none(), "the first gathers");
        let t2 = t.clone();
        let member = tokio::spawn(async move {
            t2.ask("u", share, json!({"a": 1}), |_| async { unreachable!() })
                .await
        });
        // The member joins; the first, polled again, takes the group and sends for both.
        for _ in 0..1000 {
            let joined = t
                .pending
                .locked()
                .values()
                .flatten()
                .map(|g| g.joined.len())
                .sum::<usize>();
            if joined == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(
            (&mut first).now_or_never().is_none(),
            "the first is sending"
        );
        assert!(t.pending.locked().is_empty(), "the group was taken");
        drop(first);
        assert_eq!(member.await.unwrap(), None, "the member asks alone");
    }
}
