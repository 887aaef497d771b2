//! A user of its own for each task on a root worker: each workspace's commands run as a uid
//! from a range (`--task-uids`, 1800000-1865535 by default), so the commands of one task
//! cannot signal, trace or read the processes of another, nor its files where Landlock and
//! the mount namespace are missing.
//!
//! The allocation is kept where it matters, in the worker's state: a workspace's uid is the
//! owner of its directory. A workspace not yet owned by a uid of the range (a new one, or one
//! an earlier version gave to `nobody`) gets the lowest uid no sibling workspace owns, under
//! a lock, and what it holds is handed over (entries owned by root or its old owner, walked
//! through directory descriptors, never following a symlink). A removed workspace frees its
//! uid.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use shared::locks::Lock;

/// Why a range of task uids is refused, or a workspace cannot have a task user of its own.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0:?} is not a uid range: write FIRST-LAST, e.g. 1800000-1865535")]
    NotRange(String),
    #[error(
        "task uids {0} would include login, system or special ids (nobody is 65534, -1 means none): start at 100000 or above and end below 4294967295"
    )]
    SpecialIds(String),
    #[error("cannot read the workspace {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the workspace {0} is not a directory")]
    NotDir(PathBuf),
    #[error(
        "every task uid ({uids}) is taken by a workspace under {under}: remove finished workspaces or widen --task-uids"
    )]
    AllTaken { uids: TaskUids, under: PathBuf },
    #[error("the workspace path {0} holds a NUL")]
    Nul(PathBuf),
    #[error("cannot open the workspace {workspace}: {source}")]
    Open {
        workspace: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot give the workspace {workspace} to uid {uid}: {source}")]
    HandOver {
        workspace: PathBuf,
        uid: u32,
        #[source]
        source: std::io::Error,
    },
}

/// The uids tasks run as: `first` and the `count` after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskUids {
    pub first: u32,
    pub count: u32,
}

impl Default for TaskUids {
    /// 65536 uids from 1800000: above the usual login, system and `nobody` ids, below the
    /// 2^21 that old tar formats can store, and outside the 100000+ blocks distributions hand
    /// out in /etc/subuid for the first users.
    fn default() -> Self {
        Self {
            first: 1_800_000,
            count: 65_536,
        }
    }
}

impl std::fmt::Display for TaskUids {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last())
    }
}

impl std::str::FromStr for TaskUids {
    type Err = Error;
    /// `FIRST-LAST`, both included.
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::NotRange(s.to_string());
        let (a, b) = s.split_once('-').ok_or_else(bad)?;
        let (first, last): (u32, u32) = (
            a.trim().parse().map_err(|_| bad())?,
            b.trim().parse().map_err(|_| bad())?,
        );
        if last < first {
            return Err(bad());
        }
        if first < 100_000 || last == u32::MAX {
            return Err(Error::SpecialIds(s.to_string()));
        }
        Ok(Self {
            first,
            count: last - first + 1,
        })
    }
}

impl TaskUids {
    pub fn last(&self) -> u32 {
        self.first + (self.count - 1)
    }

    pub fn contains(&self, uid: u32) -> bool {
        uid >= self.first && uid - self.first < self.count
    }

    /// The uid of the workspace `ws` (an existing directory), allocated and handed over now
    /// if it has none. `lock` serialises allocations among the worker's threads.
    pub(super) fn owner(&self, ws: &Path, lock: &std::sync::Mutex<()>) -> Result<u32, Error> {
        let meta = |p: &Path| {
            std::fs::symlink_metadata(p).map_err(|source| Error::Read {
                path: p.to_path_buf(),
                source,
            })
        };
        let uid = meta(ws)?.uid();
        if self.contains(uid) {
            return Ok(uid);
        }
        let _held = lock.locked();
        let m = meta(ws)?;
        if !m.is_dir() {
            return Err(Error::NotDir(ws.to_path_buf()));
        }
        if self.contains(m.uid()) {
            return Ok(m.uid());
        }
        let mut used = std::collections::BTreeSet::new();
        if let Some(parent) = ws.parent()
            && let Ok(entries) = std::fs::read_dir(parent)
        {
            for e in entries.flatten() {
                if let Ok(em) = e.metadata()
                    && self.contains(em.uid())
                {
                    used.insert(em.uid());
                }
            }
        }
        let uid = (self.first..=self.last())
            .find(|u| !used.contains(u))
            .ok_or_else(|| Error::AllTaken {
                uids: *self,
                under: ws.parent().unwrap_or(ws).to_path_buf(),
            })?;
        let old = m.uid();
        let c = CString::new(ws.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::Nul(ws.to_path_buf()))?;
        use rustix::fs::{Mode, OFlags};
        let dir = rustix::fs::open(
            c.as_c_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::Open {
            workspace: ws.to_path_buf(),
            source: e.into(),
        })?;
        let hand_over = |source| Error::HandOver {
            workspace: ws.to_path_buf(),
            uid,
            source,
        };
        hand_over_tree(&dir, &[0, old], uid, 0).map_err(hand_over)?;
        // The directory itself last: it is the record of the allocation. Only its user
        // may enter it (the mode first, while the worker still owns it).
        rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o700))
            .and_then(|()| {
                rustix::fs::fchown(
                    &dir,
                    Some(rustix::fs::Uid::from_raw(uid)),
                    Some(rustix::fs::Gid::from_raw(uid)),
                )
            })
            .map_err(|e| hand_over(e.into()))?;
        tracing::info!(workspace = %ws.display(), uid, "workspace given a task user of its own");
        Ok(uid)
    }
}

