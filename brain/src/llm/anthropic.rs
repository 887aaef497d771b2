//! Anthropic Messages API (`POST {base}/v1/messages`).

use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

use super::config::{Resolved, max_tokens};
use super::http::Http;
use super::types::{Error, Malformed, Message, Provider, Request, Response, Role, ToolUse, Usage};

const VERSION: &str = "2023-06-01";

/// A Messages API client for one model.
pub struct Anthropic {
    http: Http,
    model: String,
    url: String,
    max_tokens_cap: Option<u32>,
}

impl Anthropic {
    pub(crate) fn new(model: &str, r: Resolved) -> Result<Self, Error> {
        Ok(Self {
            http: Http::new(model, &r)?,
            model: model.to_string(),
            url: format!("{}/v1/messages", r.base_url),
            max_tokens_cap: r.max_tokens_cap,
        })
    }
}

#[async_trait::async_trait]
impl Provider for Anthropic {
    async fn complete(&self, req: &Request) -> Result<Response, Error> {
        let body = build_body(
            &self.model,
            req,
            max_tokens(req.max_tokens, self.max_tokens_cap),
        );
        let mut headers = HeaderMap::new();
        if let Some(key) = self.http.key() {
            headers.insert("x-api-key", self.http.secret_header(key.expose())?);
        }
        headers.insert("anthropic-version", HeaderValue::from_static(VERSION));
        let answer = self.http.post_json(&self.url, headers, &body).await?;
        parse_response(&answer).map_err(|e| Error::Decode(format!("{}: {e}", self.url)))
    }
}

/// The request body, within the rules the Messages API enforces beyond its published
/// schema: no message may be empty and no text block may be empty or only whitespace (an
/// empty answer of the model is left out), roles alternate (consecutive messages of one
/// role — tool results, then a note — become one), and in a user turn the tool results come
/// first.
pub(crate) fn build_body(model: &str, req: &Request, max_tokens: u32) -> Value {
    let mut turns: Vec<(&str, Vec<Value>)> = Vec::new();
    for m in &req.messages {
        let (role, blocks) = blocks(m);
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((r, b)) if *r == role => b.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    for (role, blocks) in &mut turns {
        if *role == "user" {
            // Stable: tool results keep their order, and so does the text after them.
            blocks.sort_by_key(|b| b["type"] != "tool_result");
        }
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, blocks)| {
            let content = match blocks.as_slice() {
                [] => json!(""),
                [one] if one["type"] == "text" => one["text"].clone(),
                _ => Value::Array(blocks),
            };
            json!({"role": role, "content": content})
        })
        .collect();
    let mut body = json!({"model": model, "max_tokens": max_tokens});
    if !req.system.is_empty() {
        body["system"] = json!(req.system);
    }
    body["messages"] = Value::Array(messages);
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| {
                json!({"name": t.name, "description": t.description, "input_schema": t.parameters})
            })
            .collect();
    }
    if let Some(t) = req.temperature {
        // Anthropic takes 0.0 to 1.0.
        body["temperature"] = json!(t.clamp(0.0, 1.0));
    }
    body
}

fn blocks(m: &Message) -> (&'static str, Vec<Value>) {
    let text = |t: &str| json!({"type": "text", "text": t});
    let has_text = !m.content.trim().is_empty();
    match m.role {
        Role::User if has_text => ("user", vec![text(&m.content)]),
        Role::User => ("user", vec![]),
        Role::Tool => {
            let content = if has_text {
                m.content.as_str()
            } else {
                "(no output)"
            };
            (
                "user",
                vec![
                    json!({"type": "tool_result", "tool_use_id": m.tool_call_id, "content": content}),
                ],
            )
        }
        Role::Assistant => {
            let mut out = Vec::new();
            if has_text {
                out.push(text(&m.content));
            }
            for c in &m.tool_calls {
                let input = serde_json::from_str::<Value>(&c.arguments)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| json!({}));
                out.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}));
            }
            ("assistant", out)
        }
    }
}

/// Reads the `text` and `tool_use` content blocks (others, e.g. thinking, are skipped) and
/// `usage` (cache reads and writes count as prompt tokens).
pub(crate) fn parse_response(v: &Value) -> Result<Response, Malformed> {
    let blocks = v["content"]
        .as_array()
        .ok_or(Malformed::Missing("content array"))?;
    let mut texts = Vec::new();
    let mut tool_calls = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        match b["type"].as_str() {
            Some("text") => texts.push(b["text"].as_str().unwrap_or_default()),
            Some("tool_use") => {
                let field = |k: &str| {
                    b[k].as_str()
                        .map(str::to_string)
                        .ok_or_else(|| Malformed::CallField {
                            call: format!("content[{i}] (tool_use)"),
                            field: k.to_string(),
                        })
                };
                tool_calls.push(ToolUse {
                    id: field("id")?,
                    name: field("name")?,
                    arguments: if b["input"].is_null() {
                        "{}".to_string()
                    } else {
                        b["input"].to_string()
                    },
                });
            }
            _ => {}
        }
    }
    let u = &v["usage"];
    let n = |k: &str| u[k].as_u64().unwrap_or(0);
    let usage = Usage {
        prompt_tokens: n("input_tokens")
            + n("cache_creation_input_tokens")
            + n("cache_read_input_tokens"),
        completion_tokens: n("output_tokens"),
    };
    Ok(Response::new(texts.join("\n"), tool_calls, usage))
}
