//! The brain's certificate authority and its data-dir layout: creating the CA, the server
//! certificate and the first admin identity (`brain init`), and signing the certificate
//! requests of workers and admins. Only the brain ever holds the CA key.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::CertificateSigningRequestDer;
use shared::pki::{self, IdentityFiles, Role};
use time::{Duration, OffsetDateTime};

/// Errors creating or using the CA.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "a CA already exists in {0}: refusing to overwrite it (every enrolled worker would be cut off); pass --force to replace it"
    )]
    Exists(PathBuf),
    #[error("no CA in {0}: run `brain init --data {0}` first")]
    Missing(PathBuf),
    #[error(transparent)]
    Pki(#[from] pki::Error),
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("invalid certificate request: {0}")]
    BadCsr(String),
    #[error("cannot create {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl shared::exit::Classify for Error {
    fn exit_code(&self) -> Option<shared::exit::ExitCode> {
        match self {
            Error::Missing(_) => Some(shared::exit::ExitCode::Config),
            Error::Pki(e) => e.exit_code(),
            Error::Exists(_) | Error::Rcgen(_) | Error::BadCsr(_) | Error::Io { .. } => None,
        }
    }
}

/// Files in the brain's data dir.
#[derive(Debug, Clone)]
pub struct DataDir(pub PathBuf);

impl DataDir {
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn ca_cert(&self) -> PathBuf {
        self.0.join("ca.pem")
    }
    pub fn ca_key(&self) -> PathBuf {
        self.0.join("ca.key")
    }
    /// The server certificate chain: the server certificate, then the CA.
    pub fn server_cert(&self) -> PathBuf {
        self.0.join("server.pem")
    }
    pub fn server_key(&self) -> PathBuf {
        self.0.join("server.key")
    }
    /// The admin identity `brain init` creates, used by admin commands on this machine.
    pub fn admin_identity(&self) -> PathBuf {
        self.0.join("admin")
    }
    pub fn db(&self) -> PathBuf {
        self.0.join("db")
    }
    /// Written by `brain serve`: the address it listens on, for admin commands to find it.
    pub fn addr_file(&self) -> PathBuf {
        self.0.join("brain.addr")
    }
}

/// Name of the admin identity `brain init` creates.
pub const INIT_ADMIN: &str = "admin";

const CA_DAYS: i64 = 3650;
const SERVER_DAYS: i64 = 825;
const CLIENT_DAYS: i64 = 365;
/// Certificates start one hour in the past so a peer whose clock is slightly behind accepts them.
const BACKDATE: Duration = Duration::hours(1);

fn validity(params: &mut CertificateParams, days: i64) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + Duration::days(days);
}

/// The loaded CA: certificate and signing key.
pub struct Ca {
    pub cert_pem: String,
    pub cert_der: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    /// Creates a new self-signed CA.
    pub fn generate() -> Result<Self, Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let tag: u32 = rand::random();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("Tether CA {tag:08x}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        validity(&mut params, CA_DAYS);
        let cert = params.self_signed(&key)?;
        let cert_pem = cert.pem();
        let cert_der = cert.der().to_vec();
        Ok(Self {
            cert_pem,
            cert_der,
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads the CA from the data dir.
    pub fn load(dir: &DataDir) -> Result<Self, Error> {
        if !dir.ca_cert().exists() {
            return Err(Error::Missing(dir.path().to_path_buf()));
        }
        let cert_pem = pki::read_text(&dir.ca_cert())?;
        let key_pem = zeroize::Zeroizing::new(pki::read_text(&dir.ca_key())?);
        Self::from_pems(cert_pem, &key_pem, &dir.ca_cert())
    }

    /// The CA from its certificate and key (PEM); `from` names where they came from.
    pub fn from_pems(cert_pem: String, key_pem: &str, from: &Path) -> Result<Self, Error> {
        let key = KeyPair::from_pem(key_pem)?;
        let cert_der = pki::certs_from_pem(&cert_pem, from)?.remove(0).to_vec();
        let issuer = Issuer::from_ca_cert_der(&cert_der.clone().into(), key)?;
        Ok(Self {
            cert_pem,
            cert_der,
            issuer,
        })
    }

    /// The signing key (PEM).
    pub fn key_pem(&self) -> zeroize::Zeroizing<String> {
        zeroize::Zeroizing::new(self.issuer.key().serialize_pem())
    }

    /// `sha256:<hex>` of the CA certificate, for `worker join --ca-hash`.
    pub fn hash(&self) -> String {
        pki::ca_hash(&self.cert_der)
    }

    /// Issues the server certificate for the given host names and addresses. Returns the chain
    /// (server certificate then CA, so enrolling workers can pin the CA) and the key.
    pub fn issue_server(&self, hosts: &[String]) -> Result<(String, String), Error> {
        let key = KeyPair::generate()?;
        let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
        for h in hosts {
            if !names.contains(h) {
                names.push(h.clone());
            }
        }
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "tether brain");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, SERVER_DAYS);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((
            format!("{}{}", cert.pem(), self.cert_pem),
            key.serialize_pem(),
        ))
    }

    /// Signs a client certificate request. The identity (role and id) and the usage are set
    /// here; whatever names the request asked for are ignored.
    pub fn sign_client(&self, csr_der: &[u8], role: Role, id: &str) -> Result<String, Error> {
        if csr_der.is_empty() || csr_der.len() > 16 * 1024 {
            return Err(Error::BadCsr(format!(
                "expected a DER request of 1..16384 bytes, got {}",
                csr_der.len()
            )));
        }
        let csr =
            CertificateSigningRequestParams::from_der(&CertificateSigningRequestDer::from(csr_der))
                .map_err(|e| Error::BadCsr(e.to_string()))?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(
            DnType::CommonName,
            format!("tether {role:?} {id}").to_lowercase(),
        );
        params.subject_alt_names = vec![SanType::URI(
            pki::identity_uri(role, id)
                .try_into()
                .map_err(|_| Error::BadCsr(format!("identity {id:?} is not a valid URI part")))?,
        )];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, CLIENT_DAYS);
        Ok(params.signed_by(&csr.public_key, &self.issuer)?.pem())
    }
}

