//! Test harness: starts the real `brain` and `worker` binaries as processes on loopback
//! ephemeral ports with temp dirs, waits for readiness, and can SIGKILL and restart either.
//!
//! Set `TETHER_KEEP_TEST_DIR=1` to keep a test's temp dir (logs, data, workspaces) after it,
//! and `TETHER_TEST_LOG` to a `RUST_LOG` filter for the processes (default `info`).

pub mod agent_run;
pub use agent_run::AgentRun;
pub mod fake_github;
pub mod fake_kube;
pub mod fake_llm;
mod follow;
pub mod gates;
pub mod git_server;
pub mod http;
pub mod https;
pub mod moto;
pub mod netns;
pub mod plans;
pub mod postgres;
mod procs;
pub mod random;
mod said;
pub mod sshd;
pub mod tasks;
pub mod terminal;
mod web_login;
pub mod webdriver;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use procs::{
    chown_tree, peak_rss, pids_mentioning, process_gone, processes_started_in, reset_peak,
};
pub use said::{
    assert_failed_saying, assert_failed_stderr_says, assert_said, assert_stderr_says,
    assert_stdout_says,
};

use anyhow::{Context, bail};
use shared::locks::Lock;

/// A number that differs between calls and processes (names of throw-away users, interfaces).
pub(crate) fn rand_u32() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    t.subsec_nanos() ^ std::process::id()
}

/// Paths of the binaries under test.
#[derive(Debug, Clone)]
pub struct Bins {
    pub brain: PathBuf,
    pub worker: PathBuf,
}

impl Bins {
    /// `$TETHER_BIN_DIR`, else the cargo target dir of the running test (`target/<profile>`).
    /// `brain` and `worker` in `dir` (which must hold both).
    pub fn at(dir: &std::path::Path) -> Self {
        let bins = Self {
            brain: dir.join("brain"),
            worker: dir.join("worker"),
        };
        for b in [&bins.brain, &bins.worker] {
            assert!(b.exists(), "{} not found", b.display());
        }
        bins
    }

    pub fn locate() -> Self {
        let dir = std::env::var_os("TETHER_BIN_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let exe = std::env::current_exe().expect("current exe");
                // target/<profile>/deps/<test-binary>
                let deps = exe.parent().expect("deps dir");
                let profile = if deps.ends_with("deps") {
                    deps.parent().expect("profile dir")
                } else {
                    deps
                };
                profile.to_path_buf()
            });
        let bins = Self {
            brain: dir.join("brain"),
            worker: dir.join("worker"),
        };
        for b in [&bins.brain, &bins.worker] {
            assert!(
                b.exists(),
                "{} not built: run `cargo build --workspace` (or `cargo test --workspace`) first",
                b.display()
            );
        }
        bins
    }
}

/// A running process whose output goes to a log file.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with its stdout and stderr appended to `log`.
    pub fn spawn(mut cmd: Command, log: &Path) -> anyhow::Result<Self> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        cmd.stdout(f.try_clone()?).stderr(f).stdin(Stdio::null());
        let child = cmd.spawn().context("spawning")?;
        Ok(Self {
            child,
            log: log.to_path_buf(),
        })
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then wait up to `timeout` for a clean exit. Returns the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        signal(self.child.id(), rustix::process::Signal::TERM);
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `timeout` for the process to exit on its own: its status, or None.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A worker process and its state dir.
pub struct Worker {
    pub name: String,
    pub id: String,
    pub state: PathBuf,
    pub proc: Option<Proc>,
}

impl Worker {
    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.state.with_extension("log")).unwrap_or_default()
    }

    /// Waits until the worker's log says `needle`; panics with the log if it does not within
    /// `timeout`.
    pub fn wait_says(&self, needle: &str, timeout: Duration) {
        assert!(
            wait_until(timeout, || self.log_text().contains(needle)),
            "worker {} never said {needle:?} within {timeout:?}:\n{}",
            self.name,
            self.log_text()
        );
    }

    /// The worker's default workspace directory on disk.
    pub fn workspace(&self) -> PathBuf {
        self.state.join("workspaces/default")
    }
}

