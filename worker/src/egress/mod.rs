//! The egress proxy of a call whose task reaches the network only through it.
//!
//! The call gets a network namespace of its own with loopback up and one listening socket
//! the worker holds ([`Net`]); the command, placed in that namespace, finds the proxy through
//! `HTTPS_PROXY` and friends and has no other way out. Each connection it asks for is decided
//! by the task's policy: a host on the direct list is dialled by the worker itself,
//! uninspected; anything else is asked of the brain over an `Egress.Tunnel` on the worker's
//! mutual-TLS session, where the brain injects the task's secrets or refuses. No secret ever
//! reaches this process: only placeholders and the brain's grant for the call.

mod error;
mod hello;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::{
    EgressPolicy, EgressRule, ExecOutput, OutputStream, TunnelOpen, TunnelUp, WorkerMessage,
    tunnel_down, worker_message,
};
use shared::locks::Lock;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::{CancellationToken, DropGuard};

use error::Error;

/// The brain's channel of the session open now (`None` between sessions).
pub type Link = Arc<Mutex<Option<tonic::transport::Channel>>>;

/// Largest request head the proxy reads (request line and headers).
const HEAD_MAX: usize = 16 * 1024;
/// How long a command has to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a direct connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the brain may take to open (or refuse) a tunnel.
const OPEN_TIMEOUT: Duration = Duration::from_secs(20);
const PIECE: usize = 32 * 1024;
/// Pieces in flight towards the brain per tunnel.
const QUEUE: usize = 8;
/// Connections of one call open at once; more wait.
const MAX_CONNECTIONS: usize = 64;
/// Refusals told on the command's stderr per call; later ones only get their 403.
const NOTES_MAX: usize = 16;
/// Where the host's CA roots are found, first match wins.
const SYSTEM_ROOTS: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// A call's own network namespace, with loopback up and the proxy's listening socket in it.
pub struct Net {
    ns: OwnedFd,
    listener: std::net::TcpListener,
    port: u16,
}

impl Net {
    /// Makes the namespace on a thread of its own (a thread's network namespace is its own
    /// to change), which ends once the namespace is held by a descriptor and a socket.
    pub fn new() -> io::Result<Net> {
        std::thread::Builder::new()
            .name("tether-netns".into())
            .spawn(|| -> io::Result<Net> {
                // SAFETY: only CLONE_FILES can close descriptors this process holds; a new
                // network namespace moves only this short-lived thread.
                unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }?;
                loopback_up()?;
                let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
                let port = listener.local_addr()?.port();
                let ns = std::fs::File::open("/proc/thread-self/ns/net")?.into();
                Ok(Net { ns, listener, port })
            })?
            .join()
            .map_err(|_| io::Error::other("the namespace thread panicked"))?
    }

    /// The namespace, for `setns` in the command's child.
    pub fn ns_fd(&self) -> RawFd {
        self.ns.as_raw_fd()
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

/// `struct ifreq` with the flags member of its union (40 bytes on Linux).
#[repr(C)]
struct IfreqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Brings `lo` up in the calling thread's network namespace.
fn loopback_up() -> io::Result<()> {
    // SAFETY: a socket we own and close; the ioctls read and write the struct we pass.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut req = IfreqFlags {
            name: [0; libc::IFNAMSIZ],
            flags: 0,
            _pad: [0; 22],
        };
        req.name[..2].copy_from_slice(b"lo");
        let mut r = libc::ioctl(s, libc::SIOCGIFFLAGS, &mut req);
        if r == 0 {
            req.flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            r = libc::ioctl(s, libc::SIOCSIFFLAGS, &req);
        }
        let err = io::Error::last_os_error();
        libc::close(s);
        if r != 0 {
            return Err(err);
        }
    }
    Ok(())
}

/// The CA bundle commands trust: the host's roots plus the brain's egress CA.
pub fn ca_bundle(ca_pem: &str) -> Vec<u8> {
    let mut out = SYSTEM_ROOTS
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .unwrap_or_default();
    if !out.is_empty() && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(ca_pem.as_bytes());
    if !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out
}

