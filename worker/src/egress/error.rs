//! Why the egress proxy refuses a connection: a request head it cannot take, a host it may
//! not dial directly, or a direct tunnel whose TLS does not name the host it was opened to.
//! The words go to the command, in the refusal's body and on its stderr.

/// Why the egress proxy refuses a connection.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the request: {0}")]
    Read(#[source] std::io::Error),
    #[error("the connection closed inside the request head")]
    CutHead,
    #[error("the request head is longer than {max} bytes")]
    LongHead { max: usize },
    #[error("not an HTTP request: {0}")]
    NotHttp(#[source] httparse::Error),
    #[error("an https:// URL is asked for with CONNECT, not sent to the proxy in the clear")]
    HttpsInClear,
    #[error("{target:?} is not an absolute http:// URL, which a proxy needs")]
    NotAbsolute { target: String },
    #[error("{authority:?}: user information does not go in a proxy request")]
    UserInfo { authority: String },
    #[error("{authority:?} is not host:port")]
    NotHostPort { authority: String },
    #[error("{authority:?}: {port:?} is not a port")]
    BadPort { authority: String, port: String },
    #[error("{authority:?} has no port")]
    NoPort { authority: String },
    #[error("{authority:?} does not name a host")]
    NoHost { authority: String },
    #[error("the brain pinned {host} to {ip:?}, which is not an address")]
    BadPin { host: String, ip: String },
    /// The host's addresses, as `shared::net::resolve_public` words why it may not be dialled.
    #[error(
        "{why}: direct egress never goes there; an operator can pin a name with [egress.resolve] in the brain's config"
    )]
    NotPublic {
        #[source]
        why: shared::net::Error,
    },
    #[error("{0}: a tunnel to a directly allowed host must carry TLS naming that host")]
    NotTls(&'static str),
    #[error("no complete ClientHello in the first 64 KiB")]
    LongHello,
    #[error("the command closed before its TLS began")]
    ClosedBeforeTls,
    #[error("no TLS ClientHello within 30s")]
    NoHello,
    #[error(
        "the tunnel was opened to {host} but its TLS asks for {named}: a direct rule admits only the host it names"
    )]
    OtherName { host: String, named: String },
    #[error("the tunnel to {host} carries TLS that names no host (no SNI)")]
    NoName { host: String },
}
