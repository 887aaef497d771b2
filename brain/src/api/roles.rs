//! Who may call each gRPC method: one table ([`TABLE`]), enforced for every request from the
//! network by one tower layer ([`RoleLayer`]) in front of all services, as the web API's route
//! table is in front of its routes. A method missing from the table is refused, so a handler
//! added without an entry is closed, not open. The layer checks the client certificate (issued
//! by this brain's CA — rustls checked that —, naming the role, current and not revoked) and
//! hands the handler the caller's identity; handlers read it with `Services::caller` and its
//! siblings, which fail closed when the layer did not run. The web API's in-process calls
//! carry its caller and are checked against the same table (`web_may`): the web reaches only
//! the methods marked [`Access::Admin`].

use std::sync::Arc;
use std::task::{Context, Poll};

use shared::pki::{self, PeerIdentity, Role};
use tonic::Status;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::NO_CERT;

/// Whether a certificate's holder may still call (current, not revoked): the registry's
/// answer.
pub type PeerCheck = Arc<dyn Fn(&PeerIdentity) -> Result<(), Status> + Send + Sync>;

/// Who may call a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone who reaches the port: the request itself carries its credential (a join
    /// token), which the handler checks.
    Token,
    /// A worker's certificate.
    Worker,
    /// An admin's certificate, or the web API's caller (whose web role its route table
    /// checked).
    Admin,
    /// An admin's certificate only: identities, credentials, secrets, backups and commands
    /// on workers are never reached through the web API.
    AdminCert,
}

/// Every gRPC method the brain serves, by its path, and who may call it.
pub const TABLE: &[(&str, Access)] = &[
    ("/tether.v1.Enrollment/Enroll", Access::Token),
    ("/tether.v1.WorkerSession/Attach", Access::Worker),
    ("/tether.v1.WorkerSession/Pulse", Access::Worker),
    ("/tether.v1.Sync/MissingBlobs", Access::Worker),
    ("/tether.v1.Sync/PutBlobs", Access::Worker),
    ("/tether.v1.Sync/PutDelta", Access::Worker),
    ("/tether.v1.Sync/GetManifest", Access::Worker),
    ("/tether.v1.Sync/GetBlobs", Access::Worker),
    ("/tether.v1.Sync/Report", Access::Worker),
    ("/tether.v1.Egress/Tunnel", Access::Worker),
    ("/tether.v1.Admin/ListWorkers", Access::Admin),
    ("/tether.v1.Admin/RevokeWorker", Access::Admin),
    ("/tether.v1.Admin/CreateToken", Access::Admin),
    ("/tether.v1.Admin/IssueAdmin", Access::AdminCert),
    ("/tether.v1.Admin/RevokeAdmin", Access::AdminCert),
    ("/tether.v1.Admin/Exec", Access::AdminCert),
    ("/tether.v1.Admin/File", Access::AdminCert),
    ("/tether.v1.Admin/Echo", Access::AdminCert),
    ("/tether.v1.Admin/RunPlan", Access::Admin),
    ("/tether.v1.Admin/ListTasks", Access::Admin),
    ("/tether.v1.Admin/TaskLog", Access::Admin),
    ("/tether.v1.Admin/TaskPrompt", Access::Admin),
    ("/tether.v1.Admin/CancelTask", Access::Admin),
    ("/tether.v1.Admin/Backup", Access::AdminCert),
    ("/tether.v1.Admin/RunAgent", Access::Admin),
    ("/tether.v1.Admin/Decide", Access::Admin),
    ("/tether.v1.Admin/ResumeTask", Access::Admin),
    ("/tether.v1.Admin/MoveTask", Access::Admin),
    ("/tether.v1.Admin/TaskDiff", Access::Admin),
    ("/tether.v1.Admin/ExportTask", Access::Admin),
    ("/tether.v1.Admin/DeliverTask", Access::Admin),
    ("/tether.v1.Admin/Provision", Access::Admin),
    ("/tether.v1.Admin/ListMachines", Access::Admin),
    ("/tether.v1.Admin/ReleaseMachine", Access::Admin),
    ("/tether.v1.Admin/CreateApiToken", Access::AdminCert),
    ("/tether.v1.Admin/CreateWebLogin", Access::AdminCert),
    ("/tether.v1.Admin/ListApiTokens", Access::AdminCert),
    ("/tether.v1.Admin/RevokeApiToken", Access::AdminCert),
    ("/tether.v1.Admin/ReloadConfig", Access::AdminCert),
    ("/tether.v1.Admin/SetSecret", Access::AdminCert),
    ("/tether.v1.Admin/ListSecrets", Access::AdminCert),
    ("/tether.v1.Admin/RemoveSecret", Access::AdminCert),
];

/// Who may call the method at `path`; `None`: it is not in the table (refused).
pub fn access(path: &str) -> Option<Access> {
    TABLE.iter().find(|(p, _)| *p == path).map(|(_, a)| *a)
}

/// Whether the web API may make the admin call `method` (`Admin/ListTasks`) in process.
pub fn web_may(method: &str) -> Result<(), Status> {
    match access(&format!("/tether.v1.{method}")) {
        Some(Access::Admin) => Ok(()),
        _ => Err(Status::permission_denied(format!(
            "the web API may not call {method}: it needs an admin certificate"
        ))),
    }
}

