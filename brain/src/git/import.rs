//! Importing a task's starting workspace into the mirror: from a git repository the brain
//! clones itself (with the brain's own git credentials, or the ones its config gives — none of
//! them reaches a worker), checked by the same manifest rules as any sync. The clone's `.git/`
//! is part of the workspace, so the agent can run `git status` and `git diff`, but cleaned
//! first: a config of the brain's own making (the origin's URL without userinfo, no
//! credential helpers, nothing of the brain user's config), no hooks. The same git directory
//! is kept in [`Repos`] for the delivery to commit on.

use std::path::{Path, PathBuf};

use shared::manifest::{Kind, Rules};
use shared::scan::Scanner;

use super::{Credentials, Git, Repos, remote};
use crate::mirror::Mirror;
use crate::model::delivery::strip_userinfo;

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
    /// The commit imported and its branch (empty: a detached head).
    pub commit: String,
    pub branch: String,
    /// The repository's URL without userinfo.
    pub url: String,
}

/// Clones `url` (at `reference`, a branch or tag, if given; shallow), stores its tree with a
/// cleaned `.git/` in the mirror and keeps the git directory in `repos`.
pub async fn from_git(
    mirror: &Mirror,
    repos: &Repos,
    url: &str,
    reference: &str,
    mut rules: Rules,
    creds: &Credentials,
    policy: &remote::Policy,
) -> Result<Imported, Error> {
    let shown = strip_userinfo(url);
    let clone_err = |reason: String| Error::Clone {
        url: shown.clone(),
        reason,
    };
    if url.starts_with('-') || reference.starts_with('-') {
        return Err(clone_err("a URL or ref may not start with '-'".into()));
    }
    let checked = policy
        .check(url)
        .await
        .map_err(|e| clone_err(e.to_string()))?;
    std::fs::create_dir_all(repos.root()).map_err(|e| clone_err(e.to_string()))?;
    let tmp = tempfile::Builder::new()
        .prefix(".import-")
        .tempdir_in(repos.root())
        .map_err(|e| clone_err(e.to_string()))?;
    let dest = tmp.path().join("repo");
    let mut args = vec!["clone", "--quiet", "--depth", "1", "--no-tags"];
    if !reference.is_empty() {
        args.extend(["--branch", reference]);
    }
    let dest_s = dest.to_string_lossy().into_owned();
    args.extend(["--", url, &dest_s]);
    Git::remote(&args, creds, &checked)
        .run()
        .await
        .map_err(|e| clone_err(mask(&e.to_string(), url, &shown)))?;
    let git_dir = dest.join(".git");
    let commit = Git::local(Some(&git_dir), &["rev-parse", "HEAD"])
        .text()
        .await
        .map_err(|e| clone_err(e.to_string()))?;
    let branch = match reference {
        "" => Git::local(Some(&git_dir), &["symbolic-ref", "--short", "-q", "HEAD"])
            .text()
            .await
            .unwrap_or_default(),
        r => r.to_string(),
    };
    clean_git_dir(&git_dir, &shown, &branch)
        .await
        .map_err(|e| clone_err(format!("cleaning .git: {e}")))?;
    rules.include_git = true;
    let (m, d, u) = (mirror.clone(), dest.clone(), shown.clone());
    let stored = tokio::task::spawn_blocking(move || store_dir(&m, &d, &u, rules))
        .await
        .map_err(|e| Error::Import {
            url: shown.clone(),
            reason: e.to_string(),
        })??;
    // Kept for deliveries; another task from the same commit may have kept it already.
    if let Ok(keep) = repos.path(&commit)
        && !keep.exists()
        && let Err(e) = std::fs::rename(&git_dir, &keep)
        && !keep.exists()
    {
        return Err(Error::Import {
            url: shown,
            reason: format!("keeping the git directory at {}: {e}", keep.display()),
        });
    }
    Ok(Imported {
        root_hash: stored.root_hash,
        files: stored.files,
        bytes: stored.bytes,
        commit,
        branch,
        url: shown,
    })
}

/// `text` with the URL as given (which may hold a credential) replaced by its shown form.
fn mask(text: &str, url: &str, shown: &str) -> String {
    if url == shown {
        text.to_string()
    } else {
        text.replace(url, shown)
    }
}

