//! Pull requests through GitHub's REST API (`POST /repos/{owner}/{repo}/pulls`, looked up
//! first with `GET .../pulls?head=OWNER:BRANCH`), so opening one again after a crash finds the
//! one already there. The token is the brain's; it goes in the `Authorization` header only.
//! Rate limits (403 or 429 with `Retry-After` or `x-ratelimit-remaining: 0`) are waited out
//! a few times, briefly; a refused token or a validation error is final and said in words.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::Error;

/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts per request when GitHub asks to wait or fails on its side.
const ATTEMPTS: u32 = 3;
/// The longest wait for a rate limit before giving up.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// Most of an answer read.
const MAX_ANSWER: usize = 4 << 20;

/// A pull request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRequest {
    pub url: String,
    pub number: u64,
}

/// What to open.
#[derive(Debug, Clone)]
pub struct Open<'a> {
    pub owner: &'a str,
    pub repo: &'a str,
    /// The branch with the changes (in the same repository) and the one to merge into.
    pub head: &'a str,
    pub base: &'a str,
    pub title: &'a str,
    pub body: &'a str,
    pub draft: bool,
}

/// A GitHub API client.
pub struct Github {
    client: reqwest::Client,
    api: String,
    token: String,
}

impl std::fmt::Debug for Github {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Github").field("api", &self.api).finish()
    }
}

/// The owner and repository a remote URL names (`https://github.com/o/r.git`,
/// `git@github.com:o/r.git`, or any URL whose path ends in `o/r`).
pub fn repo_of(url: &str) -> Option<(String, String)> {
    let path = match url.split_once("://") {
        Some((_, rest)) => rest.split_once('/')?.1,
        None => url.split_once(':')?.1,
    };
    let mut parts = path.trim_end_matches('/').rsplit('/');
    let repo = parts.next()?.trim_end_matches(".git");
    let owner = parts.next()?;
    let ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    (ok(owner) && ok(repo)).then(|| (owner.to_string(), repo.to_string()))
}

