//! The `brain` command line: `init` and `serve` act on the data dir; every other command is
//! an admin client that talks to the running brain over mutual TLS.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use shared::pki::{self, IdentityFiles};
use tokio_util::sync::CancellationToken;

use super::args::{
    AdminCmd, Cli, Cmd, ConfigCmd, MachinesCmd, ServeArgs, StoreCmd, TokenCmd, WebCmd, WorkerCmd,
};
use super::client::{Target, status};
use super::follow::{View, decide, follow, run_task};
use super::remote::{exec, file, provision};
use crate::admin::render::{print_machines, print_workers};
use crate::trust::ca::{self, DataDir};

/// The brain's async runtime (two threads); says why on stderr if it cannot start.
fn runtime() -> Option<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| err!("error: cannot start the async runtime: {e}"))
        .ok()
}

/// Parses `args` (including the program name), runs the command and returns the exit status.
pub fn main_with<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    hold_keys_close();
    shared::telemetry::init("info");
    let cli = Cli::parse_from(args);
    let Some(rt) = runtime() else {
        return 1;
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            err!("error: {e:#}");
            exit_code(&e)
        }
    }
}

/// What the brain does first, while it has one thread: takes `$TETHER_SECRET_KEY` out of
/// its environment and closes its memory (`/proc/PID/environ`, `mem`) to other processes of
/// its user, such as the commands of a local worker.
fn hold_keys_close() {
    // SAFETY: called first thing in main, before any thread is started.
    unsafe { crate::trust::secrets::take_key_from_env() };
    if let Err(e) = shared::close_memory_to_same_user() {
        err!("warning: cannot close this process's memory to its user's other processes: {e}");
    }
}

/// The exit status for an error that reached the top: [`ExitCode::Config`] (78) for a
/// configuration problem that running again will not fix (an unreadable or invalid config
/// file, no CA in the data dir, missing or malformed key material or admin identity, a
/// malformed brain URL), 1 otherwise. The systemd units in deploy/ do not restart the brain
/// on 78.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    use shared::exit::{by, classify};
    classify(
        e,
        &[
            by::<crate::config::Error>,
            by::<ca::Error>,
            by::<crate::app::Error>,
            by::<crate::admin::client::Error>,
            by::<shared::pki::Error>,
            by::<shared::tls::Error>,
        ],
    )
    .code()
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let data = DataDir(
        cli.data
            .clone()
            .unwrap_or_else(|| shared::dirs::data_dir("tether", "TETHER_DATA")),
    );
    let target = Target::resolve(&data, cli.brain.clone(), cli.identity.clone());
    let t = &target;
    match cli.cmd {
        Cmd::Init {
            hosts,
            force,
            model,
        } => init(&data, &hosts, force, model.as_deref()),
        Cmd::Config(ConfigCmd::Check { file }) => {
            config_check(&file.unwrap_or_else(|| data.path().join("config.toml")))
        }
        Cmd::Config(ConfigCmd::Reload { json }) => config_reload(t, json).await,
        Cmd::Config(ConfigCmd::Assists { model, file, json }) => super::assists::show(
            &file.unwrap_or_else(|| data.path().join("config.toml")),
            model,
            json,
        ),
        Cmd::Serve(args) => serve(&data, args).await,
        Cmd::Secret(cmd) => super::secrets::run(t, cmd).await,
        Cmd::Token(TokenCmd::Create { ttl, labels }) => token_create(t, ttl, labels).await,
        Cmd::Workers { json } => workers(t, json).await,
        Cmd::Machines {
            cmd: Some(MachinesCmd::Release { id }),
            ..
        } => machine_release(t, id).await,
        Cmd::Machines {
            cmd: None,
            json,
            all,
        } => machines(t, json, all).await,
        Cmd::Provision(p) => provision(t, p).await,
        Cmd::Worker(WorkerCmd::Revoke { worker }) => worker_revoke(t, worker, false).await,
        Cmd::Worker(WorkerCmd::Remove { worker }) => worker_revoke(t, worker, true).await,
        Cmd::Exec(args) => Ok(exec(t, args).await),
        Cmd::Run(args) => run_task(t, args).await,
        Cmd::Approve { task, always } => decide(t, &task, true, String::new(), always).await,
        Cmd::Deny { task, reason } => decide(t, &task, false, reason, false).await,
        Cmd::Tasks { json } => super::tasks::list(t, json).await,
        Cmd::Task(cmd) => super::tasks::run(t, cmd).await,
        Cmd::Watch {
            task,
            since,
            json,
            full,
        } => {
            follow(t, &task, true, View::pick(json, full), since, None).await?;
            Ok(0)
        }
        Cmd::Backup { file } => backup(t, &file).await,
        Cmd::Restore { file } => restore(&data, &file),
        Cmd::Store(StoreCmd::Copy { to, from, json }) => store_copy(&data, to, from, json).await,
        Cmd::Demo { keep, model } => {
            let worker = crate::provision::local::WorkerProgram::beside_this_program()
                .map_err(|e| anyhow::anyhow!("{e}; or run `cargo run --release -- demo`"))?;
            crate::admin::demo::run(worker, keep, model).await?;
            Ok(0)
        }
        Cmd::File(cmd) => file(t, cmd).await,
        Cmd::Admin(AdminCmd::Issue { name, out }) => admin_issue(t, &name, &out).await,
        Cmd::Admin(AdminCmd::Revoke { name }) => admin_revoke(t, name).await,
        Cmd::Admin(AdminCmd::Token(cmd)) => super::web::token(t, cmd).await,
        Cmd::Web(WebCmd::Login {
            name,
            role,
            ttl,
            json,
        }) => super::web::login(t, &name, &role, ttl, json).await,
    }
}

