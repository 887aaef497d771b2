//! A throw-away OpenSSH server on a loopback port, with a throw-away user and key, for
//! benchmarks that compare against `ssh` and `rsync` over ssh. Needs root (to create the
//! user) and openssh-server; `start` says why when it cannot run. Everything is removed on
//! drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Sshd {
    /// Where it listens.
    pub host: String,
    pub port: u16,
    pub user: String,
    pub key: PathBuf,
    /// The user's home (its own, writable).
    pub home: PathBuf,
    /// The server's public host key, as a known_hosts line for `host`.
    pub known_hosts_line: String,
    daemon: Child,
}

impl Sshd {
    /// Starts one on a loopback port in `tmp`; `Err` says why it cannot.
    pub fn start(tmp: &Path) -> Result<Self, String> {
        Self::start_in(tmp, None)
    }

    /// Starts one in `tmp`, inside `netns` (on its address, port 22) when given.
    pub fn start_in(tmp: &Path, netns: Option<&crate::netns::Netns>) -> Result<Self, String> {
        let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .ok_or("openssh-server is not installed (apt-get install openssh-server)")?;
        if !rustix::process::geteuid().is_root() {
            return Err("needs root to create a throw-away user for sshd".into());
        }
        let user = format!("tb{:06x}", crate::rand_u32() & 0xffffff);
        let home = tmp.join("sshhome");
        let ok = Command::new("useradd")
            .args(["-M", "-p", "*", "-s", "/bin/sh", "-d"])
            .arg(&home)
            .arg(&user)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err("useradd failed".into());
        }
        std::fs::create_dir_all(&home).map_err(|e| e.to_string())?;
        let _ = Command::new("chown").arg(&user).arg(&home).status();
        let key = tmp.join("id_ed25519");
        let hostkey = tmp.join("host_ed25519");
        for k in [&key, &hostkey] {
            let ok = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(k)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("userdel").arg(&user).status();
                return Err("ssh-keygen failed".into());
            }
        }
        let auth = tmp.join("authorized_keys");
        std::fs::copy(key.with_extension("pub"), &auth).map_err(|e| e.to_string())?;
        let (host, port) = match netns {
            Some(ns) => (ns.ns_ip.clone(), 22),
            None => (
                "127.0.0.1".to_string(),
                std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .map_err(|e| e.to_string())?
                    .port(),
            ),
        };
        let cfg = tmp.join("sshd_config");
        std::fs::write(
            &cfg,
            format!(
                "Port {port}\nListenAddress {host}\nHostKey {}\nAuthorizedKeysFile {}\nPidFile {}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPrintMotd no\nPrintLastLog no\nAcceptEnv none\n",
                hostkey.display(),
                auth.display(),
                tmp.join("sshd.pid").display()
            ),
        )
        .map_err(|e| e.to_string())?;
        let _ = std::fs::create_dir_all("/run/sshd");
        let mut cmd = match netns {
            Some(ns) => ns.command(&sshd.to_string_lossy()),
            None => Command::new(&sshd),
        };
        let daemon = cmd
            .arg("-D")
            .arg("-f")
            .arg(&cfg)
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let pubkey =
            std::fs::read_to_string(hostkey.with_extension("pub")).map_err(|e| e.to_string())?;
        let mut fields = pubkey.split_whitespace();
        let known_hosts_line = format!(
            "{} {} {}",
            if port == 22 {
                host.clone()
            } else {
                format!("[{host}]:{port}")
            },
            fields.next().unwrap_or_default(),
            fields.next().unwrap_or_default()
        );
        let s = Self {
            host,
            port,
            user,
            key,
            home,
            known_hosts_line,
            daemon,
        };
        let ready = crate::wait_until(Duration::from_secs(10), || {
            s.ssh(&[&s.dest(), "true"])
                .status()
                .is_ok_and(|st| st.success())
        });
        if !ready {
            return Err("the throw-away sshd did not accept a login".into());
        }
        Ok(s)
    }

    /// `user@host`.
    pub fn dest(&self) -> String {
        format!("{}@{}", self.user, self.host)
    }

    /// The ssh options that reach this server (port, key, no host-key prompts).
    pub fn ssh_args(&self) -> Vec<String> {
        vec![
            "-q".into(),
            "-p".into(),
            self.port.to_string(),
            "-i".into(),
            self.key.display().to_string(),
            "-o".into(),
            "BatchMode=yes".into(),
            "-o".into(),
            "StrictHostKeyChecking=no".into(),
            "-o".into(),
            "UserKnownHostsFile=/dev/null".into(),
            "-o".into(),
            "LogLevel=ERROR".into(),
        ]
    }

    /// `ssh` to this server with `extra` arguments.
    pub fn ssh(&self, extra: &[&str]) -> Command {
        let mut c = Command::new("ssh");
        c.args(self.ssh_args()).args(extra).stdin(Stdio::null());
        c
    }

    /// Gives `path` to the throw-away user (for rsync destinations).
    pub fn chown(&self, path: &Path) -> bool {
        Command::new("chown")
            .arg("-R")
            .arg(&self.user)
            .arg(path)
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        let _ = Command::new("userdel").arg(&self.user).status();
    }
}

