//! Identities and TLS configuration.
//!
//! Every certificate the brain issues names its holder in a URI subject-alternative name:
//! `tether://worker/<id>` or `tether://admin/<name>`. The brain writes that name itself when it
//! signs (whatever the request asked for), so a worker can never hold an admin identity. Client
//! certificates carry only the clientAuth usage and the server certificate only serverAuth, so
//! neither can stand in for the other.

use crate::locks::Lock;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};

/// Errors loading or using key material.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} in {path} is not valid PEM: {reason}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("invalid certificate: {0}")]
    Certificate(String),
    #[error(
        "invalid CA hash {0:?}: expected sha256:<64 hex digits> as printed by `brain token create`"
    )]
    CaHash(String),
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("key generation: {0}")]
    Key(#[from] rcgen::Error),
}

impl crate::exit::Classify for Error {
    /// Key material that is missing, unreadable or malformed, or a bad CA hash, is a
    /// configuration problem; failing to write a file or to make a key is not.
    fn exit_code(&self) -> Option<crate::exit::ExitCode> {
        matches!(
            self,
            Error::Read { .. }
                | Error::Pem { .. }
                | Error::Certificate(_)
                | Error::CaHash(_)
                | Error::Tls(_)
        )
        .then_some(crate::exit::ExitCode::Config)
    }
}

/// The kind of holder a client certificate names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Worker,
    Admin,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Admin => "admin",
        }
    }
}

/// Who a client certificate belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    pub role: Role,
    /// Worker id or admin name.
    pub id: String,
    /// Hex SHA-256 of the certificate's DER.
    pub fingerprint: String,
}

impl fmt::Display for PeerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.role.as_str(), self.id)
    }
}

const URI_PREFIX: &str = "tether://";

/// The SAN URI naming a holder.
pub fn identity_uri(role: Role, id: &str) -> String {
    format!("{URI_PREFIX}{}/{id}", role.as_str())
}

/// Reads the identity out of a client certificate issued by a Tether brain.
pub fn peer_identity(der: &[u8]) -> Result<PeerIdentity, Error> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| Error::Certificate(format!("cannot parse: {e}")))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| Error::Certificate(format!("bad subjectAltName: {e}")))?
        .ok_or_else(|| Error::Certificate("no subjectAltName naming a Tether identity".into()))?;
    for name in &san.value.general_names {
        if let GeneralName::URI(uri) = name
            && let Some(rest) = uri.strip_prefix(URI_PREFIX)
        {
            let (role, id) = rest
                .split_once('/')
                .ok_or_else(|| Error::Certificate(format!("malformed identity {uri:?}")))?;
            let role = match role {
                "worker" => Role::Worker,
                "admin" => Role::Admin,
                _ => return Err(Error::Certificate(format!("unknown role in {uri:?}"))),
            };
            return Ok(PeerIdentity {
                role,
                id: id.to_string(),
                fingerprint: fingerprint(der),
            });
        }
    }
    Err(Error::Certificate(
        "no tether:// identity in subjectAltName".into(),
    ))
}

/// Hex SHA-256 of a DER blob.
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// The CA pin printed for `worker join --ca-hash`: `sha256:<hex of the CA certificate's DER>`.
pub fn ca_hash(ca_der: &[u8]) -> String {
    format!("sha256:{}", fingerprint(ca_der))
}

/// Parses `sha256:<hex>` into the 32 raw bytes.
pub fn parse_ca_hash(s: &str) -> Result<[u8; 32], Error> {
    let hex_part = s
        .trim()
        .strip_prefix("sha256:")
        .ok_or_else(|| Error::CaHash(s.to_string()))?;
    let bytes = hex::decode(hex_part).map_err(|_| Error::CaHash(s.to_string()))?;
    bytes.try_into().map_err(|_| Error::CaHash(s.to_string()))
}

