//! A real git server for tests: `git http-backend` (it ships with git) run as CGI behind
//! testkit's HTTP server ([`crate::http`]) on 127.0.0.1, with HTTP Basic auth, over a temp dir
//! of bare repositories. Clone, fetch and push through it with a stock git client; every request
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
//! Credentials are checked from a request's head, before its body is read: a push without
//! them is refused before git sends its pack (git's `Expect: 100-continue` is never
//! answered), as real servers do.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use anyhow::{Context, bail};
use shared::locks::Lock;

use crate::http::{Options, Request, Response, Server};

/// Largest request body accepted (after chunked decoding).
const MAX_BODY: usize = 256 << 20;
/// Most header lines in one CGI answer.
const MAX_HEADERS: usize = 100;
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
    listener: Server,
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
        let (s, first) = (shared.clone(), shared.clone());
        let opts = Options {
            max_body: MAX_BODY,
            early: Some(Arc::new(move |head: &Request| {
                waits_for_go_ahead(head)
                    .then(|| refuse(head, &first))
                    .flatten()
            })),
            ..Options::plain("git server")
        };
        let listener =
            Server::start(opts, move |req| serve(&req, &s)).context("bind the git server")?;
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
        init_repo(w, files)?;
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
        format!("http://{}", self.listener.addr())
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
            self.listener.addr(),
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

/// Makes `dir` a repository whose branch `main` has one commit ("initial commit") holding
/// `files` (path, content).
pub fn init_repo(dir: &Path, files: &[(&str, &str)]) -> anyhow::Result<()> {
    run_git(git().args(["init", "--quiet", "-b", "main"]).arg(dir))?;
    for (path, content) in files {
        let p = dir.join(path);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("mkdir {}", parent.display()))?;
        }
        std::fs::write(&p, content).with_context(|| format!("write {}", p.display()))?;
    }
    run_git(git().current_dir(dir).args(["add", "--all"]))?;
    let commit = ["commit", "-q", "--allow-empty", "-m", "initial commit"];
    run_git(git().current_dir(dir).args(commit)).map(drop)
}

/// `git --git-dir <bare>`.
fn git_in(bare: &Path) -> Command {
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

/// `Basic base64(user:password)` → (user, password).
fn parse_basic(value: &str) -> Option<(String, String)> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    use base64::Engine as _;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let decoded = String::from_utf8(raw).ok()?;
    let (u, p) = decoded.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

/// What a request carries of credentials, as it will be recorded (status still 0).
fn record_of(req: &Request, s: &Shared) -> GitRequest {
    let authorization = req.header("authorization").map(str::to_string);
    let creds = authorization.as_deref().and_then(parse_basic);
    let authenticated = matches!(&creds, Some((u, p)) if *u == s.user && *p == s.password);
    GitRequest {
        method: req.method.clone(),
        path: req.target.clone(),
        user: creds.map(|(u, _)| u),
        authorization,
        authenticated,
        chunked: req
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked")),
        status: 0,
        backend_stderr: String::new(),
    }
}

/// Whether a request's body has not been sent yet: it asked `Expect: 100-continue`, or has
/// none. A refusal from its head then reaches the client before any body; one whose body is
/// on its way is read first, so closing does not reset the connection before the client
/// reads the answer.
fn waits_for_go_ahead(head: &Request) -> bool {
    let expects = head
        .header("expect")
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    let bodiless = head.header("transfer-encoding").is_none()
        && head
            .header("content-length")
            .is_none_or(|l| l.trim() == "0");
    expects || bodiless
}

/// A 401 (recorded) for a request that needs credentials and lacks the right ones; wrong
/// credentials are refused even where none are needed, as real servers do.
fn refuse(head: &Request, s: &Shared) -> Option<Response> {
    let mut record = record_of(head, s);
    let needs_auth = match s.auth {
        Auth::All => true,
        Auth::PushOnly => is_push_path(&head.target),
    };
    if !((needs_auth || record.authorization.is_some()) && !record.authenticated) {
        return None;
    }
    record.status = 401;
    s.requests.locked().push(record);
    Some(
        Response::new(401, "authentication required\n")
            .header("WWW-Authenticate", "Basic realm=\"git\""),
    )
}

/// Answers one request through `git http-backend`, and records it.
fn serve(req: &Request, s: &Shared) -> Response {
    if let Some(refused) = refuse(req, s) {
        return refused;
    }
    let mut record = record_of(req, s);
    let user = record.authenticated.then_some(s.user.as_str());
    let out = match run_backend(s, req, user, &mut record) {
        Ok(out) => out,
        Err(e) => Response::new(
            502,
            format!("git http-backend: {e}\n{}", record.backend_stderr),
        ),
    };
    record.status = out.status;
    s.requests.locked().push(record);
    out
}

/// Runs `git http-backend` for one request; its answer as an HTTP response.
fn run_backend(
    s: &Shared,
    req: &Request,
    user: Option<&str>,
    record: &mut GitRequest,
) -> std::io::Result<Response> {
    let mut cmd = git();
    cmd.arg("http-backend")
        .env("GIT_PROJECT_ROOT", &s.root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_HTTP_MAX_REQUEST_BUFFER", MAX_BODY.to_string())
        .env("PATH_INFO", req.path())
        .env("QUERY_STRING", req.query())
        .env("REQUEST_METHOD", &req.method)
        .env("CONTENT_LENGTH", req.body.len().to_string())
        .env("REMOTE_ADDR", "127.0.0.1")
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
        match req.header(header) {
            Some(v) => cmd.env(var, v),
            None => cmd.env_remove(var),
        };
    }
    match user {
        Some(u) => cmd.env("REMOTE_USER", u),
        None => cmd.env_remove("REMOTE_USER"),
    };
    let mut child = cmd.spawn()?;
    let (Some(mut stdin), Some(mut stdout), Some(stderr)) =
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
    let body = req.body.clone();
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
    let mut cgi = Vec::new();
    let read = stdout.read_to_end(&mut cgi);
    let _ = done_tx.send(());
    let _ = watchdog.join();
    let _ = child.locked().wait();
    let _ = writer.join();
    record.backend_stderr = errors.join().unwrap_or_default();
    read?;
    cgi_answer(&cgi)
}

fn invalid(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.into())
}

/// A CGI answer as an HTTP response: its `Status:` (default 200), its headers (but those
/// about the connection, which the server decides), then the body.
fn cgi_answer(cgi: &[u8]) -> std::io::Result<Response> {
    let ends = [&b"\r\n\r\n"[..], &b"\n\n"[..]];
    let (at, sep) = ends
        .iter()
        .filter_map(|sep| {
            cgi.windows(sep.len())
                .position(|w| w == *sep)
                .map(|at| (at, sep.len()))
        })
        .min()
        .ok_or_else(|| invalid("a CGI answer without the blank line after its headers"))?;
    let head =
        std::str::from_utf8(&cgi[..at]).map_err(|_| invalid("CGI headers that are not UTF-8"))?;
    let mut out = Response::new(200, cgi[at + sep..].to_vec());
    for (n, line) in head.lines().enumerate() {
        if n >= MAX_HEADERS {
            return Err(invalid(format!("more than {MAX_HEADERS} CGI header lines")));
        }
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| invalid(format!("a CGI header line without a colon: {line:?}")))?;
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        match k.as_str() {
            "status" => {
                out.status = v
                    .split_whitespace()
                    .next()
                    .and_then(|c| c.parse().ok())
                    .ok_or_else(|| invalid(format!("a bad CGI Status line: {v:?}")))?;
            }
            "connection" | "transfer-encoding" | "content-length" => {}
            _ => out = out.header(k, v),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
