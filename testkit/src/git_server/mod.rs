//! A real git server for tests: `git http-backend` (it ships with git) run as CGI behind a
//! small HTTP/1.1 server on 127.0.0.1, with HTTP Basic auth, over a temp dir of bare
//! repositories. Clone, fetch and push through it with a stock git client; every request
//! it answered is recorded (method, path, the credentials it carried, the status).
//!
//! ```no_run
//! use testkit::git_server::{Auth, GitServer};
//! let server = GitServer::start("alice", "s3cret", Auth::PushOnly).unwrap();
//! server.create_repo("app", &[("README.md", "hello\n")]).unwrap();
//! // git clone server.url("app") …, push a branch, then:
//! assert!(server.branches("app").iter().any(|(b, _)| b == "main"));
//! ```
//!
//! Every response says `Connection: close`; git's libcurl opens a new connection for the
//! next request, which keeps this server one request per connection and simple.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, bail};
use shared::locks::Lock;

/// Largest request body accepted (after chunked decoding).
const MAX_BODY: usize = 256 << 20;
/// Longest request line or header line.
const MAX_LINE: usize = 16 << 10;
/// Most header lines in one request (or one CGI answer).
const MAX_HEADERS: usize = 100;
/// How long a socket read or write may stall.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one `git http-backend` may run before it is killed.
const BACKEND_TIMEOUT: Duration = Duration::from_secs(120);
/// How much of `git http-backend`'s stderr is kept per request.
const MAX_STDERR: u64 = 64 << 10;

/// Which requests need HTTP Basic auth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// Every request, clone and fetch included.
    All,
    /// Only pushes (`git-receive-pack`); anyone may clone and fetch.
    PushOnly,
}

/// One request the server answered.
#[derive(Debug, Clone)]
pub struct GitRequest {
    /// `GET` or `POST`.
    pub method: String,
    /// Path and query, e.g. `/app.git/info/refs?service=git-receive-pack`.
    pub path: String,
    /// The Basic-auth user the request carried (right password or not); None without one.
    pub user: Option<String>,
    /// The raw `Authorization` header value, if any.
    pub authorization: Option<String>,
    /// Whether it carried the right user and password.
    pub authenticated: bool,
    /// Whether its body came with `Transfer-Encoding: chunked`.
    pub chunked: bool,
    /// The HTTP status answered.
    pub status: u16,
    /// What `git http-backend` wrote to stderr (bounded); empty if it did not run.
    pub backend_stderr: String,
}

impl GitRequest {
    /// Whether this is part of a push (`git-receive-pack`).
    pub fn is_push(&self) -> bool {
        is_push_path(&self.path)
    }
}

fn is_push_path(target: &str) -> bool {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    path.ends_with("/git-receive-pack")
        || query.split('&').any(|kv| kv == "service=git-receive-pack")
}

struct Shared {
    root: PathBuf,
    user: String,
    password: String,
    auth: Auth,
    requests: Mutex<Vec<GitRequest>>,
}

/// A running git server; its listener stops and its repositories are deleted when dropped.
pub struct GitServer {
    listener: Listener,
    /// The port of its TLS front, once [`GitServer::serve_tls`] made one.
    tls_port: Option<u16>,
    shared: Arc<Shared>,
    _dir: tempfile::TempDir,
}

