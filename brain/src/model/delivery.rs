//! Delivery of a task's result as a git branch (and a pull request): how it is asked for,
//! and where a delivery stands, rebuilt from the log like everything else.

use serde::{Deserialize, Serialize};

/// How a `--git` task's result is delivered when it finishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Not delivered by itself (`brain task diff`, `patch`, `export` and `deliver` still work).
    #[default]
    None,
    /// A commit on top of the imported one, pushed as branch `tether/<task-id>`.
    Branch,
    /// The branch, and a pull request for it.
    Pr,
}

impl std::str::FromStr for Mode {
    type Err = super::word::UnknownWord;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Self::None),
            "branch" => Ok(Self::Branch),
            "pr" => Ok(Self::Pr),
            other => Err(Self::Err::new("delivery", other, "branch, pr or none")),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Branch => "branch",
            Self::Pr => "pr",
        })
    }
}

/// Where the git repository a task started from stands: what the delivery builds on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The repository's URL without any userinfo.
    pub url: String,
    /// The imported commit and the branch it was on.
    pub commit: String,
    pub branch: String,
}

/// One delivery of a task, as its log tells it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub mode: Mode,
    /// A task that had not finished: delivered as `<branch>-wip`.
    pub wip: bool,
    pub branch: String,
    /// The workspace delivered (a manifest root) and the commit made of it.
    pub root: String,
    pub commit: String,
    /// The commit's author and committer date (seconds since the epoch): a delivery resumed
    /// after a crash makes the very same commit.
    pub date_s: i64,
    pub pushed: bool,
    /// The pull request, once opened.
    pub pr_url: String,
    pub pr_number: u64,
    /// Ended: delivered, or failed with `error`.
    pub done: bool,
    pub error: String,
}

impl Delivery {
    /// Whether it ended well.
    pub fn delivered(&self) -> bool {
        self.done && self.error.is_empty()
    }

    /// The delivery in words, for listings.
    pub fn describe(&self) -> String {
        let short = &self.commit[..self.commit.len().min(12)];
        match () {
            _ if self.done && !self.error.is_empty() => format!("failed: {}", self.error),
            _ if !self.pr_url.is_empty() => format!("{} at {short}, {}", self.branch, self.pr_url),
            _ if self.done => format!("{} at {short}", self.branch),
            _ if self.pushed => {
                format!("{} at {short} (pushed; pull request pending)", self.branch)
            }
            _ => format!("{} at {short} (in progress)", self.branch),
        }
    }
}

/// Splits `user:token@` off a URL (`https://user:token@host/path`), so what is stored and
/// shown never holds a credential. SCP-like addresses (`git@host:path`) keep their user, which
/// is no secret.
pub fn strip_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rfind('@') {
        Some(i) => format!("{scheme}://{}{path}", &authority[i + 1..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_stripped_and_nothing_else() {
        for (url, want) in [
            (
                "https://u:tok@github.com/o/r.git",
                "https://github.com/o/r.git",
            ),
            ("https://tok@github.com/o/r", "https://github.com/o/r"),
            ("http://a:b@127.0.0.1:9/x.git", "http://127.0.0.1:9/x.git"),
            (
                "https://github.com/o/r@v1.git",
                "https://github.com/o/r@v1.git",
            ),
            ("git@github.com:o/r.git", "git@github.com:o/r.git"),
            ("/srv/repo", "/srv/repo"),
            ("ssh://git@host/r", "ssh://host/r"),
        ] {
            assert_eq!(strip_userinfo(url), want, "{url}");
        }
    }

    #[test]
    fn modes_parse_and_print() {
        for m in [Mode::None, Mode::Branch, Mode::Pr] {
            assert_eq!(m.to_string().parse::<Mode>().unwrap(), m);
        }
        assert!(
            "push"
                .parse::<Mode>()
                .unwrap_err()
                .to_string()
                .contains("branch, pr or none")
        );
    }
}
