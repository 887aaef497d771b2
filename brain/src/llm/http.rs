//! The HTTP layer shared by the providers: one client per provider, JSON POST with bounded
//! bodies, error classification, and retries with exponential backoff and full jitter.

use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use serde_json::Value;

use super::config::{ApiKey, CONNECT_TIMEOUT, Resolved};
use super::together::Events;
use super::types::Error;

/// Largest response body we read.
const MAX_BODY: usize = 8 << 20;
/// Longest provider error text we keep.
const MAX_MESSAGE: usize = 500;
const BACKOFF_BASE: Duration = Duration::from_millis(500);
const BACKOFF_CAP: Duration = Duration::from_secs(30);
const RETRY_AFTER_CAP: Duration = Duration::from_secs(60);

/// A provider's HTTP client and what its errors should say.
pub(crate) struct Http {
    client: reqwest::Client,
    /// Named in errors; never holds a key.
    pub base_url: String,
    model: String,
    key: Option<ApiKey>,
    key_hint: String,
    timeout: Duration,
    max_retries: u32,
}

impl Http {
    pub fn new(model: &str, r: &Resolved) -> Result<Self, Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(r.timeout)
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {}", chain(&e))))?;
        Ok(Self {
            client,
            base_url: r.base_url.clone(),
            model: model.to_string(),
            key: r.key.clone(),
            key_hint: r.key_hint.clone(),
            timeout: r.timeout,
            max_retries: r.max_retries,
        })
    }

    /// The key, if the provider has one.
    pub fn key(&self) -> Option<&ApiKey> {
        self.key.as_ref()
    }

    /// A header value holding a secret: marked sensitive so nothing prints it.
    pub fn secret_header(&self, value: &str) -> Result<HeaderValue, Error> {
        let mut v = HeaderValue::from_str(value).map_err(|_| {
            Error::Config(format!(
                "the API key for {} has characters a header cannot carry: {}",
                self.base_url, self.key_hint
            ))
        })?;
        v.set_sensitive(true);
        Ok(v)
    }

    /// POSTs `body` to `url` and returns the JSON answer, retrying transient failures.
    pub async fn post_json(
        &self,
        url: &str,
        headers: HeaderMap,
        body: &Value,
    ) -> Result<Value, Error> {
        let body = serde_json::to_vec(body)
            .map_err(|e| Error::Decode(format!("cannot encode the request: {e}")))?;
        let mut attempt = 0;
        loop {
            let (err, retry_after) = match self.attempt(url, &headers, &body).await {
                Ok(v) => return Ok(v),
                Err(f) => f,
            };
            if !err.retryable() || attempt >= self.max_retries {
                return Err(if attempt > 0 {
                    annotate(err, attempt + 1)
                } else {
                    err
                });
            }
            let wait = retry_after.unwrap_or_else(|| backoff(attempt));
            attempt += 1;
            let status = match &err {
                Error::Http { status, .. } => status.to_string(),
                Error::Timeout(_) => "timeout".into(),
                _ => "transport".into(),
            };
            tracing::warn!(
                %url, %status, attempt, max_retries = self.max_retries,
                wait_ms = wait.as_millis() as u64, "LLM call failed; retrying"
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// One attempt; on failure, the error and the server's `Retry-After`.
    async fn attempt(
        &self,
        url: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Value, (Error, Option<Duration>)> {
        let resp = self
            .send(url, headers.clone(), body.to_vec())
            .await
            .map_err(|e| (e, None))?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|s| Duration::from_secs(s).min(RETRY_AFTER_CAP));
        let bytes = read_body(resp)
            .await
            .map_err(|e| (self.body_error(url, e), None))?;
        if (200..300).contains(&status) {
            return serde_json::from_slice(&bytes).map_err(|e| {
                let text = bounded(&String::from_utf8_lossy(&bytes), 200);
                (
                    Error::Decode(format!(
                        "{url} answered {status} with a body that is not JSON ({e}): {text}"
                    )),
                    None,
                )
            });
        }
        Err((self.classify(url, status, &bytes), retry_after))
    }

    /// POSTs `body` once (no retries: the caller has another way to an answer) and reads
    /// the answer as server-sent events: each `data:` line's JSON, up to `data: [DONE]` or
    /// the end, bounded like any answer.
    pub async fn post_events(
        &self,
        url: &str,
        headers: HeaderMap,
        body: &Value,
    ) -> Result<Events, Error> {
        let body = serde_json::to_vec(body)
            .map_err(|e| Error::Decode(format!("cannot encode the request: {e}")))?;
        let resp = self.send(url, headers, body).await?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let bytes = read_body(resp).await.map_err(|e| self.body_error(url, e))?;
            return Err(self.classify(url, status, &bytes));
        }
        let lines = Lines {
            resp: Some(resp),
            buf: Vec::new(),
            read: 0,
            url: url.to_string(),
        };
        Ok(Box::pin(futures_util::stream::unfold(
            lines,
            |mut lines| async move { lines.next().await.map(|event| (event, lines)) },
        )))
    }

    /// POSTs a JSON `body` with `headers`; a transport failure is told without the key.
    async fn send(
        &self,
        url: &str,
        headers: HeaderMap,
        body: Vec<u8>,
    ) -> Result<reqwest::Response, Error> {
        self.client
            .post(url)
            .headers(headers)
            .header(CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport(url, &e))
    }

    fn transport(&self, url: &str, e: &reqwest::Error) -> Error {
        if e.is_timeout() {
            Error::Timeout(format!(
                "no answer from {url} within {}: the model may be slow or the server stuck; \
                 raise [llm] timeout if answers are long",
                humantime::format_duration(self.timeout)
            ))
        } else {
            Error::Transport(format!(
                "cannot reach {url}: {}: check the base URL and that the server is up",
                chain(e)
            ))
        }
    }

    fn body_error(&self, url: &str, e: BodyError) -> Error {
        match e {
            BodyError::TooLarge => Error::Decode(format!(
                "{url} sent a response larger than {} MiB",
                MAX_BODY >> 20
            )),
            BodyError::Read(e) => self.transport(url, &e),
        }
    }

    /// Maps a non-2xx answer to an error.
    fn classify(&self, url: &str, status: u16, body: &[u8]) -> Error {
        let (message, code) = error_message(body);
        let message = self.redact(&message);
        let detail = if message.is_empty() {
            String::new()
        } else {
            format!(" ({message})")
        };
        let lower = message.to_lowercase();
        match status {
            401 | 403 => Error::Auth(format!(
                "the API key was refused by {} ({status}{}{message}): {}",
                self.base_url,
                if message.is_empty() { "" } else { ": " },
                self.key_hint
            )),
            404 => Error::NotFound(format!(
                "{url} answered 404{detail}: check the model name `{}` and the base URL",
                self.model
            )),
            400 | 413
                if code.as_deref() == Some("context_length_exceeded")
                    || lower.contains("context length")
                    || lower.contains("maximum context")
                    || lower.contains("context window")
                    || lower.contains("prompt is too long") =>
            {
                Error::ContextOverflow(format!(
                    "the prompt is longer than the context window of `{}`{detail}: shorten the \
                     conversation or use a model with a larger window",
                    self.model
                ))
            }
            _ if message.is_empty() => Error::Http {
                status,
                message: format!("{url} (no error message)"),
            },
            _ => Error::Http {
                status,
                message: format!("{url}: {message}"),
            },
        }
    }

    /// Removes the key and anything that looks like a (masked) key from provider text.
    fn redact(&self, text: &str) -> String {
        let text = match &self.key {
            Some(k) if !k.expose().is_empty() => text.replace(k.expose(), "<redacted>"),
            _ => text.to_string(),
        };
        text.split(' ')
            .map(|w| {
                if w.starts_with("sk-") || w.contains('*') {
                    "<redacted>"
                } else {
                    w
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// An event stream being read: the lines not yet taken, and how much was read.
struct Lines {
    resp: Option<reqwest::Response>,
    buf: Vec<u8>,
    read: usize,
    url: String,
}

impl Lines {
    async fn next(&mut self) -> Option<Result<Value, Error>> {
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line);
                let Some(data) = line.trim().strip_prefix("data:") else {
                    continue;
                };
                let data = data.trim();
                if data == "[DONE]" {
                    self.resp = None;
                    self.buf.clear();
                    return None;
                }
                return Some(serde_json::from_str(data).map_err(|e| {
                    Error::Decode(format!("{}: a streamed event is not JSON ({e})", self.url))
                }));
            }
            let resp = self.resp.as_mut()?;
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    self.read += chunk.len();
                    if self.read > MAX_BODY {
                        self.resp = None;
                        return Some(Err(Error::Decode(format!(
                            "{} sent a response larger than {} MiB",
                            self.url,
                            MAX_BODY >> 20
                        ))));
                    }
                    self.buf.extend_from_slice(&chunk);
                }
                Ok(None) => {
                    self.resp = None;
                    if self.buf.is_empty() {
                        return None;
                    }
                    self.buf.push(b'\n');
                }
                Err(e) => {
                    self.resp = None;
                    return Some(Err(Error::Transport(format!(
                        "{}: the answer was cut off: {}",
                        self.url,
                        chain(&e)
                    ))));
                }
            }
        }
    }
}

enum BodyError {
    TooLarge,
    Read(reqwest::Error),
}

async fn read_body(mut resp: reqwest::Response) -> Result<Vec<u8>, BodyError> {
    if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(BodyError::TooLarge);
    }
    let mut buf = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(BodyError::Read)? {
        if buf.len() + chunk.len() > MAX_BODY {
            return Err(BodyError::TooLarge);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
}

/// The provider's error text and code: `{"error":{"message","code"}}` (OpenAI, Anthropic,
/// Ollama), `{"error":"text"}`, `{"message":"text"}`, else the body itself; bounded.
fn error_message(body: &[u8]) -> (String, Option<String>) {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let err = json.as_ref().map(|j| &j["error"]);
    let code = err.and_then(|e| e["code"].as_str()).map(str::to_string);
    let text = err
        .and_then(|e| e["message"].as_str().or(e.as_str()))
        .or_else(|| json.as_ref().and_then(|j| j["message"].as_str()))
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    (bounded(text.trim(), MAX_MESSAGE), code)
}

/// `text` cut to at most `max` bytes on a char boundary.
fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Full jitter: uniform in [0, min(cap, base · 2^attempt)].
fn backoff(attempt: u32) -> Duration {
    let ceiling = BACKOFF_BASE
        .saturating_mul(1u32 << attempt.min(16))
        .min(BACKOFF_CAP);
    Duration::from_millis(rand::random_range(0..=ceiling.as_millis() as u64))
}

fn annotate(err: Error, attempts: u32) -> Error {
    let note = |m: String| format!("{m} (gave up after {attempts} attempts)");
    match err {
        Error::Http { status, message } => Error::Http {
            status,
            message: note(message),
        },
        Error::Transport(m) => Error::Transport(note(m)),
        Error::Timeout(m) => Error::Timeout(note(m)),
        other => other,
    }
}

/// An error and its sources, joined (reqwest's top-level text alone says little).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        src = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages() {
        let (m, c) = error_message(
            br#"{"error":{"message":"This model's maximum context length is 8192","code":"context_length_exceeded"}}"#,
        );
        assert!(m.starts_with("This model's maximum"));
        assert_eq!(c.as_deref(), Some("context_length_exceeded"));
        assert_eq!(error_message(br#"{"error":"boom"}"#).0, "boom");
        assert_eq!(error_message(b"plain").0, "plain");
        let long = "é".repeat(600);
        let (m, _) = error_message(long.as_bytes());
        assert!(m.len() <= MAX_MESSAGE + '…'.len_utf8());
    }

    #[test]
    fn backoff_bounds() {
        for a in 0..40 {
            assert!(backoff(a) <= BACKOFF_CAP);
        }
        assert!(backoff(0) <= BACKOFF_BASE);
    }
}