impl GitServer {
    /// Starts the server on an ephemeral loopback port, accepting `user`:`password`.
    pub fn start(user: &str, password: &str, auth: Auth) -> anyhow::Result<GitServer> {
        let dir = tempfile::Builder::new()
            .prefix("tether-git-server-")
            .tempdir()
            .context("temp dir for the git server's repositories")?;
        let shared = Arc::new(Shared {
            root: dir.path().to_path_buf(),
            user: user.to_string(),
            password: password.to_string(),
            auth,
            requests: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let listener = Listener::bind()
            .and_then(|l| Listener::start(l, "git server", move |conn| serve(conn, &s)))
            .context("bind the git server")?;
        Ok(GitServer {
            listener,
            tls_port: None,
            shared,
            _dir: dir,
        })
    }

    /// Creates the bare repository `<name>.git` (`name` may hold `/`, e.g. `acme/app`) whose
    /// branch `main` has one commit holding `files` (path, content), with
    /// `http.receivepack` enabled. Returns its path.
    pub fn create_repo(&self, name: &str, files: &[(&str, &str)]) -> anyhow::Result<PathBuf> {
        check_name(name)?;
        let bare = self.repo_path(name);
        if bare.exists() {
            bail!("repository {name} exists already at {}", bare.display());
        }
        std::fs::create_dir_all(&bare).with_context(|| format!("mkdir {}", bare.display()))?;
        run_git(
            git()
                .args(["init", "--bare", "--quiet", "-b", "main"])
                .arg(&bare),
        )?;
        run_git(git_in(&bare).args(["config", "http.receivepack", "true"]))?;
        let work = tempfile::Builder::new()
            .prefix("tether-git-seed-")
            .tempdir()
            .context("temp dir for the first commit")?;
        let w = work.path();
        run_git(git().args(["init", "--quiet", "-b", "main"]).arg(w))?;
        for (path, content) in files {
            let p = w.join(path);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("mkdir {}", parent.display()))?;
            }
            std::fs::write(&p, content).with_context(|| format!("write {}", p.display()))?;
        }
        run_git(git().current_dir(w).args(["add", "--all"]))?;
        let commit = ["commit", "-q", "--allow-empty", "-m", "initial commit"];
        run_git(git().current_dir(w).args(commit))?;
        run_git(
            git()
                .current_dir(w)
                .args(["push", "-q"])
                .arg(&bare)
                .arg("main"),
        )?;
        Ok(bare)
    }

    /// `http://127.0.0.1:PORT/<name>.git`, with no credentials in it.
    pub fn url(&self, name: &str) -> String {
        format!("{}/{name}.git", self.base_url())
    }

    /// `http://127.0.0.1:PORT`, or `https://127.0.0.1:TLS_PORT` once it serves TLS.
    pub fn base_url(&self) -> String {
        match self.tls_port {
            Some(p) => format!("https://127.0.0.1:{p}"),
            None => self.plain_url(),
        }
    }

    /// `http://127.0.0.1:PORT`: the server itself, without its TLS front.
    pub fn plain_url(&self) -> String {
        format!("http://{}", self.listener.addr)
    }

    /// Serves it over HTTPS too, with a certificate for 127.0.0.1 from `ca`; [`url`] and
    /// [`base_url`] name the HTTPS address from now on.
    ///
    /// [`url`]: GitServer::url
    /// [`base_url`]: GitServer::base_url
    pub fn serve_tls(&mut self, ca: &crate::https::TestCa) -> anyhow::Result<()> {
        self.tls_port = Some(crate::https::tls_front(
            ca,
            &["127.0.0.1"],
            self.listener.addr,
        )?);
        Ok(())
    }

    /// `127.0.0.1:PORT` of the URL [`GitServer::url`] gives (as git names a host with a port).
    pub fn authority(&self) -> String {
        self.base_url()
            .split_once("://")
            .map(|(_, a)| a.to_string())
            .unwrap_or_default()
    }

    /// Where the bare repository `<name>.git` lives on disk.
    pub fn repo_path(&self, name: &str) -> PathBuf {
        self.shared.root.join(format!("{name}.git"))
    }

    /// Branches of a repository: (short name like `main` or `tether/t-1`, commit sha),
    /// sorted. Panics, saying why, if git cannot read the repository.
    pub fn branches(&self, name: &str) -> Vec<(String, String)> {
        let format = "--format=%(refname) %(objectname)";
        let mut cmd = self.git_in(name);
        let out = run_git(cmd.args(["for-each-ref", format, "refs/heads/"]))
            .unwrap_or_else(|e| panic!("branches of {name}: {e:#}"));
        let mut branches: Vec<(String, String)> = out
            .lines()
            .filter_map(|l| {
                let (r, sha) = l.split_once(' ')?;
                Some((r.strip_prefix("refs/heads/")?.to_string(), sha.to_string()))
            })
            .collect();
        branches.sort();
        branches
    }

    /// A file's content at a revision (`main`, a branch, a sha) of a repository; None if
    /// there is no such file or revision.
    pub fn file_at(&self, name: &str, rev: &str, path: &str) -> Option<String> {
        run_git(self.git_in(name).arg("show").arg(format!("{rev}:{path}"))).ok()
    }

