//! Git objects made from workspaces in the mirror: the commit a delivery pushes (the imported
//! commit's tree with what changed between two workspaces applied, so files the mirror never
//! held stay as they were), and the diff, stat or `git am` patch between two workspaces. Only
//! the paths that differ are written to git, so the cost is what changed. `.git/` is never
//! part of a commit: the workspace's own git directory is the model's to play with.

use std::path::Path;

use shared::manifest::{Entry, Kind, Manifest};

use super::{Error, Git};
use crate::mirror::Mirror;

/// Who a commit is by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Author {
    pub name: String,
    pub email: String,
}

/// What differs between two workspaces, outside `.git/`: entries to write (files and
/// symlinks) and paths to remove.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub write: Vec<(String, Entry)>,
    pub remove: Vec<String>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.write.is_empty() && self.remove.is_empty()
    }
}

/// Whether a path's component names a git directory as git, or a disk that folds case or
/// ignores some characters, may read it: `.git` in any case, with trailing dots or spaces
/// (Windows drops them), with characters HFS+ ignores inside, or as NTFS's short name
/// `git~1`. Git refuses all of these in a tree (`verify_path`); so do commits and exports.
fn git_name(component: &str) -> bool {
    let folded: String = component
        .chars()
        .filter(|c| {
            !matches!(c, '\u{200c}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{206a}'..='\u{206f}' | '\u{feff}')
        })
        .collect::<String>()
        .trim_end_matches(['.', ' '])
        .to_lowercase();
    folded == ".git" || folded == "git~1"
}

/// What of a workspace git would take for a repository, and so runs code from (a config's
/// `core.fsmonitor`, hooks) when a person runs git there: every path with a git-directory
/// component ([`git_name`]), and every directory shaped as git's `is_git_directory` reads it
/// (a `HEAD` and the directories `objects` and `refs`: a bare repository, or one whose config
/// names a work tree elsewhere). Each is given as the prefix under which all is left out;
/// for the workspace's root itself, its `HEAD` and `config`.
pub fn repositories(m: &Manifest) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let is_dir = |p: &str| m.entries().get(p).is_some_and(|e| e.kind == Kind::Dir);
    for (path, e) in m.entries() {
        let mut end = 0;
        for c in path.split('/') {
            end += c.len();
            if git_name(c) {
                out.insert(path[..end].to_string());
                break;
            }
            end += 1;
        }
        let dir = match path.rsplit_once('/') {
            Some((dir, "HEAD")) => dir,
            None if path == "HEAD" => "",
            _ => continue,
        };
        let under = |name: &str| {
            if dir.is_empty() {
                name.to_string()
            } else {
                format!("{dir}/{name}")
            }
        };
        if matches!(e.kind, Kind::File | Kind::Symlink)
            && is_dir(&under("objects"))
            && is_dir(&under("refs"))
        {
            if dir.is_empty() {
                out.insert("HEAD".into());
                out.insert("config".into());
            } else {
                out.insert(dir.to_string());
            }
        }
    }
    out
}

/// Whether `path` is one of `repositories` or below one.
pub fn in_repository(path: &str, repositories: &std::collections::BTreeSet<String>) -> bool {
    // The prefixes of `path` that end at a component, longest first, are few.
    let mut cut = Some(path.len());
    while let Some(n) = cut {
        if repositories.contains(&path[..n]) {
            return true;
        }
        cut = path[..n].rfind('/');
    }
    false
}

/// Files and symlinks: what git tracks, outside every repository in the workspace.
fn tracked(m: &Manifest) -> impl Iterator<Item = (&String, &Entry)> {
    let repos = repositories(m);
    m.entries().iter().filter(move |(p, e)| {
        matches!(e.kind, Kind::File | Kind::Symlink) && !in_repository(p, &repos)
    })
}

/// What turns `base` into `head`.
pub fn changes(base: &Manifest, head: &Manifest) -> Changes {
    let same = |a: &Entry, b: &Entry| {
        a.kind == b.kind
            && match a.kind {
                Kind::File => a.hash == b.hash && a.exec == b.exec,
                _ => a.target == b.target,
            }
    };
    let mut c = Changes::default();
    for (p, e) in tracked(head) {
        match base.entries().get(p) {
            Some(b) if same(b, e) => {}
            _ => c.write.push((p.clone(), e.clone())),
        }
    }
    let head_repos = repositories(head);
    for (p, _) in tracked(base) {
        if in_repository(p, &head_repos)
            || !head
                .entries()
                .get(p)
                .is_some_and(|e| matches!(e.kind, Kind::File | Kind::Symlink))
        {
            c.remove.push(p.clone());
        }
    }
    c
}

