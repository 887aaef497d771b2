//! The routes: one table of every `/api` route with the role it needs, what it takes and
//! what it answers; the router and the OpenAPI document are both made from it. Handlers (in
//! `session`, `tasks`, `fleet`, `events`) take the checked caller and JSON, call the admin
//! operation the CLI calls (in process, with the caller in the request) and answer JSON:
//! the wire messages of `tether.v1` in their JSON form (absent fields take their defaults).

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};

use super::auth;
use super::events;
use super::fleet::*;
use super::openapi::{Doc, Role, Shape, of};
use super::session::*;
use super::tasks::*;
use super::{ApiError, Web, openapi, page};
use crate::trust::web::WebRole;

/// Largest request body (a task's goal, or a replay transcript); others are small.
const MAX_BODY: usize = 9 * 1024 * 1024;

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
        d("GET", "/tasks/{id}/events", Viewer, "The task's log as Server-Sent Events (id: the sequence number; resume with Last-Event-ID or since), or as NDJSON with follow=false; ends with a `closed` event when the credential does; 429 past [web] max_streams_per_credential", None, Events, get(events::task_events)).query::<events::EventsQuery>(),
        d("POST", "/tasks/{id}/approve", Operator, "Approves what the task waits for (always: the same command, or a change to the same file, for the rest of the task)", Some(of::<ApproveHow>()), of::<proto::DecideResponse>(), post(approve)),
        d("POST", "/tasks/{id}/deny", Operator, "Denies it, with a reason the model is told", Some(of::<Reason>()), of::<proto::DecideResponse>(), post(deny)),
        d("POST", "/tasks/{id}/cancel", Operator, "Cancels the task", None, of::<proto::CancelTaskResponse>(), post(cancel)),
        d("POST", "/tasks/{id}/move", Operator, "Moves the task to another worker at its next step", Some(of::<MoveTo>()), of::<proto::MoveTaskResponse>(), post(move_task)),
        d("POST", "/tasks/{id}/resume", Operator, "Resumes a task with more budget", Some(of::<MoreBudget>()), of::<proto::ResumeTaskResponse>(), post(resume)),
        d("POST", "/tasks/{id}/deliver", Operator, "Delivers the task's last barrier as a branch (and a pull request)", Some(of::<DeliverHow>()), of::<proto::DeliverTaskResponse>(), post(deliver)),
        d("GET", "/tasks/{id}/diff", Viewer, "The workspace against its base, as text: at most [web] max_diff_bytes (the X-Tether-Diff-Limit header), a longer one cut with a last line that says so", None, Text, get(diff)).query::<DiffForm>(),
        d("GET", "/tasks/{id}/files", Viewer, "The workspace's file tree at a barrier", None, of::<Tree>(), get(files)).query::<At>(),
        d("GET", "/tasks/{id}/files/content", Viewer, "One file's bytes at a barrier", None, Bytes, get(file_content)).query::<At>(),
        d("GET", "/events", Viewer, "Every task's summary as it changes, as Server-Sent Events; ends with a `closed` event when the credential does; 429 past [web] max_streams_per_credential", None, Events, get(events::all_tasks)),
        d("GET", "/workers", Viewer, "Enrolled workers", None, of::<proto::ListWorkersResponse>(), get(list_workers)),
        d("POST", "/workers/{id}/revoke", Operator, "Revokes a worker's certificate and closes its session", None, of::<proto::RevokeWorkerResponse>(), post(revoke_worker)),
        d("GET", "/machines", Viewer, "Machines the brain created", None, of::<proto::ListMachinesResponse>(), get(list_machines)).query::<AllMachines>(),
        d("POST", "/machines", Operator, "Provisions a machine", Some(of::<proto::ProvisionRequest>()), of::<proto::MachineResponse>(), post(provision)),
        d("POST", "/machines/{id}/release", Operator, "Releases a machine", None, of::<proto::MachineResponse>(), post(release_machine)),
        d("POST", "/join-tokens", Operator, "Creates a one-time join token for a worker", Some(of::<proto::CreateTokenRequest>()), of::<proto::CreateTokenResponse>(), post(create_join_token)),
    ]
}

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
        .route(
            "/openapi.json",
            get(|| async { axum::Json(openapi::build(&table())) }),
        )
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
