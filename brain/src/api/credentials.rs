//! The HTTP API's credentials through the admin API (certificate callers only): bearer
//! tokens, one-time login links, their list and revocation. The store is
//! [`crate::trust::web`]; this checks names, roles and lifetimes and converts.

use tonic::Status;

use super::{Shared, check_name};
use crate::trust::web::{self, Credential, WebRole};

fn role(text: &str) -> Result<WebRole, Status> {
    match text {
        "" => Ok(WebRole::Viewer),
        r => r
            .parse()
            .map_err(|e: crate::model::word::UnknownWord| Status::invalid_argument(e.to_string())),
    }
}

fn ttl_ms(seconds: u64, default_ms: i64) -> Result<i64, Status> {
    if seconds == 0 {
        return Ok(default_ms);
    }
    let ms = i64::try_from(seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
    if ms > web::MAX_TTL_MS {
        return Err(Status::invalid_argument(
            "a web credential lives at most 365 days",
        ));
    }
    Ok(ms)
}

pub async fn create_token(
    s: &Shared,
    req: proto::CreateApiTokenRequest,
) -> Result<proto::CreateApiTokenResponse, Status> {
    check_name(&req.name)?;
    let (token, c) = s
        .web
        .create_token(
            &req.name,
            role(&req.role)?,
            ttl_ms(req.ttl_seconds, web::TOKEN_TTL_MS)?,
        )
        .await?;
    Ok(proto::CreateApiTokenResponse {
        id: c.id,
        token,
        expires_unix_ms: c.expires_ms,
    })
}

pub async fn create_login(
    s: &Shared,
    req: proto::CreateWebLoginRequest,
) -> Result<proto::CreateWebLoginResponse, Status> {
    let name = if req.name.is_empty() {
        "admin".to_string()
    } else {
        req.name
    };
    check_name(&name)?;
    let (code, c) = s
        .web
        .create_login(
            &name,
            role(&req.role)?,
            ttl_ms(req.ttl_seconds, web::SESSION_TTL_MS)?,
        )
        .await?;
    let path = format!("/login?code={code}");
    Ok(proto::CreateWebLoginResponse {
        url: s
            .web_url
            .as_deref()
            .map(|u| format!("{}{path}", u.trim_end_matches('/')))
            .unwrap_or_default(),
        path,
        link_expires_unix_ms: c.expires_ms,
    })
}

pub async fn list(s: &Shared, all: bool) -> Result<proto::ListApiTokensResponse, Status> {
    let tokens = s
        .web
        .list(all)
        .await?
        .into_iter()
        .map(|c: Credential| proto::ApiTokenInfo {
            id: c.id,
            name: c.name,
            role: c.role.to_string(),
            kind: c.kind.to_string(),
            created_unix_ms: c.created_ms,
            expires_unix_ms: c.expires_ms,
            revoked: c.revoked,
        })
        .collect();
    Ok(proto::ListApiTokensResponse { tokens })
}
