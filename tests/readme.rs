//! The README's quickstart runs as written. Every shell block of its quickstart sections is
//! read from README.md (so the two cannot drift) and run a line at a time in one bash session
//! in the repository's root, with a home of its own, on the binaries the README's own build
//! command makes, the way a person follows it:
//!
//! - a line ending in `&` starts something in the background (the brain, a worker);
//! - a value the README leaves as `...` (`tj_...`, `sha256:...`) is the one an earlier
//!   command printed, word for word (`brain token create` prints the join line);
//! - a line's comment `# exit N` is the exit code it must end with, any other line 0;
//! - a line that fails while something started in the background may still be coming up is
//!   tried again, as a person would, for up to a minute after that start.
//!
//! The brain listens on the README's address, 127.0.0.1:7443.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};

use shared::locks::Lock;
use std::time::{Duration, Instant};

/// The sections whose blocks are run, in the README's order.
const SECTIONS: &[&str] = &["Quickstart on one machine", "A first agent task"];

/// How long a background start may take to come up.
const SETTLE: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The commands of the shell blocks of `section` (continuation lines joined).
fn commands(readme: &str, section: &str) -> Vec<String> {
    let mut heading = String::new();
    let (mut fence, mut run) = (false, false);
    let mut cmds = Vec::new();
    let mut pending = String::new();
    for line in readme.lines() {
        if line.starts_with("```") {
            run = !fence && heading == section && line.trim() == "```sh";
            fence = !fence;
            continue;
        }
        if !fence {
            if let Some(h) = line.strip_prefix('#') {
                heading = h.trim_start_matches('#').trim().to_string();
            }
            continue;
        }
        if !run {
            continue;
        }
        let l = line.trim_end();
        if let Some(head) = l.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(l);
        if !pending.trim().is_empty() {
            cmds.push(std::mem::take(&mut pending));
        }
        pending.clear();
    }
    cmds
}

