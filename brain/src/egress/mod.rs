//! The brain's side of the egress proxy: one connection a task's command opened through its
//! worker, arriving as a byte stream, whose TLS the brain terminates with a certificate from
//! the egress CA. Each HTTP/1.1 request on it is checked (its method against the allow-list;
//! every placeholder in its target and headers must be one of the task's, for a secret bound
//! to this host — else it is refused and nothing goes upstream), the placeholders are swapped
//! for the values (and a secret's credential added where the request lacks it), and the
//! request goes upstream over the brain's own TLS connection, which verifies the host's real
//! certificate. The request goes to the plan's host and no other: its `Host` is set to the
//! plan's authority, and one that names another (or an absolute-form target that does) is
//! refused, so behind a shared front the value cannot reach another tenant. A request that
//! carries a secret asks for `identity` and loses its `Range`; what comes back compressed
//! anyway is inflated, and a value echoed back in the response (headers or body, in any of
//! the forms [`mask::needles`] lists) is masked; trailers are dropped. Knows nothing of
//! tasks: the caller decides what is injected where ([`Plan`]).

mod error;
mod inflate;
mod mask;
mod sniff;
mod swap;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use shared::locks::Lock;

use error::UpstreamError;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::trust::secrets::{Inject, Value};

/// How long connecting upstream (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long upstream may take to answer a request's headers.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest request head accepted from a command.
const MAX_HEAD_BYTES: usize = 64 * 1024;

type Body = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Errors setting the proxy up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the upstream CA {path}: {reason}")]
    UpstreamCa { path: String, reason: String },
}

/// A secret to put into this connection's requests.
#[derive(Clone)]
pub struct Injection {
    pub name: String,
    /// The placeholder the task's commands hold for it.
    pub placeholder: String,
    pub value: Value,
    pub inject: Inject,
}

/// What one intercepted connection may do.
#[derive(Clone)]
pub struct Plan {
    pub host: String,
    pub port: u16,
    pub inject: Vec<Injection>,
    /// Allowed methods; empty: any.
    pub methods: Vec<String>,
}

/// Intercepted connections open at once, in all and for one task. Each costs the brain its
/// buffers (a TLS session each way, request and answer heads of at most 64 KiB, the tunnel's
/// queue) and, while it inflates an answer, about 64 KiB of inflated bytes at a time
/// ([`inflate`]); these bounds keep the sum of all of them bounded.
pub const MAX_CONNECTIONS: usize = 128;
pub const MAX_TASK_CONNECTIONS: usize = 32;

/// Counts the intercepted connections open, in all and per task.
#[derive(Default)]
struct Admission {
    open: std::sync::Mutex<(usize, std::collections::HashMap<String, usize>)>,
}

/// An admitted connection: it counts until dropped.
pub struct Ticket {
    admission: Arc<Admission>,
    task: String,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut open = self.admission.open.locked();
        open.0 = open.0.saturating_sub(1);
        if let Some(n) = open.1.get_mut(&self.task) {
            *n -= 1;
            if *n == 0 {
                open.1.remove(&self.task);
            }
        }
    }
}

/// How the brain connects upstream.
pub struct Upstream {
    tls: Arc<rustls::ClientConfig>,
    resolve: BTreeMap<String, IpAddr>,
    admission: Arc<Admission>,
}

impl Upstream {
    /// The public roots (webpki's) and the PEM files of `extra_cas`; names in `resolve` go to
    /// those addresses instead of DNS.
    pub fn new(
        extra_cas: &[std::path::PathBuf],
        resolve: BTreeMap<String, IpAddr>,
    ) -> Result<Self, Error> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        for path in extra_cas {
            let bad = |reason: String| Error::UpstreamCa {
                path: path.display().to_string(),
                reason,
            };
            let pem = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
            let certs = shared::pki::certs_from_pem(&pem, path).map_err(|e| bad(e.to_string()))?;
            for c in certs {
                roots.add(c).map_err(|e| bad(e.to_string()))?;
            }
        }
        let mut tls = rustls::ClientConfig::builder_with_provider(shared::pki::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::UpstreamCa {
                path: String::new(),
                reason: e.to_string(),
            })?
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            tls: Arc::new(tls),
            resolve: resolve
                .into_iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v))
                .collect(),
            admission: Arc::default(),
        })
    }

    /// Admits one more intercepted connection for `task`, or says in words why not (too
    /// many open for the task, or for the brain).
    pub fn admit(&self, task: &str) -> Result<Ticket, String> {
        let mut open = self.admission.open.locked();
        let mine = open.1.get(task).copied().unwrap_or(0);
        if mine >= MAX_TASK_CONNECTIONS {
            return Err(format!(
                "this task already has {MAX_TASK_CONNECTIONS} connections open through the brain, the most one task may; close some (fewer requests at once) and try again"
            ));
        }
        if open.0 >= MAX_CONNECTIONS {
            return Err(format!(
                "the brain already carries {MAX_CONNECTIONS} connections for tasks, the most it takes at once; try again when fewer are open"
            ));
        }
        open.0 += 1;
        *open.1.entry(task.to_string()).or_default() += 1;
        Ok(Ticket {
            admission: self.admission.clone(),
            task: task.to_string(),
        })
    }

    async fn connect(
        &self,
        host: &str,
        port: u16,
    ) -> Result<hyper::client::conn::http1::SendRequest<Body>, UpstreamError> {
        // A pinned name goes where the operator said; any other goes to an address that
        // is not internal (the brain's own host and network are not a task's to reach), and
        // to the address checked.
        let addr = match self.resolve.get(&host.to_ascii_lowercase()) {
            Some(ip) => std::net::SocketAddr::new(*ip, port),
            None => shared::net::resolve_public(host, port, CONNECT_TIMEOUT)
                .await
                .map_err(UpstreamError::NotPublic)?[0],
        };
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|_| UpstreamError::ServerName(host.to_string()))?;
        let connector = tokio_rustls::TlsConnector::from(self.tls.clone());
        let io = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let tcp = TcpStream::connect(&addr)
                .await
                .map_err(UpstreamError::Connect)?;
            let _ = tcp.set_nodelay(true);
            connector
                .connect(name, tcp)
                .await
                .map_err(|source| UpstreamError::Tls {
                    host: host.to_string(),
                    source,
                })
        })
        .await
        .map_err(|_| UpstreamError::ConnectTimeout(CONNECT_TIMEOUT))??;
        let (send, conn) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(MAX_HEAD_BYTES.max(8192))
            .handshake(TokioIo::new(io))
            .await
            .map_err(UpstreamError::Handshake)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(send)
    }
}

