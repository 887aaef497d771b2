//! The brain's own git: importing a task's repository into the mirror ([`import`]), making a
//! commit of a workspace in the mirror on top of the imported one and the patches and diffs
//! between two workspaces ([`commit`]), pushing it with credentials only the brain holds
//! ([`Credentials`]) and opening a pull request for it ([`github`]). Everything goes through
//! the `git` program, each run with a timeout; nothing here knows tasks or workers.

pub mod commit;
pub mod github;
pub mod import;
pub mod remote;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

/// How long a local git command may take.
const LOCAL_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a clone, fetch or push may take.
pub const REMOTE_TIMEOUT: Duration = Duration::from_secs(600);
/// Most of a git command's output kept.
const MAX_OUTPUT: usize = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot run git ({0}): is git installed on the brain's machine?")]
    Spawn(std::io::Error),
    #[error("git {what} gave no answer within {timeout:?}")]
    Timeout { what: String, timeout: Duration },
    #[error("git {what} failed: {reason}")]
    Failed { what: String, reason: String },
    #[error("{0}")]
    Io(String),
    #[error("the mirror: {0}")]
    Mirror(#[from] crate::mirror::Error),
    #[error("{0}")]
    Invalid(String),
}

/// Credentials for the brain's own clones and pushes (from its config or environment). Given
/// to one git process at a time through a credential helper that reads them from that
/// process's environment, never through a URL, a file or a worker, and that answers only
/// for `https` and the hosts they are for. `Debug` hides them.
#[derive(Clone, Default)]
pub struct Credentials {
    pub username: String,
    pub password: String,
    /// The hosts (`host`, or `host:port` off 443), lower case, the credentials are for.
    pub hosts: Vec<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"[redacted]")
            .field("hosts", &self.hosts)
            .finish()
    }
}

impl Credentials {
    pub fn is_empty(&self) -> bool {
        self.password.is_empty()
    }
}

/// What deliveries need: who commits, where branches go, the brain's tokens.
#[derive(Clone, Default)]
pub struct Settings {
    pub mode: crate::model::delivery::Mode,
    pub branch_prefix: String,
    pub author: commit::Author,
    pub creds: Credentials,
    pub github_api: String,
    pub github_token: String,
    pub draft: bool,
    /// Which repositories the brain's git may reach.
    pub remotes: remote::Policy,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("mode", &self.mode)
            .field("branch_prefix", &self.branch_prefix)
            .field("author", &self.author)
            .field("creds", &self.creds)
            .field("github_api", &self.github_api)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// The tokens, for masking wherever text leaves the brain.
    pub fn secrets(&self) -> Vec<String> {
        [&self.creds.password, &self.github_token]
            .into_iter()
            .filter(|s| s.len() >= 8)
            .cloned()
            .collect()
    }
}

/// The credential helper: answers `get` from its own environment (set for one git process),
/// so the secret is in no argument list and no file; and only when git asks for `https` and
/// one of the hosts in `$TETHER_GIT_HOSTS` (git names a port off 443 as `host:port`).
/// Otherwise it says nothing, and git goes on without credentials.
const HELPER: &str = "!f() { test \"$1\" = get || exit 0; p=; h=; while IFS= read -r l; do case \"$l\" in protocol=*) p=\"${l#protocol=}\";; host=*) h=\"${l#host=}\";; esac; done; test \"$p\" = https || exit 0; h=$(printf %s \"$h\" | tr A-Z a-z); for a in $TETHER_GIT_HOSTS; do if test \"$h\" = \"$a\"; then echo \"username=$TETHER_GIT_USERNAME\"; echo \"password=$TETHER_GIT_PASSWORD\"; exit 0; fi; done; }; f";

/// Said after git's own words when a server answered with a redirect.
const REDIRECT_HINT: &str = " (the server answered with a redirect, which the brain's git does not follow: name the repository's final URL, which is checked as any other)";

/// Whether git's error says the server answered 301, 302, 303, 307 or 308.
fn redirected(stderr: &str) -> bool {
    ["301", "302", "303", "307", "308"]
        .iter()
        .any(|c| stderr.contains(&format!("The requested URL returned error: {c}")))
}

