//! Why a sync request failed, as the brain reads it in the report's `error` (the text is the
//! contract: a person reads it in the task's log).

use std::path::PathBuf;
use std::time::Duration;

use shared::manifest;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("import directory {0:?} must be an absolute path")]
    ImportNotAbsolute(String),
    #[error("import directory {dir:?}: {source}")]
    ImportUnreadable {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "refusing to import {0:?}: this worker allows no imports (its owner starts it with --import-root DIR to allow directories below DIR; see `worker doctor`)"
    )]
    ImportsOff(String),
    #[error(
        "refusing to import {dir:?}: it is not below this worker's import roots ({roots}); its owner can add one with --import-root DIR"
    )]
    ImportOutside { dir: String, roots: String },
    #[error("import directory {0:?} is not a directory")]
    ImportNotDir(String),
    #[error(
        "refusing to import {dir:?}: it holds or is inside {}, which commands may not read (the worker's state or secrets); import the project directory itself",
        .hidden.display()
    )]
    ImportHidden { dir: String, hidden: PathBuf },
    #[error("sync of {workspace} did not finish within {after:?}")]
    TimedOut { workspace: String, after: Duration },
    #[error("no sync operation given")]
    NoOperation,
    #[error(transparent)]
    Workspace(#[from] shared::paths::Error),
    /// The scan, or a manifest or delta that does not hold.
    #[error(transparent)]
    Manifest(#[from] manifest::Error),
    #[error("the scan left no manifest")]
    NoManifest,
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    /// A call to the brain's `Sync` service failed: what it was for, and its status.
    #[error("{what}: {}", .status.message())]
    Rpc {
        what: &'static str,
        status: tonic::Status,
    },
    #[error("the delta: {0}")]
    Encode(#[source] serde_json::Error),
    /// A file went away or stopped being a regular file between the scan and its upload.
    #[error("{0} is gone since the scan")]
    Gone(String),
    /// A file's content is not what the scan hashed.
    #[error("{0} changed since the scan")]
    Changed(String),
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the brain asked for blob {0}, which is not in this workspace")]
    NotHere(String),
    #[error("uploading blobs: the stream closed before every blob was sent")]
    StreamClosed,
    #[error("the manifest is over 256 MiB compressed")]
    ManifestTooLarge,
    #[error("the manifest: {0}")]
    ManifestUnreadable(#[source] std::io::Error),
    #[error("the manifest: {0}")]
    ManifestJson(#[source] serde_json::Error),
    #[error("the delta: {0}")]
    DeltaJson(#[source] serde_json::Error),
    #[error("the brain sent a delta from {from}, but this workspace holds {have}")]
    DeltaFromElsewhere { from: String, have: String },
    #[error("the manifest sent has root {got} instead of {want}")]
    WrongRoot { got: String, want: String },
    #[error("the brain sent a blob chunk without a hash")]
    ChunkWithoutHash,
    #[error("blob {0} is larger than its file")]
    BlobTooLarge(String),
    #[error("blob {hash}: {source}")]
    Blob {
        hash: String,
        #[source]
        source: std::io::Error,
    },
    #[error("creating {}: {source}", .dir.display())]
    Staging {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("staging blob {hash}: {source}")]
    Stage {
        hash: String,
        #[source]
        source: std::io::Error,
    },
    #[error("after materialising, the workspace's root hash is {got}, not {want}")]
    Unverified { got: String, want: String },
}

impl Error {
    /// A file changed under a barrier: scanning again can succeed.
    pub fn changed_under_us(&self) -> bool {
        matches!(self, Self::Gone(_) | Self::Changed(_))
    }

    /// A failed call to the brain, for `what`.
    pub fn rpc(what: &'static str) -> impl FnOnce(tonic::Status) -> Self {
        move |status| Self::Rpc { what, status }
    }
}
