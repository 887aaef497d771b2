//! Live file changes for watchers: a `notify` (inotify) watcher per workspace in use,
//! debounced, sent to the brain as `FsChanged` (paths changed and removed). These are hints
//! for live views; barriers (rescans) are the truth. If the watcher cannot be set up (for
//! example `fs.inotify.max_user_watches` is exhausted) or its queue overflows, the worker
//! says so in its log and sends what a rescan finds instead.

use shared::locks::Lock;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};
use proto::{FsChanged, WorkerMessage, worker_message};
use shared::manifest::Rules;
use shared::scan::Scanner;
use std::sync::mpsc::{self, RecvTimeoutError};

use crate::durable::CurrentOut;

/// Quiet time before a batch of changes is sent.
const DEBOUNCE: Duration = Duration::from_millis(300);
/// Longest a change waits for quiet: a file written without pause (a log) is still shown.
const MAX_WAIT: Duration = Duration::from_secs(2);
/// Raw events queued per workspace; more means overflow (a rescan).
const QUEUE: usize = 8192;
/// Most paths per message.
const MAX_PATHS: usize = 500;
/// How often a workspace without a working watcher is rescanned.
const RESCAN_EVERY: Duration = Duration::from_secs(2);
/// How long a workspace is watched after its last use.
const IDLE: Duration = Duration::from_secs(600);

/// What `worker doctor` says about live file watching.
pub fn doctor_line() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    match (
        read("/proc/sys/fs/inotify/max_user_watches"),
        read("/proc/sys/fs/inotify/max_queued_events"),
    ) {
        (Some(w), Some(q)) => format!(
            "live file changes: inotify, up to {w} watched directories (fs.inotify.max_user_watches) and {q} queued events; beyond that, rescans every {}s",
            RESCAN_EVERY.as_secs()
        ),
        _ => format!(
            "live file changes: inotify limits unreadable; if watching fails, rescans every {}s",
            RESCAN_EVERY.as_secs()
        ),
    }
}

enum Raw {
    Paths(Vec<PathBuf>),
    /// The watcher lost events or failed: rescan.
    Rescan(String),
}

/// Watchers by workspace name.
#[derive(Default)]
pub struct Watches {
    active: Mutex<HashMap<String, Arc<Mutex<std::time::Instant>>>>,
}

impl Watches {
    /// Makes sure `workspace` is watched (and marks it used now).
    pub fn ensure(self: &Arc<Self>, workspace: &str, root: &Path, out: CurrentOut) {
        let mut active = self.active.locked();
        if let Some(used) = active.get(workspace) {
            *used.locked() = std::time::Instant::now();
            return;
        }
        let used = Arc::new(Mutex::new(std::time::Instant::now()));
        active.insert(workspace.to_string(), used.clone());
        let (me, name, root) = (self.clone(), workspace.to_string(), root.to_path_buf());
        // A thread of its own: setting up inotify watches on a big tree and rescanning it
        // block for a while, and must not hold up the session (the worker's runtime has one
        // thread).
        let spawned = std::thread::Builder::new()
            .name(format!("watch {name}"))
            .spawn(move || {
                watch(&name, &root, out, used);
                me.active.locked().remove(&name);
            });
        if let Err(e) = spawned {
            tracing::warn!(%workspace, error = %e, "cannot start a file watcher thread; no live changes for it");
            active.remove(workspace);
        }
    }
}

fn is_ignored(rel: &str) -> bool {
    rel.split('/').any(|c| {
        c == ".git"
            || shared::workspace::DEFAULT_EXCLUDES.contains(&c)
            || c.starts_with(".tether-tmp-")
            || shared::fsio::is_temp_name(c)
    })
}

