//! The real clients against `testkit::fake_llm`, and snapshots of the request bodies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::fake_llm::{FakeLlm, FakeReply, FakeRequest};

use super::config::{Resolved, ToolMode};
use super::*;

const KEY: &str = "sk-test-SECRET-0123456789";

/// System prompt, a user message, an assistant message with one tool call, its result and
/// two tools.
pub(crate) fn fixed_request() -> Request {
    Request {
        system: "You are a coding agent.".into(),
        messages: vec![
            Message::user("Fix the build."),
            Message {
                role: Role::Assistant,
                content: "Let me look.".into(),
                tool_calls: vec![ToolUse {
                    id: "call_1".into(),
                    name: "read_file".into(),
                    arguments: r#"{"path":"src/main.rs"}"#.into(),
                }],
                tool_call_id: String::new(),
            },
            Message::tool("call_1", "fn main() {}"),
        ],
        tools: vec![
            ToolSpec {
                name: "read_file".into(),
                description: "Read a file.".into(),
                parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
            },
            ToolSpec {
                name: "run".into(),
                description: "Run a command.".into(),
                parameters: json!({"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}),
            },
        ],
        response_schema: None,
        temperature: None,
        seed: None,
        share: None,
        text: Default::default(),
        replies_before: 0,
        max_tokens: 1024,
    }
}

pub(crate) fn simple_request() -> Request {
    Request {
        system: "sys".into(),
        messages: vec![Message::user("hi")],
        tools: fixed_request().tools,
        response_schema: None,
        temperature: None,
        seed: None,
        share: None,
        text: Default::default(),
        replies_before: 0,
        max_tokens: 256,
    }
}

/// A config pointing `provider` at `url` with the test key.
pub(crate) fn cfg(provider: &str, url: &str) -> LlmConfig {
    let mut c = LlmConfig {
        timeout: Some("5s".into()),
        max_retries: Some(3),
        ..Default::default()
    };
    c.providers.insert(
        provider.into(),
        ProviderConfig {
            base_url: Some(url.into()),
            api_key: Some(ApiKey::new(KEY)),
            api_key_env: None,
        },
    );
    c
}

fn openai(llm: &FakeLlm) -> Arc<dyn Provider> {
    connect(
        &ModelSpec::parse("openai:gpt-test").unwrap(),
        &cfg("openai", &llm.url()),
        &Default::default(),
    )
    .unwrap()
}

fn anthropic(llm: &FakeLlm) -> Arc<dyn Provider> {
    connect(
        &ModelSpec::parse("anthropic:claude-test").unwrap(),
        &cfg("anthropic", &llm.base()),
        &Default::default(),
    )
    .unwrap()
}

/// Answers a tool call first, then text.
fn two_step(req: &FakeRequest) -> FakeReply {
    if req.assistant_turns() == 0 {
        FakeReply::tool_call("read_file", json!({"path": "a.txt"})).usage(123, 45)
    } else {
        FakeReply::text(format!(
            "it says {}",
            req.last_tool_result_text().unwrap_or_default()
        ))
    }
}

async fn round_trip(p: &dyn Provider, llm: &FakeLlm) {
    let mut req = simple_request();
    let r = p.complete(&req).await.unwrap();
    assert_eq!(r.usage.prompt_tokens, 123);
    assert_eq!(r.usage.completion_tokens, 45);
    assert_eq!(r.message.role, Role::Assistant);
    assert_eq!(r.message.tool_calls.len(), 1);
    let call = &r.message.tool_calls[0];
    assert_eq!(call.id, "call_1");
    assert_eq!(call.name, "read_file");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&call.arguments).unwrap(),
        json!({"path": "a.txt"})
    );
    req.messages.push(r.message.clone());
    req.messages.push(Message::tool(&call.id, "hello"));
    let r = p.complete(&req).await.unwrap();
    assert_eq!(r.message.content, "it says hello");
    assert!(r.message.tool_calls.is_empty());
    assert_eq!(
        (r.usage.prompt_tokens, r.usage.completion_tokens),
        (100, 20)
    );
    assert_eq!(llm.count(), 2);
}

