//! The routes: each handler takes the checked caller and JSON, calls the admin operation the
//! CLI calls (in process, with the caller in the request) and answers JSON. Bodies and
//! answers are the wire messages of `tether.v1` in their JSON form (absent fields take their
//! defaults); `/api/openapi.json` describes them.

use std::future::Future;
use std::time::Duration;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use proto::admin_server::Admin;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio_stream::StreamExt;

use super::auth::{self, Authed};
use super::openapi::{Doc, Role, Shape, of};
use super::{ApiError, Web, events, openapi, page};
use crate::trust::web::{WebRole, csrf_for};

/// How long one API call may take before it answers 504.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest request body (a task's goal, or a replay transcript); others are small.
const MAX_BODY: usize = 9 * 1024 * 1024;
/// Largest file shown by `/files/content`.
const MAX_FILE_SHOWN: u64 = 4 * 1024 * 1024;

/// Every `/api` route with what it takes and answers: the router and the OpenAPI document
/// are both made from this table, so neither can hold a route the other lacks.
pub fn table() -> Vec<Doc> {
    use Role::*;
    use Shape::{Bytes, Events, Text};
    let d = Doc::new;
    vec![
        d("GET", "/session", Viewer, "Who is calling; a browser session's CSRF token", None, of::<SessionInfo>(), get(session)),
        d("POST", "/logout", Viewer, "Ends the caller's browser session", None, of::<Empty>(), post(logout)),
        d("GET", "/tasks", Viewer, "Tasks, newest first", None, of::<proto::ListTasksResponse>(), get(list_tasks)).query::<TaskFilter>(),
        d("POST", "/tasks", Operator, "Starts an agent task", Some(of::<proto::RunAgentRequest>()), of::<proto::RunPlanResponse>(), post(create_task)),
        d("GET", "/tasks/{id}", Viewer, "One task's summary", None, of::<proto::TaskSummary>(), get(show_task)),
        d("GET", "/tasks/{id}/events", Viewer, "The task's log as Server-Sent Events (id: the sequence number; resume with Last-Event-ID or since), or as NDJSON with follow=false", None, Events, get(events::task_events)).query::<events::EventsQuery>(),
        d("POST", "/tasks/{id}/approve", Operator, "Approves what the task waits for", None, of::<proto::DecideResponse>(), post(approve)),
        d("POST", "/tasks/{id}/deny", Operator, "Denies it, with a reason the model is told", Some(of::<Reason>()), of::<proto::DecideResponse>(), post(deny)),
        d("POST", "/tasks/{id}/cancel", Operator, "Cancels the task", None, of::<proto::CancelTaskResponse>(), post(cancel)),
        d("POST", "/tasks/{id}/move", Operator, "Moves the task to another worker at its next step", Some(of::<MoveTo>()), of::<proto::MoveTaskResponse>(), post(move_task)),
        d("POST", "/tasks/{id}/resume", Operator, "Resumes a task with more budget", Some(of::<MoreBudget>()), of::<proto::ResumeTaskResponse>(), post(resume)),
        d("POST", "/tasks/{id}/deliver", Operator, "Delivers the task's last barrier as a branch (and a pull request)", Some(of::<DeliverHow>()), of::<proto::DeliverTaskResponse>(), post(deliver)),
        d("GET", "/tasks/{id}/diff", Viewer, "The workspace against its base, as text", None, Text, get(diff)).query::<DiffForm>(),
        d("GET", "/tasks/{id}/files", Viewer, "The workspace's file tree at a barrier", None, of::<Tree>(), get(files)).query::<At>(),
        d("GET", "/tasks/{id}/files/content", Viewer, "One file's bytes at a barrier", None, Bytes, get(file_content)).query::<At>(),
        d("GET", "/events", Viewer, "Every task's summary as it changes, as Server-Sent Events", None, Events, get(events::all_tasks)),
        d("GET", "/workers", Viewer, "Enrolled workers", None, of::<proto::ListWorkersResponse>(), get(list_workers)),
        d("POST", "/workers/{id}/revoke", Operator, "Revokes a worker's certificate and closes its session", None, of::<proto::RevokeWorkerResponse>(), post(revoke_worker)),
        d("GET", "/machines", Viewer, "Machines the brain created", None, of::<proto::ListMachinesResponse>(), get(list_machines)).query::<AllMachines>(),
        d("POST", "/machines", Operator, "Provisions a machine", Some(of::<proto::ProvisionRequest>()), of::<proto::MachineResponse>(), post(provision)),
        d("POST", "/machines/{id}/release", Operator, "Releases a machine", None, of::<proto::MachineResponse>(), post(release_machine)),
        d("POST", "/join-tokens", Operator, "Creates a one-time join token for a worker", Some(of::<proto::CreateTokenRequest>()), of::<proto::CreateTokenResponse>(), post(create_join_token)),
    ]
}

