//! The composition root: `brain serve` builds every component in dependency order (each
//! gets what it needs when it is made: nothing is wired by late setters), resumes the tasks
//! once everything they may need is there, and serves until shutdown. It owns the root
//! cancellation token and the task tracker: at shutdown the server stops taking calls,
//! worker sessions are closed, every tracked task is stopped and waited for (bounded), and
//! the store is flushed.

pub mod copy;
mod ports;
mod replicas;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use shared::limits;
use shared::pki::{self, IdentityFiles};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::api::{Services, SessionOptions, Shared};
use crate::engine::log::SledLog;
use crate::engine::ports::Ports;
use crate::engine::{Engine, Store};
use crate::fleet::hub::{Hub, HubEvents};
use crate::fleet::placement::{Placement, Policy};
use crate::mirror::Mirror;
use crate::model::ids::CallIds;
use crate::provision::{self, Machines, Provisioner};
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
    Tasks(#[from] crate::engine::Error),
    #[error(transparent)]
    Mirror(#[from] crate::mirror::Error),
    #[error(transparent)]
    Provision(#[from] crate::provision::Error),
    #[error("config: {0}")]
    Config(String),
    #[error(transparent)]
    Web(#[from] crate::web::Error),
    #[error(transparent)]
    Secrets(#[from] crate::trust::secrets::Error),
    #[error(transparent)]
    Store(#[from] crate::storage::postgres::Error),
    #[error(transparent)]
    SharedCa(#[from] crate::trust::shared_ca::SharedCaError),
    #[error(transparent)]
    Replicas(#[from] replicas::ProtocolError),
}

impl shared::exit::Classify for Error {
    fn exit_code(&self) -> Option<shared::exit::ExitCode> {
        match self {
            Error::Ca(e) => e.exit_code(),
            Error::Pki(e) => e.exit_code(),
            // The server certificate and key do not make a TLS identity; a config section
            // the server cannot use.
            Error::Tls(_) | Error::Config(_) => Some(shared::exit::ExitCode::Config),
            Error::Secrets(e) => e.exit_code(),
            Error::Web(crate::web::Error::NotLoopback(_) | crate::web::Error::Config(_)) => {
                Some(shared::exit::ExitCode::Config)
            }
            // Running again will not fix it: one side must be upgraded.
            Error::Replicas(
                replicas::ProtocolError::PeerTooOld { .. }
                | replicas::ProtocolError::ThisTooOld { .. },
            ) => Some(shared::exit::ExitCode::Config),
            // A port in use, a store that cannot be opened or locked: not configuration.
            _ => None,
        }
    }
}

/// How often the mirror is garbage collected, and how old what it removes must be.
const GC_EVERY: Duration = Duration::from_secs(600);
const GC_GRACE: Duration = Duration::from_secs(3600);
/// How long shutdown waits for the tracked tasks to stop.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// What `brain serve` needs.
#[derive(Debug, Clone)]
pub struct Options {
    pub data: DataDir,
    pub listen: SocketAddr,
    pub lost_after: Duration,
    pub tasks: crate::engine::Options,
    /// Confinement a worker must have before a task is placed on it.
    pub require_sandbox: Vec<String>,
    /// The config file's contents (its LLM part is also in `tasks.llm`).
    pub config: Arc<crate::config::Config>,
    /// Where the config file is (read again by `brain config reload` and SIGHUP).
    pub config_path: std::path::PathBuf,
    /// Where the HTTP API and the web page listen (loopback only), if anywhere.
    pub web_listen: Option<SocketAddr>,
    /// A PostgreSQL store shared with other replicas, instead of sled in the data dir.
    pub store: Option<SharedStore>,
}

/// A store on PostgreSQL, as one replica of several.
#[derive(Debug, Clone)]
pub struct SharedStore {
    pub url: String,
    /// The name this replica holds task leases under: unique among the replicas running
    /// at once, and the same when one restarts (it then takes its own leases back).
    pub replica: String,
    /// How long a task's lease lasts unless renewed.
    pub lease_ttl: Duration,
}

/// What the brain keeps its state in.
struct Opened {
    kv: crate::storage::kv::Store,
    log: Arc<dyn crate::engine::log::EventLog>,
    mirror: Mirror,
    /// The sled database, when the store is sled (backups read it).
    sled: Option<sled::Db>,
    /// The PostgreSQL store, when shared.
    postgres: Option<crate::storage::postgres::Db>,
    secrets: crate::trust::secrets::Secrets,
    ca: Ca,
}

/// The store, the secrets in it and the CA (the data dir's, or on a shared store the
/// store's).
async fn open_store(opts: &Options) -> Result<Opened, Error> {
    let (kv, log, mirror, sled, postgres) = open_backend(opts).await?;
    let secrets =
        crate::trust::secrets::Secrets::in_store(&kv, &opts.data.path().join("secrets.key"))
            .await?;
    let ca = match &postgres {
        None => Ca::load(&opts.data)?,
        Some(db) => {
            crate::trust::shared_ca::in_store(&kv, &secrets, &opts.data, db.replica()).await?
        }
    };
    Ok(Opened {
        kv,
        log,
        mirror,
        sled,
        postgres,
        secrets,
        ca,
    })
}

type Backend = (
    crate::storage::kv::Store,
    Arc<dyn crate::engine::log::EventLog>,
    Mirror,
    Option<sled::Db>,
    Option<crate::storage::postgres::Db>,
);

async fn open_backend(opts: &Options) -> Result<Backend, Error> {
    match &opts.store {
        None => {
            let db = crate::storage::open_db(&opts.data.db()).map_err(registry::Error::from)?;
            Ok((
                crate::storage::kv::Store::Sled(db.clone()),
                Arc::new(SledLog::open(db.clone(), opts.data.db())?),
                Mirror::open(&db, &opts.data.path().join("blobs"))?,
                Some(db),
                None,
            ))
        }
        Some(s) => {
            let db = crate::storage::postgres::Db::open(&s.url, &s.replica).await?;
            replicas::join(&db).await?;
            tracing::info!(replica = %s.replica, "the store is PostgreSQL, shared by the replicas on it");
            Ok((
                crate::storage::kv::Store::Postgres(db.clone()),
                Arc::new(crate::engine::log::postgres::PgLog::open(
                    db.clone(),
                    crate::engine::log::postgres::Timing {
                        lease_ttl: s.lease_ttl,
                        ..Default::default()
                    },
                )),
                Mirror::shared(&db)?,
                None,
                Some(db),
            ))
        }
    }
}

/// A brain that is bound and running its tasks; [`Ready::run`] serves until `shutdown`.
pub struct Ready {
    pub addr: SocketAddr,
    pub shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    web: Option<(tokio::net::TcpListener, crate::web::Options)>,
    tls: ServerTlsConfig,
    root: CancellationToken,
    tracker: TaskTracker,
}

/// Opens everything, binds the port and resumes the tasks, so errors surface before
/// anything is announced.
pub async fn prepare(opts: Options) -> Result<Ready, Error> {
    let root = CancellationToken::new();
    let tracker = TaskTracker::new();

    // Storage and trust.
    let Opened {
        kv,
        log,
        mirror,
        sled,
        postgres,
        secrets,
        ca,
    } = open_store(&opts).await?;
    let registry = Registry::from_store(kv.clone()).await?;
    sync_init_admin(&opts.data, &registry, &ca.hash()).await?;
    let call_ids = call_ids(&kv).await?;
    let egress_ca = crate::trust::egress_ca::EgressCa::load_or_create(opts.data.path())?;
    let upstream = crate::egress::Upstream::new(
        &opts.config.egress.upstream_ca,
        opts.config.egress.resolve.clone(),
    )
    .map_err(|e| Error::Config(e.to_string()))?;

    // The port, before anything that needs to know the address.
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
    let tls = tls_config(&opts.data, &ca)?;
    let web = match opts.web_listen {
        Some(a) => {
            let web_opts = crate::web::Options::from_config(&opts.config.web)
                .map_err(crate::web::Error::Config)?;
            Some((crate::web::bind(a).await?, web_opts))
        }
        None => None,
    };
    let web_addr = web.as_ref().and_then(|(l, _)| l.local_addr().ok());

    // The fleet.
    let board = crate::fleet::board::Board::new(placement_options(&opts.config.placement)?);
    let (hub, hub_events) = Hub::with_board(call_ids.clone(), board);
    let policy = Policy {
        limits: opts.tasks.limits,
        require_sandbox: opts.require_sandbox.clone(),
    };
    let placement = Placement::new(registry.clone(), hub.clone(), policy);

    // The tasks' store (loaded by `resume_all`, below), then the machines, which ask it
    // whether a worker is in use.
    let store = Store::new(log, opts.tasks.snapshot_every, call_ids);
    let machines = machines(&opts, &ca, &kv, &registry, &hub, &placement, &store, addr).await?;

    // The brain's own git: imports and deliveries, with the tokens only it holds.
    let settings = Arc::new(opts.config.deliver.settings());
    let git = ports::GitPort {
        mirror: mirror.clone(),
        repos: crate::git::Repos::new(opts.data.path().join("repos")),
        settings: settings.clone(),
    };
    let mut tasks = opts.tasks.clone();
    tasks.secrets.extend(settings.secrets());
    // Values echoed back from upstream are masked by the proxy; these are masked in
    // whatever else leaves the brain.
    tasks.secrets.extend(
        secrets
            .values()
            .await?
            .into_iter()
            .filter_map(|(_, v)| String::from_utf8(v.expose().to_vec()).ok()),
    );
    tasks.egress = Some(crate::engine::core::EgressHandle(Arc::new(
        ports::EgressKeysPort {
            secrets: secrets.clone(),
            ca_pem: egress_ca.cert_pem.clone(),
            pinned: opts
                .config
                .egress
                .resolve
                .iter()
                .map(|(h, ip)| (h.to_ascii_lowercase(), *ip))
                .collect(),
        },
    )));

    // The engine, with every port it acts through.
    let engine = Engine::new(
        store,
        Ports {
            workers: Arc::new(hub.clone()),
            placement: Arc::new(placement.clone()),
            environments: Arc::new(machines.clone()),
            workspaces: Arc::new(git.clone()),
            delivery: Arc::new(git),
        },
        tasks,
        tracker.clone(),
        root.clone(),
    );
    route_hub_events(&tracker, &root, hub_events, engine.clone());
    Background {
        tracker: &tracker,
        root: &root,
        engine: &engine,
        machines: &machines,
        hub: &hub,
    }
    .start(postgres.as_ref(), &registry, &mirror);
    // Everything a task may need is there: resume them.
    let (loaded, resumed) = engine.resume_all().await?;
    if loaded > 0 {
        tracing::info!(loaded, resumed, "tasks loaded from the log");
    }

    if let Some(w) = web_addr {
        pki::write_file(
            &opts.data.path().join("brain.web"),
            format!("{w}\n").as_bytes(),
            0o644,
        )?;
    }
    pki::write_file(
        &opts.data.addr_file(),
        format!("{addr}\n").as_bytes(),
        0o644,
    )?;
    let web_auth = crate::trust::web::WebAuth::in_store(&kv)?;
    let shared = Arc::new(Shared {
        registry,
        hub,
        engine,
        db: sled,
        ca,
        session: SessionOptions {
            lost_after: opts.lost_after,
        },
        placement,
        config: shared::locks::Live::new(opts.config.clone()),
        config_path: opts.config_path.clone(),
        mirror,
        machines,
        web: web_auth,
        web_url: web_addr.map(|a| format!("http://{a}")),
        egress: crate::api::egress::EgressParts {
            secrets,
            ca: egress_ca,
            upstream: Arc::new(upstream),
        },
    });
    Ok(Ready {
        addr,
        shared,
        listener,
        web,
        tls,
        root,
        tracker,
    })
}

/// The call-id counter: this run's ids start above the previous run's, even if the clock
/// went back (the start is stored before any id is used). The floor moves by
/// compare-and-swap, so brains starting together on one store get ranges 2^32 apart.
async fn call_ids(kv: &crate::storage::kv::Store) -> Result<CallIds, Error> {
    let meta = kv.tree("meta").map_err(registry::Error::from)?;
    let mut ids = None;
    crate::storage::kv::update(meta.as_ref(), b"call_start", |old| {
        let floor = old
            .and_then(|v| <[u8; 8]>::try_from(v).ok().map(u64::from_be_bytes))
            .unwrap_or(0);
        let next = CallIds::starting_above(floor, shared::now_unix_ms());
        let bytes = next.start().to_be_bytes().to_vec();
        ids = Some(next);
        Some(bytes)
    })
    .await
    .map_err(registry::Error::from)?;
    meta.flush().await.map_err(registry::Error::from)?;
    Ok(ids.expect("update calls its function at least once"))
}

fn tls_config(data: &DataDir, ca: &Ca) -> Result<ServerTlsConfig, Error> {
    let chain = pki::read_text(&data.server_cert())?;
    let key = pki::read_text(&data.server_key())?;
    Ok(ServerTlsConfig::new()
        .identity(Identity::from_pem(chain, key))
        .client_ca_root(Certificate::from_pem(&ca.cert_pem))
        .client_auth_optional(true)
        .timeout(Duration::from_secs(10)))
}

/// The machines and their providers. A worker is in use while a task that holds it runs.
#[allow(clippy::too_many_arguments)]
async fn machines(
    opts: &Options,
    ca: &Ca,
    kv: &crate::storage::kv::Store,
    registry: &Registry,
    hub: &Hub,
    placement: &Placement,
    store: &Store,
    addr: SocketAddr,
) -> Result<Machines, Error> {
    let cfg = &opts.config.provision;
    let policy = cfg.policy().map_err(|e| Error::Config(e.to_string()))?;
    let url = cfg.brain_url.clone().unwrap_or_else(|| {
        let ip = if addr.ip().is_unspecified() {
            std::net::IpAddr::from([127, 0, 0, 1])
        } else {
            addr.ip()
        };
        format!("https://{}", SocketAddr::new(ip, addr.port()))
    });
    // This brain's name on hosts: from its CA, so it is stable and unique per brain.
    let tag: String = ca
        .hash()
        .trim_start_matches("sha256:")
        .chars()
        .take(16)
        .collect();
    let providers: Vec<Arc<dyn Provisioner>> = vec![
        Arc::new(provision::local::Local::new(
            opts.data.path().join("machines"),
            &cfg.local,
            std::iter::once(
                std::path::absolute(opts.data.path())
                    .unwrap_or_else(|_| opts.data.path().to_path_buf()),
            )
            .chain(opts.config.file.clone())
            .collect(),
        )),
        Arc::new(provision::ssh::Ssh::new(&cfg.ssh, &tag, opts.data.path())),
        Arc::new(provision::docker::DockerProvider::new(&cfg.docker, &tag)),
        Arc::new(provision::ec2::Ec2Provider::new(&cfg.ec2, &tag)),
        Arc::new(provision::k8s::K8sProvider::new(&cfg.k8s, &tag)),
    ];
    let store = store.clone();
    Ok(Machines::new(
        kv,
        registry.clone(),
        hub.clone(),
        placement.clone(),
        provision::BrainInfo {
            url,
            ca_hash: ca.hash(),
        },
        policy,
        providers,
        Box::new(move |worker: &str| store.worker_in_use(worker)),
    )
    .await?)
}

/// What the hub hears for the engine: live file changes, and results nobody waited for.
fn route_hub_events(
    tracker: &TaskTracker,
    root: &CancellationToken,
    mut events: HubEvents,
    engine: Engine,
) {
    let (stop, e) = (root.clone(), engine.clone());
    tracker.spawn(async move {
        loop {
            tokio::select! {
                f = events.fs.recv() => match f {
                    Some((worker, f)) => e.file_changes(&worker, f.into()),
                    None => return,
                },
                _ = stop.cancelled() => return,
            }
        }
    });
    let stop = root.clone();
    tracker.spawn(async move {
        loop {
            tokio::select! {
                o = events.orphans.recv() => match o {
                    Some((worker, call_id)) => engine.orphan_result(&worker, call_id),
                    None => return,
                },
                _ = stop.cancelled() => return,
            }
        }
    });
}

/// What runs beside the tasks.
struct Background<'a> {
    tracker: &'a TaskTracker,
    root: &'a CancellationToken,
    engine: &'a Engine,
    machines: &'a Machines,
    hub: &'a crate::fleet::hub::Hub,
}

impl Background<'_> {
    fn start(
        &self,
        postgres: Option<&crate::storage::postgres::Db>,
        registry: &Registry,
        mirror: &Mirror,
    ) {
        match postgres {
            Some(db) => self.replica(db, registry, mirror),
            None => self.single(mirror),
        }
    }

    /// The only brain on its store: the reaper and the mirror's collection.
    fn single(&self, mirror: &Mirror) {
        let (m, stop) = (self.machines.clone(), self.root.clone());
        self.tracker
            .spawn(async move { m.run_reaper(stop, None).await });
        spawn_gc(self.tracker, self.root, mirror.clone(), self.engine.clone());
    }

    /// A replica on a shared store: take-overs, the registry kept, and the leader's work.
    fn replica(&self, db: &crate::storage::postgres::Db, registry: &Registry, mirror: &Mirror) {
        spawn_replica_upkeep(
            self.tracker,
            self.root,
            self.engine.clone(),
            registry.clone(),
        );
        spawn_leadership(
            self.tracker,
            self.root,
            db.clone(),
            self.machines.clone(),
            (mirror.clone(), self.engine.clone()),
        );
        replicas::spawn(self.tracker, self.root, self.engine, db, self.hub);
    }
}

/// How often a replica looks for tasks whose lease lapsed and reads the registry again.
const UPKEEP_EVERY: Duration = Duration::from_secs(1);

/// On a shared store: takes over the tasks of replicas whose leases lapsed, and keeps the
/// registry as the other replicas change it (an enrolment or a revocation there counts
/// here within [`UPKEEP_EVERY`]).
fn spawn_replica_upkeep(
    tracker: &TaskTracker,
    root: &CancellationToken,
    engine: Engine,
    registry: Registry,
) {
    let stop = root.clone();
    tracker.spawn(async move {
        let mut every = tokio::time::interval(UPKEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stop.cancelled() => return,
            }
            if let Err(e) = registry.refresh().await {
                tracing::warn!(error = %e, "cannot read the registry from the store");
            }
            match engine.follow_workers().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    tasks = n,
                    "let tasks go to the replicas their workers are on"
                ),
                Err(e) => tracing::warn!(error = %e, "cannot let tasks follow their workers"),
            }
            match engine.adopt().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(tasks = n, "took over tasks whose replica's lease lapsed"),
                Err(e) => tracing::warn!(error = %e, "cannot look for tasks to take over"),
            }
        }
    });
}

/// The leader lease that work there must be only one of runs under, and how long it lasts
/// unless renewed (each [`UPKEEP_EVERY`]).
const LEADER: &str = "one-of-a-kind";
const LEADER_TTL: Duration = Duration::from_secs(10);

/// On a shared store: takes or renews the leader lease each [`UPKEEP_EVERY`]; while this
/// replica holds it, it runs the machine reaper and reconcile (from the records read again
/// when it starts leading), and stops them when it loses it.
fn spawn_leadership(
    tracker: &TaskTracker,
    root: &CancellationToken,
    db: crate::storage::postgres::Db,
    machines: Machines,
    (mirror, engine): (Mirror, Engine),
) {
    let (stop, tracker2) = (root.clone(), tracker.clone());
    tracker.spawn(async move {
        let mut every = tokio::time::interval(UPKEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut term: Option<CancellationToken> = None;
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stop.cancelled() => return,
            }
            let leads = match db.lead(LEADER, LEADER_TTL).await {
                Ok(epoch) => epoch,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot renew the leader lease");
                    None
                }
            };
            match (leads, &term) {
                (Some(epoch), None) => {
                    tracing::info!(
                        epoch,
                        "this replica now leads: it runs the machine reaper, reconcile and the mirror's collection"
                    );
                    if let Err(e) = machines.refresh().await {
                        tracing::warn!(error = %e, "cannot read the machine records");
                    }
                    let t = stop.child_token();
                    let m = machines.clone();
                    let run = t.clone();
                    // Each pass first checks the lease is still this term's: a leader paused
                    // past it skips the pass on waking (and stops at the next renewal).
                    let d = db.clone();
                    let fence: crate::provision::Fence = std::sync::Arc::new(move || {
                        let d = d.clone();
                        Box::pin(async move { d.holds(LEADER, epoch).await.unwrap_or(false) })
                    });
                    tracker2.spawn(async move { m.run_reaper(run, Some(fence)).await });
                    spawn_gc(&tracker2, &t, mirror.clone(), engine.clone());
                    term = Some(t);
                }
                (None, Some(t)) => {
                    tracing::warn!(
                        "this replica no longer leads: its machine reaper and the mirror's collection stop"
                    );
                    t.cancel();
                    term = None;
                }
                _ => {}
            }
        }
    });
}

