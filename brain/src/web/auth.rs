//! Who is calling, and may they: the credential from `Authorization: Bearer` or the session
//! cookie, checked against the store; for a change, the role, the origin, and (from a
//! browser) the CSRF header. Secrets are never logged: the log names the credential's id.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, Web};
use crate::trust::web::{Caller, WebRole, csrf_matches, key_of};

/// The browser session's cookie.
pub const SESSION_COOKIE: &str = "tether_session";
/// The header a browser's change carries: the session's CSRF token.
pub const CSRF_HEADER: &str = "x-tether-csrf";

/// The checked caller of a request, for its handler.
#[derive(Clone, Debug)]
pub struct Authed {
    pub caller: Caller,
    /// The session's secret when the caller came by cookie (to derive its CSRF token, or to
    /// end it on logout).
    pub session: Option<String>,
    /// The credential's key in the store ([`key_of`]), for what checks it again later (an
    /// event stream).
    pub key: String,
}

/// The credential a request carries: the bearer token first, else the session cookie.
pub fn credential(headers: &HeaderMap) -> Option<(String, bool)> {
    if let Some(v) = headers.get(axum::http::header::AUTHORIZATION) {
        let v = v.to_str().ok()?;
        let token = v
            .strip_prefix("Bearer ")
            .or_else(|| v.strip_prefix("bearer "))?;
        return Some((token.trim().to_string(), false));
    }
    cookie(headers, SESSION_COOKIE).map(|c| (c, true))
}

/// A cookie's value.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// Whether a request comes from a page of another origin: its `Origin` names another host
/// than the one it was sent to, or the browser says the fetch is cross-site. The host it was
/// sent to is `Host`, or — only when `from_proxy`, the peer being one of `[web]
/// trusted_proxies` — the last `X-Forwarded-Host` (the one that proxy set); from anyone else
/// `X-Forwarded-Host` is ignored, so it cannot make another origin look like ours.
pub fn cross_origin(headers: &HeaderMap, from_proxy: bool) -> bool {
    let get = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site")
        && !matches!(site, "same-origin" | "none")
    {
        return true;
    }
    let Some(origin) = get("origin") else {
        return false;
    };
    let forwarded = || {
        get("x-forwarded-host")
            .and_then(|v| v.rsplit(',').next())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let host = from_proxy
        .then(forwarded)
        .flatten()
        .or(get("host"))
        .unwrap_or("");
    let authority = origin
        .split_once("://")
        .map(|(_, rest)| rest.trim_end_matches('/'))
        .unwrap_or("");
    authority.is_empty() || !authority.eq_ignore_ascii_case(host)
}

fn refuse(status: StatusCode, code: &'static str, message: impl Into<String>) -> Response {
    ApiError::new(status, code, message).into_response()
}

/// The middleware in front of each `/api` route, with the role the route needs: a request
/// without a live credential gets 401; a caller below the role, a change from another
/// origin, or a change from a browser without the CSRF header gets 403.
pub async fn require(
    State((web, needs)): State<(Web, WebRole)>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some((secret, by_cookie)) = credential(req.headers()) else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "no credential: send `Authorization: Bearer TOKEN` (`brain admin token create`), or open a login link from `brain web login`",
        );
    };
    let caller = match web.auth.check(&secret).await {
        Ok(Ok(c)) => c,
        Ok(Err(why)) => {
            return refuse(StatusCode::UNAUTHORIZED, "unauthenticated", why.to_string());
        }
        Err(e) => return ApiError::from(e).into_response(),
    };
    let change = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if change {
        let from_proxy = super::conn::peer(&req).is_some_and(|p| web.opts.trusts(p.ip()));
        if cross_origin(req.headers(), from_proxy) {
            tracing::warn!(credential = %caller.id, path = %req.uri().path(), "cross-origin change refused");
            return refuse(
                StatusCode::FORBIDDEN,
                "cross_origin",
                "refused: this change comes from another origin than the brain's page",
            );
        }
        if by_cookie {
            let sent = req
                .headers()
                .get(CSRF_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !csrf_matches(&secret, sent) {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "csrf",
                    "refused: a change from the browser needs the page's X-Tether-CSRF header (reload the page)",
                );
            }
        }
    }
    if caller.role < needs {
        return refuse(
            StatusCode::FORBIDDEN,
            "permission_denied",
            format!(
                "{} is a {}: this needs an {needs} (`brain admin token create --role {needs}` or `brain web login --role {needs}`)",
                caller.name, caller.role
            ),
        );
    }
    req.extensions_mut().insert(Authed {
        caller,
        key: key_of(&secret),
        session: by_cookie.then_some(secret),
    });
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_bearer_token_wins_over_the_cookie() {
        let h = headers(&[
            ("authorization", "Bearer tw_a"),
            ("cookie", "x=1; tether_session=ts_b"),
        ]);
        assert_eq!(credential(&h), Some(("tw_a".into(), false)));
        let h = headers(&[("cookie", "x=1; tether_session=ts_b")]);
        assert_eq!(credential(&h), Some(("ts_b".into(), true)));
        assert_eq!(credential(&HeaderMap::new()), None);
    }

    #[test]
    fn another_origin_is_told_apart_from_the_same_one() {
        let same = headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
        ]);
        assert!(!cross_origin(&same, false));
        let other = headers(&[("host", "127.0.0.1:8080"), ("origin", "http://evil.test")]);
        assert!(cross_origin(&other, false));
        let null = headers(&[("host", "127.0.0.1:8080"), ("origin", "null")]);
        assert!(cross_origin(&null, false));
        let site = headers(&[("host", "127.0.0.1:8080"), ("sec-fetch-site", "cross-site")]);
        assert!(cross_origin(&site, false));
        // A program sends neither.
        assert!(!cross_origin(
            &headers(&[("host", "127.0.0.1:8080")]),
            false
        ));
    }

    #[test]
    fn x_forwarded_host_counts_only_from_a_trusted_proxy() {
        let proxied = headers(&[
            ("host", "127.0.0.1:8080"),
            ("x-forwarded-host", "tether.example.com"),
            ("origin", "https://tether.example.com"),
        ]);
        assert!(!cross_origin(&proxied, true), "through a trusted proxy");
        assert!(cross_origin(&proxied, false), "from anyone else: ignored");
        // From anyone else it cannot make another origin look like ours.
        let forged = headers(&[
            ("host", "127.0.0.1:8080"),
            ("x-forwarded-host", "evil.test"),
            ("origin", "http://evil.test"),
        ]);
        assert!(cross_origin(&forged, false));
        // Behind a trusted proxy, the value it set (the last) counts, not one a client sent.
        let appended = headers(&[
            ("host", "127.0.0.1:8080"),
            ("x-forwarded-host", "evil.test, tether.example.com"),
            ("origin", "http://evil.test"),
        ]);
        assert!(cross_origin(&appended, true));
        let empty = headers(&[
            ("host", "127.0.0.1:8080"),
            ("x-forwarded-host", ""),
            ("origin", "http://127.0.0.1:8080"),
        ]);
        assert!(
            !cross_origin(&empty, true),
            "an empty one falls back to Host"
        );
    }
}