impl Github {
    pub fn new(api: &str, token: &str) -> Result<Self, Error> {
        if token.is_empty() {
            return Err(Error::Invalid(
                "no GitHub token: set [deliver] github_token_env (default GITHUB_TOKEN) to a token that may open pull requests".into(),
            ));
        }
        let client = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("tether/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Invalid(format!("HTTP client: {e}")))?;
        Ok(Self {
            client,
            api: api.trim_end_matches('/').to_string(),
            token: token.to_string(),
        })
    }

    /// The open pull request from `head` into `base`, if there is one.
    pub async fn find(
        &self,
        owner: &str,
        repo: &str,
        head: &str,
        base: &str,
    ) -> Result<Option<PullRequest>, Error> {
        let url = format!("{}/repos/{owner}/{repo}/pulls", self.api);
        let query = [
            ("head", format!("{owner}:{head}")),
            ("base", base.to_string()),
            ("state", "open".to_string()),
        ];
        let (_, v) = self
            .send(
                || self.client.get(&url).query(&query),
                "listing pull requests",
            )
            .await?;
        Ok(v.as_array().and_then(|a| a.first()).and_then(pull))
    }

    /// Opens the pull request, or finds the one that is open already.
    pub async fn open(&self, o: &Open<'_>) -> Result<PullRequest, Error> {
        if let Some(p) = self.find(o.owner, o.repo, o.head, o.base).await? {
            return Ok(p);
        }
        let url = format!("{}/repos/{}/{}/pulls", self.api, o.owner, o.repo);
        let body = json!({
            "title": o.title,
            "head": o.head,
            "base": o.base,
            "body": o.body,
            "draft": o.draft,
        });
        let body = serde_json::to_vec(&body).unwrap_or_default();
        match self
            .send(
                || {
                    self.client
                        .post(&url)
                        .header("Content-Type", "application/json")
                        .body(body.clone())
                },
                "opening a pull request",
            )
            .await
        {
            Ok((_, v)) => pull(&v).ok_or_else(|| {
                Error::Invalid("GitHub's answer to a new pull request has no number or URL".into())
            }),
            // One exists already (opened meanwhile, or closed and reopened): find it.
            Err(Error::Failed { reason, .. }) if reason.contains("already exists") => self
                .find(o.owner, o.repo, o.head, o.base)
                .await?
                .ok_or_else(|| Error::Failed {
                    what: "GitHub".into(),
                    reason: format!(
                        "{reason}; but no open pull request from {} was found",
                        o.head
                    ),
                }),
            Err(e) => Err(e),
        }
    }

    async fn send(
        &self,
        build: impl Fn() -> reqwest::RequestBuilder,
        what: &str,
    ) -> Result<(StatusCode, Value), Error> {
        let fail = |reason: String| Error::Failed {
            what: format!("GitHub ({what})"),
            reason,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let r = build()
                .bearer_auth(&self.token)
                .header("Accept", "application/vnd.github+json")
                .header("X-GitHub-Api-Version", "2022-11-28")
                .send()
                .await;
            let r = match r {
                Ok(r) => r,
                Err(e) if attempt < ATTEMPTS => {
                    tracing::warn!(error = %e, "GitHub unreachable; trying again");
                    tokio::time::sleep(Duration::from_secs(attempt as u64)).await;
                    continue;
                }
                Err(e) => return Err(fail(format!("unreachable: {e}"))),
            };
            let status = r.status();
            let headers = r.headers().clone();
            let bytes = r.bytes().await.map_err(|e| fail(e.to_string()))?;
            if bytes.len() > MAX_ANSWER {
                return Err(fail(format!("an answer of {} bytes", bytes.len())));
            }
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            if status.is_success() {
                return Ok((status, v));
            }
            let message = message_of(&v, &bytes);
            let limited = status == StatusCode::TOO_MANY_REQUESTS
                || (status == StatusCode::FORBIDDEN
                    && (headers.contains_key("retry-after")
                        || headers
                            .get("x-ratelimit-remaining")
                            .is_some_and(|h| h.as_bytes() == b"0")));
            if limited {
                let wait = retry_after(&headers);
                if attempt < ATTEMPTS && wait <= MAX_WAIT {
                    tracing::warn!(?wait, "GitHub's rate limit; waiting");
                    tokio::time::sleep(wait).await;
                    continue;
                }
                return Err(fail(format!(
                    "rate limited ({status}: {message}); try again in {} s with `brain task deliver`",
                    wait.as_secs()
                )));
            }
            if status.is_server_error() && attempt < ATTEMPTS {
                tokio::time::sleep(Duration::from_secs(attempt as u64)).await;
                continue;
            }
            return Err(fail(match status {
                StatusCode::UNAUTHORIZED => format!(
                    "the token was refused (401: {message}): check the token [deliver] github_token_env names"
                ),
                StatusCode::FORBIDDEN => format!(
                    "forbidden (403: {message}): the token may not open pull requests on this repository"
                ),
                StatusCode::NOT_FOUND => {
                    format!("no such repository, or the token cannot see it (404: {message})")
                }
                _ => format!("{status}: {message}"),
            }));
        }
    }
}

fn pull(v: &Value) -> Option<PullRequest> {
    Some(PullRequest {
        url: v.get("html_url")?.as_str()?.to_string(),
        number: v.get("number")?.as_u64()?,
    })
}

/// GitHub's error message and the messages of its `errors` list.
fn message_of(v: &Value, raw: &[u8]) -> String {
    let mut m = v
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(&raw[..raw.len().min(300)]).into_owned());
    if let Some(errs) = v.get("errors").and_then(Value::as_array) {
        for e in errs {
            if let Some(s) = e.get("message").and_then(Value::as_str) {
                m.push_str(": ");
                m.push_str(s);
            }
        }
    }
    m
}

/// How long GitHub asks to wait: `Retry-After`, else until `x-ratelimit-reset`, else a minute.
fn retry_after(h: &reqwest::header::HeaderMap) -> Duration {
    let num = |k: &str| {
        h.get(k)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    if let Some(s) = num("retry-after") {
        return Duration::from_secs(s);
    }
    if let Some(reset) = num("x-ratelimit-reset") {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        return Duration::from_secs(reset.saturating_sub(now));
    }
    Duration::from_secs(60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_and_repo_come_from_any_remote_form() {
        for (url, want) in [
            ("https://github.com/o/r.git", Some(("o", "r"))),
            ("https://github.com/o/r", Some(("o", "r"))),
            ("git@github.com:o/r.git", Some(("o", "r"))),
            ("http://127.0.0.1:9/git/o/r.git", Some(("o", "r"))),
            ("https://github.com/r.git", None),
            ("https://github.com/o/r%20x", None),
        ] {
            assert_eq!(
                repo_of(url),
                want.map(|(a, b)| (a.to_string(), b.to_string())),
                "{url}"
            );
        }
    }
}