/// Gives every entry under the directory `dir` owned by one of `from` to `uid` (and the
/// group of the same number), descending through descriptors opened with `O_NOFOLLOW`: a
/// symlink is changed itself, never followed, so nothing outside can be reached.
fn hand_over_tree(dir: &OwnedFd, from: &[u32], uid: u32, depth: u32) -> std::io::Result<()> {
    if depth > 4096 {
        return Err(std::io::Error::other("the tree is deeper than 4096 levels"));
    }
    let entries = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))?;
    for e in entries {
        let e = e?;
        let name = CString::new(e.file_name().as_encoded_bytes())
            .map_err(|_| std::io::Error::other("a name holds a NUL"))?;
        use rustix::fs::{AtFlags, FileType, Mode, OFlags};
        let Ok(st) = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        if from.contains(&st.st_uid) {
            // SYMLINK_NOFOLLOW: a symlink is changed itself.
            let owner = Some(rustix::process::Uid::from_raw(uid));
            let group = Some(rustix::process::Gid::from_raw(uid));
            rustix::fs::chownat(dir, &name, owner, group, AtFlags::SYMLINK_NOFOLLOW)?;
        }
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let Ok(sub) = rustix::fs::openat(dir, &name, flags, Mode::empty()) else {
                continue;
            };
            hand_over_tree(&sub, from, uid, depth + 1)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_refuse_special_ids() {
        let r: TaskUids = "1800000-1865535".parse().unwrap();
        assert_eq!(r, TaskUids::default());
        assert_eq!(r.to_string(), "1800000-1865535");
        assert!(r.contains(1_800_000) && r.contains(1_865_535) && !r.contains(1_865_536));
        for bad in [
            "",
            "5",
            "9-8",
            "0-70000",
            "60000-70000",
            "200000-4294967295",
            "a-b",
        ] {
            assert!(bad.parse::<TaskUids>().is_err(), "{bad}");
        }
    }

    /// Workspaces get distinct uids, keep them, free them when removed; what they hold is
    /// handed over (from root, or from nobody for a workspace an earlier version made), and a
    /// symlink to the outside is not followed.
    #[test]
    fn workspaces_get_uids_of_their_own() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped workspaces_get_uids_of_their_own: chown needs root");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        let root = d.path().join("workspaces");
        let (a, b) = (root.join("a"), root.join("b"));
        std::fs::create_dir_all(a.join("sub")).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("sub/f"), "f").unwrap();
        std::os::unix::fs::symlink(&outside, a.join("sub/link")).unwrap();
        // `a` as an earlier version left it: given to nobody, with a stranger's file inside.
        std::fs::write(a.join("sub/stranger"), "s").unwrap();
        for (p, u) in [
            (&a, 65534),
            (&a.join("sub/f"), 65534),
            (&a.join("sub/stranger"), 4242),
        ] {
            std::os::unix::fs::lchown(p, Some(u), Some(u)).unwrap();
        }
        let uids = TaskUids {
            first: 3_000_000,
            count: 2,
        };
        let lock = std::sync::Mutex::new(());
        let ua = uids.owner(&a, &lock).unwrap();
        let ub = uids.owner(&b, &lock).unwrap();
        assert_eq!((ua, ub), (3_000_000, 3_000_001));
        assert_eq!(uids.owner(&a, &lock).unwrap(), ua, "kept");
        let uid = |p: &Path| std::fs::symlink_metadata(p).unwrap().uid();
        assert_eq!(uid(&a.join("sub/f")), ua);
        assert_eq!(uid(&a.join("sub/link")), ua);
        assert_eq!(uid(&outside), 0, "the symlink was followed");
        assert_eq!(
            uid(&a.join("sub/stranger")),
            4242,
            "only root's and nobody's entries"
        );
        assert_eq!(std::fs::metadata(&a).unwrap().mode() & 0o777, 0o700);
        let c = root.join("c");
        std::fs::create_dir_all(&c).unwrap();
        let e = uids.owner(&c, &lock).unwrap_err().to_string();
        assert!(
            e.contains("every task uid") && e.contains("--task-uids"),
            "{e}"
        );
        std::fs::remove_dir_all(&b).unwrap();
        assert_eq!(
            uids.owner(&c, &lock).unwrap(),
            ub,
            "a removed workspace frees its uid"
        );
    }
}
