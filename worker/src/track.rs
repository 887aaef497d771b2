//! Which paths of a workspace changed since the last barrier, so that a barrier lists only
//! the directories they are in instead of walking the whole tree.
//!
//! An inotify instance (the `inotify` crate, which `notify` is built on: one system call per
//! watch, where `notify` makes a round trip to its thread) watches each directory of the
//! workspace that is part of it. The scanner adds the watch just before it lists the
//! directory, so nothing created in between is missed; excluded and ignored directories such
//! as `target/` are not watched. Only changes are asked for (no opens or reads). A thread
//! reads the events and records the paths they name.
//!
//! To know that every change made before a barrier has been delivered, the barrier writes a
//! *fence*: a file in a directory of the worker's own state, watched by the same instance.
//! One instance's events arrive in the order they happened, so once the fence's event is
//! seen, every earlier change has been too.
//!
//! Whenever that cannot be relied on — the instance could not start or watch a directory
//! (`fs.inotify.max_user_instances`, `max_user_watches`), the kernel's queue overflowed, too
//! many paths changed, or the fence did not arrive in time — the barrier walks the whole tree
//! instead, as it does for its first scan. Writes through a memory mapping make no event of
//! their own, but closing a file opened for writing does (`CLOSE_WRITE`, when its last
//! descriptor or mapping goes, at the latest when the call's processes are killed), so they
//! are seen too. Like git's fsmonitor, this does not see writes through a hard link whose
//! other name is outside the workspace until the next full walk.

use shared::locks::Lock;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use inotify::{EventMask, Inotify, WatchMask, Watches};

/// Most changed paths remembered between barriers; beyond that, a full walk.
const MAX_CHANGED: usize = 50_000;
/// How long a barrier waits for its fence.
const FENCE_WAIT: Duration = Duration::from_secs(2);

/// What a workspace directory is watched for: changes to its entries and to itself.
fn dir_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::ATTRIB
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
        | WatchMask::DONT_FOLLOW
        | WatchMask::EXCL_UNLINK
}

#[derive(Default)]
struct State {
    changed: BTreeSet<String>,
    /// Events were lost since the last barrier.
    lost: bool,
    /// The highest fence seen.
    fence_seen: u64,
    /// The directory each watch is on.
    dirs: HashMap<i32, PathBuf>,
    /// The tracker is gone: the reading thread ends.
    stop: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }
}

/// The change tracker of one workspace.
pub struct Tracker {
    watches: Option<Watches>,
    shared: Arc<Shared>,
    fence_dir: PathBuf,
    next_fence: u64,
    /// A directory could not be watched: every barrier walks the whole tree.
    broken: bool,
    /// Barriers that waited out [`FENCE_WAIT`] (for figures and tests).
    pub fence_timeouts: u64,
}

impl Tracker {
    /// Starts tracking `root`; fences go in `fence_dir` (created, and emptied of old fences).
    pub fn new(root: &Path, fence_dir: &Path) -> Self {
        let shared = Arc::new(Shared::default());
        let watches = Self::start(root, fence_dir, &shared);
        if let Err(e) = &watches {
            tracing::warn!(root = %root.display(), error = %e, "cannot track workspace changes (is fs.inotify.max_user_instances exhausted?); every barrier walks the whole tree");
        }
        Self {
            watches: watches.ok(),
            shared,
            fence_dir: fence_dir.to_path_buf(),
            next_fence: 0,
            broken: false,
            fence_timeouts: 0,
        }
    }

