//! Text tool-call mode: for models or servers without native tool calling, tools are
//! described in the system prompt and called with fenced JSON blocks in plain text.
//!
//! ````text
//! ```json
//! {"tool": "NAME", "arguments": {...}}
//! ```
//! ````

use std::sync::Arc;

use serde_json::{Value, json};

use super::types::{
    CodeBlock, Error, NotACall, Provider, Request, Response, ToolSpec, ToolUse, Unreadable,
};

/// Wraps a provider so tool calls travel as text: it sends a request rendered for the text
/// mode (`model::prompt::as_sent`: the tools described in the system prompt, earlier calls
/// and results as text) and parses calls out of the answer (blocks that look like calls but cannot be read go to
/// [`Response::unreadable`]).
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
        if !req.tools.is_empty() {
            return Err(Error::Config(
                "a text tool-call mode request is sent as rendered for it (its tools described \
                 in the prompt, by model::prompt::as_sent): this one still holds native tools"
                    .into(),
            ));
        }
        let mut resp = self.inner.complete(req).await?;
        if self.constrained && !resp.message.content.contains("```") {
            // The reply is the call's JSON object itself.
            resp.message.content = format!("```json\n{}\n```", resp.message.content.trim());
        }
        let mut parsed = parse_reply(&resp.message.content, req.replies_before as usize);
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
        resp.unreadable.extend(parsed.malformed);
        Ok(resp)
    }
}

/// How a call is written in text tool-call mode, as the model is shown it.
pub const CALL_FORMAT: &str = "```json\n{\"tool\": \"NAME\", \"arguments\": {...}}\n```";

/// A call rendered the way the model is asked to write it.
pub fn call_block(c: &ToolUse) -> String {
    let args = serde_json::from_str::<Value>(&c.arguments).unwrap_or_else(|_| json!(c.arguments));
    format!(
        "```json\n{{\"tool\": {}, \"arguments\": {args}}}\n```",
        json!(c.name)
    )
}

/// The schema of a reply that is one call of one of `tools`: `{"tool": NAME, "arguments":
/// ...}` by that tool's own parameter schema.
pub fn call_schema(tools: &[ToolSpec]) -> Value {
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

/// What a text answer holds.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Parsed {
    /// The text with the parsed call blocks removed (malformed ones stay, for context).
    pub content: String,
    pub calls: Vec<ToolUse>,
    pub malformed: Vec<Unreadable>,
    /// `edit_file` calls from SEARCH/REPLACE blocks (ids start with [`EDIT_ID`]).
    pub edits: Vec<ToolUse>,
    /// Fenced blocks of code that are not calls.
    pub code_blocks: Vec<CodeBlock>,
}

/// How a tool's result begins when it is shown to the model.
pub const RESULT: &str = "Result of";

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
            out.malformed.push(Unreadable::EditNotEnded);
            rest.push_str(&lines[i..].concat());
            break;
        }
        let raw = lines[i..=k].concat();
        i = k + 1;
        let Some(path) = path.or_else(|| last_path.clone()) else {
            out.malformed.push(Unreadable::EditWithoutPath);
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
                    out.malformed.push(not_a_call(
                        body,
                        NotACall::NotJson {
                            error: e.to_string(),
                            unclosed: !closed,
                        },
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
                errors.push(NotACall::Array);
            }
            continue;
        };
        let Some(name) = o.get("tool").or_else(|| o.get("name")) else {
            continue; // JSON that is not a call: leave it as text
        };
        let Some(name) = name.as_str().filter(|n| !n.trim().is_empty()) else {
            errors.push(NotACall::NameNotText);
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
                errors.push(NotACall::ArgumentsNotObject(name.to_string()));
                continue;
            }
            None => {
                errors.push(NotACall::NoArguments(name.to_string()));
                continue;
            }
        };
        calls.push((name.to_string(), arguments));
    }
    if let Some(e) = errors.into_iter().next() {
        out.malformed.push(not_a_call(body, e));
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

fn not_a_call(body: &str, why: NotACall) -> Unreadable {
    Unreadable::Call {
        block: body.trim().chars().take(200).collect(),
        why,
    }
}

#[cfg(test)]
#[path = "text_tools_tests.rs"]
mod tests;
