//! The web API's limits and the reverse proxies it believes, checked once from the config's
//! `[web]` section when the brain starts.

use std::net::IpAddr;
use std::time::Duration;

use crate::config::WebConfig;

/// What is wrong with `[web]` (each message names the setting and says what would do).
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    /// `why`: what is wrong with the entry (`is not an IP address`).
    #[error(
        "[web] trusted_proxies entry {entry:?} {why}: write an address (\"127.0.0.1\", \"::1\") or a network (\"10.0.0.0/8\")"
    )]
    Proxy { entry: String, why: &'static str },
    /// A limit that must be at least 1 (`max_connections`).
    #[error("[web] {0} must be at least 1")]
    Zero(&'static str),
    #[error("[web] header_read_timeout {value:?} is not a duration ({source}): write it as \"5s\"")]
    Timeout {
        value: String,
        #[source]
        source: humantime::DurationError,
    },
    #[error("[web] header_read_timeout must be longer than 0s")]
    ZeroTimeout,
}

/// What `[web]` says, checked.
#[derive(Debug, Clone)]
pub struct Options {
    /// Peers whose `X-Forwarded-*` headers are believed.
    pub trusted_proxies: Vec<Network>,
    /// Event streams one credential may hold open at once.
    pub max_streams_per_credential: usize,
    /// Connections served at once.
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// The most bytes of a diff answered.
    pub max_diff_bytes: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self::from_config(&WebConfig::default()).expect("the defaults are valid")
    }
}

impl Options {
    /// Checks `[web]`: every proxy an address or network, the limits above zero, the timeout
    /// a duration.
    pub fn from_config(c: &WebConfig) -> Result<Self, OptionsError> {
        let trusted_proxies = c
            .trusted_proxies
            .iter()
            .map(|s| Network::parse(s))
            .collect::<Result<Vec<_>, _>>()?;
        if c.max_streams_per_credential == 0 {
            return Err(OptionsError::Zero("max_streams_per_credential"));
        }
        if c.max_connections == 0 {
            return Err(OptionsError::Zero("max_connections"));
        }
        let header_read_timeout =
            humantime::parse_duration(&c.header_read_timeout).map_err(|source| {
                OptionsError::Timeout {
                    value: c.header_read_timeout.clone(),
                    source,
                }
            })?;
        if header_read_timeout.is_zero() {
            return Err(OptionsError::ZeroTimeout);
        }
        if c.max_diff_bytes == 0 {
            return Err(OptionsError::Zero("max_diff_bytes"));
        }
        Ok(Self {
            trusted_proxies,
            max_streams_per_credential: c.max_streams_per_credential,
            max_connections: c.max_connections,
            header_read_timeout,
            max_diff_bytes: c.max_diff_bytes,
        })
    }

    /// Whether a request from `peer` may tell the brain, in `X-Forwarded-*`, where it came
    /// from.
    pub fn trusts(&self, peer: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|n| n.contains(peer))
    }
}

/// An address or a network (`IP/PREFIX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    pub fn parse(s: &str) -> Result<Self, OptionsError> {
        let bad = |why: &'static str| OptionsError::Proxy {
            entry: s.to_string(),
            why,
        };
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad("is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| bad("has a prefix length that is not one"))?,
        };
        Ok(Self { addr, prefix })
    }

    /// Whether `ip` is in this network (an IPv4 address mapped into IPv6 counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }
}

/// Whether the first `bits` bits of `a` and `b` are equal.
fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let (whole, rest) = ((bits / 8) as usize, bits % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    a[whole] & mask == b[whole] & mask
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn proxies_are_addresses_or_networks_and_nothing_else_is_trusted() {
        let o = Options::from_config(&WebConfig {
            trusted_proxies: vec!["127.0.0.1".into(), "10.1.0.0/16".into(), "fd00::/8".into()],
            ..Default::default()
        })
        .unwrap();
        assert!(o.trusts(ip("127.0.0.1")));
        assert!(o.trusts(ip("::ffff:127.0.0.1")), "IPv4 mapped into IPv6");
        assert!(!o.trusts(ip("127.0.0.2")));
        assert!(o.trusts(ip("10.1.255.3")));
        assert!(!o.trusts(ip("10.2.0.1")));
        assert!(o.trusts(ip("fd12::1")));
        assert!(!o.trusts(ip("fe80::1")));
        assert!(
            !Options::default().trusts(ip("127.0.0.1")),
            "none by default"
        );
        assert!(Network::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        assert!(
            Network::parse("10.0.0.0/7")
                .unwrap()
                .contains(ip("11.255.0.1"))
        );
        assert!(
            !Network::parse("10.0.0.0/7")
                .unwrap()
                .contains(ip("12.0.0.1"))
        );
        for bad in ["localhost", "10.0.0.0/33", "::1/129", "1.2.3.4/x", ""] {
            let e = Network::parse(bad).unwrap_err();
            assert!(e.to_string().contains("trusted_proxies"), "{e}");
        }
    }

    #[test]
    fn limits_must_be_usable() {
        let bad = |c: WebConfig| Options::from_config(&c).unwrap_err().to_string();
        assert!(
            bad(WebConfig {
                max_streams_per_credential: 0,
                ..Default::default()
            })
            .contains("max_streams_per_credential")
        );
        assert!(
            bad(WebConfig {
                header_read_timeout: "soon".into(),
                ..Default::default()
            })
            .contains("\"5s\"")
        );
        let d = Options::default();
        assert_eq!(
            (d.max_streams_per_credential, d.header_read_timeout),
            (8, Duration::from_secs(5))
        );
    }
}
