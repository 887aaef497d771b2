//! Model specs (`openai:gpt-4.1`), the `[llm]` config table, key and URL resolution, the
//! built-in price and context table, and [`connect`].

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

use super::types::{Error, Usage};

/// Read timeout of one HTTP attempt when the config sets none.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Connect timeout of every HTTP attempt.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Retries after the first attempt when the config sets none.
pub(crate) const DEFAULT_MAX_RETRIES: u32 = 4;
/// `max_tokens` sent when neither the request nor the model's config sets one.
pub(crate) const DEFAULT_MAX_TOKENS: u32 = 4096;
/// Context window assumed for models we know nothing about.
const DEFAULT_CONTEXT_WINDOW: u64 = 128_000;

/// Which wire format and defaults a model uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// OpenAI Chat Completions (also any compatible server through a base URL).
    OpenAi,
    /// Anthropic Messages API.
    Anthropic,
    /// Ollama's OpenAI-compatible endpoint; no key needed.
    Ollama,
    /// A recorded transcript; `model` is the file path. See [`super::Replay`].
    Replay,
}

impl ProviderKind {
    /// The spec prefix and the key of the provider's `[llm.providers.*]` table.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Ollama => "ollama",
            ProviderKind::Replay => "replay",
        }
    }

    fn from_name(s: &str) -> Option<Self> {
        [Self::OpenAi, Self::Anthropic, Self::Ollama, Self::Replay]
            .into_iter()
            .find(|k| k.name() == s)
    }

    /// (base URL env var, default base URL, key env var) of the HTTP providers.
    fn defaults(self) -> (Option<&'static str>, &'static str, Option<&'static str>) {
        match self {
            ProviderKind::OpenAi => (
                Some("OPENAI_BASE_URL"),
                "https://api.openai.com/v1",
                Some("OPENAI_API_KEY"),
            ),
            ProviderKind::Anthropic => (
                Some("ANTHROPIC_BASE_URL"),
                "https://api.anthropic.com",
                Some("ANTHROPIC_API_KEY"),
            ),
            ProviderKind::Ollama => (None, "http://127.0.0.1:11434/v1", None),
            ProviderKind::Replay => (None, "", None),
        }
    }
}

/// A model named as `provider:model` (`openai:gpt-4.1`, `anthropic:claude-sonnet-4-5`,
/// `ollama:qwen2.5-coder`, `replay:FILE`). A bare name is Anthropic's if it starts with
/// `claude-`, else OpenAI's. `Display` gives the canonical `provider:model` form, which is
/// also the key of the model's `[llm.models."…"]` table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModelSpec {
    /// Which API (and defaults) to use.
    pub provider: ProviderKind,
    /// The provider's model name (for `replay`, the transcript file).
    pub model: String,
}

impl ModelSpec {
    /// Parses a spec; the error names the text and the known prefixes.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let text = text.trim();
        let (provider, model) = match text.split_once(':') {
            Some((prefix, model)) => {
                let provider = ProviderKind::from_name(prefix).ok_or_else(|| {
                    Error::Config(format!(
                        "unknown model provider `{prefix}` in `{text}`: write \
                         openai:MODEL, anthropic:MODEL, ollama:MODEL or replay:FILE"
                    ))
                })?;
                (provider, model)
            }
            None if text.starts_with("claude-") => (ProviderKind::Anthropic, text),
            None => (ProviderKind::OpenAi, text),
        };
        if model.trim().is_empty() {
            return Err(Error::Config(format!(
                "model spec `{text}` names no model: write e.g. openai:gpt-4.1"
            )));
        }
        Ok(Self {
            provider,
            model: model.trim().to_string(),
        })
    }
}

impl FromStr for ModelSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse(s)
    }
}

impl fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.provider.name(), self.model)
    }
}

/// An API key. Its `Debug` is redacted and it has no `Display`, so it cannot end up in a
/// log line or an error by accident.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key itself, for the one header that carries it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// How tool calls travel: the API's own tool fields, or fenced JSON blocks in plain text
/// (for models or servers without tool support).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolMode {
    /// The API's `tools` / `tool_calls` fields.
    #[default]
    Native,
    /// Fenced JSON blocks in the text: see [`super::TextTools`].
    Text,
}

