//! Why the brain's egress proxy could not reach a task's upstream host or get its answer (the
//! text goes to the command in a 502 answer).

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The host does not resolve, or resolves to an internal address.
    #[error(
        "{0}: the brain does not go there for a task (pin a name with [egress.resolve] to allow it)"
    )]
    NotPublic(#[source] shared::net::Error),
    #[error("{0:?} is not a server name")]
    ServerName(String),
    #[error("cannot connect: {0}")]
    Connect(#[source] std::io::Error),
    #[error("TLS with the real {host} failed: {source}")]
    Tls {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no connection within {}s", .0.as_secs())]
    ConnectTimeout(Duration),
    #[error("HTTP handshake: {0}")]
    Handshake(#[source] hyper::Error),
    #[error("upstream failed: {0}")]
    Failed(#[source] hyper::Error),
    #[error("no answer within {}s", .0.as_secs())]
    AnswerTimeout(Duration),
}
