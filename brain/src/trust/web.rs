//! Credentials of the HTTP API: bearer tokens for programs, one-time login links for browsers
//! and the sessions those links open. Each is stored under the SHA-256 of its secret, never
//! the secret itself; each has a role, an expiry, and can be revoked. A session's CSRF token
//! is derived from its secret, so it is never stored either.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::registry::Error;
use crate::storage::kv::{Store, Tree};

/// How long an unused login link works.
pub const LINK_TTL_MS: i64 = 10 * 60 * 1000;
/// A session's default lifetime.
pub const SESSION_TTL_MS: i64 = 12 * 3600 * 1000;
/// A token's default and longest lifetime.
pub const TOKEN_TTL_MS: i64 = 30 * 24 * 3600 * 1000;
pub const MAX_TTL_MS: i64 = 365 * 24 * 3600 * 1000;
/// Credentials kept (live and ended): creating one past this drops ended ones first, then
/// refuses.
const MAX_KEPT: usize = 10_000;
/// Ended credentials are listed for this long, then forgotten.
const KEEP_ENDED_MS: i64 = 7 * 24 * 3600 * 1000;

/// What a credential's holder may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebRole {
    /// Reads tasks, workers, machines, events and workspaces.
    Viewer,
    /// Also approves, denies, moves, cancels, resumes, delivers, creates tasks, revokes
    /// workers, releases and provisions machines, creates join tokens.
    Operator,
}

impl std::str::FromStr for WebRole {
    type Err = crate::model::word::UnknownWord;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "viewer" => Ok(Self::Viewer),
            "operator" => Ok(Self::Operator),
            _ => Err(Self::Err::new("role", s, "viewer or operator")),
        }
    }
}

impl fmt::Display for WebRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Viewer => "viewer",
            Self::Operator => "operator",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// `Authorization: Bearer`.
    Token,
    /// A one-time link, not used yet.
    Login,
    /// A browser's cookie, opened by a link.
    Session,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Token => "token",
            Self::Login => "login",
            Self::Session => "session",
        })
    }
}

/// One stored credential (without its secret).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Credential {
    pub id: String,
    pub name: String,
    pub role: WebRole,
    pub kind: Kind,
    pub created_ms: i64,
    pub expires_ms: i64,
    #[serde(default)]
    pub revoked: bool,
    /// For a link: how long the session it opens lasts.
    #[serde(default)]
    pub session_ttl_ms: i64,
}

impl Credential {
    pub fn live_at(&self, now_ms: i64) -> bool {
        !self.revoked && now_ms < self.expires_ms
    }
}

/// Who made an HTTP request.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    pub id: String,
    pub name: String,
    pub role: WebRole,
    pub kind: Kind,
    /// When the credential ends, if it is not revoked first.
    pub expires_ms: i64,
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "web:{}", self.name)
    }
}

/// Why a credential was refused. The message never holds the secret.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Refused {
    #[error(
        "unknown credential: log in again (`brain web login`) or create a token (`brain admin token create`)"
    )]
    Unknown,
    #[error("this credential expired: log in again (`brain web login`) or create a new token")]
    Expired,
    #[error("this credential was revoked: ask an admin for a new one")]
    Revoked,
    #[error("this login link was already used or has expired: run `brain web login` again")]
    LinkUsed,
}

/// The store: one tree, `web_auth`, keyed by the secret's hash.
#[derive(Clone)]
pub struct WebAuth {
    tree: std::sync::Arc<dyn Tree>,
    /// Counts revocations (and logouts), so that what a credential holds open (an event
    /// stream) can check it again the moment one happens instead of polling.
    revocations: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
}

fn hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// The key a credential is stored under: the SHA-256 of its secret. What holds on to a
/// credential (an event stream) keeps this, not the secret.
pub fn key_of(secret: &str) -> String {
    hash(secret)
}

fn secret(prefix: &str) -> String {
    use base64::Engine;
    format!(
        "{prefix}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
    )
}

/// The CSRF token of a session: the page sends it back in a header on every change.
pub fn csrf_for(session_secret: &str) -> String {
    hex::encode(&Sha256::digest(format!("tether-csrf:{session_secret}").as_bytes())[..16])
}

