//! Walking a workspace the way a developer sees it: `.gitignore`-aware, without `.git/` and
//! the usual build outputs, never following symlinks. Used by the worker's `find` and
//! `search` file operations (and the agent's `list_files` and `search` tools).

use std::io::Read;
use std::path::Path;

/// Directories skipped by default wherever they are: build outputs and tool caches.
pub const DEFAULT_EXCLUDES: &[&str] = &[".git", "target", "node_modules", ".venv", "__pycache__"];

/// Files larger than this are not searched.
pub const MAX_SEARCH_FILE_BYTES: u64 = 1024 * 1024;
/// Longest line text returned by a search match; longer lines are cut.
pub const MAX_MATCH_LINE_CHARS: usize = 300;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid glob {glob:?}: {reason}")]
    Glob { glob: String, reason: String },
    #[error("invalid regular expression {pattern:?}: {reason}")]
    Pattern { pattern: String, reason: String },
}

/// A glob over workspace-relative paths. A glob without `/` matches the file name at any
/// depth (`*.rs`); one with `/` matches the whole relative path (`src/**/*.rs`). A glob
/// without wildcards also names a directory and matches what is under it (`src`, `src/`,
/// `lib/util`), and `.` (or `/`) names the workspace's root: models list a directory so.
pub struct PathGlob {
    set: Option<globset::GlobMatcher>,
    name_only: bool,
    /// The glob itself when it has no wildcards: a directory it may name.
    dir: Option<String>,
}

impl PathGlob {
    pub fn new(glob: &str) -> Result<Self, Error> {
        let glob = glob.trim().trim_start_matches("./").trim_end_matches('/');
        if glob.is_empty() || glob == "." || glob == "**" || glob == "**/*" {
            return Ok(Self {
                set: None,
                name_only: false,
                dir: None,
            });
        }
        let m = globset::GlobBuilder::new(glob)
            .literal_separator(true)
            .build()
            .map_err(|e| Error::Glob {
                glob: glob.into(),
                reason: e.kind().to_string(),
            })?
            .compile_matcher();
        let literal = !glob.contains(['*', '?', '[', ']', '{', '}', '\\']);
        Ok(Self {
            set: Some(m),
            name_only: !glob.contains('/'),
            dir: literal.then(|| glob.to_string()),
        })
    }

    pub fn matches(&self, rel: &str) -> bool {
        let under = |dir: &str| {
            let mut dirs = rel.split('/').rev().skip(1);
            if self.name_only {
                dirs.any(|d| d == dir)
            } else {
                rel.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
            }
        };
        match &self.set {
            None => true,
            Some(_) if self.dir.as_deref().is_some_and(under) => true,
            Some(m) if self.name_only => m.is_match(rel.rsplit('/').next().unwrap_or(rel)),
            Some(m) => m.is_match(rel),
        }
    }
}

/// The regular files of a workspace matching `glob`, as sorted relative paths, at most
/// `max`; the flag says whether more matched.
pub fn find(root: &Path, glob: &PathGlob, max: usize) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    let mut truncated = false;
    for rel in walk(root) {
        if glob.matches(&rel) {
            if out.len() == max {
                truncated = true;
                break;
            }
            out.push(rel);
        }
    }
    out.sort();
    (out, truncated)
}

/// A line that matched a search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    pub path: String,
    /// 1-based.
    pub line: u32,
    pub text: String,
}

/// Compiles a search pattern with a bound on its size.
pub fn pattern(pattern: &str) -> Result<regex::Regex, Error> {
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| Error::Pattern {
            pattern: pattern.into(),
            reason: e.to_string(),
        })
}

/// Lines matching `re` in the text files `find` would list (binary and files over
/// [`MAX_SEARCH_FILE_BYTES`] skipped), at most `max`. Returns the matches, whether more
/// matched, and how many files were searched.
pub fn search(
    root: &Path,
    re: &regex::Regex,
    glob: &PathGlob,
    max: usize,
) -> (Vec<Match>, bool, u32) {
    let mut files: Vec<String> = walk(root).filter(|r| glob.matches(r)).collect();
    files.sort();
    let mut out = Vec::new();
    let mut searched = 0u32;
    for rel in files {
        let Some(text) = read_text(&root.join(&rel)) else {
            continue;
        };
        searched += 1;
        for (i, line) in text.lines().enumerate() {
            if re.is_match(line) {
                if out.len() == max {
                    return (out, true, searched);
                }
                let mut t: String = line.chars().take(MAX_MATCH_LINE_CHARS).collect();
                if t.len() < line.len() {
                    t.push('…');
                }
                out.push(Match {
                    path: rel.clone(),
                    line: i as u32 + 1,
                    text: t,
                });
            }
        }
    }
    (out, false, searched)
}

