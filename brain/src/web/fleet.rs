//! Fleet routes: workers (and revoking one), machines (provisioning and releasing one), and
//! join tokens for new workers.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use proto::admin_server::Admin;
use serde::Deserialize;

use super::auth::Authed;
use super::extract::{Answer, Body, Params, request, within};
use super::{ApiError, Web};

pub(super) async fn list_workers(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
) -> Answer<proto::ListWorkersResponse> {
    let req = proto::ListWorkersRequest {};
    Ok(Json(
        within(
            web.services
                .list_workers(request(&a, "Admin/ListWorkers", req)?),
        )
        .await?,
    ))
}

pub(super) async fn revoke_worker(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
) -> Answer<proto::RevokeWorkerResponse> {
    let req = proto::RevokeWorkerRequest {
        worker: id,
        remove: false,
    };
    Ok(Json(
        within(
            web.services
                .revoke_worker(request(&a, "Admin/RevokeWorker", req)?),
        )
        .await?,
    ))
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct AllMachines {
    /// Include released and failed machines.
    pub all: bool,
}

pub(super) async fn list_machines(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Params(q): Params<AllMachines>,
) -> Answer<proto::ListMachinesResponse> {
    let req = proto::ListMachinesRequest { all: q.all };
    Ok(Json(
        within(
            web.services
                .list_machines(request(&a, "Admin/ListMachines", req)?),
        )
        .await?,
    ))
}

pub(super) async fn provision(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Body(mut req): Body<proto::ProvisionRequest>,
) -> Result<(StatusCode, Json<proto::MachineResponse>), ApiError> {
    // Within the API's timeout; the machine's state follows on /api/machines.
    req.wait_seconds = req.wait_seconds.min(50);
    let r = within(web.services.provision(request(&a, "Admin/Provision", req)?)).await?;
    Ok((StatusCode::CREATED, Json(r)))
}

pub(super) async fn release_machine(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
) -> Answer<proto::MachineResponse> {
    let req = proto::ReleaseMachineRequest { id };
    Ok(Json(
        within(
            web.services
                .release_machine(request(&a, "Admin/ReleaseMachine", req)?),
        )
        .await?,
    ))
}

pub(super) async fn create_join_token(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Body(mut req): Body<proto::CreateTokenRequest>,
) -> Result<(StatusCode, Json<proto::CreateTokenResponse>), ApiError> {
    if req.ttl_seconds == 0 {
        req.ttl_seconds = 3600;
    }
    let r = within(
        web.services
            .create_token(request(&a, "Admin/CreateToken", req)?),
    )
    .await?;
    tracing::info!(by = %a.caller, "join token created over the web API");
    Ok((StatusCode::CREATED, Json(r)))
}
