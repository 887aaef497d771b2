//! The admin calls on the brain's secrets: set (or replace), list (never values), remove.
//! Certificate-authenticated only: the web API never carries a secret's value.

use proto::{
    ListSecretsResponse, RemoveSecretRequest, RemoveSecretResponse, SetSecretRequest,
    SetSecretResponse,
};
use tonic::Status;

use crate::trust::secrets::{
    self, Error, HostPattern, Inject, SecretInfo, Secrets, Tier, Value, default_env,
};

fn status(e: Error) -> Status {
    match e {
        Error::Invalid(_) => Status::invalid_argument(e.to_string()),
        Error::Unknown(_) => Status::not_found(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

/// The wire form of a secret's description.
pub fn info(i: SecretInfo) -> proto::SecretInfo {
    proto::SecretInfo {
        name: i.name,
        hosts: i.hosts.into_iter().map(String::from).collect(),
        port: u32::from(i.port),
        inject: i.inject.to_string(),
        env: i.env,
        tier: match i.tier {
            Tier::Command => "command".into(),
            Tier::Provider => "provider".into(),
        },
        updated_unix_ms: i.updated_unix_ms,
    }
}

pub async fn set(store: &Secrets, req: SetSecretRequest) -> Result<SetSecretResponse, Status> {
    secrets::check_name(&req.name).map_err(status)?;
    let hosts = req
        .hosts
        .iter()
        .map(|h| HostPattern::parse(h).map_err(|e| Status::invalid_argument(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    let inject = match req.inject.as_str() {
        "" => Inject::Bearer,
        s => Inject::parse(s).map_err(status)?,
    };
    let port = match req.port {
        0 => 443,
        p => u16::try_from(p)
            .map_err(|_| Status::invalid_argument(format!("port {p} is not one")))?,
    };
    let env = if req.env.is_empty() {
        default_env(&req.name)
    } else {
        req.env
    };
    let info = SecretInfo {
        name: req.name.clone(),
        hosts,
        port,
        inject,
        env,
        tier: if req.provider {
            Tier::Provider
        } else {
            Tier::Command
        },
        updated_unix_ms: 0,
    };
    let replaced = store
        .set(info, Value::new(req.value))
        .await
        .map_err(status)?;
    Ok(SetSecretResponse { replaced })
}

pub async fn list(store: &Secrets) -> Result<ListSecretsResponse, Status> {
    Ok(ListSecretsResponse {
        secrets: store
            .list()
            .await
            .map_err(status)?
            .into_iter()
            .map(info)
            .collect(),
    })
}

pub async fn remove(
    store: &Secrets,
    req: RemoveSecretRequest,
) -> Result<RemoveSecretResponse, Status> {
    secrets::check_name(&req.name).map_err(status)?;
    Ok(RemoveSecretResponse {
        removed: store.remove(&req.name).await.map_err(status)?,
    })
}
