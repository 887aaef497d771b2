//! `brain admin token create|list|revoke` and `brain web login`: the HTTP API's credentials,
//! made by the brain (which keeps only their hashes) and printed here once.

use std::time::Duration;

use super::args::ApiTokenCmd;
use super::client::{Target, status};

fn until(ms: i64) -> String {
    let left = (ms - shared::now_unix_ms()).max(0) as u64;
    let d = Duration::from_secs(left / 1000);
    if d.is_zero() {
        "ended".into()
    } else {
        format!("in {}", humantime::format_duration(d))
    }
}

pub async fn token(target: &Target, cmd: ApiTokenCmd) -> anyhow::Result<i32> {
    let mut c = target.connect().await?;
    match cmd {
        ApiTokenCmd::Create {
            name,
            role,
            ttl,
            json,
        } => {
            let r = c
                .create_api_token(proto::CreateApiTokenRequest {
                    name: name.clone(),
                    role: role.clone(),
                    ttl_seconds: ttl.as_secs().max(1),
                })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            if json {
                out!(
                    "{}",
                    serde_json::json!({"id": r.id, "token": r.token, "name": name, "role": role, "expires_unix_ms": r.expires_unix_ms})
                );
            } else {
                out!("{}", r.token);
                err!(
                    "token {} for {name} ({role}), expires {}; shown once: send it as `Authorization: Bearer TOKEN`",
                    r.id,
                    until(r.expires_unix_ms)
                );
            }
        }
        ApiTokenCmd::List { all, json } => {
            let r = c
                .list_api_tokens(proto::ListApiTokensRequest { all })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            if json {
                out!("{}", serde_json::to_string(&r.tokens)?);
                return Ok(0);
            }
            out!(
                "{:<14} {:<20} {:<9} {:<8} {:<10} EXPIRES",
                "ID",
                "NAME",
                "ROLE",
                "KIND",
                "STATE"
            );
            for t in r.tokens {
                let state = if t.revoked {
                    "revoked"
                } else if t.expires_unix_ms <= shared::now_unix_ms() {
                    "expired"
                } else {
                    "live"
                };
                out!(
                    "{:<14} {:<20} {:<9} {:<8} {:<10} {}",
                    t.id,
                    t.name,
                    t.role,
                    t.kind,
                    state,
                    until(t.expires_unix_ms)
                );
            }
        }
        ApiTokenCmd::Revoke { id } => {
            let r = c
                .revoke_api_token(proto::RevokeApiTokenRequest { id: id.clone() })
                .await
                .map_err(|s| status(s, &target.url))?
                .into_inner();
            out!("revoked {} credential(s) matching {id}", r.revoked);
        }
    }
    Ok(0)
}

pub async fn login(
    target: &Target,
    name: &str,
    role: &str,
    ttl: Duration,
    json: bool,
) -> anyhow::Result<i32> {
    let r = target
        .rpc(async |mut c| {
            c.create_web_login(proto::CreateWebLoginRequest {
                name: name.into(),
                role: role.into(),
                ttl_seconds: ttl.as_secs().max(1),
            })
            .await
        })
        .await?;
    if json {
        out!(
            "{}",
            serde_json::json!({"url": r.url, "path": r.path, "link_expires_unix_ms": r.link_expires_unix_ms})
        );
        return Ok(0);
    }
    if r.url.is_empty() {
        out!("{}", r.path);
        err!(
            "this brain serves no web page (start it with `brain serve --web-listen 127.0.0.1:7480`); open this path on the address your proxy serves it at"
        );
    } else {
        out!("{}", r.url);
    }
    err!(
        "the link works once, {}; it logs a browser in as {name} ({role}) for {}",
        until(r.link_expires_unix_ms),
        humantime::format_duration(ttl)
    );
    Ok(0)
}