/// What `brain init` made.
pub struct InitOutcome {
    pub ca_hash: String,
    pub admin_fingerprint: String,
}

/// Creates the CA, the server certificate and the first admin identity in `dir`.
pub fn init(dir: &DataDir, hosts: &[String], force: bool) -> Result<InitOutcome, Error> {
    if dir.ca_cert().exists() && !force {
        return Err(Error::Exists(dir.path().to_path_buf()));
    }
    std::fs::create_dir_all(dir.path()).map_err(|source| Error::Io {
        path: dir.path().to_path_buf(),
        source,
    })?;
    set_mode(dir.path(), 0o700)?;
    let ca = Ca::generate()?;
    let (server_chain, server_key) = ca.issue_server(hosts)?;
    let (admin_key, admin_csr) = pki::new_key_and_csr(INIT_ADMIN)?;
    let admin_cert = ca.sign_client(&admin_csr, Role::Admin, INIT_ADMIN)?;
    let admin_der = pki::certs_from_pem(&admin_cert, &dir.admin_identity())?.remove(0);

    pki::write_file(
        &dir.ca_key(),
        ca.issuer.key().serialize_pem().as_bytes(),
        0o600,
    )?;
    pki::write_file(&dir.ca_cert(), ca.cert_pem.as_bytes(), 0o644)?;
    pki::write_file(&dir.server_key(), server_key.as_bytes(), 0o600)?;
    pki::write_file(&dir.server_cert(), server_chain.as_bytes(), 0o644)?;
    IdentityFiles {
        ca_pem: ca.cert_pem.clone(),
        cert_pem: admin_cert,
        key_pem: admin_key.serialize_pem(),
    }
    .save(&dir.admin_identity())?;
    Ok(InitOutcome {
        ca_hash: ca.hash(),
        admin_fingerprint: pki::fingerprint(&admin_der),
    })
}

fn set_mode(path: &Path, mode: u32) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|source| {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_writes_private_keys_0600_and_refuses_to_overwrite() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir(tmp.path().join("data"));
        let out = init(&dir, &["brain.example".into()], false).unwrap();
        for key in [
            dir.ca_key(),
            dir.server_key(),
            dir.admin_identity().join("key.pem"),
        ] {
            let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", key.display());
        }
        let err = init(&dir, &[], false).err().expect("second init must fail");
        assert!(matches!(err, Error::Exists(_)), "{err}");
        let ca = Ca::load(&dir).unwrap();
        assert_eq!(ca.hash(), out.ca_hash);
        let again = init(&dir, &[], true).unwrap();
        assert_ne!(again.ca_hash, out.ca_hash);
    }

    #[test]
    fn signed_identity_ignores_what_the_request_asked_for() {
        let ca = Ca::generate().unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["evil.example".to_string()]).unwrap();
        params.subject_alt_names.push(SanType::URI(
            pki::identity_uri(Role::Admin, "root").try_into().unwrap(),
        ));
        let csr = params.serialize_request(&key).unwrap();
        let pem = ca.sign_client(csr.der(), Role::Worker, "w-1").unwrap();
        let der = pki::certs_from_pem(&pem, Path::new("x")).unwrap().remove(0);
        let id = pki::peer_identity(&der).unwrap();
        assert_eq!((id.role, id.id.as_str()), (Role::Worker, "w-1"));
        assert!(ca.sign_client(b"garbage", Role::Worker, "w-2").is_err());
    }
}
