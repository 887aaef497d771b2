//! Text tool-call mode: for models or servers without native tool calling, tools are
//! described in the system prompt and called with fenced JSON blocks in plain text.
//!
//! ````text
//! ```json
//! {"tool": "NAME", "arguments": {...}}
//! ```
//! ````

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::types::{
    CodeBlock, Error, Message, Provider, Request, Response, Role, TextAssists, ToolSpec, ToolUse,
};

/// Wraps a provider so tool calls travel as text: sends no `tools`, describes them in the
/// system prompt, replays earlier calls and results as text, and parses calls out of the
/// answer (blocks that look like calls but cannot be read go to
/// [`Response::malformed_calls`]).
pub struct TextTools {
    inner: Arc<dyn Provider>,
    /// Replies are constrained to one call by the tools' schemas (`constrain =
    /// "json_schema"`): the answer is that call's JSON object, unfenced.
    constrained: bool,
}

impl TextTools {
    /// Wraps `inner`; `constrained` asks the server for replies that are one call.
    pub fn new(inner: Arc<dyn Provider>, constrained: bool) -> Self {
        Self { inner, constrained }
    }
}

#[async_trait::async_trait]
impl Provider for TextTools {
    fn tools_sent(&self) -> super::types::ToolsSent {
        if self.constrained {
            super::types::ToolsSent::TextConstrained
        } else {
            super::types::ToolsSent::Text
        }
    }

    async fn complete(&self, req: &Request) -> Result<Response, Error> {
        let mut resp = self
            .inner
            .complete(&to_text_request(req, self.constrained))
            .await?;
        if self.constrained && !resp.message.content.contains("```") {
            // The reply is the call's JSON object itself.
            resp.message.content = format!("```json\n{}\n```", resp.message.content.trim());
        }
        let turn = req
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let mut parsed = parse_reply(&resp.message.content, turn);
        // One call per reply: the model sees each result before its next move, so it does
        // not run a plan blind (a `finish` after a test it has not seen fail). Edits written
        // as SEARCH/REPLACE blocks all run, before it.
        let mut edits = std::mem::take(&mut parsed.edits);
        if !req.text.edit_blocks {
            // Blocks are not read as edits: what is left of the reply is its calls.
            edits.clear();
            parsed.code_blocks.clear();
        }
        if req.text.one_call && parsed.calls.len() > 1 {
            let extra: Vec<String> = parsed.calls.drain(1..).map(|c| c.name).collect();
            resp.calls_not_run = Some((parsed.calls[0].name.clone(), extra));
        }
        resp.no_call = parsed.calls.is_empty() && edits.is_empty() && parsed.malformed.is_empty();
        // Blocks of code go along even beside a call: small models write the fix as a block
        // and `finish` in the same reply, and the fix is the part that matters.
        if edits.is_empty() && parsed.malformed.is_empty() {
            resp.code_blocks = parsed.code_blocks;
        }
        resp.message.content = parsed.content;
        resp.message.tool_calls.extend(edits);
        resp.message.tool_calls.extend(parsed.calls);
        resp.malformed_calls.extend(parsed.malformed);
        Ok(resp)
    }
}

const FORMAT: &str = "```json\n{\"tool\": \"NAME\", \"arguments\": {...}}\n```";

/// The edit format a small model can write, shown once in the prompt and in a nudge.
/// The example is a plain text file: nothing language-specific in what the model is told.
pub const EDIT_FORMAT: &str = "notes.txt\n<<<<<<< SEARCH\ncolour = red\nsize = 2\n=======\ncolour = blue\nsize = 2\n>>>>>>> REPLACE";