    /// Subjects of the commits reachable from `rev`, newest first; empty if there is no
    /// such revision.
    pub fn commit_subjects(&self, name: &str, rev: &str) -> Vec<String> {
        let log = run_git(self.git_in(name).args(["log", "--format=%s", rev, "--"]));
        log.map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// `git --git-dir <the repository>`.
    fn git_in(&self, name: &str) -> Command {
        git_in(&self.repo_path(name))
    }

    /// Every request answered so far, in the order they finished.
    pub fn requests(&self) -> Vec<GitRequest> {
        self.shared.requests.locked().clone()
    }

    /// The raw `Authorization` header values seen so far, in order.
    pub fn authorizations(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter_map(|r| r.authorization)
            .collect()
    }
}

/// A `git` command that reads no system or user config and never prompts, with a fixed
/// committer: the same behaviour on every machine. Tests drive their clients with it too.
pub fn git() -> Command {
    let mut cmd = Command::new("git");
    cmd.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_AUTHOR_NAME", "Tether Test")
        .env("GIT_AUTHOR_EMAIL", "test@tether.invalid")
        .env("GIT_COMMITTER_NAME", "Tether Test")
        .env("GIT_COMMITTER_EMAIL", "test@tether.invalid")
        .env_remove("GIT_ASKPASS")
        .env_remove("SSH_ASKPASS")
        .stdin(Stdio::null());
    // Nothing of a surrounding git (a hook running the tests) may leak in.
    let leaks = "GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_OBJECT_DIRECTORY \
                 GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_CONFIG_PARAMETERS GIT_CONFIG_COUNT";
    for v in leaks.split_whitespace() {
        cmd.env_remove(v);
    }
    cmd
}

/// `git --git-dir <bare>`.
fn git_in(bare: &std::path::Path) -> Command {
    let mut cmd = git();
    cmd.arg("--git-dir").arg(bare);
    cmd
}

/// Runs a git command; its stdout, or an error with its stderr.
fn run_git(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("running {cmd:?} (is git installed?)"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        });
    if !ok {
        bail!("bad repository name {name:?}: use letters, digits, `._-`, and `/` between parts");
    }
    Ok(())
}

/// An accept loop on an ephemeral loopback port answering each connection in a thread of
/// its own; it stops when dropped.
pub(crate) struct Listener {
    pub(crate) addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// Binds 127.0.0.1 on an ephemeral port.
    pub(crate) fn bind() -> std::io::Result<TcpListener> {
        TcpListener::bind("127.0.0.1:0")
    }

    pub(crate) fn start(
        listener: TcpListener,
        name: &'static str,
        serve: impl Fn(TcpStream) -> std::io::Result<()> + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (serve, halt) = (Arc::new(serve), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if halt.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let serve = serve.clone();
                std::thread::spawn(move || {
                    // A client that gave up closes first: not worth a line.
                    if let Err(e) = serve(conn)
                        && !matches!(
                            e.kind(),
                            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                        )
                    {
                        eprintln!("{name}: {e}");
                    }
                });
            }
        });
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A request line and headers (names lowercased, in order).
pub(crate) struct Head {
    pub(crate) method: String,
    pub(crate) target: String,
    pub(crate) headers: Vec<(String, String)>,
}

impl Head {
    /// The first value of a header, by lowercase name.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn invalid(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.into())
}

/// One CRLF- (or LF-) terminated line without its terminator, at most [`MAX_LINE`] long;
/// None at a clean end of input.
fn read_line(r: &mut impl BufRead) -> std::io::Result<Option<String>> {
    let mut buf = Vec::new();
    let n = r
        .by_ref()
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        if n > MAX_LINE {
            return Err(invalid(format!("a line longer than {MAX_LINE} bytes")));
        }
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    buf.pop();
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    String::from_utf8(buf)
        .map(Some)
        .map_err(|_| invalid("a line that is not UTF-8"))
}

/// Header lines up to the blank line (names lowercased).
fn read_headers(r: &mut impl BufRead) -> std::io::Result<Vec<(String, String)>> {
    let mut headers = Vec::new();
    loop {
        let line = read_line(r)?.ok_or(std::io::ErrorKind::UnexpectedEof)?;
        if line.is_empty() {
            return Ok(headers);
        }
        if headers.len() >= MAX_HEADERS {
            return Err(invalid(format!("more than {MAX_HEADERS} header lines")));
        }
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| invalid(format!("a header line without a colon: {line:?}")))?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
}

