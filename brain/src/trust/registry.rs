//! Durable records of who may talk to the brain: enrolled workers, join tokens and admin
//! identities, one sled tree each. Records are JSON with an explicit version field; every
//! change is flushed before the caller acts on it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use shared::pki::{PeerIdentity, Role};

/// Errors of the registry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Open(#[from] crate::storage::OpenError),
    #[error("store: {0}")]
    Sled(#[from] sled::Error),
    #[error("record {key:?} in tree {tree} cannot be decoded: {reason}")]
    Decode {
        tree: &'static str,
        key: String,
        reason: String,
    },
    #[error("invalid join token: it was never issued by this brain (check for typos)")]
    TokenUnknown,
    #[error(
        "join token already used: tokens are one-time; create a new one with `brain token create`"
    )]
    TokenUsed,
    #[error("join token expired; create a new one with `brain token create`")]
    TokenExpired,
    #[error("no worker named {0:?}: see `brain workers`")]
    NoSuchWorker(String),
    #[error("more than one worker is named {0:?}: use its id (see `brain workers`)")]
    Ambiguous(String),
    #[error("admin {0:?} already exists: revoke it first or choose another name")]
    AdminExists(String),
    #[error("no admin named {0:?}")]
    NoSuchAdmin(String),
    #[error(
        "the brain holds {0} web credentials already: revoke some (`brain admin token list`, `brain admin token revoke`)"
    )]
    Full(usize),
}

/// A stored worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub v: u32,
    pub id: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub cert_fingerprint: String,
    pub enrolled_ms: i64,
    pub last_seen_ms: i64,
    pub revoked: bool,
    pub caps: Option<Caps>,
}

/// What a worker said about itself in its last hello.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Caps {
    pub cpus: u32,
    pub memory_bytes: u64,
    pub disk_free_bytes: u64,
    pub os: String,
    pub arch: String,
    pub version: String,
    pub hostname: String,
    /// Confinement mechanisms active on the worker.
    #[serde(default)]
    pub sandbox: Vec<String>,
    /// Tasks it takes at once, as it said (0: it did not say).
    #[serde(default)]
    pub max_tasks: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct TokenRecord {
    v: u32,
    created_ms: i64,
    expires_ms: i64,
    labels: BTreeMap<String, String>,
    used_ms: Option<i64>,
}

/// A stored admin identity.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdminRecord {
    pub v: u32,
    pub name: String,
    pub fingerprint: String,
    pub issued_ms: i64,
    pub revoked: bool,
    /// The CA that issued it (`sha256:…`), to tell a re-created CA from a re-issued admin.
    #[serde(default)]
    pub ca_hash: String,
}

const V: u32 = 1;

/// The sled-backed registry. Cheap to clone.
#[derive(Clone)]
pub struct Registry {
    db: sled::Db,
    workers: sled::Tree,
    tokens: sled::Tree,
    admins: sled::Tree,
}

fn decode<T: for<'de> Deserialize<'de>>(
    tree: &'static str,
    key: &[u8],
    bytes: &[u8],
) -> Result<T, Error> {
    serde_json::from_slice(bytes).map_err(|e| Error::Decode {
        tree,
        key: String::from_utf8_lossy(key).into_owned(),
        reason: e.to_string(),
    })
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("records serialise")
}

/// Hex SHA-256 of a join token: the only form in which tokens are stored.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

impl Registry {
    /// Opens (or creates) the store. Fails clearly if another process holds it.
    pub fn open(path: &Path) -> Result<Self, Error> {
        Self::from_db(crate::storage::open_db(path)?)
    }

    /// The registry's trees in an already open store.
    pub fn from_db(db: sled::Db) -> Result<Self, Error> {
        Ok(Self {
            workers: db.open_tree("workers")?,
            tokens: db.open_tree("tokens")?,
            admins: db.open_tree("admins")?,
            db,
        })
    }

    /// Flushes everything written so far to disk.
    pub async fn flush_now(&self) -> Result<(), Error> {
        self.flush().await
    }

    async fn flush(&self) -> Result<(), Error> {
        crate::storage::flush(&self.db).await?;
        Ok(())
    }

    // ------------------------------------------------------------------ tokens

    /// Stores a new token (by hash) and returns the token text.
    pub async fn create_token(
        &self,
        ttl_ms: i64,
        labels: BTreeMap<String, String>,
    ) -> Result<(String, i64), Error> {
        let token = format!("tj_{}", hex::encode(rand::random::<[u8; 24]>()));
        let now = shared::now_unix_ms();
        let rec = TokenRecord {
            v: V,
            created_ms: now,
            expires_ms: now + ttl_ms,
            labels,
            used_ms: None,
        };
        self.tokens
            .insert(token_hash(&token).as_bytes(), encode(&rec))?;
        self.flush().await?;
        Ok((token, rec.expires_ms))
    }

