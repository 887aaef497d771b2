//! Running one command for the brain: in its own process group, in the workspace, with a
//! scrubbed environment, streamed output capped per call, and the whole group killed on
//! timeout or cancel so nothing is left behind.

use shared::locks::Lock;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use proto::{ExecExit, ExecOutput, ExecStart, OutputStream, WorkerMessage, worker_message};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::sandbox::StartError;
use crate::sandbox::spawnd::resolve_program;

/// Environment variables passed through to commands; everything else is dropped so the
/// worker's own secrets are never inherited.
const ENV_ALLOW: &[&str] = &[
    "PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "TMPDIR",
];
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How long to keep reading output after the command exits, for pipes still held open by a
/// background child.
const DRAIN_GRACE: Duration = Duration::from_millis(250);
const CHUNK: usize = 32 * 1024;

/// Why a call's command was not started.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no command given")]
    NoCommand,
    #[error(transparent)]
    Path(#[from] shared::paths::Error),
    #[error(
        "working directory {0:?} does not exist in the workspace; leave the working directory out to run at the workspace's root"
    )]
    NoCwd(String),
    #[error("the brain sent an environment variable this worker does not set: {0:?}")]
    Env(String),
    #[error("cannot make the call's network namespace: {0}")]
    Netns(#[source] std::io::Error),
    #[error("cannot start the call's egress proxy: {0}")]
    Proxy(#[source] std::io::Error),
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::ConfineError),
}

fn msg(m: worker_message::Msg) -> WorkerMessage {
    WorkerMessage { msg: Some(m) }
}

fn exit_with_error(call_id: u64, code: i32, error: String) -> WorkerMessage {
    msg(worker_message::Msg::ExecExit(ExecExit {
        call_id,
        code: Some(code),
        error,
        ..Default::default()
    }))
}

/// Runs `start` under `workspaces_root`, sending output and then exactly one exit message.
pub async fn run(
    start: ExecStart,
    workspaces_root: &Path,
    out: mpsc::Sender<WorkerMessage>,
    cancel: CancellationToken,
) {
    run_with(start, workspaces_root, out, cancel, None, None).await
}

/// What confines a worker's commands, and the way their egress reaches the brain.
#[derive(Clone)]
pub struct Confinement {
    pub sandbox: std::sync::Arc<crate::sandbox::Sandbox>,
    pub link: crate::egress::Link,
}

/// Called with the command's process group id right after it starts.
pub type OnSpawn = Box<dyn FnOnce(i32) + Send>;

/// [`run`], telling `on_spawn` the process group of the command once it exists.
pub async fn run_with(
    start: ExecStart,
    workspaces_root: &Path,
    out: mpsc::Sender<WorkerMessage>,
    cancel: CancellationToken,
    on_spawn: Option<OnSpawn>,
    confinement: Option<&Confinement>,
) {
    let call_id = start.call_id;
    let sandbox = confinement.map(|c| &*c.sandbox).filter(|s| s.enabled());
    let link = confinement.map(|c| &c.link);
    // A call behind the egress proxy: its namespace and proxy live as long as the call.
    let net = match egress_net(&start, sandbox, link, &out) {
        Ok(n) => n,
        Err(e) => {
            let _ = out.send(exit_with_error(call_id, 125, e.to_string())).await;
            return;
        }
    };
    let ns = net.as_ref();
    let (exit, confined) = match prepare(&start, workspaces_root, sandbox, true, ns) {
        Ok(launch) => {
            let fallback = || prepare(&start, workspaces_root, sandbox, false, ns);
            execute(launch, fallback, &start, &out, cancel, on_spawn).await
        }
        Err(e) => (exit_with_error(call_id, 125, e.to_string()), Confined::None),
    };
    drop(net);
    // A spawner goes back before the answer, so the caller's next call finds it idle (its
    // leaves were emptied at the command's end: this only checks them and files it).
    let confined = match confined {
        Confined::Lease(l) => {
            drop(l);
            Confined::None
        }
        other => other,
    };
    let _ = out.send(exit).await;
    // Tidying the call's own cgroup and temp dir waits until the caller has its answer.
    if !matches!(confined, Confined::None) {
        tokio::task::spawn_blocking(move || drop(confined));
    }
}