#[tokio::test]
async fn openai_round_trip() {
    let llm = FakeLlm::start(two_step);
    round_trip(openai(&llm).as_ref(), &llm).await;
    let reqs = llm.requests();
    assert_eq!(reqs[0].path, "/v1/chat/completions");
    assert_eq!(
        reqs[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(reqs[0].header("content-type"), Some("application/json"));
    // Not api.openai.com: the classic field.
    assert_eq!(reqs[0].body["max_tokens"], 256);
    assert_eq!(reqs[0].body["model"], "gpt-test");
    assert_eq!(reqs[1].body["messages"][3]["role"], "tool");
}

#[tokio::test]
async fn anthropic_round_trip() {
    let llm = FakeLlm::start(two_step);
    round_trip(anthropic(&llm).as_ref(), &llm).await;
    let reqs = llm.requests();
    assert_eq!(reqs[0].path, "/v1/messages");
    assert_eq!(reqs[0].header("x-api-key"), Some(KEY));
    assert_eq!(reqs[0].header("anthropic-version"), Some("2023-06-01"));
    assert!(reqs[0].header("authorization").is_none());
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let llm = FakeLlm::start(|r| match r.seq {
        1 => FakeReply::status(429, json!({"error": {"message": "slow down"}})).retry_after(1),
        _ => FakeReply::text("ok"),
    });
    let start = Instant::now();
    let r = openai(&llm).complete(&simple_request()).await.unwrap();
    assert_eq!(r.message.content, "ok");
    assert_eq!(llm.count(), 2);
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn server_error_is_retried() {
    let llm = FakeLlm::start(|r| match r.seq {
        1 => FakeReply::status(500, json!({"error": {"message": "oops"}})),
        2 => FakeReply::status(
            529,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ),
        _ => FakeReply::text("ok"),
    });
    let r = anthropic(&llm).complete(&simple_request()).await.unwrap();
    assert_eq!(r.message.content, "ok");
    assert_eq!(llm.count(), 3);
}

#[tokio::test]
async fn retries_give_up() {
    let llm = FakeLlm::start(|_| FakeReply::status(503, json!({"error": {"message": "down"}})));
    let mut c = cfg("openai", &llm.url());
    c.max_retries = Some(1);
    let p = connect(&ModelSpec::parse("gpt-x").unwrap(), &c, &Default::default()).unwrap();
    let e = p.complete(&simple_request()).await.unwrap_err();
    assert!(matches!(e, Error::Http { status: 503, .. }), "{e:?}");
    assert!(
        e.to_string().contains("down") && e.to_string().contains("2 attempts"),
        "{e}"
    );
    assert_eq!(llm.count(), 2);
}

#[tokio::test]
async fn auth_error_is_final_and_hides_the_key() {
    let llm = FakeLlm::start(|_| {
        FakeReply::status(
            401,
            json!({"error": {"message": format!("Incorrect API key provided: {KEY}. Or sk-tes*****6789."), "code": "invalid_api_key"}}),
        )
    });
    let e = openai(&llm).complete(&simple_request()).await.unwrap_err();
    assert_eq!(llm.count(), 1);
    assert!(matches!(e, Error::Auth(_)), "{e:?}");
    assert!(!e.retryable());
    let shown = format!("{e} {e:?}");
    assert!(
        !shown.contains("SECRET") && !shown.contains("6789"),
        "{shown}"
    );
    assert!(
        shown.contains("OPENAI_API_KEY") && shown.contains(&llm.url()),
        "{shown}"
    );
    assert!(shown.contains("Incorrect API key provided"), "{shown}");
}

#[tokio::test]
async fn not_found() {
    let llm = FakeLlm::start(|_| {
        FakeReply::status(
            404,
            json!({"error": {"message": "The model `gpt-test` does not exist"}}),
        )
    });
    let e = openai(&llm).complete(&simple_request()).await.unwrap_err();
    assert!(
        matches!(&e, Error::NotFound(m) if m.contains("does not exist")),
        "{e:?}"
    );
    assert_eq!(llm.count(), 1);
}

#[tokio::test]
async fn context_overflow_is_not_retried() {
    let llm = FakeLlm::start(|r| {
        if r.is_anthropic() {
            FakeReply::status(
                400,
                json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"}}),
            )
        } else {
            FakeReply::status(
                400,
                json!({"error": {"message": "Your input exceeds the limit.", "type": "invalid_request_error", "code": "context_length_exceeded"}}),
            )
        }
    });
    let e = openai(&llm).complete(&simple_request()).await.unwrap_err();
    assert!(matches!(e, Error::ContextOverflow(_)), "{e:?}");
    assert_eq!(llm.count(), 1);
    let e = anthropic(&llm)
        .complete(&simple_request())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::ContextOverflow(m) if m.contains("prompt is too long")),
        "{e:?}"
    );
    assert_eq!(llm.count(), 2);
    // Any other 400 is a plain, final HTTP error.
    let llm = FakeLlm::start(|_| {
        FakeReply::status(400, json!({"error": {"message": "bad tool schema"}}))
    });
    let e = openai(&llm).complete(&simple_request()).await.unwrap_err();
    assert!(
        matches!(&e, Error::Http { status: 400, message } if message.contains("bad tool schema")),
        "{e:?}"
    );
    assert_eq!(llm.count(), 1);
}

#[tokio::test]
async fn slow_answer_times_out_after_retries() {
    let llm = FakeLlm::start(|_| FakeReply::text("late").delay(Duration::from_secs(3)));
    let mut c = cfg("openai", &llm.url());
    c.timeout = Some("300ms".into());
    c.max_retries = Some(1);
    let p = connect(
        &ModelSpec::parse("openai:gpt-test").unwrap(),
        &c,
        &Default::default(),
    )
    .unwrap();
    let start = Instant::now();
    let e = p.complete(&simple_request()).await.unwrap_err();
    assert!(
        matches!(&e, Error::Timeout(m) if m.contains("300ms")),
        "{e:?}"
    );
    assert_eq!(llm.count(), 2);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn unreachable_server_is_a_transport_error() {
    let url = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/v1", l.local_addr().unwrap())
    };
    let mut c = cfg("openai", &url);
    c.max_retries = Some(0);
    let p = connect(
        &ModelSpec::parse("openai:gpt-test").unwrap(),
        &c,
        &Default::default(),
    )
    .unwrap();
    let e = p.complete(&simple_request()).await.unwrap_err();
    assert!(
        matches!(&e, Error::Transport(m) if m.contains("cannot reach")),
        "{e:?}"
    );
    assert!(e.retryable());
}

#[tokio::test]
async fn garbage_answer_is_a_decode_error() {
    let llm = FakeLlm::start(|_| FakeReply::status(200, json!({"unexpected": true})));
    let e = openai(&llm).complete(&simple_request()).await.unwrap_err();
    assert!(
        matches!(&e, Error::Decode(m) if m.contains("choices")),
        "{e:?}"
    );
}

#[test]
fn openai_body_snapshot() {
    let body = openai::build_body("gpt-4.1", &fixed_request(), "max_completion_tokens", 1024);
    assert_eq!(
        body,
        json!({
            "model": "gpt-4.1",
            "messages": [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Fix the build."},
                {"role": "assistant", "content": "Let me look.", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "read_file", "arguments": "{\"path\":\"src/main.rs\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "fn main() {}"}
            ],
            "tools": [
                {"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                 "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
                {"type": "function", "function": {"name": "run", "description": "Run a command.",
                 "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}
            ],
            "max_completion_tokens": 1024
        })
    );
}

#[test]
fn anthropic_body_snapshot() {
    let body = anthropic::build_body("claude-sonnet-4-5", &fixed_request(), 1024);
    assert_eq!(
        body,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "system": "You are a coding agent.",
            "messages": [
                {"role": "user", "content": "Fix the build."},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "src/main.rs"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "fn main() {}"}
                ]}
            ],
            "tools": [
                {"name": "read_file", "description": "Read a file.",
                 "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
                {"name": "run", "description": "Run a command.",
                 "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
            ]
        })
    );
}

#[test]
fn anthropic_merges_tool_results_and_repairs_arguments() {
    let mut req = fixed_request();
    req.system.clear();
    req.tools.clear();
    req.messages[1].content.clear();
    req.messages[1].tool_calls.push(ToolUse {
        id: "call_2".into(),
        name: "run".into(),
        arguments: "{not json".into(),
    });
    req.messages.push(Message::tool("call_2", "ok"));
    req.messages.push(Message::user("Note: the worker moved."));
    let body = anthropic::build_body("m", &req, 10);
    assert!(body.get("system").is_none() && body.get("tools").is_none());
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": "Fix the build."},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "src/main.rs"}},
                {"type": "tool_use", "id": "call_2", "name": "run", "input": {}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "fn main() {}"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": "ok"},
                {"type": "text", "text": "Note: the worker moved."}
            ]}
        ])
    );
}

