//! The CA on a store that several brains share: its certificate and its key, the key sealed
//! under the secrets key like every secret, in the tree `ca`. The first replica to reach the
//! store puts its own CA there (from `brain init`); every other takes the store's, so that
//! every replica's server certificate and every worker's and admin's certificate chain to
//! one CA and a worker may move between replicas.
//!
//! A replica that adopts the store's CA moves the data dir's own CA, server certificate and
//! admin identity aside into `replaced-<ms>/` (nothing is deleted) and issues itself a new
//! server certificate under the store's CA for the names its old one had, and an admin
//! identity of its own, `admin-<replica>` (registered at start like `brain init`'s), so that
//! admin commands work on every replica's machine. Its CA key stays in the store only: a
//! data dir that adopted the CA holds no CA key.

use serde::{Deserialize, Serialize};
use shared::pki;

use super::ca::{Ca, DataDir, Error};
use super::secrets::Secrets;
use crate::storage::kv;

/// What the key is sealed for (bound into the seal).
const PURPOSE: &str = "tether ca key v1";
const KEY: &[u8] = b"ca";

#[derive(Serialize, Deserialize)]
struct Record {
    cert_pem: String,
    /// Hex of the sealed key.
    key_sealed: String,
}

/// Errors of the shared CA.
#[derive(Debug, thiserror::Error)]
pub enum SharedCaError {
    #[error(transparent)]
    Ca(#[from] Error),
    #[error("the store: {0}")]
    Store(#[from] kv::Error),
    #[error("{0}")]
    Secrets(#[from] super::secrets::Error),
    #[error(
        "the store's CA key was sealed with another secrets key than this brain's: every replica on one store needs the same secrets key (copy secrets.key from the first replica's data dir, mode 600, or set TETHER_SECRET_KEY)"
    )]
    KeyMismatch,
    #[error("the store's CA record is unreadable: {0}")]
    Bad(String),
}

/// The CA every brain on `store` uses (see the module's header).
pub async fn in_store(
    store: &kv::Store,
    secrets: &Secrets,
    data: &DataDir,
    replica: &str,
) -> Result<Ca, SharedCaError> {
    let tree = store.tree("ca")?;
    loop {
        if let Some(bytes) = tree.get(KEY).await? {
            let rec: Record =
                serde_json::from_slice(&bytes).map_err(|e| SharedCaError::Bad(e.to_string()))?;
            let sealed =
                hex::decode(&rec.key_sealed).map_err(|e| SharedCaError::Bad(e.to_string()))?;
            let key = secrets
                .open_bytes(PURPOSE, &sealed)
                .ok_or(SharedCaError::KeyMismatch)?;
            let key = std::str::from_utf8(&key).map_err(|e| SharedCaError::Bad(e.to_string()))?;
            let ca = Ca::from_pems(rec.cert_pem, key, std::path::Path::new("the store's CA"))?;
            adopt(data, &ca, replica)?;
            return Ok(ca);
        }
        let local = Ca::load(data)?;
        let rec = Record {
            cert_pem: local.cert_pem.clone(),
            key_sealed: hex::encode(secrets.seal_bytes(PURPOSE, local.key_pem().as_bytes())?),
        };
        let json = serde_json::to_vec(&rec).expect("records serialise");
        if tree.compare_and_swap(KEY, None, Some(&json)).await? {
            tracing::info!(ca = %local.hash(), "this brain's CA is now the store's");
            return Ok(local);
        }
        // Another replica put its CA there first: take that one.
    }
}

/// Makes the data dir's trust files the store CA's (see the module's header).
fn adopt(data: &DataDir, ca: &Ca, replica: &str) -> Result<(), Error> {
    let io = |path: &std::path::Path, source: std::io::Error| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    if std::fs::read_to_string(data.ca_cert()).ok().as_deref() == Some(ca.cert_pem.as_str()) {
        return Ok(());
    }
    std::fs::create_dir_all(data.path()).map_err(|e| io(data.path(), e))?;
    let hosts = std::fs::read_to_string(data.server_cert())
        .ok()
        .map(|pem| server_names(&pem))
        .unwrap_or_default();
    let aside = data
        .path()
        .join(format!("replaced-{}", shared::now_unix_ms()));
    let moved: Vec<std::path::PathBuf> = [
        data.ca_cert(),
        data.ca_key(),
        data.server_cert(),
        data.server_key(),
        data.admin_identity(),
    ]
    .into_iter()
    .filter(|p| p.exists())
    .collect();
    if !moved.is_empty() {
        std::fs::create_dir_all(&aside).map_err(|e| io(&aside, e))?;
        for p in &moved {
            let to = aside.join(p.file_name().expect("a file in the data dir"));
            std::fs::rename(p, &to).map_err(|e| io(p, e))?;
        }
    }
    let (chain, key) = ca.issue_server(&hosts)?;
    pki::write_file(&data.ca_cert(), ca.cert_pem.as_bytes(), 0o644)?;
    pki::write_file(&data.server_key(), key.as_bytes(), 0o600)?;
    pki::write_file(&data.server_cert(), chain.as_bytes(), 0o644)?;
    let admin = admin_name(replica);
    let (key, csr) = pki::new_key_and_csr(&admin)?;
    pki::IdentityFiles {
        ca_pem: ca.cert_pem.clone(),
        cert_pem: ca.sign_client(&csr, pki::Role::Admin, &admin)?,
        key_pem: key.serialize_pem(),
    }
    .save(&data.admin_identity())?;
    tracing::warn!(
        ca = %ca.hash(),
        hosts = ?hosts,
        aside = %aside.display(),
        %admin,
        "this data dir now uses the store's CA (shared by every replica); its own CA, server certificate and admin identity were moved aside, and it has an admin identity of its own under the store's CA"
    );
    Ok(())
}

/// The admin identity a replica that adopted the store's CA holds: `admin-` and its name,
/// with what is not a letter, digit, `-`, `_` or `.` made `-`.
fn admin_name(replica: &str) -> String {
    let safe: String = replica
        .chars()
        .take(64)
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
            _ => '-',
        })
        .collect();
    format!("admin-{safe}")
}

/// The DNS names and IP addresses a server certificate (the first in `pem`) is for.
fn server_names(pem: &str) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok(certs) = pki::certs_from_pem(pem, std::path::Path::new("server.pem")) else {
        return Vec::new();
    };
    let Some(der) = certs.first() else {
        return Vec::new();
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some(d.to_string()),
            GeneralName::IPAddress(b) => match b.len() {
                4 => Some(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).ok()?).to_string()),
                16 => Some(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).ok()?).to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}