/// How a call's command is started: forked and confined on its own, or by the workspace's
/// pre-confined spawner.
enum Launch {
    Fork(Box<tokio::process::Command>, Option<crate::sandbox::Guard>),
    /// The spawner lent to the call, and the encoded request.
    Spawner(crate::sandbox::Lease, Vec<u8>),
}

/// What holds a running call's confinement: its own cgroup guard, or the spawner lent to it.
enum Confined {
    None,
    Guard(crate::sandbox::Guard),
    Lease(crate::sandbox::Lease),
}

impl Confined {
    fn guard(&self) -> Option<&crate::sandbox::Guard> {
        match self {
            Confined::None => None,
            Confined::Guard(g) => Some(g),
            Confined::Lease(l) => l.guard(),
        }
    }
}

/// The network namespace and running proxy of a call behind the egress proxy.
type EgressNet = (crate::egress::Net, tokio_util::sync::DropGuard);

fn egress_net(
    start: &ExecStart,
    sandbox: Option<&crate::sandbox::Sandbox>,
    link: Option<&crate::egress::Link>,
    out: &mpsc::Sender<WorkerMessage>,
) -> Result<Option<EgressNet>, Error> {
    let Some(policy) = start.egress.clone() else {
        return Ok(None);
    };
    let (Some(_), Some(link)) = (sandbox.filter(|s| s.egress()), link) else {
        return Err(crate::sandbox::ConfineError::EgressUnavailable.into());
    };
    let net = crate::egress::Net::new().map_err(Error::Netns)?;
    let serving = crate::egress::serve(&net, policy, start.call_id, link.clone(), out.clone())
        .map_err(Error::Proxy)?;
    Ok(Some((net, serving)))
}

/// Whether `name` may be set in a command's environment from the brain's `ExecStart.env`.
fn env_name_ok(name: &str) -> bool {
    let mut b = name.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && !ENV_ALLOW.contains(&name)
        && name.len() <= 128
}

fn prepare(
    start: &ExecStart,
    root: &Path,
    sandbox: Option<&crate::sandbox::Sandbox>,
    spawner: bool,
    net: Option<&EgressNet>,
) -> Result<Launch, Error> {
    let argv0 = start.argv.first().ok_or(Error::NoCommand)?;
    let ws = crate::state::workspace(root, &start.workspace)?;
    if let Some(sb) = sandbox {
        sb.hand_over(&ws);
    }
    let cwd = shared::paths::confine(&ws, &start.cwd)?;
    if !cwd.is_dir() {
        return Err(Error::NoCwd(start.cwd.clone()));
    }
    let path_var = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
    let mut env: Vec<(std::ffi::OsString, std::ffi::OsString)> = ENV_ALLOW
        .iter()
        .filter(|k| **k != "PATH")
        .filter_map(|k| std::env::var_os(k).map(|v| ((*k).into(), v)))
        .collect();
    env.push(("PATH".into(), path_var.clone()));
    for (k, v) in &start.env {
        if !env_name_ok(k) || v.contains('\0') {
            return Err(Error::Env(k.clone()));
        }
        env.push((k.into(), v.into()));
    }
    if let (Some((n, _)), Some(sb), Some(policy)) = (net, sandbox, &start.egress) {
        let bundle = sb.call_file(
            &ws,
            &cwd,
            "tether-egress-ca.pem",
            &crate::egress::ca_bundle(&policy.ca_pem),
        )?;
        for (k, v) in crate::egress::proxy_env(n.port(), &bundle) {
            env.push((k.into(), v.into()));
        }
    }
    let limits = start.limits.unwrap_or_default();
    // A call behind the egress proxy is started on its own, in its namespace.
    if let Some(sb) = sandbox.filter(|_| spawner && net.is_none())
        && let Some((lease, req)) = sb.lease(&ws, &cwd, &limits, &start.argv, &env)
    {
        return Ok(Launch::Spawner(lease, req));
    }
    // Confined commands are spawned with fork + exec anyway (the sandbox needs a pre-exec
    // step), and must find the program as the command's user: let execvp look it up.
    let program = if sandbox.is_some() {
        std::path::PathBuf::from(argv0)
    } else {
        resolve_program(argv0.as_ref(), &path_var)
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg0(argv0)
        .args(&start.argv[1..])
        .current_dir(&cwd)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let guard = match sandbox {
        // The sandbox starts a new session (and so a process group) in the child.
        Some(sb) => {
            let ns = net.map(|(n, _)| n.ns_fd());
            Some(sb.confine(&ws, &cwd, &limits, ns, &mut cmd)?)
        }
        None => {
            cmd.process_group(0);
            None
        }
    };
    Ok(Launch::Fork(Box::new(cmd), guard))
}

/// Shared output budget of one call: bytes still allowed, and bytes dropped past the cap;
/// and whether the output reported a write past the file size limit.
struct Budget {
    left: u64,
    dropped: u64,
    efbig: bool,
}

/// How the C library words EFBIG, which a write past the file size limit fails with.
const EFBIG_TEXT: &[u8] = b"File too large";

async fn pump(
    mut pipe: impl tokio::io::AsyncRead + Unpin,
    stream: OutputStream,
    call_id: u64,
    budget: std::sync::Arc<std::sync::Mutex<Budget>>,
    out: mpsc::Sender<WorkerMessage>,
    stop: CancellationToken,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        // Only the wait for more output is cut short by `stop`; output already read is
        // always sent.
        let n = tokio::select! {
            r = pipe.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = stop.cancelled() => return,
        };
        let efbig = buf[..n].windows(EFBIG_TEXT.len()).any(|w| w == EFBIG_TEXT);
        let keep = {
            let mut b = budget.locked();
            b.efbig |= efbig;
            let keep = (n as u64).min(b.left) as usize;
            b.left -= keep as u64;
            b.dropped += (n - keep) as u64;
            keep
        };
        if keep > 0 {
            let m = msg(worker_message::Msg::ExecOutput(ExecOutput {
                call_id,
                stream: stream as i32,
                data: buf[..keep].to_vec(),
            }));
            if out.send(m).await.is_err() {
                return;
            }
        }
    }
}