/// A small text file's contents; `None` for large, binary or unreadable files.
fn read_text(path: &Path) -> Option<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_SEARCH_FILE_BYTES {
        return None;
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    f.take(MAX_SEARCH_FILE_BYTES).read_to_end(&mut buf).ok()?;
    if buf[..buf.len().min(8192)].contains(&0) {
        return None;
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// Relative paths (with `/`) of the regular files under `root`, honouring `.gitignore`
/// (also outside a git repository), `.ignore` and [`DEFAULT_EXCLUDES`]. Hidden files are
/// included; symlinks are not followed.
pub fn walk(root: &Path) -> impl Iterator<Item = String> {
    let root = root.to_path_buf();
    let walker = ignore::WalkBuilder::new(&root)
        .hidden(false)
        .follow_links(false)
        .require_git(false)
        .git_global(false)
        .parents(false)
        .filter_entry(|e| {
            !(e.depth() > 0
                && e.file_type().is_some_and(|t| t.is_dir())
                && DEFAULT_EXCLUDES.contains(&e.file_name().to_string_lossy().as_ref()))
        })
        .build();
    walker.filter_map(move |e| {
        let e = e.ok()?;
        if !e.file_type()?.is_file() {
            return None;
        }
        let rel = e.path().strip_prefix(&root).ok()?;
        Some(rel.to_string_lossy().into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let w = |p: &str, s: &str| {
            let p = d.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        w(".gitignore", "*.log\nbuild/\n");
        w("src/main.rs", "fn main() {\n    println!(\"hi\");\n}\n");
        w("src/lib/util.rs", "pub fn util() {}\n");
        w("notes.log", "main\n");
        w("build/out.rs", "fn main() {}\n");
        w("target/debug/x.rs", "fn main() {}\n");
        w(".git/config", "main\n");
        w("bin.dat", "main\0\0");
        d
    }

    #[test]
    fn find_honours_gitignore_and_default_excludes() {
        let d = tree();
        let (all, more) = find(d.path(), &PathGlob::new("").unwrap(), 100);
        assert!(!more);
        assert_eq!(
            all,
            [".gitignore", "bin.dat", "src/lib/util.rs", "src/main.rs"]
        );
        let (rs, _) = find(d.path(), &PathGlob::new("*.rs").unwrap(), 100);
        assert_eq!(rs, ["src/lib/util.rs", "src/main.rs"]);
        let (top, _) = find(d.path(), &PathGlob::new("src/*.rs").unwrap(), 100);
        assert_eq!(top, ["src/main.rs"]);
        let (one, more) = find(d.path(), &PathGlob::new("**/*.rs").unwrap(), 1);
        assert_eq!((one.len(), more), (1, true));
        assert!(PathGlob::new("src/[").is_err());
    }

    #[test]
    fn a_glob_without_wildcards_also_names_a_directory() {
        let d = tree();
        let list = |g: &str| find(d.path(), &PathGlob::new(g).unwrap(), 100).0;
        let all = list("");
        for root in [".", "./", "/", " . "] {
            assert_eq!(list(root), all, "{root:?}");
        }
        let src = ["src/lib/util.rs", "src/main.rs"];
        assert_eq!(list("src"), src);
        assert_eq!(list("src/"), src);
        assert_eq!(list("./src"), src);
        // A directory at any depth by its name alone, as a file's name is matched.
        assert_eq!(list("lib"), ["src/lib/util.rs"]);
        assert_eq!(list("src/lib"), ["src/lib/util.rs"]);
        // A file by its path or its name, as before; a part of a name is not a directory.
        assert_eq!(list("src/main.rs"), ["src/main.rs"]);
        assert_eq!(list("util.rs"), ["src/lib/util.rs"]);
        assert!(list("sr").is_empty());
        assert!(list("rc/lib").is_empty());
        // Ignored and excluded directories stay so when named.
        assert!(list("build").is_empty());
        assert!(list("target").is_empty());
    }

    #[test]
    fn search_finds_lines_and_skips_binary_and_ignored_files() {
        let d = tree();
        let re = pattern(r"fn \w+").unwrap();
        let (m, more, files) = search(d.path(), &re, &PathGlob::new("").unwrap(), 100);
        assert!(!more);
        assert_eq!(files, 3, "bin.dat is skipped as binary");
        assert_eq!(
            m,
            [
                Match {
                    path: "src/lib/util.rs".into(),
                    line: 1,
                    text: "pub fn util() {}".into()
                },
                Match {
                    path: "src/main.rs".into(),
                    line: 1,
                    text: "fn main() {".into()
                }
            ]
        );
        let (m, more, _) = search(
            d.path(),
            &pattern("fn").unwrap(),
            &PathGlob::new("").unwrap(),
            1,
        );
        assert_eq!((m.len(), more), (1, true));
        assert!(pattern("(").is_err());
    }
}
