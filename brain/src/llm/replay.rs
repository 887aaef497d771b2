//! A recorded transcript played back as a provider: for demos, tests and reproducing a task
//! without a model.

use std::path::Path;

use super::types::{Error, Provider, Request, Response, Role};

/// Answers from a transcript. The answer to a request is the response whose index is the
/// number of assistant messages already in the conversation, so playback keeps no state
/// and carries on after a brain restart.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// The recorded answers, in order.
    pub responses: Vec<Response>,
}

impl Replay {
    /// Reads a transcript: one JSON-serialised [`Response`] per line; blank lines and lines
    /// starting with `#` are skipped. Errors name the line.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let mut responses = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let r = serde_json::from_str(line).map_err(|e| {
                Error::Config(format!(
                    "transcript line {}: not a recorded response ({e}): each line must be one \
                     JSON object like {{\"message\":{{\"role\":\"assistant\",\"content\":\"…\"}},\
                     \"usage\":{{\"prompt_tokens\":0,\"completion_tokens\":0}}}}",
                    i + 1
                ))
            })?;
            responses.push(r);
        }
        Ok(Self { responses })
    }

    /// Reads and parses a transcript file; errors name the file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Config(format!(
                "cannot read transcript {}: {e}: check the path in replay:FILE",
                path.display()
            ))
        })?;
        Self::parse(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }
}

/// The transcript text for `responses`, which [`Replay::parse`] reads back.
pub fn to_transcript(responses: &[Response]) -> String {
    responses
        .iter()
        .filter_map(|r| serde_json::to_string(r).ok())
        .map(|l| l + "\n")
        .collect()
}

#[async_trait::async_trait]
impl Provider for Replay {
    async fn complete(&self, req: &Request) -> Result<Response, Error> {
        let n = req
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        self.responses.get(n).cloned().ok_or_else(|| {
            Error::Config(format!(
                "the recorded transcript has {} responses and the task asked for more \
                 (response {}): record a longer transcript or use a real model",
                self.responses.len(),
                n + 1
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::types::{Message, ToolUse, Usage};
    use super::*;

    fn resp(text: &str, calls: Vec<ToolUse>) -> Response {
        let usage = Usage {
            prompt_tokens: 10,
            completion_tokens: 2,
        };
        Response::new(text, calls, usage)
    }

    #[tokio::test]
    async fn replays_by_assistant_turns() {
        let call = ToolUse {
            id: "c1".into(),
            name: "ls".into(),
            arguments: "{}".into(),
        };
        let recorded = vec![resp("", vec![call]), resp("done", vec![])];
        let text = format!("# a recorded task\n\n{}", to_transcript(&recorded));
        let replay = Replay::parse(&text).unwrap();
        assert_eq!(replay.responses, recorded);

        let mut req = Request {
            system: "s".into(),
            messages: vec![Message::user("go")],
            tools: vec![],
            max_tokens: 100,
            response_schema: None,
            temperature: None,
            seed: None,
            share: None,
            text: Default::default(),
            replies_before: 0,
        };
        assert_eq!(replay.complete(&req).await.unwrap(), recorded[0]);
        req.messages.push(recorded[0].message.clone());
        req.messages.push(Message::tool("c1", "a b"));
        assert_eq!(replay.complete(&req).await.unwrap(), recorded[1]);
        req.messages.push(recorded[1].message.clone());
        let e = replay.complete(&req).await.unwrap_err();
        assert!(
            matches!(&e, Error::Config(m) if m.contains("has 2 responses and the task asked for more")),
            "{e}"
        );
    }

    #[test]
    fn parse_errors_name_the_line() {
        let e = Replay::parse("# c\n\n{not json}\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("transcript line 3:"), "{e}");
    }
}
