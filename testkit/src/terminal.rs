//! A command on a pseudo-terminal that a test types into, as a person at a terminal would:
//! util-linux's `script` gives the command a terminal for stdin, stdout and stderr; the test
//! writes lines to `script`'s stdin and reads what the terminal received.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shared::locks::Lock;

/// A running command on a terminal.
pub struct Terminal {
    child: Child,
    stdin: Option<ChildStdin>,
    seen: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Terminal {
    /// Starts `line` (a shell command line) on a terminal.
    pub fn start(line: &str) -> Self {
        let mut child = Command::new("script")
            .args(["-qefc", line, "/dev/null"])
            .env_remove("TETHER_BRAIN")
            .env_remove("TETHER_IDENTITY")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run script (util-linux)");
        let stdin = child.stdin.take();
        let mut out = child.stdout.take().expect("script's stdout");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.locked().extend_from_slice(&buf[..n]);
            }
        });
        Self {
            child,
            stdin,
            seen,
            reader: Some(reader),
        }
    }

    /// What the terminal received so far, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen.locked()).into_owned()
    }

    /// Waits until the terminal has shown `what` at least `times` times in all; panics with
    /// the screen after `timeout`.
    pub fn wait_for(&self, what: &str, times: usize, timeout: Duration) {
        let until = Instant::now() + timeout;
        loop {
            let text = self.text();
            if text.matches(what).count() >= times {
                return;
            }
            assert!(
                Instant::now() < until,
                "the terminal did not show {what:?} ({times} times) within {timeout:?}; it shows:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Types `line` and Enter.
    pub fn type_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("the terminal's input is open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|_| stdin.flush())
            .expect("type into the terminal");
    }

    /// Waits for the command to end (within `timeout`): its exit code and all it showed.
    pub fn wait(mut self, timeout: Duration) -> (Option<i32>, String) {
        let until = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for script") {
                self.stdin.take();
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                return (status.code(), self.text());
            }
            if Instant::now() >= until {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "the command on the terminal did not end within {timeout:?}; it shows:\n{}",
                    self.text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