    /// Checks that a token is valid (known, unused, unexpired) without using it up.
    pub fn check_token(&self, token: &str) -> Result<(), Error> {
        self.check_token_at(token, shared::now_unix_ms())
    }

    /// [`Registry::check_token`] as of `now_ms`.
    pub fn check_token_at(&self, token: &str, now_ms: i64) -> Result<(), Error> {
        let key = token_hash(token);
        let bytes = self
            .tokens
            .get(key.as_bytes())?
            .ok_or(Error::TokenUnknown)?;
        let rec: TokenRecord = decode("tokens", key.as_bytes(), &bytes)?;
        if rec.used_ms.is_some() {
            return Err(Error::TokenUsed);
        }
        if now_ms >= rec.expires_ms {
            return Err(Error::TokenExpired);
        }
        Ok(())
    }

    /// Marks a token used, atomically, and returns its labels. A token can be consumed once.
    pub async fn consume_token(&self, token: &str) -> Result<BTreeMap<String, String>, Error> {
        self.consume_token_at(token, shared::now_unix_ms()).await
    }

    /// [`Registry::consume_token`] as of `now_ms`.
    pub async fn consume_token_at(
        &self,
        token: &str,
        now_ms: i64,
    ) -> Result<BTreeMap<String, String>, Error> {
        let key = token_hash(token);
        loop {
            let old = self
                .tokens
                .get(key.as_bytes())?
                .ok_or(Error::TokenUnknown)?;
            let mut rec: TokenRecord = decode("tokens", key.as_bytes(), &old)?;
            if rec.used_ms.is_some() {
                return Err(Error::TokenUsed);
            }
            if now_ms >= rec.expires_ms {
                return Err(Error::TokenExpired);
            }
            rec.used_ms = Some(now_ms);
            let swapped =
                self.tokens
                    .compare_and_swap(key.as_bytes(), Some(old), Some(encode(&rec)))?;
            if swapped.is_ok() {
                self.flush().await?;
                return Ok(rec.labels);
            }
        }
    }

    // ------------------------------------------------------------------ workers

    pub async fn add_worker(&self, rec: &WorkerRecord) -> Result<(), Error> {
        self.workers.insert(rec.id.as_bytes(), encode(rec))?;
        self.flush().await
    }

    pub fn worker(&self, id: &str) -> Result<Option<WorkerRecord>, Error> {
        self.workers
            .get(id.as_bytes())?
            .map(|b| decode("workers", id.as_bytes(), &b))
            .transpose()
    }

    /// All workers, in id order. A record that cannot be decoded is reported, not hidden.
    pub fn workers(&self) -> Result<Vec<WorkerRecord>, Error> {
        self.workers
            .iter()
            .map(|kv| {
                let (k, v) = kv?;
                decode("workers", &k, &v)
            })
            .collect()
    }

    /// Finds a worker by id, or else by a name only one worker has.
    pub fn resolve_worker(&self, id_or_name: &str) -> Result<WorkerRecord, Error> {
        if let Some(w) = self.worker(id_or_name)? {
            return Ok(w);
        }
        let mut found: Vec<WorkerRecord> = self
            .workers()?
            .into_iter()
            .filter(|w| w.name == id_or_name)
            .collect();
        match found.len() {
            0 => Err(Error::NoSuchWorker(id_or_name.to_string())),
            1 => Ok(found.remove(0)),
            _ => Err(Error::Ambiguous(id_or_name.to_string())),
        }
    }

    /// Applies `f` to a stored worker and saves it. Not flushed: used for liveness data
    /// (last seen, capabilities) that is cheap to lose.
    pub fn update_worker(
        &self,
        id: &str,
        f: impl Fn(&mut WorkerRecord),
    ) -> Result<Option<WorkerRecord>, Error> {
        let mut result = None;
        let mut err = None;
        self.workers.update_and_fetch(id.as_bytes(), |old| {
            let old = old?;
            match decode::<WorkerRecord>("workers", id.as_bytes(), old) {
                Ok(mut rec) => {
                    f(&mut rec);
                    let bytes = encode(&rec);
                    result = Some(rec);
                    Some(bytes)
                }
                Err(e) => {
                    err = Some(e);
                    Some(old.to_vec())
                }
            }
        })?;
        match err {
            Some(e) => Err(e),
            None => Ok(result),
        }
    }

    /// Revokes a worker and flushes before returning.
    pub async fn revoke_worker(&self, id: &str) -> Result<WorkerRecord, Error> {
        let rec = self
            .update_worker(id, |w| w.revoked = true)?
            .ok_or_else(|| Error::NoSuchWorker(id.to_string()))?;
        self.flush().await?;
        Ok(rec)
    }

    // ------------------------------------------------------------------ admins