/// The crypto provider every Tether TLS endpoint uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses every certificate in a PEM text.
pub fn certs_from_pem(pem: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Pem {
            what: "certificate",
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(Error::Pem {
            what: "certificate",
            path: path.to_path_buf(),
            reason: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

/// Parses a private key in PEM.
pub fn key_from_pem(pem: &str, path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| Error::Pem {
        what: "private key",
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Reads a whole file as text.
pub fn read_text(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes a file atomically and durably with the given mode. Key files use 0600.
pub fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), Error> {
    crate::fsio::write_atomic(path, contents, mode, crate::fsio::Durability::Full).map_err(
        |source| Error::Write {
            path: path.to_path_buf(),
            source,
        },
    )
}

/// A certificate, its key and the CA that issued it: an identity directory holds `ca.pem`,
/// `cert.pem` and `key.pem`.
#[derive(Clone)]
pub struct IdentityFiles {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl IdentityFiles {
    pub const CA: &'static str = "ca.pem";
    pub const CERT: &'static str = "cert.pem";
    pub const KEY: &'static str = "key.pem";

    pub fn load(dir: &Path) -> Result<Self, Error> {
        Ok(Self {
            ca_pem: read_text(&dir.join(Self::CA))?,
            cert_pem: read_text(&dir.join(Self::CERT))?,
            key_pem: read_text(&dir.join(Self::KEY))?,
        })
    }

    /// Writes the three files into a 0700 directory; the key with mode 0600.
    pub fn save(&self, dir: &Path) -> Result<(), Error> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
            .map_err(|source| Error::Write {
                path: dir.to_path_buf(),
                source,
            })?;
        write_file(&dir.join(Self::CA), self.ca_pem.as_bytes(), 0o644)?;
        write_file(&dir.join(Self::KEY), self.key_pem.as_bytes(), 0o600)?;
        write_file(&dir.join(Self::CERT), self.cert_pem.as_bytes(), 0o600)
    }

    /// A client configuration for mutual TLS: trusts only this CA and presents this identity.
    pub fn client_config(&self, dir: &Path) -> Result<ClientConfig, Error> {
        let mut roots = RootCertStore::empty();
        for ca in certs_from_pem(&self.ca_pem, &dir.join(Self::CA))? {
            roots.add(ca)?;
        }
        let certs = certs_from_pem(&self.cert_pem, &dir.join(Self::CERT))?;
        let key = key_from_pem(&self.key_pem, &dir.join(Self::KEY))?;
        let mut cfg = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)?;
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Ok(cfg)
    }
}

/// A fresh key pair and a certificate signing request for it. The key never leaves the caller.
pub fn new_key_and_csr(common_name: &str) -> Result<(rcgen::KeyPair, Vec<u8>), Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    let csr = params.serialize_request(&key)?;
    Ok((key, csr.der().to_vec()))
}

/// What the pinning verifier saw, so `worker join` can say exactly why it refused the brain.
#[derive(Debug, Default, Clone)]
pub struct PinObservation {
    /// CA hashes the brain presented in its chain.
    pub presented: Vec<String>,
    /// The pinned CA certificate, once found.
    pub ca_der: Option<Vec<u8>>,
}

/// Server verifier for enrolment: the brain's chain must contain a CA certificate whose SHA-256
/// equals the pin, and the server certificate must verify against that CA (name, dates,
/// usage), like kubeadm's discovery hash.
#[derive(Debug)]
pub struct PinnedCaVerifier {
    pin: [u8; 32],
    provider: Arc<CryptoProvider>,
    seen: Arc<Mutex<PinObservation>>,
}

impl PinnedCaVerifier {
    pub fn new(pin: [u8; 32]) -> (Arc<Self>, Arc<Mutex<PinObservation>>) {
        let seen = Arc::new(Mutex::new(PinObservation::default()));
        let v = Arc::new(Self {
            pin,
            provider: provider(),
            seen: seen.clone(),
        });
        (v, seen)
    }

    /// A client configuration with no client certificate that trusts only the pinned CA.
    pub fn client_config(self: Arc<Self>) -> Result<ClientConfig, Error> {
        let mut cfg = ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(self)
            .with_no_client_auth();
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Ok(cfg)
    }
}

impl ServerCertVerifier for PinnedCaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut seen = self.seen.locked();
        seen.presented = intermediates.iter().map(|c| ca_hash(c)).collect();
        let Some(ca) = intermediates
            .iter()
            .find(|c| Sha256::digest(c.as_ref()).as_slice() == self.pin)
        else {
            return Err(rustls::Error::General(
                "CA hash mismatch: the brain's CA is not the one --ca-hash pins".into(),
            ));
        };
        seen.ca_der = Some(ca.to_vec());
        drop(seen);
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            self.provider.clone(),
        )
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
        inner.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_hash_round_trips() {
        let h = ca_hash(b"hello");
        assert_eq!(
            parse_ca_hash(&h).unwrap().to_vec(),
            Sha256::digest(b"hello").to_vec()
        );
        assert!(parse_ca_hash("sha256:abc").is_err());
        assert!(parse_ca_hash(&h.replace("sha256:", "md5:")).is_err());
    }

    #[test]
    fn identity_round_trips_through_a_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names.push(rcgen::SanType::URI(
            identity_uri(Role::Worker, "w-1234").try_into().unwrap(),
        ));
        let cert = params.self_signed(&key).unwrap();
        let id = peer_identity(cert.der()).unwrap();
        assert_eq!(id.role, Role::Worker);
        assert_eq!(id.id, "w-1234");
        assert_eq!(id.fingerprint, fingerprint(cert.der()));

        let plain = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        assert!(peer_identity(plain.der()).is_err());
    }
}