/// Admits a request from the network to `path`, or says why not; the caller's identity when
/// the method needs a certificate.
fn admit(
    check: &PeerCheck,
    path: &str,
    ext: &http::Extensions,
) -> Result<Option<PeerIdentity>, Status> {
    let Some(access) = access(path) else {
        tracing::warn!(%path, "refused a call to a method that is not in the role table");
        return Err(Status::permission_denied(format!(
            "{path} is not in the brain's role table, so nobody may call it"
        )));
    };
    let role = match access {
        Access::Token => return Ok(None),
        Access::Worker => Role::Worker,
        Access::Admin | Access::AdminCert => Role::Admin,
    };
    let certs = ext
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|i| i.peer_certs())
        .ok_or_else(|| Status::unauthenticated(NO_CERT))?;
    let leaf = certs
        .first()
        .ok_or_else(|| Status::unauthenticated(NO_CERT))?;
    let peer = pki::peer_identity(leaf)
        .map_err(|e| Status::unauthenticated(format!("client certificate not usable here: {e}")))?;
    if peer.role != role {
        return Err(Status::permission_denied(format!(
            "{peer} may not make this call: it needs a {} certificate",
            match role {
                Role::Admin => "admin",
                Role::Worker => "worker",
            }
        )));
    }
    check(&peer)?;
    Ok(Some(peer))
}

/// The layer in front of every gRPC service: [`TABLE`] enforced on every request.
#[derive(Clone)]
pub struct RoleLayer(pub PeerCheck);

impl<S> tower::Layer<S> for RoleLayer {
    type Service = Guarded<S>;
    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded {
            inner,
            check: self.0.clone(),
        }
    }
}

/// A service behind the role table.
#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    check: PeerCheck,
}

impl<S, B> tower::Service<http::Request<B>> for Guarded<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        futures_util::future::Either<S::Future, std::future::Ready<Result<S::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(
        &mut self,
        mut req: http::Request<B>,
    ) -> <Self as tower::Service<http::Request<B>>>::Future {
        use futures_util::future::Either;
        match admit(&self.check, req.uri().path(), req.extensions()) {
            Ok(peer) => {
                if let Some(peer) = peer {
                    req.extensions_mut().insert(peer);
                }
                Either::Left(self.inner.call(req))
            }
            Err(status) => Either::Right(std::future::ready(Ok(status.into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rpc in the proto file, as `/package.Service/Method`.
    fn proto_methods() -> Vec<String> {
        let text = include_str!("../../../proto/proto/tether/v1/tether.proto");
        let mut service = "";
        let mut out = vec![];
        for line in text.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("service ") {
                service = rest.split_whitespace().next().unwrap_or_default();
            } else if let Some(rest) = line.strip_prefix("rpc ") {
                let name = rest.split('(').next().unwrap_or_default().trim();
                out.push(format!("/tether.v1.{service}/{name}"));
            }
        }
        out
    }

    #[test]
    fn the_table_names_every_method_the_proto_defines_and_nothing_else() {
        let methods = proto_methods();
        assert!(methods.len() > 30, "{methods:?}");
        for m in &methods {
            assert!(access(m).is_some(), "{m} has no entry in the role table");
        }
        for (p, _) in TABLE {
            assert!(methods.iter().any(|m| m == p), "{p} is not in the proto");
        }
    }

    /// The status a guarded call answered with (0: it reached the service).
    async fn answer(path: &str) -> i32 {
        use tower::{Layer, ServiceExt};
        let inner = tower::service_fn(|_req: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::empty()))
        });
        let ok: PeerCheck = Arc::new(|_| Ok(()));
        let svc = RoleLayer(ok).layer(inner);
        let req = http::Request::builder().uri(path).body(()).unwrap();
        let res = svc.oneshot(req).await.unwrap();
        res.headers()
            .get("grpc-status")
            .map_or(0, |v| v.to_str().unwrap().parse().unwrap())
    }

    #[tokio::test]
    async fn a_method_added_without_an_entry_is_refused_before_its_handler() {
        // As if `rpc Added` were in the proto and served, but not in the table.
        assert_eq!(
            answer("/tether.v1.Admin/Added").await,
            tonic::Code::PermissionDenied as i32
        );
        // A listed admin method without a certificate: unauthenticated, never reached.
        assert_eq!(
            answer("/tether.v1.Admin/ListTasks").await,
            tonic::Code::Unauthenticated as i32
        );
        // Enrolment carries its own credential: it reaches its handler.
        assert_eq!(answer("/tether.v1.Enrollment/Enroll").await, 0);
    }

    #[test]
    fn the_web_reaches_only_what_the_table_gives_it() {
        assert!(web_may("Admin/ListTasks").is_ok());
        for m in [
            "Admin/Backup",
            "Admin/SetSecret",
            "Admin/Exec",
            "Sync/GetBlobs",
        ] {
            let e = web_may(m).unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{m}");
        }
        assert!(web_may("Admin/NotAMethod").is_err());
    }
}
