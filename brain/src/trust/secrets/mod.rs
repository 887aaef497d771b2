//! Credentials the brain holds for tasks' commands: each sealed at rest in the sled tree
//! `secrets` (ChaCha20-Poly1305 under a key that is not in the store: `secrets.key` in the
//! data dir, 0600, made on first use, or `$TETHER_SECRET_KEY`), so a backup carries them
//! only sealed. The seal covers the whole record — its version, name, hosts, port,
//! injection, environment variable and tier, as the associated data — so whoever can write
//! the store or hand over a backup cannot rebind a secret to another host or lower its tier:
//! a record edited so opens nowhere, and says so. Each is bound to the hosts (exact, or `*.suffix`) and the port it may be sent
//! to and says how it is injected there. A secret of the provider tier (an LLM or cloud key)
//! is held the same way but never resolved for a command.
//!
//! Commands never see a value: a task's command gets a placeholder,
//! `tether-secret:NAME:TOKEN`, whose token is a keyed hash of the task and the name under a
//! key derived from the secrets key, so it is unguessable, the same after a restart, and
//! worthless anywhere but on the way through this brain to a host the secret is bound to.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

pub use crate::model::egress::HostPattern;

/// The environment variable that may hold the secrets key (64 hex digits) instead of the
/// data dir's `secrets.key`.
pub const KEY_ENV: &str = "TETHER_SECRET_KEY";
/// What every placeholder starts with.
pub const PLACEHOLDER_PREFIX: &str = "tether-secret:";
/// Largest value accepted.
pub const MAX_VALUE_BYTES: usize = 16 * 1024;
/// Most hosts one secret is bound to.
pub const MAX_HOSTS: usize = 32;
/// Version 2 seals the whole binding; version 1 sealed the name only and is refused.
const RECORD_VERSION: u32 = 2;

/// Errors of the secrets store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid secret: {0}")]
    Invalid(String),
    #[error("no secret named {0:?} (see `brain secret list`)")]
    Unknown(String),
    #[error(
        "the secrets key is missing ({path} does not exist) but the store holds sealed secrets: restore that file or set {KEY_ENV}"
    )]
    KeyMissing { path: PathBuf },
    #[error("the secrets key {0}")]
    BadKey(String),
    #[error(
        "cannot open secret {0:?}: it was sealed with another key than this brain's secrets key, or its record was edited after sealing (the seal covers its binding: hosts, port, injection, tier); restore the matching secrets.key or {KEY_ENV}, or set it again with `brain secret set {0}`"
    )]
    Unseal(String),
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "secret {0:?} does not open: its seal does not match its binding (hosts, port, injection, tier) — the record was edited, or sealed by an earlier version that bound only its name; set it again with `brain secret set {0}` or remove it with `brain secret rm {0}`"
    )]
    Binding(String),
    #[error("secret record {0:?} is unreadable: {1}")]
    Decode(String, String),
    #[error("store: {0}")]
    Sled(#[from] sled::Error),
    #[error(transparent)]
    Store(#[from] crate::storage::kv::Error),
}

impl shared::exit::Classify for Error {
    fn exit_code(&self) -> Option<shared::exit::ExitCode> {
        match self {
            Error::KeyMissing { .. } | Error::BadKey(_) | Error::Unseal(_) | Error::Binding(_) => {
                Some(shared::exit::ExitCode::Config)
            }
            _ => None,
        }
    }
}

/// How a secret is put into a request to a host it is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "name")]
pub enum Inject {
    /// `Authorization: Bearer VALUE`.
    Bearer,
    /// `Authorization: Basic base64(USER:VALUE)`.
    Basic(String),
    /// A header of this name holding the value.
    Header(String),
    /// A query parameter of this name holding the value.
    Query(String),
}

impl Inject {
    /// `bearer`, `basic:USER`, `header:NAME`, `query:NAME`.
    pub fn parse(s: &str) -> Result<Self, Error> {
        let (kind, arg) = s.split_once(':').unwrap_or((s, ""));
        let need = |what: &str| {
            if arg.is_empty() {
                Err(Error::Invalid(format!(
                    "injection {kind:?} needs {what}: {kind}:{}",
                    what.to_uppercase()
                )))
            } else {
                Ok(arg.to_string())
            }
        };
        let token_chars = |v: &str, what: &str| {
            if v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.~!#$&'*+^`|".contains(&b))
            {
                Ok(())
            } else {
                Err(Error::Invalid(format!(
                    "{what} {v:?} has characters a {what} may not hold"
                )))
            }
        };
        match kind {
            "bearer" if arg.is_empty() => Ok(Inject::Bearer),
            "basic" => {
                let user = need("a user name")?;
                if user.contains(':') || user.chars().any(char::is_control) {
                    return Err(Error::Invalid(format!(
                        "Basic auth user {user:?} may not hold ':' or control characters"
                    )));
                }
                Ok(Inject::Basic(user))
            }
            "header" => {
                let h = need("a header name")?;
                token_chars(&h, "header name")?;
                let lower = h.to_ascii_lowercase();
                if matches!(
                    lower.as_str(),
                    "host" | "content-length" | "transfer-encoding" | "connection"
                ) {
                    return Err(Error::Invalid(format!(
                        "header {h:?} cannot carry a secret"
                    )));
                }
                Ok(Inject::Header(h))
            }
            "query" => {
                let q = need("a parameter name")?;
                token_chars(&q, "query parameter")?;
                Ok(Inject::Query(q))
            }
            _ => Err(Error::Invalid(format!(
                "unknown injection {s:?}: use bearer, basic:USER, header:NAME or query:NAME"
            ))),
        }
    }
}

impl std::fmt::Display for Inject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Inject::Bearer => f.write_str("bearer"),
            Inject::Basic(u) => write!(f, "basic:{u}"),
            Inject::Header(h) => write!(f, "header:{h}"),
            Inject::Query(q) => write!(f, "query:{q}"),
        }
    }
}

