//! The egress CA: the certificate authority the brain's egress proxy signs a certificate
//! with for each host whose TLS it terminates (to put a secret into the request). Made on
//! first start as `egress-ca.pem` and `egress-ca.key` (0600) in the data dir; a separate CA
//! from the one that signs workers and admins, so trusting it grants nothing on the session.
//! Its certificate goes to workers, for commands' CA bundles; its key never leaves the brain.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use shared::locks::Lock;
use shared::pki;
use time::{Duration, OffsetDateTime};

use super::ca::Error;

/// How many hosts' server configs are kept.
const CACHE: usize = 256;

/// The loaded egress CA and the server configs made with it.
pub struct EgressCa {
    pub cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    configs: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl std::fmt::Debug for EgressCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EgressCa")
    }
}

impl EgressCa {
    /// Loads the egress CA from `dir`, making it first if it is not there.
    pub fn load_or_create(dir: &Path) -> Result<Self, Error> {
        let cert_path = dir.join("egress-ca.pem");
        let key_path = dir.join("egress-ca.key");
        if !cert_path.exists() {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(Vec::<String>::new())?;
            let tag: u32 = rand::random();
            params
                .distinguished_name
                .push(DnType::CommonName, format!("Tether egress CA {tag:08x}"));
            params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            let now = OffsetDateTime::now_utc();
            params.not_before = now - Duration::hours(1);
            params.not_after = now + Duration::days(3650);
            let cert = params.self_signed(&key)?;
            pki::write_file(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
            pki::write_file(&cert_path, cert.pem().as_bytes(), 0o644)?;
        }
        let cert_pem = pki::read_text(&cert_path)?;
        let key = KeyPair::from_pem(&pki::read_text(&key_path)?)?;
        let cert_der = pki::certs_from_pem(&cert_pem, &cert_path)?.remove(0);
        let issuer = Issuer::from_ca_cert_der(&cert_der, key)?;
        Ok(Self {
            cert_pem,
            cert_der,
            issuer,
            configs: Mutex::new(HashMap::new()),
        })
    }

    /// A TLS server config presenting a certificate for `host` (a name or an address),
    /// signed by this CA; made once per host and kept.
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, Error> {
        if let Some(c) = self.configs.locked().get(host) {
            return Ok(c.clone());
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.subject_alt_names = vec![match host.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                host.to_string()
                    .try_into()
                    .map_err(|_| Error::BadCsr(format!("{host:?} is not a DNS name")))?,
            ),
        }];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::hours(1);
        params.not_after = now + Duration::days(30);
        let cert = params.signed_by(&key, &self.issuer)?;
        let chain = vec![cert.der().clone(), self.cert_der.clone()];
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(pki::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::BadCsr(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| Error::BadCsr(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut cache = self.configs.locked();
        if cache.len() >= CACHE {
            cache.clear();
        }
        cache.insert(host.to_string(), config.clone());
        Ok(config)
    }
}
