//! A task's egress policy, fixed when the task is created: the secrets its commands may use
//! and the allow-list of what else they may reach, and the one decision made for every
//! connection a command opens through the egress proxy ([`EgressSpec::decide`]). Pure.

use serde::{Deserialize, Serialize};

/// Why a host pattern, an allow-list entry or a preset name is refused (each message quotes
/// it and says what would do).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{0:?} is not a host name or *.suffix pattern")]
    NotHost(String),
    #[error("{0:?} would match every name under a top-level domain; name a longer suffix")]
    TopLevel(String),
    #[error("an empty allow-list entry")]
    EmptyEntry,
    #[error("{0:?} is not an HTTP method")]
    NotMethod(String),
    #[error("{0:?}: write HOST[:PORT[,PORT]] [METHOD,METHOD] (one space)")]
    EntryForm(String),
    #[error(
        "{0:?}: a pass-through host's requests cannot be seen, so its methods cannot be limited"
    )]
    PassThroughMethods(String),
    #[error("{0:?} is not a port")]
    NotPort(String),
    #[error("unknown egress preset {0:?}: use {presets}", presets = PRESETS.join(", "))]
    UnknownPreset(String),
}

/// A host pattern: exactly `name`, any name under `.suffix` for `*.suffix` (not `suffix`
/// itself), or `*` for any host.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostPattern(String);

impl HostPattern {
    /// A host name or `*.suffix`; `any` also admits `*` (allow-lists do, secrets do not).
    pub fn parse_with(s: &str, any: bool) -> Result<Self, Error> {
        let lower = s.trim().to_ascii_lowercase();
        if lower == "*" && any {
            return Ok(Self(lower));
        }
        let name = lower.strip_prefix("*.").unwrap_or(&lower);
        let ip = name.parse::<std::net::IpAddr>().is_ok() && !lower.starts_with("*.");
        let ok = ip
            || (!name.is_empty()
                && name.len() <= 253
                && name.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                }));
        if !ok {
            return Err(Error::NotHost(s.to_string()));
        }
        if lower.starts_with("*.") && !name.contains('.') {
            return Err(Error::TopLevel(s.to_string()));
        }
        Ok(Self(lower))
    }

    pub fn parse(s: &str) -> Result<Self, Error> {
        Self::parse_with(s, false)
    }

    /// Whether `host` (any case, no port) is this pattern's.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if self.0 == "*" {
            return true;
        }
        match self.0.strip_prefix("*.") {
            Some(suffix) => host
                .strip_suffix(suffix)
                .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
            None => host == self.0,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// For `*.suffix` where `suffix` is a public suffix — a name under which anyone can
    /// register their own (`co.uk`, and private ones such as `herokuapp.com` or `github.io`),
    /// or a name inside one with no registrable domain of its own — that suffix, by the Public
    /// Suffix List compiled into the `psl` crate (an unknown top-level name counts as one).
    /// A secret bound to such a pattern would go to strangers' hosts, so secrets refuse it;
    /// allow-lists may name it (they grant reach, not a credential, and admit `*` itself).
    pub fn spans_public_suffix(&self) -> Option<&str> {
        let suffix = self.0.strip_prefix("*.")?;
        psl::domain(suffix.as_bytes()).is_none().then_some(suffix)
    }
}

impl TryFrom<String> for HostPattern {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        Self::parse_with(&s, true)
    }
}

