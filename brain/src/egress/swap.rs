//! Finding the placeholders in a request and putting the values in their place — only where
//! each secret's injection says: a bearer secret in the `Authorization` header (`SCHEME
//! PLACEHOLDER`), a Basic one as the password of a Basic credential, a header secret as the
//! whole value of its header, a query secret as the whole value of its parameter. A
//! placeholder anywhere else (the path, another parameter, a cookie, the user agent, any
//! other header) would let a command make the server store or reflect the value where the
//! command can read it back, so it refuses the request, and so does every placeholder that
//! is not one of the plan's — unknown, another task's, a secret not bound to this host, or
//! malformed (fails closed). Also adds a secret's credential where the request carries none.

use std::collections::BTreeSet;

use base64::Engine as _;
use hyper::HeaderMap;
use hyper::header::{AUTHORIZATION, HeaderName, HeaderValue};

use super::{Injection, Plan};
use crate::trust::secrets::{Inject, PLACEHOLDER_PREFIX};

/// The prefix without its colon: in a request target the colon may be percent-encoded.
const STEM: &str = "tether-secret";

/// Why a request is refused: a placeholder where its secret may not stand, or one that is not
/// the plan's (what the command is told, and the task's log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("a malformed {PLACEHOLDER_PREFIX} placeholder in the request to {host}:{port}")]
    Malformed { host: String, port: u16 },
    #[error(
        "the placeholder for secret {name:?} is not valid for {host}:{port} (the secret is not bound there, or the placeholder is not this task's)"
    )]
    NotHere {
        name: String,
        host: String,
        port: u16,
    },
    /// `place`: where the secret's injection lets it stand ([`place`]).
    #[error("the placeholder for secret {name:?} is in {found}; it may stand only in {place}")]
    Misplaced {
        name: String,
        found: String,
        place: String,
    },
    #[error("header {0} holds a placeholder in bytes that are not text")]
    NotText(String),
}

/// Where a secret's injection lets its placeholder stand, in words.
fn place(inject: &Inject) -> String {
    match inject {
        Inject::Bearer => "the Authorization header (`Authorization: Bearer PLACEHOLDER`)".into(),
        Inject::Basic(_) => "the password of a Basic Authorization credential".into(),
        Inject::Header(h) => format!("the whole value of header {h}"),
        Inject::Query(q) => format!("the whole value of query parameter {q}"),
    }
}

/// The plan's secret whose placeholder starts `text` (after any whitespace), and the length
/// of the placeholder; an error for a placeholder that is not the plan's.
fn lookup<'p>(text: &str, plan: &'p Plan) -> Result<(&'p Injection, usize), Refusal> {
    let malformed = || Refusal::Malformed {
        host: plan.host.clone(),
        port: plan.port,
    };
    let after = text.strip_prefix(STEM).ok_or_else(malformed)?;
    let (name, token, len) = parse(after).ok_or_else(malformed)?;
    let canonical = format!("{PLACEHOLDER_PREFIX}{name}:{token}");
    plan.inject
        .iter()
        .find(|i| i.placeholder == canonical)
        .map(|i| (i, STEM.len() + len))
        .ok_or_else(|| Refusal::NotHere {
            name,
            host: plan.host.clone(),
            port: plan.port,
        })
}

/// The refusal for a placeholder found at `where_`: what it is and where it may go.
fn misplaced(text: &str, where_: &str, plan: &Plan) -> Refusal {
    let at = text.find(STEM).unwrap_or(0);
    match lookup(&text[at..], plan) {
        Ok((inj, _)) => Refusal::Misplaced {
            name: inj.name.clone(),
            found: where_.to_string(),
            place: place(&inj.inject),
        },
        Err(why) => why,
    }
}

