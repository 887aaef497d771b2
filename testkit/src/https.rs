//! An HTTPS server on loopback with a CA of its own, standing in for the hosts a task's
//! commands reach through the egress proxy: rustls over TCP, one request per connection,
//! and a record of every request it received (head and body) for tests to inspect.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shared::locks::Lock;

/// One request as the server received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Header lines as sent, `Name: value`, names in their case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    /// The value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The whole request as text (for "appears nowhere" checks).
    pub fn text(&self) -> String {
        let mut s = format!("{} {}\n", self.method, self.path);
        for (n, v) in &self.headers {
            s.push_str(&format!("{n}: {v}\n"));
        }
        s.push_str(&String::from_utf8_lossy(&self.body));
        s
    }
}

/// What a handler answers: status and body.
pub type Handler = Arc<dyn Fn(&Received) -> (u16, Vec<u8>) + Send + Sync>;

/// A handler that writes the whole response itself (status line, headers, body as sent:
/// chunked, with trailers, compressed...), for servers that misbehave on purpose.
pub type RawHandler = Arc<dyn Fn(&Received) -> Vec<u8> + Send + Sync>;

/// A [`Handler`]'s answer as a whole HTTP/1.1 response.
fn plain(code: u16, out: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 {code} X\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        out.len()
    )
    .into_bytes();
    r.extend_from_slice(out);
    r
}

/// A CA that signs the test servers' certificates.
pub struct TestCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    pub fn new() -> anyhow::Result<Self> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "tether test upstream CA");
        Ok(Self {
            issuer: rcgen::CertifiedIssuer::self_signed(params, key)?,
        })
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server config whose certificate names `names`, signed by this CA.
    pub fn server_config(&self, names: &[&str]) -> anyhow::Result<rustls::ServerConfig> {
        let key = rcgen::KeyPair::generate()?;
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Ok(rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone(), self.issuer.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )?)
    }
}

/// A running server; it stops serving when dropped (its thread ends with the process).
pub struct Upstream {
    pub port: u16,
    seen: Arc<Mutex<Vec<Received>>>,
}

impl Upstream {
    /// Serves `handler` for a certificate naming `names`, signed by `ca`.
    pub fn start(ca: &TestCa, names: &[&str], handler: Handler) -> anyhow::Result<Self> {
        Self::start_raw(
            ca,
            names,
            Arc::new(move |r: &Received| {
                let (code, out) = handler(r);
                plain(code, &out)
            }),
        )
    }

    /// Answers every request 200 with `body`, for a certificate naming `names`.
    pub fn answering(ca: &TestCa, names: &[&str], body: &'static str) -> anyhow::Result<Self> {
        Self::start(ca, names, Arc::new(|_: &Received| (200, body.into())))
    }

    /// Serves `handler`, whose answers are written as they are.
    pub fn start_raw(ca: &TestCa, names: &[&str], handler: RawHandler) -> anyhow::Result<Self> {
        let cfg = Arc::new(ca.server_config(names)?);
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let seen: Arc<Mutex<Vec<Received>>> = Arc::default();
        let record = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (cfg, handler, record) = (cfg.clone(), handler.clone(), record.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, cfg, &handler, &record);
                });
            }
        });
        Ok(Self { port, seen })
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<Received> {
        self.seen.locked().clone()
    }
}

fn serve(
    tcp: TcpStream,
    cfg: Arc<rustls::ServerConfig>,
    handler: &RawHandler,
    record: &Mutex<Vec<Received>>,
) -> anyhow::Result<()> {
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    let conn = rustls::ServerConnection::new(cfg)?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut buf = Vec::new();
    let mut piece = [0u8; 8192];
    let head_end = loop {
        let n = tls.read(&mut piece)?;
        anyhow::ensure!(n > 0, "closed before a request");
        buf.extend_from_slice(&piece[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        anyhow::ensure!(buf.len() < 64 * 1024, "head too long");
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let method = first.next().unwrap_or_default().to_string();
    let path = first.next().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = tls.read(&mut piece)?;
        anyhow::ensure!(n > 0, "closed inside the body");
        body.extend_from_slice(&piece[..n]);
    }
    let req = Received {
        method,
        path,
        headers,
        body,
    };
    record.locked().push(req.clone());
    tls.write_all(&handler(&req))?;
    tls.flush()?;
    tls.conn.send_close_notify();
    let _ = tls.flush();
    Ok(())
}

/// A TLS front (a certificate for `names`, from `ca`) before a plain TCP server at
/// `backend`; gives its port on 127.0.0.1. It serves until the process ends.
pub fn tls_front(
    ca: &TestCa,
    names: &[&str],
    backend: std::net::SocketAddr,
) -> anyhow::Result<u16> {
    let cfg = Arc::new(ca.server_config(names)?);
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::spawn(move || {
        rt.block_on(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(conn).await else {
                        return;
                    };
                    let Ok(mut up) = tokio::net::TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                });
            }
        });
    });
    Ok(port)
}
