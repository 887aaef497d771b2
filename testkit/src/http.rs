//! The one HTTP/1.1 server testkit's fakes answer with: hyper, on a runtime thread of its
//! own, over plain TCP or rustls. Each request is read whole (up to a bound) and handed to the
//! fake's handler on a blocking thread, so a handler may sleep, run a program or take a lock;
//! its answer is written back as it is. Stops when dropped. And [`request`], the one client
//! for the peers testkit drives over plain HTTP (chromedriver, moto's control API).
//!
//! ```no_run
//! use testkit::http::{Options, Response, Server};
//! let server = Server::start(Options::plain("echo"), |req| {
//!     Response::new(200, req.body.clone())
//! })
//! .unwrap();
//! println!("http://{}", server.addr());
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// One request as a handler sees it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// The request target as sent: path and query (`/v1/messages`, `/a.git/info/refs?service=x`).
    pub target: String,
    /// Header names lowercased, in the order sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The first value of a header, by name (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The target's path, without its query.
    pub fn path(&self) -> &str {
        self.target.split_once('?').map_or(&self.target, |(p, _)| p)
    }

    /// The target's query, without the `?` (empty if none).
    pub fn query(&self) -> &str {
        self.target.split_once('?').map_or("", |(_, q)| q)
    }
}

/// A handler's answer.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// `body` as `application/json`.
    pub fn json(status: u16, body: &serde_json::Value) -> Self {
        Self::new(status, body.to_string()).header("content-type", "application/json")
    }

    /// One more header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// An answer given from the request's head alone, before its body is read (`None`: read it
/// and ask the handler). A client that sent `Expect: 100-continue` is then never told to
/// send the body: a refusal reaches it first, as real servers answer one.
pub type Early = Arc<dyn Fn(&Request) -> Option<Response> + Send + Sync>;

/// How a server is set up.
pub struct Options {
    /// Said in its thread's name and its complaints.
    pub name: &'static str,
    /// Largest request body read (after chunked decoding); a larger one is answered 413.
    pub max_body: usize,
    /// TLS with this configuration, or plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Asked first, with the body still unread.
    pub early: Option<Early>,
}

impl Options {
    /// Plain HTTP, bodies up to 64 MiB.
    pub fn plain(name: &'static str) -> Self {
        Self {
            name,
            max_body: 64 << 20,
            tls: None,
            early: None,
        }
    }
}

type Handler = dyn Fn(Request) -> Response + Send + Sync;

/// A running server on an ephemeral loopback port.
pub struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Binds 127.0.0.1 on an ephemeral port and answers every request with `handler`.
    pub fn start(
        opts: Options,
        handler: impl Fn(Request) -> Response + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let handler: Arc<Handler> = Arc::new(handler);
        let thread = std::thread::Builder::new()
            .name(opts.name.into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("a runtime for a test server");
                rt.block_on(accept(listener, opts, handler, stopped));
                // A handler still sleeping (a slow-answer test) is not waited for.
                rt.shutdown_background();
            })?;
        Ok(Self {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept(
    listener: std::net::TcpListener,
    opts: Options,
    handler: Arc<Handler>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        eprintln!("{}: cannot listen", opts.name);
        return;
    };
    let tls = opts.tls.map(tokio_rustls::TlsAcceptor::from);
    let (name, max_body, early) = (opts.name, opts.max_body, opts.early);
    loop {
        let tcp = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(_) => continue,
            },
        };
        let (handler, tls, early) = (handler.clone(), tls.clone(), early.clone());
        tokio::spawn(async move {
            let service =
                service_fn(move |req| answer(req, handler.clone(), early.clone(), max_body));
            let served = match tls {
                Some(tls) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                    // A client that gave up on the handshake (or a probe): nothing to answer.
                    _ => return,
                },
                None => {
                    http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await
                }
            };
            // A client that gave up first is not worth a line.
            if let Err(e) = served
                && !e.is_incomplete_message()
                && !e.is_canceled()
            {
                eprintln!("{name}: {e}");
            }
        });
    }
}