/// The system prompt's tool section.
fn tools_prompt(tools: &[ToolSpec], assists: TextAssists) -> String {
    let mut s = String::from(
        "# Tools\n\nYou can call the tools below. To call one, write a fenced block exactly \
         like this, with the arguments as a JSON object matching the tool's schema:\n\n",
    );
    s.push_str(FORMAT);
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

/// A call rendered the way the model is asked to write it.
fn call_block(c: &ToolUse) -> String {
    let args = serde_json::from_str::<Value>(&c.arguments).unwrap_or_else(|_| json!(c.arguments));
    format!(
        "```json\n{{\"tool\": {}, \"arguments\": {args}}}\n```",
        json!(c.name)
    )
}

/// The schema of a reply that is one call of one of `tools`: `{"tool": NAME, "arguments":
/// ...}` by that tool's own parameter schema.
pub(crate) fn call_schema(tools: &[ToolSpec]) -> Value {
    let branches: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {"tool": {"const": t.name}, "arguments": t.parameters},
                "required": ["tool", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    json!({"anyOf": branches})
}

/// The request the inner provider sees.
pub(crate) fn to_text_request(req: &Request, constrained: bool) -> Request {
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

/// What a text answer holds.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Parsed {
    /// The text with the parsed call blocks removed (malformed ones stay, for context).
    pub content: String,
    pub calls: Vec<ToolUse>,
    pub malformed: Vec<String>,
    /// `edit_file` calls from SEARCH/REPLACE blocks (ids start with [`EDIT_ID`]).
    pub edits: Vec<ToolUse>,
    /// Fenced blocks of code that are not calls.
    pub code_blocks: Vec<CodeBlock>,
}

/// How a tool's result begins when it is shown to the model.
const RESULT: &str = "Result of";

/// The reply up to where it starts writing the other side of the conversation: a line,
/// outside a fenced block, that begins the way a tool's result is shown to it (`Result of
/// `). A small model that has seen results go on in its own voice writes them itself, and
/// what it makes up is neither a call nor an edit.
fn own_part(text: &str) -> &str {
    let mut fenced = false;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        if t.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && t.starts_with(RESULT) {
            return &text[..at];
        }
        at += line.len();
    }
    text
}

/// The id prefix of calls the model wrote as blocks of code rather than as JSON.
pub const EDIT_ID: &str = "edit_";

/// Reads the tool calls out of an answer. `turn` (the number of earlier assistant messages)
/// makes the ids `call_<turn>_<n>` unique within the conversation.
pub(crate) fn parse_reply(text: &str, turn: usize) -> Parsed {
    let mut out = Parsed::default();
    let text = own_part(text);
    let text = search_replace(text, turn, &mut out);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let Some(rest) = line.trim().strip_prefix("```") else {
            out.content.push_str(line);
            i += 1;
            continue;
        };
        // One-line block: ```json {...} ```
        let (info, body, raw, closed) = if rest.len() > 3 && rest.ends_with("```") {
            let inner = rest[..rest.len() - 3].trim();
            let (info, body) = match inner.find(|c: char| c.is_whitespace() || c == '{') {
                Some(p) if !inner.starts_with('{') => (&inner[..p], inner[p..].to_string()),
                _ => ("", inner.to_string()),
            };
            i += 1;
            (info.trim(), body, line.to_string(), true)
        } else {
            let mut j = i + 1;
            while j < lines.len() && lines[j].trim() != "```" {
                j += 1;
            }
            let closed = j < lines.len();
            let body: String = lines[i + 1..j].concat();
            let end = if closed { j + 1 } else { j };
            let raw = lines[i..end].concat();
            i = end;
            (rest.trim(), body, raw, closed)
        };
        let info_raw = info.to_string();
        let info = info.to_ascii_lowercase();
        if !matches!(
            info.as_str(),
            "" | "json" | "tool" | "tool_call" | "tool_code"
        ) {
            out.content.push_str(&raw);
            out.code_blocks.push(code_block(
                &info_raw,
                &out.content[..out.content.len() - raw.len()],
                &body,
            ));
            continue;
        }
        let tool_fence = info.starts_with("tool");
        let before = (out.calls.len(), out.malformed.len());
        read_block(&body, tool_fence, closed, turn, &mut out);
        if out.malformed.len() > before.1 || out.calls.len() == before.0 {
            out.content.push_str(&raw); // not a call, or a malformed one: keep the text
            if out.malformed.len() == before.1 && !body.trim_start().starts_with(['{', '[']) {
                let above = &out.content[..out.content.len() - raw.len()];
                out.code_blocks.push(code_block(&info_raw, above, &body));
            }
        }
    }
    out.content = out.content.trim().to_string();
    out
}