/// Whether the model's replies are constrained to one tool call by the tools' schemas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Constrain {
    /// Free text (default).
    #[default]
    None,
    /// `response_format: {"type": "json_schema", ...}` (OpenAI-compatible servers that take
    /// it, llama.cpp's among them): every reply is one call. Text tool mode only.
    JsonSchema,
}

/// `[llm.providers.<openai|anthropic|ollama>]`.
#[derive(Deserialize, Default, Clone, Debug)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderConfig {
    /// Overrides `OPENAI_BASE_URL` / `ANTHROPIC_BASE_URL` and the default URL.
    pub base_url: Option<String>,
    /// The key itself (prefer `api_key_env`: config files get copied around).
    pub api_key: Option<ApiKey>,
    /// The environment variable holding the key, instead of the provider's usual one.
    pub api_key_env: Option<String>,
}

/// `[llm.models."provider:model"]`: per-model overrides.
#[derive(Deserialize, Default, Clone, Debug)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// `native` (default) or `text`: see [`ToolMode`].
    pub tool_mode: Option<ToolMode>,
    /// Tokens the model accepts in one call (prompt + answer).
    pub context_window: Option<u64>,
    /// Price of a million prompt tokens, USD.
    pub input_usd_per_mtok: Option<f64>,
    /// Price of a million completion tokens, USD.
    pub output_usd_per_mtok: Option<f64>,
    /// Upper bound on the answer's tokens (also the value used when a request sets 0).
    pub max_tokens: Option<u32>,
    /// `none` (default) or `json_schema`: see [`Constrain`].
    pub constrain: Option<Constrain>,
    /// The assists the agent loop gives this model (`model::assists`); default: all of them
    /// in text tool mode, those that help any model in native mode.
    pub assists: Option<AssistChoice>,
}

/// `assists = "small" | "native" | "none" | ["name", "family", "-name", …]`: which of the
/// agent loop's assists a model gets (the names are `model::assists`'s registry).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum AssistChoice {
    /// A preset, or names separated by commas.
    Preset(String),
    List(Vec<String>),
}

/// The brain config's `[llm]` table.
#[derive(Deserialize, Default, Clone, Debug)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// The model spec tasks use when they name none.
    pub default_model: Option<String>,
    /// Timeout of one HTTP attempt (humantime, e.g. `120s`, `2m`); default 120 s.
    pub timeout: Option<String>,
    /// Retries after the first attempt on 429, 5xx, connect errors and timeouts; default 4.
    pub max_retries: Option<u32>,
    /// By provider name: `openai`, `anthropic`, `ollama`.
    pub providers: HashMap<String, ProviderConfig>,
    /// By full spec, e.g. `"ollama:qwen2.5-coder"`.
    pub models: HashMap<String, ModelConfig>,
}

impl LlmConfig {
    /// Checks what can be checked without the network: the timeout, provider names, model
    /// specs used as keys, and the default model. Errors name the offending entry.
    pub fn validate(&self) -> Result<(), Error> {
        self.timeout()?;
        for name in self.providers.keys() {
            match ProviderKind::from_name(name) {
                Some(ProviderKind::Replay) | None => {
                    return Err(Error::Config(format!(
                        "[llm.providers.{name}]: unknown provider: use openai, anthropic or \
                         ollama (an OpenAI-compatible server is `openai` with a base_url)"
                    )));
                }
                Some(_) => {}
            }
        }
        for (key, m) in &self.models {
            let spec = ModelSpec::parse(key)
                .map_err(|e| Error::Config(format!("[llm.models.\"{key}\"]: {e}")))?;
            constrain_applies(&spec, m.tool_mode.unwrap_or_default(), m.constrain)?;
        }
        if let Some(m) = &self.default_model {
            ModelSpec::parse(m).map_err(|e| Error::Config(format!("[llm] default_model: {e}")))?;
        }
        Ok(())
    }

    /// The per-attempt timeout.
    pub fn timeout(&self) -> Result<Duration, Error> {
        match &self.timeout {
            None => Ok(DEFAULT_TIMEOUT),
            Some(t) => humantime::parse_duration(t).map_err(|e| {
                Error::Config(format!(
                    "[llm] timeout `{t}` is not a duration ({e}): write e.g. \"120s\" or \"2m\""
                ))
            }),
        }
    }

