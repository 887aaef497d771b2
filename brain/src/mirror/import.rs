//! Importing a task's starting workspace into the mirror: from a git repository the brain
//! clones itself (with whatever credentials the brain's own git has — nothing of them
//! reaches a worker), checked by the same manifest rules as any sync.

use std::path::Path;
use std::time::Duration;

use shared::manifest::{Kind, Rules};
use shared::scan::Scanner;

use crate::mirror::Mirror;

/// How long a clone may take.
const CLONE_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("git clone of {url} failed: {reason}")]
    Clone { url: String, reason: String },
    #[error("importing {url}: {reason}")]
    Import { url: String, reason: String },
}

/// What an import stored.
#[derive(Debug, Clone)]
pub struct Imported {
    pub root_hash: String,
    pub files: u64,
    pub bytes: u64,
}

/// Clones `url` (at `reference`, a branch or tag, if given; shallow) and stores its tree in
/// the mirror. `.git/` is not part of the workspace.
pub async fn from_git(
    mirror: &Mirror,
    url: &str,
    reference: &str,
    rules: Rules,
) -> Result<Imported, Error> {
    if url.starts_with('-') || reference.starts_with('-') {
        return Err(Error::Clone {
            url: url.into(),
            reason: "a URL or ref may not start with '-'".into(),
        });
    }
    let tmp = tempfile::tempdir().map_err(|e| Error::Clone {
        url: url.into(),
        reason: e.to_string(),
    })?;
    let dest = tmp.path().join("repo");
    let mut cmd = tokio::process::Command::new("git");
    cmd.args(["clone", "--quiet", "--depth", "1", "--no-tags"]);
    if !reference.is_empty() {
        cmd.args(["--branch", reference]);
    }
    cmd.arg("--")
        .arg(url)
        .arg(&dest)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(CLONE_TIMEOUT, cmd.output())
        .await
        .map_err(|_| Error::Clone {
            url: url.into(),
            reason: format!("no answer within {CLONE_TIMEOUT:?}"),
        })?
        .map_err(|e| Error::Clone {
            url: url.into(),
            reason: format!("cannot run git ({e}): is git installed on the brain's machine?"),
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(Error::Clone {
            url: url.into(),
            reason: err.trim().chars().take(1000).collect(),
        });
    }
    let (mirror, u) = (mirror.clone(), url.to_string());
    tokio::task::spawn_blocking(move || store_dir(&mirror, &dest, &u, rules))
        .await
        .map_err(|e| Error::Import {
            url: url.into(),
            reason: e.to_string(),
        })?
}

/// Stores a directory's tree (by the workspace rules) in the mirror.
pub fn store_dir(
    mirror: &Mirror,
    dir: &Path,
    source: &str,
    rules: Rules,
) -> Result<Imported, Error> {
    let err = |reason: String| Error::Import {
        url: source.into(),
        reason,
    };
    let m = Scanner::new(dir, rules)
        .scan()
        .map_err(|e| err(e.to_string()))?;
    for (path, e) in &m.entries {
        if e.kind == Kind::File && !mirror.has(&e.hash) {
            let data = std::fs::read(dir.join(path)).map_err(|e| err(format!("{path}: {e}")))?;
            let h = mirror.put(&data).map_err(|e| err(e.to_string()))?;
            if h != e.hash {
                return Err(err(format!("{path} changed while it was imported")));
            }
        }
    }
    mirror.sync().map_err(|e| err(e.to_string()))?;
    let root_hash = mirror.put_manifest(&m).map_err(|e| err(e.to_string()))?;
    Ok(Imported {
        root_hash,
        files: m.entries.values().filter(|e| e.kind == Kind::File).count() as u64,
        bytes: m.bytes(),
    })
}
