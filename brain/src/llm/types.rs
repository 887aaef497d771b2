//! The types every provider shares: a conversation's messages and tool calls, a request,
//! an answer, the `Provider` trait and its errors.

use serde::{Deserialize, Serialize};

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
    /// The result of a tool call, answering `tool_call_id`.
    Tool,
}

/// A tool call the model asked for. `arguments` is the JSON text as the model wrote it (it
/// may be malformed: the agent answers that with an error the model can fix).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolUse {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// One message of a conversation. The system prompt is not a message: see [`Request`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub content: String,
    /// Assistant messages: the tool calls asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolUse>,
    /// Tool messages: the call this answers.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tool_call_id: String,
}

impl Message {
    pub fn user(text: impl Into<String>) -> Self {
        Self {
            role: Role::User,
            content: text.into(),
            tool_calls: vec![],
            tool_call_id: String::new(),
        }
    }

    pub fn tool(call_id: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            role: Role::Tool,
            content: text.into(),
            tool_calls: vec![],
            tool_call_id: call_id.into(),
        }
    }
}

/// A tool offered to the model; `parameters` is a JSON schema object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
}

/// One completion request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub system: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub max_tokens: u32,
    /// Constrained replies: the answer must be JSON matching this schema (sent as
    /// `response_format: {"type": "json_schema", ...}`); `None`: free text.
    pub response_schema: Option<serde_json::Value>,
    /// The sampling temperature; `None`: the provider's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// The sampling seed, where the provider takes one (OpenAI's API and llama.cpp's server
    /// do; Anthropic's does not); `None`: the provider's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// One of the first turns of attempts started together, which may be asked together
    /// (see [`super::Together`]); never sent as such.
    #[serde(skip)]
    pub share: Option<Share>,
    /// What the text tool-call wrapper does for the model (the agent's assists); never sent.
    #[serde(skip)]
    pub text: TextAssists,
    /// The model's replies before this request's answer (text mode numbers the calls it
    /// reads out of the answer by it); never sent.
    #[serde(skip)]
    pub replies_before: u32,
}

/// The text tool-call wrapper's accommodations, each one of the agent's assists (named in
/// `model::assists`): all on by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextAssists {
    /// Blocks of code and SEARCH/REPLACE blocks are read as edits (and the tool section
    /// shows the format).
    pub edit_blocks: bool,
    /// Only the first call of a reply runs.
    pub one_call: bool,
    /// Earlier replies are shown as their calls only.
    pub history_as_calls: bool,
    /// A repeated reply raises the temperature of the next request.
    pub repeat_temperature: bool,
}

impl Default for TextAssists {
    fn default() -> Self {
        TextAssists {
            edit_blocks: true,
            one_call: true,
            history_as_calls: true,
            repeat_temperature: true,
        }
    }
}

/// Marks a request as one of `of` that may be asked together: the first turns of the
/// attempts of the task `group` that sample alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub group: u64,
    pub of: u32,
}

/// Token usage of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// The model's answer: an assistant message, the usage, and (text tool-call mode) the tool
/// calls written in the text that could not be parsed, each as an error the model can act on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub message: Message,
    pub usage: Usage,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub malformed_calls: Vec<String>,
    /// Calls the model wrote that were not taken (text mode takes one call per reply), in
    /// the words the model is told.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_calls: Vec<String>,
    /// What to tell the model when this answer has no call (how to call, in its mode); empty:
    /// the agent's default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nudge: String,
    /// Text mode: fenced code blocks of an answer without calls, which the agent may take as
    /// edits (see `model::edits`). Resolved before the answer is logged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub code_blocks: Vec<CodeBlock>,
    /// Text mode: the reply made no call, no edit and no attempt at one that could not be
    /// read; the agent words what it is told (`nudge`) before the answer is logged.
    #[serde(skip)]
    pub no_call: bool,
    /// Text mode: the reply's first call, which runs, and the names of the others it made,
    /// which do not (one call per reply); worded by the agent into `skipped_calls`.
    #[serde(skip)]
    pub calls_not_run: Option<(String, Vec<String>)>,
    /// Text mode: blocks that looked like calls or edits and could not be read; worded by the
    /// agent into `malformed_calls`.
    #[serde(skip)]
    pub unreadable: Vec<Unreadable>,
}