/// `brain init`.
fn init(data: &DataDir, hosts: &[String], force: bool, model: Option<&str>) -> anyhow::Result<i32> {
    let config = data.path().join("config.toml");
    if let Some(m) = model {
        // Checked before anything is made: a typo must not leave half a data dir.
        crate::llm::ModelSpec::parse(m).map_err(|e| anyhow::anyhow!("--model {m}: {e}"))?;
        if config.exists() {
            anyhow::bail!(
                "{} exists: set [llm] default_model = \"{m}\" in it instead (nothing was changed)",
                config.display()
            );
        }
    }
    let out = ca::init(data, hosts, force)?;
    out!("initialised {}", data.path().display());
    out!("CA hash: {}", out.ca_hash);
    if let Some(m) = model {
        std::fs::write(&config, format!("[llm]\ndefault_model = \"{m}\"\n"))
            .with_context(|| format!("writing {}", config.display()))?;
        out!("wrote {} (default model {m})", config.display());
        if let Some(why) = model_not_ready(&crate::config::Config::load(&config)?, m) {
            err!("note: {why}");
        }
    }
    out!("next: brain serve --data {}", data.path().display());
    Ok(0)
}

/// Why `model` could not be asked with this config and the keys of this environment, if it
/// could not (a replay is always ready).
fn model_not_ready(config: &crate::config::Config, model: &str) -> Option<String> {
    let spec = crate::llm::ModelSpec::parse(model).ok()?;
    crate::llm::check(&spec, &config.llm)
        .err()
        .map(|e| e.to_string())
}

/// `brain config check`.
fn config_check(path: &std::path::Path) -> anyhow::Result<i32> {
    if !path.exists() {
        out!(
            "no config file at {}: the brain runs on its defaults",
            path.display()
        );
        return Ok(0);
    }
    let config = match crate::config::Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            err!("error: {e}");
            return Ok(shared::exit::ExitCode::Config.code());
        }
    };
    out!("{} is valid", path.display());
    if let Some(m) = &config.llm.default_model {
        match model_not_ready(&config, m) {
            None => out!("default model {m}: ready"),
            Some(why) => out!("default model {m}: not ready with this shell's environment: {why}"),
        }
        if let Ok(a) = crate::model::assists::Assists::for_model(m, &config.llm, None) {
            let names = a.names();
            out!(
                "default model {m}: assists {} (`brain config assists` says what each does)",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            );
        }
    }
    Ok(0)
}

/// `brain serve`: until a signal.
async fn serve(data: &DataDir, a: ServeArgs) -> anyhow::Result<i32> {
    let config_path = a.config.unwrap_or_else(|| data.path().join("config.toml"));
    let config = std::sync::Arc::new(crate::config::Config::load(&config_path)?);
    let store = match a.store.or_else(|| config.store.url.clone()) {
        Some(url) => Some(crate::app::SharedStore {
            url,
            lease_ttl: config.store.lease_ttl()?,
            replica: a
                .replica
                .or_else(|| config.store.replica.clone())
                .unwrap_or_else(|| match a.listen.port() {
                    // No port to tell two replicas on one host apart by.
                    0 => format!("{}:{:08x}", host_name(), rand::random::<u32>()),
                    port => format!("{}:{port}", host_name()),
                }),
        }),
        None if a.replica.is_some() => {
            err!(
                "error: --replica names a replica on a shared store: give --store (or [store] url) too"
            );
            return Ok(shared::exit::ExitCode::Usage.code());
        }
        None if config.store.lease_ttl.is_some() => {
            err!(
                "error: [store] lease_ttl is for replicas on a shared store: give --store (or [store] url) too, or take it out of {}",
                config_path.display()
            );
            return Ok(shared::exit::ExitCode::Config.code());
        }
        None => None,
    };
    let ready = crate::app::prepare(crate::app::Options {
        data: data.clone(),
        listen: a.listen,
        lost_after: a.lost_after,
        tasks: crate::engine::Options {
            snapshot_every: a.snapshot_every.max(1),
            worker_wait: a.worker_wait,
            limits: a.limits.to_proto(a.network_off).into(),
            disk_quota: crate::model::ops::DiskQuota {
                bytes: a.disk_quota.unwrap_or(0),
                files: a.disk_files.unwrap_or(0),
            },
            llm: std::sync::Arc::new(config.llm.clone()),
            failover_after: a.failover_after,
            secrets: vec![],
            egress: None,
        },
        require_sandbox: a.require_sandbox,
        config,
        config_path,
        web_listen: a.web_listen,
        store,
    })
    .await?;
    tracing::info!(addr = %ready.addr, data = %data.path().display(), "brain listening on {}", ready.addr);
    let stop = CancellationToken::new();
    spawn_signal_handler(stop.clone());
    spawn_reload_on_hangup(ready.shared.clone(), stop.clone());
    ready.run(stop.cancelled_owned()).await?;
    tracing::info!("brain stopped");
    Ok(0)
}