#[test]
fn openai_field_for_api_openai_com() {
    let resolved = |url: &str| Resolved {
        base_url: url.into(),
        key: Some(ApiKey::new(KEY)),
        key_hint: "set OPENAI_API_KEY".into(),
        timeout: Duration::from_secs(1),
        max_retries: 0,
        max_tokens_cap: None,
        tool_mode: ToolMode::Native,
        constrain: Default::default(),
    };
    let p = OpenAi::new("gpt-4.1", resolved("https://api.openai.com/v1"), None).unwrap();
    assert_eq!(p.max_tokens_field(), "max_completion_tokens");
    let p = OpenAi::new("llama", resolved("http://127.0.0.1:11434/v1"), None).unwrap();
    assert_eq!(p.max_tokens_field(), "max_tokens");
}

#[test]
fn openai_response_variants() {
    let r = openai::parse_response(&json!({
        "choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "ls", "arguments": {"p": 1}}}
        ]}}]
    }))
    .unwrap();
    assert_eq!(r.message.content, "");
    assert_eq!(r.message.tool_calls[0].arguments, r#"{"p":1}"#);
    assert_eq!(r.usage, Usage::default());
    assert!(openai::parse_response(&json!({"choices": []})).is_err());
}

/// `of` requests of one group that are the same but for their seed, each through its own
/// provider (as each attempt has its own) over one [`Together`].
async fn ask_together(llm: &FakeLlm, of: u32, temperature: [Option<f32>; 3]) -> Vec<Response> {
    let together: Arc<Together> = Arc::default();
    let asks = (0..3u64).map(|i| {
        let p = connect(
            &ModelSpec::parse("openai:gpt-test").unwrap(),
            &cfg("openai", &llm.url()),
            &together,
        )
        .unwrap();
        let req = Request {
            seed: Some(100 + i),
            temperature: temperature[i as usize],
            share: Some(Share { group: 7, of }),
            ..simple_request()
        };
        async move { p.complete(&req).await.unwrap() }
    });
    futures_util::future::join_all(asks).await
}

