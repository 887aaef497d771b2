//! A throw-away PostgreSQL cluster for tests and benchmarks: Debian's `postgresql` package,
//! `initdb` in a temporary directory (as the unprivileged `postgres` user when the test runs
//! as root: the server refuses to run as root), `pg_ctl` on an ephemeral loopback port, with
//! password (SCRAM) authentication as on a real deployment. Stopped with `immediate` on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The database user, its password and the database the tests use.
const USER: &str = "tether";
const PASSWORD: &str = "tether-test-password";
const DATABASE: &str = "tether";

/// The config [`Postgres::replica`] gives a brain.
pub const REPLICA_CONFIG: &str = "[store]\nlease_ttl = \"3s\"\n";

pub struct Postgres {
    pub port: u16,
    bin: PathBuf,
    data: PathBuf,
    /// Run the server's tools as this user (`Some("postgres")` when the test is root).
    run_as: Option<String>,
    _dir: tempfile::TempDir,
}

/// Where the newest installed server's programs are.
fn bin_dir() -> Result<PathBuf, String> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| "PostgreSQL is not installed (apt-get install postgresql)".to_string())?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, b)| b)
        .ok_or_else(|| "no initdb under /usr/lib/postgresql/*/bin".into())
}

/// What a server image built from the host's packages needs (deploy/Dockerfile.postgres):
/// the newest server's tree, its shared data, and the time zones.
pub fn install_dirs() -> Result<Vec<PathBuf>, String> {
    let bin = bin_dir()?;
    let tree = bin.parent().ok_or("no server tree")?;
    let version = tree.file_name().ok_or("no server version")?;
    let share = Path::new("/usr/share/postgresql").join(version);
    if !share.is_dir() {
        return Err(format!(
            "no {} (apt-get install postgresql)",
            share.display()
        ));
    }
    Ok(vec![
        tree.to_path_buf(),
        share,
        PathBuf::from("/usr/share/zoneinfo"),
    ])
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

impl Postgres {
    /// Makes and starts a cluster; `Err` says why it cannot run here.
    pub fn start() -> Result<Self, String> {
        let bin = bin_dir()?;
        let run_as = if rustix::process::geteuid().is_root() {
            let ok = Command::new("id")
                .arg("postgres")
                .output()
                .is_ok_and(|o| o.status.success());
            if !ok {
                return Err("running as root and there is no `postgres` user to run the server as (the postgresql package makes one)".into());
            }
            Some("postgres".to_string())
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("tether-pg")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let data = dir.path().join("data");
        let pwfile = dir.path().join("pw");
        std::fs::write(&pwfile, PASSWORD).map_err(|e| e.to_string())?;
        if let Some(user) = &run_as {
            // The server's user needs its way into the directory and nothing else of ours.
            let ok = Command::new("chown")
                .arg(user)
                .arg(dir.path())
                .arg(&pwfile)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                return Err(format!("cannot chown {} to {user}", dir.path().display()));
            }
        }
        let mut pg = Self {
            port: 0,
            bin,
            data,
            run_as,
            _dir: dir,
        };
        let out = pg.tool("initdb", |c| {
            c.arg("-D")
                .arg(&pg.data)
                .args([
                    "-U",
                    USER,
                    "--auth=scram-sha-256",
                    "--no-sync",
                    "-E",
                    "UTF8",
                ])
                .arg(format!("--pwfile={}", pwfile.display()));
        })?;
        if !out.status.success() {
            return Err(format!("initdb failed: {}", text(&out)));
        }
        // Ports picked this way can be taken by someone else before the server binds: try a
        // few.
        let mut last = String::new();
        for _ in 0..5 {
            pg.port = free_port()?;
            match pg.start_server() {
                Ok(()) => {
                    pg.create_database()?;
                    return Ok(pg);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A command for one of the server's programs, as the server's user.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        match &self.run_as {
            Some(user) => {
                let mut c = Command::new("setpriv");
                c.args([
                    &format!("--reuid={user}"),
                    &format!("--regid={user}"),
                    "--init-groups",
                    "--",
                ])
                .arg(path);
                c
            }
            None => Command::new(path),
        }
    }

    fn tool(&self, program: &str, args: impl FnOnce(&mut Command)) -> Result<Output, String> {
        let mut c = self.command(program);
        args(&mut c);
        c.env("PGPASSWORD", PASSWORD)
            .output()
            .map_err(|e| format!("cannot run {program}: {e}"))
    }

    fn start_server(&self) -> Result<(), String> {
        let log = self.data.with_file_name("server.log");
        let opts = format!(
            "-c port={} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c max_connections=300",
            self.port
        );
        let out = self.tool("pg_ctl", |c| {
            c.arg("-D")
                .arg(&self.data)
                .arg("-l")
                .arg(&log)
                .args(["-w", "-t", "60", "-o", &opts, "start"]);
        })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl start failed: {}\n{}",
                text(&out),
                std::fs::read_to_string(&log).unwrap_or_default()
            ))
        }
    }

    fn create_database(&self) -> Result<(), String> {
        let out = self.tool("createdb", |c| {
            c.args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
                .arg(DATABASE);
        })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("createdb failed: {}", text(&out)))
        }
    }

    /// The connection URL (`postgres://user:password@127.0.0.1:port/db`).
    pub fn url(&self) -> String {
        format!(
            "postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{DATABASE}",
            self.port
        )
    }

    /// Options for a brain on this cluster as replica `name`, with the secrets key every
    /// replica shares and task leases of 3 s (another replica takes a dead one's tasks
    /// within that, not the default 10 s).
    pub fn replica(&self, name: &str) -> crate::BrainOptions {
        crate::BrainOptions {
            extra_args: vec![
                "--store".into(),
                self.url(),
                "--replica".into(),
                name.into(),
            ],
            config: Some(REPLICA_CONFIG.into()),
            env: vec![("TETHER_SECRET_KEY".into(), "5e".repeat(32))],
            ..Default::default()
        }
    }

    /// Runs `sql` through `psql` and returns what it printed (unaligned, tuples only).
    pub fn psql(&self, sql: &str) -> String {
        let out = self
            .tool("psql", |c| {
                c.args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
                    .args([
                        "-d",
                        DATABASE,
                        "-X",
                        "-A",
                        "-t",
                        "-v",
                        "ON_ERROR_STOP=1",
                        "-c",
                    ])
                    .arg(sql);
            })
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(out.status.success(), "psql {sql:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Stops the server (`fast`: clients are cut off, nothing acknowledged is lost).
    pub fn stop(&self) {
        let out = self
            .tool("pg_ctl", |c| {
                c.arg("-D")
                    .arg(&self.data)
                    .args(["-w", "-t", "60", "-m", "fast", "stop"]);
            })
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(out.status.success(), "pg_ctl stop: {}", text(&out));
    }

    /// Starts it again on the same port after [`Postgres::stop`].
    pub fn restart(&self) {
        self.start_server().unwrap_or_else(|e| panic!("{e}"));
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// Waits until the server takes connections again, for at most `timeout`.
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        crate::wait_until(timeout, || {
            self.tool("pg_isready", |c| {
                c.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
            })
            .is_ok_and(|o| o.status.success())
        })
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self.tool("pg_ctl", |c| {
            c.arg("-D")
                .arg(&self.data)
                .args(["-w", "-t", "30", "-m", "immediate", "stop"]);
        });
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A cluster for a test that needs one, or `None` after [`crate::skip`] said why (a failure
/// where `TETHER_REQUIRE_PEERS` names `postgres`).
pub fn start_or_skip() -> Option<Postgres> {
    match Postgres::start() {
        Ok(pg) => Some(pg),
        Err(why) => {
            crate::skip("postgres", &why);
            None
        }
    }
}
