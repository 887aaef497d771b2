//! A profile's `credential_process`: the program run without a shell (the line split into
//! words, double quotes grouping), its JSON answer read (version 1); nothing of the answer
//! is quoted in an error, since it holds a secret.

use std::time::Duration;

use serde::Deserialize;

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
pub(super) async fn run(line: &str, timeout: Duration, max: usize) -> Result<Answer, String> {
    let words = split_words(line)?;
    let (program, args) = words.split_first().ok_or_else(|| "is empty".to_string())?;
    let out = tokio::time::timeout(
        timeout,
        tokio::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| format!("{program} did not finish within {timeout:?}"))?
    .map_err(|e| format!("cannot run {program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} failed ({}): {}",
            out.status,
            clip(&String::from_utf8_lossy(&out.stderr))
        ));
    }
    if out.stdout.len() > max {
        return Err(format!("{program} printed over {max} bytes"));
    }
    let a: Answer = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "{program} printed no credentials JSON (Version, AccessKeyId, SecretAccessKey, …): {} at line {} column {}",
            match e.classify() {
                serde_json::error::Category::Data => "a field is missing or of the wrong type",
                _ => "not JSON",
            },
            e.line(),
            e.column()
        )
    })?;
    if a.version != 1 {
        return Err(format!(
            "{program} printed Version {}; only 1 is known",
            a.version
        ));
    }
    Ok(a)
}

/// Splits a command line into words: whitespace separates, double quotes group.
pub(super) fn split_words(line: &str) -> Result<Vec<String>, String> {
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
        return Err(format!("has an unclosed double quote: {line:?}"));
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