/// This host's name (for a replica's default name).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "brain".into())
}

/// `brain token create`.
async fn token_create(
    t: &Target,
    ttl: Duration,
    labels: Vec<(String, String)>,
) -> anyhow::Result<i32> {
    let req = proto::CreateTokenRequest {
        ttl_seconds: ttl.as_secs().max(1),
        labels: labels.into_iter().collect(),
    };
    let resp = t.rpc(async |mut c| c.create_token(req).await).await?;
    out!("{}", resp.token);
    err!(
        "one-time token, valid for {}; on the worker machine run:",
        humantime::format_duration(ttl)
    );
    // The token rides in the environment, where `ps` does not show it to other users.
    err!(
        "  TETHER_JOIN_TOKEN={} worker join --brain {} --ca-hash {} --name NAME",
        resp.token,
        t.url,
        resp.ca_hash
    );
    Ok(0)
}

/// `brain workers`.
async fn workers(t: &Target, json: bool) -> anyhow::Result<i32> {
    let req = proto::ListWorkersRequest {};
    let list = t.rpc(async |mut c| c.list_workers(req).await).await?;
    print_workers(&list.workers, json);
    Ok(0)
}

/// `brain machines release ID`.
async fn machine_release(t: &Target, id: String) -> anyhow::Result<i32> {
    let req = proto::ReleaseMachineRequest { id };
    let m = t
        .rpc(async |mut c| c.release_machine(req).await)
        .await?
        .machine
        .unwrap_or_default();
    out!(
        "released {} ({}, cost ${:.4}); its worker {} is revoked",
        m.id,
        m.provider,
        m.cost_usd,
        if m.worker_id.is_empty() {
            "(none joined)"
        } else {
            &m.worker_id
        }
    );
    Ok(0)
}

/// `brain machines`.
async fn machines(t: &Target, json: bool, all: bool) -> anyhow::Result<i32> {
    let req = proto::ListMachinesRequest { all };
    let list = t.rpc(async |mut c| c.list_machines(req).await).await?;
    print_machines(&list.machines, json);
    Ok(0)
}

/// `brain worker revoke` and `brain worker remove`.
async fn worker_revoke(t: &Target, worker: String, remove: bool) -> anyhow::Result<i32> {
    let req = proto::RevokeWorkerRequest { worker, remove };
    let r = t.rpc(async |mut c| c.revoke_worker(req).await).await?;
    out!(
        "{} {}{}",
        if remove { "removed" } else { "revoked" },
        r.worker_id,
        if r.session_closed {
            " (open session closed)"
        } else {
            ""
        }
    );
    Ok(0)
}

/// `brain backup FILE`: the running brain's store, streamed.
async fn backup(t: &Target, file: &std::path::Path) -> anyhow::Result<i32> {
    let mut stream = t
        .rpc(async |mut c| c.backup(proto::BackupRequest {}).await)
        .await?;
    let mut chunks = Vec::new();
    while let Some(chunk) = stream.message().await.map_err(|s| status(s, &t.url))? {
        chunks.push(chunk.data);
    }
    crate::storage::save(file, &chunks).with_context(|| format!("writing {}", file.display()))?;
    let lines: usize = chunks
        .iter()
        .map(|c| c.iter().filter(|b| **b == b'\n').count())
        .sum();
    out!("backup of {lines} records written to {}", file.display());
    Ok(0)
}

/// `brain restore FILE` into a stopped brain.
fn restore(data: &DataDir, file: &std::path::Path) -> anyhow::Result<i32> {
    let (n, moved) = crate::storage::restore(file, &data.db())?;
    out!("restored {n} records into {}", data.db().display());
    if let Some(m) = moved {
        out!("the previous store was moved to {}", m.display());
    }
    Ok(0)
}