    /// The model's `[llm.models]` entry: by canonical spec, else by the exact text.
    pub fn model(&self, spec: &ModelSpec, text: &str) -> Option<&ModelConfig> {
        self.models
            .get(&spec.to_string())
            .or_else(|| self.models.get(text))
    }
}

/// USD prices per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    /// USD per million prompt tokens.
    pub input_usd_per_mtok: f64,
    /// USD per million completion tokens.
    pub output_usd_per_mtok: f64,
}

impl Price {
    /// What a call with this usage cost, in USD.
    pub fn cost(&self, usage: &Usage) -> f64 {
        (usage.prompt_tokens as f64 * self.input_usd_per_mtok
            + usage.completion_tokens as f64 * self.output_usd_per_mtok)
            / 1_000_000.0
    }
}

/// What the agent needs to budget a model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelInfo {
    /// Tokens per call (prompt + answer).
    pub context_window: u64,
    /// `None` when unknown: count tokens only.
    pub price: Option<Price>,
}

/// Built-in (model, context window, input $/Mtok, output $/Mtok), list prices at the time of
/// writing. Dated snapshots (`gpt-4o-2024-08-06`) match their family. Override in config.
const TABLE: &[(&str, u64, f64, f64)] = &[
    ("gpt-4.1", 1_047_576, 2.0, 8.0),
    ("gpt-4.1-mini", 1_047_576, 0.4, 1.6),
    ("gpt-4o", 128_000, 2.5, 10.0),
    ("gpt-4o-mini", 128_000, 0.15, 0.6),
    ("o3", 200_000, 2.0, 8.0),
    ("o4-mini", 200_000, 1.1, 4.4),
    ("claude-sonnet-4-5", 200_000, 3.0, 15.0),
    ("claude-opus-4-1", 200_000, 15.0, 75.0),
    ("claude-haiku-4-5", 200_000, 1.0, 5.0),
    ("deepseek-chat", 128_000, 0.28, 0.42),
];

/// The longest table entry that is `model` or a prefix of it followed by `-`.
fn lookup(model: &str) -> Option<(u64, f64, f64)> {
    TABLE
        .iter()
        .filter(|(name, ..)| {
            model == *name
                || model
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('-'))
        })
        .max_by_key(|(name, ..)| name.len())
        .map(|&(_, ctx, i, o)| (ctx, i, o))
}

/// Context window and price of a model: the config's `[llm.models]` entry over the built-in
/// table. Ollama and replay models cost nothing; unknown models have no price and a
/// 128 000-token window. An unparsable spec is treated as an unknown model.
pub fn model_info(spec_text: &str, cfg: &LlmConfig) -> ModelInfo {
    let spec = ModelSpec::parse(spec_text).ok();
    let (ctx, price) = match &spec {
        Some(s) if matches!(s.provider, ProviderKind::Ollama | ProviderKind::Replay) => (
            DEFAULT_CONTEXT_WINDOW,
            Some(Price {
                input_usd_per_mtok: 0.0,
                output_usd_per_mtok: 0.0,
            }),
        ),
        Some(s) => match lookup(&s.model) {
            Some((ctx, i, o)) => (
                ctx,
                Some(Price {
                    input_usd_per_mtok: i,
                    output_usd_per_mtok: o,
                }),
            ),
            None => (DEFAULT_CONTEXT_WINDOW, None),
        },
        None => (DEFAULT_CONTEXT_WINDOW, None),
    };
    let mc = match &spec {
        Some(s) => cfg.model(s, spec_text),
        None => cfg.models.get(spec_text),
    };
    let Some(mc) = mc else {
        return ModelInfo {
            context_window: ctx,
            price,
        };
    };
    let price = if mc.input_usd_per_mtok.is_some() || mc.output_usd_per_mtok.is_some() {
        Some(Price {
            input_usd_per_mtok: mc
                .input_usd_per_mtok
                .or(price.map(|p| p.input_usd_per_mtok))
                .unwrap_or(0.0),
            output_usd_per_mtok: mc
                .output_usd_per_mtok
                .or(price.map(|p| p.output_usd_per_mtok))
                .unwrap_or(0.0),
        })
    } else {
        price
    };
    ModelInfo {
        context_window: mc.context_window.unwrap_or(ctx),
        price,
    }
}