/// Whether `sent` is the CSRF token of the session `session_secret`, compared in constant
/// time (the time depends on the lengths only, never on how much of `sent` is right), so a
/// page cannot learn the token a byte at a time by timing refusals. Empty never matches.
pub fn csrf_matches(session_secret: &str, sent: &str) -> bool {
    use subtle::ConstantTimeEq;
    !sent.is_empty() && bool::from(sent.as_bytes().ct_eq(csrf_for(session_secret).as_bytes()))
}

/// Whether `text` looks like one of our secrets (for masking in logs).
pub fn looks_secret(text: &str) -> bool {
    ["tw_", "tl_", "ts_"].iter().any(|p| text.starts_with(p))
}

impl WebAuth {
    pub fn open(db: &sled::Db) -> Result<Self, Error> {
        Self::in_store(&Store::Sled(db.clone()))
    }

    pub fn in_store(store: &Store) -> Result<Self, Error> {
        Ok(Self {
            tree: store.tree("web_auth")?,
            revocations: std::sync::Arc::new(tokio::sync::watch::channel(0).0),
        })
    }

    /// Changes after every revocation or logout, once it is stored.
    pub fn revocations(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revocations.subscribe()
    }

    fn revoked_some(&self) {
        self.revocations.send_modify(|n| *n += 1);
    }

