//! Dialling the brain: a gRPC channel over TLS with a rustls configuration we build ourselves
//! (pinned CA for enrolment, mutual TLS afterwards), and plain-words explanations of why a
//! connection failed.

use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tonic::transport::{Channel, Endpoint};

/// Errors dialling the brain.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid brain URL {url:?}: {reason} (expected https://HOST:PORT)")]
    Url { url: String, reason: String },
    #[error("{0}")]
    Connect(String),
}

impl crate::exit::Classify for Error {
    /// A malformed URL is a configuration problem; a failed connection is not.
    fn exit_code(&self) -> Option<crate::exit::ExitCode> {
        matches!(self, Error::Url { .. }).then_some(crate::exit::ExitCode::Config)
    }
}

/// Where the brain is: host, port and the name its certificate must carry.
#[derive(Debug, Clone)]
pub struct BrainAddr {
    pub host: String,
    pub port: u16,
}

impl BrainAddr {
    /// Parses `https://HOST:PORT` (port defaults to 7443).
    pub fn parse(url: &str) -> Result<Self, Error> {
        let bad = |reason: &str| Error::Url {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
        if uri.scheme_str() != Some("https") {
            return Err(bad("the scheme must be https"));
        }
        let host = uri.host().ok_or_else(|| bad("no host"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        Ok(Self {
            host,
            port: uri.port_u16().unwrap_or(7443),
        })
    }

    pub fn url(&self) -> String {
        if self.host.contains(':') {
            format!("https://[{}]:{}", self.host, self.port)
        } else {
            format!("https://{}:{}", self.host, self.port)
        }
    }
}

/// Timeouts for a brain connection.
#[derive(Debug, Clone, Copy)]
pub struct DialOptions {
    pub connect_timeout: Duration,
    /// HTTP/2 keep-alive ping interval; a dead peer is noticed within about twice this.
    pub keepalive: Duration,
}

impl Default for DialOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            keepalive: Duration::from_secs(10),
        }
    }
}

/// Opens a gRPC channel to the brain over TLS with `config`. The TCP and TLS handshakes happen
/// here, so a refused certificate or an unreachable brain is reported by this call.
pub async fn dial(
    addr: &BrainAddr,
    config: ClientConfig,
    opts: DialOptions,
) -> Result<Channel, Error> {
    let server_name = ServerName::try_from(addr.host.clone()).map_err(|_| Error::Url {
        url: addr.url(),
        reason: "host is not a valid DNS name or IP address".into(),
    })?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let target = (addr.host.clone(), addr.port);
    let connect = tower::service_fn(move |_: Uri| {
        let connector = connector.clone();
        let server_name = server_name.clone();
        let target = target.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect((target.0.as_str(), target.1)).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(server_name, tcp).await?;
            Ok::<_, std::io::Error>(TokioIo::new(tls))
        }
    });
    // The URI only labels requests; the connector above decides where and how to connect.
    let label = addr.url().replacen("https://", "http://", 1);
    let endpoint = Endpoint::from_shared(label)
        .map_err(|e| Error::Url {
            url: addr.url(),
            reason: e.to_string(),
        })?
        .connect_timeout(opts.connect_timeout)
        .http2_keep_alive_interval(opts.keepalive)
        .keep_alive_timeout(opts.keepalive)
        .keep_alive_while_idle(true);
    endpoint
        .connect_with_connector(connect)
        .await
        .map_err(|e| Error::Connect(explain(&e, &addr.url())))
}

/// Says in plain words why talking to the brain failed, by walking the error's causes.
pub fn explain(err: &(dyn std::error::Error + 'static), url: &str) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return explain_tls(tls, url);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(inner) = io.get_ref()
                && let Some(tls) = inner.downcast_ref::<rustls::Error>()
            {
                return explain_tls(tls, url);
            }
            // h2 keeps only the text of an I/O error, so a TLS alert may arrive as text.
            let text = io.to_string();
            if text.contains("received fatal alert") {
                return format!(
                    "the brain at {url} refused our certificate ({text}): it may be from another brain, revoked or expired"
                );
            }
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => {
                    format!(
                        "brain unreachable at {url}: connection refused (is `brain serve` running there?)"
                    )
                }
                std::io::ErrorKind::TimedOut => format!("brain unreachable at {url}: timed out"),
                std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::UnexpectedEof => format!(
                    "the brain at {url} closed the connection ({io}): it may have refused our certificate (from another brain, revoked or expired)"
                ),
                _ => format!("brain unreachable at {url}: {io}"),
            };
        }
        // hyper reports a connection the peer dropped under a pending request as cancelled.
        if e.to_string().contains("connection closed") {
            return format!(
                "the brain at {url} closed the connection: it may have refused our certificate (from another brain, revoked or expired)"
            );
        }
        cur = e.source();
    }
    let mut msg = format!("cannot talk to the brain at {url}: {err}");
    let mut src = err.source();
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    msg
}