/// The entries of `m` at `paths` that it tracks, as changes from nothing.
fn only(m: &Manifest, paths: &[&String]) -> Changes {
    Changes {
        write: paths
            .iter()
            .filter_map(|p| {
                m.entries()
                    .get(*p)
                    .filter(|e| matches!(e.kind, Kind::File | Kind::Symlink))
                    .map(|e| ((*p).clone(), e.clone()))
            })
            .collect(),
        remove: vec![],
    }
}

/// A tree: `base` (a tree-ish, or nothing) with `changes` applied, written into `git_dir`.
async fn tree(
    mirror: &Mirror,
    git_dir: &Path,
    base: Option<&str>,
    changes: &Changes,
) -> Result<String, Error> {
    let tmp = tempfile::tempdir().map_err(|e| Error::Io(e.to_string()))?;
    let index = tmp.path().join("index");
    match base {
        Some(b) => {
            Git::local(Some(git_dir), &["read-tree", b])
                .index(&index)
                .run()
                .await?
        }
        None => {
            Git::local(Some(git_dir), &["read-tree", "--empty"])
                .index(&index)
                .run()
                .await?
        }
    };
    // The contents, as files for `hash-object --stdin-paths`.
    let mut list = String::new();
    for (i, (path, e)) in changes.write.iter().enumerate() {
        let data = match e.kind {
            Kind::Symlink => e.target.clone().into_bytes(),
            _ => mirror.get(&e.hash)?,
        };
        let f = tmp.path().join(format!("b{i}"));
        std::fs::write(&f, data).map_err(|e| Error::Io(format!("{path}: {e}")))?;
        list.push_str(&f.to_string_lossy());
        list.push('\n');
    }
    let oids = if list.is_empty() {
        String::new()
    } else {
        Git::local(
            Some(git_dir),
            &["hash-object", "-w", "--no-filters", "--stdin-paths"],
        )
        .input(list.into_bytes())
        .text()
        .await?
    };
    let oids: Vec<&str> = oids.lines().collect();
    if oids.len() != changes.write.len() {
        return Err(Error::Invalid(format!(
            "git hash-object wrote {} objects for {} files",
            oids.len(),
            changes.write.len()
        )));
    }
    let zero = "0".repeat(oids.first().map_or(40, |o| o.len()));
    let mut info = Vec::new();
    for p in &changes.remove {
        info.extend_from_slice(format!("0 {zero}\t{p}\0").as_bytes());
    }
    for ((p, e), oid) in changes.write.iter().zip(&oids) {
        let mode = match (e.kind, e.exec) {
            (Kind::Symlink, _) => "120000",
            (_, true) => "100755",
            _ => "100644",
        };
        info.extend_from_slice(format!("{mode} {oid}\t{p}\0").as_bytes());
    }
    if !info.is_empty() {
        Git::local(Some(git_dir), &["update-index", "-z", "--index-info"])
            .index(&index)
            .input(info)
            .run()
            .await?;
    }
    Git::local(Some(git_dir), &["write-tree"])
        .index(&index)
        .text()
        .await
}

/// `git commit-tree` with a fixed author, committer and date, so the same inputs make the
/// same commit id.
async fn commit_tree(
    git_dir: &Path,
    tree: &str,
    parent: Option<&str>,
    author: &Author,
    date_s: i64,
    message: &str,
) -> Result<String, Error> {
    let mut args = vec!["commit-tree", tree];
    if let Some(p) = parent {
        args.extend(["-p", p]);
    }
    args.extend(["-F", "-"]);
    let date = format!("{date_s} +0000");
    Git::local(Some(git_dir), &args)
        .env("GIT_AUTHOR_NAME", &author.name)
        .env("GIT_AUTHOR_EMAIL", &author.email)
        .env("GIT_AUTHOR_DATE", &date)
        .env("GIT_COMMITTER_NAME", &author.name)
        .env("GIT_COMMITTER_EMAIL", &author.email)
        .env("GIT_COMMITTER_DATE", &date)
        .input(message.as_bytes().to_vec())
        .text()
        .await
}