/// Everything an HTTP provider needs, resolved from config and environment.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub base_url: String,
    pub key: Option<ApiKey>,
    /// What to do when the key is refused, e.g. "set OPENAI_API_KEY or the config's api_key".
    pub key_hint: String,
    pub timeout: Duration,
    pub max_retries: u32,
    pub max_tokens_cap: Option<u32>,
    pub tool_mode: ToolMode,
    pub constrain: Constrain,
}

/// Refuses a `constrain` that cannot apply to the model, rather than dropping it.
fn constrain_applies(
    spec: &ModelSpec,
    tool_mode: ToolMode,
    constrain: Option<Constrain>,
) -> Result<(), Error> {
    if constrain != Some(Constrain::JsonSchema) {
        return Ok(());
    }
    if spec.provider == ProviderKind::Anthropic {
        return Err(Error::Config(format!(
            "[llm.models.\"{spec}\"] constrain = \"json_schema\" needs an OpenAI-compatible server that takes response_format (the Anthropic API does not): remove it"
        )));
    }
    if tool_mode != ToolMode::Text {
        return Err(Error::Config(format!(
            "[llm.models.\"{spec}\"] constrain = \"json_schema\" works in text tool mode only: add tool_mode = \"text\" or remove it"
        )));
    }
    Ok(())
}

/// Resolves URL, key and limits. `env` reads an environment variable (a parameter so tests
/// need not touch the process environment).
pub(crate) fn resolve(
    spec: &ModelSpec,
    cfg: &LlmConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Resolved, Error> {
    let (url_env, default_url, key_env) = spec.provider.defaults();
    let pc = cfg
        .providers
        .get(spec.provider.name())
        .cloned()
        .unwrap_or_default();
    let nonempty = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    let base_url = nonempty(pc.base_url.clone())
        .or_else(|| url_env.and_then(|v| nonempty(env(v))))
        .unwrap_or_else(|| default_url.to_string());
    let base_url = base_url.trim().trim_end_matches('/').to_string();
    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
        return Err(Error::Config(format!(
            "the base URL `{base_url}` for {} is not an http(s) URL: fix \
             [llm.providers.{}] base_url{}",
            spec.provider.name(),
            spec.provider.name(),
            url_env.map(|v| format!(" or {v}")).unwrap_or_default()
        )));
    }
    let named_env = pc.api_key_env.clone().filter(|s| !s.is_empty());
    let key_env_name = named_env.clone().or(key_env.map(str::to_string));
    let key_hint = match &key_env_name {
        Some(v) => format!("set {v} or the config's api_key"),
        None => format!("set api_key in [llm.providers.{}]", spec.provider.name()),
    };
    let key = pc
        .api_key
        .clone()
        .filter(|k| !k.expose().trim().is_empty())
        .or_else(|| {
            named_env
                .as_deref()
                .or(key_env)
                .and_then(|v| nonempty(env(v)))
                .map(ApiKey::new)
        });
    // A server on this machine (llama.cpp, vLLM, Ollama behind an OpenAI-compatible URL)
    // asks for no key: none is sent.
    if let (None, Some(_), Some(var)) = (&key, key_env, &key_env_name)
        && !on_loopback(&base_url)
    {
        return Err(Error::Config(format!(
            "no API key for {spec}: set {var} in the brain's environment (the brain reads \
             it, not the CLI: restart the brain after setting it), or api_key_env / api_key \
             in [llm.providers.{}] of the brain's config",
            spec.provider.name()
        )));
    }
    let mc = cfg.model(spec, &spec.to_string());
    let tool_mode = mc.and_then(|m| m.tool_mode).unwrap_or_default();
    let constrain = mc.and_then(|m| m.constrain).unwrap_or_default();
    constrain_applies(spec, tool_mode, Some(constrain))?;
    Ok(Resolved {
        base_url,
        key,
        key_hint,
        timeout: cfg.timeout()?,
        max_retries: cfg.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
        max_tokens_cap: mc.and_then(|m| m.max_tokens),
        tool_mode,
        constrain,
    })
}

