//! The text tool-call mode's side of the request: for a model without native tool calls,
//! the tools are described in the system prompt, its earlier calls are shown as the fenced
//! JSON blocks it is asked to write, and their results as messages in the user's voice.
//! `llm::TextTools` reads the calls back out of the reply; the format they share
//! (`llm::CALL_FORMAT`, `llm::call_block`, `llm::RESULT`) is there.

use std::collections::HashMap;

use serde_json::Value;

use crate::llm::{
    CALL_FORMAT, EDIT_ID, Message, NotACall, RESULT, Request, Role, TextAssists, ToolSpec,
    ToolsSent, Unreadable, call_block, call_schema,
};

/// The edit format a small model can write, shown once in the prompt and in a nudge.
/// The example is a plain text file: nothing language-specific in what the model is told.
pub const EDIT_FORMAT: &str = "notes.txt\n<<<<<<< SEARCH\ncolour = red\nsize = 2\n=======\ncolour = blue\nsize = 2\n>>>>>>> REPLACE";

/// `req` as a provider that sends tools `how` passes it on to the model's API: unchanged for
/// native tool calls, rendered for the text mode otherwise. What is sent, what `brain task
/// prompt` shows and what the log's hash covers.
pub fn as_sent(req: &Request, how: ToolsSent) -> Request {
    match how {
        ToolsSent::Native => req.clone(),
        ToolsSent::Text => render(req, false),
        ToolsSent::TextConstrained => render(req, true),
    }
}

/// What the model is told of a block of its reply that could not be read.
pub fn unreadable(u: &Unreadable) -> String {
    match u {
        Unreadable::EditNotEnded => "A SEARCH/REPLACE block was not applied because it does not end with a `>>>>>>> REPLACE` line.".into(),
        Unreadable::EditWithoutPath => "A SEARCH/REPLACE block was not applied because no file is named: write the file's path on the line just above `<<<<<<< SEARCH`.".into(),
        Unreadable::Call { block, why } => {
            let what = match why {
                NotACall::NotJson { error, unclosed } => format!(
                    "it is not valid JSON: {error}{}",
                    if *unclosed {
                        " (the block is not closed with ```)"
                    } else {
                        ""
                    }
                ),
                NotACall::Array => "it is a JSON array: write one object per block".into(),
                NotACall::NameNotText => "\"tool\" must be the tool's name as a string".into(),
                NotACall::ArgumentsNotObject(name) => {
                    format!("the arguments of `{name}` are not a JSON object")
                }
                NotACall::NoArguments(name) => format!(
                    "the call to `{name}` has no \"arguments\" (write \"arguments\": {{}} if it takes none)"
                ),
            };
            format!(
                "A tool call could not be read because {what}. The block was:\n{block}\nWrite each call as its own fenced block, exactly:\n{CALL_FORMAT}"
            )
        }
    }
}

/// The model's replies in `messages` (text mode numbers a reply's calls by it).
fn assistant_turns(messages: &[Message]) -> u32 {
    messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .count() as u32
}

/// `req` (as the agent has it: native tool calls) as a text tool-call mode model reads it:
/// the tools described in the system prompt (`constrained`: every reply is one call, by the
/// tools' schemas), earlier calls and results told as text.
pub fn render(req: &Request, constrained: bool) -> Request {
    let mut system = req.system.clone();
    if !req.tools.is_empty() {
        if !system.is_empty() {
            system.push_str("\n\n");
        }
        system.push_str(&if constrained {
            constrained_prompt(&req.tools)
        } else {
            tools_prompt(&req.tools, req.text)
        });
    }
    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut messages: Vec<Message> = Vec::with_capacity(req.messages.len());
    for m in &req.messages {
        let text = match m.role {
            // A reply that made calls is shown as its calls, its edits written as blocks told
            // in the user's voice as what it did: a small model shown its own words (a failed
            // fix, the reasoning around it) writes them again, word for word, at any
            // temperature. What the calls did comes in their results, and the files as they
            // are now with the check's next result.
            // Without the assist, a reply is shown as it was read: its words, then its calls.
            Role::Assistant if !req.text.history_as_calls => {
                let mut text = m.content.trim().to_string();
                for c in &m.tool_calls {
                    names.insert(&c.id, &c.name);
                    if !text.is_empty() {
                        text.push_str("\n\n");
                    }
                    text.push_str(&call_block(c));
                }
                if text.is_empty() {
                    continue;
                }
                messages.push(Message {
                    role: Role::Assistant,
                    content: text,
                    tool_calls: vec![],
                    tool_call_id: String::new(),
                });
                continue;
            }
            Role::Assistant if !m.tool_calls.is_empty() => {
                let mut changed: Vec<String> = Vec::new();
                let mut calls: Vec<String> = Vec::new();
                for c in &m.tool_calls {
                    names.insert(&c.id, &c.name);
                    if !c.id.starts_with(EDIT_ID) {
                        calls.push(call_block(c));
                        continue;
                    }
                    let path = serde_json::from_str::<Value>(&c.arguments)
                        .ok()
                        .and_then(|v| v["path"].as_str().map(String::from))
                        .unwrap_or_default();
                    if !path.is_empty() && !changed.contains(&path) {
                        changed.push(path);
                    }
                }
                if !changed.is_empty() {
                    push_user(
                        &mut messages,
                        format!("(You changed {} with blocks of code.)", changed.join(", ")),
                    );
                }
                if !calls.is_empty() {
                    messages.push(Message {
                        role: Role::Assistant,
                        content: calls.join("\n\n"),
                        tool_calls: vec![],
                        tool_call_id: String::new(),
                    });
                }
                continue;
            }
            // A reply without calls is not shown either: what it is told next (why nothing
            // was done, what a block it wrote came to) says what became of it.
            Role::Assistant => continue,
            Role::Tool => {
                let name = names
                    .get(m.tool_call_id.as_str())
                    .copied()
                    .unwrap_or("tool");
                format!("{RESULT} {name} call {}:\n{}", m.tool_call_id, m.content)
            }
            Role::User => m.content.clone(),
        };
        push_user(&mut messages, text);
    }
    // A repeat raises the temperature; never below the one asked for.
    let repeat = req
        .text
        .repeat_temperature
        .then(|| repeat_temperature(&req.messages))
        .flatten();
    let temperature = match (repeat, req.temperature) {
        (Some(r), Some(t)) => Some(r.max(t)),
        (r, t) => r.or(t),
    };
    Request {
        temperature,
        seed: req.seed,
        share: req.share,
        text: req.text,
        replies_before: assistant_turns(&req.messages),
        system,
        messages,
        tools: vec![],
        max_tokens: req.max_tokens,
        response_schema: constrained.then(|| call_schema(&req.tools)),
    }
}

