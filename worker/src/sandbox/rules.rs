//! The Landlock side of confinement: the kernel's ABI, and the ruleset a command restricts
//! itself with — read everywhere but the denied subtrees (carved around them), read and
//! write in the workspace, its temp dir and /dev/null — built once per workspace and reused
//! for [`ROOTS_TTL`].

use shared::locks::Lock;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr, path_beneath_rules,
};

/// Why a workspace's Landlock ruleset cannot be had (the command is not started).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot build the Landlock ruleset: {0}")]
    Build(#[from] landlock::RulesetError),
    #[error("the kernel refused to create a Landlock ruleset; see `worker doctor`")]
    Refused,
}

/// The Landlock ABI we require: 3 adds control of truncation, without which a command could
/// still empty a file it may only read.
const LANDLOCK_ABI: ABI = ABI::V3;

/// The opened Landlock read roots (each with whether it is a directory) and when they were
/// carved.
type RootsCache = (
    std::time::Instant,
    std::sync::Arc<Vec<(landlock::PathFd, bool)>>,
);

/// A built Landlock ruleset's descriptor and when it was built.
type RulesetCache = (std::time::Instant, std::sync::Arc<OwnedFd>);

/// How long carved Landlock roots are reused. An entry created in a carved directory (such as
/// the home directory itself) in that window is not readable by commands until it passes.
const ROOTS_TTL: std::time::Duration = std::time::Duration::from_secs(2);

pub(super) fn landlock_abi() -> Option<i64> {
    // landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    // SAFETY: this form of the syscall only returns the ABI version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    (v > 0).then_some(v)
}

type RulesetKey = (PathBuf, [(u64, u64); 2]);

/// Built rulesets by workspace, and the carved read roots (shared by every clone of the
/// sandbox).
#[derive(Debug, Clone, Default)]
pub(super) struct Rules {
    /// The read-only Landlock roots, opened, and when: carving and opening them costs more
    /// than the rest of a spawn, so they are reused for a moment.
    roots: std::sync::Arc<std::sync::Mutex<Option<RootsCache>>>,
    /// Landlock rulesets by workspace (its path, and the workspace's and temp dir's device
    /// and inode: a ruleset holds the directories it was built from, so one made again gets
    /// a new one), and when they were built.
    rulesets: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<RulesetKey, RulesetCache>>>,
}

impl Rules {
    /// The carved read-only roots, opened (cached for [`ROOTS_TTL`]).
    fn read_roots(&self, denied: &[PathBuf]) -> std::sync::Arc<Vec<(landlock::PathFd, bool)>> {
        let mut g = self.roots.locked();
        if let Some((at, fds)) = g.as_ref()
            && at.elapsed() < ROOTS_TTL
        {
            return fds.clone();
        }
        let mut roots = Vec::new();
        carve(Path::new("/"), denied, &mut roots);
        let fds = std::sync::Arc::new(
            roots
                .iter()
                .filter_map(|p| {
                    let is_dir = std::fs::metadata(p).is_ok_and(|m| m.is_dir());
                    landlock::PathFd::new(p).ok().map(|fd| (fd, is_dir))
                })
                .collect::<Vec<_>>(),
        );
        *g = Some((std::time::Instant::now(), fds.clone()));
        fds
    }

    /// The Landlock ruleset for a workspace, built once and reused for [`ROOTS_TTL`]: each
    /// child restricts itself with the inherited descriptor.
    pub(super) fn ruleset_fd(
        &self,
        denied: &[PathBuf],
        workspace: &Path,
        tmp: &Path,
    ) -> Result<std::sync::Arc<OwnedFd>, Error> {
        let key = (
            workspace.to_path_buf(),
            [
                super::spawner::dir_id(workspace),
                super::spawner::dir_id(tmp),
            ],
        );
        let mut cache = self.rulesets.locked();
        if let Some((at, fd)) = cache.get(&key)
            && at.elapsed() < ROOTS_TTL
        {
            return Ok(fd.clone());
        }
        let created = self.ruleset(denied, workspace, tmp)?;
        let fd: Option<OwnedFd> = created.into();
        let fd = std::sync::Arc::new(fd.ok_or(Error::Refused)?);
        if cache.len() > 256 {
            cache.clear();
        }
        cache.insert(key, (std::time::Instant::now(), fd.clone()));
        Ok(fd)
    }

    /// Read everywhere except the denied subtrees; read and write in the workspace, the temp
    /// dir and /dev/null.
    fn ruleset(
        &self,
        denied: &[PathBuf],
        workspace: &Path,
        tmp: &Path,
    ) -> Result<RulesetCreated, landlock::RulesetError> {
        let read = AccessFs::from_read(LANDLOCK_ABI);
        let all = AccessFs::from_all(LANDLOCK_ABI);
        let roots = self.read_roots(denied);
        Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(all)?
            .create()?
            .add_rules(roots.iter().map(|(fd, is_dir)| {
                // Files take only the rights that make sense for a file.
                let access = if *is_dir {
                    read
                } else {
                    read & AccessFs::from_file(LANDLOCK_ABI)
                };
                Ok::<_, landlock::RulesetError>(landlock::PathBeneath::new(fd, access))
            }))?
            .add_rules(path_beneath_rules(
                [workspace, tmp, Path::new("/dev/null")],
                all,
            ))
    }
}

/// Collects paths that together cover `dir` minus the denied subtrees: a dir with nothing
/// denied inside is taken whole; one with denied parts is opened up and its other entries
/// taken. Symlinks into a denied subtree are left out.
fn carve(dir: &Path, denied: &[PathBuf], out: &mut Vec<PathBuf>) {
    if denied.iter().any(|d| d == dir) {
        return;
    }
    if !denied.iter().any(|d| d.starts_with(dir)) {
        out.push(dir.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_symlink()) {
            match p.canonicalize() {
                // Into a denied subtree, or onto a directory that holds one: granting it
                // would grant the secret.
                Ok(t) if denied.iter().any(|d| t.starts_with(d) || d.starts_with(&t)) => continue,
                Ok(_) => out.push(p),
                Err(_) => {}
            }
            continue;
        }
        carve(&p, denied, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carving_leaves_out_denied_subtrees_only() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        for p in ["a/secret/x", "a/open/y", "b/z"] {
            std::fs::create_dir_all(root.join(p)).unwrap();
        }
        std::os::unix::fs::symlink(root.join("a/secret"), root.join("a/sneaky")).unwrap();
        let denied = vec![root.join("a/secret")];
        let mut out = Vec::new();
        carve(&root, &denied, &mut out);
        out.sort();
        assert_eq!(out, vec![root.join("a/open"), root.join("b")]);
    }
}
