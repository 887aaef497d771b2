//! Durable records of who may talk to the brain: enrolled workers, join tokens and admin
//! identities, one tree each in the store (sled or PostgreSQL). Records are JSON with an
//! explicit version field; every change is durable before the caller acts on it.
//!
//! Workers and admins are also held in memory (read at open, kept as this registry writes
//! them), so the checks on every call and placement read them without waiting on the store.
//! Join tokens are read from the store each time: one brain may create one and another
//! consume it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use shared::locks::RwLockExt;

use crate::storage::kv::{self, Store, Tree};

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
    #[error(transparent)]
    Store(#[from] crate::storage::kv::Error),
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
    /// Removed (`brain worker remove`): revoked, listed no more, its name free. The record
    /// stays, so that every brain sharing the store refuses its certificate as revoked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
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

/// The registry. Cheap to clone.
#[derive(Clone)]
pub struct Registry {
    store: Store,
    workers: Arc<dyn Tree>,
    tokens: Arc<dyn Tree>,
    admins: Arc<dyn Tree>,
    held: Arc<RwLock<Held>>,
}

/// Each record as stored: decoded, or why it cannot be (reported by every read of it).
type Entry<T> = Result<T, String>;

/// Workers and admins as the store holds them, by key.
#[derive(Default)]
struct Held {
    workers: BTreeMap<String, Entry<WorkerRecord>>,
    admins: BTreeMap<String, Entry<AdminRecord>>,
}

/// Every record of `tree`, by key.
async fn read_all<T: for<'de> Deserialize<'de>>(
    tree: &dyn Tree,
) -> Result<BTreeMap<String, Entry<T>>, Error> {
    Ok(tree
        .scan_prefix(b"")
        .await?
        .into_iter()
        .map(|(k, v)| {
            let entry = serde_json::from_slice(&v).map_err(|e| e.to_string());
            (String::from_utf8_lossy(&k).into_owned(), entry)
        })
        .collect())
}

/// The record under `key`, or the error that says why it cannot be read.
fn held<T: Clone>(
    tree: &'static str,
    map: &BTreeMap<String, Entry<T>>,
    key: &str,
) -> Result<Option<T>, Error> {
    match map.get(key) {
        None => Ok(None),
        Some(Ok(r)) => Ok(Some(r.clone())),
        Some(Err(reason)) => Err(Error::Decode {
            tree,
            key: key.to_string(),
            reason: reason.clone(),
        }),
    }
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
    pub async fn open(path: &Path) -> Result<Self, Error> {
        Self::from_db(crate::storage::open_db(path)?).await
    }

    /// The registry's trees in an already open sled store.
    pub async fn from_db(db: sled::Db) -> Result<Self, Error> {
        Self::from_store(Store::Sled(db)).await
    }

    /// The registry's trees in a store.
    pub async fn from_store(store: Store) -> Result<Self, Error> {
        let workers = store.tree("workers")?;
        let admins = store.tree("admins")?;
        let held = Held {
            workers: read_all(workers.as_ref()).await?,
            admins: read_all(admins.as_ref()).await?,
        };
        Ok(Self {
            workers,
            tokens: store.tree("tokens")?,
            admins,
            store,
            held: Arc::new(RwLock::new(held)),
        })
    }

    /// Reads the workers and admins again from the store: what other brains sharing it
    /// enrolled, changed or revoked since.
    pub async fn refresh(&self) -> Result<(), Error> {
        let held = Held {
            workers: read_all(self.workers.as_ref()).await?,
            admins: read_all(self.admins.as_ref()).await?,
        };
        *self.held.write_locked() = held;
        Ok(())
    }

    /// Flushes everything written so far to disk.
    pub async fn flush_now(&self) -> Result<(), Error> {
        self.flush().await
    }

    async fn flush(&self) -> Result<(), Error> {
        self.store.flush().await?;
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
            .insert(token_hash(&token).as_bytes(), &encode(&rec))
            .await?;
        self.flush().await?;
        Ok((token, rec.expires_ms))
    }

    /// Checks that a token is valid (known, unused, unexpired) without using it up.
    pub async fn check_token(&self, token: &str) -> Result<(), Error> {
        self.check_token_at(token, shared::now_unix_ms()).await
    }

    /// [`Registry::check_token`] as of `now_ms`.
    pub async fn check_token_at(&self, token: &str, now_ms: i64) -> Result<(), Error> {
        let key = token_hash(token);
        let bytes = self
            .tokens
            .get(key.as_bytes())
            .await?
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
                .get(key.as_bytes())
                .await?
                .ok_or(Error::TokenUnknown)?;
            let mut rec: TokenRecord = decode("tokens", key.as_bytes(), &old)?;
            if rec.used_ms.is_some() {
                return Err(Error::TokenUsed);
            }
            if now_ms >= rec.expires_ms {
                return Err(Error::TokenExpired);
            }
            rec.used_ms = Some(now_ms);
            let swapped = self
                .tokens
                .compare_and_swap(key.as_bytes(), Some(&old), Some(&encode(&rec)))
                .await?;
            if swapped {
                self.flush().await?;
                return Ok(rec.labels);
            }
        }
    }

    // ------------------------------------------------------------------ workers

    pub async fn add_worker(&self, rec: &WorkerRecord) -> Result<(), Error> {
        self.workers.insert(rec.id.as_bytes(), &encode(rec)).await?;
        self.flush().await?;
        self.held
            .write_locked()
            .workers
            .insert(rec.id.clone(), Ok(rec.clone()));
        Ok(())
    }

    pub fn worker(&self, id: &str) -> Result<Option<WorkerRecord>, Error> {
        held("workers", &self.held.read_locked().workers, id)
    }

    /// All workers but the removed, in id order. A record that cannot be decoded is
    /// reported, not hidden.
    pub fn workers(&self) -> Result<Vec<WorkerRecord>, Error> {
        let all = self.held.read_locked();
        all.workers
            .keys()
            .filter_map(|k| held("workers", &all.workers, k).transpose())
            .filter(|w| !w.as_ref().is_ok_and(|w| w.removed))
            .collect()
    }

    /// Finds a worker by id, or else by a name only one worker has (a removed one is gone).
    pub fn resolve_worker(&self, id_or_name: &str) -> Result<WorkerRecord, Error> {
        if let Some(w) = self.worker(id_or_name)?.filter(|w| !w.removed) {
            return Ok(w);
        }
        let mut found: Vec<WorkerRecord> = self
            .workers()?
            .into_iter()
            .filter(|w| w.name == id_or_name)
            .collect();
        // A name that a revoked worker had and a new one has now is the new one's.
        if found.iter().filter(|w| !w.revoked).count() == 1 {
            found.retain(|w| !w.revoked);
        }
        match found.len() {
            0 => Err(Error::NoSuchWorker(id_or_name.to_string())),
            1 => Ok(found.remove(0)),
            _ => Err(Error::Ambiguous(id_or_name.to_string())),
        }
    }

    /// Applies `f` to a stored worker and saves it. Not flushed: used for liveness data
    /// (last seen, capabilities) that is cheap to lose.
    pub async fn update_worker(
        &self,
        id: &str,
        f: impl Fn(&mut WorkerRecord),
    ) -> Result<Option<WorkerRecord>, Error> {
        let mut result = None;
        let mut err = None;
        kv::update(self.workers.as_ref(), id.as_bytes(), |old| {
            result = None;
            match decode::<WorkerRecord>("workers", id.as_bytes(), old?) {
                Ok(mut rec) => {
                    f(&mut rec);
                    let bytes = encode(&rec);
                    result = Some(rec);
                    Some(bytes)
                }
                Err(e) => {
                    err = Some(e);
                    None
                }
            }
        })
        .await?;
        if let Some(e) = err {
            return Err(e);
        }
        if let Some(rec) = &result {
            self.held
                .write_locked()
                .workers
                .insert(id.to_string(), Ok(rec.clone()));
        }
        Ok(result)
    }

    /// Revokes a worker and flushes before returning.
    pub async fn revoke_worker(&self, id: &str) -> Result<WorkerRecord, Error> {
        let rec = self
            .update_worker(id, |w| w.revoked = true)
            .await?
            .ok_or_else(|| Error::NoSuchWorker(id.to_string()))?;
        self.flush().await?;
        Ok(rec)
    }

    /// Removes a worker: revoked, listed no more, its name free; flushed before returning.
    /// Its record stays as a tombstone, so every brain sharing the store goes on refusing its
    /// certificate as revoked.
    pub async fn remove_worker(&self, id: &str) -> Result<WorkerRecord, Error> {
        let rec = self
            .update_worker(id, |w| {
                w.revoked = true;
                w.removed = true;
            })
            .await?
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
        self.put_admin(rec).await
    }

    async fn put_admin(&self, rec: AdminRecord) -> Result<(), Error> {
        self.admins
            .insert(rec.name.as_bytes(), &encode(&rec))
            .await?;
        self.flush().await?;
        self.held
            .write_locked()
            .admins
            .insert(rec.name.clone(), Ok(rec));
        Ok(())
    }

    pub fn admin(&self, name: &str) -> Result<Option<AdminRecord>, Error> {
        held("admins", &self.held.read_locked().admins, name)
    }

    pub async fn revoke_admin(&self, name: &str) -> Result<(), Error> {
        let mut rec = self
            .admin(name)?
            .ok_or_else(|| Error::NoSuchAdmin(name.to_string()))?;
        rec.revoked = true;
        self.put_admin(rec).await
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

    #[test]
    fn a_worker_knows_a_refusal_for_good_by_its_words() {
        let s =
            tonic::Status::permission_denied(PeerRefused::Revoked("worker w-1".into()).to_string());
        assert!(shared::tls::refused_for_good(&s));
        // What a replica whose copy of the registry lags may say is not for good: the worker
        // tries again (the copy is read again from the store within a minute).
        for lagging in [
            PeerRefused::UnknownWorker("w-1".into()),
            PeerRefused::Superseded("worker w-1".into()),
        ] {
            let s = tonic::Status::permission_denied(lagging.to_string());
            assert!(!shared::tls::refused_for_good(&s), "{lagging}");
        }
        let passing = tonic::Status::permission_denied("worker w-1 may not make this call");
        assert!(!shared::tls::refused_for_good(&passing));
        let other_code = tonic::Status::unavailable(PeerRefused::Revoked("x".into()).to_string());
        assert!(!shared::tls::refused_for_good(&other_code));
    }

    async fn reg() -> (tempfile::TempDir, Registry) {
        let d = tempfile::tempdir().unwrap();
        let r = Registry::open(&d.path().join("db")).await.unwrap();
        (d, r)
    }

    #[tokio::test]
    async fn tokens_are_one_time_and_expire() {
        let (_d, r) = reg().await;
        let (t, _) = r.create_token(60_000, BTreeMap::new()).await.unwrap();
        assert!(
            r.tokens.get(t.as_bytes()).await.unwrap().is_none(),
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
        let (_d, r) = reg().await;
        let (t, expires) = r.create_token(1_000, BTreeMap::new()).await.unwrap();
        r.check_token_at(&t, expires - 1).await.unwrap();
        assert!(matches!(
            r.check_token_at(&t, expires).await,
            Err(Error::TokenExpired)
        ));
        assert!(matches!(
            r.consume_token_at(&t, expires).await,
            Err(Error::TokenExpired)
        ));
        // An expired attempt leaves it usable within its life.
        r.consume_token_at(&t, expires - 1).await.unwrap();
        assert!(matches!(
            r.check_token_at(&t, expires - 1).await,
            Err(Error::TokenUsed)
        ));
    }

    #[tokio::test]
    async fn second_open_of_the_same_store_fails_clearly() {
        let (d, _r) = reg().await;
        let err = Registry::open(&d.path().join("db"))
            .await
            .err()
            .expect("must fail");
        assert!(err.to_string().contains("another `brain serve`"), "{err}");
    }

    /// Two brains on one PostgreSQL database: a token one creates is consumed once across
    /// both; a worker one enrols the other finds when it opens; an undecodable record is
    /// reported by its key.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_postgres_two_brains_share_tokens_workers_and_admins() {
        let Some(pg) = testkit::postgres::start_or_skip() else {
            return;
        };
        let open = |name: &'static str| {
            let url = pg.url();
            async move {
                let db = crate::storage::postgres::Db::open(&url, name)
                    .await
                    .unwrap();
                Registry::from_store(Store::Postgres(db)).await.unwrap()
            }
        };
        let a = open("a").await;
        let b = open("b").await;
        let (t, _) = a.create_token(60_000, BTreeMap::new()).await.unwrap();
        b.check_token(&t).await.unwrap();
        let (ra, rb) = tokio::join!(a.consume_token(&t), b.consume_token(&t));
        assert!(
            ra.is_ok() != rb.is_ok(),
            "a one-time token was consumed {} times",
            u8::from(ra.is_ok()) + u8::from(rb.is_ok())
        );
        assert!(matches!(a.check_token(&t).await, Err(Error::TokenUsed)));
        let w = WorkerRecord {
            v: V,
            id: "w-1".into(),
            name: "laptop".into(),
            labels: BTreeMap::new(),
            cert_fingerprint: "f".into(),
            enrolled_ms: 1,
            last_seen_ms: 1,
            revoked: false,
            caps: None,
            removed: false,
        };
        a.add_worker(&w).await.unwrap();
        a.add_admin("ops", "fp", "ca", false).await.unwrap();
        let c = open("c").await;
        assert_eq!(c.resolve_worker("laptop").unwrap().id, "w-1");
        assert_eq!(c.admin("ops").unwrap().unwrap().fingerprint, "fp");
        c.revoke_worker("w-1").await.unwrap();
        assert!(open("d").await.worker("w-1").unwrap().unwrap().revoked);
        // A removal is seen by every brain on the store: revoked, listed no more, the name
        // free; the record stays, so its certificate is refused as revoked everywhere.
        c.remove_worker("w-1").await.unwrap();
        let f = open("f").await;
        let gone = f.worker("w-1").unwrap().unwrap();
        assert!(gone.revoked && gone.removed);
        assert!(f.workers().unwrap().is_empty());
        assert!(f.resolve_worker("laptop").is_err());
        pg.psql("INSERT INTO kv (tree, key, value) VALUES ('workers', 'w-bad', 'not json')");
        let err = open("e").await.workers().unwrap_err().to_string();
        assert!(err.contains("\"w-bad\" in tree workers"), "{err}");
    }
}
