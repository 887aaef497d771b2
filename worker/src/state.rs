//! The worker's state dir: its identity (key never leaves it), the brain it belongs to, and
//! the root under which workspaces live.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shared::pki::{self, IdentityFiles};

/// Errors reading or writing worker state.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "this worker has not joined a brain yet ({0} has no identity): run `worker join` first"
    )]
    NotJoined(PathBuf),
    #[error("{path} is not valid: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error(transparent)]
    Pki(#[from] pki::Error),
    #[error("cannot create {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl shared::exit::Classify for Error {
    /// Not joined, or a state file that is not valid: running again will not fix it.
    fn exit_code(&self) -> Option<shared::exit::ExitCode> {
        match self {
            Error::NotJoined(_) | Error::Invalid { .. } => Some(shared::exit::ExitCode::Config),
            Error::Pki(e) => shared::exit::Classify::exit_code(e),
            Error::Io { .. } => None,
        }
    }
}

/// What the worker remembers about its enrolment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Membership {
    pub v: u32,
    pub worker_id: String,
    pub name: String,
    pub brain_url: String,
    pub labels: BTreeMap<String, String>,
    /// Further brains sharing the first one's store, tried in turn after it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_brains: Vec<String>,
}

/// Paths inside the state dir.
#[derive(Debug, Clone)]
pub struct StateDir(pub PathBuf);

impl StateDir {
    pub fn identity(&self) -> PathBuf {
        self.0.join("identity")
    }
    pub fn membership(&self) -> PathBuf {
        self.0.join("worker.json")
    }
    pub fn workspaces(&self) -> PathBuf {
        self.0.join("workspaces")
    }

    pub fn is_joined(&self) -> bool {
        self.membership().exists() && self.identity().join(IdentityFiles::CERT).exists()
    }

    /// Creates the state dir (mode 0700) and the workspaces root.
    pub fn create(&self) -> Result<(), Error> {
        use std::os::unix::fs::PermissionsExt;
        for dir in [self.0.clone(), self.workspaces()] {
            std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
                path: dir.clone(),
                source,
            })?;
        }
        // Traversable but not listable by others, so a command running as an unprivileged user
        // can reach its workspace; the identity and the journal inside stay 0700.
        std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o711)).map_err(
            |source| Error::Io {
                path: self.0.clone(),
                source,
            },
        )
    }

    pub fn load(&self) -> Result<(Membership, IdentityFiles), Error> {
        if !self.is_joined() {
            return Err(Error::NotJoined(self.0.clone()));
        }
        let text = pki::read_text(&self.membership())?;
        let m: Membership = serde_json::from_str(&text).map_err(|e| Error::Invalid {
            path: self.membership(),
            reason: e.to_string(),
        })?;
        Ok((m, IdentityFiles::load(&self.identity())?))
    }

    pub fn save(&self, m: &Membership, ident: &IdentityFiles) -> Result<(), Error> {
        self.create()?;
        ident.save(&self.identity())?;
        let text = serde_json::to_vec_pretty(m).expect("membership serialises");
        pki::write_file(&self.membership(), &text, 0o600)?;
        Ok(())
    }
}

/// Default state dir: `$TETHER_WORKER_STATE`, else the XDG data dir's `tether-worker`.
pub fn default_dir() -> PathBuf {
    shared::dirs::data_dir("tether-worker", "TETHER_WORKER_STATE")
}

/// The workspace root for a named workspace, created on first use.
pub fn workspace(root: &Path, name: &str) -> Result<PathBuf, shared::paths::Error> {
    shared::paths::check_workspace_name(name)?;
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).map_err(|source| shared::paths::Error::Root {
        root: dir.clone(),
        source,
    })?;
    Ok(dir)
}