/// What a delivery commits.
pub struct Spec<'a> {
    /// The git directory holding `parent` (see [`super::Repos`]).
    pub git_dir: &'a Path,
    pub parent: &'a str,
    /// The workspace as imported at `parent`, and the one to deliver.
    pub base: &'a Manifest,
    pub head: &'a Manifest,
    pub author: &'a Author,
    pub date_s: i64,
    pub message: &'a str,
}

/// The commit of `head` on top of `parent`: the same spec always makes the same id.
pub async fn commit(mirror: &Mirror, spec: &Spec<'_>) -> Result<String, Error> {
    let c = changes(spec.base, spec.head);
    let tree = tree(mirror, spec.git_dir, Some(spec.parent), &c).await?;
    commit_tree(
        spec.git_dir,
        &tree,
        Some(spec.parent),
        spec.author,
        spec.date_s,
        spec.message,
    )
    .await
}

/// How to show what changed between two workspaces.
pub enum Form<'a> {
    /// A unified diff (`git diff` style, binary files included).
    Diff,
    /// `git diff --stat`.
    Stat,
    /// `git diff --numstat`: lines added and removed per file (`-` for binary files).
    NumStat,
    /// A mail `git am` applies, with this author, date and message.
    Patch {
        author: &'a Author,
        date_s: i64,
        message: &'a str,
    },
}

/// What changed from `base` (nothing: an empty workspace) to `head`, in `form`. Works for
/// any task: the objects are made in a throw-away repository.
pub async fn show(
    mirror: &Mirror,
    base: &Manifest,
    head: &Manifest,
    form: Form<'_>,
) -> Result<Vec<u8>, Error> {
    let (git, _tmp) = show_git(mirror, base, head, form).await?;
    git.run().await
}

/// [`show`] as git writes it, in pieces of at most `piece` bytes, a few at most ahead of
/// the reader: memory does not grow with the diff, and a reader that stops ends git.
pub async fn show_streamed(
    mirror: &Mirror,
    base: &Manifest,
    head: &Manifest,
    form: Form<'_>,
    piece: usize,
) -> Result<tokio::sync::mpsc::Receiver<Result<Vec<u8>, Error>>, Error> {
    let (git, tmp) = show_git(mirror, base, head, form).await?;
    git.stream(piece, tmp)
}

/// The git command that shows the change in `form`, and the throw-away repository it runs
/// in (which must live as long as it does).
async fn show_git(
    mirror: &Mirror,
    base: &Manifest,
    head: &Manifest,
    form: Form<'_>,
) -> Result<(Git, tempfile::TempDir), Error> {
    let c = changes(base, head);
    let tmp = tempfile::tempdir().map_err(|e| Error::Io(e.to_string()))?;
    let git_dir = tmp.path().join("repo.git");
    let dir_s = git_dir.to_string_lossy().into_owned();
    Git::local(None, &["init", "--quiet", "--bare", &dir_s])
        .run()
        .await?;
    // Both sides hold only the paths that differ: the same diff, at the cost of the change.
    let paths: Vec<&String> = c
        .write
        .iter()
        .map(|(p, _)| p)
        .chain(c.remove.iter())
        .collect();
    let a = tree(mirror, &git_dir, None, &only(base, &paths)).await?;
    let b = tree(mirror, &git_dir, None, &only(head, &paths)).await?;
    let git = match form {
        Form::Diff => Git::local(
            Some(&git_dir),
            &[
                "diff-tree",
                "-p",
                "--binary",
                "--no-color",
                "--find-renames",
                &a,
                &b,
            ],
        ),
        Form::Stat | Form::NumStat => {
            let stat = if matches!(form, Form::Stat) {
                "--stat"
            } else {
                "--numstat"
            };
            Git::local(
                Some(&git_dir),
                &["diff-tree", stat, "--no-color", "--find-renames", &a, &b],
            )
        }
        Form::Patch {
            author,
            date_s,
            message,
        } => {
            let pa = commit_tree(&git_dir, &a, None, author, date_s, "base\n").await?;
            let pb = commit_tree(&git_dir, &b, Some(&pa), author, date_s, message).await?;
            Git::local(
                Some(&git_dir),
                &[
                    "format-patch",
                    "-1",
                    "--stdout",
                    "--binary",
                    "--find-renames",
                    "--no-signature",
                    &pb,
                ],
            )
        }
    };
    Ok((git, tmp))
}