/// The environment a command behind the proxy gets: the proxy's address under every name
/// common tools read, and the CA bundle at `bundle` (as the command sees it) likewise.
pub fn proxy_env(port: u16, bundle: &std::path::Path) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let mut env = Vec::new();
    for k in ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"] {
        env.push((k.to_string(), url.clone()));
        env.push((k.to_ascii_lowercase(), url.clone()));
    }
    // Loopback inside the call's namespace is the command's own.
    let local = "localhost,127.0.0.1,::1".to_string();
    env.push(("NO_PROXY".into(), local.clone()));
    env.push(("no_proxy".into(), local));
    let bundle = bundle.to_string_lossy().into_owned();
    for k in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO",
        "CURL_CA_BUNDLE",
    ] {
        env.push((k.to_string(), bundle.clone()));
    }
    env
}

/// What every connection of one call shares.
struct Cx {
    policy: EgressPolicy,
    call_id: u64,
    link: Link,
    out: mpsc::Sender<WorkerMessage>,
    notes: Mutex<usize>,
    slots: Semaphore,
}

/// Serves the call's proxy until the returned guard is dropped (the call's end), which also
/// closes every connection still open.
pub fn serve(
    net: &Net,
    policy: EgressPolicy,
    call_id: u64,
    link: Link,
    out: mpsc::Sender<WorkerMessage>,
) -> io::Result<DropGuard> {
    let std_listener = net.listener.try_clone()?;
    std_listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(std_listener)?;
    let stop = CancellationToken::new();
    let cx = Arc::new(Cx {
        policy,
        call_id,
        link,
        out,
        notes: Mutex::new(0),
        slots: Semaphore::new(MAX_CONNECTIONS),
    });
    let token = stop.clone();
    tokio::spawn(async move {
        loop {
            let conn = tokio::select! {
                _ = token.cancelled() => return,
                c = listener.accept() => c,
            };
            let Ok((conn, _)) = conn else { continue };
            let (cx, token) = (cx.clone(), token.clone());
            tokio::spawn(async move {
                let Ok(_slot) = cx.slots.acquire().await else {
                    return;
                };
                tokio::select! {
                    _ = token.cancelled() => {}
                    _ = handle(conn, &cx) => {}
                }
            });
        }
    });
    Ok(stop.drop_guard())
}

/// One request as the proxy sees it.
#[derive(Debug, PartialEq)]
struct Ask {
    host: String,
    port: u16,
    /// `CONNECT` (a tunnel) rather than a plain-HTTP request.
    connect: bool,
    method: String,
    /// For a plain request: its head rewritten for the origin server.
    origin_head: Vec<u8>,
}

async fn handle(mut c: TcpStream, cx: &Cx) {
    let (ask, rest) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut c)).await {
        Ok(Ok(Some(h))) => h,
        Ok(Ok(None)) => return,
        Ok(Err(why)) => return respond(&mut c, 400, &why.to_string()).await,
        Err(_) => return respond(&mut c, 408, "no request head within 30s").await,
    };
    if direct(&cx.policy.direct, &ask.host, ask.port) {
        let addr = match direct_addr(&cx.policy, &ask.host, ask.port).await {
            Ok(a) => a,
            Err(why) => {
                let why = why.to_string();
                cx.note(&ask, &why).await;
                return respond(&mut c, 403, &why).await;
            }
        };
        let mut rest = rest;
        if ask.connect {
            // The tunnel must carry TLS naming the host it was opened to.
            if c.write_all(ESTABLISHED).await.is_err() {
                return;
            }
            if let Err(why) = check_hello(&mut c, &mut rest, &ask).await {
                cx.note(&ask, &why.to_string()).await;
                return;
            }
        }
        let up = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await;
        let mut up = match up {
            Ok(Ok(u)) => u,
            Ok(Err(e)) => {
                let why = format!("cannot connect to {}:{} ({addr}): {e}", ask.host, ask.port);
                return respond(&mut c, 502, &why).await;
            }
            Err(_) => {
                let why = format!("connecting to {}:{} timed out", ask.host, ask.port);
                return respond(&mut c, 504, &why).await;
            }
        };
        let first = if ask.connect {
            rest
        } else {
            [ask.origin_head.as_slice(), &rest].concat()
        };
        if up.write_all(&first).await.is_ok() {
            let _ = tokio::io::copy_bidirectional(&mut c, &mut up).await;
        }
        return;
    }
    via_brain(c, ask, rest, cx).await
}

