//! Waiting for a task's records as the brain appends them: `brain watch ID --json` followed
//! (the brain's own event stream, nothing polled), picked up again from the last record seen
//! if the brain restarts underneath.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{Cluster, json_u64};

impl Cluster {
    /// Follows task `id`'s log until `n` records satisfy `want`, and gives them; panics with
    /// the brain's log when `timeout` passes first or the task ends without them.
    pub fn wait_record(
        &self,
        id: &str,
        n: usize,
        timeout: Duration,
        mut want: impl FnMut(&Value) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        let mut found = Vec::new();
        let mut since = 0;
        loop {
            let (ended, last) = self.follow_once(id, since, deadline, &mut |r: &Value| {
                if want(r) {
                    found.push(r.clone());
                }
                found.len() >= n
            });
            since = last.max(since);
            if found.len() >= n {
                return found;
            }
            assert!(
                !ended && Instant::now() < deadline,
                "task {id}: {} of {n} records wanted {} (since {since}); brain log:\n{}",
                found.len(),
                if ended {
                    "when its log ended"
                } else {
                    "within the time"
                },
                self.brain_log()
            );
            // The watch was cut (a brain restart): wait for the brain, then go on.
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (at most `timeout`) until task `id`'s log holds `n` records of kind `kind`.
    pub fn wait_records(&self, id: &str, kind: &str, n: usize, timeout: Duration) {
        self.wait_record(id, n, timeout, |r| r["kind"] == kind);
    }

    /// One `brain watch` from after `since`, each record offered to `enough` until it says
    /// so or the deadline passes. Returns whether the log ended (the task did) and the last
    /// sequence number seen.
    fn follow_once(
        &self,
        id: &str,
        since: u64,
        deadline: Instant,
        enough: &mut dyn FnMut(&Value) -> bool,
    ) -> (bool, u64) {
        let since_arg = since.to_string();
        let mut child = self
            .brain_cli_cmd(&["watch", id, "--json", "--since", &since_arg])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run brain watch");
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel::<Value>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && tx.send(v).is_err()
                {
                    break;
                }
            }
        });
        let mut last = since;
        let ended = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                // Live items (output, file changes) have no sequence number: not records.
                Ok(v) => {
                    let Some(seq) = json_u64(&v["seq"]) else {
                        continue;
                    };
                    last = last.max(seq);
                    if enough(&v) {
                        break false;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => break false,
                // The watch ended: the task did, or the brain went away.
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let ok = child.wait().map(|s| s.success()).unwrap_or(false);
                    let _ = reader.join();
                    return (ok, last);
                }
            }
        };
        let _ = child.kill();
        let _ = child.wait();
        let _ = reader.join();
        (ended, last)
    }
}
