//! Finding the placeholders in a request and putting the values in their place: in the
//! request target (percent-encoded there), in header values, inside a Basic credential; and
//! adding a secret's credential where the request carries none. Every placeholder must be
//! one of the plan's: any other — unknown, another task's, a secret not bound to this host,
//! or malformed — refuses the request (fails closed).

use std::collections::BTreeSet;

use base64::Engine as _;
use hyper::HeaderMap;
use hyper::header::{AUTHORIZATION, HeaderName, HeaderValue};

use super::Plan;
use crate::trust::secrets::{Inject, PLACEHOLDER_PREFIX};

/// The prefix without its colon: in a request target the colon may be percent-encoded.
const STEM: &str = "tether-secret";

/// `text` with each placeholder swapped for `encode(value)`; the secrets used are added to
/// `used`.
fn swap(
    text: &str,
    plan: &Plan,
    used: &mut BTreeSet<String>,
    encode: impl Fn(&[u8]) -> String,
) -> Result<String, String> {
    if !text.contains(STEM) {
        return Ok(text.to_string());
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(STEM) {
        out.push_str(&rest[..at]);
        let after = &rest[at + STEM.len()..];
        let (name, token, len) = parse(after).ok_or_else(|| {
            format!(
                "a malformed {PLACEHOLDER_PREFIX} placeholder in the request to {}:{}",
                plan.host, plan.port
            )
        })?;
        let canonical = format!("{PLACEHOLDER_PREFIX}{name}:{token}");
        let Some(inj) = plan.inject.iter().find(|i| i.placeholder == canonical) else {
            return Err(format!(
                "the placeholder for secret {name:?} is not valid for {}:{} (the secret is not bound there, or the placeholder is not this task's)",
                plan.host, plan.port
            ));
        };
        out.push_str(&encode(inj.value.expose()));
        used.insert(inj.name.clone());
        rest = &after[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// After the stem: `:NAME:TOKEN` (each colon possibly `%3A`). Returns the name, the token and
/// the length consumed.
fn parse(s: &str) -> Option<(String, String, usize)> {
    let colon = |s: &str| -> Option<usize> {
        if s.starts_with(':') {
            Some(1)
        } else if s.len() >= 3 && s[..3].eq_ignore_ascii_case("%3a") {
            Some(3)
        } else {
            None
        }
    };
    let mut i = colon(s)?;
    let name_len = s[i..]
        .bytes()
        .take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_' || *b == b'-')
        .count();
    if name_len == 0 || name_len > 64 {
        return None;
    }
    let name = s[i..i + name_len].to_string();
    i += name_len;
    i += colon(&s[i..])?;
    let token: String = s[i..].chars().take(32).collect();
    if token.len() != 32 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((name, token.to_ascii_lowercase(), i + 32))
}

fn percent(value: &[u8]) -> String {
    form_urlencoded::byte_serialize(value).collect()
}

fn raw(value: &[u8]) -> String {
    String::from_utf8_lossy(value).into_owned()
}

/// The request target (path and query) with its placeholders swapped.
pub fn in_target(target: &str, plan: &Plan, used: &mut BTreeSet<String>) -> Result<String, String> {
    swap(target, plan, used, percent)
}

/// A header's value with its placeholders swapped, inside a Basic credential too.
pub fn in_header(
    name: &str,
    value: &[u8],
    plan: &Plan,
    used: &mut BTreeSet<String>,
) -> Result<Vec<u8>, String> {
    let Ok(text) = std::str::from_utf8(value) else {
        if value.windows(STEM.len()).any(|w| w == STEM.as_bytes()) {
            return Err(format!(
                "header {name} holds a placeholder in bytes that are not text"
            ));
        }
        return Ok(value.to_vec());
    };
    if name.eq_ignore_ascii_case(AUTHORIZATION.as_str())
        && let Some(b64) = text
            .strip_prefix("Basic ")
            .or_else(|| text.strip_prefix("basic "))
        && let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(b64.trim())
        && let Ok(decoded) = String::from_utf8(decoded)
        && decoded.contains(STEM)
    {
        let swapped = swap(&decoded, plan, used, raw)?;
        return Ok(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(swapped)
        )
        .into_bytes());
    }
    Ok(swap(text, plan, used, raw)?.into_bytes())
}

/// Adds the credential of each of the plan's secrets the request did not name by
/// placeholder, where the request has none of its own; returns the target (a query secret
/// goes there).
pub fn add_credentials(
    headers: &mut HeaderMap,
    mut target: String,
    plan: &Plan,
    used: &BTreeSet<String>,
) -> String {
    for inj in plan.inject.iter().filter(|i| !used.contains(&i.name)) {
        let value = inj.value.expose();
        match &inj.inject {
            Inject::Bearer | Inject::Basic(_) if headers.contains_key(AUTHORIZATION) => {}
            Inject::Bearer => {
                if let Ok(v) = HeaderValue::from_bytes(&[b"Bearer ", value].concat()) {
                    headers.insert(AUTHORIZATION, v);
                }
            }
            Inject::Basic(user) => {
                let cred = base64::engine::general_purpose::STANDARD
                    .encode([user.as_bytes(), b":", value].concat());
                if let Ok(v) = HeaderValue::from_str(&format!("Basic {cred}")) {
                    headers.insert(AUTHORIZATION, v);
                }
            }
            Inject::Header(h) => {
                if let (Ok(n), Ok(v)) = (
                    HeaderName::from_bytes(h.as_bytes()),
                    HeaderValue::from_bytes(value),
                ) && !headers.contains_key(&n)
                {
                    headers.insert(n, v);
                }
            }
            Inject::Query(q) => {
                let query = target.split_once('?').map(|(_, q)| q).unwrap_or("");
                let has = form_urlencoded::parse(query.as_bytes()).any(|(k, _)| k == q.as_str());
                if !has {
                    let sep = if target.contains('?') { '&' } else { '?' };
                    target = format!("{target}{sep}{}={}", percent(q.as_bytes()), percent(value));
                }
            }
        }
    }
    target
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::Injection;
    use crate::trust::secrets::Value;

    const P: &str = "tether-secret:gh:0123456789abcdef0123456789abcdef";

    fn plan(inject: Inject) -> Plan {
        Plan {
            host: "api.example.com".into(),
            port: 443,
            inject: vec![Injection {
                name: "gh".into(),
                placeholder: P.into(),
                value: Value::new(b"s3cr3t value".to_vec()),
                inject,
            }],
            methods: vec![],
        }
    }

    #[test]
    fn placeholders_are_swapped_where_they_are() {
        let p = plan(Inject::Bearer);
        let mut used = BTreeSet::new();
        let h = in_header(
            "authorization",
            format!("Bearer {P}").as_bytes(),
            &p,
            &mut used,
        )
        .unwrap();
        assert_eq!(h, b"Bearer s3cr3t value");
        assert!(used.contains("gh"));
        let t = in_target(
            &format!("/x?token={}", P.replace(':', "%3A")),
            &p,
            &mut BTreeSet::new(),
        )
        .unwrap();
        assert_eq!(t, "/x?token=s3cr3t+value");
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("git:{P}"));
        let h = in_header(
            "Authorization",
            format!("Basic {basic}").as_bytes(),
            &p,
            &mut BTreeSet::new(),
        )
        .unwrap();
        let expect = base64::engine::general_purpose::STANDARD.encode("git:s3cr3t value");
        assert_eq!(h, format!("Basic {expect}").as_bytes());
    }

    #[test]
    fn a_foreign_unknown_or_malformed_placeholder_refuses_the_request() {
        let p = plan(Inject::Bearer);
        for bad in [
            "tether-secret:gh:ffffffffffffffffffffffffffffffff",
            "tether-secret:npm:0123456789abcdef0123456789abcdef",
            "tether-secret:gh:0123",
            "tether-secret:",
        ] {
            let mut used = BTreeSet::new();
            assert!(
                in_header("x-token", bad.as_bytes(), &p, &mut used).is_err(),
                "{bad}"
            );
            assert!(
                in_target(&format!("/{bad}"), &p, &mut used).is_err(),
                "{bad}"
            );
            assert!(used.is_empty());
        }
    }

    #[test]
    fn a_credential_is_added_only_where_none_is_given() {
        let mut h = HeaderMap::new();
        let t = add_credentials(&mut h, "/a".into(), &plan(Inject::Bearer), &BTreeSet::new());
        assert_eq!(t, "/a");
        assert_eq!(h[AUTHORIZATION], "Bearer s3cr3t value");
        let mut own = HeaderMap::new();
        own.insert(AUTHORIZATION, HeaderValue::from_static("Bearer mine"));
        add_credentials(
            &mut own,
            "/".into(),
            &plan(Inject::Bearer),
            &BTreeSet::new(),
        );
        assert_eq!(own[AUTHORIZATION], "Bearer mine");
        let t = add_credentials(
            &mut HeaderMap::new(),
            "/a?x=1".into(),
            &plan(Inject::Query("key".into())),
            &BTreeSet::new(),
        );
        assert_eq!(t, "/a?x=1&key=s3cr3t+value");
        let mut h = HeaderMap::new();
        add_credentials(
            &mut h,
            "/".into(),
            &plan(Inject::Header("X-Api-Key".into())),
            &BTreeSet::new(),
        );
        assert_eq!(h["x-api-key"], "s3cr3t value");
        let mut h = HeaderMap::new();
        add_credentials(
            &mut h,
            "/".into(),
            &plan(Inject::Basic("git".into())),
            &BTreeSet::new(),
        );
        let expect = base64::engine::general_purpose::STANDARD.encode("git:s3cr3t value");
        assert_eq!(h[AUTHORIZATION], format!("Basic {expect}").as_str());
    }
}