/// An answer with nothing in it.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct Empty {}

pub fn router(web: Web) -> Router {
    let mut api = Router::new();
    for doc in table() {
        let role = match doc.role {
            Role::Viewer => WebRole::Viewer,
            Role::Operator => WebRole::Operator,
        };
        let gate = axum::middleware::from_fn_with_state((web.clone(), role), auth::require);
        api = api.route(doc.path, doc.handler.route_layer(gate));
    }
    let api = api
        // Public: what the API looks like.
        .route("/openapi.json", get(openapi::document))
        .fallback(not_found);
    Router::new()
        .nest("/api", api)
        .route("/login", get(login))
        .merge(page::routes())
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(web)
}

async fn security_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    r
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint: see /api/openapi.json",
    )
}

/// A JSON body whose rejection is a JSON error too.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        // An empty body is the message with every field at its default.
        let empty = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v == "0");
        if empty {
            return serde_json::from_str("{}")
                .map(Body)
                .map_err(|e| ApiError::bad_request(e.to_string()));
        }
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(e) => Err(json_rejection(e)),
        }
    }
}

fn json_rejection(e: JsonRejection) -> ApiError {
    let status = e.status();
    ApiError::new(
        status,
        "invalid_argument",
        format!(
            "the request body is not what this endpoint takes: {}",
            e.body_text()
        ),
    )
}

/// Query parameters whose rejection is a JSON error.
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;
    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Params(q.0))
            .map_err(|e: QueryRejection| {
                ApiError::bad_request(format!("bad query parameters: {}", e.body_text()))
            })
    }
}

/// An admin request carrying the web caller.
fn request<T>(a: &Authed, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.extensions_mut().insert(a.caller.clone());
    r
}

/// Runs an admin call with the API's timeout.
async fn within<T>(
    f: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => Ok(r?.into_inner()),
        Err(_) => Err(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "deadline_exceeded",
            format!("the brain did not answer within {CALL_TIMEOUT:?}; try again"),
        )),
    }
}

type Answer<T> = Result<Json<T>, ApiError>;

// ---------------------------------------------------------------- session

#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct SessionInfo {
    pub name: String,
    pub role: String,
    /// token or session.
    pub kind: String,
    /// For a browser session: the value its changes send in `X-Tether-CSRF`.
    pub csrf: String,
}

async fn session(Extension(a): Extension<Authed>) -> Json<SessionInfo> {
    Json(SessionInfo {
        name: a.caller.name.clone(),
        role: a.caller.role.to_string(),
        kind: a.caller.kind.to_string(),
        csrf: a.session.as_deref().map(csrf_for).unwrap_or_default(),
    })
}

