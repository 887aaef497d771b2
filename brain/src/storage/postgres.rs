//! The PostgreSQL store: a small pool of `tokio-postgres` connections (TLS by rustls where
//! the server offers it), the schema's migrations (in `migrations/`, applied at start under
//! an advisory lock, so replicas starting together apply each once), and the rows of task
//! logs and their leases.
//!
//! Invariants the SQL here keeps, whatever any replica does:
//! - A record lands only in the statement that also holds its task's lease row locked and
//!   finds it this replica's, at the epoch the replica names, unexpired by the database's own
//!   clock. A replica whose lease lapsed or moved writes nothing more (fencing).
//! - `(task, seq)` is the primary key: a record is never stored twice. An append whose answer
//!   was lost (the connection broke) is retried; if it had landed, the retry finds its own
//!   records in place and reports them landed, so nothing is written twice or lost.
//! - Times (lease expiry) are the database's `now()`, never a replica's clock.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::error::SqlState;

/// The migrations, in order. A version once released never changes; new ones are added.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "task_logs",
        include_str!("migrations/0001_task_logs.sql"),
    ),
    (
        2,
        "trees_and_blobs",
        include_str!("migrations/0002_trees_and_blobs.sql"),
    ),
    (
        3,
        "blob_times",
        include_str!("migrations/0003_blob_times.sql"),
    ),
    (4, "leaders", include_str!("migrations/0004_leaders.sql")),
    (
        5,
        "replica_traffic",
        include_str!("migrations/0005_replica_traffic.sql"),
    ),
];

/// The schema version this brain brings its databases to.
pub fn schema_version_known() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}

/// The advisory lock key migrations take (any constant; "tether" in ASCII).
const MIGRATION_LOCK: i64 = 0x7465_7468_6572;

/// Connections the pool keeps at most.
const POOL_SIZE: usize = 16;
/// A connection attempt, and the wait for a free connection, give up after this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// One statement gives up after this (the connection may be gone without a word).
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);
/// The oldest server the SQL here is written for.
const MIN_SERVER_VERSION: i32 = 130_000;

/// Errors of the PostgreSQL store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the store URL is not a PostgreSQL URL ({reason}): write postgres://USER:PASSWORD@HOST:PORT/DATABASE"
    )]
    Url { reason: String },
    #[error(
        "cannot reach PostgreSQL at {target}: {reason} (is the server up, and are the URL's user and password right?)"
    )]
    Connect { target: String, reason: String },
    #[error("PostgreSQL at {target} did not answer within {after:?}")]
    Timeout { target: String, after: Duration },
    #[error("PostgreSQL: {}", explain(.0))]
    Query(#[from] tokio_postgres::Error),
    #[error(
        "the database's schema is at version {found}, newer than this brain knows ({known}): upgrade this brain before pointing it at this database"
    )]
    SchemaTooNew { found: i32, known: i32 },
    #[error("migration {version} ({name}) failed: {}", explain(source))]
    Migrate {
        version: i32,
        name: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("PostgreSQL {found} is too old: the store needs 13 or later")]
    ServerTooOld { found: String },
    #[error(
        "records {first}..={last} of task {task} are stored with other contents than this replica appended: two writers held the task at once"
    )]
    Conflict { task: i64, first: i64, last: i64 },
}

impl Error {
    /// Whether the database may answer if asked again (the server restarting, a connection
    /// cut, a timeout) as opposed to refusing what was asked.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::Timeout { .. } => true,
            Self::Query(e) => transient(e),
            _ => false,
        }
    }
}

/// The server's own words for an error (tokio-postgres' Display says only "db error"), with
/// its SQLSTATE, detail and hint.
fn explain(e: &tokio_postgres::Error) -> String {
    let Some(db) = e.as_db_error() else {
        return match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        };
    };
    let mut s = format!("{} (SQLSTATE {})", db.message(), db.code().code());
    if let Some(d) = db.detail() {
        s.push_str(&format!("; {d}"));
    }
    if let Some(h) = db.hint() {
        s.push_str(&format!("; hint: {h}"));
    }
    s
}