/// Kills the command's process group when dropped: whatever way the call ends (exit,
/// timeout, cancel, or the worker shutting down and dropping the task), nothing it started
/// is left running.
struct GroupGuard(i32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        kill_group(self.0);
    }
}

fn kill_group(pgid: i32) {
    if let Some(group) = rustix::process::Pid::from_raw(pgid) {
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
    }
}

/// A command's output pipe: ours from a fork, or handed to the spawner.
type Pipe = Box<dyn tokio::io::AsyncRead + Unpin + Send>;

/// Waits for the command: our child, or the spawner's (its exit comes from the spawner).
async fn wait(
    child: &mut Option<tokio::process::Child>,
    confined: &mut Confined,
) -> std::io::Result<std::process::ExitStatus> {
    match (child, confined) {
        (Some(c), _) => c.wait().await,
        (None, Confined::Lease(l)) => l.wait().await,
        (None, _) => Err(std::io::Error::other("no command to wait for")),
    }
}

/// A command started: our child or the spawner's, its pipes and process group.
struct Running {
    child: Option<tokio::process::Child>,
    stdout: Option<Pipe>,
    stderr: Option<Pipe>,
    pgid: i32,
    confined: Confined,
}

/// Starts the command: by the workspace's spawner when there is one; when that spawner is
/// gone, the command (not started) is started the ordinary way. A command that cannot start
/// is its exit message.
async fn spawn(
    launch: Launch,
    fallback: impl FnOnce() -> Result<Launch, Error>,
    start: &ExecStart,
) -> Result<Running, (WorkerMessage, Confined)> {
    let call_id = start.call_id;
    let cannot_start = |e: std::io::Error| {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => 127,
            std::io::ErrorKind::PermissionDenied => 126,
            _ => 125,
        };
        exit_with_error(
            call_id,
            code,
            format!("cannot start {:?}: {e}", start.argv[0]),
        )
    };
    let launch = match launch {
        Launch::Spawner(mut lease, req) => match lease.start(&req).await {
            Ok(s) => Ok((lease, s)),
            Err(StartError::Refused(e)) => return Err((cannot_start(e), Confined::Lease(lease))),
            Err(StartError::Unsure(why)) => {
                tracing::warn!(call_id, %why, "a spawner failed during a start");
                return Err((exit_with_error(call_id, 125, why), Confined::Lease(lease)));
            }
            Err(StartError::Lost(why)) => {
                tracing::warn!(call_id, %why, "the workspace's spawner is gone; starting the command the ordinary way");
                tokio::task::spawn_blocking(move || drop(lease));
                match fallback() {
                    Ok(l) => Err(l),
                    Err(e) => {
                        return Err((exit_with_error(call_id, 125, e.to_string()), Confined::None));
                    }
                }
            }
        },
        other => Err(other),
    };
    Ok(match launch {
        Ok((lease, s)) => Running {
            child: None,
            stdout: Some(Box::new(s.stdout)),
            stderr: Some(Box::new(s.stderr)),
            pgid: s.pid,
            confined: Confined::Lease(lease),
        },
        Err(Launch::Fork(mut cmd, guard)) => {
            let confined = guard.map_or(Confined::None, Confined::Guard);
            let mut c = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => return Err((cannot_start(e), confined)),
            };
            let stdout = c.stdout.take().map(|p| Box::new(p) as Pipe);
            let stderr = c.stderr.take().map(|p| Box::new(p) as Pipe);
            let pgid = c.id().map(|p| p as i32).unwrap_or(0);
            Running {
                child: Some(c),
                stdout,
                stderr,
                pgid,
                confined,
            }
        }
        Err(Launch::Spawner(..)) => unreachable!("a spawner launch was started above"),
    })
}