    async fn put(&self, key: &str, c: &Credential) -> Result<(), Error> {
        self.tree
            .insert(key.as_bytes(), &serde_json::to_vec(c).expect("serialises"))
            .await?;
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Credential>, Error> {
        match self.tree.get(key.as_bytes()).await? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| Error::Decode {
                    tree: "web_auth",
                    key: key.chars().take(8).collect(),
                    reason: e.to_string(),
                }),
        }
    }

    async fn entries(&self) -> Result<Vec<(String, Credential)>, Error> {
        let mut v = Vec::new();
        for (k, b) in self.tree.scan_prefix(b"").await? {
            let key = String::from_utf8_lossy(&k).into_owned();
            match serde_json::from_slice::<Credential>(&b) {
                Ok(c) => v.push((key, c)),
                Err(e) => tracing::warn!(error = %e, "undecodable web credential skipped"),
            }
        }
        Ok(v)
    }

    /// Makes room for one more: when the store is full, ended credentials go (those ended
    /// more than a week ago first); full of live ones, it refuses.
    async fn make_room(&self, now_ms: i64) -> Result<(), Error> {
        if self.tree.count().await? < MAX_KEPT {
            return Ok(());
        }
        let ended: Vec<(String, Credential)> = self
            .entries()
            .await?
            .into_iter()
            .filter(|(_, c)| !c.live_at(now_ms))
            .collect();
        let old = |c: &Credential| now_ms - c.expires_ms > KEEP_ENDED_MS;
        for (k, _) in ended.iter().filter(|(_, c)| old(c)) {
            self.tree.remove(k.as_bytes()).await?;
        }
        for (k, _) in ended.iter().filter(|(_, c)| !old(c)) {
            if self.tree.count().await? < MAX_KEPT {
                break;
            }
            self.tree.remove(k.as_bytes()).await?;
        }
        if self.tree.count().await? >= MAX_KEPT {
            return Err(Error::Full(MAX_KEPT));
        }
        Ok(())
    }

    async fn create(
        &self,
        kind: Kind,
        name: &str,
        role: WebRole,
        ttl_ms: i64,
        session_ttl_ms: i64,
    ) -> Result<(String, Credential), Error> {
        let now = shared::now_unix_ms();
        self.make_room(now).await?;
        let prefix = match kind {
            Kind::Token => "tw_",
            Kind::Login => "tl_",
            Kind::Session => "ts_",
        };
        let secret = secret(prefix);
        let c = Credential {
            id: hex::encode(rand::random::<[u8; 6]>()),
            name: name.to_string(),
            role,
            kind,
            created_ms: now,
            expires_ms: now + ttl_ms.clamp(1000, MAX_TTL_MS),
            revoked: false,
            session_ttl_ms,
        };
        self.put(&hash(&secret), &c).await?;
        self.tree.flush().await?;
        Ok((secret, c))
    }

    /// A bearer token for a program.
    pub async fn create_token(
        &self,
        name: &str,
        role: WebRole,
        ttl_ms: i64,
    ) -> Result<(String, Credential), Error> {
        self.create(Kind::Token, name, role, ttl_ms, 0).await
    }

    /// A one-time login link (its code) that opens a session of `session_ttl_ms`.
    pub async fn create_login(
        &self,
        name: &str,
        role: WebRole,
        session_ttl_ms: i64,
    ) -> Result<(String, Credential), Error> {
        self.create(Kind::Login, name, role, LINK_TTL_MS, session_ttl_ms)
            .await
    }

    /// Uses a login link up and opens its session: the session's secret (the cookie).
    pub async fn redeem(&self, code: &str) -> Result<Result<(String, Credential), Refused>, Error> {
        let key = hash(code);
        let Some(c) = self.get(&key).await? else {
            return Ok(Err(Refused::LinkUsed));
        };
        // One use: removed before the session exists, so two opens cannot both win.
        if self.tree.remove(key.as_bytes()).await?.is_none() || c.kind != Kind::Login {
            return Ok(Err(Refused::LinkUsed));
        }
        if !c.live_at(shared::now_unix_ms()) {
            self.tree.flush().await?;
            return Ok(Err(Refused::LinkUsed));
        }
        let ttl = if c.session_ttl_ms > 0 {
            c.session_ttl_ms
        } else {
            SESSION_TTL_MS
        };
        self.create(Kind::Session, &c.name, c.role, ttl, 0)
            .await
            .map(Ok)
    }

    /// Who holds `secret` (a token or a session), if it is live.
    pub async fn check(&self, secret: &str) -> Result<Result<Caller, Refused>, Error> {
        self.check_at(secret, shared::now_unix_ms()).await
    }

    pub async fn check_at(
        &self,
        secret: &str,
        now_ms: i64,
    ) -> Result<Result<Caller, Refused>, Error> {
        self.check_key_at(&hash(secret), now_ms).await
    }

    /// [`WebAuth::check`] by the credential's key ([`key_of`]) instead of its secret.
    pub async fn check_key(&self, key: &str) -> Result<Result<Caller, Refused>, Error> {
        self.check_key_at(key, shared::now_unix_ms()).await
    }

    async fn check_key_at(&self, key: &str, now_ms: i64) -> Result<Result<Caller, Refused>, Error> {
        let Some(c) = self.get(key).await? else {
            return Ok(Err(Refused::Unknown));
        };
        if c.kind == Kind::Login {
            return Ok(Err(Refused::Unknown));
        }
        if c.revoked {
            return Ok(Err(Refused::Revoked));
        }
        if now_ms >= c.expires_ms {
            return Ok(Err(Refused::Expired));
        }
        Ok(Ok(Caller {
            id: c.id,
            name: c.name,
            role: c.role,
            kind: c.kind,
            expires_ms: c.expires_ms,
        }))
    }

    /// Every credential, newest first; with `all`, ended ones too.
    pub async fn list(&self, all: bool) -> Result<Vec<Credential>, Error> {
        let now = shared::now_unix_ms();
        let mut v: Vec<Credential> = self
            .entries()
            .await?
            .into_iter()
            .map(|(_, c)| c)
            .filter(|c| all || c.live_at(now))
            .collect();
        v.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(a.id.cmp(&b.id)));
        Ok(v)
    }

    /// Revokes the credential with this id, or every one of this name. How many.
    pub async fn revoke(&self, id_or_name: &str) -> Result<usize, Error> {
        let mut n = 0;
        for (k, mut c) in self.entries().await? {
            if (c.id == id_or_name || c.name == id_or_name) && !c.revoked {
                c.revoked = true;
                self.put(&k, &c).await?;
                n += 1;
            }
        }
        self.tree.flush().await?;
        if n > 0 {
            self.revoked_some();
        }
        Ok(n)
    }

    /// Ends one session (logging out).
    pub async fn end_session(&self, secret: &str) -> Result<(), Error> {
        let key = hash(secret);
        if let Some(mut c) = self.get(&key).await?
            && c.kind == Kind::Session
        {
            c.revoked = true;
            self.put(&key, &c).await?;
            self.tree.flush().await?;
            self.revoked_some();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> WebAuth {
        let db = sled::Config::new().temporary(true).open().unwrap();
        WebAuth::open(&db).unwrap()
    }

    #[tokio::test]
    async fn a_token_is_stored_only_as_its_hash_and_checks_by_role() {
        let s = store();
        let (secret, c) = s.create_token("ci", WebRole::Viewer, 60_000).await.unwrap();
        assert!(secret.starts_with("tw_") && secret.len() > 40);
        for (k, v) in s.tree.scan_prefix(b"").await.unwrap() {
            assert!(!String::from_utf8_lossy(&k).contains(&secret[3..]));
            assert!(!String::from_utf8_lossy(&v).contains(&secret[3..]));
        }
        let who = s.check(&secret).await.unwrap().unwrap();
        assert_eq!((who.name.as_str(), who.role), ("ci", WebRole::Viewer));
        assert_eq!(s.check("tw_nope").await.unwrap(), Err(Refused::Unknown));
        assert_eq!(
            s.check_at(&secret, c.expires_ms).await.unwrap(),
            Err(Refused::Expired)
        );
        assert_eq!(s.revoke(&c.id).await.unwrap(), 1);
        assert_eq!(s.check(&secret).await.unwrap(), Err(Refused::Revoked));
        assert!(s.list(false).await.unwrap().is_empty());
        assert_eq!(s.list(true).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_login_link_opens_one_session_once() {
        let s = store();
        let (code, _) = s
            .create_login("ann", WebRole::Operator, 3_600_000)
            .await
            .unwrap();
        // A link is not a credential by itself.
        assert_eq!(s.check(&code).await.unwrap(), Err(Refused::Unknown));
        let (session, c) = s.redeem(&code).await.unwrap().unwrap();
        assert_eq!(c.kind, Kind::Session);
        assert!(c.expires_ms - c.created_ms == 3_600_000);
        assert_eq!(s.redeem(&code).await.unwrap(), Err(Refused::LinkUsed));
        let who = s.check(&session).await.unwrap().unwrap();
        assert_eq!(who.role, WebRole::Operator);
        assert_ne!(csrf_for(&session), csrf_for("ts_other"));
        s.end_session(&session).await.unwrap();
        assert_eq!(s.check(&session).await.unwrap(), Err(Refused::Revoked));
    }

    #[test]
    fn the_csrf_token_is_compared_whole_and_only_equal_matches() {
        let session = "ts_session-secret";
        let good = csrf_for(session);
        assert!(csrf_matches(session, &good));
        assert!(!csrf_matches(session, ""), "empty");
        assert!(!csrf_matches(session, &good[..good.len() - 1]), "a prefix");
        assert!(!csrf_matches(session, &format!("{good}0")), "longer");
        assert!(!csrf_matches(session, &good.to_uppercase()), "another case");
        let mut last_wrong = good.clone().into_bytes();
        *last_wrong.last_mut().unwrap() ^= 1;
        assert!(!csrf_matches(
            session,
            &String::from_utf8(last_wrong).unwrap()
        ));
        assert!(!csrf_matches("ts_other", &good), "another session's");
    }

    #[tokio::test]
    async fn revoking_a_name_ends_its_tokens_and_sessions() {
        let s = store();
        let (a, _) = s
            .create_token("bob", WebRole::Viewer, 60_000)
            .await
            .unwrap();
        let (code, _) = s.create_login("bob", WebRole::Viewer, 0).await.unwrap();
        let (b, _) = s.redeem(&code).await.unwrap().unwrap();
        let (other, _) = s
            .create_token("eve", WebRole::Viewer, 60_000)
            .await
            .unwrap();
        assert_eq!(s.revoke("bob").await.unwrap(), 2);
        assert_eq!(s.check(&a).await.unwrap(), Err(Refused::Revoked));
        assert_eq!(s.check(&b).await.unwrap(), Err(Refused::Revoked));
        assert!(s.check(&other).await.unwrap().is_ok());
    }
}