/// A path as a model writes it around a block: `stats.py`, **src/a.rs**, "In `x.py`:",
/// "File: x.py". The last word with a file extension, stripped of marks.
fn path_in(line: &str) -> Option<String> {
    line.split_whitespace()
        .rev()
        .map(|w| w.trim_matches(|c: char| "`*\"'():,;#".contains(c)))
        .find(|w| {
            let (stem, ext) = w.rsplit_once('.').unwrap_or(("", ""));
            !stem.is_empty()
                && !ext.is_empty()
                && ext.len() <= 10
                && ext.chars().all(|c| c.is_ascii_alphanumeric())
                && !ext.chars().all(|c| c.is_ascii_digit())
                && w.chars()
                    .all(|c| c.is_alphanumeric() || "._-/@+".contains(c))
                && !w.starts_with('/')
                && !w.contains("..")
        })
        .map(|w| w.trim_start_matches("./").to_string())
}

/// A fenced block of code: the file its info string or the line above names.
fn code_block(info: &str, above: &str, body: &str) -> CodeBlock {
    let mut words = info.split_whitespace();
    let first = words.next().unwrap_or("");
    let (lang, named) = if path_in(first).is_some_and(|p| p == first) {
        ("", Some(first.to_string()))
    } else {
        (first, words.find_map(path_in))
    };
    let path = named.or_else(|| {
        above
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .filter(|l| l.len() <= 200)
            .and_then(path_in)
    });
    CodeBlock {
        path,
        lang: lang.to_string(),
        body: body.to_string(),
    }
}

fn marker(line: &str, ch: char, word: &str) -> bool {
    let t = line.trim();
    let n = t.chars().take_while(|c| *c == ch).count();
    (5..=9).contains(&n) && t[n..].trim().eq_ignore_ascii_case(word)
}

/// Takes the SEARCH/REPLACE blocks out of `text` as `edit_file` calls (or, with an empty
/// SEARCH, as a block of code for a new file), and answers the rest of the text.
fn search_replace(text: &str, turn: usize, out: &mut Parsed) -> String {
    if !text.contains("<<<<<") {
        return text.to_string();
    }
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut rest = String::new();
    let mut last_path: Option<String> = None;
    let mut i = 0;
    while i < lines.len() {
        if !marker(lines[i], '<', "SEARCH") {
            rest.push_str(lines[i]);
            i += 1;
            continue;
        }
        // The path: on the nearest line above that is not blank or a fence.
        let mut path = None;
        for l in lines[..i].iter().rev().take(4) {
            let t = l.trim();
            if t.is_empty() {
                continue;
            }
            if let Some(info) = t.strip_prefix("```") {
                match info.split_whitespace().find_map(path_in) {
                    Some(p) => {
                        path = Some(p);
                        break;
                    }
                    None => continue,
                }
            }
            if marker(t, '>', "REPLACE") {
                path = last_path.clone();
            } else {
                path = path_in(t);
            }
            break;
        }
        let (mut old, mut new) = (String::new(), String::new());
        let mut j = i + 1;
        while j < lines.len() && !marker(lines[j], '=', "") {
            old.push_str(lines[j]);
            j += 1;
        }
        let mut k = j + 1;
        while k < lines.len() && !marker(lines[k], '>', "REPLACE") {
            new.push_str(lines[k]);
            k += 1;
        }
        if k >= lines.len() {
            out.malformed.push(
                "A SEARCH/REPLACE block was not applied because it does not end with a `>>>>>>> REPLACE` line.".into(),
            );
            rest.push_str(&lines[i..].concat());
            break;
        }
        let raw = lines[i..=k].concat();
        i = k + 1;
        let Some(path) = path.or_else(|| last_path.clone()) else {
            out.malformed.push("A SEARCH/REPLACE block was not applied because no file is named: write the file's path on the line just above `<<<<<<< SEARCH`.".into());
            rest.push_str(&raw);
            continue;
        };
        last_path = Some(path.clone());
        let (old, new) = (old.trim_end_matches('\n'), new.trim_end_matches('\n'));
        if old.trim().is_empty() {
            out.code_blocks.push(CodeBlock {
                path: Some(path),
                lang: String::new(),
                body: format!("{new}\n"),
            });
        } else {
            out.edits.push(ToolUse {
                id: format!("{EDIT_ID}{turn}_{}", out.edits.len()),
                name: "edit_file".into(),
                arguments: json!({"path": path, "old_string": old, "new_string": new}).to_string(),
            });
        }
        rest.push_str(&raw);
    }
    rest
}