/// Blobs and manifests nothing refers to any more are collected now and then: what every
/// task's log names (its starting workspace and last barrier) is kept.
fn spawn_gc(tracker: &TaskTracker, root: &CancellationToken, mirror: Mirror, engine: Engine) {
    let stop = root.clone();
    tracker.spawn(async move {
        let mut every = tokio::time::interval(GC_EVERY);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stop.cancelled() => return,
            }
            // On a shared store every task is shown here (this replica's and the views of the
            // others'); a task stored but not shown yet would lose what it names: wait.
            if engine.store().shared() && !every_task_shown(&engine).await {
                tracing::debug!("not every task is shown here yet: the mirror's collection waits");
                continue;
            }
            let keep: std::collections::HashSet<String> = engine
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

/// Whether every task in the log is one of this brain's or a view here.
async fn every_task_shown(engine: &Engine) -> bool {
    let store = engine.store();
    match store.log().tasks().await {
        Ok(ids) => ids
            .into_iter()
            .all(|t| store.task(t).is_some() || store.view(t).is_some()),
        Err(_) => false,
    }
}

impl Ready {
    /// Serves until `shutdown` resolves; then closes worker sessions, stops every tracked
    /// task (waiting a bounded time) and flushes the store.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let services = Services(self.shared.clone());
        if let Some((l, web_opts)) = self.web {
            let web = crate::web::Web::new(self.shared.clone(), self.shared.web.clone(), web_opts);
            let stop = self.root.clone();
            tracing::info!(addr = %l.local_addr().map(|a| a.to_string()).unwrap_or_default(), "web API and page listening");
            self.tracker.spawn(async move {
                if let Err(e) = crate::web::serve(l, web, stop).await {
                    tracing::error!(error = %e, "the web API stopped");
                }
            });
        }
        let incoming = TcpIncoming::from(self.listener).with_nodelay(Some(true));
        let hub = self.shared.hub.clone();
        let registry = self.shared.registry.clone();
        let check: crate::api::roles::PeerCheck =
            Arc::new(move |peer| match registry.check_peer(peer)? {
                Ok(()) => Ok(()),
                Err(reason) => Err(tonic::Status::permission_denied(reason.to_string())),
            });
        let result = Server::builder()
            .tls_config(self.tls)
            .map_err(|e| Error::Tls(e.to_string()))?
            .http2_keepalive_interval(Some(Duration::from_secs(10)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .layer(crate::api::roles::RoleLayer(check))
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
                proto::egress_server::EgressServer::new(services.clone())
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
        self.root.cancel();
        self.tracker.close();
        if tokio::time::timeout(SHUTDOWN_WAIT, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("some tasks did not stop within {SHUTDOWN_WAIT:?}; leaving them");
        }
        if let Err(e) = self.shared.registry.flush_now().await {
            tracing::error!(error = %e, "final flush of the store failed");
        }
        result.map_err(Error::from)
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
    // `brain init`'s "admin", or on a replica that adopted a shared store's CA its own.
    let name = pki::peer_identity(&der)
        .map(|p| p.id)
        .unwrap_or_else(|_| ca::INIT_ADMIN.to_string());
    match registry.admin(&name)? {
        Some(rec) if rec.fingerprint == fp || rec.ca_hash == ca_hash => Ok(()),
        _ => Ok(registry.add_admin(&name, &fp, ca_hash, true).await?),
    }
}

/// Placement's settings from `[placement]`.
fn placement_options(
    c: &crate::config::PlacementConfig,
) -> Result<crate::fleet::board::Options, Error> {
    let (steady_after, backoff) = c.durations().map_err(|e| Error::Config(e.to_string()))?;
    Ok(crate::fleet::board::Options {
        max_tasks_per_worker: c.max_tasks_per_worker,
        moves_per_worker: c.moves_per_worker,
        steady_after,
        backoff,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brains starting at once on one PostgreSQL store take call-id ranges at least 2^32
    /// apart, and each start is above the one stored before it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn brains_starting_together_get_call_id_ranges_apart() {
        let Some(pg) = testkit::postgres::start_or_skip() else {
            return;
        };
        let db = crate::storage::postgres::Db::open(&pg.url(), "r")
            .await
            .unwrap();
        let kv = crate::storage::kv::Store::Postgres(db);
        let starts: Vec<_> = (0..4)
            .map(|_| {
                let kv = kv.clone();
                tokio::spawn(async move { call_ids(&kv).await.unwrap().start() })
            })
            .collect();
        let mut got = Vec::new();
        for s in starts {
            got.push(s.await.unwrap());
        }
        got.sort_unstable();
        for w in got.windows(2) {
            assert!(w[1] - w[0] >= 1 << 32, "ranges overlap: {got:?}");
        }
        let later = call_ids(&kv).await.unwrap().start();
        assert!(later >= got[3] + (1 << 32), "{later} after {got:?}");
    }
}