/// Whether `url` names this machine: `localhost` (or a name under it) or a loopback address.
fn on_loopback(url: &str) -> bool {
    let Ok(u) = reqwest::Url::parse(url) else {
        return false;
    };
    let host = u.host_str().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.to_ascii_lowercase().ends_with(".localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The `max_tokens` to send: the request's, bounded by the model's configured cap; a
/// request with 0 gets the cap or [`DEFAULT_MAX_TOKENS`].
pub(crate) fn max_tokens(requested: u32, cap: Option<u32>) -> u32 {
    match (requested, cap) {
        (0, c) => c.unwrap_or(DEFAULT_MAX_TOKENS),
        (r, Some(c)) => r.min(c),
        (r, None) => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn specs() {
        let s = ModelSpec::parse("openai:gpt-4.1").unwrap();
        assert_eq!(
            (s.provider, s.model.as_str()),
            (ProviderKind::OpenAi, "gpt-4.1")
        );
        let s = ModelSpec::parse("ollama:qwen2.5-coder:7b").unwrap();
        assert_eq!(
            (s.provider, s.model.as_str()),
            (ProviderKind::Ollama, "qwen2.5-coder:7b")
        );
        assert_eq!(
            ModelSpec::parse("claude-sonnet-4-5").unwrap().provider,
            ProviderKind::Anthropic
        );
        assert_eq!(
            ModelSpec::parse("gpt-4o").unwrap().to_string(),
            "openai:gpt-4o"
        );
        assert_eq!(
            ModelSpec::parse("replay:/tmp/a.jsonl").unwrap().model,
            "/tmp/a.jsonl"
        );
        let e = ModelSpec::parse("gemini:pro").unwrap_err().to_string();
        assert!(e.contains("unknown model provider `gemini`"), "{e}");
        assert!(ModelSpec::parse("openai:").is_err());
    }

    #[test]
    fn config_toml() {
        let cfg: LlmConfig = toml::from_str(
            r#"
            default_model = "anthropic:claude-sonnet-4-5"
            timeout = "30s"
            [providers.openai]
            base_url = "http://localhost:8000/v1"
            api_key = "sk-secret-value"
            [models."ollama:qwen2.5-coder"]
            tool_mode = "text"
            context_window = 32768
            "#,
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.timeout().unwrap(), Duration::from_secs(30));
        assert!(!format!("{cfg:?}").contains("sk-secret-value"));
        let bad: Result<LlmConfig, _> = toml::from_str("timeot = \"1s\"");
        assert!(bad.is_err());
        let bad: LlmConfig = toml::from_str("[providers.gemini]\n").unwrap();
        assert!(bad.validate().is_err());
        // A constraint that cannot apply is refused, not dropped.
        for (toml, says) in [
            (
                "[models.\"anthropic:c\"]\ntool_mode = \"text\"\nconstrain = \"json_schema\"",
                "Anthropic",
            ),
            (
                "[models.\"openai:q\"]\nconstrain = \"json_schema\"",
                "text tool mode only",
            ),
        ] {
            let c: LlmConfig = toml::from_str(toml).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
        let ok: LlmConfig = toml::from_str(
            "[models.\"openai:q\"]\ntool_mode = \"text\"\nconstrain = \"json_schema\"",
        )
        .unwrap();
        ok.validate().unwrap();
    }

    #[test]
    fn resolution_precedence() {
        let spec = ModelSpec::parse("openai:gpt-4.1").unwrap();
        let mut cfg = LlmConfig::default();
        let e = resolve(&spec, &cfg, &env(&[])).unwrap_err();
        assert!(
            matches!(&e, Error::Config(m) if m.contains("OPENAI_API_KEY")),
            "{e}"
        );

        let r = resolve(&spec, &cfg, &env(&[("OPENAI_API_KEY", "k-env")])).unwrap();
        assert_eq!(r.base_url, "https://api.openai.com/v1");
        assert_eq!(r.key, Some(ApiKey::new("k-env")));
        assert_eq!((r.timeout, r.max_retries), (DEFAULT_TIMEOUT, 4));

        let e = &[
            ("OPENAI_API_KEY", "k-env"),
            ("MY_KEY", "k-mine"),
            ("OPENAI_BASE_URL", "http://env/v1/"),
        ];
        let r = resolve(&spec, &cfg, &env(e)).unwrap();
        assert_eq!(r.base_url, "http://env/v1");
        cfg.providers.insert(
            "openai".into(),
            ProviderConfig {
                base_url: Some("http://cfg/v1".into()),
                api_key: None,
                api_key_env: Some("MY_KEY".into()),
            },
        );
        let r = resolve(&spec, &cfg, &env(e)).unwrap();
        assert_eq!(r.base_url, "http://cfg/v1");
        assert_eq!(r.key, Some(ApiKey::new("k-mine")));
        cfg.providers.get_mut("openai").unwrap().api_key = Some(ApiKey::new("k-cfg"));
        let r = resolve(&spec, &cfg, &env(e)).unwrap();
        assert_eq!(r.key, Some(ApiKey::new("k-cfg")));
        assert!(!format!("{r:?}").contains("k-cfg"));

        let ollama = ModelSpec::parse("ollama:llama3").unwrap();
        let r = resolve(&ollama, &LlmConfig::default(), &env(&[])).unwrap();
        assert_eq!(r.base_url, "http://127.0.0.1:11434/v1");
        assert!(r.key.is_none());

        let anth = ModelSpec::parse("claude-haiku-4-5").unwrap();
        let e = resolve(&anth, &LlmConfig::default(), &env(&[])).unwrap_err();
        assert!(e.to_string().contains("ANTHROPIC_API_KEY"), "{e}");

        // A server on this machine needs no key; one elsewhere does.
        for (url, local) in [
            ("http://127.0.0.1:8080/v1", true),
            ("http://localhost:8080/v1", true),
            ("http://[::1]:8080/v1", true),
            ("http://127.9.9.9/v1", true),
            ("http://gpu.localhost/v1", true),
            ("http://10.0.0.5:8080/v1", false),
            ("https://localhost.example.com/v1", false),
        ] {
            let only_url = |k: &str| (k == "OPENAI_BASE_URL").then(|| url.to_string());
            let got = resolve(&spec, &LlmConfig::default(), &only_url);
            assert_eq!(got.is_ok(), local, "{url}: {got:?}");
            if let Ok(r) = got {
                assert!(r.key.is_none(), "{url}");
            }
        }
    }

    #[test]
    fn prices() {
        let cfg = LlmConfig::default();
        let i = model_info("openai:gpt-4o-mini-2024-07-18", &cfg);
        assert_eq!(i.price.unwrap().input_usd_per_mtok, 0.15);
        assert_eq!(
            model_info("gpt-4o", &cfg)
                .price
                .unwrap()
                .output_usd_per_mtok,
            10.0
        );
        let i = model_info("claude-sonnet-4-5-20250929", &cfg);
        assert_eq!(i.context_window, 200_000);
        let usage = Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 100_000,
        };
        assert!((i.price.unwrap().cost(&usage) - 4.5).abs() < 1e-9);
        let i = model_info("openai:mystery", &cfg);
        assert_eq!((i.context_window, i.price), (128_000, None));
        assert_eq!(
            model_info("ollama:x", &cfg).price.unwrap().cost(&usage),
            0.0
        );

        let mut cfg = LlmConfig::default();
        cfg.models.insert(
            "openai:mystery".into(),
            ModelConfig {
                context_window: Some(8192),
                output_usd_per_mtok: Some(1.0),
                ..Default::default()
            },
        );
        let i = model_info("mystery", &cfg);
        assert_eq!(i.context_window, 8192);
        assert_eq!(
            i.price,
            Some(Price {
                input_usd_per_mtok: 0.0,
                output_usd_per_mtok: 1.0
            })
        );
    }

    #[test]
    fn max_tokens_cap() {
        assert_eq!(max_tokens(0, None), DEFAULT_MAX_TOKENS);
        assert_eq!(max_tokens(0, Some(100)), 100);
        assert_eq!(max_tokens(500, Some(100)), 100);
        assert_eq!(max_tokens(500, None), 500);
    }
}
