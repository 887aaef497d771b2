//! The server name a TLS connection asks for, read from its first flight (the ClientHello's
//! `server_name` extension, RFC 6066 §3) without terminating it: what a direct tunnel's
//! TLS names must be the host the tunnel was opened to, or one allowed name would carry
//! connections to every other name behind the same address.

/// Largest ClientHello read (post-quantum key shares make them a few KiB).
pub const MAX_HELLO: usize = 64 * 1024;

/// What the bytes so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// Not all of the ClientHello yet: read more.
    More,
    /// Not a TLS handshake (or a malformed one).
    NotTls(&'static str),
    /// A ClientHello, and the host name it asks for (none: no `server_name`).
    Name(Option<String>),
}

fn u16_at(b: &[u8], i: usize) -> Option<usize> {
    Some(usize::from(*b.get(i)?) << 8 | usize::from(*b.get(i + 1)?))
}

/// Reads the ClientHello at the start of `buf` (TLS records of type handshake, reassembled).
pub fn parse(buf: &[u8]) -> Hello {
    // Records: type 22 (handshake), version 3.x, length.
    let mut hs = Vec::new();
    let mut i = 0;
    loop {
        if buf.len() < i + 5 {
            return if buf.len() > i && buf[i] != 22 {
                Hello::NotTls("the connection does not start with a TLS handshake")
            } else {
                Hello::More
            };
        }
        if buf[i] != 22 || buf[i + 1] != 3 {
            return Hello::NotTls("the connection does not start with a TLS handshake");
        }
        let len = u16_at(buf, i + 3).unwrap_or(0);
        if len == 0 || len > 16 * 1024 + 256 {
            return Hello::NotTls("a TLS record of a length no ClientHello has");
        }
        if buf.len() < i + 5 + len {
            return Hello::More;
        }
        hs.extend_from_slice(&buf[i + 5..i + 5 + len]);
        i += 5 + len;
        // Handshake: type 1 (ClientHello), 24-bit length.
        if hs.len() >= 4 {
            if hs[0] != 1 {
                return Hello::NotTls("the first TLS handshake message is not a ClientHello");
            }
            let need = (usize::from(hs[1]) << 16) | (usize::from(hs[2]) << 8) | usize::from(hs[3]);
            if need + 4 > MAX_HELLO {
                return Hello::NotTls("a ClientHello larger than any client sends");
            }
            if hs.len() >= need + 4 {
                return match server_name(&hs[4..need + 4]) {
                    Some(name) => Hello::Name(name),
                    None => Hello::NotTls("a malformed ClientHello"),
                };
            }
        }
    }
}

/// The `server_name` of a ClientHello body; `Some(None)` when it has none, `None` when the
/// body is malformed.
fn server_name(b: &[u8]) -> Option<Option<String>> {
    // version (2), random (32), session id (1 + n), cipher suites (2 + n),
    // compression methods (1 + n), extensions (2 + n).
    let mut i = 2 + 32;
    i += 1 + usize::from(*b.get(i)?);
    i += 2 + u16_at(b, i)?;
    i += 1 + usize::from(*b.get(i)?);
    if i == b.len() {
        return Some(None);
    }
    let end = i + 2 + u16_at(b, i)?;
    if end > b.len() {
        return None;
    }
    i += 2;
    while i + 4 <= end {
        let kind = u16_at(b, i)?;
        let len = u16_at(b, i + 2)?;
        let data = b.get(i + 4..i + 4 + len)?;
        if kind == 0 {
            // server_name_list: length, then entries of type (1) and name (2 + n).
            let mut j = 2;
            while j + 3 <= data.len() {
                let kind = data[j];
                let n = u16_at(data, j + 1)?;
                let name = data.get(j + 3..j + 3 + n)?;
                if kind == 0 {
                    let name = std::str::from_utf8(name).ok()?;
                    return Some(Some(name.trim_end_matches('.').to_ascii_lowercase()));
                }
                j += 3 + n;
            }
            return None;
        }
        i += 4 + len;
    }
    Some(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello as rustls writes it for `name`.
    fn hello(name: &str) -> Vec<u8> {
        use std::io::Write;
        let cfg = rustls::ClientConfig::builder_with_provider(shared::pki::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let mut c = rustls::ClientConnection::new(
            std::sync::Arc::new(cfg),
            rustls::pki_types::ServerName::try_from(name.to_string()).unwrap(),
        )
        .unwrap();
        let mut out = Vec::new();
        c.write_tls(&mut out).unwrap();
        out.flush().unwrap();
        out
    }

    #[test]
    fn the_name_is_read_whole_or_asked_for_more() {
        let h = hello("API.Example.com");
        assert_eq!(parse(&h), Hello::Name(Some("api.example.com".into())));
        for cut in [0, 3, 5, 40, h.len() - 1] {
            assert_eq!(parse(&h[..cut]), Hello::More, "cut at {cut}");
        }
        // Split across two records.
        let body = &h[5..];
        let (a, b) = body.split_at(body.len() / 2);
        let mut two = vec![22, 3, 1];
        two.extend_from_slice(&(a.len() as u16).to_be_bytes());
        two.extend_from_slice(a);
        two.extend_from_slice(&[22, 3, 1]);
        two.extend_from_slice(&(b.len() as u16).to_be_bytes());
        two.extend_from_slice(b);
        assert_eq!(parse(&two), Hello::Name(Some("api.example.com".into())));
        // An IP address is never a server name: none is sent.
        assert_eq!(parse(&hello("127.0.0.1")), Hello::Name(None));
        assert!(matches!(parse(b"GET / HTTP/1.1\r\n"), Hello::NotTls(_)));
        assert!(matches!(parse(b"SSH-2.0-OpenSSH\r\n"), Hello::NotTls(_)));
        let mut bad = h.clone();
        bad[5] = 2;
        assert!(matches!(parse(&bad), Hello::NotTls(_)));
    }
}