fn transient(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        // Class 08 (connection exception), the server shutting down or starting.
        Some(c) => {
            c.code().starts_with("08")
                || *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
        }
        // No SQLSTATE: the error came from the socket, not the server.
        None => true,
    }
}

/// A lease as the database holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub holder: String,
    pub epoch: i64,
    /// Whether it has lapsed by the database's clock.
    pub lapsed: bool,
}

/// What became of an append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Appended {
    /// Every record is stored.
    Landed,
    /// Nothing was stored: the lease is not this replica's at that epoch, or has lapsed.
    /// The lease as it is now (`None`: the task has none).
    Fenced(Option<LeaseRow>),
}

/// One stored record's row.
#[derive(Debug, Clone)]
pub struct EventRow {
    pub seq: i64,
    pub v: i32,
    pub at_ms: i64,
    pub event: Vec<u8>,
}

/// A pool on one database, as one replica.
#[derive(Clone)]
pub struct Db {
    pool: Pool,
    /// host:port/database, for messages (never the password).
    pub(super) target: String,
    /// The name this replica holds leases under.
    replica: String,
    /// How to open a connection of its own (a listener's), outside the pool.
    pub(super) direct: std::sync::Arc<(
        tokio_postgres::Config,
        tokio_postgres_rustls::MakeRustlsConnect,
    )>,
}