/// Who may resolve a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Tasks' commands, through the egress proxy, on the hosts it is bound to.
    Command,
    /// The brain's own calls (LLM and cloud-provider keys): never a command's.
    Provider,
}

/// What is known of a secret besides its value: what `brain secret list` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretInfo {
    pub name: String,
    pub hosts: Vec<HostPattern>,
    pub port: u16,
    pub inject: Inject,
    /// The environment variable a task's commands find its placeholder in.
    pub env: String,
    pub tier: Tier,
    pub updated_unix_ms: i64,
}

impl SecretInfo {
    /// Whether this secret may be sent to `host:port`.
    pub fn bound_to(&self, host: &str, port: u16) -> bool {
        self.port == port && self.hosts.iter().any(|h| h.matches(host))
    }
}

/// A secret's value. Its `Debug` says nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Value(Vec<u8>);

impl Value {
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Value(<{} bytes>)", self.0.len())
    }
}

#[derive(Serialize, Deserialize)]
struct Record {
    v: u32,
    info: SecretInfo,
    nonce: String,
    sealed: String,
}

/// What the seal binds a value to: everything that says where it may go and who may use it.
#[derive(Serialize)]
struct Binding<'a> {
    v: u32,
    name: &'a str,
    hosts: &'a [HostPattern],
    port: u16,
    inject: &'a Inject,
    env: &'a str,
    tier: Tier,
}

/// The associated data of a record's seal.
fn aad(v: u32, info: &SecretInfo) -> Vec<u8> {
    let mut out = b"tether secret\0".to_vec();
    serde_json::to_writer(
        &mut out,
        &Binding {
            v,
            name: &info.name,
            hosts: &info.hosts,
            port: info.port,
            inject: &info.inject,
            env: &info.env,
            tier: info.tier,
        },
    )
    .expect("bindings serialise");
    out
}

/// A secret's name: 1-64 characters of `[a-z0-9_-]`, starting with a letter.
pub fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "secret name {name:?}: use 1-64 characters of a-z, 0-9, '_' and '-', starting with a letter"
        )))
    }
}

/// The default environment variable for a secret: its name in capitals, `-` as `_`.
pub fn default_env(name: &str) -> String {
    name.to_ascii_uppercase().replace('-', "_")
}

fn check_env(env: &str) -> Result<(), Error> {
    let ok = !env.is_empty()
        && env.len() <= 128
        && env.starts_with(|c: char| c.is_ascii_uppercase() || c == '_')
        && env
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    let reserved = matches!(
        env,
        "PATH"
            | "HOME"
            | "TMPDIR"
            | "USER"
            | "LOGNAME"
            | "LD_PRELOAD"
            | "LD_LIBRARY_PATH"
            | "HTTP_PROXY"
            | "HTTPS_PROXY"
            | "ALL_PROXY"
            | "NO_PROXY"
    ) || env.ends_with("_PROXY")
        || env.starts_with("TETHER_");
    if ok && !reserved {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "environment variable {env:?}: use A-Z, 0-9 and '_', and not one the sandbox sets (PATH, HOME, *_PROXY, TETHER_*, ...)"
        )))
    }
}

