//! The web listener's connections, served with hyper's HTTP/1 directly (not `axum::serve`,
//! whose connection builder sets no timer, so it has no header read timeout at all):
//! a connection must send each request's headers within `[web] header_read_timeout` (from
//! when it opens, or from the end of its previous answer), else it is closed — a slowloris
//! that trickles header lines is closed as one that sends nothing; at most `[web]
//! max_connections` are served at once, and one more is answered 503 with words and closed.
//! Each request carries its peer's address (`ConnectInfo`), for the trusted-proxy check.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::options::Options;

/// Refusals being written at once; past this, an excess connection is closed unanswered.
const REFUSALS: usize = 64;
/// How long a refusal may take to be written and its connection closed.
const REFUSAL_TIME: Duration = Duration::from_secs(2);
/// How long to wait after an accept error (out of file descriptors) before the next accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `stop` is cancelled; then every connection is asked to
/// close after its answer in flight, and this returns when they have, or after `grace`
/// (event streams do not end by themselves).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    opts: &Options,
    stop: CancellationToken,
    grace: Duration,
) {
    // Why a semaphore: a connection holds a permit for its whole life, so the web API holds
    // at most `max_connections` sockets (and their buffers) however many come.
    let permits = Arc::new(Semaphore::new(opts.max_connections));
    // Why another: refusals are written by tasks of their own; this bounds those too.
    let refusals = Arc::new(Semaphore::new(REFUSALS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(opts.header_read_timeout);
    let tracker = TaskTracker::new();
    let max = opts.max_connections;
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "the web API cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(%peer, max, "web connection refused: too many open");
            if let Ok(slot) = refusals.clone().try_acquire_owned() {
                tracker.spawn(async move {
                    let _slot = slot;
                    let _ = tokio::time::timeout(REFUSAL_TIME, refuse(stream, max)).await;
                });
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = TowerToHyperService::new(app.clone());
        let svc = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            app.call(req)
        });
        let conn = http.serve_connection(TokioIo::new(stream), svc);
        let stop = stop.clone();
        tracker.spawn(async move {
            let _permit = permit;
            tokio::pin!(conn);
            let r = tokio::select! {
                r = conn.as_mut() => r,
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = r {
                tracing::debug!(%peer, error = %e, "web connection ended");
            }
        });
    }
    tracker.close();
    let _ = tokio::time::timeout(grace, tracker.wait()).await;
}

/// Answers a connection past the limit with 503 and closes it: the answer first, then the
/// write side, then what the client sent is read away (closing with it unread would reset
/// the connection, and the client might lose the answer).
async fn refuse(mut stream: TcpStream, max: usize) {
    let body = serde_json::json!({"error": {
        "code": "unavailable",
        "message": format!("the web API serves at most {max} connections at once ([web] max_connections): try again shortly"),
    }})
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(answer.as_bytes()).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 1024];
    while let Ok(n) = stream.read(&mut sink).await {
        if n == 0 {
            break;
        }
    }
}

/// The address a request came from (the peer of its connection).
pub fn peer(req: &axum::extract::Request) -> Option<std::net::SocketAddr> {
    req.extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0)
}
