//! What this host enforces, mechanism by mechanism, and why not where it does not: the text of
//! `worker doctor` and the list the worker's hello carries.

/// One mechanism's state on this host.
#[derive(Debug, Clone)]
pub struct Mechanism {
    pub name: &'static str,
    pub active: bool,
    pub detail: String,
}

/// What this host enforces, and why not where it does not.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub mechanisms: Vec<Mechanism>,
}

impl Report {
    /// Names of the active mechanisms, for the hello.
    pub fn active(&self) -> Vec<String> {
        self.mechanisms
            .iter()
            .filter(|m| m.active)
            .map(|m| m.name.to_string())
            .collect()
    }

    /// The `worker doctor` text.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for m in &self.mechanisms {
            s.push_str(&format!(
                "{:<9} {:<8} {}\n",
                m.name,
                if m.active { "active" } else { "MISSING" },
                m.detail
            ));
        }
        s
    }
}