impl Db {
    /// Connects to `url` as `replica`, checks the server and applies the migrations this
    /// brain has and the database has not.
    pub async fn open(url: &str, replica: &str) -> Result<Self, Error> {
        let mut config = tokio_postgres::Config::from_str(url).map_err(|e| Error::Url {
            reason: e.to_string(),
        })?;
        if config.get_hosts().is_empty() {
            return Err(Error::Url {
                reason: "it names no host".into(),
            });
        }
        let target = describe(&config);
        config
            .application_name(format!("tether-brain {replica}"))
            .connect_timeout(CONNECT_TIMEOUT)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10));
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls_config());
        let direct = std::sync::Arc::new((config.clone(), tls.clone()));
        let manager = Manager::from_config(
            config,
            tls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| Error::Url {
                reason: e.to_string(),
            })?;
        let db = Self {
            pool,
            target,
            replica: replica.to_string(),
            direct,
        };
        db.check_server().await?;
        db.migrate().await?;
        Ok(db)
    }

    /// The name this replica holds leases under.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// A connection from the pool.
    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object, Error> {
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Timeout(_) => Error::Timeout {
                target: self.target.clone(),
                after: CONNECT_TIMEOUT,
            },
            // Refused at the door (password, role, database): say so as a connection error.
            deadpool_postgres::PoolError::Backend(e)
                if e.code().is_some_and(|c| {
                    c.code().starts_with("28") || *c == SqlState::INVALID_CATALOG_NAME
                }) =>
            {
                Error::Connect {
                    target: self.target.clone(),
                    reason: explain(&e),
                }
            }
            deadpool_postgres::PoolError::Backend(e) if e.code().is_some() => Error::Query(e),
            other => Error::Connect {
                target: self.target.clone(),
                reason: other.to_string(),
            },
        })
    }

    /// `fut` with the statement timeout.
    pub(super) async fn timed<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(QUERY_TIMEOUT, fut).await {
            Ok(r) => r.map_err(Error::Query),
            Err(_) => Err(Error::Timeout {
                target: self.target.clone(),
                after: QUERY_TIMEOUT,
            }),
        }
    }

    /// One statement's rows, on a connection from the pool, within the timeout.
    pub(super) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        let c = self.client().await?;
        self.timed(c.query(sql, params)).await
    }

    /// [`Db::query`] for at most one row.
    pub(super) async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, Error> {
        let c = self.client().await?;
        self.timed(c.query_opt(sql, params)).await
    }

    /// [`Db::query`] for exactly one row.
    pub(super) async fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, Error> {
        let c = self.client().await?;
        self.timed(c.query_one(sql, params)).await
    }

    /// [`Db::query`] for a statement that returns no rows: how many it changed.
    pub(super) async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, Error> {
        let c = self.client().await?;
        self.timed(c.execute(sql, params)).await
    }

    async fn check_server(&self) -> Result<(), Error> {
        let row = self
            .query_one(
                "SELECT current_setting('server_version_num')::int, current_setting('server_version'), \
                 current_setting('fsync'), current_setting('synchronous_commit')",
                &[],
            )
            .await?;
        let (num, version): (i32, String) = (row.get(0), row.get(1));
        if num < MIN_SERVER_VERSION {
            return Err(Error::ServerTooOld { found: version });
        }
        let (fsync, sync_commit): (String, String) = (row.get(2), row.get(3));
        if fsync != "on" || sync_commit == "off" {
            tracing::warn!(
                %fsync, synchronous_commit = %sync_commit,
                "PostgreSQL at {} may lose commits it acknowledged (fsync or synchronous_commit is off): a task's records are durable only as far as the database is",
                self.target
            );
        }
        Ok(())
    }

    async fn migrate(&self) -> Result<(), Error> {
        let mut c = self.client().await?;
        let tx = self.timed(c.transaction()).await?;
        self.timed(tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]))
            .await?;
        self.timed(tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS tether_schema (
                 version    integer     PRIMARY KEY,
                 name       text        NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now())",
        ))
        .await?;
        let current: i32 = self
            .timed(tx.query_one("SELECT coalesce(max(version), 0) FROM tether_schema", &[]))
            .await?
            .get(0);
        let known = schema_version_known();
        if current > known {
            return Err(Error::SchemaTooNew {
                found: current,
                known,
            });
        }
        for &(version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
            tracing::info!(version, name, "applying a store migration");
            tx.batch_execute(sql)
                .await
                .map_err(|source| Error::Migrate {
                    version,
                    name,
                    source,
                })?;
            self.timed(tx.execute(
                "INSERT INTO tether_schema (version, name) VALUES ($1, $2)",
                &[&version, &name],
            ))
            .await?;
        }
        self.timed(tx.commit()).await?;
        Ok(())
    }

    /// The schema version the database is at.
    pub async fn schema_version(&self) -> Result<i32, Error> {
        Ok(self
            .query_one("SELECT coalesce(max(version), 0) FROM tether_schema", &[])
            .await?
            .get(0))
    }

    // ------------------------------------------------------------------------ leases

    /// A new task id, leased to this replica at epoch 1 for `ttl`.
    pub async fn new_task(&self, ttl: Duration) -> Result<i64, Error> {
        Ok(self
            .query_one(
                "INSERT INTO leases (task, holder, epoch, expires_at)
                 VALUES (nextval('task_ids'), $1, 1, now() + $2::bigint * interval '1 millisecond')
                 RETURNING task",
                &[&self.replica, &millis(ttl)],
            )
            .await?
            .get(0))
    }

    /// Takes `task`'s lease for `ttl` if it is free, lapsed or already this replica's;
    /// returns its epoch (raised whenever it changes hands or had lapsed), or `None` while
    /// another replica holds it.
    pub async fn claim(&self, task: i64, ttl: Duration) -> Result<Option<i64>, Error> {
        let row = self
            .query_opt(
                "INSERT INTO leases AS l (task, holder, epoch, expires_at)
                 VALUES ($1, $2, 1, now() + $3::bigint * interval '1 millisecond')
                 ON CONFLICT (task) DO UPDATE SET
                     holder = excluded.holder,
                     expires_at = excluded.expires_at,
                     epoch = CASE WHEN l.holder = excluded.holder AND l.expires_at > now()
                                  THEN l.epoch ELSE l.epoch + 1 END
                   WHERE l.expires_at <= now() OR l.holder = excluded.holder
                 RETURNING epoch",
                &[&task, &self.replica, &millis(ttl)],
            )
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Extends every unlapsed lease this replica holds by `ttl`; returns them (task, epoch).
    /// A lease missing from the answer is not this replica's any more.
    pub async fn renew(&self, ttl: Duration) -> Result<Vec<(i64, i64)>, Error> {
        Ok(self
            .query(
                "UPDATE leases SET expires_at = now() + $2::bigint * interval '1 millisecond'
                 WHERE holder = $1 AND expires_at > now()
                 RETURNING task, epoch",
                &[&self.replica, &millis(ttl)],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }

    /// Lets `task`'s lease lapse now if this replica holds it at `epoch`.
    pub async fn release(&self, task: i64, epoch: i64) -> Result<bool, Error> {
        Ok(self
            .execute(
                "UPDATE leases SET expires_at = now()
                 WHERE task = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()",
                &[&task, &self.replica, &epoch],
            )
            .await?
            == 1)
    }

    /// `task`'s lease as the database holds it now.
    pub async fn lease(&self, task: i64) -> Result<Option<LeaseRow>, Error> {
        Ok(self
            .query_opt(
                "SELECT holder, epoch, expires_at <= now() FROM leases WHERE task = $1",
                &[&task],
            )
            .await?
            .map(|r| LeaseRow {
                holder: r.get(0),
                epoch: r.get(1),
                lapsed: r.get(2),
            }))
    }

    // ------------------------------------------------------------------------ records

    /// Stores `events` as records `first_seq..` of `task`, in the statement that checks
    /// `task`'s lease is this replica's at `epoch` and unlapsed. One try: a transient error
    /// leaves it unknown whether the records landed (see [`Db::append`]).
    async fn try_append(
        &self,
        task: i64,
        epoch: i64,
        first_seq: i64,
        v: i32,
        at_ms: i64,
        events: &[Vec<u8>],
    ) -> Result<u64, Error> {
        let c = self.client().await?;
        let stmt = self
            .timed(c.prepare_cached(
                "INSERT INTO events (task, seq, v, at_ms, event)
                 SELECT $1, $4 + e.n - 1, $5, $6, e.body
                 FROM (SELECT 1 FROM leases
                       WHERE task = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()
                       FOR UPDATE) AS held,
                      unnest($7::bytea[]) WITH ORDINALITY AS e(body, n)",
            ))
            .await?;
        self.timed(c.execute(
            &stmt,
            &[
                &task,
                &self.replica,
                &epoch,
                &first_seq,
                &v,
                &at_ms,
                &events,
            ],
        ))
        .await
    }

    /// Appends `events` as records `first_seq..` of `task` under the lease at `epoch`.
    /// A transient failure is retried until `patience` runs out; a retry that finds the
    /// records already stored (the earlier try landed, its answer was lost) reports them
    /// landed.
    #[expect(clippy::too_many_arguments, reason = "one record batch's envelope")]
    pub async fn append(
        &self,
        task: i64,
        epoch: i64,
        first_seq: i64,
        v: i32,
        at_ms: i64,
        events: &[Vec<u8>],
        patience: Duration,
    ) -> Result<Appended, Error> {
        let give_up = tokio::time::Instant::now() + patience;
        let mut pause = Duration::from_millis(50);
        loop {
            let tried = self
                .try_append(task, epoch, first_seq, v, at_ms, events)
                .await;
            match tried {
                Ok(n) if n as usize == events.len() => return Ok(Appended::Landed),
                Ok(_) => {}
                Err(Error::Query(e)) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {}
                Err(e) if e.is_transient() && tokio::time::Instant::now() < give_up => {
                    tracing::warn!(task, error = %e, "the store did not take an append; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                    continue;
                }
                Err(e) => return Err(e),
            }
            // Nothing stored by this try: an earlier try may have stored these records (its
            // answer lost), or the lease is not ours.
            let last = first_seq + events.len() as i64 - 1;
            let stored = self.read_range(task, first_seq, last).await?;
            if stored.len() == events.len() && stored.iter().zip(events).all(|(s, e)| s.event == *e)
            {
                return Ok(Appended::Landed);
            }
            let lease = self.lease(task).await?;
            let ours = lease
                .as_ref()
                .is_some_and(|l| l.holder == self.replica && l.epoch == epoch && !l.lapsed);
            if ours && !stored.is_empty() {
                return Err(Error::Conflict {
                    task,
                    first: first_seq,
                    last,
                });
            }
            return Ok(Appended::Fenced(lease));
        }
    }

    async fn read_range(&self, task: i64, first: i64, last: i64) -> Result<Vec<EventRow>, Error> {
        let rows = self
            .query(
                "SELECT seq, v, at_ms, event FROM events
                 WHERE task = $1 AND seq BETWEEN $2 AND $3 ORDER BY seq",
                &[&task, &first, &last],
            )
            .await?;
        Ok(rows.iter().map(event_row).collect())
    }

    /// `task`'s records after `after`, in order.
    pub async fn read(&self, task: i64, after: i64) -> Result<Vec<EventRow>, Error> {
        self.read_range(task, after + 1, i64::MAX).await
    }

    /// The last record's number (0 if none).
    pub async fn last_seq(&self, task: i64) -> Result<i64, Error> {
        Ok(self
            .query_one(
                "SELECT coalesce(max(seq), 0) FROM events WHERE task = $1",
                &[&task],
            )
            .await?
            .get(0))
    }

    /// Every task that has a record, in id order.
    pub async fn tasks(&self) -> Result<Vec<i64>, Error> {
        Ok(self
            .query(
                "SELECT l.task FROM leases l
                 WHERE EXISTS (SELECT 1 FROM events e WHERE e.task = l.task)
                 ORDER BY l.task",
                &[],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    /// The tasks whose lease another replica holds now (unlapsed).
    pub async fn held_elsewhere(&self) -> Result<Vec<i64>, Error> {
        Ok(self
            .query(
                "SELECT task FROM leases WHERE holder <> $1 AND expires_at > now()",
                &[&self.replica],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    /// Stores a snapshot covering records up to `upto`, if this replica holds the lease at
    /// `epoch` and no later snapshot is stored. Whether it was stored.
    pub async fn put_snapshot(
        &self,
        task: i64,
        epoch: i64,
        upto: i64,
        state: &[u8],
    ) -> Result<bool, Error> {
        Ok(self
            .execute(
                "INSERT INTO snapshots AS s (task, upto, state)
                 SELECT $1, $4, $5 FROM leases
                 WHERE task = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()
                 ON CONFLICT (task) DO UPDATE SET upto = excluded.upto, state = excluded.state
                   WHERE s.upto < excluded.upto",
                &[&task, &self.replica, &epoch, &upto, &state],
            )
            .await?
            == 1)
    }

    /// The latest snapshot: (upto, bytes).
    pub async fn snapshot(&self, task: i64) -> Result<Option<(i64, Vec<u8>)>, Error> {
        Ok(self
            .query_opt(
                "SELECT upto, state FROM snapshots WHERE task = $1",
                &[&task],
            )
            .await?
            .map(|r| (r.get(0), r.get(1))))
    }
}

fn event_row(r: &tokio_postgres::Row) -> EventRow {
    EventRow {
        seq: r.get(0),
        v: r.get(1),
        at_ms: r.get(2),
        event: r.get(3),
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// host:port/database of a config, for messages.
fn describe(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "?".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{host}:{port}/{}",
        config
            .get_dbname()
            .unwrap_or(config.get_user().unwrap_or("?"))
    )
}

/// The TLS settings for the database: the public web PKI's roots (a database with a private
/// CA is reached with `sslmode=disable` on a private network, or through a proxy that holds
/// its CA).
fn tls_config() -> rustls::ClientConfig {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the default TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth()
}