async fn logout(State(web): State<Web>, Extension(a): Extension<Authed>) -> Response {
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
struct LoginQuery {
    #[serde(default)]
    code: String,
}

/// `GET /login?code=...`: uses the one-time link up, sets the session cookie and goes to the
/// page; the code leaves the address bar at once.
async fn login(
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

// ---------------------------------------------------------------- tasks

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct TaskFilter {
    /// A status (`running`, `waiting`, `finished`, `budget_exhausted`, ...), or `active`
    /// for every task that has not ended.
    pub status: String,
    /// Worker id or name.
    pub worker: String,
    /// verified, unverified, failing, pending.
    pub verification: String,
    /// Text the goal contains (case-insensitive).
    pub q: String,
    /// At most this many, newest first (0: all).
    pub limit: usize,
}

fn matches(f: &TaskFilter, t: &proto::TaskSummary) -> bool {
    let status_ok = match f.status.as_str() {
        "" => true,
        "active" => !matches!(
            t.status.as_str(),
            "finished" | "failed" | "cancelled" | "stuck" | "stalled"
        ),
        s => t.status == s,
    };
    status_ok
        && (f.worker.is_empty() || t.worker == f.worker)
        && (f.verification.is_empty() || t.verification == f.verification)
        && (f.q.is_empty() || t.goal.to_lowercase().contains(&f.q.to_lowercase()))
}

async fn list_tasks(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Params(f): Params<TaskFilter>,
) -> Answer<proto::ListTasksResponse> {
    let mut r = within(
        web.services
            .list_tasks(request(&a, proto::ListTasksRequest {})),
    )
    .await?;
    r.tasks.retain(|t| matches(&f, t));
    r.tasks.reverse();
    if f.limit > 0 {
        r.tasks.truncate(f.limit);
    }
    Ok(Json(r))
}

async fn show_task(
    State(web): State<Web>,
    Extension(_): Extension<Authed>,
    Path(id): Path<String>,
) -> Answer<proto::TaskSummary> {
    let task = web.shared().engine.find(&id).map_err(tonic::Status::from)?;
    Ok(Json(task.state().into()))
}

async fn create_task(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Body(req): Body<proto::RunAgentRequest>,
) -> Result<(StatusCode, Json<proto::RunPlanResponse>), ApiError> {
    let r = within(web.services.run_agent(request(&a, req))).await?;
    Ok((StatusCode::CREATED, Json(r)))
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Reason {
    pub reason: String,
}

async fn approve(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
) -> Answer<proto::DecideResponse> {
    let req = proto::DecideRequest {
        task_id: id,
        approve: true,
        reason: String::new(),
    };
    Ok(Json(within(web.services.decide(request(&a, req))).await?))
}

async fn deny(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
    Body(b): Body<Reason>,
) -> Answer<proto::DecideResponse> {
    let req = proto::DecideRequest {
        task_id: id,
        approve: false,
        reason: b.reason.chars().take(4096).collect(),
    };
    Ok(Json(within(web.services.decide(request(&a, req))).await?))
}

async fn cancel(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
) -> Answer<proto::CancelTaskResponse> {
    let req = proto::CancelTaskRequest { task_id: id };
    Ok(Json(
        within(web.services.cancel_task(request(&a, req))).await?,
    ))
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct MoveTo {
    /// Worker id or name.
    pub to: String,
}

async fn move_task(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
    Body(b): Body<MoveTo>,
) -> Answer<proto::MoveTaskResponse> {
    let req = proto::MoveTaskRequest {
        task_id: id,
        to: b.to,
    };
    Ok(Json(
        within(web.services.move_task(request(&a, req))).await?,
    ))
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct MoreBudget {
    pub budget: proto::Budget,
}

async fn resume(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
    Body(b): Body<MoreBudget>,
) -> Answer<proto::ResumeTaskResponse> {
    let req = proto::ResumeTaskRequest {
        task_id: id,
        budget: Some(b.budget),
    };
    Ok(Json(
        within(web.services.resume_task(request(&a, req))).await?,
    ))
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct DeliverHow {
    pub pull_request: bool,
}

async fn deliver(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
    Body(b): Body<DeliverHow>,
) -> Answer<proto::DeliverTaskResponse> {
    let req = proto::DeliverTaskRequest {
        task_id: id,
        pull_request: b.pull_request,
    };
    Ok(Json(
        within(web.services.deliver_task(request(&a, req))).await?,
    ))
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct DiffForm {
    /// diff (default), stat or patch.
    pub form: String,
    /// The workspace at this root hash (a barrier the task's log names); empty: the last.
    pub root: String,
}

/// The workspace against its base, as text.
async fn diff(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
    Params(f): Params<DiffForm>,
) -> Result<Response, ApiError> {
    let req = proto::TaskDiffRequest {
        task_id: id,
        form: f.form,
        root: f.root,
    };
    let mut pieces = within(web.services.task_diff(request(&a, req))).await?;
    let mut text = Vec::new();
    while let Some(p) = pieces.next().await {
        text.extend_from_slice(&p?.data);
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response())
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct At {
    /// A root hash the task's log names (a barrier, or its starting workspace); empty: the
    /// last barrier.
    pub root: String,
    /// For `content`: the file's path.
    pub path: String,
}

#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct TreeEntry {
    pub path: String,
    /// file, dir or symlink.
    pub kind: &'static str,
    pub size: u64,
    pub exec: bool,
    pub target: String,
}

#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct Tree {
    pub root: String,
    pub entries: Vec<TreeEntry>,
}

/// The manifest at `root` if the task's log names it (empty: the last barrier).
async fn manifest_at(
    web: &Web,
    id: &str,
    root: &str,
) -> Result<(String, shared::manifest::Manifest), ApiError> {
    let (_, root) = crate::api::results::root_at(web.shared(), id, root).await?;
    if root.is_empty() {
        return Ok((root, shared::manifest::Manifest::default()));
    }
    let m = web.shared().mirror.clone();
    let r = root.clone();
    let manifest = tokio::task::spawn_blocking(move || m.manifest(&r))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map_err(tonic::Status::from)?;
    Ok((root, manifest))
}

/// The file tree of a task's workspace at a barrier.
async fn files(
    State(web): State<Web>,
    Extension(_): Extension<Authed>,
    Path(id): Path<String>,
    Params(at): Params<At>,
) -> Answer<Tree> {
    use shared::manifest::Kind as K;
    let (root, m) = manifest_at(&web, &id, &at.root).await?;
    let entries = m
        .entries
        .iter()
        .map(|(path, e)| TreeEntry {
            path: path.clone(),
            kind: match e.kind {
                K::File => "file",
                K::Dir => "dir",
                K::Symlink => "symlink",
            },
            size: e.size,
            exec: e.exec,
            target: e.target.clone(),
        })
        .collect();
    Ok(Json(Tree { root, entries }))
}

/// One file's content at a barrier, as bytes (`application/octet-stream`: a browser shows it
/// as text it builds itself, never as a page).
async fn file_content(
    State(web): State<Web>,
    Extension(_): Extension<Authed>,
    Path(id): Path<String>,
    Params(at): Params<At>,
) -> Result<Response, ApiError> {
    let (_, m) = manifest_at(&web, &id, &at.root).await?;
    let Some(e) = m.entries.get(&at.path) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no file {:?} in that workspace: see /files", at.path),
        ));
    };
    if e.kind != shared::manifest::Kind::File {
        return Err(ApiError::bad_request(format!(
            "{:?} is not a file",
            at.path
        )));
    }
    if e.size > MAX_FILE_SHOWN {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "{:?} is {} bytes, over the {} shown here: use `brain task export`",
                at.path, e.size, MAX_FILE_SHOWN
            ),
        ));
    }
    let (mirror, hash) = (web.shared().mirror.clone(), e.hash.clone());
    let data = tokio::task::spawn_blocking(move || mirror.get(&hash))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map_err(tonic::Status::from)?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response())
}

