//! OpenAI Chat Completions (`POST {base}/chat/completions`), also used for Ollama and any
//! OpenAI-compatible server.

use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde_json::{Value, json};

use super::config::{Resolved, max_tokens};
use super::http::Http;
use super::together::Together;
use super::types::{Error, Malformed, Message, Provider, Request, Response, Role, ToolUse, Usage};

/// A Chat Completions client for one model.
///
/// The answer's size limit is sent as `max_completion_tokens` to `api.openai.com` (its newer
/// models refuse `max_tokens`) and as `max_tokens` to every other server (Ollama, vLLM,
/// DeepSeek and most compatible servers know only that one).
pub struct OpenAi {
    http: Http,
    model: String,
    url: String,
    max_tokens_cap: Option<u32>,
    /// Where first turns of attempts started together are asked together.
    together: Option<std::sync::Arc<Together>>,
}

impl OpenAi {
    pub(crate) fn new(
        model: &str,
        r: Resolved,
        together: Option<std::sync::Arc<Together>>,
    ) -> Result<Self, Error> {
        Ok(Self {
            http: Http::new(model, &r)?,
            model: model.to_string(),
            url: format!("{}/chat/completions", r.base_url),
            max_tokens_cap: r.max_tokens_cap,
            together,
        })
    }

    pub(crate) fn max_tokens_field(&self) -> &'static str {
        if self.http.base_url.contains("://api.openai.com") {
            "max_completion_tokens"
        } else {
            "max_tokens"
        }
    }
}

#[async_trait::async_trait]
impl Provider for OpenAi {
    async fn complete(&self, req: &Request) -> Result<Response, Error> {
        let body = build_body(
            &self.model,
            req,
            self.max_tokens_field(),
            max_tokens(req.max_tokens, self.max_tokens_cap),
        );
        let mut headers = HeaderMap::new();
        if let Some(key) = self.http.key() {
            let v = self
                .http
                .secret_header(&format!("Bearer {}", key.expose()))?;
            headers.insert(AUTHORIZATION, v);
        }
        if let (Some(share), Some(together)) = (req.share, &self.together) {
            let mut shared = body.clone();
            if let Some(o) = shared.as_object_mut() {
                o.remove("seed");
            }
            let send = |b: Value| {
                let headers = headers.clone();
                async move { self.http.post_events(&self.url, headers, &b).await }
            };
            // Without an answer from the group's request, it asks alone (below).
            if let Some(answer) = together.ask(&self.url, share, shared, send).await {
                return parse_response(&answer)
                    .map_err(|e| Error::Decode(format!("{}: {e}", self.url)));
            }
        }
        let answer = self.http.post_json(&self.url, headers, &body).await?;
        parse_response(&answer).map_err(|e| Error::Decode(format!("{}: {e}", self.url)))
    }
}

/// The request body.
pub(crate) fn build_body(
    model: &str,
    req: &Request,
    max_tokens_field: &str,
    max_tokens: u32,
) -> Value {
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if !req.system.is_empty() {
        messages.push(json!({"role": "system", "content": req.system}));
    }
    messages.extend(req.messages.iter().map(message));
    let mut body = json!({"model": model, "messages": messages});
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters,
                }})
            })
            .collect();
    }
    if let Some(schema) = &req.response_schema {
        body["response_format"] = json!({"type": "json_schema", "json_schema": {
            "name": "tool_call", "schema": schema,
        }});
    }
    if let Some(t) = req.temperature {
        body["temperature"] = json!(t);
    }
    if let Some(seed) = req.seed {
        body["seed"] = json!(seed);
    }
    body[max_tokens_field] = json!(max_tokens);
    body
}

fn message(m: &Message) -> Value {
    match m.role {
        Role::User => json!({"role": "user", "content": m.content}),
        Role::Tool => json!({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}),
        Role::Assistant if m.tool_calls.is_empty() => {
            json!({"role": "assistant", "content": m.content})
        }
        Role::Assistant => {
            let content = if m.content.is_empty() {
                Value::Null
            } else {
                json!(m.content)
            };
            let calls: Vec<Value> = m
                .tool_calls
                .iter()
                .map(|c| {
                    json!({"id": c.id, "type": "function",
                           "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
            json!({"role": "assistant", "content": content, "tool_calls": calls})
        }
    }
}

/// Reads `choices[0].message` and `usage`.
pub(crate) fn parse_response(v: &Value) -> Result<Response, Malformed> {
    let msg = v["choices"]
        .get(0)
        .map(|c| &c["message"])
        .filter(|m| m.is_object())
        .ok_or(Malformed::Missing("choices[0].message"))?;
    let content = match &msg["content"] {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => return Err(Malformed::NotText(other.clone())),
    };
    let mut tool_calls = Vec::new();
    if let Some(calls) = msg["tool_calls"].as_array() {
        for (i, c) in calls.iter().enumerate() {
            let f = &c["function"];
            let name = f["name"].as_str().ok_or_else(|| Malformed::CallField {
                call: format!("tool_calls[{i}]"),
                field: "function.name".into(),
            })?;
            let arguments = match &f["arguments"] {
                Value::String(s) => s.clone(),
                Value::Null => "{}".to_string(),
                // Some compatible servers send an object.
                other => other.to_string(),
            };
            let id = c["id"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .unwrap_or_else(|| format!("call_{i}"));
            tool_calls.push(ToolUse {
                id,
                name: name.to_string(),
                arguments,
            });
        }
    }
    let usage = Usage {
        prompt_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
        completion_tokens: v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
    };
    Ok(Response::new(content, tool_calls, usage))
}
