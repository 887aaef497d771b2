//! Masks secrets (LLM keys, delivery tokens) in text bound for the log, the model, a watcher or a worker.

use crate::llm;

/// The secrets to mask: every LLM key the brain can see (environment and config) and the
/// `extra` ones, eight characters or longer.
pub struct Redactor(Vec<String>);

impl Redactor {
    pub fn new(cfg: &llm::LlmConfig, extra: &[String]) -> Self {
        let mut secrets: Vec<String> = ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"]
            .iter()
            .filter_map(|v| std::env::var(v).ok())
            .chain(
                cfg.providers
                    .values()
                    .filter_map(|p| p.api_key.as_ref().map(|k| k.expose().to_string())),
            )
            .chain(
                cfg.providers
                    .values()
                    .filter_map(|p| p.api_key_env.as_ref())
                    .filter_map(|v| std::env::var(v).ok()),
            )
            .chain(extra.iter().cloned())
            .filter(|s| s.len() >= 8)
            .collect();
        secrets.sort();
        secrets.dedup();
        Self(secrets)
    }

    pub fn apply(&self, text: &str) -> String {
        let mut t = text.to_string();
        for s in &self.0 {
            if t.contains(s.as_str()) {
                t = t.replace(s.as_str(), "[redacted]");
            }
        }
        t
    }
}