/// Asks `early` with the head; else reads the request whole and asks the handler, both on a
/// blocking thread; writes the answer.
async fn answer(
    req: hyper::Request<Incoming>,
    handler: Arc<Handler>,
    early: Option<Early>,
    max_body: usize,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let mut request = Request {
        method: parts.method.to_string(),
        target: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_string(), |p| p.to_string()),
        headers: parts
            .headers
            .iter()
            .map(|(k, v)| {
                let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
                (k.as_str().to_ascii_lowercase(), v)
            })
            .collect(),
        body: Vec::new(),
    };
    if let Some(early) = early {
        let head = request.clone();
        let said = tokio::task::spawn_blocking(move || early(&head)).await;
        if let Ok(Some(refused)) = said {
            return Ok(written(refused));
        }
    }
    request.body = match Limited::new(body, max_body).collect().await {
        Ok(b) => b.to_bytes().to_vec(),
        Err(e) => {
            let too_large = e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some();
            let status = if too_large { 413 } else { 400 };
            return Ok(written(Response::new(status, format!("{e}\n"))));
        }
    };
    let out = tokio::task::spawn_blocking(move || handler(request))
        .await
        .unwrap_or_else(|e| Response::new(500, format!("the test server's handler failed: {e}\n")));
    Ok(written(out))
}

/// A handler's answer as hyper writes it.
fn written(r: Response) -> hyper::Response<Full<Bytes>> {
    let mut b = hyper::Response::builder().status(r.status);
    for (k, v) in &r.headers {
        b = b.header(k.as_str(), v.as_str());
    }
    b.body(Full::new(Bytes::from(r.body))).unwrap_or_else(|e| {
        let mut fallback = hyper::Response::new(Full::new(Bytes::from(format!(
            "a test server wrote a bad response head: {e}\n"
        ))));
        *fallback.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
        fallback
    })
}

/// One request to `127.0.0.1:port` on a connection of its own: the status and the whole
/// body, within `timeout`.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> std::io::Result<(u16, Vec<u8>)> {
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        std::io::Error::other(format!("{method} {path} on 127.0.0.1:{port}: {what}: {e}"))
    };
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", format!("127.0.0.1:{port}"))
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| failed("a bad request", &e))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let exchange = async {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map_err(|e| failed("connecting", &e))?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .map_err(|e| failed("the handshake", &e))?;
            tokio::spawn(conn);
            let resp = sender
                .send_request(req)
                .await
                .map_err(|e| failed("the answer", &e))?;
            let status = resp.status().as_u16();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| failed("the answer's body", &e))?
                .to_bytes()
                .to_vec();
            Ok::<_, std::io::Error>((status, body))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| failed("no answer", &format!("within {timeout:?}")))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn raw(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn a_request_reaches_the_handler_whole_and_its_answer_comes_back() {
        let server = Server::start(
            Options {
                max_body: 16,
                ..Options::plain("test server")
            },
            |req| {
                Response::new(
                    201,
                    format!(
                        "{} {} {} q={} x={} {}",
                        req.method,
                        req.path(),
                        req.body.len(),
                        req.query(),
                        req.header("X-Thing").unwrap_or("-"),
                        String::from_utf8_lossy(&req.body)
                    ),
                )
                .header("x-answer", "yes")
            },
        )
        .unwrap();
        let chunked = b"POST /a/b?k=v HTTP/1.1\r\nHost: x\r\nX-Thing: 7\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let out = raw(server.addr(), chunked);
        assert!(out.starts_with("HTTP/1.1 201"), "{out}");
        assert!(out.to_ascii_lowercase().contains("x-answer: yes"), "{out}");
        assert!(out.ends_with("POST /a/b 5 q=k=v x=7 abcde"), "{out}");
        // Over the bound: 413, and the handler never sees it.
        let big = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\nConnection: close\r\n\r\n01234567890123456";
        let out = raw(server.addr(), big);
        assert!(out.starts_with("HTTP/1.1 413"), "{out}");
        // Not HTTP at all: answered 400 or closed, and the server goes on.
        let _ = raw(server.addr(), b"\x16\x03\x01 nonsense\r\n\r\n");
        let out = raw(
            server.addr(),
            b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(out.starts_with("HTTP/1.1 201"), "{out}");
        // The client: a body out, the answer back.
        let port = server.addr().port();
        let (status, body) = request(
            port,
            "PUT",
            "/c?z=1",
            "text/plain",
            b"xy".to_vec(),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(status, 201);
        assert_eq!(String::from_utf8_lossy(&body), "PUT /c 2 q=z=1 x=- xy");
        drop(server);
        // Nobody listening: an error that says where.
        let e = request(
            port,
            "GET",
            "/",
            "text/plain",
            vec![],
            Duration::from_secs(5),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    }
}
