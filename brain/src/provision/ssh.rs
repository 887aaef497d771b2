//! The `ssh` provider: a worker on a host the brain reaches over ssh (the `openssh` crate,
//! which drives the system's `ssh`, so the user's ssh config, keys and agent apply).
//!
//! On the host everything lives in `~/.tether/<brain>/<machine>/`: the worker binary (unless
//! the host has the same one installed as `tether-worker`), its state and its log. That path,
//! on the worker's command line as `--state …/state`, is the marker `list` looks for. The
//! worker starts detached: as a transient systemd user unit where a user manager answers,
//! otherwise under `setsid`. The one-time join token goes through ssh's stdin into a 0600 file
//! that the worker deletes when it reads it: it is never on a command line. A worker that
//! gives up on its brain (`worker_exit_after`) removes that directory and exits.
//!
//! Host keys: the check is whatever the user's ssh config says for that host
//! (`StrictHostKeyChecking`, read with `ssh -G`); by default an unknown or changed key is
//! refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use openssh::{KnownHosts, Session, SessionBuilder, Stdio};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::error::ProviderError;
use super::local::{self, WorkerProgram};
use super::provider::{Created, Join, Provisioner, Seen};
use super::records::{Machine, Spec};

/// `[provision.ssh]` in the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SshConfig {
    /// An ssh config file to use instead of `~/.ssh/config` (`ssh -F`).
    pub config_file: Option<PathBuf>,
    /// Worker binaries for other architectures, by `uname -m` (e.g. `aarch64 = "/opt/worker-arm64"`).
    pub workers: BTreeMap<String, PathBuf>,
}

/// Where a machine is: the request's parameters.
#[derive(Debug, Clone, Deserialize)]
struct Target {
    destination: String,
    #[serde(default)]
    port: u16,
    #[serde(default)]
    identity_file: String,
}

impl Target {
    fn from(params: &serde_json::Value) -> Result<Self, ProviderError> {
        let t: Target = serde_json::from_value(params.clone()).map_err(|e| {
            ProviderError::new(format!(
                "ssh needs {{destination, port, identity_file}}: {e}"
            ))
        })?;
        let d = &t.destination;
        let ok = !d.is_empty()
            && d.len() <= 255
            && !d.starts_with('-')
            && d.chars()
                .all(|c| c.is_ascii_alphanumeric() || "@._-:[]".contains(c));
        if !ok {
            return Err(ProviderError::new(format!(
                "invalid ssh destination {d:?}: expected [USER@]HOST"
            )));
        }
        if !t.identity_file.is_empty() && !Path::new(&t.identity_file).is_absolute() {
            return Err(ProviderError::new(format!(
                "the identity file {:?} must be an absolute path on the brain's machine",
                t.identity_file
            )));
        }
        Ok(t)
    }

    /// The destination is this host (`localhost`, a loopback address).
    fn is_this_host(&self) -> bool {
        let host = self
            .destination
            .rsplit_once('@')
            .map(|(_, h)| h)
            .unwrap_or(&self.destination)
            .trim_start_matches('[')
            .trim_end_matches(']');
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    fn shown(&self) -> String {
        if self.port == 0 {
            self.destination.clone()
        } else {
            format!("{}:{}", self.destination, self.port)
        }
    }
}

/// Workers on ssh hosts.
pub struct Ssh {
    worker: Result<WorkerProgram, local::Error>,
    cfg: SshConfig,
    /// Names this brain on hosts: `~/.tether/<tag>/`.
    tag: String,
    /// ssh's control sockets (a short path: unix socket paths are limited).
    control_dir: PathBuf,
}

/// How long to wait for ssh to connect, and for one remote script.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

impl Ssh {
    /// `tag` names this brain on the hosts (letters and digits). ssh's control sockets go in
    /// `<data>/ssh` when that path is short enough for a unix socket (ssh appends about 46
    /// characters to it), else in the temp dir.
    pub fn new(cfg: &SshConfig, tag: &str, data: &Path) -> Self {
        let beside = data.join("ssh");
        let control_dir = if beside.as_os_str().len() <= 60 {
            beside
        } else {
            std::env::temp_dir().join(format!(
                "tether-ssh-{}-{}",
                rustix::process::geteuid().as_raw(),
                &tag[..tag.len().min(12)]
            ))
        };
        Self {
            worker: WorkerProgram::beside_this_program(),
            cfg: cfg.clone(),
            tag: tag.to_string(),
            control_dir,
        }
    }

