//! A profile's `credential_process`: the program run without a shell (the line split into
//! words, double quotes grouping), its JSON answer read (version 1); nothing of the answer
//! is quoted in an error, since it holds a secret.

use std::time::Duration;

use serde::Deserialize;

/// Why a `credential_process` gave no credentials, in words that never hold its answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("is empty")]
    Empty,
    #[error("has an unclosed double quote: {0:?}")]
    UnclosedQuote(String),
    #[error("{program} did not finish within {timeout:?}")]
    Timeout { program: String, timeout: Duration },
    #[error("cannot run {program}: {source}")]
    Run {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// `stderr`: what it said there, clipped.
    #[error("{program} failed ({status}): {stderr}")]
    Failed {
        program: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("{program} printed over {max} bytes")]
    TooLong { program: String, max: usize },
    /// Where the JSON broke and how, never what it held.
    #[error(
        "{program} printed no credentials JSON (Version, AccessKeyId, SecretAccessKey, …): {why} at line {line} column {column}"
    )]
    NotCredentials {
        program: String,
        why: &'static str,
        line: usize,
        column: usize,
    },
    #[error("{program} printed Version {version}; only 1 is known")]
    Version { program: String, version: u32 },
    #[error("Expiration {0:?} is not an RFC 3339 time")]
    Expiration(String),
}

/// What the program printed.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Answer {
    version: u32,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    pub expiration: Option<String>,
}

/// Runs `line` within `timeout` and reads at most `max` bytes of its answer; errors say why
/// in words that never hold the answer.
pub(super) async fn run(line: &str, timeout: Duration, max: usize) -> Result<Answer, Error> {
    let words = split_words(line)?;
    let (program, args) = words.split_first().ok_or(Error::Empty)?;
    let out = tokio::time::timeout(
        timeout,
        tokio::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| Error::Timeout {
        program: program.clone(),
        timeout,
    })?
    .map_err(|source| Error::Run {
        program: program.clone(),
        source,
    })?;
    if !out.status.success() {
        return Err(Error::Failed {
            program: program.clone(),
            status: out.status,
            stderr: clip(&String::from_utf8_lossy(&out.stderr)),
        });
    }
    if out.stdout.len() > max {
        return Err(Error::TooLong {
            program: program.clone(),
            max,
        });
    }
    let a: Answer = serde_json::from_slice(&out.stdout).map_err(|e| Error::NotCredentials {
        program: program.clone(),
        why: match e.classify() {
            serde_json::error::Category::Data => "a field is missing or of the wrong type",
            _ => "not JSON",
        },
        line: e.line(),
        column: e.column(),
    })?;
    if a.version != 1 {
        return Err(Error::Version {
            program: program.clone(),
            version: a.version,
        });
    }
    Ok(a)
}

/// Splits a command line into words: whitespace separates, double quotes group.
pub(super) fn split_words(line: &str) -> Result<Vec<String>, Error> {
    let (mut words, mut cur, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if quoted {
        return Err(Error::UnclosedQuote(line.to_string()));
    }
    if any {
        words.push(cur);
    }
    Ok(words)
}

/// At most 300 characters of `s`, trimmed.
pub(super) fn clip(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}