/// Options for the brain under test.
#[derive(Debug, Clone)]
pub struct BrainOptions {
    pub lost_after: Duration,
    /// More `brain serve` arguments (policy, limits).
    pub extra_args: Vec<String>,
    /// The brain's config file (TOML), written to `<data>/config.toml` before it starts.
    pub config: Option<String>,
    /// Environment for the next `brain serve` only (taken when it starts).
    pub env: Vec<(String, String)>,
    /// The address `brain serve` listens on (its port is chosen at the first start).
    pub listen_host: String,
    /// More `brain init` arguments (e.g. `--host` for another address).
    pub init_args: Vec<String>,
    /// Where the cluster's temp dir goes (default: the system's temp dir).
    pub parent: Option<PathBuf>,
    /// Serve the web API on loopback (`--web-listen`; its port is chosen at the first start
    /// and kept across restarts, as the gRPC port is).
    pub web: bool,
    /// Run `brain serve` as this uid (and gid), owning the cluster's directory: how a test
    /// run by root sees what a brain that is not root does.
    pub run_as: Option<u32>,
    /// Where `brain` and `worker` are (default: [`Bins::locate`]): a benchmark's baseline
    /// built from another commit.
    pub bin_dir: Option<PathBuf>,
}

impl Default for BrainOptions {
    fn default() -> Self {
        Self {
            lost_after: Duration::from_secs(3),
            extra_args: Vec::new(),
            config: None,
            env: Vec::new(),
            listen_host: "127.0.0.1".into(),
            init_args: Vec::new(),
            parent: None,
            web: false,
            run_as: None,
            bin_dir: None,
        }
    }
}

/// A brain (and its workers) in a temp dir.
pub struct Cluster {
    pub bins: Bins,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    pub data: PathBuf,
    pub port: u16,
    /// The web API's port (0 before the first start, or without `BrainOptions::web`).
    pub web_port: u16,
    pub opts: BrainOptions,
    pub brain: Option<Proc>,
}

impl Cluster {
    pub fn start() -> Self {
        Self::start_with(BrainOptions::default())
    }

    /// `brain init` and `brain serve` on 127.0.0.1 with an ephemeral port.
    pub fn start_with(opts: BrainOptions) -> Self {
        let bins = opts
            .bin_dir
            .as_deref()
            .map(Bins::at)
            .unwrap_or_else(Bins::locate);
        let tmp = tempfile::Builder::new()
            .prefix("tether-test-")
            .tempdir_in(opts.parent.clone().unwrap_or_else(std::env::temp_dir))
            .expect("temp dir");
        let dir = tmp.path().to_path_buf();
        let keep = std::env::var_os("TETHER_KEEP_TEST_DIR").is_some();
        let tmp = if keep {
            eprintln!("keeping test dir {}", dir.display());
            let _ = tmp.keep();
            None
        } else {
            Some(tmp)
        };
        let data = dir.join("data");
        let mut c = Self {
            bins,
            dir,
            _tmp: tmp,
            data,
            port: 0,
            web_port: 0,
            opts,
            brain: None,
        };
        let mut init = vec!["init"];
        init.extend(c.opts.init_args.iter().map(String::as_str));
        let out = c.brain_cli(&init);
        assert!(out.status.success(), "brain init failed: {}", text(&out));
        if let Some(config) = &c.opts.config {
            std::fs::write(c.data.join("config.toml"), config).expect("write config");
        }
        if let Some(uid) = c.opts.run_as {
            chown_tree(&c.dir, uid);
        }
        c.start_brain().expect("brain start");
        c
    }