    /// The host-key check the user's ssh config asks for this host.
    async fn host_key_policy(&self, t: &Target) -> Result<KnownHosts, ProviderError> {
        let mut cmd = tokio::process::Command::new("ssh");
        cmd.arg("-G");
        if let Some(f) = &self.cfg.config_file {
            cmd.arg("-F").arg(f);
        }
        if t.port != 0 {
            cmd.arg("-p").arg(t.port.to_string());
        }
        let out = cmd
            .arg("--")
            .arg(&t.destination)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .map_err(|e| {
                ProviderError::new(format!("cannot run ssh (install openssh-client): {e}"))
            })?;
        if !out.status.success() {
            return Err(ProviderError::new(format!(
                "ssh cannot read its config for {}: {}",
                t.shown(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix("stricthostkeychecking "))
            .unwrap_or("ask")
            .trim()
            .to_ascii_lowercase();
        Ok(match value.as_str() {
            "false" | "no" | "off" => KnownHosts::Accept,
            "accept-new" => KnownHosts::Add,
            // "yes", and "ask", which a brain cannot answer.
            _ => KnownHosts::Strict,
        })
    }

    async fn connect(&self, t: &Target) -> Result<Session, ProviderError> {
        std::fs::create_dir_all(&self.control_dir).map_err(|e| {
            ProviderError::new(format!("cannot create {}: {e}", self.control_dir.display()))
        })?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ =
                std::fs::set_permissions(&self.control_dir, std::fs::Permissions::from_mode(0o700));
        }
        let mut b = SessionBuilder::default();
        b.known_hosts_check(self.host_key_policy(t).await?)
            .connect_timeout(CONNECT_TIMEOUT)
            .server_alive_interval(Duration::from_secs(10))
            .control_directory(&self.control_dir)
            .control_persist(openssh::ControlPersist::IdleFor(
                std::num::NonZeroUsize::new(30).expect("nonzero"),
            ));
        if t.port != 0 {
            b.port(t.port);
        }
        if !t.identity_file.is_empty() {
            b.keyfile(&t.identity_file);
        }
        if let Some(f) = &self.cfg.config_file {
            b.config_file(f);
        }
        let connect = b.connect(&t.destination);
        match tokio::time::timeout(CONNECT_TIMEOUT + Duration::from_secs(5), connect).await {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(explain(&t.shown(), &e)),
            Err(_) => Err(ProviderError::new(format!(
                "connecting to {} timed out after {CONNECT_TIMEOUT:?}",
                t.shown()
            ))),
        }
    }

    /// Runs `script` with `sh -c` on the host, arguments as `$1…`, optionally feeding `stdin`;
    /// returns stdout, or an error with stderr.
    async fn script(
        &self,
        s: &Session,
        t: &Target,
        what: &str,
        script: &str,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<String, ProviderError> {
        let run = async {
            let mut cmd = s.command("sh");
            cmd.arg("-c").arg(script).arg("tether");
            for a in args {
                cmd.arg(*a);
            }
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            cmd.stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            });
            let mut child = cmd.spawn().await?;
            if let Some(bytes) = stdin {
                let mut w = child.stdin().take().expect("piped stdin");
                w.write_all(bytes).await.map_err(openssh::Error::ChildIo)?;
                w.shutdown().await.map_err(openssh::Error::ChildIo)?;
            }
            child.wait_with_output().await
        };
        let out = tokio::time::timeout(SCRIPT_TIMEOUT, run)
            .await
            .map_err(|_| {
                ProviderError::new(format!(
                    "{what} on {} took longer than {SCRIPT_TIMEOUT:?}",
                    t.shown()
                ))
            })?
            .map_err(|e| ProviderError::new(format!("{what} on {}: {e}", t.shown())))?;
        if !out.status.success() {
            return Err(ProviderError::new(format!(
                "{what} on {} failed ({}): {}",
                t.shown(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The worker binary for a host's `uname -m`, and the arguments before `join`.
    fn binary_for(&self, arch: &str) -> Result<WorkerProgram, ProviderError> {
        if let Some(p) = self.cfg.workers.get(arch) {
            return Ok(WorkerProgram {
                program: p.clone(),
                prefix: vec![],
            });
        }
        if arch == std::env::consts::ARCH {
            return self
                .worker
                .as_ref()
                .cloned()
                .map_err(|e| ProviderError::new(e.to_string()));
        }
        Err(ProviderError::new(format!(
            "the host is {arch} and this brain has no worker for it: set provision.ssh.workers.{arch} to a worker binary built for it"
        )))
    }
}

/// A plain-words error for a failed ssh connection.
fn explain(dest: &str, e: &openssh::Error) -> ProviderError {
    let inner = std::error::Error::source(e)
        .map(|s| s.to_string())
        .unwrap_or_else(|| e.to_string());
    if inner.contains("Host key verification failed") {
        let why = if inner.contains("HAS CHANGED") || inner.contains("has changed") {
            "has CHANGED since it was recorded in known_hosts"
        } else {
            "is not in known_hosts"
        };
        return ProviderError::new(format!(
            "refused {dest}: its host key {why}; check the host's key and record it (ssh-keyscan, or one interactive `ssh {dest}`), or let your ssh config accept it (StrictHostKeyChecking)"
        ));
    }
    ProviderError::new(format!(
        "cannot connect to {dest}: {}",
        inner.trim().replace("\r\n", "; ")
    ))
}

/// Hex SHA-256 of a file.
fn sha256_file(path: &Path) -> Result<String, ProviderError> {
    let mut f = std::fs::File::open(path)
        .map_err(|e| ProviderError::new(format!("cannot read {}: {e}", path.display())))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)
        .map_err(|e| ProviderError::new(format!("cannot read {}: {e}", path.display())))?;
    Ok(hex::encode(h.finalize()))
}

/// Prepares the machine's directory; prints the OS, architecture, whether a systemd user
/// manager answers, and which installed worker (if any) has the given checksum.
const PREPARE: &str = r#"set -eu
D="$HOME/.tether/$1/$2"
umask 077
mkdir -p "$D/state"
chmod 700 "$HOME/.tether" "$HOME/.tether/$1" "$D"
command -v pgrep >/dev/null && command -v pkill >/dev/null || { echo "the host needs pgrep and pkill (procps)" >&2; exit 3; }
echo "os $(uname -s)"
echo "arch $(uname -m)"
if command -v systemd-run >/dev/null && systemctl --user show-environment >/dev/null 2>&1; then echo "systemd yes"; else echo "systemd no"; fi
for b in "$(command -v tether-worker 2>/dev/null || true)" "$HOME/.local/bin/tether-worker"; do
  if [ -n "$b" ] && [ -x "$b" ] && command -v sha256sum >/dev/null && [ "$(sha256sum "$b" | cut -d' ' -f1)" = "$3" ]; then echo "installed $b"; break; fi
done
"#;

/// Writes stdin to the machine's worker binary.
const UPLOAD: &str = r#"set -eu
D="$HOME/.tether/$1/$2"
cat > "$D/worker.tmp"
chmod 755 "$D/worker.tmp"
mv "$D/worker.tmp" "$D/worker"
"#;

/// Writes the token (stdin) and starts the worker detached; `$3` is the binary (empty: the
/// copy in the machine's directory), `$4` "yes" for systemd, the rest the worker's arguments
/// before `--token-file`. Prints the handle.
const START: &str = r#"set -eu
D="$HOME/.tether/$1/$2"; BIN="${3:-$D/worker}"; SYSTEMD="$4"; shift 4
umask 077
cat > "$D/token"
if [ "$SYSTEMD" = yes ]; then
  systemd-run --user --quiet --collect --unit "tether-$(basename "$D")" \
    -p StandardOutput="append:$D/worker.log" -p StandardError="append:$D/worker.log" \
    "$BIN" "$@" --token-file "$D/token" --state "$D/state" --remove-on-give-up "$D"
  echo "systemd tether-$(basename "$D")"
else
  setsid nohup "$BIN" "$@" --token-file "$D/token" --state "$D/state" --remove-on-give-up "$D" </dev/null >>"$D/worker.log" 2>&1 &
  echo "pid $!"
fi
"#;

/// Prints the ids of this brain's machines whose worker runs.
const LIST: &str = r#"set -u
for d in "$HOME/.tether/$1"/m-*; do
  [ -d "$d" ] || continue
  if pgrep -f -- "$d/state" >/dev/null 2>&1; then echo "${d##*/}"; fi
done
"#;

/// Stops the machine's worker and removes everything installed for it.
const DESTROY: &str = r#"set -u
D="$HOME/.tether/$1/$2"
systemctl --user stop "tether-$2" >/dev/null 2>&1 || true
pkill -TERM -f -- "$D/state" >/dev/null 2>&1 || true
i=0
while pgrep -f -- "$D/state" >/dev/null 2>&1 && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
pkill -KILL -f -- "$D/state" >/dev/null 2>&1 || true
rm -rf "$D"
rmdir "$HOME/.tether/$1" "$HOME/.tether" 2>/dev/null || true
"#;

#[async_trait::async_trait]
impl Provisioner for Ssh {
    fn name(&self) -> &'static str {
        "ssh"
    }

    fn remote(&self, params: &serde_json::Value) -> bool {
        Target::from(params).is_ok_and(|t| !t.is_this_host())
    }

    fn check(&self, params: &serde_json::Value, _spec: &Spec) -> Result<(), ProviderError> {
        Target::from(params).map(drop)
    }

    async fn create(&self, m: &Machine, join: &Join) -> Result<Created, ProviderError> {
        let t = Target::from(&m.params).map_err(|e| ProviderError::untouched(e.message))?;
        // Nothing is made on a host that cannot be reached.
        let s = self
            .connect(&t)
            .await
            .map_err(|e| ProviderError::untouched(e.message))?;
        let result = self.create_on(&s, &t, m, join).await;
        let _ = s.close().await;
        result
    }

    async fn destroy(&self, m: &Machine) -> Result<(), ProviderError> {
        let t = Target::from(&m.params)?;
        let s = self.connect(&t).await?;
        let r = self
            .script(
                &s,
                &t,
                "stopping the worker",
                DESTROY,
                &[&self.tag, &m.id],
                None,
            )
            .await;
        let _ = s.close().await;
        r.map(drop)
    }

    async fn list(&self, records: &[Machine]) -> Result<Vec<Seen>, ProviderError> {
        // Hosts are known only through records: each one that has a live record is asked.
        let mut hosts: BTreeMap<(String, u16, String), Target> = BTreeMap::new();
        for m in records {
            if let Ok(t) = Target::from(&m.params) {
                hosts.insert((t.destination.clone(), t.port, t.identity_file.clone()), t);
            }
        }
        let mut seen = Vec::new();
        for t in hosts.values() {
            let s = self.connect(t).await?;
            let out = self
                .script(&s, t, "listing workers", LIST, &[&self.tag], None)
                .await;
            let _ = s.close().await;
            tracing::debug!(host = %t.shown(), out = ?out, "listed");
            for id in out?.lines().map(str::trim).filter(|l| l.starts_with("m-")) {
                seen.push(Seen {
                    machine: id.to_string(),
                    handle: t.shown(),
                    failure: None,
                });
            }
        }
        Ok(seen)
    }
}

impl Ssh {
    async fn create_on(
        &self,
        s: &Session,
        t: &Target,
        m: &Machine,
        join: &Join,
    ) -> Result<Created, ProviderError> {
        let local = self
            .worker
            .as_ref()
            .cloned()
            .map_err(|e| ProviderError::new(e.to_string()))?;
        let local_sum = {
            let p = local.program.clone();
            tokio::task::spawn_blocking(move || sha256_file(&p))
                .await
                .map_err(|e| ProviderError::new(e.to_string()))??
        };
        let facts = self
            .script(
                s,
                t,
                "checking the host",
                PREPARE,
                &[&self.tag, &m.id, &local_sum],
                None,
            )
            .await?;
        let fact = |k: &str| {
            facts
                .lines()
                .find_map(|l| l.strip_prefix(k).map(|v| v.trim().to_string()))
                .unwrap_or_default()
        };
        let (os, arch) = (fact("os "), fact("arch "));
        if os != "Linux" {
            return Err(ProviderError::new(format!(
                "{} runs {os:?}; workers run on Linux only",
                t.shown()
            )));
        }
        let program = self.binary_for(&arch)?;
        let installed = fact("installed ");
        let bin = if !installed.is_empty() && program.program == local.program {
            tracing::info!(host = %t.shown(), binary = %installed, "using the worker already installed");
            installed
        } else {
            let bytes = tokio::fs::read(&program.program).await.map_err(|e| {
                ProviderError::new(format!("cannot read {}: {e}", program.program.display()))
            })?;
            tracing::info!(host = %t.shown(), bytes = bytes.len(), "copying the worker binary");
            self.script(
                s,
                t,
                "copying the worker",
                UPLOAD,
                &[&self.tag, &m.id],
                Some(&bytes),
            )
            .await?;
            // START's default: the copy in the machine's directory.
            String::new()
        };
        let systemd = if fact("systemd ") == "yes" {
            "yes"
        } else {
            "no"
        };
        let mut args: Vec<String> = vec![self.tag.clone(), m.id.clone(), bin, systemd.into()];
        args.extend(program.prefix.iter().cloned());
        args.extend(join.args());
        let all: Vec<&str> = args.iter().map(String::as_str).collect();
        let handle = self
            .script(
                s,
                t,
                "starting the worker",
                START,
                &all,
                Some(format!("{}\n", join.token).as_bytes()),
            )
            .await?;
        Ok(Created {
            handle: handle.trim().to_string(),
            address: t.shown(),
        })
    }
}