/// `text` is exactly one placeholder of the plan's (surrounding whitespace aside) for a
/// secret `fits` accepts: that secret. `Err(None)`: a placeholder of the plan's, but not
/// alone or not one that may stand here (the caller says where it was).
fn whole<'p>(
    text: &str,
    plan: &'p Plan,
    fits: impl Fn(&Inject) -> bool,
) -> Option<Result<&'p Injection, Option<Refusal>>> {
    let t = text.trim();
    if !t.contains(STEM) {
        return None;
    }
    if !t.starts_with(STEM) {
        return Some(Err(None));
    }
    Some(match lookup(t, plan) {
        Ok((inj, len)) if len == t.len() && fits(&inj.inject) => Ok(inj),
        Ok(_) => Err(None),
        Err(why) => Err(Some(why)),
    })
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

/// `s` with its `%XX` escapes decoded (for finding placeholders, not for forwarding).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(hex) = std::str::from_utf8(&b[i + 1..i + 3])
            && let Ok(v) = u8::from_str_radix(hex, 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `s` holds a placeholder's stem, escaped or not, in any case.
fn holds_stem(s: &str) -> bool {
    unescape(s).to_ascii_lowercase().contains(STEM)
}

/// The request target (path and query) with the placeholders of query secrets swapped in
/// their own parameters; a placeholder anywhere else refuses the request.
pub fn in_target(
    target: &str,
    plan: &Plan,
    used: &mut BTreeSet<String>,
) -> Result<String, Refusal> {
    if !holds_stem(target) {
        return Ok(target.to_string());
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    if holds_stem(path) {
        return Err(misplaced(&unescape(path), "the request path", plan));
    }
    let mut out = path.to_string();
    if let Some(query) = query {
        out.push('?');
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            if !holds_stem(pair) {
                out.push_str(pair);
                continue;
            }
            let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = unescape(&raw_key.replace('+', " "));
            let value = unescape(&raw_value.replace('+', " "));
            let where_ = format!("query parameter {key:?}");
            if holds_stem(raw_key) {
                return Err(misplaced(&key, &where_, plan));
            }
            match whole(&value, plan, |i| matches!(i, Inject::Query(q) if *q == key)) {
                Some(Ok(inj)) => {
                    out.push_str(raw_key);
                    out.push('=');
                    out.push_str(&percent(inj.value.expose()));
                    used.insert(inj.name.clone());
                }
                Some(Err(Some(why))) => return Err(why),
                _ => return Err(misplaced(&value, &where_, plan)),
            }
        }
    }
    Ok(out)
}

/// A header's value with a placeholder swapped where its secret's injection puts it; a
/// placeholder anywhere else refuses the request.
pub fn in_header(
    name: &str,
    value: &[u8],
    plan: &Plan,
    used: &mut BTreeSet<String>,
) -> Result<Vec<u8>, Refusal> {
    let Ok(text) = std::str::from_utf8(value) else {
        if value.windows(STEM.len()).any(|w| w == STEM.as_bytes()) {
            return Err(Refusal::NotText(name.to_string()));
        }
        return Ok(value.to_vec());
    };
    if !text.contains(STEM) && !(name.eq_ignore_ascii_case(AUTHORIZATION.as_str())) {
        return Ok(value.to_vec());
    }
    let where_ = format!("header {name}");
    if name.eq_ignore_ascii_case(AUTHORIZATION.as_str()) {
        let (scheme, cred) = text.trim().split_once(' ').unwrap_or((text.trim(), ""));
        if scheme.eq_ignore_ascii_case("basic") {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(cred.trim())
                .ok()
                .and_then(|d| String::from_utf8(d).ok());
            let Some(decoded) = decoded.filter(|d| d.contains(STEM)) else {
                if text.contains(STEM) {
                    return Err(misplaced(
                        text,
                        "a Basic credential that is not Base64",
                        plan,
                    ));
                }
                return Ok(value.to_vec());
            };
            let (user, password) = decoded.split_once(':').unwrap_or(("", &decoded));
            if user.contains(STEM) {
                return Err(misplaced(user, "the user name of a Basic credential", plan));
            }
            return match whole(password, plan, |i| matches!(i, Inject::Basic(_))) {
                Some(Ok(inj)) => {
                    let Inject::Basic(own) = &inj.inject else {
                        unreachable!("matched Basic above")
                    };
                    used.insert(inj.name.clone());
                    let cred = base64::engine::general_purpose::STANDARD
                        .encode([own.as_bytes(), b":", inj.value.expose()].concat());
                    Ok(format!("Basic {cred}").into_bytes())
                }
                Some(Err(Some(why))) => Err(why),
                _ => Err(misplaced(
                    password,
                    "the password of a Basic credential",
                    plan,
                )),
            };
        }
        if !text.contains(STEM) {
            return Ok(value.to_vec());
        }
        if scheme.contains(STEM) {
            return Err(misplaced(text, &where_, plan));
        }
        return match whole(cred, plan, |i| matches!(i, Inject::Bearer)) {
            Some(Ok(inj)) => {
                used.insert(inj.name.clone());
                Ok([scheme.as_bytes(), b" ", inj.value.expose()].concat())
            }
            Some(Err(Some(why))) => Err(why),
            _ => Err(misplaced(cred, &where_, plan)),
        };
    }
    match whole(
        text,
        plan,
        |i| matches!(i, Inject::Header(h) if h.eq_ignore_ascii_case(name)),
    ) {
        Some(Ok(inj)) => {
            used.insert(inj.name.clone());
            Ok(inj.value.expose().to_vec())
        }
        Some(Err(Some(why))) => Err(why),
        _ => Err(misplaced(text, &where_, plan)),
    }
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
            &format!("/x?a=1&token={}", P.replace(':', "%3A")),
            &plan(Inject::Query("token".into())),
            &mut BTreeSet::new(),
        )
        .unwrap();
        assert_eq!(t, "/x?a=1&token=s3cr3t+value");
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("anyone:{P}"));
        let h = in_header(
            "Authorization",
            format!("Basic {basic}").as_bytes(),
            &plan(Inject::Basic("git".into())),
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
    fn a_placeholder_goes_only_where_its_injection_says() {
        let enc = P.replace(':', "%3A");
        let bearer = plan(Inject::Bearer);
        for (name, value) in [
            ("x-token", P.to_string()),
            ("cookie", format!("s={P}")),
            ("user-agent", P.to_string()),
            ("authorization", format!("Bearer {P} extra")),
            (
                "authorization",
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(format!("u:{P}"))
                ),
            ),
        ] {
            let err = in_header(name, value.as_bytes(), &bearer, &mut BTreeSet::new())
                .expect_err(&format!("{name}: {value}"));
            assert!(err.to_string().contains("may stand only in"), "{err}");
        }
        for target in [
            format!("/files/{P}"),
            format!("/files/{enc}"),
            format!("/x?name={enc}"),
            format!("/x?{enc}=1"),
            "/files/%74ether-secret%3Agh%3A0123456789abcdef0123456789abcdef".to_string(),
        ] {
            for p in [&bearer, &plan(Inject::Query("token".into()))] {
                assert!(
                    in_target(&target, p, &mut BTreeSet::new()).is_err(),
                    "{target}"
                );
            }
        }
        let header = plan(Inject::Header("X-Api-Key".into()));
        assert_eq!(
            in_header("x-api-key", P.as_bytes(), &header, &mut BTreeSet::new()).unwrap(),
            b"s3cr3t value"
        );
        assert!(
            in_header(
                "x-api-key",
                format!("{P}{P}").as_bytes(),
                &header,
                &mut BTreeSet::new()
            )
            .is_err()
        );
        assert!(in_header("x-other", P.as_bytes(), &header, &mut BTreeSet::new()).is_err());
        // Text without a placeholder passes untouched.
        assert_eq!(
            in_header(
                "authorization",
                b"Bearer mine",
                &bearer,
                &mut BTreeSet::new()
            )
            .unwrap(),
            b"Bearer mine"
        );
        assert_eq!(
            in_target("/a%zz?b=%41", &bearer, &mut BTreeSet::new()).unwrap(),
            "/a%zz?b=%41"
        );
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
