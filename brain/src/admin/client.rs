//! The admin side: finding the brain and an admin identity, and dialling it with mutual TLS.
//! Used by the CLI, the benchmark and the tests.

use std::path::{Path, PathBuf};

use proto::admin_client::AdminClient;
use shared::pki::{self, IdentityFiles};
use shared::tls::{self, BrainAddr, DialOptions};
use tonic::transport::Channel;

use crate::trust::ca::DataDir;

/// Errors reaching the brain as an admin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no admin identity in {0}: run `brain init` there, or pass --identity DIR (made by `brain admin issue`)"
    )]
    NoIdentity(PathBuf),
    #[error(transparent)]
    Pki(#[from] pki::Error),
    #[error(transparent)]
    Tls(#[from] tls::Error),
}

impl shared::exit::Classify for Error {
    fn exit_code(&self) -> Option<shared::exit::ExitCode> {
        match self {
            Error::NoIdentity(_) => Some(shared::exit::ExitCode::Config),
            Error::Pki(e) => e.exit_code(),
            Error::Tls(e) => e.exit_code(),
        }
    }
}

/// Where to find the brain and who to be.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub identity_dir: PathBuf,
}

impl Target {
    /// `--brain` (or `TETHER_BRAIN`) if given; else the address `brain serve` wrote into the
    /// data dir; else the default `https://127.0.0.1:7443`. `--identity` if given; else the
    /// data dir's admin identity.
    pub fn resolve(data: &DataDir, brain: Option<String>, identity: Option<PathBuf>) -> Self {
        let url = brain.unwrap_or_else(|| {
            std::fs::read_to_string(data.addr_file())
                .ok()
                .and_then(|s| s.trim().parse::<std::net::SocketAddr>().ok())
                .map(|a| {
                    let ip = if a.ip().is_unspecified() {
                        "127.0.0.1".to_string()
                    } else {
                        a.ip().to_string()
                    };
                    BrainAddr {
                        host: ip,
                        port: a.port(),
                    }
                    .url()
                })
                .unwrap_or_else(|| "https://127.0.0.1:7443".into())
        });
        Self {
            url,
            identity_dir: identity.unwrap_or_else(|| data.admin_identity()),
        }
    }

    /// Makes one admin call on a fresh connection; a status from the brain comes back in
    /// words (what failed and what to do), ready for the terminal and the exit code.
    pub async fn rpc<T>(
        &self,
        call: impl AsyncFnOnce(AdminClient<Channel>) -> Result<tonic::Response<T>, tonic::Status>,
    ) -> anyhow::Result<T> {
        let c = self.connect().await?;
        Ok(call(c)
            .await
            .map_err(|s| status(s, &self.url))?
            .into_inner())
    }

    /// Dials the brain with this admin identity.
    pub async fn connect(&self) -> Result<AdminClient<Channel>, Error> {
        let channel = connect_channel(&self.url, &self.identity_dir).await?;
        Ok(AdminClient::new(channel)
            .max_decoding_message_size(shared::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(shared::limits::MAX_MESSAGE_BYTES))
    }
}

/// A mutual-TLS channel to `url` with the identity in `dir`.
pub async fn connect_channel(url: &str, dir: &Path) -> Result<Channel, Error> {
    if !dir.join(IdentityFiles::CERT).exists() {
        return Err(Error::NoIdentity(dir.to_path_buf()));
    }
    let ident = IdentityFiles::load(dir)?;
    let config = ident.client_config(dir)?;
    let addr = BrainAddr::parse(url)?;
    Ok(tls::dial(&addr, config, DialOptions::default()).await?)
}

/// A status from the brain in words for the person at the terminal.
pub fn status(s: tonic::Status, url: &str) -> anyhow::Error {
    anyhow::anyhow!(shared::tls::explain_status(&s, url))
}
