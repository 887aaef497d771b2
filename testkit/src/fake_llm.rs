//! A fake LLM server for tests: plain HTTP/1.1 on 127.0.0.1 ([`crate::http`]), speaking the
//! OpenAI Chat Completions and Anthropic Messages wire formats. A script decides each answer.
//!
//! ```no_run
//! use testkit::fake_llm::{FakeLlm, FakeReply};
//! let llm = FakeLlm::start(|req| {
//!     if req.assistant_turns() == 0 {
//!         FakeReply::tool_call("ls", serde_json::json!({"path": "."}))
//!     } else {
//!         FakeReply::text("done")
//!     }
//! });
//! // point the brain at llm.url() (OpenAI style) or llm.base() (Anthropic style)
//! ```

use shared::locks::Lock;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::http::{Options, Response, Server};

use serde_json::{Value, json};

/// Largest request body accepted.
const MAX_BODY: usize = 64 << 20;

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct FakeRequest {
    /// `POST`.
    pub method: String,
    /// E.g. `/v1/chat/completions` or `/v1/messages`.
    pub path: String,
    /// Header names lowercased.
    pub headers: BTreeMap<String, String>,
    /// The body as JSON (`Null` if it was not JSON).
    pub body: Value,
    /// 1 for the first request the server received, 2 for the next…
    pub seq: usize,
    /// Which of the request's answers the script is asked for: OpenAI's `n` asks for several
    /// answers to one prompt, and the script is asked once for each (0, 1, …).
    pub choice: usize,
}

impl FakeRequest {
    /// Whether this is an Anthropic Messages request (path ends in `/messages`).
    pub fn is_anthropic(&self) -> bool {
        self.path.ends_with("/messages")
    }