fn explain_tls(e: &rustls::Error, url: &str) -> String {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    match e {
        E::InvalidCertificate(C::Expired | C::NotValidYet)
        | E::InvalidCertificate(C::ExpiredContext { .. })
        | E::InvalidCertificate(C::NotValidYetContext { .. }) => format!(
            "the brain's certificate is outside its validity period at {url}: check this machine's clock (clock skew) or the brain's certificate dates ({e})"
        ),
        E::InvalidCertificate(C::UnknownIssuer) => format!(
            "the brain at {url} presented a certificate from a CA we do not trust: wrong brain, or its CA was re-created"
        ),
        E::InvalidCertificate(C::NotValidForName)
        | E::InvalidCertificate(C::NotValidForNameContext { .. }) => format!(
            "the brain's certificate does not name the host in {url}: re-run `brain init --force --host NAME` with this name, or connect by a name it has ({e})"
        ),
        E::AlertReceived(
            A::CertificateRevoked
            | A::BadCertificate
            | A::UnknownCA
            | A::CertificateUnknown
            | A::CertificateExpired,
        ) => format!(
            "the brain at {url} refused our certificate ({e}): it may be from another brain, revoked or expired; enrol again with `worker join`"
        ),
        E::General(msg) if msg.contains("CA hash mismatch") => msg.clone(),
        other => format!("TLS with the brain at {url} failed: {other}"),
    }
}

/// Whether the brain refused a worker's certificate for good: revoked (or removed, which
/// revokes). Retrying cannot change that. "Not enrolled here" and "superseded" are not: a
/// replica whose copy of the shared registry lags says them of a worker another replica just
/// enrolled. The brain's words (its `PeerRefused`) are held to this by its tests.
pub fn refused_for_good(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::PermissionDenied
        && s.message().starts_with("certificate revoked:")
        && s.message().ends_with(" was revoked on this brain")
}

/// Says in plain words what a status from the brain at `url` means, looking through to the
/// transport error underneath when the call never reached the brain.
pub fn explain_status(s: &tonic::Status, url: &str) -> String {
    use tonic::Code;
    if let Some(src) = std::error::Error::source(s) {
        let text = explain(src, url);
        if !text.starts_with("cannot talk to the brain") {
            return text;
        }
        if s.code() == Code::Cancelled {
            // hyper cancels a request whose connection the peer dropped.
            return format!(
                "the brain at {url} closed the connection: it may have refused our certificate (from another brain, revoked or expired)"
            );
        }
    }
    match s.code() {
        Code::Unauthenticated | Code::PermissionDenied => {
            format!("the brain refused us: {}", s.message())
        }
        // Said by the brain itself: it is there, something behind it is not (a provider).
        Code::Unavailable if !s.message().is_empty() => s.message().to_string(),
        Code::Unavailable => format!("the brain at {url} is unavailable"),
        Code::Internal | Code::Unknown | Code::DataLoss => {
            format!("the brain failed: {} ({:?})", s.message(), s.code())
        }
        _ => s.message().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explains_common_failures_in_plain_words() {
        let url = "https://b:1";
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(explain(&refused, url).contains("connection refused"));
        let expired = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidYet),
        );
        assert!(explain(&expired, url).contains("clock skew"));
        let alert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "received fatal alert: UnknownCA",
        );
        assert!(explain(&alert, url).contains("refused our certificate"));
        let s = tonic::Status::permission_denied("certificate revoked: worker w-1");
        assert!(explain_status(&s, url).contains("certificate revoked"));
        let s = tonic::Status::not_found("no worker named \"x\"");
        assert_eq!(explain_status(&s, url), "no worker named \"x\"");
    }

    #[test]
    fn parses_brain_urls() {
        let a = BrainAddr::parse("https://10.1.2.3:9000").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("10.1.2.3", 9000));
        assert_eq!(
            BrainAddr::parse("https://brain.example").unwrap().port,
            7443
        );
        assert_eq!(BrainAddr::parse("https://[::1]:1").unwrap().host, "::1");
        assert!(BrainAddr::parse("http://x:1").is_err());
        assert!(BrainAddr::parse("nonsense").is_err());
    }
}
