//! The HTTP API and the web page, served by `brain serve --web-listen ADDR`: JSON endpoints
//! over the same admin operations the CLI calls ([`crate::api`]'s `Admin` service, called in
//! process with the web caller in the request), a task's events as Server-Sent Events that
//! resume from a sequence number, and a page embedded in the binary.
//!
//! Who calls: a bearer token (`brain admin token create`) or a browser session (a cookie
//! opened by a one-time `brain web login` link). Viewers read; operators also change. A
//! change needs, from a browser, the session's CSRF token in `X-Tether-CSRF`, and is refused
//! from another origin. Plain HTTP only on loopback: put a TLS reverse proxy in front, and
//! list it in `[web] trusted_proxies` so that its `X-Forwarded-Host` is believed (from any
//! other peer that header is ignored).

mod auth;
mod conn;
mod events;
mod extract;
mod fleet;
mod openapi;
mod options;
mod page;
mod routes;
mod session;
mod streams;
mod tasks;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use tokio_util::sync::CancellationToken;

use crate::api::{Services, Shared};
use crate::trust::web::WebAuth;

pub use auth::SESSION_COOKIE;
pub use options::Options;

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
    #[error("invalid web settings in the config file: {0}")]
    Config(#[from] options::OptionsError),
}

/// What the handlers share.
#[derive(Clone)]
pub struct Web {
    pub(crate) services: Services,
    pub(crate) auth: WebAuth,
    /// `[web]`: limits and trusted proxies.
    pub(crate) opts: Arc<Options>,
    /// The event streams each credential holds open.
    pub(crate) streams: Arc<streams::Streams>,
}

impl Web {
    pub fn new(shared: Arc<Shared>, auth: WebAuth, opts: Options) -> Self {
        Self {
            services: Services(shared),
            auth,
            opts: Arc::new(opts),
            streams: Arc::default(),
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

/// How long the web API's threads get to close their connections at shutdown.
const WEB_STOP: Duration = Duration::from_secs(2);

/// Serves until `shutdown` is cancelled, on threads of its own at the lowest CPU priority
/// (see [`lower_priority`]): what watchers cost (a write per watcher per batch of records, and
/// their wakeups) is taken from what the tasks leave, so a thousand watchers of a task do not
/// hold it up. Each request's handler runs on `engine`, the runtime it came from (it may start
/// tasks that must outlive the request at the engine's priority); only the answers are written
/// from here, a task's event stream included. Returns when the web threads have stopped (or
/// after a short grace once `shutdown` is cancelled).
pub async fn serve(
    listener: tokio::net::TcpListener,
    web: Web,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listener = listener.into_std()?;
    let engine = tokio::runtime::Handle::current();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let stop = shutdown.clone();
    std::thread::Builder::new()
        .name("tether-web".into())
        .spawn(move || {
            let result = web_runtime().and_then(|rt| {
                let result = rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)?;
                    let opts = web.opts.clone();
                    let app = routes::router(web).layer(axum::middleware::from_fn(
                        move |req: axum::extract::Request, next: axum::middleware::Next| {
                            let engine = engine.clone();
                            async move {
                                match engine.spawn(next.run(req)).await {
                                    Ok(r) => r,
                                    Err(e) => ApiError::new(
                                        StatusCode::SERVICE_UNAVAILABLE,
                                        "unavailable",
                                        format!("the brain is stopping ({e}); try again"),
                                    )
                                    .into_response(),
                                }
                            }
                        },
                    ));
                    conn::serve(listener, app, &opts, stop, WEB_STOP).await;
                    Ok::<_, std::io::Error>(())
                });
                rt.shutdown_timeout(WEB_STOP);
                result
            });
            let _ = done_tx.send(result);
        })?;
    tokio::select! {
        r = done_rx => r.unwrap_or(Ok(())),
        // Streams that do not end by themselves (a client that reads nothing) are cut.
        _ = async { shutdown.cancelled().await; tokio::time::sleep(WEB_STOP * 2).await } => Ok(()),
    }
}

/// The web API's runtime: two threads, named `tether-web`, each at the lowest priority.
fn web_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    lower_priority();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tether-web")
        .on_thread_start(lower_priority)
        .enable_all()
        .build()
}

/// Puts the calling thread in Linux's `SCHED_IDLE` class: it runs on CPU time no other thread
/// of its group wants, and a thread of the engine that wakes takes the CPU from it at once.
/// Not a nice value: nice stops at 19, so a brain started at nice 10 or more (systemd's
/// `Nice=`, `nice -n 19`) could not put its web threads 10 below its engine, and one at 19 not
/// below it at all (the events bench under `nice -n 19`: both at 19, 1,000 watchers slowed a
/// task up to 5×). Lowering needs no privilege; where it fails, the thread keeps its priority.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid sched_param that outlives the call; pid 0 is the calling
        // thread, and the call changes nothing but that thread's scheduling class (rustix has
        // no sched_setscheduler).
        let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        if r != 0 {
            let error = std::io::Error::last_os_error();
            tracing::debug!(%error, "cannot lower the web threads' priority");
        }
    }
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
