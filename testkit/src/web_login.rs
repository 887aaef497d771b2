//! The web API's ways in, as tests make them: a brain with `--web-listen` whose models are
//! the fake, an API token of a role (`brain admin token create`), and a person's one-time
//! login link (`brain web login`).

use crate::fake_llm::FakeLlm;
use crate::{BrainOptions, Cluster, stdout, text};

impl BrainOptions {
    /// [`BrainOptions::with_llm`] (no extra config) with the web API listening.
    pub fn web_with_llm(llm: &FakeLlm, key: &str) -> Self {
        Self {
            web: true,
            ..Self::with_llm(llm, key, "")
        }
    }
}

impl Cluster {
    /// A web API token named `name` of `role` that lasts `ttl` (`1h`, `3s`, ...).
    pub fn web_token(&self, name: &str, role: &str, ttl: &str) -> String {
        let out = self.brain_cli(&[
            "admin", "token", "create", "--name", name, "--role", role, "--ttl", ttl,
        ]);
        assert!(out.status.success(), "{}", text(&out));
        stdout(&out).trim().to_string()
    }

    /// The one-time link that logs a browser in as `name` of `role`.
    pub fn web_login(&self, name: &str, role: &str) -> String {
        let out = self.brain_cli(&["web", "login", "--name", name, "--role", role]);
        assert!(out.status.success(), "{}", text(&out));
        stdout(&out).trim().to_string()
    }
}
