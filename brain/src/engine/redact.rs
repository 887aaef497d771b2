//! Masks secrets (LLM keys, delivery tokens, command secrets) in text bound for the log, the
//! model, a watcher or a worker. It starts with what the brain knows when it starts and
//! learns secrets set while it runs (`brain secret set`) the moment they are set; it never
//! forgets one while it runs (a removed secret's value may still be in a command's output).

use std::sync::{Arc, RwLock};

use shared::locks::RwLockExt;

use crate::llm;

/// Secrets this short are not masked (they would mask ordinary words).
const SHORTEST: usize = 8;

/// The secrets to mask: every LLM key the brain can see (environment and config), the
/// `extra` ones and those learnt since, eight characters or longer.
pub struct Redactor {
    /// Why a lock: secrets are learnt while tasks mask their output; a reader takes the
    /// current list (an `Arc`) and lets go at once, a writer replaces it whole.
    secrets: RwLock<Arc<Vec<String>>>,
}

/// The LLM keys the brain knows: the providers' environment variables' values and the
/// config's own keys.
fn llm_keys(cfg: &llm::LlmConfig) -> Vec<String> {
    ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"]
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
        .collect()
}

impl Redactor {
    pub fn new(cfg: &llm::LlmConfig, extra: &[String]) -> Self {
        let mut secrets: Vec<String> = llm_keys(cfg)
            .into_iter()
            .chain(extra.iter().cloned())
            .filter(|s| s.len() >= SHORTEST)
            .collect();
        secrets.sort();
        secrets.dedup();
        Self {
            secrets: RwLock::new(Arc::new(secrets)),
        }
    }

    /// Masks the keys of a reloaded LLM config too (the old ones stay masked).
    pub fn learn_llm(&self, cfg: &llm::LlmConfig) {
        self.learn(llm_keys(cfg));
    }

    /// Masks `values` too from now on: everything masked after this returns masks them.
    pub fn learn(&self, values: impl IntoIterator<Item = String>) {
        let mut secrets = self.secrets.write_locked();
        let mut next: Vec<String> = secrets.iter().cloned().collect();
        next.extend(values.into_iter().filter(|s| s.len() >= SHORTEST));
        next.sort();
        next.dedup();
        if next.len() != secrets.len() {
            *secrets = Arc::new(next);
        }
    }

    /// The secrets masked now.
    fn secrets(&self) -> Arc<Vec<String>> {
        self.secrets.read_locked().clone()
    }

    pub fn apply(&self, text: &str) -> String {
        let mut t = text.to_string();
        for s in self.secrets().iter() {
            if t.contains(s.as_str()) {
                t = t.replace(s.as_str(), "[redacted]");
            }
        }
        t
    }
}

impl Redactor {
    /// A masker for output that arrives in pieces: a secret split across two pieces is
    /// masked too, because the end of a piece that could begin a secret is held back until
    /// the next piece shows whether it does (as are bytes of a character cut in two).
    pub fn stream(self: &std::sync::Arc<Self>) -> Streaming {
        Streaming {
            redactor: self.clone(),
            held: Vec::new(),
        }
    }
}

/// See [`Redactor::stream`].
pub struct Streaming {
    redactor: std::sync::Arc<Redactor>,
    held: Vec<u8>,
}

impl Streaming {
    /// The masked text that can be shown now.
    pub fn push(&mut self, data: &[u8]) -> String {
        self.held.extend_from_slice(data);
        // Only whole characters; an invalid sequence (not a cut one) is shown replaced.
        let valid = match std::str::from_utf8(&self.held) {
            Ok(_) => self.held.len(),
            Err(e) if e.error_len().is_some() => self.held.len(),
            Err(e) => e.valid_up_to(),
        };
        let text = String::from_utf8_lossy(&self.held[..valid]).into_owned();
        let rest = self.held[valid..].to_vec();
        let masked = self.redactor.apply(&text);
        // The longest end of the text that is the start of a secret waits for more.
        let keep = self
            .redactor
            .secrets()
            .iter()
            .flat_map(|secret| {
                (1..secret.len().min(masked.len() + 1)).rev().find(|&n| {
                    masked.is_char_boundary(masked.len() - n)
                        && secret
                            .as_bytes()
                            .starts_with(&masked.as_bytes()[masked.len() - n..])
                })
            })
            .max()
            .unwrap_or(0);
        let (now, later) = masked.split_at(masked.len() - keep);
        self.held = later.as_bytes().to_vec();
        self.held.extend_from_slice(&rest);
        now.to_string()
    }

    /// What was held back, once no more comes.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&std::mem::take(&mut self.held)).into_owned();
        self.redactor.apply(&rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_cut_across_pieces_is_masked_and_nothing_else_is_held() {
        let cfg = llm::LlmConfig::default();
        let r = std::sync::Arc::new(Redactor::new(&cfg, &["tok-SECRET-123456".into()]));
        let mut s = r.stream();
        let mut shown = String::new();
        for piece in ["hello tok-SEC", "RET-12", "3456 and ", "to", "k but not"] {
            shown.push_str(&s.push(piece.as_bytes()));
        }
        // The last "t" could begin the secret: it waits for the end.
        assert_eq!(shown, "hello [redacted] and tok but no");
        assert_eq!(s.finish(), "t");
        assert_eq!(s.finish(), "");
        // A character cut in two waits for its other half.
        let mut s = r.stream();
        let e = "é".as_bytes();
        assert_eq!(s.push(&e[..1]), "");
        assert_eq!(s.push(&e[1..]), "é");
    }

    #[test]
    fn a_secret_learnt_later_is_masked_from_then_on_even_in_a_stream_already_open() {
        let cfg = llm::LlmConfig::default();
        let r = std::sync::Arc::new(Redactor::new(&cfg, &[]));
        let mut s = r.stream();
        assert_eq!(r.apply("key late-secret-42"), "key late-secret-42");
        r.learn(["late-secret-42".to_string(), "short".to_string()]);
        assert_eq!(r.apply("key late-secret-42"), "key [redacted]");
        assert_eq!(
            r.apply("short"),
            "short",
            "under eight characters: not masked"
        );
        let mut shown = s.push(b"out: late-sec");
        shown.push_str(&s.push(b"ret-42 done"));
        shown.push_str(&s.finish());
        assert_eq!(shown, "out: [redacted] done");
        // Learning one again changes nothing.
        r.learn(["late-secret-42".to_string()]);
        assert_eq!(r.secrets().len(), 1);
    }
}
