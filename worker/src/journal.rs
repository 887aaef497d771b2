//! The worker's journal of durable calls, on disk in its state dir, so that a call the brain
//! issued is run at most once across brain restarts, reconnects and worker restarts:
//! `<id>.started` is synced before the command starts, `<id>.result` when it ends. A repeat of
//! a finished call gets the recorded result; a call started by an earlier worker process that
//! died before recording its end is reported interrupted, never run again. Once the brain has
//! acknowledged a result, `<id>.started` becomes `<id>.acked` (one rename: a crash leaves one
//! or the other) and the result goes: the call is never run again either, though a brain that
//! lost its lease (a replica behind the one that logged the result) sends it once more.

use shared::locks::Lock;
use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use prost::Message;
use proto::CallResult;

/// Most calls remembered; the oldest (lowest ids) are forgotten first.
const MAX_ENTRIES: usize = 10_000;

/// What the journal says about a call.
pub enum Known {
    /// Never seen: run it.
    New,
    /// Running in this process: its result will follow.
    Running,
    /// Finished (or found interrupted): here is the result.
    Done(CallResult),
}

/// Identifies a process across pid reuse: the boot id and the process's start time.
fn process_stamp(pid: i32) -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    // Field 22 of /proc/<pid>/stat is the start time; `after` starts at field 3.
    let start = after.split_whitespace().nth(19)?;
    Some(format!("{}-{start}", boot.trim()))
}

pub struct Journal {
    dir: PathBuf,
    /// Calls running in this process. A std mutex: held only for set operations.
    running: Mutex<HashSet<u64>>,
    /// Calls acknowledged since the last prune (the tombstones are pruned every so often).
    acked: std::sync::atomic::AtomicUsize,
}

/// Acknowledged calls between two prunes of the tombstones.
const PRUNE_EVERY: usize = 1024;

