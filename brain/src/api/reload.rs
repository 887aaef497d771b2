//! `brain config reload` (and SIGHUP): the config file read again and, when it is valid,
//! applied without a restart where it can be. The `[llm]` and `[agent]` sections apply to
//! tasks that start from now on (a running task keeps the model settings it started with);
//! a change to any other section is named as needing a restart. An invalid file changes
//! nothing.

use std::sync::Arc;

use crate::config::{Config, Error};

/// What a reload did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloaded {
    pub file: String,
    /// Sections that changed and apply now.
    pub applied: Vec<&'static str>,
    /// Sections that changed and apply only after a restart.
    pub need_restart: Vec<&'static str>,
}

/// The sections a reload applies.
const LIVE: &[&str] = &["llm", "agent"];

/// Each section of `c` by name, in words that differ when the section does: its `Debug`
/// form, and for [llm] its keys too (`Debug` masks them, and a new key is a change). Only
/// compared, never shown.
fn sections(c: &Config) -> Vec<(&'static str, String)> {
    let keys: Vec<(&String, Option<&str>)> = c
        .llm
        .providers
        .iter()
        .map(|(name, p)| (name, p.api_key.as_ref().map(|k| k.expose())))
        .collect();
    vec![
        ("llm", format!("{:?} {keys:?}", c.llm)),
        ("agent", format!("{:?}", c.agent)),
        ("deliver", format!("{:?}", c.deliver)),
        ("provision", format!("{:?}", c.provision)),
        ("egress", format!("{:?}", c.egress)),
        ("web", format!("{:?}", c.web)),
        ("placement", format!("{:?}", c.placement)),
        ("store", format!("{:?}", c.store)),
    ]
}

/// What changed from `old` to `new`, split into what applies now and what needs a restart.
pub fn compare(old: &Config, new: &Config) -> (Vec<&'static str>, Vec<&'static str>) {
    let (mut applied, mut restart) = (Vec::new(), Vec::new());
    for ((name, a), (_, b)) in sections(old).into_iter().zip(sections(new)) {
        if a != b {
            if LIVE.contains(&name) {
                applied.push(name);
            } else {
                restart.push(name);
            }
        }
    }
    (applied, restart)
}

impl super::Shared {
    /// Reads the config file again and applies what can be applied.
    pub fn reload_config(&self) -> Result<Reloaded, Error> {
        let new = Config::load(&self.config_path)?;
        let old = self.config.get();
        let (applied, need_restart) = compare(&old, &new);
        if applied.contains(&"llm") {
            self.engine.reload_llm(new.llm.clone());
        }
        // The sections that need a restart stay as they were until one: what the brain
        // says it runs with is what it runs with.
        let mut next = (*old).clone();
        next.llm = new.llm;
        next.agent = new.agent;
        self.config.set(Arc::new(next));
        let reloaded = Reloaded {
            file: self.config_path.display().to_string(),
            applied,
            need_restart,
        };
        tracing::info!(
            file = %reloaded.file,
            applied = ?reloaded.applied,
            need_restart = ?reloaded.need_restart,
            "config reloaded"
        );
        Ok(reloaded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_applied_or_named_as_needing_a_restart() {
        let old = Config::parse("[agent]\nmax_steps = 10\n").unwrap();
        let new = Config::parse(
            "[agent]\nmax_steps = 20\n[llm]\ndefault_model = \"openai:gpt-4.1\"\n[web]\nmax_connections = 7\n",
        )
        .unwrap();
        let (applied, restart) = compare(&old, &new);
        assert_eq!(applied, ["llm", "agent"]);
        assert_eq!(restart, ["web"]);
        assert_eq!(compare(&new, &new), (vec![], vec![]));
    }
}