/// Checks a secret's description and value before it is stored.
fn check(info: &SecretInfo, value: &[u8]) -> Result<(), Error> {
    check_name(&info.name)?;
    check_env(&info.env)?;
    if value.is_empty() {
        return Err(Error::Invalid("the value is empty".into()));
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(Error::Invalid(format!(
            "the value is {} bytes; at most {MAX_VALUE_BYTES}",
            value.len()
        )));
    }
    if value.iter().any(|b| b.is_ascii_control()) {
        return Err(Error::Invalid(
            "the value holds a control character (a newline?): it could not travel in a header"
                .into(),
        ));
    }
    if info.tier == Tier::Command && info.hosts.is_empty() {
        return Err(Error::Invalid(
            "a command's secret must be bound to at least one host (--host)".into(),
        ));
    }
    if info.hosts.len() > MAX_HOSTS {
        return Err(Error::Invalid(format!("more than {MAX_HOSTS} hosts")));
    }
    if let Some((host, suffix)) = info
        .hosts
        .iter()
        .find_map(|h| h.spans_public_suffix().map(|s| (h, s)))
    {
        return Err(Error::Invalid(format!(
            "host {host} spans the public suffix {suffix}: anyone can register a name under it and would be sent this secret; name the hosts you use (e.g. api.{suffix} or *.yourname.{suffix})"
        )));
    }
    if info.port == 0 {
        return Err(Error::Invalid("port 0".into()));
    }
    Ok(())
}

/// `$TETHER_SECRET_KEY`, once [`take_key_from_env`] has taken it out of the environment.
static TAKEN: std::sync::OnceLock<Option<zeroize::Zeroizing<String>>> = std::sync::OnceLock::new();

/// Takes `$TETHER_SECRET_KEY` out of this process's environment and keeps it for
/// [`Secrets::open`]: the value's bytes in the environment block (which `/proc/PID/environ`
/// shows) are overwritten, and the variable is removed, so neither that file nor any program
/// this process starts (git, ssh, a local worker) carries it.
///
/// # Safety
/// Call it before this process starts any thread: it writes the environment.
pub unsafe fn take_key_from_env() {
    let value = std::env::var(KEY_ENV).ok().map(zeroize::Zeroizing::new);
    if std::env::var_os(KEY_ENV).is_some() {
        // SAFETY: single-threaded (the caller's promise); getenv points at the value's bytes
        // inside the "NAME=value" string, which is ours to write, and strlen stays within it.
        unsafe {
            let p = libc::getenv(c"TETHER_SECRET_KEY".as_ptr());
            if !p.is_null() {
                std::ptr::write_bytes(p, 0, libc::strlen(p));
            }
            std::env::remove_var(KEY_ENV);
        }
    }
    let _ = TAKEN.set(value);
}

/// The key's text from the environment, taken or (in a process that did not take it) read.
fn key_from_env() -> Option<zeroize::Zeroizing<String>> {
    match TAKEN.get() {
        Some(taken) => taken.clone(),
        None => std::env::var(KEY_ENV).ok().map(zeroize::Zeroizing::new),
    }
}

