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
    /// group: the first to come gathers the others for a moment, then sends one request with
    /// `send` for all of them (`n`), and hands each its answer, written as a one-answer
    /// response. `None`: ask alone.
    pub async fn ask<F, Fut>(&self, url: &str, share: Share, body: Value, send: F) -> Option<Value>
    where
        F: FnOnce(Value) -> Fut,
        Fut: Future<Output = Result<Value, Error>>,
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
        let n = joined.len() + 1;
        let mut body = body;
        body["n"] = json!(n);
        let answer = send(body).await.ok()?;
        let mut answers = split(&answer, n).into_iter();
        let own = answers.next().flatten();
        for (tx, a) in joined.into_iter().zip(answers) {
            let _ = tx.send(a);
        }
        own
    }
}

/// `answer`'s choices as `n` one-answer responses, each with its share of the usage; `None`
/// where the server sent fewer answers than asked. The prompt was read once: its tokens are
/// shared out evenly. The answers' tokens are shared out by their length, and each counts
/// at least its length / 4 (OpenAI's usage covers every answer; llama.cpp's covers only the
/// first, and an answer must not go uncounted).
fn split(answer: &Value, n: usize) -> Vec<Option<Value>> {
    let mut slots: Vec<Option<&Value>> = vec![None; n];
    for (pos, c) in answer["choices"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = c["index"].as_u64().map_or(pos, |i| i as usize);
        if let Some(slot) = slots.get_mut(at).filter(|s| s.is_none()) {
            *slot = Some(c);
        } else if let Some(slot) = slots.iter_mut().find(|s| s.is_none()) {
            *slot = Some(c);
        }
    }
    let length = |c: &Value| {
        let m = &c["message"];
        let calls: usize = m["tool_calls"]
            .as_array()
            .map_or(0, |calls| calls.iter().map(|t| t.to_string().len()).sum());
        (m["content"].as_str().map_or(0, str::len) + calls) as u64
    };
    let lengths: Vec<u64> = slots.iter().map(|c| c.map_or(0, length)).collect();
    let all: u64 = lengths.iter().sum::<u64>().max(1);
    let prompt = answer["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    let completion = answer["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    let n64 = n as u64;
    slots
        .iter()
        .zip(&lengths)
        .enumerate()
        .map(|(i, (choice, &len))| {
            let choice = (*choice)?;
            let prompt = prompt / n64 + u64::from((i as u64) < prompt % n64);
            let completion = (completion * len / all).max(len / 4);
            Some(json!({
                "choices": [choice],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
            }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(i: u64, text: &str) -> Value {
        json!({"index": i, "message": {"role": "assistant", "content": text}})
    }

    #[test]
    fn each_answer_goes_to_its_own_and_the_usage_is_shared_out() {
        let answer = json!({
            "choices": [choice(1, "bbbbbbbb"), choice(0, "aaaaaaaa"), choice(2, "cccccccccccccccc")],
            "usage": {"prompt_tokens": 1000, "completion_tokens": 40},
        });
        let got = split(&answer, 3);
        let text = |v: &Option<Value>| {
            v.as_ref().unwrap()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(text(&got[0]), "aaaaaaaa");
        assert_eq!(text(&got[1]), "bbbbbbbb");
        assert_eq!(text(&got[2]), "cccccccccccccccc");
        let prompts: Vec<u64> = got
            .iter()
            .map(|g| {
                g.as_ref().unwrap()["usage"]["prompt_tokens"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(prompts, [334, 333, 333], "the prompt counted once in all");
        let completions: Vec<u64> = got
            .iter()
            .map(|g| {
                g.as_ref().unwrap()["usage"]["completion_tokens"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(completions, [10, 10, 20], "shared out by length");
    }

    #[test]
    fn fewer_answers_than_asked_leave_the_rest_to_ask_alone() {
        let answer = json!({
            "choices": [choice(0, "only")],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1},
        });
        let got = split(&answer, 3);
        assert!(got[0].is_some());
        assert!(got[1].is_none() && got[2].is_none());
        // A server that counts one answer only: each still counts its length / 4.
        let answer = json!({
            "choices": [choice(0, &"x".repeat(400)), choice(1, &"y".repeat(800))],
            "usage": {"prompt_tokens": 10, "completion_tokens": 100},
        });
        let got = split(&answer, 2);
        let c1 = got[1].as_ref().unwrap()["usage"]["completion_tokens"].as_u64();
        assert_eq!(c1, Some(200));
    }

    #[tokio::test]
    async fn members_ask_alone_when_the_first_is_dropped_while_it_asks() {
        use futures_util::FutureExt;
        let t = Arc::new(Together::default());
        let share = Share { group: 1, of: 2 };
        let never = |_| std::future::pending::<Result<Value, Error>>();
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