/// Reads a request line and its headers; None if the peer closed without sending one.
pub(crate) fn read_head(r: &mut impl BufRead) -> std::io::Result<Option<Head>> {
    let Some(line) = read_line(r)? else {
        return Ok(None);
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid(format!("a malformed request line: {line:?}")));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(invalid(format!("not HTTP/1.x: {line:?}")));
    }
    Ok(Some(Head {
        method: method.to_string(),
        target: target.to_string(),
        headers: read_headers(r)?,
    }))
}

/// Reads a request body: `Content-Length` bytes, or a chunked body decoded; at most `max`
/// bytes (else an error of kind `FileTooLarge`).
pub(crate) fn read_body(r: &mut impl BufRead, head: &Head, max: usize) -> std::io::Result<Vec<u8>> {
    let too_large = || {
        std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("a request body larger than {max} bytes"),
        )
    };
    if let Some(te) = head.header("transfer-encoding") {
        if !te.eq_ignore_ascii_case("chunked") {
            return Err(invalid(format!("unsupported Transfer-Encoding: {te}")));
        }
        let mut body = Vec::new();
        loop {
            let line = read_line(r)?.ok_or(std::io::ErrorKind::UnexpectedEof)?;
            let size = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size, 16)
                .map_err(|_| invalid(format!("a bad chunk size line: {line:?}")))?;
            if size == 0 {
                // Trailers, if any, up to the blank line.
                read_headers(r)?;
                return Ok(body);
            }
            let start = body.len();
            if start.saturating_add(size) > max {
                return Err(too_large());
            }
            body.resize(start + size, 0);
            r.read_exact(&mut body[start..])?;
            if read_line(r)?.as_deref() != Some("") {
                return Err(invalid("a chunk not followed by CRLF"));
            }
        }
    }
    let len = match head.header("content-length") {
        None => 0,
        Some(v) => v
            .parse::<usize>()
            .map_err(|_| invalid(format!("a bad Content-Length: {v:?}")))?,
    };
    if len > max {
        return Err(too_large());
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok(body)
}

/// Writes a complete response with a small body and closes the connection.
pub(crate) fn respond(
    mut conn: &TcpStream,
    status: u16,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        reason(status),
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())?;
    conn.write_all(body)?;
    conn.flush()?;
    let _ = conn.shutdown(std::net::Shutdown::Write);
    Ok(())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        _ => "Status",
    }
}

/// `Basic base64(user:password)` → (user, password).
fn parse_basic(value: &str) -> Option<(String, String)> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = String::from_utf8(base64_decode(rest.trim())?).ok()?;
    let (u, p) = decoded.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.trim_end_matches('=').bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Answers one request and closes the connection; records it.
fn serve(conn: TcpStream, s: &Shared) -> std::io::Result<()> {
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    let peer = conn.peer_addr()?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let head = match read_head(&mut reader) {
        Ok(Some(h)) => h,
        Ok(None) => return Ok(()), // the wake-up connection from Drop, or a probe
        Err(e) => {
            let _ = respond(&conn, 400, &[], format!("{e}\n").as_bytes());
            return Err(e);
        }
    };
    let authorization = head.header("authorization").map(str::to_string);
    let creds = authorization.as_deref().and_then(parse_basic);
    let authenticated = matches!(&creds, Some((u, p)) if *u == s.user && *p == s.password);
    let needs_auth = match s.auth {
        Auth::All => true,
        Auth::PushOnly => is_push_path(&head.target),
    };
    let mut record = GitRequest {
        method: head.method.clone(),
        path: head.target.clone(),
        user: creds.map(|(u, _)| u),
        authorization,
        authenticated,
        chunked: head
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked")),
        status: 0,
        backend_stderr: String::new(),
    };
    let expects_continue = head
        .header("expect")
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    // Wrong credentials are refused even where none are needed, as real servers do.
    let result = if (needs_auth || record.authorization.is_some()) && !authenticated {
        if !expects_continue {
            // Read what the client sends anyway, so closing does not reset the connection
            // before it reads the 401.
            let _ = read_body(&mut reader, &head, MAX_BODY);
        }
        record.status = 401;
        respond(
            &conn,
            401,
            &[("WWW-Authenticate", "Basic realm=\"git\"".into())],
            b"authentication required\n",
        )
    } else {
        if expects_continue {
            (&conn).write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        }
        match read_body(&mut reader, &head, MAX_BODY) {
            Err(e) => {
                record.status = if e.kind() == std::io::ErrorKind::FileTooLarge {
                    413
                } else {
                    400
                };
                let _ = respond(&conn, record.status, &[], format!("{e}\n").as_bytes());
                Err(e)
            }
            Ok(body) => {
                let user = authenticated.then_some(s.user.as_str());
                run_backend(&conn, s, &head, body, user, peer, &mut record)
            }
        }
    };
    s.requests.locked().push(record);
    result
}