    /// Records an admin identity (used by `brain init` and `IssueAdmin`).
    pub async fn add_admin(
        &self,
        name: &str,
        fingerprint: &str,
        ca_hash: &str,
        replace: bool,
    ) -> Result<(), Error> {
        if !replace
            && let Some(old) = self.admin(name)?
            && !old.revoked
        {
            return Err(Error::AdminExists(name.to_string()));
        }
        let rec = AdminRecord {
            v: V,
            name: name.to_string(),
            fingerprint: fingerprint.to_string(),
            issued_ms: shared::now_unix_ms(),
            revoked: false,
            ca_hash: ca_hash.to_string(),
        };
        self.admins.insert(name.as_bytes(), encode(&rec))?;
        self.flush().await
    }

    pub fn admin(&self, name: &str) -> Result<Option<AdminRecord>, Error> {
        self.admins
            .get(name.as_bytes())?
            .map(|b| decode("admins", name.as_bytes(), &b))
            .transpose()
    }

    pub async fn revoke_admin(&self, name: &str) -> Result<(), Error> {
        let mut rec = self
            .admin(name)?
            .ok_or_else(|| Error::NoSuchAdmin(name.to_string()))?;
        rec.revoked = true;
        self.admins.insert(name.as_bytes(), encode(&rec))?;
        self.flush().await
    }

    // ------------------------------------------------------------------ auth

    /// Checks that a peer's certificate is the current, unrevoked one for its identity.
    /// Returns a reason suitable for the peer when it is not.
    pub fn check_peer(&self, peer: &PeerIdentity) -> Result<Result<(), PeerRefused>, Error> {
        let (fingerprint, revoked) = match peer.role {
            Role::Worker => match self.worker(&peer.id)? {
                Some(w) => (w.cert_fingerprint, w.revoked),
                None => return Ok(Err(PeerRefused::UnknownWorker(peer.id.clone()))),
            },
            Role::Admin => match self.admin(&peer.id)? {
                Some(a) => (a.fingerprint, a.revoked),
                None => return Ok(Err(PeerRefused::UnknownAdmin(peer.id.clone()))),
            },
        };
        if revoked {
            return Ok(Err(PeerRefused::Revoked(peer.to_string())));
        }
        if fingerprint != peer.fingerprint {
            return Ok(Err(PeerRefused::Superseded(peer.to_string())));
        }
        Ok(Ok(()))
    }
}

/// Why a peer's certificate is not accepted: the reason it is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerRefused {
    #[error("worker {0} is not enrolled here")]
    UnknownWorker(String),
    #[error("admin {0} is not known here")]
    UnknownAdmin(String),
    /// `{0}`: the peer, as [`PeerIdentity`] shows itself.
    #[error("certificate revoked: {0} was revoked on this brain")]
    Revoked(String),
    #[error("certificate revoked: {0} has been issued a newer certificate")]
    Superseded(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg() -> (tempfile::TempDir, Registry) {
        let d = tempfile::tempdir().unwrap();
        let r = Registry::open(&d.path().join("db")).unwrap();
        (d, r)
    }

    #[tokio::test]
    async fn tokens_are_one_time_and_expire() {
        let (_d, r) = reg();
        let (t, _) = r.create_token(60_000, BTreeMap::new()).await.unwrap();
        assert!(
            r.tokens.get(t.as_bytes()).unwrap().is_none(),
            "token stored in clear"
        );
        r.consume_token(&t).await.unwrap();
        assert!(matches!(r.consume_token(&t).await, Err(Error::TokenUsed)));
        let (old, _) = r.create_token(-1, BTreeMap::new()).await.unwrap();
        assert!(matches!(
            r.consume_token(&old).await,
            Err(Error::TokenExpired)
        ));
        assert!(matches!(
            r.consume_token("tj_nope").await,
            Err(Error::TokenUnknown)
        ));
    }

    #[tokio::test]
    async fn a_token_expires_exactly_at_its_ttl() {
        let (_d, r) = reg();
        let (t, expires) = r.create_token(1_000, BTreeMap::new()).await.unwrap();
        r.check_token_at(&t, expires - 1).unwrap();
        assert!(matches!(
            r.check_token_at(&t, expires),
            Err(Error::TokenExpired)
        ));
        assert!(matches!(
            r.consume_token_at(&t, expires).await,
            Err(Error::TokenExpired)
        ));
        // An expired attempt leaves it usable within its life.
        r.consume_token_at(&t, expires - 1).await.unwrap();
        assert!(matches!(
            r.check_token_at(&t, expires - 1),
            Err(Error::TokenUsed)
        ));
    }

    #[tokio::test]
    async fn second_open_of_the_same_store_fails_clearly() {
        let (d, _r) = reg();
        let err = Registry::open(&d.path().join("db"))
            .err()
            .expect("must fail");
        assert!(err.to_string().contains("another `brain serve`"), "{err}");
    }
}