/// A "remote host" for provisioning tests and benchmarks: sshd in a network namespace of its
/// own (on a loopback port where namespaces are unavailable), with a throw-away user, keys, a
/// directory that user can reach, and an ssh config for the brain. Everything it started is
/// killed and removed on drop.
pub struct SshHost {
    pub sshd: Sshd,
    // Dropped after sshd.
    _ns: Option<crate::netns::Netns>,
    pub tmp: PathBuf,
    /// The address the host reaches the brain on.
    pub brain_host: String,
}

impl SshHost {
    /// A host, or why there cannot be one here.
    pub fn start() -> Result<Self, String> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = std::env::temp_dir().join(format!("tether-ssh-host-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
        // The throw-away user must reach its home inside.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
        let ns = match crate::netns::Netns::create() {
            Ok(ns) => Some(ns),
            Err(why) => {
                eprintln!("no network namespace ({why}); the host is a loopback port instead");
                None
            }
        };
        let sshd = Sshd::start_in(&tmp, ns.as_ref())?;
        let brain_host = ns
            .as_ref()
            .map(|n| n.host_ip.clone())
            .unwrap_or_else(|| "127.0.0.1".into());
        Ok(Self {
            sshd,
            _ns: ns,
            tmp,
            brain_host,
        })
    }

    /// Writes an ssh config for this host (user, port, key, a known_hosts file of its own,
    /// `StrictHostKeyChecking strict`) and returns its path.
    pub fn write_ssh_config(&self, strict: &str) -> PathBuf {
        let cfg = self.tmp.join("ssh_config");
        std::fs::write(
            &cfg,
            format!(
                "Host {host}\n  User {user}\n  Port {port}\n  IdentityFile {key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {kh}\n  StrictHostKeyChecking {strict}\n  LogLevel ERROR\n",
                host = self.sshd.host,
                user = self.sshd.user,
                port = self.sshd.port,
                key = self.sshd.key.display(),
                kh = self.known_hosts().display(),
            ),
        )
        .expect("write the ssh config");
        cfg
    }

    /// The known_hosts file the config names.
    pub fn known_hosts(&self) -> PathBuf {
        self.tmp.join("known_hosts")
    }

    /// Records the host's real key in it.
    pub fn trust(&self) {
        std::fs::write(
            self.known_hosts(),
            format!("{}\n", self.sshd.known_hosts_line),
        )
        .expect("write known_hosts");
    }
}

impl Drop for SshHost {
    fn drop(&mut self) {
        for pid in crate::pids_mentioning(&self.sshd.home) {
            crate::signal(pid, rustix::process::Signal::KILL);
        }
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}