/// `brain store copy`.
async fn store_copy(
    data: &DataDir,
    to: Option<String>,
    from: Option<String>,
    json: bool,
) -> anyhow::Result<i32> {
    let (c, way) = match (to, from) {
        (Some(url), None) => (
            crate::app::copy::to_postgres(data, &url).await?,
            "into PostgreSQL",
        ),
        (None, Some(url)) => (
            crate::app::copy::from_postgres(data, &url).await?,
            "from PostgreSQL",
        ),
        _ => anyhow::bail!("give one of --to URL and --from URL"),
    };
    if json {
        out!("{}", serde_json::to_string(&c)?);
        return Ok(0);
    }
    out!(
        "copied {} tasks ({} records), {} entries in {} trees and {} blobs {way}; read back and compared, record by record",
        c.tasks,
        c.records,
        c.entries,
        c.trees,
        c.blobs
    );
    out!(
        "every brain on that store needs this data dir's secrets key: copy {} (mode 600) or set TETHER_SECRET_KEY",
        data.path().join("secrets.key").display()
    );
    Ok(0)
}

/// `brain admin issue NAME --out DIR`.
async fn admin_issue(t: &Target, name: &str, out: &std::path::Path) -> anyhow::Result<i32> {
    let (key, csr) = pki::new_key_and_csr(name)?;
    let req = proto::IssueAdminRequest {
        name: name.to_string(),
        csr_der: csr,
    };
    let resp = t.rpc(async |mut c| c.issue_admin(req).await).await?;
    IdentityFiles {
        ca_pem: resp.ca_pem,
        cert_pem: resp.cert_pem,
        key_pem: key.serialize_pem(),
    }
    .save(out)?;
    out!(
        "admin identity {name} written to {}; use it with --identity {} --brain {}",
        out.display(),
        out.display(),
        t.url
    );
    Ok(0)
}

/// `brain admin revoke NAME`.
async fn admin_revoke(t: &Target, name: String) -> anyhow::Result<i32> {
    let req = proto::RevokeAdminRequest { name: name.clone() };
    t.rpc(async |mut c| c.revoke_admin(req).await).await?;
    out!("admin identity {name} revoked");
    Ok(0)
}

fn spawn_signal_handler(stop: CancellationToken) {
    tokio::spawn(async move {
        shared::signals::terminated().await;
        stop.cancel();
    });
}

/// SIGHUP reads the config file again, as `brain config reload` does; what came of it is
/// logged.
fn spawn_reload_on_hangup(shared: std::sync::Arc<crate::api::Shared>, stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("SIGHUP cannot be caught here: use `brain config reload`");
        return;
    };
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                got = hup.recv() => if got.is_none() { return },
            }
            if let Err(e) = shared.reload_config() {
                tracing::error!(error = %e, "config not reloaded (nothing was changed)");
            }
        }
    });
}

/// `brain config reload`.
async fn config_reload(t: &Target, json: bool) -> anyhow::Result<i32> {
    let r = match t
        .rpc(async |mut c| c.reload_config(proto::ReloadConfigRequest {}).await)
        .await
    {
        Ok(r) => r,
        Err(e) => {
            err!("error: {e:#}");
            return Ok(shared::exit::ExitCode::Config.code());
        }
    };
    if json {
        out!(
            "{}",
            serde_json::json!({"file": r.file, "applied": r.applied, "need_restart": r.need_restart})
        );
        return Ok(0);
    }
    if r.applied.is_empty() && r.need_restart.is_empty() {
        out!("{}: nothing changed", r.file);
        return Ok(0);
    }
    if !r.applied.is_empty() {
        out!(
            "{}: applied [{}] (tasks that start from now on use it; running ones keep theirs)",
            r.file,
            r.applied.join("], [")
        );
    }
    if !r.need_restart.is_empty() {
        out!(
            "changed, but applies only after a restart of brain serve: [{}]",
            r.need_restart.join("], [")
        );
    }
    Ok(0)
}

/// `tether demo`: runs the demo with workers started as `<this program> worker ...`.
pub fn run_demo(keep: bool, model: Option<String>) -> i32 {
    hold_keys_close();
    // The demo narrates on stdout; the brain's own log would only interleave with it.
    shared::telemetry::init("error");
    let worker = match crate::provision::local::WorkerProgram::beside_this_program() {
        Ok(w) => w,
        Err(e) => {
            err!("error: {e}");
            return 1;
        }
    };
    let Some(rt) = runtime() else {
        return 1;
    };
    match rt.block_on(crate::admin::demo::run(worker, keep, model)) {
        Ok(()) => 0,
        Err(e) => {
            err!("error: {e:#}");
            1
        }
    }
}