    /// `worker doctor`'s line for a mechanism on this host, and whether it is active.
    pub fn doctor(&self, mechanism: &str) -> (bool, String) {
        let out = Command::new(&self.bins.worker)
            .args(["doctor", "--state"])
            .arg(self.dir.join("doctor"))
            .output()
            .expect("worker doctor runs");
        assert!(out.status.success(), "{}", text(&out));
        let line = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.split_whitespace().next() == Some(mechanism))
            .unwrap_or_else(|| panic!("doctor says nothing of {mechanism}: {}", text(&out)))
            .to_string();
        (line.contains(" active "), line)
    }

    /// The brain's URL.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The web API's URL (with `BrainOptions::web`).
    pub fn web_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.web_port)
    }

    /// Starts `brain serve` (on the same port as before, after the first start).
    pub fn start_brain(&mut self) -> anyhow::Result<()> {
        let addr_file = self.data.join("brain.addr");
        let _ = std::fs::remove_file(&addr_file);
        let web_file = self.data.join("brain.web");
        let _ = std::fs::remove_file(&web_file);
        let mut cmd = Command::new(&self.bins.brain);
        cmd.arg("--data")
            .arg(&self.data)
            .arg("serve")
            .arg("--listen")
            .arg(format!("{}:{}", self.opts.listen_host, self.port))
            .arg("--lost-after")
            .arg(format!("{}ms", self.opts.lost_after.as_millis()))
            .args(&self.opts.extra_args)
            .args(
                self.opts
                    .web
                    .then(|| {
                        [
                            "--web-listen".to_string(),
                            format!("127.0.0.1:{}", self.web_port),
                        ]
                    })
                    .into_iter()
                    .flatten(),
            )
            .env("RUST_LOG", test_log())
            .envs(std::mem::take(&mut self.opts.env));
        if let Some(uid) = self.opts.run_as {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(uid).env("HOME", &self.dir);
        }
        let mut proc = Proc::spawn(cmd, &self.dir.join("brain.log"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(s) = std::fs::read_to_string(&addr_file)
                && let Ok(a) = s.trim().parse::<std::net::SocketAddr>()
            {
                self.port = a.port();
                if self.opts.web {
                    let s = std::fs::read_to_string(&web_file).unwrap_or_default();
                    let a: std::net::SocketAddr =
                        s.trim().parse().expect("brain.web holds the web address");
                    self.web_port = a.port();
                }
                break;
            }
            if !proc.is_running() {
                bail!("brain exited during start-up:\n{}", proc.log_text());
            }
            if Instant::now() > deadline {
                bail!("brain not ready in 20s:\n{}", proc.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.brain = Some(proc);
        Ok(())
    }

    /// SIGKILL the brain.
    pub fn kill_brain(&mut self) {
        if let Some(mut p) = self.brain.take() {
            p.kill();
        }
    }

    /// A task's status as `brain tasks` shows it (None if the brain does not answer).
    pub fn task_status(&self, id: &str) -> Option<String> {
        let out = self.brain_cli(&["tasks"]);
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
    }

    /// Waits until a task's status is one of `want`, and returns it; panics (with the
    /// brain's log) after `timeout`, or as soon as the task ends in another status. `brain
    /// task wait` follows the task's log, so nothing is polled while the brain answers; a
    /// brain that is down (being restarted by the test) is asked again.
    pub fn wait_status(&self, id: &str, want: &[&str], timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let until = want.join(",");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let secs = format!("{}ms", left.as_millis().max(1));
            let out = self.brain_cli(&[
                "task",
                "wait",
                id,
                "--until",
                &until,
                "--timeout",
                &secs,
                "--json",
            ]);
            let answer: Option<serde_json::Value> = serde_json::from_slice(&out.stdout).ok();
            match (out.status.code(), answer) {
                (Some(0), Some(a)) => return a["status"].as_str().unwrap_or_default().into(),
                (Some(1), Some(a)) => panic!(
                    "task {id} ended {} ({}), not {want:?}; brain log:\n{}",
                    a["status"],
                    a["reason"],
                    self.brain_log()
                ),
                _ => {}
            }
            assert!(
                Instant::now() < deadline,
                "task {id} did not reach {want:?} within {timeout:?} (it is {:?}; {}); brain log:\n{}",
                self.task_status(id),
                text(&out),
                self.brain_log()
            );
            // The brain did not answer (a test restarting it): ask again shortly.
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A task's log as JSON records (`brain task log ID --json`).
    pub fn task_log_json(&self, id: &str) -> Vec<serde_json::Value> {
        let out = self.brain_cli(&["task", "log", id, "--json"]);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON record"))
            .collect()
    }

    /// A task as `brain task show ID --json` gives it.
    pub fn task_show(&self, id: &str) -> serde_json::Value {
        let out = self.brain_cli(&["task", "show", id, "--json"]);
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).expect("a JSON task")
    }

    pub fn brain_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("brain.log")).unwrap_or_default()
    }

    /// Runs `brain --data DIR ARGS...` and waits for it.
    pub fn brain_cli(&self, args: &[&str]) -> Output {
        self.brain_cli_cmd(args).output().expect("run brain")
    }

    /// The command for `brain --data DIR ARGS...`, to run or spawn.
    pub fn brain_cli_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.bins.brain);
        cmd.arg("--data").arg(&self.data).args(args);
        cmd.env_remove("TETHER_BRAIN").env_remove("TETHER_IDENTITY");
        cmd
    }

    /// `brain machines --json` (with `--all`: released and failed ones too).
    pub fn machines(&self, all: bool) -> Vec<serde_json::Value> {
        let mut args = vec!["machines", "--json"];
        if all {
            args.push("--all");
        }
        let out = self.brain_cli(&args);
        assert!(out.status.success(), "brain machines: {}", text(&out));
        serde_json::from_slice(&out.stdout).expect("machines JSON")
    }

    /// The machine that is ready, its worker connected: its id and its worker's id.
    pub fn ready_machine(&self) -> (String, String) {
        let m = self
            .machines(true)
            .into_iter()
            .find(|m| m["state"] == "ready")
            .expect("a ready machine");
        assert_eq!(m["connected"], true, "{m}");
        let field = |k: &str| m[k].as_str().unwrap().to_string();
        (field("id"), field("worker_id"))
    }

    /// One machine's record, as `brain machines --json --all` shows it.
    pub fn machine(&self, id: &str) -> serde_json::Value {
        self.machines(true)
            .into_iter()
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("no machine {id} in `brain machines --all`"))
    }

    /// Waits until machine `id` is in `state` and returns its record; panics with the record
    /// and the brain's log if it is not within `timeout`.
    pub fn wait_machine_state(
        &self,
        id: &str,
        state: &str,
        timeout: Duration,
    ) -> serde_json::Value {
        assert!(
            wait_until(timeout, || self.machine(id)["state"] == state),
            "machine {id} not {state} within {timeout:?}: {}\n{}",
            self.machine(id),
            self.brain_log()
        );
        self.machine(id)
    }

    /// Waits until the brain's log says `needle`; panics with the log if it does not within
    /// `timeout`.
    pub fn wait_brain_says(&self, needle: &str, timeout: Duration) {
        assert!(
            wait_until(timeout, || self.brain_log().contains(needle)),
            "the brain never said {needle:?} within {timeout:?}:\n{}",
            self.brain_log()
        );
    }

    /// Waits until machine `id` is settled after a crash in its creation: adopted (ready,
    /// its worker connected) or closed (released or failed). Returns its record; panics
    /// with it if that does not happen within `timeout`.
    pub fn wait_settled(&self, id: &str, timeout: Duration) -> serde_json::Value {
        let settled = |m: &serde_json::Value| {
            (m["state"] == "ready" && m["connected"] == true)
                || m["state"] == "released"
                || m["state"] == "failed"
        };
        assert!(
            wait_until(timeout, || settled(&self.machine(id))),
            "machine {id} not settled: {}\n{}",
            self.machine(id),
            self.brain_log()
        );
        self.machine(id)
    }

    /// Mints a join token; returns (token, ca_hash).
    pub fn token(&self, extra: &[&str]) -> (String, String) {
        let mut args = vec!["token", "create"];
        args.extend_from_slice(extra);
        let out = self.brain_cli(&args);
        assert!(out.status.success(), "token create failed: {}", text(&out));
        let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let ca_hash = stderr
            .split_whitespace()
            .skip_while(|w| *w != "--ca-hash")
            .nth(1)
            .expect("ca hash in the join line")
            .to_string();
        (token, ca_hash)
    }

    /// The command line of `worker join` with a fresh token, to run or tweak.
    pub fn join_cmd(&self, name: &str, token: &str, ca_hash: &str) -> Command {
        let mut cmd = Command::new(&self.bins.worker);
        cmd.arg("join")
            .arg("--brain")
            .arg(self.url())
            .arg("--token")
            .arg(token)
            .arg("--ca-hash")
            .arg(ca_hash)
            .arg("--name")
            .arg(name)
            .arg("--state")
            .arg(self.dir.join(name))
            .env("RUST_LOG", test_log());
        cmd
    }

    /// Enrols a worker named `name` and waits until the brain shows it connected.
    pub fn join_worker(&self, name: &str) -> Worker {
        self.join_worker_with(name, &[])
    }

    /// [`Cluster::join_worker`] with extra environment for the worker process.
    /// Joins a worker whose token carries these labels (`k=v`).
    pub fn join_worker_labeled(&self, name: &str, labels: &[&str]) -> Worker {
        let extra: Vec<&str> = labels.iter().flat_map(|l| ["--label", *l]).collect();
        self.join_worker_token(name, &extra, &[])
    }

    pub fn join_worker_with(&self, name: &str, env: &[(&str, &str)]) -> Worker {
        self.join_worker_token(name, &[], env)
    }

    fn join_worker_token(&self, name: &str, token_args: &[&str], env: &[(&str, &str)]) -> Worker {
        let (token, ca_hash) = self.token(token_args);
        let mut cmd = self.join_cmd(name, &token, &ca_hash);
        for (k, v) in env {
            cmd.env(k, v);
        }
        self.spawn_worker(name, cmd)
    }

    /// Starts a `worker join` command made with [`Cluster::join_cmd`] (perhaps wrapped, e.g.
    /// to run as another user) and waits until the brain shows it connected. Its state dir
    /// is `<dir>/<name>`.
    pub fn spawn_worker(&self, name: &str, cmd: Command) -> Worker {
        let state = self.dir.join(name);
        let proc = Proc::spawn(cmd, &state.with_extension("log")).expect("spawn worker");
        let mut w = Worker {
            name: name.to_string(),
            id: String::new(),
            state,
            proc: Some(proc),
        };
        let id = self
            .wait_for_state(name, "connected", Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{e}\nworker log:\n{}", w.log_text()));
        w.id = id;
        w
    }

    /// Starts `worker run` again with the stored identity.
    pub fn restart_worker(&self, w: &mut Worker) {
        self.restart_worker_with(w, &[]);
    }

    /// Starts `worker run ARGS...` again with the stored identity.
    pub fn restart_worker_with(&self, w: &mut Worker, args: &[&str]) {
        w.kill();
        let mut cmd = Command::new(&self.bins.worker);
        cmd.arg("run")
            .arg("--state")
            .arg(&w.state)
            .args(args)
            .env("RUST_LOG", test_log());
        w.proc = Some(Proc::spawn(cmd, &w.state.with_extension("log")).expect("spawn worker"));
    }

    /// `brain run --plan PLAN --worker WORKER`, and the task id it printed.
    pub fn run_plan(&self, plan: &Path, worker: &str) -> String {
        let out = self.brain_cli(&["run", "--plan", plan.to_str().unwrap(), "--worker", worker]);
        assert!(out.status.success(), "brain run --plan: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `brain workers --json`.
    pub fn workers(&self) -> Vec<serde_json::Value> {
        let out = self.brain_cli(&["workers", "--json"]);
        assert!(out.status.success(), "brain workers failed: {}", text(&out));
        serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).expect("workers json")
    }

    /// The state of the worker with this name or id, as `brain workers` shows it.
    pub fn worker_state(&self, name_or_id: &str) -> Option<String> {
        self.workers()
            .into_iter()
            .find(|w| w["name"] == name_or_id || w["id"] == name_or_id)
            .and_then(|w| w["state"].as_str().map(str::to_string))
    }

    /// Polls until the named worker is in `state`; returns its id.
    pub fn wait_for_state(
        &self,
        name_or_id: &str,
        state: &str,
        timeout: Duration,
    ) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            // A revoked worker's name may be another's now: any of that name in the state.
            let named: Vec<serde_json::Value> = self
                .workers()
                .into_iter()
                .filter(|w| w["name"] == name_or_id || w["id"] == name_or_id)
                .collect();
            if let Some(w) = named.iter().find(|w| w["state"] == state) {
                return Ok(w["id"].as_str().unwrap_or_default().to_string());
            }
            if let Some(w) = named.last() {
                last = w["state"].as_str().map(str::to_string);
            }
            if Instant::now() > deadline {
                bail!(
                    "worker {name_or_id} not {state} within {timeout:?} (last state {last:?})\nbrain log:\n{}",
                    self.brain_log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill_brain();
        // Processes the brain started on its own (provisioned workers) name the test dir in
        // their command line; none may outlive the test.
        for pid in pids_mentioning(&self.dir) {
            signal(pid, rustix::process::Signal::KILL);
        }
    }
}

/// One line of a replayed model transcript (`--model replay:FILE`): an answer calling `tool`
/// with `args`.
pub fn replay_turn(n: usize, tool: &str, args: serde_json::Value) -> String {
    serde_json::json!({
        "message": {"role": "assistant", "content": format!("step {n}"), "tool_calls": [
            {"id": format!("call_{n}"), "name": tool, "arguments": args.to_string()}
        ]},
        "usage": {"prompt_tokens": 100, "completion_tokens": 10}
    })
    .to_string()
}

/// Waits until `f` is true or `timeout` passes; returns whether it became true.
/// Sends `sig` to process `pid`; a process already gone is no error.
pub fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(p) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(p, sig);
    }
}

pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// [`wait_until`] for an async condition, polled on the caller's runtime.
pub async fn wait_until_async<F: std::future::Future<Output = bool>>(
    timeout: Duration,
    mut f: impl FnMut() -> F,
) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A command's standard output, as text.
/// Runs `cmd` with its stdout a pipe whose reader is gone before anything is written, and
/// asserts it ends as every command must then: quietly (no panic, no "broken pipe"), with
/// 141. `what` names it in a failure.
pub fn assert_quiet_into_a_closed_pipe(what: &str, cmd: &mut std::process::Command) {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(!err.to_lowercase().contains("broken pipe"), "{what}: {err}");
    assert_eq!(out.status.code(), Some(141), "{what}: {err}");
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A 64-bit integer of the API's JSON: a decimal string (proto3's JSON mapping, which the
/// API and `brain task log --json` follow), or a number where the CLI writes one.
pub fn json_u64(v: &serde_json::Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str()?.parse().ok())
}

/// stdout and stderr of a finished command, for assertion messages.
pub fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The log filter for the processes a test starts.
fn test_log() -> String {
    std::env::var("TETHER_TEST_LOG").unwrap_or_else(|_| "info".into())
}

/// Skips the calling test because `peer` (`docker`, `compose`, `sshd`, `moto`, `landlock`,
/// `cgroup`, …) cannot run here, saying why. Where `TETHER_REQUIRE_PEERS` names the peer
/// (comma-separated, or `all`) — `.ci/run` sets it for every peer it installs — a missing
/// peer is a broken install and the test fails instead. The line goes past the test
/// harness's output capture, and each test binary ends with one summary of its skips.
pub fn skip(peer: &str, why: &str) {
    if peer_required(peer) {
        panic!(
            "{peer} is required here (TETHER_REQUIRE_PEERS={}) but cannot run: {why}",
            std::env::var("TETHER_REQUIRE_PEERS").unwrap_or_default()
        );
    }
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    let line = format!("SKIPPED {test}: no {peer} here: {why}");
    {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{line}");
    }
    let mut skipped = SKIPPED.locked();
    if skipped.is_empty() {
        // SAFETY: registering a plain `extern "C" fn` with no captured state.
        unsafe {
            libc::atexit(print_skipped);
        }
    }
    skipped.push(line);
}

/// Whether `TETHER_REQUIRE_PEERS` asks for `peer`.
pub fn peer_required(peer: &str) -> bool {
    names_peer(
        &std::env::var("TETHER_REQUIRE_PEERS").unwrap_or_default(),
        peer,
    )
}

/// Whether a comma-separated list of peers names `peer` (or is `all`).
fn names_peer(list: &str, peer: &str) -> bool {
    list.split(',')
        .map(str::trim)
        .any(|p| p == peer || p == "all")
}

static SKIPPED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

extern "C" fn print_skipped() {
    use std::io::Write;
    let skipped = SKIPPED.locked();
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "\n{} test(s) of {} skipped because a peer cannot run here (TETHER_REQUIRE_PEERS=PEER makes that a failure):",
        skipped.len(),
        std::env::args().next().unwrap_or_default()
    );
    for l in skipped.iter() {
        let _ = writeln!(err, "  {l}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_list_of_required_peers_is_read_exactly() {
        use super::names_peer;
        assert!(names_peer("sshd, moto", "moto"));
        assert!(names_peer("all", "docker"));
        assert!(!names_peer("sshd", "ssh"));
        assert!(!names_peer("", "docker"));
    }
}
