//! Gates a task's command waits at until the test opens them: the condition a test means
//! ("hold this worker until every task is placed") instead of a fixed `sleep` standing in
//! for it.
//!
//! A gate is a file in a directory outside /tmp (commands see a private /tmp) that every
//! user may read; a command waits for it with a bounded loop, so a test that fails before it
//! opens a gate does not leave commands waiting for ever.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

/// A directory of gates, removed on drop.
pub struct Gates(tempfile::TempDir);

impl Default for Gates {
    fn default() -> Self {
        Self::new()
    }
}

impl Gates {
    pub fn new() -> Self {
        let d = tempfile::Builder::new()
            .prefix("tether-gates-")
            .tempdir_in("/var/tmp")
            .expect("a gates directory in /var/tmp");
        std::fs::set_permissions(
            d.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("gates directory readable by all");
        Self(d)
    }

    /// Gate `n`'s file.
    pub fn path(&self, n: u32) -> PathBuf {
        self.0.path().join(format!("g{n}"))
    }

    /// Shell that waits until gate `n` is open, for at most `most`.
    pub fn wait(&self, n: u32, most: Duration) -> String {
        let ticks = (most.as_millis() / 50).max(1);
        format!(
            "i=0; while [ ! -e {g} ] && [ $i -lt {ticks} ]; do sleep 0.05; i=$((i+1)); done",
            g = self.path(n).display()
        )
    }

    /// Shell that runs `cmd` unless gate `n` is open (`sleep 1` while a test's kills go on).
    pub fn unless_open(&self, n: u32, cmd: &str) -> String {
        format!("[ -e {} ] || {cmd}", self.path(n).display())
    }

    /// A plan step that waits (at most a minute) until gate `n` is open, then runs `then`.
    pub fn step(&self, n: u32, then: &str) -> Value {
        json!({"run": ["sh", "-c", format!("{}; {then}", self.wait(n, Duration::from_secs(60)))]})
    }

    /// Opens gate `n`: every command waiting at it goes on.
    pub fn open(&self, n: u32) {
        std::fs::write(self.path(n), "").expect("open a gate");
    }
}

impl crate::Cluster {
    /// Asks to move task `id` to worker `to` once its `call`th call is issued (one that waits
    /// at gate `n`), then opens the gate: the move happens when that call ends.
    pub fn move_at_gate(&self, id: &str, call: usize, to: &str, gates: &Gates, n: u32) {
        self.wait_records(id, "tool_call_issued", call, Duration::from_secs(180));
        let out = self.brain_cli(&["task", "move", id, "--to", to]);
        assert!(out.status.success(), "{}", crate::text(&out));
        gates.open(n);
    }
}