async fn execute(
    launch: Launch,
    fallback: impl FnOnce() -> Result<Launch, Error>,
    start: &ExecStart,
    out: &mpsc::Sender<WorkerMessage>,
    cancel: CancellationToken,
    on_spawn: Option<OnSpawn>,
) -> (WorkerMessage, Confined) {
    let call_id = start.call_id;
    let (mut child, stdout, stderr, pgid, mut confined) = match spawn(launch, fallback, start).await
    {
        Ok(r) => (r.child, r.stdout, r.stderr, r.pgid, r.confined),
        Err(refused) => return refused,
    };
    let kill_all = |pgid: i32, confined: &Confined| {
        kill_group(pgid);
        if let Some(g) = confined.guard() {
            g.kill_all();
        }
    };
    let _group = GroupGuard(pgid);
    if let Some(f) = on_spawn {
        f(pgid);
    }
    let stop_reading = CancellationToken::new();
    let cap = match start.output_cap_bytes {
        0 => shared::limits::DEFAULT_OUTPUT_CAP_BYTES,
        n => n.min(shared::limits::MAX_OUTPUT_CAP_BYTES),
    };
    let budget = std::sync::Arc::new(std::sync::Mutex::new(Budget {
        left: cap,
        dropped: 0,
        efbig: false,
    }));
    // Both pipes are read inside this task (no extra tasks to spawn and join per command).
    let pumps = async {
        let a = async {
            if let Some(p) = stdout {
                pump(
                    p,
                    OutputStream::Stdout,
                    call_id,
                    budget.clone(),
                    out.clone(),
                    stop_reading.clone(),
                )
                .await;
            }
        };
        let b = async {
            if let Some(p) = stderr {
                pump(
                    p,
                    OutputStream::Stderr,
                    call_id,
                    budget.clone(),
                    out.clone(),
                    stop_reading.clone(),
                )
                .await;
            }
        };
        tokio::join!(a, b);
    };
    tokio::pin!(pumps);
    let timeout = Duration::from_millis(if start.timeout_ms == 0 {
        shared::limits::DEFAULT_EXEC_TIMEOUT_MS
    } else {
        start.timeout_ms
    });
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let (mut timed_out, mut cancelled, mut drained) = (false, false, false);
    let status = loop {
        tokio::select! {
            _ = &mut pumps, if !drained => drained = true,
            s = wait(&mut child, &mut confined) => break s,
            _ = &mut deadline => {
                timed_out = true;
                kill_all(pgid, &confined);
                break wait(&mut child, &mut confined).await;
            }
            _ = cancel.cancelled() => {
                cancelled = true;
                kill_all(pgid, &confined);
                break wait(&mut child, &mut confined).await;
            }
        }
    };
    // Output written before the exit is sent before the exit message. A background child
    // that keeps a pipe open gets a short grace, then we stop waiting for more (what was read
    // is still sent), and the group is killed.
    if !drained {
        tokio::select! {
            _ = &mut pumps => {}
            _ = tokio::time::sleep(DRAIN_GRACE) => {
                stop_reading.cancel();
                (&mut pumps).await;
            }
        }
    }
    kill_all(pgid, &confined);
    let (dropped, efbig) = {
        let b = budget.locked();
        (b.dropped, b.efbig)
    };
    let mut exit = ExecExit {
        call_id,
        timed_out,
        cancelled,
        dropped_bytes: dropped,
        ..Default::default()
    };
    match status {
        Ok(st) => {
            use std::os::unix::process::ExitStatusExt;
            exit.code = st.code();
            exit.signal = st.signal();
        }
        Err(e) => exit.error = format!("waiting for the command failed: {e}"),
    }
    // Which limit ended it, in words: an exit code alone tells the model nothing.
    if let Some(limit) = confined
        .guard()
        .and_then(|g| g.limit_hit(exit.code, exit.signal, efbig))
    {
        tracing::info!(call_id, %limit, "a sandbox limit ended or hampered the command");
        exit.limit = limit;
    }
    (msg(worker_message::Msg::ExecExit(exit)), confined)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run_cmd(argv: &[&str], timeout_ms: u64, cap: u64) -> (Vec<u8>, ExecExit) {
        run_in(argv, "", timeout_ms, cap).await
    }

    async fn run_in(argv: &[&str], cwd: &str, timeout_ms: u64, cap: u64) -> (Vec<u8>, ExecExit) {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(1024);
        let start = ExecStart {
            call_id: 7,
            workspace: "default".into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: cwd.into(),
            timeout_ms,
            output_cap_bytes: cap,
            durable: false,
            limits: None,
            ..Default::default()
        };
        run(start, dir.path(), tx, CancellationToken::new()).await;
        let mut stdout = Vec::new();
        while let Some(m) = rx.recv().await {
            match m.msg {
                Some(worker_message::Msg::ExecOutput(o)) => stdout.extend(o.data),
                Some(worker_message::Msg::ExecExit(e)) => return (stdout, e),
                _ => panic!("unexpected message"),
            }
        }
        panic!("no exit message");
    }

    #[tokio::test]
    async fn output_and_exit_code() {
        let (out, exit) = run_cmd(&["sh", "-c", "echo hi; exit 3"], 5000, 0).await;
        assert_eq!(out, b"hi\n");
        assert_eq!(exit.code, Some(3));
        assert!(!exit.timed_out);
    }

    #[tokio::test]
    async fn a_working_directory_that_is_not_there_is_refused_saying_how_to_run_at_the_root() {
        let (out, exit) = run_in(&["true"], "cart", 5000, 0).await;
        assert!(out.is_empty());
        assert_ne!(exit.code, Some(0));
        assert!(
            exit.error.contains("\"cart\" does not exist")
                && exit.error.contains("leave the working directory out"),
            "{exit:?}"
        );
    }

    #[tokio::test]
    async fn output_is_capped_with_a_count_of_what_was_dropped() {
        let (out, exit) = run_cmd(&["sh", "-c", "head -c 100000 /dev/zero"], 5000, 1000).await;
        assert_eq!(out.len(), 1000);
        assert_eq!(exit.dropped_bytes, 99_000);
    }

    #[tokio::test]
    async fn missing_program_is_127_with_a_message() {
        let (_, exit) = run_cmd(&["no-such-program-xyz"], 5000, 0).await;
        assert_eq!(exit.code, Some(127));
        assert!(exit.error.contains("no-such-program-xyz"), "{}", exit.error);
    }

    #[tokio::test]
    async fn background_children_do_not_outlive_the_command() {
        let (out, exit) = run_cmd(&["sh", "-c", "sleep 300 & echo $!"], 5000, 0).await;
        assert_eq!(exit.code, Some(0));
        let pid: i32 = String::from_utf8(out).unwrap().trim().parse().unwrap();
        let gone = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| {
                    s.rsplit_once(')')
                        .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
                })
                .unwrap_or(true)
        });
        assert!(gone, "background child {pid} survived");
    }

    #[tokio::test]
    async fn arg0_is_kept() {
        let (out, _) = run_cmd(&["sh", "-c", "echo $0"], 5000, 0).await;
        assert_eq!(out, b"sh\n");
    }

    #[tokio::test]
    async fn environment_is_scrubbed() {
        // SAFETY: test-only; no other thread in this test reads the environment concurrently.
        unsafe { std::env::set_var("TETHER_TEST_SECRET", "hunter2") };
        let (out, _) = run_cmd(&["env"], 5000, 0).await;
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("PATH="), "{text}");
    }
}