impl From<HostPattern> for String {
    fn from(h: HostPattern) -> String {
        h.0
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One allow-list entry: `HOST[:PORT[,PORT...]] [METHOD,...]`, or `pass:HOST[:PORTS]` for a
/// host whose TLS is never terminated (it pins certificates or wants a client certificate:
/// nothing can be injected there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllowRule {
    pub host: HostPattern,
    /// Empty: any port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// Empty: any method. Methods can only be seen where the brain terminates TLS, so a rule
    /// with methods sends its host's connections through the brain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pass_through: bool,
}

impl AllowRule {
    pub fn parse(s: &str) -> Result<Self, Error> {
        let s = s.trim();
        let (pass_through, s) = match s.strip_prefix("pass:") {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let mut parts = s.split_whitespace();
        let target = parts.next().ok_or(Error::EmptyEntry)?;
        let methods: Vec<String> = match parts.next() {
            Some(m) => m
                .split(',')
                .map(|m| {
                    let up = m.trim().to_ascii_uppercase();
                    if up.is_empty() || !up.bytes().all(|b| b.is_ascii_uppercase()) {
                        Err(Error::NotMethod(m.to_string()))
                    } else {
                        Ok(up)
                    }
                })
                .collect::<Result<_, _>>()?,
            None => vec![],
        };
        if parts.next().is_some() {
            return Err(Error::EntryForm(s.to_string()));
        }
        if pass_through && !methods.is_empty() {
            return Err(Error::PassThroughMethods(s.to_string()));
        }
        let (host, ports) = match target.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (
                h,
                p.split(',')
                    .map(|p| {
                        p.parse::<u16>()
                            .ok()
                            .filter(|p| *p > 0)
                            .ok_or_else(|| Error::NotPort(p.to_string()))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            _ => (target, vec![]),
        };
        Ok(Self {
            host: HostPattern::parse_with(host, true)?,
            ports,
            methods,
            pass_through,
        })
    }

    pub fn matches(&self, host: &str, port: u16) -> bool {
        self.host.matches(host) && (self.ports.is_empty() || self.ports.contains(&port))
    }

    /// Whether the worker may connect by itself, uninspected.
    pub fn direct(&self) -> bool {
        self.methods.is_empty()
    }
}

impl std::fmt::Display for AllowRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.pass_through {
            f.write_str("pass:")?;
        }
        f.write_str(self.host.as_str())?;
        if !self.ports.is_empty() {
            let p: Vec<String> = self.ports.iter().map(u16::to_string).collect();
            write!(f, ":{}", p.join(","))?;
        }
        if !self.methods.is_empty() {
            write!(f, " {}", self.methods.join(","))?;
        }
        Ok(())
    }
}

/// The allow-list presets.
pub const PRESETS: &[&str] = &["none", "registries", "all"];

/// The hosts of a preset: `none` nothing, `registries` the common package registries over
/// HTTPS (read only: GET and HEAD, seen by the brain, so a push or an upload to them is
/// refused; Debian's mirrors too, so apt needs `https://` sources), `all` any host directly.
pub fn preset(name: &str) -> Result<Vec<AllowRule>, Error> {
    let rules: &[&str] = match name {
        "none" => &[],
        "registries" => &[
            "registry.npmjs.org:443 GET,HEAD",
            "registry.yarnpkg.com:443 GET,HEAD",
            "pypi.org:443 GET,HEAD",
            "files.pythonhosted.org:443 GET,HEAD",
            "crates.io:443 GET,HEAD",
            "index.crates.io:443 GET,HEAD",
            "static.crates.io:443 GET,HEAD",
            "static.rust-lang.org:443 GET,HEAD",
            "proxy.golang.org:443 GET,HEAD",
            "sum.golang.org:443 GET,HEAD",
            "repo.maven.apache.org:443 GET,HEAD",
            "repo1.maven.org:443 GET,HEAD",
            "rubygems.org:443 GET,HEAD",
            "deb.debian.org:443 GET,HEAD",
            "security.debian.org:443 GET,HEAD",
            "github.com:443 GET,HEAD",
            "codeload.github.com:443 GET,HEAD",
            "objects.githubusercontent.com:443 GET,HEAD",
        ],
        "all" => &["*"],
        other => return Err(Error::UnknownPreset(other.to_string())),
    };
    Ok(rules
        .iter()
        .map(|r| AllowRule::parse(r).expect("presets parse"))
        .collect())
}

/// A secret as a task's policy knows it: where it may go (its value stays in the store).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub name: String,
    pub env: String,
    pub hosts: Vec<HostPattern>,
    pub port: u16,
}

impl Binding {
    pub fn bound_to(&self, host: &str, port: u16) -> bool {
        self.port == port && self.hosts.iter().any(|h| h.matches(host))
    }
}

/// A task's egress policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressSpec {
    /// The secrets its commands may use, as they were bound when the task was created.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<Binding>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<AllowRule>,
}