// ---------------------------------------------------------------- fleet

async fn list_workers(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
) -> Answer<proto::ListWorkersResponse> {
    let req = proto::ListWorkersRequest {};
    Ok(Json(
        within(web.services.list_workers(request(&a, req))).await?,
    ))
}

async fn revoke_worker(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
) -> Answer<proto::RevokeWorkerResponse> {
    let req = proto::RevokeWorkerRequest { worker: id };
    Ok(Json(
        within(web.services.revoke_worker(request(&a, req))).await?,
    ))
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct AllMachines {
    /// Include released and failed machines.
    pub all: bool,
}

async fn list_machines(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Params(q): Params<AllMachines>,
) -> Answer<proto::ListMachinesResponse> {
    let req = proto::ListMachinesRequest { all: q.all };
    Ok(Json(
        within(web.services.list_machines(request(&a, req))).await?,
    ))
}

async fn provision(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Body(mut req): Body<proto::ProvisionRequest>,
) -> Result<(StatusCode, Json<proto::MachineResponse>), ApiError> {
    // Within the API's timeout; the machine's state follows on /api/machines.
    req.wait_seconds = req.wait_seconds.min(50);
    let r = within(web.services.provision(request(&a, req))).await?;
    Ok((StatusCode::CREATED, Json(r)))
}

async fn release_machine(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
) -> Answer<proto::MachineResponse> {
    let req = proto::ReleaseMachineRequest { id };
    Ok(Json(
        within(web.services.release_machine(request(&a, req))).await?,
    ))
}

async fn create_join_token(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Body(mut req): Body<proto::CreateTokenRequest>,
) -> Result<(StatusCode, Json<proto::CreateTokenResponse>), ApiError> {
    if req.ttl_seconds == 0 {
        req.ttl_seconds = 3600;
    }
    let r = within(web.services.create_token(request(&a, req))).await?;
    tracing::info!(by = %a.caller, "join token created over the web API");
    Ok((StatusCode::CREATED, Json(r)))
}