const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// Where a direct connection to `host:port` goes: the address the operator pinned the name
/// to, or the host's first address once none of its addresses is internal (and that
/// address, not a second lookup that DNS rebinding could answer otherwise).
async fn direct_addr(
    policy: &EgressPolicy,
    host: &str,
    port: u16,
) -> Result<std::net::SocketAddr, Error> {
    if let Some(ip) = policy.resolve.get(host) {
        let ip: std::net::IpAddr = ip.parse().map_err(|_| Error::BadPin {
            host: host.to_string(),
            ip: ip.clone(),
        })?;
        return Ok((ip, port).into());
    }
    let addrs = shared::net::resolve_public(host, port, CONNECT_TIMEOUT)
        .await
        .map_err(|why| Error::NotPublic { why })?;
    Ok(addrs[0])
}

/// Reads the command's ClientHello into `rest` and checks that it names `ask.host` (none
/// for an address).
async fn check_hello(c: &mut TcpStream, rest: &mut Vec<u8>, ask: &Ask) -> Result<(), Error> {
    let mut piece = [0u8; 4096];
    let named = loop {
        match hello::parse(rest) {
            hello::Hello::Name(n) => break n,
            hello::Hello::NotTls(why) => return Err(Error::NotTls(why)),
            hello::Hello::More => {}
        }
        if rest.len() >= hello::MAX_HELLO {
            return Err(Error::LongHello);
        }
        let n = match tokio::time::timeout(HEAD_TIMEOUT, c.read(&mut piece)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Err(Error::ClosedBeforeTls),
            Ok(Ok(n)) => n,
            Err(_) => return Err(Error::NoHello),
        };
        rest.extend_from_slice(&piece[..n]);
    };
    let is_addr = ask.host.parse::<std::net::IpAddr>().is_ok();
    match named {
        Some(n) if n == ask.host => Ok(()),
        None if is_addr => Ok(()),
        Some(named) => Err(Error::OtherName {
            host: ask.host.clone(),
            named,
        }),
        None => Err(Error::NoName {
            host: ask.host.clone(),
        }),
    }
}

/// Whether the worker may connect to `host:port` itself.
fn direct(rules: &[EgressRule], host: &str, port: u16) -> bool {
    rules.iter().any(|r| {
        let p = r.host.trim_end_matches('.').to_ascii_lowercase();
        let host_ok = p == "*"
            || match p.strip_prefix("*.") {
                Some(suffix) => host
                    .strip_suffix(suffix)
                    .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
                None => host == p,
            };
        host_ok && (r.ports.is_empty() || r.ports.contains(&u32::from(port)))
    })
}

