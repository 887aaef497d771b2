//! `brain serve`: opens the store, loads the PKI and runs the gRPC server until shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use shared::limits;
use shared::pki::{self, IdentityFiles};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::api::{Services, SessionOptions, Shared};
use crate::engine::log::SledLog;
use crate::engine::manager::{self, Manager, Options as TaskOptions};
use crate::fleet::hub::Hub;
use crate::trust::ca::{self, Ca, DataDir};
use crate::trust::registry::{self, Registry};

/// Errors starting or running the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Ca(#[from] ca::Error),
    #[error(transparent)]
    Registry(#[from] registry::Error),
    #[error(transparent)]
    Pki(#[from] pki::Error),
    #[error("cannot listen on {addr}: {source} (is another process using this port?)")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS set-up: {0}")]
    Tls(String),
    #[error("server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error(transparent)]
    Log(#[from] crate::engine::log::Error),
    #[error(transparent)]
    Tasks(#[from] manager::Error),
    #[error(transparent)]
    Mirror(#[from] crate::mirror::Error),
    #[error(transparent)]
    Provision(#[from] crate::provision::Error),
    #[error("config: {0}")]
    Config(String),
}

impl shared::exit::Classify for Error {
    fn exit_code(&self) -> Option<shared::exit::ExitCode> {
        match self {
            Error::Ca(e) => e.exit_code(),
            Error::Pki(e) => e.exit_code(),
            // The server certificate and key do not make a TLS identity; a config section
            // the server cannot use.
            Error::Tls(_) | Error::Config(_) => Some(shared::exit::ExitCode::Config),
            // A port in use, a store that cannot be opened or locked: not configuration.
            _ => None,
        }
    }
}

/// How often the mirror is garbage collected, and how old what it removes must be.
const GC_EVERY: Duration = Duration::from_secs(600);
const GC_GRACE: Duration = Duration::from_secs(3600);

/// What `brain serve` needs.
#[derive(Debug, Clone)]
pub struct Options {
    pub data: DataDir,
    pub listen: SocketAddr,
    pub lost_after: Duration,
    pub tasks: TaskOptions,
    /// Confinement a worker must have before a task is placed on it.
    pub require_sandbox: Vec<String>,
    /// The config file's contents (its LLM part is also in `tasks.llm`).
    pub config: Arc<crate::config::Config>,
}

/// A brain that is bound and ready; [`Ready::run`] serves until `shutdown` resolves.
pub struct Ready {
    pub addr: SocketAddr,
    pub shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    tls: ServerTlsConfig,
}

/// Opens everything and binds the port, so errors surface before anything is announced.
pub async fn prepare(opts: Options) -> Result<Ready, Error> {
    let ca = Ca::load(&opts.data)?;
    let db = registry::open_db(&opts.data.db())?;
    let registry = Registry::from_db(db.clone())?;
    sync_init_admin(&opts.data, &registry, &ca.hash()).await?;
    let log = SledLog::open(db.clone(), opts.data.db())?;
    let mirror = crate::mirror::Mirror::open(&db, &opts.data.path().join("blobs"))?;
    // Call ids start above the previous run's, even if the clock went back.
    let meta = db.open_tree("meta").map_err(registry::Error::from)?;
    let floor = meta
        .get("call_start")
        .map_err(registry::Error::from)?
        .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok().map(u64::from_be_bytes))
        .unwrap_or(0);
    let hub = Hub::with_call_floor(floor);
    meta.insert("call_start", &hub.call_start().to_be_bytes())
        .map_err(registry::Error::from)?;
    db.flush_async().await.map_err(registry::Error::from)?;
    let policy = crate::api::Policy {
        limits: opts.tasks.limits,
        require_sandbox: opts.require_sandbox.clone(),
    };
    let tasks = Manager::new(std::sync::Arc::new(log), hub.clone(), opts.tasks.clone());
    let (loaded, resumed) = tasks.resume_all().await?;
    if loaded > 0 {
        tracing::info!(loaded, resumed, "tasks loaded from the log");
    }

    let chain = pki::read_text(&opts.data.server_cert())?;
    let key = pki::read_text(&opts.data.server_key())?;
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(chain, key))
        .client_ca_root(Certificate::from_pem(&ca.cert_pem))
        .client_auth_optional(true)
        .timeout(Duration::from_secs(10));

    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|source| Error::Bind {
            addr: opts.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| Error::Bind {
        addr: opts.listen,
        source,
    })?;
    pki::write_file(
        &opts.data.addr_file(),
        format!("{addr}\n").as_bytes(),
        0o644,
    )?;
    {
        // Failover goes to a connected worker the policy allows, other than the lost one.
        let (registry, hub, policy) = (registry.clone(), hub.clone(), policy.clone());
        tasks.set_placer(Arc::new(
            move |lost: &str, labels: &crate::engine::manager::Labels| {
                let workers = registry.workers().ok()?;
                workers
                    .into_iter()
                    .filter(|w| w.id != lost && !w.revoked && hub.session(&w.id).is_some())
                    .filter(|w| labels.iter().all(|(k, v)| w.labels.get(k) == Some(v)))
                    .find(|w| policy.refuse(w).is_none())
                    .map(|w| w.id)
            },
        ));
    }
    {
        // Blobs and manifests nothing refers to any more are collected now and then: what
        // every task's log names (its starting workspace and last barrier) is kept.
        let (mirror, tasks) = (mirror.clone(), tasks.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(GC_EVERY);
            loop {
                every.tick().await;
                let keep: std::collections::HashSet<String> = tasks
                    .list()
                    .into_iter()
                    .flat_map(|t| [t.barrier_root, t.seed_root])
                    .filter(|r| !r.is_empty())
                    .collect();
                let m = mirror.clone();
                match tokio::task::spawn_blocking(move || m.gc(&keep, GC_GRACE)).await {
                    Ok(Ok(c)) if c.blobs + c.manifests > 0 => {
                        tracing::info!(
                            blobs = c.blobs,
                            bytes = c.bytes,
                            manifests = c.manifests,
                            "mirror garbage collected"
                        );
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "mirror garbage collection failed"),
                    Err(e) => tracing::warn!(error = %e, "mirror garbage collection failed"),
                }
            }
        });
    }
    let machines = {
        let cfg = &opts.config.provision;
        let policy = cfg.policy().map_err(Error::Config)?;
        let url = cfg.brain_url.clone().unwrap_or_else(|| {
            let host = if addr.ip().is_unspecified() {
                "127.0.0.1".to_string()
            } else {
                addr.ip().to_string()
            };
            format!(
                "https://{}",
                SocketAddr::new(host.parse().expect("an ip"), addr.port())
            )
        });
        // This brain's name on hosts: from its CA, so it is stable and unique per brain.
        let tag: String = ca
            .hash()
            .trim_start_matches("sha256:")
            .chars()
            .take(16)
            .collect();
        let providers: Vec<Arc<dyn crate::provision::Provisioner>> = vec![
            Arc::new(crate::provision::local::Local::new(
                opts.data.path().join("machines"),
                &cfg.local,
            )),
            Arc::new(crate::provision::ssh::Ssh::new(
                &cfg.ssh,
                &tag,
                opts.data.path(),
            )),
            Arc::new(crate::provision::docker::DockerProvider::new(
                &cfg.docker,
                &tag,
            )),
            Arc::new(crate::provision::ec2::Ec2Provider::new(&cfg.ec2, &tag)),
        ];
        let tasks = tasks.clone();
        crate::provision::Machines::new(
            db.clone(),
            registry.clone(),
            hub.clone(),
            crate::provision::BrainInfo {
                url,
                ca_hash: ca.hash(),
            },
            policy,
            providers,
            Box::new(move |worker: &str| {
                // A task stopped for budget holds nothing there: its workspace is mirrored.
                tasks.list().iter().any(|t| {
                    !t.status.is_terminal()
                        && t.status != crate::model::state::Status::BudgetExhausted
                        && t.worker.as_deref() == Some(worker)
                })
            }),
        )?
    };
    {
        let policy = policy.clone();
        machines.set_eligible(Box::new(move |w| policy.refuse(w).is_none()));
    }
    tasks.set_environments(Arc::new(machines.clone()));
    machines.spawn_reaper();
    let shared = Arc::new(Shared {
        registry,
        hub,
        tasks,
        db,
        ca,
        session: SessionOptions {
            lost_after: opts.lost_after,
        },
        policy,
        config: opts.config.clone(),
        mirror,
        machines,
    });
    Ok(Ready {
        addr,
        shared,
        listener,
        tls,
    })
}

impl Ready {
    /// Serves until `shutdown` resolves, then closes worker sessions and stops.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let services = Services(self.shared.clone());
        let incoming = TcpIncoming::from(self.listener).with_nodelay(Some(true));
        let hub = self.shared.hub.clone();
        let result = Server::builder()
            .tls_config(self.tls)
            .map_err(|e| Error::Tls(e.to_string()))?
            .http2_keepalive_interval(Some(Duration::from_secs(10)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .add_service(proto::enrollment_server::EnrollmentServer::new(
                services.clone(),
            ))
            .add_service(
                proto::worker_session_server::WorkerSessionServer::new(services.clone())
                    .max_decoding_message_size(limits::MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(limits::MAX_MESSAGE_BYTES),
            )
            .add_service(
                proto::sync_server::SyncServer::new(services.clone())
                    .max_decoding_message_size(limits::MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(limits::MAX_MESSAGE_BYTES),
            )
            .add_service(
                proto::admin_server::AdminServer::new(services)
                    .max_decoding_message_size(limits::MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(limits::MAX_MESSAGE_BYTES),
            )
            .serve_with_incoming_shutdown(incoming, async move {
                shutdown.await;
                hub.close_all();
            })
            .await;
        self.shared.registry_flush().await;
        result.map_err(Error::from)
    }
}

impl Shared {
    async fn registry_flush(&self) {
        if let Err(e) = self.registry.flush_now().await {
            tracing::error!(error = %e, "final flush of the store failed");
        }
    }
}

/// Makes sure the admin identity `brain init` wrote is known to the store: added on first
/// start and replaced after `brain init --force` made a new CA. On the same CA the store
/// wins, so a revocation or a re-issue through `brain admin` is never undone by a restart.
async fn sync_init_admin(data: &DataDir, registry: &Registry, ca_hash: &str) -> Result<(), Error> {
    let dir = data.admin_identity();
    if !dir.join(IdentityFiles::CERT).exists() {
        return Ok(());
    }
    let pem = pki::read_text(&dir.join(IdentityFiles::CERT))?;
    let der = pki::certs_from_pem(&pem, &dir.join(IdentityFiles::CERT))?.remove(0);
    let fp = pki::fingerprint(&der);
    match registry.admin(ca::INIT_ADMIN)? {
        Some(rec) if rec.fingerprint == fp || rec.ca_hash == ca_hash => Ok(()),
        _ => Ok(registry
            .add_admin(ca::INIT_ADMIN, &fp, ca_hash, true)
            .await?),
    }
}