/// The sealing key, from the environment or the data dir.
fn load_key(path: &Path, store_empty: bool) -> Result<[u8; 32], Error> {
    let parse = |text: &str, from: &str| -> Result<[u8; 32], Error> {
        let bytes = hex::decode(text.trim())
            .map_err(|e| Error::BadKey(format!("in {from} is not hex: {e}")))?;
        bytes.try_into().map_err(|b: Vec<u8>| {
            Error::BadKey(format!(
                "in {from} is {} bytes; it must be 32 (64 hex digits)",
                b.len()
            ))
        })
    };
    if let Some(text) = key_from_env() {
        return parse(&text, KEY_ENV);
    }
    match std::fs::read_to_string(path) {
        Ok(text) => {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path)
                .map(|m| m.permissions().mode() & 0o777)
                .unwrap_or(0);
            if mode & 0o077 != 0 {
                return Err(Error::BadKey(format!(
                    "file {} is readable by others (mode {mode:o}): `chmod 600` it",
                    path.display()
                )));
            }
            parse(&text, &path.display().to_string())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !store_empty {
                return Err(Error::KeyMissing {
                    path: path.to_path_buf(),
                });
            }
            let mut key = [0u8; 32];
            SystemRandom::new()
                .fill(&mut key)
                .map_err(|_| Error::BadKey("cannot be made: no randomness".into()))?;
            shared::fsio::write_atomic(
                path,
                format!("{}\n", hex::encode(key)).as_bytes(),
                0o600,
                shared::fsio::Durability::Full,
            )
            .map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?;
            Ok(key)
        }
        Err(source) => Err(Error::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The secrets store. Cheap to clone.
#[derive(Clone)]
pub struct Secrets {
    tree: std::sync::Arc<dyn crate::storage::kv::Tree>,
    seal: std::sync::Arc<LessSafeKey>,
    placeholder_key: std::sync::Arc<ring::hmac::Key>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secrets")
    }
}

impl Secrets {
    /// Opens the tree `secrets` with the key from `$TETHER_SECRET_KEY` or `key_file` (made
    /// when neither exists and nothing is sealed yet).
    pub async fn open(db: &sled::Db, key_file: &Path) -> Result<Self, Error> {
        Self::in_store(&crate::storage::kv::Store::Sled(db.clone()), key_file).await
    }

    /// [`Secrets::open`] in any store.
    pub async fn in_store(
        store: &crate::storage::kv::Store,
        key_file: &Path,
    ) -> Result<Self, Error> {
        let tree = store.tree("secrets")?;
        let key = load_key(key_file, tree.scan_prefix(b"").await?.is_empty())?;
        let seal = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &key).expect("32 bytes"));
        // A separate key for placeholders, so that knowing one says nothing of the other.
        let derived = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key),
            b"tether placeholders v1",
        );
        let placeholder_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, derived.as_ref());
        Ok(Self {
            tree,
            seal: seal.into(),
            placeholder_key: placeholder_key.into(),
        })
    }

    /// Stores (or replaces) a secret, flushed before it returns. Says whether one was
    /// replaced.
    pub async fn set(&self, mut info: SecretInfo, value: Value) -> Result<bool, Error> {
        check(&info, value.expose())?;
        info.hosts.sort();
        info.hosts.dedup();
        info.updated_unix_ms = shared::now_unix_ms();
        let mut nonce = [0u8; 12];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| Error::Invalid("no randomness for a nonce".into()))?;
        let mut sealed = value.expose().to_vec();
        self.seal
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(RECORD_VERSION, &info)),
                &mut sealed,
            )
            .map_err(|_| Error::Invalid("cannot seal the value".into()))?;
        let rec = Record {
            v: RECORD_VERSION,
            info: info.clone(),
            nonce: hex::encode(nonce),
            sealed: hex::encode(&sealed),
        };
        let old = self
            .tree
            .insert(
                info.name.as_bytes(),
                &serde_json::to_vec(&rec).expect("records serialise"),
            )
            .await?;
        self.tree.flush().await?;
        Ok(old.is_some())
    }

    /// `plain` sealed under the secrets key for `purpose` (which it must be opened with):
    /// a random nonce, then the ciphertext and tag.
    pub fn seal_bytes(&self, purpose: &str, plain: &[u8]) -> Result<Vec<u8>, Error> {
        let mut nonce = [0u8; 12];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| Error::Invalid("no randomness for a nonce".into()))?;
        let mut sealed = plain.to_vec();
        self.seal
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(purpose.as_bytes()),
                &mut sealed,
            )
            .map_err(|_| Error::Invalid("cannot seal".into()))?;
        Ok([&nonce[..], &sealed].concat())
    }

    /// Opens what [`Secrets::seal_bytes`] sealed for `purpose`; `None` when this key did not
    /// seal it (or it was changed).
    pub fn open_bytes(&self, purpose: &str, sealed: &[u8]) -> Option<zeroize::Zeroizing<Vec<u8>>> {
        let (nonce, rest) = sealed.split_at_checked(12)?;
        let mut buf = zeroize::Zeroizing::new(rest.to_vec());
        let plain = self
            .seal
            .open_in_place(
                Nonce::assume_unique_for_key(nonce.try_into().ok()?),
                Aad::from(purpose.as_bytes()),
                &mut buf[..],
            )
            .ok()?
            .to_vec();
        Some(zeroize::Zeroizing::new(plain))
    }

    /// Removes a secret; says whether there was one.
    pub async fn remove(&self, name: &str) -> Result<bool, Error> {
        let old = self.tree.remove(name.as_bytes()).await?;
        self.tree.flush().await?;
        Ok(old.is_some())
    }

    /// A record, opened: its seal checked against its whole binding.
    fn open_record(&self, name: &str, bytes: &[u8]) -> Result<(SecretInfo, Value), Error> {
        let rec: Record = serde_json::from_slice(bytes)
            .map_err(|e| Error::Decode(name.to_string(), e.to_string()))?;
        if rec.v == 1 || rec.info.name != name {
            return Err(Error::Binding(name.to_string()));
        }
        if rec.v != RECORD_VERSION {
            return Err(Error::Decode(
                name.to_string(),
                format!(
                    "record version {} (this brain reads {RECORD_VERSION})",
                    rec.v
                ),
            ));
        }
        let bad = || Error::Decode(name.to_string(), "bad hex".into());
        let nonce: [u8; 12] = hex::decode(&rec.nonce)
            .map_err(|_| bad())?
            .try_into()
            .map_err(|_| bad())?;
        let mut sealed = hex::decode(&rec.sealed).map_err(|_| bad())?;
        let plain = self
            .seal
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(rec.v, &rec.info)),
                &mut sealed,
            )
            .map_err(|_| Error::Unseal(name.to_string()))?;
        Ok((rec.info, Value::new(plain.to_vec())))
    }

    /// One secret's description, without its value (checked as [`Secrets::reveal`] does).
    pub async fn info(&self, name: &str) -> Result<SecretInfo, Error> {
        Ok(self.reveal(name).await?.0)
    }

    /// Every secret's description, by name; the first record that does not open is an error
    /// naming it.
    pub async fn list(&self) -> Result<Vec<SecretInfo>, Error> {
        let mut out = Vec::new();
        for (k, v) in self.tree.scan_prefix(b"").await? {
            out.push(self.open_record(&String::from_utf8_lossy(&k), &v)?.0);
        }
        Ok(out)
    }

    /// A secret's value, for the brain's own use (the egress proxy, the redactor), once its
    /// seal is checked against its whole binding.
    pub async fn reveal(&self, name: &str) -> Result<(SecretInfo, Value), Error> {
        let bytes = self
            .tree
            .get(name.as_bytes())
            .await?
            .ok_or_else(|| Error::Unknown(name.to_string()))?;
        self.open_record(name, &bytes)
    }

    /// The placeholder a task's commands hold for secret `name`.
    pub fn placeholder(&self, task: &str, name: &str) -> String {
        let tag = ring::hmac::sign(
            &self.placeholder_key,
            format!("{task}\u{0}{name}").as_bytes(),
        );
        format!(
            "{PLACEHOLDER_PREFIX}{name}:{}",
            hex::encode(&tag.as_ref()[..16])
        )
    }

    /// A keyed tag for `parts`, for grants the brain checks later without storing them.
    pub fn tag(&self, parts: &[&str]) -> String {
        let tag = ring::hmac::sign(&self.placeholder_key, parts.join("\u{0}").as_bytes());
        hex::encode(&tag.as_ref()[..16])
    }

    /// Every secret's value with its name, for masking (records that do not open are
    /// skipped: they are never sent anywhere either).
    /// The store not answering is an error: masking must not go on without the values.
    pub async fn values(&self) -> Result<Vec<(String, Value)>, Error> {
        Ok(self
            .tree
            .scan_prefix(b"")
            .await?
            .into_iter()
            .filter_map(|(k, v)| self.open_record(&String::from_utf8_lossy(&k), &v).ok())
            .map(|(i, v)| (i.name, v))
            .collect())
    }

    /// Checks that `names` are command secrets, for a task that asks for them; refuses a
    /// provider-tier one and an unknown one.
    pub async fn for_task(&self, names: &[String]) -> Result<Vec<SecretInfo>, Error> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for n in names {
            if !seen.insert(n.as_str()) {
                continue;
            }
            let info = self.info(n).await?;
            if info.tier == Tier::Provider {
                return Err(Error::Invalid(format!(
                    "secret {n:?} is a provider key (LLM or cloud): the brain's own, never a command's"
                )));
            }
            out.push(info);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
