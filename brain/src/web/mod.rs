//! The HTTP API and the web page, served by `brain serve --web-listen ADDR`: JSON endpoints
//! over the same admin operations the CLI calls ([`crate::api`]'s `Admin` service, called in
//! process with the web caller in the request), a task's events as Server-Sent Events that
//! resume from a sequence number, and a page embedded in the binary.
//!
//! Who calls: a bearer token (`brain admin token create`) or a browser session (a cookie
//! opened by a one-time `brain web login` link). Viewers read; operators also change. A
//! change needs, from a browser, the session's CSRF token in `X-Tether-CSRF`, and is refused
//! from another origin. Plain HTTP only on loopback: put a TLS reverse proxy in front.

mod auth;
mod events;
mod extract;
mod fleet;
mod openapi;
mod page;
mod routes;
mod session;
mod tasks;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::api::{Services, Shared};
use crate::trust::web::WebAuth;

pub use auth::SESSION_COOKIE;

/// Why the web API could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "refusing to serve plain HTTP on {0}: the web API listens on loopback only (127.0.0.1 or ::1); put a TLS reverse proxy in front for other hosts"
    )]
    NotLoopback(SocketAddr),
    #[error(
        "cannot listen on {addr} for the web API: {source} (is another process using this port?)"
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// What the handlers share.
#[derive(Clone)]
pub struct Web {
    pub(crate) services: Services,
    pub(crate) auth: WebAuth,
}

impl Web {
    pub fn new(shared: Arc<Shared>, auth: WebAuth) -> Self {
        Self {
            services: Services(shared),
            auth,
        }
    }

    fn shared(&self) -> &Shared {
        &self.services.0
    }
}

/// Binds the web API's port (loopback only).
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    if !addr.ip().is_loopback() {
        return Err(Error::NotLoopback(addr));
    }
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })
}

/// Serves until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    web: Web,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, routes::router(web))
        .with_graceful_shutdown(shutdown)
        .await
}

/// An error answer: `{"error": {"code": ..., "message": ...}}` with the HTTP status that
/// says what kind of failure it is; the message says what to do.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_argument", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

impl From<tonic::Status> for ApiError {
    fn from(s: tonic::Status) -> Self {
        use tonic::Code as C;
        let (status, code) = match s.code() {
            C::InvalidArgument | C::OutOfRange => (StatusCode::BAD_REQUEST, "invalid_argument"),
            C::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            C::AlreadyExists => (StatusCode::CONFLICT, "already_exists"),
            C::FailedPrecondition | C::Aborted => (StatusCode::CONFLICT, "failed_precondition"),
            C::PermissionDenied => (StatusCode::FORBIDDEN, "permission_denied"),
            C::Unauthenticated => (StatusCode::UNAUTHORIZED, "unauthenticated"),
            C::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "resource_exhausted"),
            C::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "deadline_exceeded"),
            C::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        Self::new(status, code, s.message())
    }
}

impl From<crate::trust::registry::Error> for ApiError {
    fn from(e: crate::trust::registry::Error) -> Self {
        tonic::Status::from(e).into()
    }
}
