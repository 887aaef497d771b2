//! Errors of the mirror.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("blob store {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("mirror store: {0}")]
    Store(#[from] sled::Error),
    #[error("mirror store: {0}")]
    Shared(#[from] crate::storage::postgres::Error),
    #[error("mirror store: {0}")]
    Tree(#[from] crate::storage::kv::Error),
    #[error("blob {0} is not stored")]
    NoBlob(String),
    #[error("blob {0} is corrupt or does not match its hash")]
    Corrupt(String),
    #[error("invalid blob hash {0:?}: expected 64 hex digits")]
    BadHash(String),
    #[error("no manifest with root hash {0}")]
    NoManifest(String),
    #[error("manifest {root}: {reason}")]
    BadManifest { root: String, reason: String },
}
