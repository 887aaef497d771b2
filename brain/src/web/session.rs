//! The caller's session: who is calling (and a browser session's CSRF token), logging out,
//! and `GET /login?code=...`, which turns a one-time link into the session cookie.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Json};
use serde::Deserialize;

use super::auth::{self, Authed};
use super::{ApiError, Web};
use crate::trust::web::csrf_for;

/// An answer with nothing in it.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct Empty {}

#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct SessionInfo {
    pub name: String,
    pub role: String,
    /// token or session.
    pub kind: String,
    /// For a browser session: the value its changes send in `X-Tether-CSRF`.
    pub csrf: String,
}

pub(super) async fn session(Extension(a): Extension<Authed>) -> Json<SessionInfo> {
    Json(SessionInfo {
        name: a.caller.name.clone(),
        role: a.caller.role.to_string(),
        kind: a.caller.kind.to_string(),
        csrf: a.session.as_deref().map(csrf_for).unwrap_or_default(),
    })
}

pub(super) async fn logout(State(web): State<Web>, Extension(a): Extension<Authed>) -> Response {
    if let Some(s) = &a.session
        && let Err(e) = web.auth.end_session(s).await
    {
        return ApiError::from(e).into_response();
    }
    let mut r = Json(Empty {}).into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&format!(
            "{}=; HttpOnly; Secure; SameSite=Strict; Path=/; Max-Age=0",
            auth::SESSION_COOKIE
        ))
        .expect("ascii"),
    );
    r
}

#[derive(Deserialize)]
pub(super) struct LoginQuery {
    #[serde(default)]
    code: String,
}

/// `GET /login?code=...`: uses the one-time link up, sets the session cookie and goes to the
/// page; the code leaves the address bar at once.
pub(super) async fn login(
    State(web): State<Web>,
    axum::extract::Query(q): axum::extract::Query<LoginQuery>,
) -> Response {
    let refused = |why: String| {
        (
            StatusCode::UNAUTHORIZED,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("{why}\n"),
        )
            .into_response()
    };
    if q.code.is_empty() || q.code.len() > 200 {
        return refused("this login link is not complete: run `brain web login` again".into());
    }
    match web.auth.redeem(&q.code).await {
        Ok(Ok((secret, c))) => {
            tracing::info!(credential = %c.id, name = %c.name, role = %c.role, "web session opened");
            let max_age = ((c.expires_ms - c.created_ms) / 1000).max(1);
            let mut r = Redirect::to("/").into_response();
            r.headers_mut().insert(
                header::SET_COOKIE,
                HeaderValue::from_str(&format!(
                    "{}={secret}; HttpOnly; Secure; SameSite=Strict; Path=/; Max-Age={max_age}",
                    auth::SESSION_COOKIE
                ))
                .expect("ascii"),
            );
            r
        }
        Ok(Err(why)) => refused(why.to_string()),
        Err(e) => ApiError::from(e).into_response(),
    }
}