/// Adds the calls (or the errors) in one fenced block's body to `out`.
fn read_block(body: &str, tool_fence: bool, closed: bool, turn: usize, out: &mut Parsed) {
    let looks_like_call = tool_fence
        || body.contains("\"tool\"")
        || (body.contains("\"name\"") && body.contains("\"arguments\""));
    // A small model writes regexes and Windows paths into JSON strings unescaped
    // (`"def greet\("`): a backslash before a character JSON does not escape is taken as
    // the character it meant, not as a malformed call.
    let repaired;
    let body = if looks_like_call
        && serde_json::Deserializer::from_str(body)
            .into_iter::<Value>()
            .any(|v| v.is_err())
    {
        repaired = repair_escapes(body);
        repaired.as_str()
    } else {
        body
    };
    let mut values = Vec::new();
    for v in serde_json::Deserializer::from_str(body).into_iter::<Value>() {
        match v {
            Ok(v) => values.push(v),
            Err(e) => {
                if looks_like_call {
                    let unclosed = if closed {
                        ""
                    } else {
                        " (the block is not closed with ```)"
                    };
                    out.malformed.push(malformed(
                        body,
                        &format!("it is not valid JSON: {e}{unclosed}"),
                    ));
                }
                return;
            }
        }
    }
    let mut calls = Vec::new();
    let mut errors = Vec::new();
    for v in &values {
        let Some(o) = v.as_object() else {
            if v.is_array() && v.to_string().contains("\"tool\"") {
                errors.push("it is a JSON array: write one object per block".to_string());
            }
            continue;
        };
        let Some(name) = o.get("tool").or_else(|| o.get("name")) else {
            continue; // JSON that is not a call: leave it as text
        };
        let Some(name) = name.as_str().filter(|n| !n.trim().is_empty()) else {
            errors.push("\"tool\" must be the tool's name as a string".to_string());
            continue;
        };
        let arguments = match o.get("arguments") {
            Some(a @ Value::Object(_)) => a.to_string(),
            Some(Value::String(s))
                if serde_json::from_str::<Value>(s).is_ok_and(|v| v.is_object()) =>
            {
                s.clone()
            }
            Some(_) => {
                errors.push(format!("the arguments of `{name}` are not a JSON object"));
                continue;
            }
            None => {
                errors.push(format!(
                    "the call to `{name}` has no \"arguments\" (write \"arguments\": {{}} if it \
                     takes none)"
                ));
                continue;
            }
        };
        calls.push((name.to_string(), arguments));
    }
    if let Some(e) = errors.first() {
        out.malformed.push(malformed(body, e));
        return;
    }
    for (name, arguments) in calls {
        let id = format!("call_{turn}_{}", out.calls.len());
        out.calls.push(ToolUse {
            id,
            name,
            arguments,
        });
    }
}

/// `text` with every backslash inside a JSON string that does not start a valid escape
/// (`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\uXXXX`) doubled, so it stands for
/// itself; everything else as it was.
fn repair_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_string = !in_string;
                out.push(c);
            }
            '\\' if in_string => match chars.peek() {
                Some(&n) if "\"\\/bfnrt".contains(n) => {
                    out.push(c);
                    out.push(n);
                    chars.next();
                }
                Some('u') => {
                    let hex: String = chars.clone().skip(1).take(4).collect();
                    if hex.len() == 4 && hex.chars().all(|h| h.is_ascii_hexdigit()) {
                        out.push(c);
                    } else {
                        out.push_str("\\\\");
                    }
                }
                _ => out.push_str("\\\\"),
            },
            _ => out.push(c),
        }
    }
    out
}

fn malformed(body: &str, what: &str) -> String {
    let snippet: String = body.trim().chars().take(200).collect();
    format!(
        "A tool call could not be read because {what}. The block was:\n{snippet}\nWrite each \
         call as its own fenced block, exactly:\n{FORMAT}"
    )
}

#[cfg(test)]
#[path = "text_tools_tests.rs"]
mod tests;