/// Serves one intercepted connection: TLS with `tls` (a certificate for the plan's host),
/// then its requests, until either side closes. `refused` is told each request it refuses,
/// and why.
pub async fn intercept<IO>(
    io: IO,
    tls: Arc<rustls::ServerConfig>,
    plan: Plan,
    upstream: Arc<Upstream>,
    refused: Arc<dyn Fn(String) + Send + Sync>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, acceptor.accept(io)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(host = %plan.host, error = %e, "egress: the command's TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let conn = Arc::new(Conn {
        plan,
        upstream,
        refused,
        send: tokio::sync::Mutex::new(None),
    });
    let service = hyper::service::service_fn(move |req| {
        let conn = conn.clone();
        async move { Ok::<_, std::convert::Infallible>(conn.handle(req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD_BYTES.max(8192))
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// One intercepted connection's state: its plan and its upstream connection, made at the
/// first request and reused while it stays open.
struct Conn {
    plan: Plan,
    upstream: Arc<Upstream>,
    refused: Arc<dyn Fn(String) + Send + Sync>,
    send: tokio::sync::Mutex<Option<hyper::client::conn::http1::SendRequest<Body>>>,
}

fn answer(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(
        http_body_util::Full::new(Bytes::from(format!("{text}\n")))
            .map_err(|e| match e {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Whether an authority (`host[:port]`, from a `Host` header or a request target) names
/// the plan's host and port (443 when it names none).
fn names_plan(authority: &str, plan: &Plan) -> bool {
    let a = authority.trim();
    let a = a.rsplit_once('@').map_or(a, |(_, h)| h);
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, "")) => (h, None),
            Some((h, p)) => match p.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None => return false,
            },
            None => return false,
        }
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (a, None),
        }
    };
    let port = match port {
        None => 443,
        Some(p) => match p.parse::<u16>() {
            Ok(p) => p,
            Err(_) => return false,
        },
    };
    host.trim_end_matches('.').eq_ignore_ascii_case(&plan.host) && port == plan.port
}

/// Headers that belong to one hop, never forwarded.
const HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

impl Conn {
    fn refuse(&self, why: String) -> Response<Body> {
        (self.refused)(why.clone());
        answer(
            StatusCode::FORBIDDEN,
            format!("tether egress refused: {why}"),
        )
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let p = &self.plan;
        let method = req.method().as_str().to_string();
        if !p.methods.is_empty() && !p.methods.contains(&method) {
            return self.refuse(format!(
                "{method} to {}:{} is not allowed (this task's allow-list admits {})",
                p.host,
                p.port,
                p.methods.join(", ")
            ));
        }
        let (mut parts, body) = req.into_parts();
        let authority = if p.port == 443 {
            p.host.clone()
        } else {
            format!("{}:{}", p.host, p.port)
        };
        if let Some(a) = parts.uri.authority()
            && !names_plan(a.as_str(), p)
        {
            return self.refuse(format!(
                "the request target names {a}, but this connection (and its credential) is for {authority}: the Host may not differ"
            ));
        }
        for h in parts.headers.get_all(hyper::header::HOST) {
            let named = String::from_utf8_lossy(h.as_bytes()).into_owned();
            if !names_plan(&named, p) {
                return self.refuse(format!(
                    "the request's Host names {named:?}, but this connection (and its credential) is for {authority}"
                ));
            }
        }
        let target = parts
            .uri
            .path_and_query()
            .map(|pq| pq.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        let mut used = std::collections::BTreeSet::new();
        let target = match swap::in_target(&target, p, &mut used) {
            Ok(t) => t,
            Err(why) => return self.refuse(why.to_string()),
        };
        let mut headers = hyper::HeaderMap::new();
        for (name, value) in parts.headers.iter() {
            if HOP.contains(&name.as_str()) {
                continue;
            }
            match swap::in_header(name.as_str(), value.as_bytes(), p, &mut used) {
                Ok(v) => match hyper::header::HeaderValue::from_bytes(&v) {
                    Ok(v) => {
                        headers.append(name.clone(), v);
                    }
                    Err(_) => return self.refuse(format!("header {name} is not valid")),
                },
                Err(why) => return self.refuse(why.to_string()),
            }
        }
        let target = swap::add_credentials(&mut headers, target, p, &used);
        if !p.inject.is_empty() {
            // Masking needs the body as sent, and all of it: no compression, no slices.
            headers.insert(
                hyper::header::ACCEPT_ENCODING,
                hyper::header::HeaderValue::from_static("identity"),
            );
            headers.remove(hyper::header::RANGE);
            headers.remove(hyper::header::IF_RANGE);
        }
        match hyper::header::HeaderValue::from_str(&authority) {
            Ok(v) => {
                headers.insert(hyper::header::HOST, v);
            }
            Err(_) => return answer(StatusCode::BAD_REQUEST, "bad host".into()),
        }
        parts.headers = headers;
        parts.uri = match target.parse() {
            Ok(u) => u,
            Err(_) => return answer(StatusCode::BAD_REQUEST, "bad request target".into()),
        };
        let out = Request::from_parts(parts, body.map_err(|e| Box::new(e) as _).boxed());
        let resp = match self.forward(out).await {
            Ok(r) => r,
            Err(why) => {
                return answer(
                    StatusCode::BAD_GATEWAY,
                    format!("tether egress: {}:{}: {why}", p.host, p.port),
                );
            }
        };
        if p.inject.is_empty() {
            return resp.map(|b| b.map_err(|e| Box::new(e) as _).boxed());
        }
        let values: Vec<Vec<u8>> = p.inject.iter().map(|i| i.value.expose().to_vec()).collect();
        let needles = mask::Finder::new(&mask::needles(&values));
        let (mut parts, body) = resp.into_parts();
        // The status line carries the canonical reason phrase, never upstream's own words.
        parts.extensions = hyper::http::Extensions::new();
        let mut headers = hyper::HeaderMap::with_capacity(parts.headers.len());
        for (name, v) in parts.headers.iter() {
            let name = match needles.masked(name.as_str().as_bytes()) {
                // `*` is a token character: the masked name is still a name.
                Some(masked) => match hyper::header::HeaderName::from_bytes(&masked) {
                    Ok(n) => n,
                    Err(_) => continue,
                },
                None => name.clone(),
            };
            let value = match needles.masked(v.as_bytes()) {
                Some(masked) => match hyper::header::HeaderValue::from_bytes(&masked) {
                    Ok(m) => m,
                    Err(_) => continue,
                },
                None => v.clone(),
            };
            headers.append(name, value);
        }
        parts.headers = headers;
        parts.headers.remove(hyper::header::TRAILER);
        let coding = parts
            .headers
            .get_all(hyper::header::CONTENT_ENCODING)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect::<Vec<_>>()
            .join(",");
        let found = self.refused.clone();
        let body: Body = match inflate::Coding::of(&coding) {
            None => mask::Masked::new(sniff::Watched::new(body, needles.clone(), found), needles)
                .boxed(),
            Some(Ok(c)) => {
                parts.headers.remove(hyper::header::CONTENT_ENCODING);
                parts.headers.remove(hyper::header::CONTENT_LENGTH);
                let inflated = inflate::Inflated::new(body, c);
                mask::Masked::new(
                    sniff::Watched::new(inflated, needles.clone(), found),
                    needles,
                )
                .boxed()
            }
            Some(Err(())) => {
                return self.refuse(format!(
                    "{}:{} answered with Content-Encoding {coding:?} though the brain asked for identity; the brain can read only gzip and deflate, so it cannot mask the secret in it",
                    p.host, p.port
                ));
            }
        };
        Response::from_parts(parts, body)
    }

    async fn forward(&self, req: Request<Body>) -> Result<Response<Incoming>, UpstreamError> {
        let mut slot = self.send.lock().await;
        let reusable = slot.as_ref().is_some_and(|s| !s.is_closed());
        if !reusable {
            *slot = Some(
                self.upstream
                    .connect(&self.plan.host, self.plan.port)
                    .await?,
            );
        }
        let send = slot.as_mut().expect("set above");
        if send.ready().await.is_err() {
            *slot = Some(
                self.upstream
                    .connect(&self.plan.host, self.plan.port)
                    .await?,
            );
        }
        let send = slot.as_mut().expect("set above");
        match tokio::time::timeout(ANSWER_TIMEOUT, send.send_request(req)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                *slot = None;
                Err(UpstreamError::Failed(e))
            }
            Err(_) => {
                *slot = None;
                Err(UpstreamError::AnswerTimeout(ANSWER_TIMEOUT))
            }
        }
    }
}
