//! Which repositories the brain may clone and push to, decided before git runs: a task's
//! `--git` URL is named by an operator, and the brain's own git acts with the brain's
//! credentials on the brain's host, so a URL is an instruction to reach somewhere with them.
//!
//! - Transports: `https` and `ssh` by default; `http`, `git` and `file` (local paths too)
//!   only when `[deliver] git_schemes` names them; git's remote helpers (`ext::`, `fd::`, any
//!   other `NAME::`) never. Git enforces the same list itself (`GIT_ALLOW_PROTOCOL`), for
//!   redirects and submodules too.
//! - Addresses: a host that resolves to an internal address ([`shared::net::is_internal`]:
//!   loopback, private, link-local, ...) is refused unless `[deliver] git_internal_hosts`
//!   allows it, and an HTTP(S) clone dials the address that was checked
//!   (`http.curloptResolve`), so a second lookup cannot answer otherwise (DNS rebinding).
//! - Redirects: none is followed (`http.followRedirects=false`, for clone, fetch and push),
//!   so the host checked is the only one reached; the error says to name the final URL.
//!
//! The credentials themselves are bound separately: the credential helper answers only for
//! `https` and the hosts they are for ([`super::Credentials::hosts`]).

use std::net::IpAddr;
use std::time::Duration;

/// How long resolving a repository's host may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The transports git may use.
pub const TRANSPORTS: &[&str] = &["https", "ssh", "http", "git", "file"];

/// Why a repository URL is refused, or a transport in the config is unknown.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL cannot be read as git reads it, or names a transport git may not use.
    #[error("repository {url}: {source}")]
    Unreadable {
        url: String,
        #[source]
        source: UrlError,
    },
    /// The transport is one git could use, but the config does not allow it; `what` names
    /// it (`local paths and file:// URLs are`).
    #[error(
        "repository {url}: {what} not allowed (the brain's git uses {allowed}; add {transport:?} to `[deliver] git_schemes` in the brain's config to allow it)"
    )]
    Transport {
        url: String,
        what: String,
        allowed: String,
        transport: &'static str,
    },
    #[error(
        "repository {url}: {host} is pinned to {ip}, an internal address (loopback, private, link-local or reserved); set `[deliver] git_internal_hosts = true` in the brain's config to allow such hosts"
    )]
    PinnedInternal {
        url: String,
        host: String,
        ip: IpAddr,
    },
    /// The host does not resolve, or resolves to an internal address.
    #[error(
        "repository {url}: {source}; set `[deliver] git_internal_hosts = true` in the brain's config to allow such hosts"
    )]
    NotPublic {
        url: String,
        #[source]
        source: shared::net::Error,
    },
    #[error("deliver.git_schemes: {0:?} is not one of {transports}", transports = TRANSPORTS.join(", "))]
    UnknownTransport(String),
}

/// Why a URL cannot be read as git reads it, or may never be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("an empty URL")]
    Empty,
    #[error("a URL may not start with '-'")]
    Dash,
    #[error("a URL may not hold control characters")]
    Control,
    #[error("{0}:// is not a transport the brain's git uses")]
    Scheme(String),
    #[error("git remote helpers (NAME::ADDRESS) are never used")]
    Helper,
    #[error("an ssh address without a host")]
    SshWithoutHost,
    #[error("{0:?} is not a host")]
    NotHost(String),
    #[error("a URL without a host")]
    NoHost,
    #[error("{0:?} is not a port")]
    NotPort(String),
}

/// A repository URL, as far as the policy cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// One of [`TRANSPORTS`].
    pub transport: &'static str,
    /// The host, lower case, without brackets (none for `file`).
    pub host: Option<String>,
    pub port: Option<u16>,
}