    fn start(root: &Path, fence_dir: &Path, shared: &Arc<Shared>) -> std::io::Result<Watches> {
        let _ = std::fs::remove_dir_all(fence_dir);
        std::fs::create_dir_all(fence_dir)?;
        let mut inotify = Inotify::init()?;
        let watches = inotify.watches();
        let fence_wd = watches
            .clone()
            .add(fence_dir, WatchMask::CREATE | WatchMask::ONLYDIR)?
            .get_watch_descriptor_id();
        let (s, root) = (shared.clone(), root.to_path_buf());
        std::thread::Builder::new()
            .name("tether-track".into())
            .spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let events = match inotify.read_events_blocking(&mut buf) {
                        Ok(ev) => ev,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            tracing::warn!(error = %e, "reading workspace changes failed; barriers walk the whole tree");
                            s.lock().lost = true;
                            s.cv.notify_all();
                            return;
                        }
                    };
                    let mut st = s.lock();
                    if st.stop {
                        return;
                    }
                    for ev in events {
                        if ev.mask.contains(EventMask::Q_OVERFLOW) {
                            st.lost = true;
                            s.cv.notify_all();
                            continue;
                        }
                        let wd = ev.wd.get_watch_descriptor_id();
                        if wd == fence_wd {
                            let n = ev.name.and_then(|n| n.to_str()?.parse::<u64>().ok());
                            if let Some(n) = n {
                                st.fence_seen = st.fence_seen.max(n);
                                s.cv.notify_all();
                            }
                            continue;
                        }
                        if ev.mask.contains(EventMask::IGNORED) {
                            st.dirs.remove(&wd);
                            continue;
                        }
                        let Some(dir) = st.dirs.get(&wd) else {
                            continue;
                        };
                        let path = match ev.name {
                            Some(name) => dir.join(name),
                            None => dir.clone(),
                        };
                        let Ok(rel) = path.strip_prefix(&root) else {
                            continue;
                        };
                        let rel = rel.to_string_lossy().into_owned();
                        if st.changed.len() >= MAX_CHANGED {
                            st.lost = true;
                        } else {
                            st.changed.insert(rel);
                        }
                    }
                }
            })?;
        Ok(watches)
    }

    /// Watches a directory of the workspace (the scanner calls this before listing it).
    pub fn watch_dir(&mut self, dir: &Path) {
        let Some(w) = self.watches.as_mut() else {
            return;
        };
        if self.broken {
            return;
        }
        // Under the lock, so the reading thread knows the watch before its first event.
        let mut st = self.shared.lock();
        match w.add(dir, dir_mask()) {
            Ok(wd) => {
                st.dirs
                    .insert(wd.get_watch_descriptor_id(), dir.to_path_buf());
            }
            // Gone already, or replaced by something else: its parent's change covers it.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {}
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch a workspace directory (fs.inotify.max_user_watches?); barriers walk the whole tree from now on");
                self.broken = true;
            }
        }
    }

    /// The paths changed since the last call, or `None` when they cannot be known (no
    /// watcher, lost events, the fence did not arrive): then the caller walks the whole tree.
    pub fn take(&mut self) -> Option<BTreeSet<String>> {
        self.watches.as_ref()?;
        self.next_fence += 1;
        let n = self.next_fence;
        let fence = self.fence_dir.join(n.to_string());
        if let Err(e) = std::fs::write(&fence, b"") {
            tracing::warn!(fence = %fence.display(), error = %e, "cannot write a barrier fence; walking the whole tree");
            self.drain();
            return None;
        }
        let deadline = Instant::now() + FENCE_WAIT;
        let mut st = self.shared.lock();
        // Lost events may include the fence itself (an overflowing queue drops what follows):
        // the answer is a full walk then, so there is nothing to wait for.
        while st.fence_seen < n && !st.lost {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.fence_timeouts += 1;
                break;
            }
            st = self
                .shared
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let arrived = st.fence_seen >= n;
        let changed = std::mem::take(&mut st.changed);
        let lost = std::mem::take(&mut st.lost);
        drop(st);
        let _ = std::fs::remove_file(&fence);
        if !arrived && !lost {
            tracing::warn!(
                "a barrier fence did not arrive within {FENCE_WAIT:?}; walking the whole tree"
            );
        }
        (arrived && !lost && !self.broken).then_some(changed)
    }

    /// Forgets the changes so far, before a full walk that will see them anyway (events of
    /// earlier changes still on their way land in the next set: harmless).
    pub fn drain(&self) {
        let mut st = self.shared.lock();
        st.changed.clear();
        st.lost = false;
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if self.watches.take().is_some() {
            // Wake the reading thread with one last fence; it sees `stop` and closes the
            // instance.
            self.shared.lock().stop = true;
            let _ = std::fs::write(self.fence_dir.join("0"), b"");
        }
        let _ = std::fs::remove_dir_all(&self.fence_dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use shared::manifest::Rules;
    use shared::scan::Scanner;

    fn mess_with(root: &Path, r: &mut StdRng, step: usize) {
        let dirs = ["", "a", "a/b", "a/b/c", "d", "target", "n"];
        let d = root.join(dirs[r.random_range(0..dirs.len() as u64) as usize]);
        let f = d.join(format!("f{}", r.random_range(0..5)));
        match r.random_range(0..8) {
            0..=2 => {
                std::fs::create_dir_all(&d).unwrap();
                if !f.is_dir() {
                    std::fs::write(&f, format!("{step}")).unwrap();
                }
            }
            3 => {
                let _ = std::fs::remove_file(&f);
            }
            4 => {
                // A whole new tree at once, as `tar x` or `git checkout` makes one.
                let t = d.join(format!("t{}", r.random_range(0..3)));
                for i in 0..r.random_range(0..20) {
                    let p = t.join(format!("x{}/y{i}", i % 3));
                    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                    std::fs::write(p, format!("{step}/{i}")).unwrap();
                }
            }
            5 => {
                let from = d.join(format!("t{}", r.random_range(0..3)));
                let to = root.join(format!("m{}", r.random_range(0..3)));
                if from.is_dir() {
                    let _ = std::fs::remove_dir_all(&to);
                    std::fs::rename(&from, &to).unwrap();
                    // Written in the moved tree right away, before anything re-watches it.
                    std::fs::write(to.join("after-move"), format!("{step}")).unwrap();
                }
            }
            6 => {
                let _ = std::fs::remove_dir_all(d.join(format!("t{}", r.random_range(0..3))));
            }
            _ => {
                std::fs::create_dir_all(&d).unwrap();
                let _ = std::fs::remove_file(d.join("link"));
                std::os::unix::fs::symlink(format!("f{}", r.random_range(0..5)), d.join("link"))
                    .unwrap();
            }
        }
    }

    #[test]
    fn barriers_from_watcher_events_agree_with_full_walks() {
        let state = tempfile::tempdir().unwrap();
        for seed in 1..=12u64 {
            let d = tempfile::tempdir().unwrap();
            let root = d.path();
            std::fs::write(root.join(".gitignore"), "n/\n").unwrap();
            let mut t = Tracker::new(root, &state.path().join("fences"));
            let mut s = Scanner::new(root, Rules::default());
            let mut r = StdRng::seed_from_u64(seed);
            let mut partial = 0;
            for step in 0..25 {
                let changed = t.take();
                let got = match changed {
                    Some(c) => s.scan_changes(&c, &mut |d| t.watch_dir(d)),
                    None => s.scan_full(&mut |d| t.watch_dir(d)),
                }
                .unwrap()
                .clone();
                partial += usize::from(!s.was_full);
                let want = Scanner::new(root, Rules::default()).scan().unwrap();
                assert!(
                    got == want,
                    "seed {seed} step {step}: the tracked scan disagrees with a full walk: {:?}",
                    got.diff(&want)
                );
                for _ in 0..=r.random_range(0..4) {
                    mess_with(root, &mut r, step);
                }
            }
            assert!(
                partial >= 20,
                "seed {seed}: only {partial} of 25 scans were partial"
            );
        }
    }

    #[test]
    fn a_barrier_after_one_change_lists_one_directory() {
        let state = tempfile::tempdir().unwrap();
        let d = tempfile::tempdir().unwrap();
        for i in 0..200 {
            let p = d.path().join(format!("d{}/s{}/f{i}", i % 10, i % 7));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "x").unwrap();
        }
        let mut t = Tracker::new(d.path(), &state.path().join("fences"));
        let mut s = Scanner::new(d.path(), Rules::default());
        s.scan_full(&mut |p| t.watch_dir(p)).unwrap();
        assert_eq!(t.take().as_ref().map(|c| c.len()), Some(0));
        std::fs::write(d.path().join("d3/s3/f3"), "changed").unwrap();
        let c = t.take().expect("the watcher works");
        assert_eq!(c.into_iter().collect::<Vec<_>>(), ["d3/s3/f3"]);
    }

    #[test]
    fn a_write_through_a_memory_mapping_is_seen_when_the_mapping_goes() {
        use std::os::fd::AsRawFd;
        let state = tempfile::tempdir().unwrap();
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("db")).unwrap();
        std::fs::write(d.path().join("db/pages"), [0u8; 4096]).unwrap();
        let mut t = Tracker::new(d.path(), &state.path().join("fences"));
        let mut s = Scanner::new(d.path(), Rules::default());
        s.scan_full(&mut |p| t.watch_dir(p)).unwrap();
        assert_eq!(t.take().as_ref().map(|c| c.len()), Some(0));
        // Opened for reading and writing, mapped, the descriptor closed at once, then written
        // through the mapping only: no write(2), so no MODIFY event.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(d.path().join("db/pages"))
            .unwrap();
        // SAFETY: a shared mapping of a 4096-byte file we own, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        drop(f);
        // SAFETY: `p` maps 4096 writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(b"written".as_ptr(), p as *mut u8, 7) };
        assert_eq!(
            t.take().map(|c| c.len()),
            Some(0),
            "nothing to see while the file is still mapped"
        );
        // SAFETY: unmaps what was mapped above.
        assert_eq!(unsafe { libc::munmap(p, 4096) }, 0);
        let c = t.take().expect("the watcher works");
        assert_eq!(c.into_iter().collect::<Vec<_>>(), ["db/pages"]);
        let m = s
            .scan_changes(&["db/pages".to_string()].into(), &mut |_| {})
            .unwrap();
        assert_eq!(
            m.get("db/pages").unwrap().hash,
            shared::manifest::hash(&std::fs::read(d.path().join("db/pages")).unwrap())
        );
    }

    #[test]
    fn a_flood_of_changes_is_answered_without_waiting_out_the_fence() {
        let state = tempfile::tempdir().unwrap();
        let d = tempfile::tempdir().unwrap();
        let mut t = Tracker::new(d.path(), &state.path().join("fences"));
        t.watch_dir(d.path());
        let max: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(16384);
        // More events than the kernel queues (each write is several), made while the
        // reader is held up, so the queue overflows and drops the fence too.
        let guard = t.shared.state.locked();
        for i in 0..max {
            std::fs::write(d.path().join(format!("f{i}")), "x").unwrap();
        }
        drop(guard);
        match t.take() {
            None => assert_eq!(
                t.fence_timeouts, 0,
                "waited out a fence the overflow dropped"
            ),
            Some(c) => assert_eq!(c.len(), max, "no overflow, so every write was seen"),
        }
        // And the next barrier is back to normal.
        std::fs::write(d.path().join("f0"), "y").unwrap();
        let c = t.take().expect("the watcher works again");
        assert!(c.contains("f0"));
        assert_eq!(t.fence_timeouts, 0);
    }
}