/// One git command being put together.
pub struct Git {
    cmd: tokio::process::Command,
    what: String,
    timeout: Duration,
    stdin: Option<Vec<u8>>,
}

impl Git {
    /// `git ARGS` on the repository at `git_dir` (or none), isolated from the brain user's
    /// and the system's git config, for local plumbing that must come out the same anywhere.
    pub fn local(git_dir: Option<&Path>, args: &[&str]) -> Self {
        let mut g = Self::new(args, LOCAL_TIMEOUT);
        g.cmd
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null");
        if let Some(d) = git_dir {
            g.cmd.env("GIT_DIR", d);
        }
        g
    }

    /// `git ARGS` that talks to a remote the policy let through (`checked`: git may use only
    /// the transports allowed, and an HTTP(S) host is pinned to the address checked). The
    /// brain user's own git config applies (its ssh setup, its credential helpers) unless
    /// `creds` are given, which then replace every configured credential helper for this
    /// process.
    pub fn remote(args: &[&str], creds: &Credentials, checked: &remote::Checked) -> Self {
        let mut g = Self::new(args, REMOTE_TIMEOUT);
        g.cmd.env("GIT_ALLOW_PROTOCOL", &checked.protocols);
        // No redirect is followed: the host checked and pinned is the only one reached (git
        // would follow the first answer's redirect wherever it led, an internal address too).
        let mut config: Vec<(&str, &str)> = vec![("http.followRedirects", "false")];
        config.extend(
            checked
                .pins
                .iter()
                .map(|p| ("http.curloptResolve", p.as_str())),
        );
        if !creds.is_empty() {
            config.push(("credential.helper", ""));
            config.push(("credential.helper", HELPER));
        }
        g.cmd.env("GIT_CONFIG_COUNT", config.len().to_string());
        for (i, (k, v)) in config.iter().enumerate() {
            g.cmd
                .env(format!("GIT_CONFIG_KEY_{i}"), k)
                .env(format!("GIT_CONFIG_VALUE_{i}"), v);
        }
        if !creds.is_empty() {
            g.cmd
                .env("TETHER_GIT_HOSTS", creds.hosts.join(" "))
                .env(
                    "TETHER_GIT_USERNAME",
                    if creds.username.is_empty() {
                        "x-access-token"
                    } else {
                        &creds.username
                    },
                )
                .env("TETHER_GIT_PASSWORD", &creds.password);
        }
        g
    }

    fn new(args: &[&str], timeout: Duration) -> Self {
        let mut cmd = tokio::process::Command::new("git");
        cmd.args(args)
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_ASKPASS", "/bin/false")
            .env("SSH_ASKPASS", "/bin/false")
            .env_remove("GIT_DIR")
            .env_remove("GIT_INDEX_FILE")
            .env_remove("GIT_WORK_TREE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        Self {
            cmd,
            what: args.first().copied().unwrap_or("").to_string(),
            timeout,
            stdin: None,
        }
    }

    pub fn env(mut self, k: &str, v: impl AsRef<std::ffi::OsStr>) -> Self {
        self.cmd.env(k, v);
        self
    }

    pub fn dir(mut self, d: &Path) -> Self {
        self.cmd.current_dir(d);
        self
    }

    pub fn index(self, index: &Path) -> Self {
        self.env("GIT_INDEX_FILE", index)
    }

    pub fn input(mut self, data: Vec<u8>) -> Self {
        self.stdin = Some(data);
        self.cmd.stdin(Stdio::piped());
        self
    }

