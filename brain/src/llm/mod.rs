//! LLM providers behind one trait. Providers know nothing of tasks: they turn a [`Request`]
//! into a [`Response`] over the provider's real wire format, with timeouts and retries.
//! Keys live only here (from the brain's config and env) and never appear in errors or logs.

use std::sync::Arc;

mod anthropic;
mod config;
mod http;
mod openai;
mod replay;
#[cfg(test)]
pub(crate) mod tests;
mod text_tools;
mod together;
mod types;

/// The body an OpenAI-compatible server receives for `req` (as rendered for it). What the
/// prompt's snapshot tests pin.
pub fn openai_body(model: &str, req: &Request) -> serde_json::Value {
    openai::build_body(model, req, "max_tokens", req.max_tokens)
}

/// The body Anthropic's API receives for `req`, for the tests of what is rendered.
#[cfg(test)]
pub(crate) fn anthropic_body(model: &str, req: &Request, max_tokens: u32) -> serde_json::Value {
    anthropic::build_body(model, req, max_tokens)
}

pub use anthropic::Anthropic;
pub use config::{
    ApiKey, AssistChoice, Constrain, LlmConfig, ModelConfig, ModelInfo, ModelSpec, Price,
    ProviderConfig, ProviderKind, ToolMode, model_info,
};
pub use openai::OpenAi;
pub use replay::{Replay, to_transcript};
/// The parser of text-mode replies, for the tests that check the examples the model is shown
/// are calls it reads.
#[cfg(test)]
pub(crate) use text_tools::parse_reply;
pub use text_tools::{CALL_FORMAT, EDIT_ID, RESULT, TextTools, call_block, call_schema};
pub use together::Together;
pub use types::{
    CodeBlock, Error, Message, NotACall, Provider, Request, Response, Role, Share, TextAssists,
    ToolSpec, ToolUse, ToolsSent, Unreadable, Usage,
};

/// Whether `spec` could be asked with `cfg` and this process's environment (a key found
/// where one is needed, a URL that parses): the reason when not. A replay always can.
pub fn check(spec: &ModelSpec, cfg: &LlmConfig) -> Result<(), Error> {
    if spec.provider == ProviderKind::Replay {
        return Ok(());
    }
    config::resolve(spec, cfg, &|v| std::env::var(v).ok()).map(|_| ())
}

/// Builds the provider for `spec`: its HTTP client with the resolved URL, key, timeouts and
/// retries, wrapped in [`TextTools`] when the model's `tool_mode` is `text`. A
/// `replay:FILE` spec loads the transcript file ([`Replay::load`]). Requests marked as
/// shared go through `together` (OpenAI-compatible servers only; Anthropic's API has no
/// `n`).
pub fn connect(
    spec: &ModelSpec,
    cfg: &LlmConfig,
    together: &Arc<Together>,
) -> Result<Arc<dyn Provider>, Error> {
    if spec.provider == ProviderKind::Replay {
        return Ok(Arc::new(Replay::load(&spec.model)?));
    }
    let r = config::resolve(spec, cfg, &|v| std::env::var(v).ok())?;
    let (tool_mode, constrain) = (r.tool_mode, r.constrain);
    let provider: Arc<dyn Provider> = match spec.provider {
        ProviderKind::Anthropic => Arc::new(Anthropic::new(&spec.model, r)?),
        _ => Arc::new(OpenAi::new(&spec.model, r, Some(together.clone()))?),
    };
    Ok(match tool_mode {
        ToolMode::Native => provider,
        ToolMode::Text => Arc::new(TextTools::new(provider, constrain == Constrain::JsonSchema)),
    })
}
