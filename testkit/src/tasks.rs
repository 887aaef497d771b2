//! Replayed agent tasks whose commands the test chooses, and the checks the security tests
//! make afterwards: a secret set through the CLI (value on stdin), a task of one command per
//! turn and each command's result from its log, and "the value is nowhere" searches of a
//! directory tree and of every process's environment.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::https::TestCa;
use crate::{BrainOptions, Cluster, replay_turn, text};

/// Whether a worker here can give commands their own network namespace (it needs root: the
/// egress proxy's tests); otherwise says why the calling test is skipped.
pub fn have_netns() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    crate::skip(
        "netns",
        "it needs a root worker to give commands their own network namespace",
    );
    false
}

/// A cluster whose brain trusts `ca` upstream (`[egress] upstream_ca`) and pins each of
/// `names` to 127.0.0.1 (`[egress.resolve]`), plus `more` config.
pub fn egress_cluster(ca: &TestCa, names: &[&str], more: &str) -> Cluster {
    // One file per cluster: tests in one process run at once, each with its own CA.
    let ca_file = std::env::temp_dir().join(format!(
        "tether-egress-ca-{}-{}.pem",
        std::process::id(),
        unique()
    ));
    std::fs::write(&ca_file, ca.pem()).expect("write the CA");
    let resolve: String = names
        .iter()
        .map(|n| format!("\"{n}\" = \"127.0.0.1\"\n"))
        .collect();
    Cluster::start_with(BrainOptions {
        config: Some(format!(
            "{more}\n[egress]\nupstream_ca = [{:?}]\n[egress.resolve]\n{resolve}",
            ca_file.display().to_string()
        )),
        ..Default::default()
    })
}

/// `brain secret set NAME ARGS` with `value` on stdin; panics unless it succeeds.
pub fn set_secret(c: &Cluster, name: &str, value: &str, args: &[&str]) {
    let out = try_set_secret(c, name, value, args);
    assert!(out.status.success(), "secret set: {}", text(&out));
}

/// `brain secret set NAME ARGS` with `value` on stdin, whatever it answers.
/// [`set_secret`] `api`: `value` for `host` on `port` only, given to commands as
/// `$API_TOKEN`.
pub fn set_api_secret(c: &Cluster, value: &str, host: &str, port: u16) {
    let port = port.to_string();
    set_secret(
        c,
        "api",
        value,
        &["--host", host, "--port", &port, "--env", "API_TOKEN"],
    );
}

pub fn try_set_secret(c: &Cluster, name: &str, value: &str, args: &[&str]) -> std::process::Output {
    let mut cmd = c.brain_cli_cmd(&[&["secret", "set", name][..], args].concat());
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start brain secret set");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(value.as_bytes())
        .expect("write the value");
    child.wait_with_output().expect("brain secret set")
}

/// One command's result as the task log holds it.
#[derive(Debug, Clone)]
pub struct Ran {
    pub command: String,
    pub stdout: String,
    pub stderr: String,
    pub exit: Option<i64>,
}

impl Ran {
    /// stdout and stderr together.
    pub fn told(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

fn unique() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A replayed model transcript: one `run_command` of each of `commands` per turn (with
/// `timeout_secs` when given), then `finish`.
pub fn command_turns(commands: &[String], timeout_secs: Option<u64>) -> String {
    let mut turns: Vec<String> = commands
        .iter()
        .enumerate()
        .map(|(i, cmd)| {
            let mut args = serde_json::json!({ "command": cmd });
            if let Some(t) = timeout_secs {
                args["timeout_secs"] = t.into();
            }
            replay_turn(i + 1, "run_command", args)
        })
        .collect();
    turns.push(replay_turn(
        commands.len() + 1,
        "finish",
        serde_json::json!({"summary": "done"}),
    ));
    turns.join("\n")
}

/// `brain run --detach` of a replayed task of `commands` (see [`command_turns`]) on
/// `worker` with more arguments `args`, whatever it answers.
pub fn try_start_commands(
    c: &Cluster,
    worker: &str,
    args: &[&str],
    commands: &[String],
    timeout_secs: Option<u64>,
) -> std::process::Output {
    let file = c.dir.join(format!("t-{}.jsonl", unique()));
    std::fs::write(&file, command_turns(commands, timeout_secs)).expect("write the transcript");
    let model = format!("replay:{}", file.display());
    let mut run = vec![
        "run",
        "--detach",
        "--model",
        &model,
        "--permission",
        "full",
        "--worker",
        worker,
    ];
    run.extend_from_slice(args);
    run.push("run the commands");
    c.brain_cli(&run)
}

/// Starts a replayed task of `commands` (see [`command_turns`]) on `worker` with more
/// `brain run` arguments `args`; gives its id.
pub fn start_commands(c: &Cluster, worker: &str, args: &[&str], commands: &[String]) -> String {
    let out = try_start_commands(c, worker, args, commands, None);
    assert!(out.status.success(), "brain run: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs a replayed task of `commands` (see [`start_commands`]), waits for it to finish, and
/// gives its id and each command's result in order.
pub fn run_commands(
    c: &Cluster,
    worker: &str,
    args: &[&str],
    commands: &[String],
) -> (String, Vec<Ran>) {
    let task = start_commands(c, worker, args, commands);
    let end = c.wait_status(
        &task,
        &["finished", "failed", "stuck", "cancelled"],
        Duration::from_secs(120),
    );
    assert_eq!(end, "finished", "{}", c.brain_log());
    let ran = results(c, &task);
    assert_eq!(ran.len(), commands.len(), "{ran:#?}");
    (task, ran)
}

/// Each `run_command` of a task with its output and exit code, in order.
pub fn results(c: &Cluster, task: &str) -> Vec<Ran> {
    let log = c.task_log_json(task);
    let mut out: Vec<(u64, Ran)> = Vec::new();
    for e in &log {
        let id = crate::json_u64(&e["call_id"]).unwrap_or(0);
        match e["kind"].as_str() {
            Some("tool_call_issued") if e["call"]["tool"] == "run_command" => out.push((
                id,
                Ran {
                    command: e["call"]["argv"].to_string(),
                    stdout: String::new(),
                    stderr: String::new(),
                    exit: None,
                },
            )),
            Some("tool_output") => {
                if let Some((_, ran)) = out.iter_mut().find(|(i, _)| *i == id) {
                    ran.stdout = e["stdout"].as_str().unwrap_or_default().into();
                    ran.stderr = e["stderr"].as_str().unwrap_or_default().into();
                }
            }
            Some("tool_call_completed") => {
                if let Some((_, ran)) = out.iter_mut().find(|(i, _)| *i == id) {
                    ran.exit = e["result"]["exit_code"].as_i64();
                }
            }
            _ => {}
        }
    }
    out.into_iter().map(|(_, r)| r).collect()
}

/// Every file under `dir` holding `needle` (binary files too).
pub fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file()
                && std::fs::read(&p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
            {
                hits.push(p.display().to_string());
            }
        }
    }
    hits
}

/// Every process whose environment holds `needle`.
pub fn environs_holding(needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return hits;
    };
    for e in procs.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.parse::<u32>().is_err() {
            continue;
        }
        if let Ok(env) = std::fs::read(e.path().join("environ"))
            && env.windows(needle.len()).any(|w| w == needle)
        {
            let cmd = std::fs::read_to_string(e.path().join("cmdline")).unwrap_or_default();
            hits.push(format!("{name}: {}", cmd.replace('\0', " ")));
        }
    }
    hits
}