/// Replaces a fresh clone's config by one of our own (only what `git status`, `git diff` and
/// `git log` need, and the origin without userinfo) and removes its hooks.
async fn clean_git_dir(git_dir: &Path, url: &str, branch: &str) -> Result<(), super::Error> {
    let old = git_dir.join("config");
    let format = Git::local(
        None,
        &[
            "config",
            "--file",
            &old.to_string_lossy(),
            "--get",
            "extensions.objectformat",
        ],
    )
    .text()
    .await
    .unwrap_or_default();
    let new = git_dir.join("config.tether");
    let _ = std::fs::remove_file(&new);
    let file = new.to_string_lossy().into_owned();
    let mut settings: Vec<(String, String)> = vec![
        (
            "core.repositoryformatversion".into(),
            if format.is_empty() { "0" } else { "1" }.into(),
        ),
        ("core.filemode".into(), "true".into()),
        ("core.bare".into(), "false".into()),
    ];
    if !format.is_empty() {
        settings.push(("extensions.objectformat".into(), format));
    }
    settings.push(("remote.origin.url".into(), url.into()));
    if !branch.is_empty() {
        settings.push((
            "remote.origin.fetch".into(),
            format!("+refs/heads/{branch}:refs/remotes/origin/{branch}"),
        ));
        settings.push((format!("branch.{branch}.remote"), "origin".into()));
        settings.push((
            format!("branch.{branch}.merge"),
            format!("refs/heads/{branch}"),
        ));
    }
    for (k, v) in &settings {
        Git::local(None, &["config", "--file", &file, k, v])
            .run()
            .await?;
    }
    std::fs::rename(&new, &old).map_err(|e| super::Error::Io(format!("{}: {e}", old.display())))?;
    for gone in ["hooks", "FETCH_HEAD", "ORIG_HEAD"] {
        let p = git_dir.join(gone);
        let _ = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
    }
    Ok(())
}

/// Fetches `commit` alone (depth 1) from `url` into the git directory kept for deliveries
/// from it, when this brain holds none: a replica sharing the store delivers a task another
/// replica imported (whose git directory is on that replica's disk). Its path.
pub async fn fetch_commit(
    repos: &Repos,
    url: &str,
    commit: &str,
    creds: &Credentials,
    policy: &remote::Policy,
) -> Result<PathBuf, Error> {
    let shown = strip_userinfo(url);
    let fetch_err = |reason: String| Error::Clone {
        url: shown.clone(),
        reason: format!("fetching {commit} again: {reason}"),
    };
    if url.starts_with('-') || !super::is_object_id(commit) {
        return Err(fetch_err("not a URL and a commit id".into()));
    }
    let keep = repos.path(commit).map_err(|e| fetch_err(e.to_string()))?;
    if keep.is_dir() {
        return Ok(keep);
    }
    let checked = policy
        .check(url)
        .await
        .map_err(|e| fetch_err(e.to_string()))?;
    std::fs::create_dir_all(repos.root()).map_err(|e| fetch_err(e.to_string()))?;
    let tmp = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(repos.root())
        .map_err(|e| fetch_err(e.to_string()))?;
    let git_dir = tmp.path().join("git");
    let dir_s = git_dir.to_string_lossy().into_owned();
    Git::local(None, &["init", "--quiet", "--bare", "--", &dir_s])
        .run()
        .await
        .map_err(|e| fetch_err(e.to_string()))?;
    Git::remote(
        &[
            "fetch",
            "--quiet",
            "--depth",
            "1",
            "--no-tags",
            "--",
            url,
            commit,
        ],
        creds,
        &checked,
    )
    .env("GIT_DIR", &git_dir)
    .run()
    .await
    .map_err(|e| fetch_err(mask(&e.to_string(), url, &shown)))?;
    // What came is that commit (a server may answer a want with something else).
    Git::local(
        Some(&git_dir),
        &["cat-file", "-e", &format!("{commit}^{{commit}}")],
    )
    .run()
    .await
    .map_err(|_| fetch_err("the server did not send it".into()))?;
    let _ = std::fs::remove_dir_all(git_dir.join("hooks"));
    // Another delivery may have fetched it meanwhile: either copy serves.
    if let Err(e) = std::fs::rename(&git_dir, &keep)
        && !keep.is_dir()
    {
        return Err(fetch_err(format!("keeping it at {}: {e}", keep.display())));
    }
    Ok(keep)
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
    for (path, e) in m.entries() {
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
        files: m.files(),
        bytes: m.bytes(),
        commit: String::new(),
        branch: String::new(),
        url: source.into(),
    })
}