/// Asks the brain for a tunnel to `ask`'s host and bridges the command's connection to it.
async fn via_brain(mut c: TcpStream, ask: Ask, rest: Vec<u8>, cx: &Cx) {
    let channel = cx.link.locked().clone();
    let Some(channel) = channel else {
        let why = "the worker is not connected to the brain right now; try again shortly";
        cx.note(&ask, why).await;
        return respond(&mut c, 503, why).await;
    };
    let mut client = proto::egress_client::EgressClient::new(channel)
        .max_decoding_message_size(shared::limits::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(shared::limits::MAX_MESSAGE_BYTES);
    let (tx, rx) = mpsc::channel::<TunnelUp>(QUEUE);
    let open = TunnelUp {
        open: Some(TunnelOpen {
            task: cx.policy.task.clone(),
            call_id: cx.call_id,
            grant: cx.policy.grant.clone(),
            host: ask.host.clone(),
            port: u32::from(ask.port),
            plain: !ask.connect,
            method: ask.method.clone(),
        }),
        data: Vec::new(),
    };
    let _ = tx.send(open).await;
    let opened = tokio::time::timeout(OPEN_TIMEOUT, async {
        let mut down = client
            .tunnel(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        let first = down.message().await?;
        Ok::<_, tonic::Status>((down, first))
    })
    .await;
    let mut down = match opened {
        Ok(Ok((down, Some(m)))) => match m.kind {
            Some(tunnel_down::Kind::Opened(true)) if ask.connect => down,
            Some(tunnel_down::Kind::Refused(why)) => {
                cx.note(&ask, &why).await;
                return respond(&mut c, 403, &why).await;
            }
            _ => {
                let why = "the brain answered the tunnel out of turn";
                cx.note(&ask, why).await;
                return respond(&mut c, 502, why).await;
            }
        },
        Ok(Ok((_, None))) => {
            let why = "the brain closed the tunnel before opening it";
            cx.note(&ask, why).await;
            return respond(&mut c, 502, why).await;
        }
        Ok(Err(s)) => {
            let why = format!("the brain could not open the tunnel: {}", s.message());
            cx.note(&ask, &why).await;
            return respond(&mut c, 502, &why).await;
        }
        Err(_) => {
            let why = "the brain did not open the tunnel within 20s";
            cx.note(&ask, why).await;
            return respond(&mut c, 504, why).await;
        }
    };
    if c.write_all(ESTABLISHED).await.is_err() {
        return;
    }
    let (mut from_cmd, mut to_cmd) = c.into_split();
    let up = async move {
        if !rest.is_empty() && tx.send(data(rest)).await.is_err() {
            return;
        }
        let mut buf = vec![0u8; PIECE];
        loop {
            match from_cmd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.send(data(buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let told = &ask;
    let back = async move {
        while let Ok(Some(m)) = down.message().await {
            match m.kind {
                Some(tunnel_down::Kind::Data(d)) if to_cmd.write_all(&d).await.is_err() => break,
                // One request on the connection was refused; the connection goes on.
                Some(tunnel_down::Kind::Refused(why)) => cx.note(told, &why).await,
                _ => {}
            }
        }
        let _ = to_cmd.shutdown().await;
    };
    // The tunnel ends when the brain's side ends; the command's side ending only closes
    // the stream up (the brain then finishes and closes).
    tokio::join!(up, back);
}

fn data(d: Vec<u8>) -> TunnelUp {
    TunnelUp {
        open: None,
        data: d,
    }
}

impl Cx {
    /// Tells the command's stderr why a connection was refused (the first few per call).
    async fn note(&self, ask: &Ask, why: &str) {
        {
            let mut n = self.notes.locked();
            if *n >= NOTES_MAX {
                return;
            }
            *n += 1;
        }
        let text = format!("tether: egress refused: {}:{}: {why}\n", ask.host, ask.port);
        let m = WorkerMessage {
            msg: Some(worker_message::Msg::ExecOutput(ExecOutput {
                call_id: self.call_id,
                stream: OutputStream::Stderr as i32,
                data: text.into_bytes(),
            })),
        };
        let _ = self.out.send(m).await;
    }
}

async fn respond(c: &mut (impl AsyncWrite + Unpin), code: u16, why: &str) {
    let reason = match code {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Bad Gateway",
    };
    let body = format!("tether egress: {why}\n");
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = c.write_all(head.as_bytes()).await;
    let _ = c.write_all(body.as_bytes()).await;
    let _ = c.shutdown().await;
}

/// Reads one request head: the request and whatever came after its head. `None` when the
/// command closed the connection without a byte.
async fn read_head(c: &mut (impl AsyncRead + Unpin)) -> Result<Option<(Ask, Vec<u8>)>, Error> {
    let mut buf = Vec::with_capacity(1024);
    let mut piece = [0u8; 4096];
    loop {
        let n = c.read(&mut piece).await.map_err(Error::Read)?;
        if n == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(Error::CutHead)
            };
        }
        buf.extend_from_slice(&piece[..n]);
        if let Some((ask, used)) = parse_head(&buf)? {
            return Ok(Some((ask, buf.split_off(used))));
        }
        if buf.len() > HEAD_MAX {
            return Err(Error::LongHead { max: HEAD_MAX });
        }
    }
}

/// Parses a complete request head (`None`: more bytes are needed).
fn parse_head(buf: &[u8]) -> Result<Option<(Ask, usize)>, Error> {
    let mut headers = [httparse::EMPTY_HEADER; 96];
    let mut req = httparse::Request::new(&mut headers);
    let used = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(Error::NotHttp(e)),
    };
    let method = req.method.unwrap_or_default().to_string();
    let target = req.path.unwrap_or_default();
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = authority(target, None)?;
        return Ok(Some((
            Ask {
                host,
                port,
                connect: true,
                method,
                origin_head: Vec::new(),
            },
            used,
        )));
    }
    let lower = target.to_ascii_lowercase();
    let Some(rest) = lower.strip_prefix("http://").map(|_| &target[7..]) else {
        return Err(if lower.starts_with("https://") {
            Error::HttpsInClear
        } else {
            Error::NotAbsolute {
                target: target.to_string(),
            }
        });
    };
    let (auth, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
        Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
        None => (rest, "/".to_string()),
    };
    let (host, port) = authority(auth, Some(80))?;
    // The head the origin gets: origin-form target, no proxy headers, one request.
    let mut head = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
    // The Host is the one the request was allowed for, whatever the command wrote.
    let shown = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    if port == 80 {
        head.extend_from_slice(format!("Host: {shown}\r\n").as_bytes());
    } else {
        head.extend_from_slice(format!("Host: {shown}:{port}\r\n").as_bytes());
    }
    for h in req.headers.iter() {
        let n = h.name.to_ascii_lowercase();
        if n.starts_with("proxy-") || n == "connection" || n == "keep-alive" || n == "host" {
            continue;
        }
        head.extend_from_slice(h.name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(h.value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Some((
        Ask {
            host,
            port,
            connect: false,
            method,
            origin_head: head,
        },
        used,
    )))
}

/// `host:port` (or `[v6]:port`), with `default` when the port is left out.
fn authority(s: &str, default: Option<u16>) -> Result<(String, u16), Error> {
    let authority = || s.to_string();
    if s.contains('@') {
        return Err(Error::UserInfo {
            authority: authority(),
        });
    }
    let (host, port) = shared::net::split_host_port(s).ok_or_else(|| Error::NotHostPort {
        authority: authority(),
    })?;
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| Error::BadPort {
                authority: authority(),
                port: p.to_string(),
            })?,
        None => default.ok_or_else(|| Error::NoPort {
            authority: authority(),
        })?,
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:_".contains(&b));
    if !ok {
        return Err(Error::NoHost {
            authority: authority(),
        });
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(host: &str, ports: &[u32]) -> EgressRule {
        EgressRule {
            host: host.into(),
            ports: ports.to_vec(),
        }
    }

    #[test]
    fn connect_heads_parse_and_partial_heads_wait() {
        let (ask, used) =
            parse_head(b"CONNECT Api.Example.com:8443 HTTP/1.1\r\nHost: x\r\n\r\nTLS")
                .unwrap()
                .unwrap();
        assert_eq!(
            (ask.host.as_str(), ask.port, ask.connect),
            ("api.example.com", 8443, true)
        );
        assert_eq!(used, 53 - 3, "the bytes after the head are the tunnel's");
        assert!(
            parse_head(b"CONNECT a:1 HTTP/1.1\r\nHost")
                .unwrap()
                .is_none()
        );
        let (v6, _) = parse_head(b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 443));
    }

    #[test]
    fn plain_requests_are_rewritten_for_the_origin() {
        let head = b"GET http://Example.org/a/b?c=1 HTTP/1.1\r\nHost: example.org\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: x\r\nAccept: */*\r\n\r\n";
        let (ask, _) = parse_head(head).unwrap().unwrap();
        assert_eq!(
            (ask.host.as_str(), ask.port, ask.connect),
            ("example.org", 80, false)
        );
        let h = String::from_utf8(ask.origin_head).unwrap();
        assert!(h.starts_with("GET /a/b?c=1 HTTP/1.1\r\n"), "{h}");
        assert!(h.contains("Accept: */*\r\n") && h.ends_with("Connection: close\r\n\r\n"));
        assert!(!h.to_ascii_lowercase().contains("proxy-"), "{h}");
        let (q, _) = parse_head(b"GET http://h:8080?x HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(q.port, 8080);
        assert!(
            String::from_utf8(q.origin_head)
                .unwrap()
                .starts_with("GET /?x ")
        );
    }

    #[test]
    fn bad_heads_are_refused_in_words() {
        for bad in [
            &b"GET /local HTTP/1.1\r\n\r\n"[..],
            b"GET https://a.test/ HTTP/1.1\r\n\r\n",
            b"CONNECT a.test HTTP/1.1\r\n\r\n",
            b"CONNECT a.test:0 HTTP/1.1\r\n\r\n",
            b"CONNECT a.test:99999 HTTP/1.1\r\n\r\n",
            b"CONNECT u:p@a.test:443 HTTP/1.1\r\n\r\n",
            b"CONNECT a/b:443 HTTP/1.1\r\n\r\n",
            b"\x16\x03\x01 not http\r\n\r\n",
        ] {
            assert!(
                parse_head(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn direct_rules_match_hosts_suffixes_and_ports() {
        let rules = [rule("registry.npmjs.org", &[443]), rule("*.pypi.org", &[])];
        assert!(direct(&rules, "registry.npmjs.org", 443));
        assert!(!direct(&rules, "registry.npmjs.org", 80));
        assert!(direct(&rules, "files.pypi.org", 8443));
        assert!(!direct(&rules, "pypi.org", 443));
        assert!(!direct(&rules, "evilpypi.org", 443));
        assert!(!direct(&rules, "example.com", 443));
        assert!(direct(&[rule("*", &[])], "anything.test", 1));
    }

    #[test]
    fn the_environment_names_the_proxy_and_the_bundle_everywhere() {
        let env = proxy_env(4711, std::path::Path::new("/tmp/ca.pem"));
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        for k in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "ALL_PROXY"] {
            assert_eq!(get(k), Some("http://127.0.0.1:4711"), "{k}");
        }
        for k in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "NODE_EXTRA_CA_CERTS",
            "GIT_SSL_CAINFO",
            "CURL_CA_BUNDLE",
        ] {
            assert_eq!(get(k), Some("/tmp/ca.pem"), "{k}");
        }
        let b = ca_bundle("-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----");
        assert!(b.ends_with(b"-----END CERTIFICATE-----\n"));
    }

    #[tokio::test]
    async fn heads_past_the_limit_and_cut_heads_are_errors() {
        let mut long = b"GET http://a.test/ HTTP/1.1\r\n".to_vec();
        while long.len() <= HEAD_MAX + 10 {
            long.extend_from_slice(format!("X-Filler: {}\r\n", "y".repeat(1000)).as_bytes());
        }
        let e = read_head(&mut &long[..]).await.unwrap_err().to_string();
        assert!(e.contains("longer than"), "{e}");
        let e = read_head(&mut &b"CONNECT a:1 HTTP/1.1\r\n"[..])
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("closed inside"), "{e}");
        assert!(read_head(&mut &b""[..]).await.unwrap().is_none());
    }
}