impl Response {
    /// An answer of `content` and `calls` that used `usage`, with nothing else to say.
    pub fn new(content: impl Into<String>, calls: Vec<ToolUse>, usage: Usage) -> Self {
        Self {
            message: Message {
                role: Role::Assistant,
                content: content.into(),
                tool_calls: calls,
                tool_call_id: String::new(),
            },
            usage,
            malformed_calls: vec![],
            skipped_calls: vec![],
            nudge: String::new(),
            code_blocks: vec![],
            no_call: false,
            calls_not_run: None,
            unreadable: vec![],
        }
    }
}

/// A fenced block of code in an answer: the file it names (in its info string or on the
/// line above), its language, its text.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CodeBlock {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lang: String,
    pub body: String,
}

/// A model behind its wire format: one call, one answer. Implementations retry transient
/// failures themselves (429, 5xx, connect errors, timeouts), so an error is final.
#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// Sends `req` and returns the model's answer.
    async fn complete(&self, req: &Request) -> Result<Response, Error>;

    /// How this provider sends a request's tools: the caller renders the request for it
    /// (`model::prompt::as_sent`).
    fn tools_sent(&self) -> ToolsSent {
        ToolsSent::Native
    }
}

/// How a request's tools reach the model: as the API's native tool definitions, or described
/// in the prompt and called in text (text tool-call mode), its replies free or constrained to
/// one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolsSent {
    #[default]
    Native,
    Text,
    TextConstrained,
}

impl ToolsSent {
    /// The name the log and `--json` use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Text => "text",
            Self::TextConstrained => "text_constrained",
        }
    }
}

/// Why a completion failed. Messages say what failed and what to do; none ever holds a key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// 401/403: the key was refused.
    #[error("{0}")]
    Auth(String),
    /// 404: the model or the URL is unknown.
    #[error("{0}")]
    NotFound(String),
    /// The prompt is longer than the model's context window.
    #[error("{0}")]
    ContextOverflow(String),
    /// Any other HTTP error status.
    #[error("HTTP {status}: {message}")]
    Http { status: u16, message: String },
    /// The server could not be reached (DNS, connect, TLS, connection reset).
    #[error("{0}")]
    Transport(String),
    /// No complete answer within the configured timeout.
    #[error("{0}")]
    Timeout(String),
    /// The server answered something we cannot read.
    #[error("{0}")]
    Decode(String),
    /// Bad or missing configuration (model spec, key, URL, timeout, transcript).
    #[error("{0}")]
    Config(String),
}

/// What a provider's answer lacks, in the provider's own field names (the caller adds the
/// URL, as [`Error::Decode`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Malformed {
    /// A part every answer has (`content array`, `choices[0].message`).
    #[error("the answer has no {0}")]
    Missing(&'static str),
    /// A field of a tool call: where the call is (`content[0] (tool_use)`), and the field.
    #[error("{call} has no {field}")]
    CallField { call: String, field: String },
    #[error("message content is not text: {0}")]
    NotText(serde_json::Value),
}

impl Error {
    /// Whether trying again later may succeed: 429, 5xx, transport errors and timeouts.
    pub fn retryable(&self) -> bool {
        match self {
            Error::Http { status, .. } => *status == 429 || *status >= 500,
            Error::Transport(_) | Error::Timeout(_) => true,
            _ => false,
        }
    }
}

/// A block of a text reply that looked like a call or an edit and could not be read, and
/// why: the model is told in words (`model::prompt::text_mode::unreadable`).
#[derive(Debug, Clone, PartialEq)]
pub enum Unreadable {
    /// A SEARCH/REPLACE block without its `>>>>>>> REPLACE` line.
    EditNotEnded,
    /// A SEARCH/REPLACE block with no file named above it.
    EditWithoutPath,
    /// A block that looks like a call (its first 200 characters), and why it is not one.
    Call { block: String, why: NotACall },
}

/// Why a block that looks like a call is not one.
#[derive(Debug, Clone, PartialEq)]
pub enum NotACall {
    /// Not JSON (`unclosed`: the fence was never closed).
    NotJson { error: String, unclosed: bool },
    /// A JSON array of calls.
    Array,
    /// `"tool"` is not a name.
    NameNotText,
    /// The named call's arguments are not an object.
    ArgumentsNotObject(String),
    /// The named call has no arguments.
    NoArguments(String),
}