fn watch(name: &str, root: &Path, out: CurrentOut, used: Arc<Mutex<std::time::Instant>>) {
    let (tx, rx) = mpsc::sync_channel::<Raw>(QUEUE);
    let tx2 = tx.clone();
    // Symlinks in a workspace may point anywhere (`ln -s / root`): never follow them.
    let config = notify::Config::default().with_follow_symlinks(false);
    let watcher = notify::RecommendedWatcher::new(
        move |res: notify::Result<notify::Event>| {
            let msg = match res {
                Ok(ev) if ev.need_rescan() => Raw::Rescan("the watcher lost events".into()),
                Ok(ev) if matches!(ev.kind, EventKind::Access(_)) => return,
                Ok(ev) => Raw::Paths(ev.paths),
                Err(e) => Raw::Rescan(e.to_string()),
            };
            if tx2.try_send(msg).is_err() {
                // Full: the consumer will rescan when it sees this.
                let _ = tx2.try_send(Raw::Rescan("too many changes at once".into()));
            }
        },
        config,
    )
    .and_then(|mut w| w.watch(root, RecursiveMode::Recursive).map(|_| w));
    let mut rescan_mode = match &watcher {
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(workspace = name, error = %e, "cannot watch the workspace (is fs.inotify.max_user_watches exhausted?); live changes come from rescans every {RESCAN_EVERY:?}");
            Some(Scanner::new(root, Rules::default()))
        }
    };
    drop(tx);
    let mut last: Option<shared::manifest::Manifest> = None;
    let mut pending: BTreeSet<String> = BTreeSet::new();
    let mut need_rescan = false;
    // When the oldest change not yet sent came in.
    let mut waiting_since: Option<std::time::Instant> = None;
    loop {
        if used.locked().elapsed() > IDLE {
            return;
        }
        let wait = if pending.is_empty() && !need_rescan {
            if rescan_mode.is_some() {
                RESCAN_EVERY
            } else {
                Duration::from_secs(5)
            }
        } else {
            DEBOUNCE
        };
        match rx.recv_timeout(wait) {
            Ok(Raw::Paths(paths)) => {
                for p in paths {
                    if let Ok(rel) = p.strip_prefix(root) {
                        let rel = rel.to_string_lossy().into_owned();
                        if !rel.is_empty() && !is_ignored(&rel) {
                            pending.insert(rel);
                        }
                    }
                }
                if pending.is_empty() && !need_rescan {
                    continue;
                }
                let since = *waiting_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() < MAX_WAIT {
                    continue;
                }
            }
            Ok(Raw::Rescan(why)) => {
                if !need_rescan {
                    tracing::info!(workspace = name, reason = %why, "file watcher fell behind; rescanning");
                }
                need_rescan = true;
                let since = *waiting_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() < MAX_WAIT {
                    continue;
                }
            }
            Err(RecvTimeoutError::Disconnected) if rescan_mode.is_none() => {
                tracing::warn!(
                    workspace = name,
                    "the file watcher stopped; live changes come from rescans"
                );
                rescan_mode = Some(Scanner::new(root, Rules::default()));
            }
            // No watcher: nothing to wait on but the clock.
            Err(RecvTimeoutError::Disconnected) => std::thread::sleep(wait),
            Err(RecvTimeoutError::Timeout) => {}
        }
        // Quiet now: send what changed.
        let rescan = need_rescan || rescan_mode.is_some();
        need_rescan = false;
        waiting_since = None;
        // Without a watcher, scans say what changed. With one that fell behind, the message
        // says "rescan" and the viewer reads the tree again: scanning here too would hash the
        // whole workspace with nothing to compare it to (after a big materialisation, a
        // second core busy for seconds beside the next sync).
        if let Some(scanner) = rescan_mode.as_mut()
            && let Ok(now) = scanner.scan()
        {
            if let Some(before) = &last {
                let d = before.diff(&now);
                pending.extend(d.upserts.into_keys());
                pending.extend(d.deletes);
            }
            last = Some(now);
        }
        if pending.is_empty() {
            continue;
        }
        // A new directory's files may have been created before inotify watched it: list them,
        // until there are more than one message holds (the rest is `truncated` either way).
        let dirs: Vec<String> = pending
            .iter()
            .filter(|rel| root.join(rel).symlink_metadata().is_ok_and(|m| m.is_dir()))
            .cloned()
            .collect();
        for d in dirs {
            if pending.len() > MAX_PATHS {
                break;
            }
            for f in shared::workspace::walk(&root.join(&d)).take(MAX_PATHS + 1) {
                pending.insert(format!("{d}/{f}"));
            }
        }
        let (mut changed, mut removed) = (Vec::new(), Vec::new());
        let truncated = pending.len() > MAX_PATHS;
        for rel in std::mem::take(&mut pending).into_iter().take(MAX_PATHS) {
            if root.join(&rel).symlink_metadata().is_ok() {
                changed.push(rel);
            } else {
                removed.push(rel);
            }
        }
        let tx = out.locked().clone();
        if let Some(tx) = tx {
            let _ = tx.try_send(WorkerMessage {
                msg: Some(worker_message::Msg::FsChanged(FsChanged {
                    workspace: name.to_string(),
                    changed,
                    removed,
                    truncated,
                    rescan,
                })),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paths of the `FsChanged` messages that arrive within `timeout`, until `done`
    /// holds for what arrived so far; and whether any said `rescan` or `truncated`.
    fn collect(
        rx: &mut tokio::sync::mpsc::Receiver<WorkerMessage>,
        timeout: Duration,
        done: impl Fn(&BTreeSet<String>) -> bool,
    ) -> (BTreeSet<String>, bool, bool) {
        let deadline = std::time::Instant::now() + timeout;
        let (mut seen, mut rescan, mut truncated) = (BTreeSet::new(), false, false);
        while !done(&seen) && std::time::Instant::now() < deadline {
            match rx.try_recv() {
                Ok(WorkerMessage {
                    msg: Some(worker_message::Msg::FsChanged(f)),
                }) => {
                    seen.extend(f.changed);
                    rescan |= f.rescan;
                    truncated |= f.truncated;
                }
                Ok(_) => {}
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        (seen, rescan, truncated)
    }

    #[test]
    fn a_watched_workspace_reports_what_changed_and_says_so_when_it_fell_behind() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("ws");
        std::fs::create_dir_all(root.join("src")).unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
        let out: CurrentOut = Arc::new(Mutex::new(Some(tx)));
        let watches = Arc::new(Watches::default());
        watches.ensure("task-1", &root, out.clone());
        // The watch is set up on its own thread: write until it is seen.
        let (seen, ..) = collect(&mut rx, Duration::from_secs(20), |seen| {
            std::fs::write(root.join("src/a.rs"), "fn a() {}").unwrap();
            seen.contains("src/a.rs")
        });
        assert!(seen.contains("src/a.rs"), "{seen:?}");

        // A directory moved in whole: inotify names only the directory, so its files are
        // listed, up to what one message holds, and the message says it was cut.
        let outside = d.path().join("gen");
        for i in 0..(MAX_PATHS + 300) {
            let dir = outside.join(format!("d{:03}", i / 20));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("f{i}")), "x").unwrap();
        }
        std::fs::rename(&outside, root.join("gen")).unwrap();
        let (seen, _, truncated) = collect(&mut rx, Duration::from_secs(30), |seen| {
            seen.iter().any(|p| p.starts_with("gen/"))
        });
        assert!(truncated, "more paths than a message holds");
        let files: Vec<&String> = seen.iter().filter(|p| p.starts_with("gen/")).collect();
        assert!(files.len() >= MAX_PATHS - 1, "{}", files.len());
        assert!(
            files.iter().all(|p| p.matches('/').count() == 2),
            "{files:?}"
        );
    }
}