#[tokio::test]
async fn first_turns_started_together_are_asked_as_one_request_for_that_many_answers() {
    let llm =
        FakeLlm::start(|req| FakeReply::text(format!("answer {}", req.choice)).usage(900, 10));
    let answers = ask_together(&llm, 3, [Some(0.9); 3]).await;
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1, "one request for the three: {reqs:?}");
    assert_eq!(reqs[0].body["n"], json!(3));
    assert!(
        reqs[0].body.get("seed").is_none(),
        "each answer samples with its own seed"
    );
    assert!((reqs[0].body["temperature"].as_f64().unwrap() - 0.9).abs() < 1e-6);
    let mut texts: Vec<String> = answers.iter().map(|r| r.message.content.clone()).collect();
    texts.sort();
    assert_eq!(texts, ["answer 0", "answer 1", "answer 2"]);
    // Streamed, each answer as soon as it is complete.
    assert_eq!(reqs[0].body["stream"], json!(true));
    // The prompt was read once: shared out, never counted three times.
    let prompt: u64 = answers.iter().map(|r| r.usage.prompt_tokens).sum();
    assert!(prompt <= 900, "{prompt}");
    assert!(answers.iter().all(|r| r.usage.completion_tokens > 0));
}

#[tokio::test]
async fn requests_that_differ_beyond_the_seed_are_not_asked_together() {
    let llm = FakeLlm::start(|req| FakeReply::text(format!("answer {}", req.choice)));
    let answers = ask_together(&llm, 2, [None, Some(0.9), Some(0.9)]).await;
    assert_eq!(answers.len(), 3);
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    let alone = reqs.iter().find(|r| r.body.get("n").is_none()).unwrap();
    assert!(alone.body.get("temperature").is_none());
    assert_eq!(alone.body["seed"], json!(100), "alone, it keeps its seed");
    let two = reqs.iter().find(|r| r.body["n"] == json!(2)).unwrap();
    assert!((two.body["temperature"].as_f64().unwrap() - 0.9).abs() < 1e-6);
}

#[tokio::test]
async fn a_server_that_ignores_n_and_stream_still_answers_every_request() {
    // Like a server without `n` or streaming: one plain answer, whatever is asked.
    let llm = FakeLlm::start(|req| {
        let text = format!("seed {}", req.body["seed"]);
        FakeReply::status(
            200,
            json!({"choices": [{"index": 0, "message": {
            "role": "assistant", "content": text}}], "usage": {}}),
        )
    });
    let answers = ask_together(&llm, 3, [Some(0.9); 3]).await;
    let mut texts: Vec<String> = answers.iter().map(|r| r.message.content.clone()).collect();
    texts.sort();
    // Nothing usable came back for the group: each asked alone, with its own seed.
    assert_eq!(texts, ["seed 100", "seed 101", "seed 102"]);
    assert_eq!(llm.count(), 4);
}