/// Runs `git http-backend` for one request and streams its answer to the client.
fn run_backend(
    conn: &TcpStream,
    s: &Shared,
    head: &Head,
    body: Vec<u8>,
    user: Option<&str>,
    peer: SocketAddr,
    record: &mut GitRequest,
) -> std::io::Result<()> {
    let (path, query) = head
        .target
        .split_once('?')
        .unwrap_or((head.target.as_str(), ""));
    let mut cmd = git();
    cmd.arg("http-backend")
        .env("GIT_PROJECT_ROOT", &s.root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_HTTP_MAX_REQUEST_BUFFER", MAX_BODY.to_string())
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("REQUEST_METHOD", &head.method)
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("REMOTE_ADDR", peer.ip().to_string())
        .env("SERVER_PROTOCOL", "HTTP/1.1")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (var, header) in [
        ("CONTENT_TYPE", "content-type"),
        ("HTTP_CONTENT_ENCODING", "content-encoding"),
        ("GIT_PROTOCOL", "git-protocol"),
    ] {
        match head.header(header) {
            Some(v) => cmd.env(var, v),
            None => cmd.env_remove(var),
        };
    }
    match user {
        Some(u) => cmd.env("REMOTE_USER", u),
        None => cmd.env_remove("REMOTE_USER"),
    };
    let mut child = cmd.spawn()?;
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(invalid("git http-backend without pipes"));
    };
    let child = Arc::new(Mutex::new(child));
    // A backend that hangs is killed, so no request outlives its timeout.
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = {
        let child = child.clone();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(BACKEND_TIMEOUT) {
                let _ = child.locked().kill();
            }
        })
    };
    let writer = std::thread::spawn(move || {
        // The backend may stop reading early (it refused the request): not an error here.
        let _ = stdin.write_all(&body);
    });
    let errors = std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut stderr = stderr;
        let _ = stderr.by_ref().take(MAX_STDERR).read_to_end(&mut kept);
        let _ = std::io::copy(&mut stderr, &mut std::io::sink());
        String::from_utf8_lossy(&kept).into_owned()
    });
    let result = relay(conn, BufReader::new(stdout), record);
    if result.is_err() {
        let _ = child.locked().kill();
    }
    let _ = done_tx.send(());
    let _ = watchdog.join();
    let _ = child.locked().wait();
    let _ = writer.join();
    record.backend_stderr = errors.join().unwrap_or_default();
    if let Err(e) = &result
        && record.status == 0
    {
        record.status = 502;
        let msg = format!("git http-backend: {e}\n{}", record.backend_stderr);
        let _ = respond(conn, 502, &[], msg.as_bytes());
    }
    result
}

/// Turns a CGI answer into an HTTP response: its `Status:` (default 200) and headers, then
/// the body as it comes, delimited by closing the connection.
fn relay(
    mut conn: &TcpStream,
    mut cgi: BufReader<std::process::ChildStdout>,
    record: &mut GitRequest,
) -> std::io::Result<()> {
    let headers = read_headers(&mut cgi)?;
    let mut status = 200;
    let mut head = String::new();
    for (k, v) in &headers {
        match k.as_str() {
            "status" => {
                status = v
                    .split_whitespace()
                    .next()
                    .and_then(|c| c.parse().ok())
                    .ok_or_else(|| invalid(format!("a bad CGI Status line: {v:?}")))?;
            }
            "connection" | "transfer-encoding" => {}
            _ => head.push_str(&format!("{k}: {v}\r\n")),
        }
    }
    record.status = status;
    let head = format!(
        "HTTP/1.1 {status} {}\r\n{head}Connection: close\r\n\r\n",
        reason(status)
    );
    conn.write_all(head.as_bytes())?;
    std::io::copy(&mut cgi, &mut conn)?;
    conn.flush()?;
    let _ = conn.shutdown(std::net::Shutdown::Write);
    Ok(())
}

#[cfg(test)]
mod tests;