/// The exit code a line's comment says it ends with (`# exit 124: ...`), else 0.
fn expected_exit(cmd: &str) -> i32 {
    cmd.split_once(" # ")
        .and_then(|(_, comment)| comment.trim().strip_prefix("exit "))
        .and_then(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// `cmd` with each `...` value filled in from what earlier commands printed.
fn filled(cmd: &str, printed: &str) -> Result<String, String> {
    let mut out = Vec::new();
    for word in cmd.split(' ') {
        let Some((prefix, rest)) = word.split_once("...") else {
            out.push(word.to_string());
            continue;
        };
        if prefix.is_empty() {
            out.push(word.to_string());
            continue;
        }
        let value = printed
            .split_whitespace()
            .rev()
            .find(|w| w.starts_with(prefix) && w.len() > prefix.len() && !w.contains("..."))
            .ok_or_else(|| {
                format!("nothing printed before `{cmd}` holds a value for {prefix}...")
            })?;
        out.push(format!("{value}{rest}"));
    }
    Ok(out.join(" "))
}

/// One bash session, its output gathered as it comes.
struct Session {
    bash: Child,
    stdin: ChildStdin,
    said: Arc<Mutex<String>>,
    ends: Receiver<i32>,
}

const MARK: &str = "@@readme-rc ";

impl Session {
    fn start(home: &Path) -> Self {
        let real_home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        let mut cmd = Command::new("bash");
        cmd.args(["--norc", "--noprofile", "-s"])
            .current_dir(repo())
            .env("HOME", home)
            .env_remove("TETHER_DATA")
            .env_remove("TETHER_BRAIN")
            .env_remove("TETHER_IDENTITY")
            .env_remove("TETHER_WORKER_STATE")
            .env_remove("TETHER_JOIN_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // The toolchain stays where it is: only the home the README writes to is new.
        if std::env::var_os("CARGO_HOME").is_none() {
            cmd.env("CARGO_HOME", format!("{real_home}/.cargo"));
        }
        if std::env::var_os("RUSTUP_HOME").is_none() {
            cmd.env("RUSTUP_HOME", format!("{real_home}/.rustup"));
        }
        let mut bash = cmd.spawn().expect("start bash");
        let stdin = bash.stdin.take().expect("bash's stdin");
        let said = Arc::new(Mutex::new(String::new()));
        let (tx, ends) = channel();
        for stream in [
            Box::new(bash.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>,
            Box::new(bash.stderr.take().expect("stderr")),
        ] {
            let said = said.clone();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    if let Some(rc) = line.strip_prefix(MARK) {
                        let _ = tx.send(rc.trim().parse().unwrap_or(-1));
                        continue;
                    }
                    let mut s = said.locked();
                    s.push_str(&line);
                    s.push('\n');
                }
            });
        }
        Self {
            bash,
            stdin,
            said,
            ends,
        }
    }

    fn said(&self) -> String {
        self.said.locked().clone()
    }

    /// Runs `cmd`: its exit code, within `timeout`.
    fn run(&mut self, cmd: &str, timeout: Duration) -> Option<i32> {
        // The code goes to both streams, so all the command wrote to either is in first.
        writeln!(
            self.stdin,
            "{cmd}\n__rc=$?; echo \"{MARK}$__rc\"; echo \"{MARK}$__rc\" >&2"
        )
        .and_then(|()| self.stdin.flush())
        .expect("write to bash");
        let until = Instant::now() + timeout;
        let mut codes = Vec::new();
        while codes.len() < 2 {
            let left = until.saturating_duration_since(Instant::now());
            match self.ends.recv_timeout(left) {
                Ok(rc) => codes.push(rc),
                Err(_) => return None,
            }
        }
        Some(codes[0])
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Everything the session started in the background is in its process group.
        if let Some(pgid) = i32::try_from(self.bash.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
        let _ = self.bash.wait();
    }
}

#[test]
fn the_readme_quickstart_runs_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let mut all = Vec::new();
    for section in SECTIONS {
        let cmds = commands(&readme, section);
        assert!(
            !cmds.is_empty(),
            "the README has no shell block under \"## {section}\" (this test runs them)"
        );
        all.extend(cmds);
    }
    // The README's address must be free, or the brain it starts could not listen.
    assert!(
        std::net::TcpListener::bind("127.0.0.1:7443").is_ok(),
        "127.0.0.1:7443 is taken: the README's brain listens there; stop what holds it"
    );
    // Where cargo puts what it builds when CARGO_TARGET_DIR sends it elsewhere: the README
    // says target/release, so that is where it must be found.
    // (Another test may have made target/ for its artifacts: then target/release is linked.)
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        let (target, dir) = (repo().join("target"), PathBuf::from(dir));
        if !target.exists() {
            std::os::unix::fs::symlink(&dir, &target).expect("link target/");
        } else if !target.join("release").exists() {
            std::os::unix::fs::symlink(dir.join("release"), target.join("release"))
                .expect("link target/release");
        }
    }
    let home = tempfile::tempdir().expect("a home for the README's session");
    let mut s = Session::start(home.path());
    let mut background_at: Option<Instant> = None;
    for cmd in &all {
        let want = expected_exit(cmd);
        let timeout = if cmd.starts_with("cargo ") {
            Duration::from_secs(60 * 60)
        } else {
            Duration::from_secs(120)
        };
        let background = cmd
            .split(" #")
            .next()
            .unwrap_or(cmd)
            .trim_end()
            .ends_with('&');
        loop {
            let line = filled(cmd, &s.said()).unwrap_or_else(|e| panic!("{e}"));
            let before = s.said().len();
            let got = s.run(&line, timeout);
            if got == Some(want) {
                break;
            }
            let settling = background_at.is_some_and(|t| t.elapsed() < SETTLE);
            if got.is_some() && settling {
                // Something started just before may still be coming up: as a person would,
                // try again in a moment.
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
            let said = s.said();
            panic!(
                "the README's line\n  {cmd}\nran as\n  {line}\nand ended with {got:?}, not {want}; it printed:\n{}\n(all the session printed:\n{said})",
                &said[before.min(said.len())..]
            );
        }
        if background {
            background_at = Some(Instant::now());
        }
    }
    // What the quickstart promised on the way, in its own words.
    let said = s.said();
    for promised in [
        "laptop",
        "hi",
        "finished",
        "verified",
        "+    echo $(($1 + $2))",
    ] {
        assert!(
            said.contains(promised),
            "the quickstart's output lacks {promised:?}:\n{said}"
        );
    }
}

#[test]
fn the_readme_reader_finds_blocks_joins_lines_and_fills_values() {
    let readme = "# T\n## Quickstart on one machine\n\n```sh\na   # exit 124: why\nb \\\n  c\n```\n\n```text\nnot run\n```\n### Other\n```sh\nd\n```\n";
    assert_eq!(
        commands(readme, "Quickstart on one machine"),
        ["a   # exit 124: why", "b   c"]
    );
    assert_eq!(expected_exit("a   # exit 124: why"), 124);
    assert_eq!(expected_exit("brain workers   # id, name"), 0);
    let printed =
        "tj_abc\n  TETHER_JOIN_TOKEN=tj_abc worker join --ca-hash sha256:ff --name NAME\n";
    assert_eq!(
        filled(
            "TETHER_JOIN_TOKEN=tj_... w --ca-hash sha256:... --name laptop &",
            printed
        )
        .unwrap(),
        "TETHER_JOIN_TOKEN=tj_abc w --ca-hash sha256:ff --name laptop &"
    );
    assert!(filled("w --token zz_...", printed).is_err());
}