    /// A header's value, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// The body's messages.
    pub fn messages(&self) -> &[Value] {
        self.body["messages"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The number of assistant messages in the conversation.
    pub fn assistant_turns(&self) -> usize {
        self.messages()
            .iter()
            .filter(|m| m["role"] == "assistant")
            .count()
    }

    /// The text of the last tool result: an OpenAI `tool` message, an Anthropic
    /// `tool_result` block, or (text tool-call mode) a user message starting `Result of `.
    pub fn last_tool_result_text(&self) -> Option<String> {
        for m in self.messages().iter().rev() {
            match (m["role"].as_str(), &m["content"]) {
                (Some("tool"), c) => return Some(text_of(c)),
                (Some("user"), Value::Array(blocks)) => {
                    if let Some(b) = blocks.iter().rev().find(|b| b["type"] == "tool_result") {
                        return Some(text_of(&b["content"]));
                    }
                }
                (Some("user"), Value::String(s)) if s.contains("Result of ") => {
                    let at = s.rfind("Result of ").unwrap_or(0);
                    return Some(s[at..].to_string());
                }
                _ => {}
            }
        }
        None
    }
}

/// A string, or the text blocks of a content array, joined.
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[derive(Debug, Clone)]
enum Body {
    Text(String),
    ToolCall(String, Value),
    /// Several calls in one answer (native parallel tool calls).
    ToolCalls(Vec<(String, Value)>),
    Raw(Value),
}

/// What the fake answers; rendered in the request's wire format.
#[derive(Debug, Clone)]
pub struct FakeReply {
    status: u16,
    body: Body,
    usage: (u64, u64),
    retry_after: Option<u64>,
    delay: Option<Duration>,
}

impl FakeReply {
    fn new(status: u16, body: Body) -> Self {
        Self {
            status,
            body,
            usage: (100, 20),
            retry_after: None,
            delay: None,
        }
    }

    /// A `run_command` call.
    pub fn run(command: impl Into<String>) -> Self {
        Self::tool_call(
            "run_command",
            serde_json::json!({"command": command.into()}),
        )
    }

    /// A `write_file` call.
    pub fn write(path: &str, content: impl AsRef<str>) -> Self {
        Self::tool_call(
            "write_file",
            serde_json::json!({"path": path, "content": content.as_ref()}),
        )
    }

    /// A `finish` call with its summary.
    pub fn finish(summary: impl Into<String>) -> Self {
        Self::tool_call("finish", serde_json::json!({"summary": summary.into()}))
    }

    /// A plain text answer.
    pub fn text(s: impl Into<String>) -> Self {
        Self::new(200, Body::Text(s.into()))
    }

    /// An answer calling tool `name` with `args` (id `call_<request seq>`).
    pub fn tool_call(name: impl Into<String>, args: Value) -> Self {
        Self::new(200, Body::ToolCall(name.into(), args))
    }

    /// An answer calling several tools at once (ids `call_<request seq>_<n>`).
    pub fn tool_calls(calls: Vec<(&str, Value)>) -> Self {
        Self::new(
            200,
            Body::ToolCalls(calls.into_iter().map(|(n, a)| (n.to_string(), a)).collect()),
        )
    }

    /// Any status with this JSON body, sent as is (e.g. `{"error":{"message":"…"}}`).
    pub fn status(code: u16, body: Value) -> Self {
        Self::new(code, Body::Raw(body))
    }

    /// Token usage to report (default 100 prompt, 20 completion).
    pub fn usage(mut self, prompt: u64, completion: u64) -> Self {
        self.usage = (prompt, completion);
        self
    }

    /// Adds `Retry-After: secs`.
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// Waits this long before answering.
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = Some(d);
        self
    }

    fn render(&self, req: &FakeRequest) -> Value {
        let (p, c) = self.usage;
        let model = req.body["model"].clone();
        let id = format!("call_{}", req.seq);
        if req.is_anthropic() {
            let (content, stop) = match &self.body {
                Body::Text(t) => (json!([{"type": "text", "text": t}]), "end_turn"),
                Body::ToolCall(name, args) => (
                    json!([{"type": "tool_use", "id": id, "name": name, "input": args}]),
                    "tool_use",
                ),
                Body::ToolCalls(calls) => (
                    calls
                        .iter()
                        .enumerate()
                        .map(|(i, (name, args))| {
                            json!({"type": "tool_use", "id": format!("{id}_{i}"), "name": name, "input": args})
                        })
                        .collect(),
                    "tool_use",
                ),
                Body::Raw(v) => return v.clone(),
            };
            json!({
                "id": format!("msg_{}", req.seq), "type": "message", "role": "assistant",
                "model": model, "content": content, "stop_reason": stop,
                "stop_sequence": null, "usage": {"input_tokens": p, "output_tokens": c},
            })
        } else {
            let (message, finish) = match &self.body {
                Body::Text(t) => (json!({"role": "assistant", "content": t}), "stop"),
                Body::ToolCall(name, args) => (
                    json!({"role": "assistant", "content": null, "tool_calls": [{
                        "id": id, "type": "function",
                        "function": {"name": name, "arguments": args.to_string()},
                    }]}),
                    "tool_calls",
                ),
                Body::ToolCalls(calls) => (
                    json!({"role": "assistant", "content": null, "tool_calls": calls
                        .iter()
                        .enumerate()
                        .map(|(i, (name, args))| json!({
                            "id": format!("{id}_{i}"), "type": "function",
                            "function": {"name": name, "arguments": args.to_string()},
                        }))
                        .collect::<Vec<_>>()}),
                    "tool_calls",
                ),
                Body::Raw(v) => return v.clone(),
            };
            json!({
                "id": format!("chatcmpl-{}", req.seq), "object": "chat.completion",
                "created": 0, "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
            })
        }
    }
}

type Script = dyn Fn(&FakeRequest) -> FakeReply + Send + Sync;

struct Shared {
    script: Box<Script>,
    requests: Mutex<Vec<FakeRequest>>,
}

/// A running fake LLM server; stops when dropped.
pub struct FakeLlm {
    server: Server,
    shared: Arc<Shared>,
}

impl FakeLlm {
    /// Starts the server on an ephemeral loopback port; `script` answers every request.
    pub fn start(script: impl Fn(&FakeRequest) -> FakeReply + Send + Sync + 'static) -> Self {
        let shared = Arc::new(Shared {
            script: Box::new(script),
            requests: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let opts = Options {
            max_body: MAX_BODY,
            ..Options::plain("fake LLM")
        };
        let server = Server::start(opts, move |req| serve(req, &s)).expect("start the fake LLM");
        Self { server, shared }
    }

    /// A server that answers the model's turns in order: turn `n` (the assistant turns the
    /// request already holds) gets `turns[n]`, and every turn past the end the last one.
    pub fn script(turns: Vec<FakeReply>) -> Self {
        assert!(!turns.is_empty(), "a script needs at least one reply");
        Self::start(move |req| {
            let n = req.assistant_turns().min(turns.len() - 1);
            turns[n].clone()
        })
    }

    /// OpenAI-style base URL: `http://127.0.0.1:PORT/v1`.
    pub fn url(&self) -> String {
        format!("{}/v1", self.base())
    }

    /// Anthropic-style base URL: `http://127.0.0.1:PORT`.
    pub fn base(&self) -> String {
        format!("http://{}", self.server.addr())
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<FakeRequest> {
        self.shared.requests.locked().clone()
    }

    /// The number of requests received so far.
    pub fn count(&self) -> usize {
        self.shared.requests.locked().len()
    }
}

/// Records a request, asks the script, answers in the request's wire format.
fn serve(req: crate::http::Request, shared: &Shared) -> Response {
    let req = {
        let mut reqs = shared.requests.locked();
        let req = FakeRequest {
            method: req.method,
            path: req.target,
            headers: req.headers.into_iter().collect(),
            body: serde_json::from_slice(&req.body).unwrap_or(Value::Null),
            seq: reqs.len() + 1,
            choice: 0,
        };
        reqs.push(req.clone());
        req
    };
    let reply = (shared.script)(&req);
    if let Some(d) = reply.delay {
        std::thread::sleep(d);
    }
    let mut body = reply.render(&req);
    let n = req.body["n"].as_u64().unwrap_or(1) as usize;
    // A raw answer is the server's whole answer: it stands for a server that ignores `n`.
    let raw = matches!(reply.body, Body::Raw(_));
    if n > 1 && !req.is_anthropic() && reply.status == 200 && !raw {
        more_choices(&mut body, &req, n, shared);
    }
    let stream = req.body["stream"] == json!(true) && !req.is_anthropic();
    let out = if stream && reply.status == 200 && !raw {
        Response::new(200, events(&body)).header("content-type", "text/event-stream")
    } else {
        Response::json(reply.status, &body)
    };
    match reply.retry_after {
        Some(s) => out.header("retry-after", s.to_string()),
        None => out,
    }
}

/// OpenAI's `n`: the other answers to the same prompt, one script call each, as `choices[1..]`;
/// the usage counts the prompt once and every answer's tokens.
fn more_choices(body: &mut Value, req: &FakeRequest, n: usize, shared: &Shared) {
    for choice in 1..n {
        let other = FakeRequest {
            choice,
            ..req.clone()
        };
        let answer = (shared.script)(&other).render(&other);
        let Some(mut c) = answer["choices"].get(0).cloned() else {
            continue;
        };
        c["index"] = json!(choice);
        let tokens = answer["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        if let Some(choices) = body["choices"].as_array_mut() {
            choices.push(c);
        }
        let usage = &mut body["usage"];
        usage["completion_tokens"] =
            json!(usage["completion_tokens"].as_u64().unwrap_or(0) + tokens);
        usage["total_tokens"] = json!(
            usage["prompt_tokens"].as_u64().unwrap_or(0)
                + usage["completion_tokens"].as_u64().unwrap_or(0)
        );
    }
}

/// A Chat Completions answer as OpenAI streams it (`stream: true`): for each answer, a piece
/// with its role, one with its text, one per tool call, and one with its `finish_reason`; then
/// the usage; then `[DONE]`.
fn events(answer: &Value) -> Vec<u8> {
    let mut out = String::new();
    let mut push = |v: Value| out.push_str(&format!("data: {v}\n\n"));
    for c in answer["choices"].as_array().into_iter().flatten() {
        let i = &c["index"];
        let m = &c["message"];
        let piece = |delta: Value, finish: Value| {
            json!({"object": "chat.completion.chunk",
                   "choices": [{"index": i, "delta": delta, "finish_reason": finish}]})
        };
        push(piece(
            json!({"role": "assistant", "content": null}),
            Value::Null,
        ));
        if let Some(text) = m["content"].as_str() {
            push(piece(json!({"content": text}), Value::Null));
        }
        for (k, call) in m["tool_calls"].as_array().into_iter().flatten().enumerate() {
            push(piece(
                json!({"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                       "function": call["function"]}]}),
                Value::Null,
            ));
        }
        push(piece(json!({}), c["finish_reason"].clone()));
    }
    push(json!({"object": "chat.completion.chunk", "choices": [], "usage": answer["usage"]}));
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}