impl Journal {
    pub fn open(dir: PathBuf) -> std::io::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let j = Self {
            dir,
            running: Mutex::new(HashSet::new()),
            acked: std::sync::atomic::AtomicUsize::new(0),
        };
        j.prune()?;
        Ok(j)
    }

    fn path(&self, id: u64, ext: &str) -> PathBuf {
        self.dir.join(format!("{id:020}.{ext}"))
    }

    fn ids(&self, ext: &str) -> std::io::Result<Vec<u64>> {
        let mut ids = Vec::new();
        for ent in std::fs::read_dir(&self.dir)? {
            let name = ent?.file_name();
            let name = name.to_string_lossy();
            if let Some(id) = name
                .strip_suffix(&format!(".{ext}"))
                .and_then(|s| s.parse().ok())
            {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// Keeps the newest [`MAX_ENTRIES`] calls and as many tombstones of acknowledged ones.
    fn prune(&self) -> std::io::Result<()> {
        for ext in ["started", "acked"] {
            let ids = self.ids(ext)?;
            if ids.len() > MAX_ENTRIES {
                for id in &ids[..ids.len() - MAX_ENTRIES] {
                    self.remove(*id);
                }
            }
        }
        Ok(())
    }

    /// Every file of a call, tombstone included.
    fn remove(&self, id: u64) {
        for ext in ["result", "pgid", "started", "acked"] {
            let _ = std::fs::remove_file(self.path(id, ext));
        }
    }

    /// Looks a call up; if it is new, records it as started (synced) and marks it running.
    pub fn begin(&self, id: u64) -> std::io::Result<Known> {
        let mut running = self.running.locked();
        if running.contains(&id) {
            return Ok(Known::Running);
        }
        if let Some(r) = self.result(id) {
            return Ok(Known::Done(r));
        }
        if self.path(id, "acked").exists() {
            // Run and logged: only a brain behind the one that logged it asks again. It gets
            // no second run (and its append of this is refused by the log's fencing).
            return Ok(Known::Done(CallResult {
                call_id: id,
                interrupted:
                    "this call ran and its result was acknowledged already; it was not run again"
                        .into(),
                ..Default::default()
            }));
        }
        if self.path(id, "started").exists() {
            // The process that ran it died; whatever it started may still run. Stop it, so
            // nothing changes the workspace after we report the call interrupted.
            // Only if that group is still the one we recorded: same boot, same leader start
            // time (a pid can be reused after a reboot or a wrap-around).
            if let Some(pgid) = std::fs::read_to_string(self.path(id, "pgid"))
                .ok()
                .and_then(|s| {
                    let mut it = s.split_whitespace();
                    let pgid = it.next()?.parse::<i32>().ok()?;
                    let stamp = it.next()?.to_string();
                    (pgid > 1 && process_stamp(pgid).as_deref() == Some(stamp.as_str()))
                        .then_some(pgid)
                })
                && let Some(group) = rustix::process::Pid::from_raw(pgid)
            {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            }
            let r = CallResult {
                call_id: id,
                interrupted: "the worker process running this call ended before it could record the result; it was not run again".into(),
                ..Default::default()
            };
            self.save(&r)?;
            return Ok(Known::Done(r));
        }
        let mut f = std::fs::File::create(self.path(id, "started"))?;
        f.write_all(b"started\n")?;
        f.sync_all()?;
        shared::fsio::sync_dir(&self.dir)?;
        running.insert(id);
        Ok(Known::New)
    }

    /// Records the process group a call runs in, so a later worker process can stop it.
    pub fn set_group(&self, id: u64, pgid: i32) {
        if let Some(stamp) = process_stamp(pgid) {
            let _ = std::fs::write(self.path(id, "pgid"), format!("{pgid} {stamp}\n"));
        }
    }

    /// Records a call's result (synced) and marks it no longer running.
    pub fn finish(&self, r: &CallResult) -> std::io::Result<()> {
        let res = self.save(r);
        self.running.locked().remove(&r.call_id);
        res
    }

    fn save(&self, r: &CallResult) -> std::io::Result<()> {
        shared::fsio::write_atomic(
            &self.path(r.call_id, "result"),
            &r.encode_to_vec(),
            0o600,
            shared::fsio::Durability::Full,
        )
    }

    pub fn result(&self, id: u64) -> Option<CallResult> {
        let bytes = std::fs::read(self.path(id, "result")).ok()?;
        CallResult::decode(bytes.as_slice()).ok()
    }

    /// Every recorded result the brain has not acknowledged.
    pub fn unacked(&self) -> Vec<CallResult> {
        self.ids("result")
            .unwrap_or_default()
            .into_iter()
            .filter_map(|id| self.result(id))
            .collect()
    }

    /// The brain has logged the result: drop it, and keep a tombstone so the call never
    /// runs again.
    pub fn forget(&self, id: u64) {
        if std::fs::rename(self.path(id, "started"), self.path(id, "acked")).is_err() {
            // Not started here (or acknowledged twice): nothing ran to keep a tombstone of.
            if !self.path(id, "acked").exists() {
                return;
            }
        }
        let _ = std::fs::remove_file(self.path(id, "result"));
        let _ = std::fs::remove_file(self.path(id, "pgid"));
        let n = self
            .acked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        if n.is_multiple_of(PRUNE_EVERY) {
            let _ = self.prune();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_runs_once_and_a_dead_run_is_reported_interrupted() {
        let d = tempfile::tempdir().unwrap();
        let j = Journal::open(d.path().join("calls")).unwrap();
        assert!(matches!(j.begin(1).unwrap(), Known::New));
        assert!(matches!(j.begin(1).unwrap(), Known::Running));
        j.finish(&CallResult {
            call_id: 1,
            stdout: b"hi".to_vec(),
            ..Default::default()
        })
        .unwrap();
        match j.begin(1).unwrap() {
            Known::Done(r) => assert_eq!(r.stdout, b"hi"),
            _ => panic!("a finished call must not run again"),
        }
        // Call 2 started, then the process died (a new journal on the same dir).
        assert!(matches!(j.begin(2).unwrap(), Known::New));
        let j2 = Journal::open(d.path().join("calls")).unwrap();
        match j2.begin(2).unwrap() {
            Known::Done(r) => assert!(!r.interrupted.is_empty()),
            _ => panic!("a call started by a dead process must be reported interrupted"),
        }
        assert_eq!(j2.unacked().len(), 2);
        j2.forget(1);
        assert_eq!(j2.unacked().len(), 1);
    }

    #[test]
    fn an_acknowledged_call_asked_again_is_not_run_again() {
        let d = tempfile::tempdir().unwrap();
        let j = Journal::open(d.path().join("calls")).unwrap();
        assert!(matches!(j.begin(7).unwrap(), Known::New));
        j.finish(&CallResult {
            call_id: 7,
            stdout: b"ran".to_vec(),
            ..Default::default()
        })
        .unwrap();
        // The brain logged the result and acknowledged it; a brain that lost the task since
        // (a replica behind) sends the call again.
        j.forget(7);
        assert!(j.unacked().is_empty());
        for journal in [&j, &Journal::open(d.path().join("calls")).unwrap()] {
            match journal.begin(7).unwrap() {
                Known::Done(r) => assert!(r.interrupted.contains("acknowledged"), "{r:?}"),
                _ => panic!("an acknowledged call must not run again"),
            }
        }
        // An acknowledgement of a call never started here leaves nothing behind.
        j.forget(8);
        assert!(matches!(j.begin(8).unwrap(), Known::New));
    }

    #[test]
    fn tombstones_are_bounded() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("calls");
        std::fs::create_dir_all(&dir).unwrap();
        for id in 0..(MAX_ENTRIES as u64 + 5) {
            std::fs::write(dir.join(format!("{id:020}.acked")), b"").unwrap();
        }
        let j = Journal::open(dir).unwrap();
        assert_eq!(j.ids("acked").unwrap().len(), MAX_ENTRIES);
        // The oldest went.
        assert!(matches!(j.begin(0).unwrap(), Known::New));
    }
}
