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
pub mod reload;
pub mod results;
pub mod roles;
mod secrets;
mod session;
pub mod sync;

use std::sync::Arc;
use std::time::Duration;

use shared::pki::{PeerIdentity, Role};
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
    /// The sled store, when the brain keeps its state there (not on a shared store).
    pub db: Option<sled::Db>,
    pub ca: Ca,
    pub session: SessionOptions,
    pub placement: Placement,
    /// The brain's config file (agent defaults), replaced whole by `brain config reload`.
    pub config: shared::locks::Live<crate::config::Config>,
    /// Where the config file is (it may not exist: the defaults).
    pub config_path: std::path::PathBuf,
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
    /// The admin calling: the identity the role layer ([`roles`]) established from its
    /// certificate, or the web API's caller for an in-process call (whose web role its route
    /// table, and [`roles::web_may`], checked). Fails closed when neither is there.
    pub(crate) fn caller<T>(&self, req: &Request<T>) -> Result<PeerIdentity, Status> {
        if let Some(c) = req.extensions().get::<crate::trust::web::Caller>() {
            return Ok(PeerIdentity {
                role: Role::Admin,
                id: c.to_string(),
                fingerprint: String::new(),
            });
        }
        self.cert_caller(req)
    }

    /// [`Services::caller`] by certificate only: for the calls the web API never makes.
    pub(crate) fn cert_caller<T>(&self, req: &Request<T>) -> Result<PeerIdentity, Status> {
        Self::by_cert(req, Role::Admin)
    }

    /// The worker calling, by the identity the role layer established.
    pub(crate) fn worker_caller<T>(&self, req: &Request<T>) -> Result<PeerIdentity, Status> {
        Self::by_cert(req, Role::Worker)
    }

    fn by_cert<T>(req: &Request<T>, role: Role) -> Result<PeerIdentity, Status> {
        match req.extensions().get::<PeerIdentity>() {
            Some(p) if p.role == role => Ok(p.clone()),
            Some(p) => Err(Status::permission_denied(format!(
                "{p} may not make this call"
            ))),
            None => Err(Status::unauthenticated(NO_CERT)),
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
