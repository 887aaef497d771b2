//! The one place where a path from the wire becomes a path on disk.
//!
//! Every receiver (worker or brain) resolves wire paths with [`confine`]: it rejects absolute
//! paths, `..`, NUL and control characters, and symlinks whose target leaves the root, and it
//! names the offending path in the error. Nothing else in Tether joins a wire path onto a root.

use std::io;
use std::path::{Component, Path, PathBuf};

/// Why a wire path was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("path {path:?} rejected: {reason}")]
    Rejected { path: String, reason: &'static str },
    #[error("path {path:?} rejected: symlink {link:?} resolves outside the workspace")]
    SymlinkEscape { path: String, link: String },
    #[error("workspace root {root:?} is not usable: {source}")]
    Root {
        root: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("path {path:?}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The same error, naming `path` (the whole wire path) instead of a prefix of it.
    fn for_path(self, path: &str) -> Self {
        let path = path.to_string();
        match self {
            Error::Rejected { reason, .. } => Error::Rejected { path, reason },
            Error::SymlinkEscape { link, .. } => Error::SymlinkEscape { path, link },
            Error::Io { source, .. } => Error::Io { path, source },
            other => other,
        }
    }
}

/// Where a worker's confined commands see their workspace (each in a mount namespace of its
/// own): the same path on every worker.
pub const WORKSPACE_IN_SANDBOX: &str = "/workspace";

/// Longest wire path accepted, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;

/// Checks the text of a workspace-relative path without touching the disk and returns its
/// normal components. The empty path and `.` mean the root itself.
pub fn check_relative(path: &str) -> Result<Vec<&str>, Error> {
    let reject = |reason| Error::Rejected {
        path: path.to_string(),
        reason,
    };
    if path.len() > MAX_PATH_BYTES {
        return Err(reject("longer than 4096 bytes"));
    }
    if path.contains('\0') {
        return Err(reject("contains a NUL byte"));
    }
    if path.chars().any(char::is_control) {
        return Err(reject("contains a control character"));
    }
    if path.starts_with('/') || path.starts_with('\\') {
        return Err(reject(
            "absolute paths are not allowed; use a path relative to the workspace",
        ));
    }
    let mut parts = Vec::new();
    for comp in Path::new(path).components() {
        match comp {
            Component::Normal(c) => parts.push(c.to_str().ok_or_else(|| reject("not UTF-8"))?),
            Component::CurDir => {}
            Component::ParentDir => return Err(reject("'..' is not allowed")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(reject("absolute paths are not allowed"));
            }
        }
    }
    Ok(parts)
}

/// Resolves `path` (relative, from the wire) under `root`, following symlinks only while they
/// stay inside the root. Returns the resolved absolute path, which may not exist yet (its
/// missing tail is made of plain components, so it cannot leave the root once created).
///
/// A symlink whose target does not exist is refused too: writing through it would create a
/// file wherever it points.
pub fn confine(root: &Path, path: &str) -> Result<PathBuf, Error> {
    let parts = check_relative(path)?;
    let root = root.canonicalize().map_err(|source| Error::Root {
        root: root.to_path_buf(),
        source,
    })?;
    let mut cur = root.clone();
    let mut iter = parts.iter();
    for part in iter.by_ref() {
        cur.push(part);
        match std::fs::symlink_metadata(&cur) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let escape = || Error::SymlinkEscape {
                    path: path.to_string(),
                    link: cur
                        .strip_prefix(&root)
                        .unwrap_or(&cur)
                        .display()
                        .to_string(),
                };
                let resolved = cur.canonicalize().map_err(|_| escape())?;
                if !resolved.starts_with(&root) {
                    return Err(escape());
                }
                cur = resolved;
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => break,
            Err(source) => {
                return Err(Error::Io {
                    path: path.to_string(),
                    source,
                });
            }
        }
    }
    for part in iter {
        cur.push(part);
    }
    Ok(cur)
}

/// Resolves the parent of `path` like [`confine`] and returns it with the final component,
/// which is *not* followed if it is a symlink. Used to write, replace or remove an entry
/// itself rather than whatever it points at. The root itself has no parent and is refused.
pub fn confine_parent(root: &Path, path: &str) -> Result<(PathBuf, String), Error> {
    let parts = check_relative(path)?;
    let Some((name, parent)) = parts.split_last() else {
        return Err(Error::Rejected {
            path: path.to_string(),
            reason: "this operation needs a path inside the workspace, not its root",
        });
    };
    let resolved = confine(root, &parent.join("/")).map_err(|e| e.for_path(path))?;
    Ok((resolved, (*name).to_string()))
}

/// Checks a workspace name: one short path component of `[A-Za-z0-9._-]`, not starting with a dot.
pub fn check_workspace_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::Rejected {
            path: name.to_string(),
            reason: "a workspace name is 1-64 characters of [A-Za-z0-9._-] and does not start with '.'",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn root() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn plain_paths_resolve_under_root() {
        let d = root();
        let canon = d.path().canonicalize().unwrap();
        assert_eq!(confine(d.path(), "a/b.txt").unwrap(), canon.join("a/b.txt"));
        assert_eq!(confine(d.path(), "").unwrap(), canon);
        assert_eq!(confine(d.path(), "./x").unwrap(), canon.join("x"));
    }

    #[test]
    fn textual_escapes_are_rejected_with_the_path_named() {
        let d = root();
        for bad in ["../x", "a/../../x", "/etc/passwd", "a\0b", "a\nb", "a/.."] {
            let err = confine(d.path(), bad).unwrap_err();
            assert!(matches!(err, Error::Rejected { .. }), "{bad:?}: {err}");
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        assert!(confine(d.path(), &"a/".repeat(3000)).is_err());
    }

    #[test]
    fn symlinks_leaving_the_root_are_rejected() {
        let d = root();
        symlink("/", d.path().join("out")).unwrap();
        symlink("/nonexistent/place", d.path().join("dangling")).unwrap();
        std::fs::create_dir(d.path().join("in")).unwrap();
        symlink("in", d.path().join("inner")).unwrap();
        for bad in ["out", "out/etc/passwd", "dangling", "dangling/x"] {
            let err = confine(d.path(), bad).unwrap_err();
            assert!(matches!(err, Error::SymlinkEscape { .. }), "{bad}: {err}");
        }
        let canon = d.path().canonicalize().unwrap();
        assert_eq!(confine(d.path(), "inner/f").unwrap(), canon.join("in/f"));
    }

    #[test]
    fn parent_confinement_does_not_follow_the_final_link() {
        let d = root();
        symlink("/etc/passwd", d.path().join("link")).unwrap();
        let (parent, name) = confine_parent(d.path(), "link").unwrap();
        assert_eq!(parent, d.path().canonicalize().unwrap());
        assert_eq!(name, "link");
        assert!(confine_parent(d.path(), "").is_err());
        symlink("/", d.path().join("out")).unwrap();
        let err = confine_parent(d.path(), "out/etc/passwd").unwrap_err();
        assert!(err.to_string().contains("\"out/etc/passwd\""), "{err}");
    }

    #[test]
    fn workspace_names() {
        assert!(check_workspace_name("default").is_ok());
        assert!(check_workspace_name("task-12.a_b").is_ok());
        for bad in ["", ".", "..", "a/b", ".hidden", &"x".repeat(65)] {
            assert!(check_workspace_name(bad).is_err(), "{bad:?}");
        }
    }
}