/// What happens to one connection a command opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The worker connects by itself, uninspected.
    Direct,
    /// The brain terminates TLS, checks each request's method against `methods` (empty:
    /// any), puts in the secrets named in `inject` and connects upstream.
    Intercept {
        inject: Vec<String>,
        methods: Vec<String>,
    },
    /// Refused, and why.
    Refuse(String),
}

impl EgressSpec {
    /// The rules whose hosts the worker connects to itself.
    pub fn direct_rules(&self) -> Vec<&AllowRule> {
        self.allow
            .iter()
            .filter(|r| r.direct() && !self.secrets.iter().any(|s| overlaps(r, s)))
            .collect()
    }

    /// The one decision for a connection to `host:port` (`plain`: an unencrypted HTTP
    /// request, which the brain never puts a secret into).
    pub fn decide(&self, host: &str, port: u16, plain: bool) -> Decision {
        let inject: Vec<String> = self
            .secrets
            .iter()
            .filter(|s| s.bound_to(host, port))
            .map(|s| s.name.clone())
            .collect();
        let rules: Vec<&AllowRule> = self
            .allow
            .iter()
            .filter(|r| r.matches(host, port))
            .collect();
        if plain {
            return if !inject.is_empty() {
                Decision::Refuse(format!(
                    "{host}:{port} is bound to secret {}, which is only sent over HTTPS",
                    inject.join(", ")
                ))
            } else if rules.iter().any(|r| r.direct()) {
                Decision::Direct
            } else {
                Decision::Refuse(format!(
                    "plain HTTP to {host}:{port} is not on this task's allow-list"
                ))
            };
        }
        if !inject.is_empty() {
            if let Some(r) = rules.iter().find(|r| r.pass_through) {
                return Decision::Refuse(format!(
                    "{host}:{port} is pass-through ({r}), so secret {} cannot be injected there",
                    inject.join(", ")
                ));
            }
            // A secret's host takes any method unless the allow-list limits it.
            let methods = if rules.iter().any(|r| r.direct()) || rules.is_empty() {
                vec![]
            } else {
                methods_of(&rules)
            };
            return Decision::Intercept { inject, methods };
        }
        if rules.iter().any(|r| r.direct()) {
            return Decision::Direct;
        }
        if !rules.is_empty() {
            return Decision::Intercept {
                inject: vec![],
                methods: methods_of(&rules),
            };
        }
        Decision::Refuse(format!("{host}:{port} is not on this task's allow-list"))
    }
}

fn methods_of(rules: &[&AllowRule]) -> Vec<String> {
    let mut m: Vec<String> = rules.iter().flat_map(|r| r.methods.clone()).collect();
    m.sort();
    m.dedup();
    m
}