    /// Runs it; its stdout on success, else its stderr in the error.
    pub async fn run(mut self) -> Result<Vec<u8>, Error> {
        let mut child = self.cmd.spawn().map_err(Error::Spawn)?;
        let input = self.stdin.take();
        let mut stdin = child.stdin.take();
        let (what, timeout) = (self.what.clone(), self.timeout);
        let work = async move {
            let feed = async {
                if let (Some(data), Some(s)) = (input, stdin.as_mut()) {
                    // A git that exits early closes its end; its status says why.
                    let _ = s.write_all(&data).await;
                }
                drop(stdin);
            };
            let (_, out) = tokio::join!(feed, child.wait_with_output());
            out
        };
        let out = tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| Error::Timeout {
                what: what.clone(),
                timeout,
            })?
            .map_err(Error::Spawn)?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let err = err.trim();
            let mut reason: String = if err.is_empty() {
                format!("{}", out.status)
            } else {
                err.chars().take(2000).collect()
            };
            if redirected(err) {
                reason.push_str(REDIRECT_HINT);
            }
            return Err(Error::Failed { what, reason });
        }
        if out.stdout.len() > MAX_OUTPUT {
            return Err(Error::Failed {
                what,
                reason: format!("more than {MAX_OUTPUT} bytes of output"),
            });
        }
        Ok(out.stdout)
    }

    /// Runs it and hands its stdout on in pieces of at most `piece` bytes as they come, never
    /// more than a few pieces ahead of the reader: a reader that stops (drops the receiver)
    /// ends git (killed on drop), so nothing is read that nobody wants. The last item is an
    /// error if git failed or took longer than its timeout. `keep` (a temporary repository)
    /// lives until git is done.
    pub fn stream<K: Send + 'static>(
        mut self,
        piece: usize,
        keep: K,
    ) -> Result<tokio::sync::mpsc::Receiver<Result<Vec<u8>, Error>>, Error> {
        use tokio::io::AsyncReadExt;
        self.cmd.stdin(Stdio::null());
        let mut child = self.cmd.spawn().map_err(Error::Spawn)?;
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let (what, timeout) = (self.what, self.timeout);
        let mut stdout = child
            .stdout
            .take()
            .ok_or_else(|| Error::Io("no stdout".into()))?;
        let mut stderr = child
            .stderr
            .take()
            .ok_or_else(|| Error::Io("no stderr".into()))?;
        tokio::spawn(async move {
            let _keep = keep;
            let work = async {
                // Git's complaint, kept short, read beside its output so neither blocks.
                let complaint = tokio::spawn(async move {
                    let mut e = Vec::new();
                    let _ = (&mut stderr).take(64 * 1024).read_to_end(&mut e).await;
                    e
                });
                let pass = async {
                    let mut buf = vec![0u8; piece];
                    loop {
                        let n = stdout
                            .read(&mut buf)
                            .await
                            .map_err(|e| Error::Io(e.to_string()))?;
                        if n == 0 {
                            return Ok(true);
                        }
                        if tx.send(Ok(buf[..n].to_vec())).await.is_err() {
                            // The reader has gone: git is killed below.
                            return Ok(false);
                        }
                    }
                };
                match pass.await {
                    Ok(true) => {}
                    // Dropping git (at the end of this task) kills it.
                    Ok(false) => return Ok(()),
                    Err(e) => return Err(e),
                }
                let complaint = complaint.await.unwrap_or_default();
                let status = child.wait().await.map_err(Error::Spawn)?;
                if status.success() {
                    return Ok(());
                }
                let err = String::from_utf8_lossy(&complaint);
                Err(Error::Failed {
                    what: what.clone(),
                    reason: if err.trim().is_empty() {
                        status.to_string()
                    } else {
                        err.trim().chars().take(2000).collect()
                    },
                })
            };
            let r = match tokio::time::timeout(timeout, work).await {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout {
                    what: what.clone(),
                    timeout,
                }),
            };
            if let Err(e) = r {
                let _ = tx.send(Err(e)).await;
            }
        });
        Ok(rx)
    }

    /// Runs it; its stdout as trimmed text.
    pub async fn text(self) -> Result<String, Error> {
        let out = self.run().await?;
        Ok(String::from_utf8_lossy(&out).trim().to_string())
    }
}

/// Where the brain keeps each imported repository's git objects: one git directory per
/// imported commit (shallow, with no remote and no credentials), which deliveries commit on.
#[derive(Debug, Clone)]
pub struct Repos {
    dir: PathBuf,
}

impl Repos {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The git directory holding `commit`.
    pub fn path(&self, commit: &str) -> Result<PathBuf, Error> {
        if !is_object_id(commit) {
            return Err(Error::Invalid(format!("{commit:?} is not a git commit id")));
        }
        Ok(self.dir.join(format!("{commit}.git")))
    }

    pub fn root(&self) -> &Path {
        &self.dir
    }
}

/// A full hexadecimal git object id (SHA-1 or SHA-256).
pub fn is_object_id(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}