/// Reads what transport and host `url` names, as git would.
pub fn parse(url: &str) -> Result<Remote, UrlError> {
    let url = url.trim();
    if url.is_empty() {
        return Err(UrlError::Empty);
    }
    if url.starts_with('-') {
        return Err(UrlError::Dash);
    }
    if url.chars().any(char::is_control) {
        return Err(UrlError::Control);
    }
    if let Some((scheme, rest)) = url.split_once("://") {
        let transport = match scheme.to_ascii_lowercase().as_str() {
            "https" => "https",
            "http" => "http",
            "ssh" | "git+ssh" | "ssh+git" => "ssh",
            "git" => "git",
            "file" => "file",
            other => return Err(UrlError::Scheme(other.to_string())),
        };
        if transport == "file" {
            return Ok(Remote {
                transport,
                host: None,
                port: None,
            });
        }
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (host, port) = split_authority(authority)?;
        return Ok(Remote {
            transport,
            host: Some(host),
            port,
        });
    }
    // `NAME::ADDRESS` calls git's remote helper NAME (`ext::` runs a command).
    let before_slash = url.split('/').next().unwrap_or("");
    if before_slash.contains("::") {
        return Err(UrlError::Helper);
    }
    // scp-like `[user@]host:path`: a colon before any slash.
    if let Some((authority, _)) = before_slash.split_once(':')
        && !authority.is_empty()
    {
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(UrlError::SshWithoutHost);
        }
        return Ok(Remote {
            transport: "ssh",
            host: Some(host.to_ascii_lowercase()),
            port: None,
        });
    }
    Ok(Remote {
        transport: "file",
        host: None,
        port: None,
    })
}

fn split_authority(a: &str) -> Result<(String, Option<u16>), UrlError> {
    let (host, port) =
        shared::net::split_host_port(a).ok_or_else(|| UrlError::NotHost(a.to_string()))?;
    if host.is_empty() {
        return Err(UrlError::NoHost);
    }
    let port = match port {
        None | Some("") => None,
        Some(p) => Some(
            p.parse::<u16>()
                .map_err(|_| UrlError::NotPort(p.to_string()))?,
        ),
    };
    Ok((host.to_ascii_lowercase(), port))
}

/// Where the brain's git may go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Transports allowed, from [`TRANSPORTS`].
    pub transports: Vec<String>,
    /// Whether hosts that resolve to internal addresses are allowed.
    pub internal_hosts: bool,
    /// Names resolved to these addresses instead of asking DNS (tests, split horizons).
    pub resolve: std::collections::BTreeMap<String, IpAddr>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            transports: vec!["https".into(), "ssh".into()],
            internal_hosts: false,
            resolve: Default::default(),
        }
    }
}

/// A URL the policy let through, and how git must reach it.
#[derive(Debug, Clone)]
pub struct Checked {
    /// `GIT_ALLOW_PROTOCOL`: the transports git itself may use.
    pub protocols: String,
    /// `http.curloptResolve` entries: HTTP(S) hosts pinned to the address that was checked.
    pub pins: Vec<String>,
}

impl Policy {
    /// Checks the transports named in the config.
    pub fn validate(&self) -> Result<(), Error> {
        for t in &self.transports {
            if !TRANSPORTS.contains(&t.as_str()) {
                return Err(Error::UnknownTransport(t.clone()));
            }
        }
        Ok(())
    }

    fn protocols(&self) -> String {
        self.transports.join(":")
    }