/// Adds a user turn; consecutive user turns (tool results, then a note) become one message.
fn push_user(messages: &mut Vec<Message>, text: String) {
    match messages.last_mut() {
        Some(prev) if prev.role == Role::User => {
            prev.content.push_str("\n\n");
            prev.content.push_str(&text);
        }
        _ => messages.push(Message::user(text)),
    }
}

/// The sampling temperature after the model gave a reply it had given before, word for word:
/// at its usual temperature a small model gives the same wrong answer for ever, whatever it
/// was told in between. 1.0 after one repeat, 0.2 more for each further one, at most 1.4;
/// `None` (the server's default) otherwise.
/// Two replies are the same when their code is (the same fenced blocks, whitespace aside,
/// however the words around them differ) or, without code, when their words are.
fn repeat_temperature(messages: &[Message]) -> Option<f32> {
    let mut replies = messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .map(|m| reply_key(&m.content));
    let last = replies.next_back().filter(|c| !c.is_empty())?;
    let earlier = replies.filter(|c| *c == last).count();
    (earlier > 0).then(|| (0.8 + 0.2 * earlier as f32).min(1.4))
}

/// What a reply comes to for [`repeat_temperature`]: its fenced blocks' lines, whitespace
/// aside, or its trimmed text when it has none.
fn reply_key(text: &str) -> String {
    let mut code = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            code.push('\n');
        } else if fenced && !line.trim().is_empty() {
            code.push_str(&line.split_whitespace().collect::<Vec<_>>().join(" "));
            code.push('\n');
        }
    }
    if code.trim().is_empty() {
        text.trim().to_string()
    } else {
        code
    }
}

/// The system prompt's tool section.
fn tools_prompt(tools: &[ToolSpec], assists: TextAssists) -> String {
    let mut s = String::from(
        "# Tools\n\nYou can call the tools below. To call one, write a fenced block exactly \
         like this, with the arguments as a JSON object matching the tool's schema:\n\n",
    );
    s.push_str(CALL_FORMAT);
    if assists.one_call {
        s.push_str(
            "\n\nMake exactly one call per reply: its result comes back in the next message, \
             and only then decide the next step. Only the first block of a reply is run.",
        );
    }
    if assists.edit_blocks {
        s.push_str(
            "\n\nTo change part of a file you may instead write its path on a line, then the \
             exact lines now in it and the lines to put there (several such blocks in one reply \
             all apply):\n\n",
        );
        s.push_str(EDIT_FORMAT);
    }
    s.push('\n');
    for t in tools {
        s.push_str(&format!(
            "\n## {}\n\n{}\n\nArguments (JSON schema): {}\n",
            t.name, t.description, t.parameters
        ));
    }
    s
}

/// The system prompt's tool section when replies are constrained: each reply is one call.
fn constrained_prompt(tools: &[ToolSpec]) -> String {
    let mut s = String::from(
        "# Tools\n\nEvery reply of yours is exactly one tool call, a JSON object \
         {\"tool\": NAME, \"arguments\": {...}} with the arguments matching the tool's \
         schema. Its result comes back in the next message; then decide the next call. To \
         change a file, call `edit_file` or `write_file`; when the goal is met, call `finish`.\n",
    );
    for t in tools {
        s.push_str(&format!(
            "\n## {}\n\n{}\n\nArguments (JSON schema): {}\n",
            t.name, t.description, t.parameters
        ));
    }
    s
}

#[cfg(test)]
#[path = "text_mode_tests.rs"]
mod tests;