/// Whether a direct rule could take a connection a secret is bound to (then the worker must
/// ask the brain for that host instead).
fn overlaps(rule: &AllowRule, secret: &Binding) -> bool {
    if !rule.ports.is_empty() && !rule.ports.contains(&secret.port) {
        return false;
    }
    if rule.host.as_str() == "*" {
        return true;
    }
    secret.hosts.iter().any(|h| {
        h.matches(rule.host.as_str().trim_start_matches("*."))
            || rule.host.matches(h.as_str().trim_start_matches("*."))
            || h == &rule.host
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(secrets: &[(&str, &str, u16)], allow: &[&str]) -> EgressSpec {
        EgressSpec {
            secrets: secrets
                .iter()
                .map(|(n, h, p)| Binding {
                    name: n.to_string(),
                    env: n.to_ascii_uppercase(),
                    hosts: vec![HostPattern::parse(h).unwrap()],
                    port: *p,
                })
                .collect(),
            allow: allow.iter().map(|a| AllowRule::parse(a).unwrap()).collect(),
        }
    }

    #[test]
    fn each_connection_gets_one_decision() {
        let s = spec(
            &[("github", "api.github.com", 443)],
            &[
                "registry.npmjs.org",
                "api.example.com:443 GET,HEAD",
                "pass:pinned.example.com",
            ],
        );
        assert_eq!(
            s.decide("api.github.com", 443, false),
            Decision::Intercept {
                inject: vec!["github".into()],
                methods: vec![]
            }
        );
        // The secret's port only.
        assert!(matches!(
            s.decide("api.github.com", 8443, false),
            Decision::Refuse(_)
        ));
        assert_eq!(s.decide("registry.npmjs.org", 443, false), Decision::Direct);
        assert_eq!(
            s.decide("api.example.com", 443, false),
            Decision::Intercept {
                inject: vec![],
                methods: vec!["GET".into(), "HEAD".into()]
            }
        );
        assert_eq!(s.decide("pinned.example.com", 443, false), Decision::Direct);
        assert!(matches!(
            s.decide("evil.example.net", 443, false),
            Decision::Refuse(r) if r.contains("not on this task's allow-list")
        ));
        assert!(matches!(
            s.decide("api.github.com", 443, true),
            Decision::Refuse(r) if r.contains("only sent over HTTPS")
        ));
        assert_eq!(s.decide("registry.npmjs.org", 80, true), Decision::Direct);
    }

    #[test]
    fn a_direct_rule_never_takes_a_secrets_host() {
        let s = spec(&[("gh", "api.github.com", 443)], &["*", "*.github.com"]);
        assert!(s.direct_rules().is_empty());
        assert!(matches!(
            s.decide("api.github.com", 443, false),
            Decision::Intercept { .. }
        ));
        let s = spec(&[("gh", "api.github.com", 443)], &["*:80"]);
        assert_eq!(s.direct_rules().len(), 1);
        let pinned = spec(&[("gh", "api.github.com", 443)], &["pass:api.github.com"]);
        assert!(matches!(
            pinned.decide("api.github.com", 443, false),
            Decision::Refuse(r) if r.contains("pass-through")
        ));
    }

    #[test]
    fn allow_rules_parse_and_print_back() {
        for s in [
            "registry.npmjs.org",
            "*.example.com:443,8443",
            "api.example.com:443 GET,HEAD",
            "pass:pinned.example.com:443",
            "127.0.0.1:8080",
            "*",
        ] {
            assert_eq!(AllowRule::parse(s).unwrap().to_string(), s);
        }
        for bad in [
            "",
            "a.com:0",
            "a.com:x",
            "a.com GET POST",
            "pass:a.com GET",
            "a.com g3t",
            "*.com",
        ] {
            assert!(AllowRule::parse(bad).is_err(), "{bad}");
        }
        assert!(preset("registries").unwrap().len() > 5);
        assert!(preset("some").is_err());
        let p = HostPattern::parse("*.example.com").unwrap();
        assert!(p.matches("a.b.example.com") && !p.matches("example.com"));
        assert!(!p.matches("badexample.com"));
        assert!(HostPattern::parse("*").is_err());
    }

    #[test]
    fn wildcards_over_a_public_suffix_are_told_apart() {
        for (pattern, suffix) in [
            ("*.herokuapp.com", "herokuapp.com"),
            ("*.github.io", "github.io"),
            ("*.co.uk", "co.uk"),
            ("*.s3.amazonaws.com", "s3.amazonaws.com"),
            ("*.com.au", "com.au"),
            ("*.appspot.com", "appspot.com"),
        ] {
            let p = HostPattern::parse_with(pattern, true).unwrap();
            assert_eq!(p.spans_public_suffix(), Some(suffix), "{pattern}");
        }
        for pattern in [
            "*.example.com",
            "*.myapp.herokuapp.com",
            "*.example.co.uk",
            "*.a.b.example.com",
            "github.io",
            "co.uk",
            "127.0.0.1",
            "*",
        ] {
            let p = HostPattern::parse_with(pattern, true).unwrap();
            assert_eq!(p.spans_public_suffix(), None, "{pattern}");
        }
    }
}