/// Files changed and lines added plus removed, from `git diff --numstat` output; a binary
/// file counts as one line.
pub fn numstat_size(out: &str) -> (u64, u64) {
    let mut files = 0;
    let mut lines = 0;
    for l in out.lines() {
        let mut f = l.split('\t');
        let (Some(add), Some(del), Some(_)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        files += 1;
        lines += match (add.parse::<u64>(), del.parse::<u64>()) {
            (Ok(a), Ok(d)) => a + d,
            _ => 1,
        };
    }
    (files, lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: Kind, hash: &str, exec: bool, target: &str) -> Entry {
        Entry {
            kind,
            exec,
            size: 1,
            hash: hash.into(),
            target: target.into(),
        }
    }

    #[test]
    fn changes_leave_out_git_dirs_and_unchanged_entries() {
        let mut base = Manifest::default();
        let mut head = Manifest::default();
        for m in [&mut base, &mut head] {
            m.insert("same.txt".into(), entry(Kind::File, "aa", false, ""));
            m.insert("d".into(), entry(Kind::Dir, "", false, ""));
        }
        base.insert(".git/index".into(), entry(Kind::File, "01", false, ""));
        head.insert(".git/index".into(), entry(Kind::File, "02", false, ""));
        base.insert("gone.txt".into(), entry(Kind::File, "bb", false, ""));
        base.insert("run.sh".into(), entry(Kind::File, "cc", false, ""));
        head.insert("run.sh".into(), entry(Kind::File, "cc", true, ""));
        head.insert("link".into(), entry(Kind::Symlink, "", false, "same.txt"));
        let c = changes(&base, &head);
        let written: Vec<&str> = c.write.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(written, ["link", "run.sh"]);
        assert_eq!(c.remove, ["gone.txt"]);
        assert!(changes(&head, &head).is_empty());
    }

    #[test]
    fn every_spelling_of_a_git_directory_and_every_repository_shape_is_found() {
        for name in [
            ".git",
            ".GIT",
            ".Git.",
            ".git  ",
            "git~1",
            "GIT~1",
            ".g\u{200c}it",
        ] {
            assert!(git_name(name), "{name:?}");
        }
        for name in ["git", ".github", ".gitignore", ".git-blame-ignore", "x.git"] {
            assert!(!git_name(name), "{name:?}");
        }
        let mut m = Manifest::default();
        let file = || entry(Kind::File, "aa", false, "");
        let dir = || entry(Kind::Dir, "", false, "");
        for d in [
            "bare.git",
            "bare.git/objects",
            "bare.git/refs",
            "half",
            "half/refs",
        ] {
            m.insert(d.into(), dir());
        }
        for f in [
            "bare.git/HEAD",
            "bare.git/config",
            "half/HEAD",
            "a/.GIT/config",
            "b/.git",
            "src/main.rs",
            ".github/workflows/ci.yml",
        ] {
            m.insert(f.into(), file());
        }
        let repos = repositories(&m);
        let got: Vec<&str> = repos.iter().map(String::as_str).collect();
        assert_eq!(got, ["a/.GIT", "b/.git", "bare.git"]);
        for (p, inside) in [
            ("bare.git/config", true),
            ("bare.git", true),
            ("bare.gitx/y", false),
            ("a/.GIT/config", true),
            ("half/HEAD", false),
            (".github/workflows/ci.yml", false),
        ] {
            assert_eq!(in_repository(p, &repos), inside, "{p}");
        }
        // At the workspace's root, its HEAD and config.
        for d in ["objects", "refs"] {
            m.insert(d.into(), dir());
        }
        m.insert("HEAD".into(), file());
        let repos = repositories(&m);
        assert!(
            repos.contains("HEAD") && repos.contains("config"),
            "{repos:?}"
        );
        let tracked: Vec<&String> = tracked(&m).map(|(p, _)| p).collect();
        assert_eq!(
            tracked,
            [".github/workflows/ci.yml", "half/HEAD", "src/main.rs"]
        );
    }
}