    /// Whether the brain's git may reach `url`, resolving its host; how to reach it if so.
    pub async fn check(&self, url: &str) -> Result<Checked, Error> {
        let shown = crate::model::delivery::strip_userinfo(url);
        let remote = parse(url).map_err(|source| Error::Unreadable {
            url: shown.clone(),
            source,
        })?;
        if !self.transports.iter().any(|t| t == remote.transport) {
            let what = if remote.transport == "file" {
                "local paths and file:// URLs are".to_string()
            } else {
                format!("{}:// URLs are", remote.transport)
            };
            return Err(Error::Transport {
                url: shown,
                what,
                allowed: self.transports.join(" and "),
                transport: remote.transport,
            });
        }
        let mut checked = Checked {
            protocols: self.protocols(),
            pins: Vec::new(),
        };
        let Some(host) = remote.host else {
            return Ok(checked);
        };
        if self.internal_hosts {
            return Ok(checked);
        }
        let port = remote.port.unwrap_or(match remote.transport {
            "https" => 443,
            "http" => 80,
            "git" => 9418,
            _ => 22,
        });
        let first = match self.resolve.get(&host) {
            Some(ip) if !shared::net::is_internal(*ip) => *ip,
            Some(ip) => {
                return Err(Error::PinnedInternal {
                    url: shown,
                    host,
                    ip: *ip,
                });
            }
            None => shared::net::resolve_public(&host, port, RESOLVE_TIMEOUT)
                .await
                .map_err(|source| Error::NotPublic { url: shown, source })?[0]
                .ip(),
        };
        if matches!(remote.transport, "https" | "http") {
            let addr = match &first {
                IpAddr::V6(v6) => format!("[{v6}]"),
                IpAddr::V4(v4) => v4.to_string(),
            };
            checked.pins.push(format!("{host}:{port}:{addr}"));
        }
        Ok(checked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_read_as_git_reads_them() {
        for (url, transport, host, port) in [
            (
                "https://github.com/o/r.git",
                "https",
                Some("github.com"),
                None,
            ),
            (
                "https://tok@GitHub.com:8443/o/r",
                "https",
                Some("github.com"),
                Some(8443),
            ),
            ("http://[::1]:9/x.git", "http", Some("::1"), Some(9)),
            (
                "ssh://git@host.example/o/r",
                "ssh",
                Some("host.example"),
                None,
            ),
            ("git@github.com:o/r.git", "ssh", Some("github.com"), None),
            ("git://host.example/r", "git", Some("host.example"), None),
            ("file:///srv/r.git", "file", None, None),
            ("/srv/r.git", "file", None, None),
            ("./r", "file", None, None),
            ("dir/with:colon", "file", None, None),
        ] {
            let r = parse(url).unwrap();
            assert_eq!(r.transport, transport, "{url}");
            assert_eq!(r.host.as_deref(), host, "{url}");
            assert_eq!(r.port, port, "{url}");
        }
        for bad in [
            "ext::sh -c touch% /tmp/pwned",
            "fd::3",
            "-upload-pack=x",
            "ftp://h/r",
            "https://h:99999/r",
            "",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn the_policy_refuses_other_transports_and_internal_hosts_in_words() {
        let p = Policy::default();
        for (url, says) in [
            ("http://example.com/r.git", "git_schemes"),
            ("file:///srv/r.git", "local paths"),
            ("/srv/r.git", "local paths"),
            ("https://127.0.0.1/r.git", "internal address"),
            ("https://[::ffff:169.254.169.254]/r.git", "internal address"),
            ("git@10.0.0.1:o/r.git", "internal address"),
        ] {
            let err = p.check(url).await.unwrap_err().to_string();
            assert!(err.contains(says), "{url}: {err}");
        }
        let mut named = Policy::default();
        named
            .resolve
            .insert("git.example".into(), "93.184.216.34".parse().unwrap());
        let ok = named.check("https://git.example/r.git").await.unwrap();
        assert_eq!(ok.protocols, "https:ssh");
        assert_eq!(ok.pins, ["git.example:443:93.184.216.34"]);
        named
            .resolve
            .insert("rebind.example".into(), "127.0.0.1".parse().unwrap());
        assert!(named.check("https://rebind.example/r.git").await.is_err());
        let open = Policy {
            transports: vec!["https".into(), "http".into(), "file".into()],
            internal_hosts: true,
            resolve: Default::default(),
        };
        assert!(open.check("http://127.0.0.1:9/r.git").await.is_ok());
        assert!(open.check("/srv/r.git").await.is_ok());
        assert!(open.check("ext::sh -c x").await.is_err());
    }
}
