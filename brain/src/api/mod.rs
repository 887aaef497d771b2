//! The brain's gRPC services, as thin adapters: enrolment (token-authenticated), the worker
//! session stream, the workers' bulk `Sync` service and the admin API (certificate-
//! authenticated). Each handler checks the caller, converts the request once
//! ([`convert`]), calls the component that owns the work, and converts the answer; every
//! internal error becomes a `tonic::Status` in one place ([`error`]).

mod admin;
pub mod convert;
mod credentials;
pub mod egress;
mod enroll;
mod error;
pub mod results;
mod secrets;
mod session;
pub mod sync;

use std::sync::Arc;
use std::time::Duration;

use shared::pki::{self, PeerIdentity, Role};
use tonic::{Request, Status};

use crate::engine::Engine;
use crate::fleet::hub::Hub;
use crate::fleet::placement::Placement;
use crate::mirror::Mirror;
use crate::provision::Machines;
use crate::trust::ca::Ca;
use crate::trust::registry::{Registry, WorkerRecord};

/// Session timing.
#[derive(Debug, Clone, Copy)]
pub struct SessionOptions {
    /// A worker that sends nothing for this long is marked lost.
    pub lost_after: Duration,
}

impl SessionOptions {
    pub fn heartbeat_interval(&self) -> Duration {
        (self.lost_after / 3).max(Duration::from_millis(100))
    }
}

/// What the services act on; built by the composition root.
pub struct Shared {
    pub registry: Registry,
    pub hub: Hub,
    pub engine: Engine,
    /// The whole store, for backups.
    pub db: sled::Db,
    pub ca: Ca,
    pub session: SessionOptions,
    pub placement: Placement,
    /// The brain's config file (agent defaults).
    pub config: Arc<crate::config::Config>,
    /// Blobs and manifests of every task's workspace.
    pub mirror: Mirror,
    /// Machines this brain created.
    pub machines: Machines,
    /// The HTTP API's tokens and sessions.
    pub web: crate::trust::web::WebAuth,
    /// Where the web page is (for `brain web login` links), if it is served.
    pub web_url: Option<String>,
    /// The secrets, the egress CA and the upstream side of the egress proxy.
    pub egress: egress::EgressParts,
}

/// The services, cheap to clone.
#[derive(Clone)]
pub struct Services(pub Arc<Shared>);

const NO_CERT: &str = "no client certificate: this call needs a certificate issued by this brain (workers: run `worker join`; admins: use the data dir's admin identity or --identity DIR)";
/// How long an admin's file call may take.
const FILE_TIMEOUT: Duration = Duration::from_secs(60);

impl Services {
    /// Checks the caller: a certificate issued by our CA (rustls did that), naming `role`,
    /// current and not revoked; or, for an admin call made in process by the web API, the
    /// web caller it checked (whose role the web API's route table enforced).
    pub(crate) fn authorize<T>(
        &self,
        req: &Request<T>,
        role: Role,
    ) -> Result<PeerIdentity, Status> {
        if let Some(c) = req.extensions().get::<crate::trust::web::Caller>() {
            if role != Role::Admin {
                return Err(Status::permission_denied(
                    "web callers make admin calls only",
                ));
            }
            return Ok(PeerIdentity {
                role: Role::Admin,
                id: c.to_string(),
                fingerprint: String::new(),
            });
        }
        self.authorize_cert(req, role)
    }

    /// [`Services::authorize`] by certificate only: for calls the web API never makes
    /// (identities, credentials, backups, commands on workers).
    pub(crate) fn authorize_cert<T>(
        &self,
        req: &Request<T>,
        role: Role,
    ) -> Result<PeerIdentity, Status> {
        let certs = req
            .peer_certs()
            .ok_or_else(|| Status::unauthenticated(NO_CERT))?;
        let leaf = certs
            .first()
            .ok_or_else(|| Status::unauthenticated(NO_CERT))?;
        let peer = pki::peer_identity(leaf).map_err(|e| {
            Status::unauthenticated(format!("client certificate not usable here: {e}"))
        })?;
        if peer.role != role {
            return Err(Status::permission_denied(format!(
                "{peer} may not make this call: it needs a {} certificate",
                match role {
                    Role::Admin => "admin",
                    Role::Worker => "worker",
                }
            )));
        }
        match self.0.registry.check_peer(&peer)? {
            Ok(()) => Ok(peer),
            Err(reason) => Err(Status::permission_denied(reason)),
        }
    }

    fn resolve(&self, worker: &str) -> Result<WorkerRecord, Status> {
        Ok(self.0.registry.resolve_worker(worker)?)
    }
}

/// A worker or admin name: 1-64 characters of `[A-Za-z0-9._-]`.
fn check_name(name: &str) -> Result<(), Status> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "invalid name {name:?}: use 1-64 characters of [A-Za-z0-9._-]"
        )))
    }
}
