//! Which addresses are internal: loopback, private, link-local (the cloud metadata service
//! lives there), carrier-grade NAT, unspecified, multicast, broadcast, documentation and
//! benchmarking ranges, IPv6 unique-local and site-local, and IPv4 addresses mapped or
//! translated into IPv6. A host that resolves to one of these is not "somewhere on the
//! internet": the brain's clones and a worker's direct egress refuse it unless the
//! operator allows it by name, and dial the address that was checked (not a second lookup
//! that DNS rebinding could answer differently).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// Why a host may not be dialled as a public one (callers add what to do about it).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{host} did not resolve within {}s", .timeout.as_secs())]
    Timeout { host: String, timeout: Duration },
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{host} is (or resolves to) {ip}, an internal address (loopback, private, link-local or reserved)"
    )]
    Internal { host: String, ip: IpAddr },
    #[error("{0} resolves to no address")]
    NoAddress(String),
}

/// The addresses of `host:port` (an address is its own), resolved within `timeout`; an
/// error, in words, when it does not resolve or any of its addresses is internal. Callers
/// dial the first address given, not the name again.
pub async fn resolve_public(
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<Vec<SocketAddr>, Error> {
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![(ip, port).into()],
        Err(_) => tokio::time::timeout(timeout, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| Error::Timeout {
                host: host.to_string(),
                timeout,
            })?
            .map_err(|source| Error::Resolve {
                host: host.to_string(),
                source,
            })?
            .collect(),
    };
    if let Some(bad) = addrs.iter().find(|a| is_internal(a.ip())) {
        return Err(Error::Internal {
            host: host.to_string(),
            ip: bad.ip(),
        });
    }
    if addrs.is_empty() {
        return Err(Error::NoAddress(host.to_string()));
    }
    Ok(addrs)
}

/// Whether `ip` is an internal address (see the module's doc).
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4_internal(v4),
        IpAddr::V6(v6) => v6_internal(v6),
    }
}

fn v4_internal(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || o[0] == 0
        // 100.64.0.0/10: carrier-grade NAT (and some clouds' internal services).
        || (o[0] == 100 && (o[1] & 0xc0) == 64)
        // 192.0.0.0/24: IETF protocol assignments.
        || (o[0] == 192 && o[1] == 0 && o[2] == 0)
        // 198.18.0.0/15: benchmarking.
        || (o[0] == 198 && (o[1] & 0xfe) == 18)
        // 240.0.0.0/4: reserved.
        || o[0] >= 240
}

fn v6_internal(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return v4_internal(v4);
    }
    let s = ip.segments();
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        // fc00::/7 unique local, fe80::/10 link-local, fec0::/10 site-local.
        || (s[0] & 0xfe00) == 0xfc00
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
        // ::ffff:0:0/96 is handled above; ::/96 (IPv4-compatible) and 64:ff9b::/96 (NAT64)
        // carry an IPv4 address that decides.
        || (s[..6] == [0, 0, 0, 0, 0, 0])
        || (s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0]
            && v4_internal(Ipv4Addr::new(
                (s[6] >> 8) as u8,
                s[6] as u8,
                (s[7] >> 8) as u8,
                s[7] as u8,
            )))
        // 2001:db8::/32: documentation.
        || (s[0] == 0x2001 && s[1] == 0x0db8)
}

/// `host[:port]` or `[v6][:port]` split into the host (brackets off) and the port text, if
/// any; None when a `[` is not closed. Neither part is checked.
pub fn split_host_port(a: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        return Some((h, after.strip_prefix(':')));
    }
    Some(match a.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (a, None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_told_from_public_ones() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "198.18.0.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "::127.0.0.1",
        ] {
            assert!(is_internal(a.parse().unwrap()), "{a}");
        }
        for a in [
            "1.1.1.1",
            "140.82.112.3",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert!(!is_internal(a.parse().unwrap()), "{a}");
        }
    }

    #[test]
    fn host_and_port_are_split_with_and_without_brackets() {
        assert_eq!(split_host_port("a.b:443"), Some(("a.b", Some("443"))));
        assert_eq!(split_host_port("a.b"), Some(("a.b", None)));
        assert_eq!(split_host_port("[::1]:22"), Some(("::1", Some("22"))));
        assert_eq!(split_host_port("[::1]"), Some(("::1", None)));
        assert_eq!(split_host_port("[::1"), None);
    }
}
