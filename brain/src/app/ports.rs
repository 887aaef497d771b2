//! The engine's ports over the real components: workers through the hub, placement through
//! the fleet's rule, environments through the machines, git imports into the mirror and
//! deliveries through the brain's own git. Thin:
//! each converts between domain and wire types (through `api::convert`) and forwards.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::ports::{
    CallError, CommitRequest, Delivery, Environments, Imported, OutputSink, Picked, Placement,
    PortError, PullRequestSpec, Workers, Workspaces,
};
use crate::fleet::hub::{self, Durable, Hub};
use crate::fleet::placement;
use crate::git::{self, Repos, Settings};
use crate::mirror::Mirror;
use crate::model::delivery::{Mode, Origin};
use crate::model::env::{EnvRequest, Grant, Quote};
use crate::model::event::SyncRules;
use crate::model::ops::{Command, CommandEnd, FileAnswer, FileOp, OutputChunk, SyncOp, SyncReport};
use crate::provision::Machines;

impl From<hub::Error> for CallError {
    fn from(e: hub::Error) -> Self {
        match e {
            hub::Error::NotConnected(w) => CallError::NotConnected(w),
            hub::Error::Lost(w) => CallError::Lost(w),
            hub::Error::Timeout { worker, timeout } => CallError::Timeout { worker, timeout },
            e @ hub::Error::Malformed { .. } => CallError::Other(e.to_string()),
        }
    }
}

/// A placement refusal as the engine's port passes it on.
fn unplaceable(e: impl std::fmt::Display) -> PortError {
    PortError::Unplaceable(e.to_string())
}

/// A failure of the brain's git or mirror as the engine's port passes it on.
fn git_failed(e: impl std::fmt::Display) -> PortError {
    PortError::Git(e.to_string())
}

/// A failure of the forge's API as the engine's port passes it on.
fn forge_failed(e: impl std::fmt::Display) -> PortError {
    PortError::Forge(e.to_string())
}

#[async_trait::async_trait]
impl Workers for Hub {
    fn is_connected(&self, worker: &str) -> bool {
        Hub::is_connected(self, worker)
    }

    async fn wait_connected(&self, worker: &str, wait: Duration) -> bool {
        Hub::wait_connected(self, worker, wait).await.is_some()
    }

    async fn run_durable(
        &self,
        worker: &str,
        cmd: Command,
        wait: Duration,
        output: OutputSink,
    ) -> CommandEnd {
        let call_id = cmd.call_id;
        self.watch(
            call_id,
            Arc::new(move |o: proto::ExecOutput| output(OutputChunk::from(o))),
        );
        let r = self.durable_exec(worker, cmd.into(), wait).await;
        self.unwatch(call_id);
        match r {
            Durable::Done(r) => r.into(),
            Durable::WorkerGone => CommandEnd::WorkerGone,
        }
    }

    fn cancel(&self, worker: &str, call_id: u64) {
        if let Some(s) = self.session(worker) {
            s.try_send(proto::brain_message::Msg::Cancel(proto::Cancel { call_id }));
        }
    }

    fn ack(&self, worker: &str, call_id: u64) {
        Hub::ack(self, worker, call_id)
    }

    async fn file(
        &self,
        worker: &str,
        workspace: &str,
        op: FileOp,
        timeout: Duration,
    ) -> Result<FileAnswer, CallError> {
        let call = proto::FileCall {
            call_id: 0,
            workspace: workspace.to_string(),
            op: Some(op.into()),
        };
        Ok(Hub::file(self, worker, call, timeout).await?.into())
    }

    async fn sync(
        &self,
        worker: &str,
        workspace: &str,
        op: SyncOp,
        rules: &SyncRules,
        full_scan: bool,
        timeout: Duration,
    ) -> Result<SyncReport, CallError> {
        Ok(Hub::sync(
            self,
            worker,
            workspace,
            op.into(),
            rules,
            full_scan,
            timeout,
        )
        .await?
        .into())
    }
}

impl Placement for placement::Placement {
    fn named(&self, named: &str, labels: &placement::Labels) -> Result<Picked, PortError> {
        placement::Placement::named(self, named, labels)
            .map(|w| Picked {
                id: w.id,
                name: w.name,
            })
            .map_err(unplaceable)
    }

    fn check(&self, labels: &placement::Labels) -> Result<(), PortError> {
        placement::Placement::check(self, labels).map_err(unplaceable)
    }

    fn place(&self, task: u64, labels: &placement::Labels) -> Result<String, PortError> {
        placement::Placement::place(self, task, labels).map_err(unplaceable)
    }

    fn place_apart(
        &self,
        task: u64,
        labels: &placement::Labels,
        apart: &[String],
    ) -> Result<String, PortError> {
        placement::Placement::place_apart(self, task, labels, apart).map_err(unplaceable)
    }

    fn enqueue(
        &self,
        task: u64,
        labels: &placement::Labels,
    ) -> tokio::sync::oneshot::Receiver<String> {
        placement::Placement::enqueue(self, task, labels)
    }

    fn move_target(
        &self,
        task: u64,
        current: &str,
        labels: &placement::Labels,
    ) -> Result<String, PortError> {
        placement::Placement::move_target(self, task, current, labels).map_err(unplaceable)
    }

    fn failover(&self, task: u64, lost: &str, labels: &placement::Labels) -> Option<String> {
        placement::Placement::failover(self, task, lost, labels)
    }

    fn occupy(&self, task: u64, now: Option<crate::model::ops::Occupancy>) {
        placement::Placement::occupy(self, task, now)
    }
}

#[async_trait::async_trait]
impl Environments for Machines {
    fn quote(&self, task: &str, current: &str, req: &EnvRequest) -> Quote {
        Machines::quote(self, task, current, req)
    }

    async fn obtain(
        &self,
        task: &str,
        current: &str,
        req: &EnvRequest,
        budget_left: Option<f64>,
    ) -> Result<Grant, PortError> {
        Machines::obtain(self, task, current, req, budget_left)
            .await
            .map_err(|e| PortError::NoMachine(e.to_string()))
    }

    async fn release_if_ours(&self, worker: &str, task: &str) -> Option<String> {
        Machines::release_if_ours(self, worker, task).await
    }

    async fn release_for_task(&self, task: &str) -> Vec<String> {
        Machines::release_for_task(self, task).await
    }

    fn task_cost(&self, task: &str) -> f64 {
        Machines::task_cost(self, task)
    }

    fn available(&self, current: &str) -> bool {
        Machines::available(self, current)
    }
}

/// The mirror and the brain's own git: imports, and deliveries of what the mirror holds.
#[derive(Clone)]
pub struct GitPort {
    pub mirror: Mirror,
    pub repos: Repos,
    pub settings: Arc<Settings>,
}

impl GitPort {
    /// The git directory kept for deliveries of `origin`'s commit. Where this brain holds
    /// none (another replica sharing the store imported the task; or it was removed), the
    /// commit is fetched again from the task's URL.
    async fn git_dir(&self, origin: &Origin) -> Result<std::path::PathBuf, PortError> {
        let git_dir = self.repos.path(&origin.commit).map_err(git_failed)?;
        if git_dir.is_dir() {
            return Ok(git_dir);
        }
        tracing::info!(commit = %origin.commit, "the imported commit's git objects are not here: fetching it again from the task's origin");
        git::import::fetch_commit(
            &self.repos,
            &origin.url,
            &origin.commit,
            &self.settings.creds,
            &self.settings.remotes,
        )
        .await
        .map_err(|e| PortError::ObjectsGone {
            commit: origin.commit.clone(),
            at: git_dir,
            why: e.to_string(),
        })
    }
}

#[async_trait::async_trait]
impl Delivery for GitPort {
    fn default_mode(&self) -> Mode {
        self.settings.mode
    }

    fn branch_prefix(&self) -> String {
        self.settings.branch_prefix.clone()
    }

    async fn commit(&self, req: &CommitRequest) -> Result<String, PortError> {
        let git_dir = self.git_dir(&req.origin).await?;
        let (m, base, root) = (self.mirror.clone(), req.base_root.clone(), req.root.clone());
        let (base, head) = tokio::task::spawn_blocking(move || {
            Ok::<_, crate::mirror::Error>((m.manifest(&base)?, m.manifest(&root)?))
        })
        .await
        .map_err(git_failed)?
        .map_err(git_failed)?;
        git::commit::commit(
            &self.mirror,
            &git::commit::Spec {
                git_dir: &git_dir,
                parent: &req.origin.commit,
                base: &base,
                head: &head,
                author: &self.settings.author,
                date_s: req.date_s,
                message: &req.message,
            },
        )
        .await
        .map_err(git_failed)
    }

    async fn push(&self, origin: &Origin, commit: &str, branch: &str) -> Result<(), PortError> {
        let git_dir = self.git_dir(origin).await?;
        let refspec = format!("+{commit}:refs/heads/{branch}");
        let checked = self
            .settings
            .remotes
            .check(&origin.url)
            .await
            .map_err(git_failed)?;
        git::Git::remote(
            &[
                "push",
                "--quiet",
                "--no-verify",
                "--",
                &origin.url,
                &refspec,
            ],
            &self.settings.creds,
            &checked,
        )
        .env("GIT_DIR", &git_dir)
        .run()
        .await
        .map(|_| ())
        .map_err(git_failed)
    }

    async fn open_pull_request(&self, pr: &PullRequestSpec) -> Result<(String, u64), PortError> {
        let (owner, repo) = git::github::repo_of(&pr.origin_url)
            .ok_or_else(|| PortError::NotGithub(pr.origin_url.clone()))?;
        let gh = git::github::Github::new(&self.settings.github_api, &self.settings.github_token)
            .map_err(forge_failed)?;
        gh.open(&git::github::Open {
            owner: &owner,
            repo: &repo,
            head: &pr.head,
            base: &pr.base,
            title: &pr.title,
            body: &pr.body,
            draft: self.settings.draft,
        })
        .await
        .map(|p| (p.url, p.number))
        .map_err(forge_failed)
    }
}

#[async_trait::async_trait]
impl Workspaces for GitPort {
    async fn import_git(
        &self,
        url: &str,
        git_ref: &str,
        rules: &SyncRules,
    ) -> Result<Imported, PortError> {
        let i = git::import::from_git(
            &self.mirror,
            &self.repos,
            url,
            git_ref,
            rules.to_rules(),
            &self.settings.creds,
            &self.settings.remotes,
        )
        .await
        .map_err(git_failed)?;
        Ok(Imported {
            root_hash: i.root_hash,
            files: i.files,
            bytes: i.bytes,
            commit: i.commit,
            branch: i.branch,
            url: i.url,
        })
    }

    async fn read_file(&self, root: &str, path: &str, max: u64) -> Option<Vec<u8>> {
        let (m, root, path) = (self.mirror.clone(), root.to_string(), path.to_string());
        tokio::task::spawn_blocking(move || {
            let manifest = m.manifest_shared(&root).ok()?;
            let e = manifest.entries().get(&path)?;
            (e.kind == shared::manifest::Kind::File && e.size <= max)
                .then(|| m.get(&e.hash).ok())
                .flatten()
        })
        .await
        .ok()
        .flatten()
    }

    async fn list_files(&self, root: &str) -> Vec<(String, bool)> {
        let (m, root) = (self.mirror.clone(), root.to_string());
        tokio::task::spawn_blocking(move || {
            m.manifest_shared(&root)
                .map(|manifest| {
                    manifest
                        .entries()
                        .iter()
                        .filter(|(_, e)| e.kind == shared::manifest::Kind::File)
                        .map(|(p, e)| (p.clone(), e.exec))
                        .collect()
                })
                .unwrap_or_default()
        })
        .await
        .unwrap_or_default()
    }

    async fn changed_files(&self, from: &str, to: &str) -> Vec<(String, Option<bool>)> {
        use shared::manifest::{Entry, Kind};
        let (m, from, to) = (self.mirror.clone(), from.to_string(), to.to_string());
        tokio::task::spawn_blocking(move || {
            let (Ok(a), Ok(b)) = (m.manifest_shared(&from), m.manifest_shared(&to)) else {
                return vec![];
            };
            let file = |e: &Entry| (e.kind == Kind::File).then(|| (e.hash.clone(), e.exec));
            let (a, b) = (a.entries(), b.entries());
            let paths: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            paths
                .into_iter()
                .filter_map(|p| {
                    let (x, y) = (a.get(p).and_then(file), b.get(p).and_then(file));
                    (x != y).then(|| (p.clone(), x.map(|(_, exec)| exec)))
                })
                .collect()
        })
        .await
        .unwrap_or_default()
    }

    async fn diff_size(&self, from: &str, to: &str) -> Result<(u64, u64), PortError> {
        if from == to {
            return Ok((0, 0));
        }
        let (m, from, to) = (self.mirror.clone(), from.to_string(), to.to_string());
        let (a, b) = tokio::task::spawn_blocking(move || {
            let get = |root: &str| {
                if root.is_empty() {
                    Ok(shared::manifest::Manifest::default())
                } else {
                    m.manifest(root)
                }
            };
            Ok::<_, crate::mirror::Error>((get(&from)?, get(&to)?))
        })
        .await
        .map_err(git_failed)?
        .map_err(git_failed)?;
        let out = crate::git::commit::show(&self.mirror, &a, &b, crate::git::commit::Form::NumStat)
            .await
            .map_err(git_failed)?;
        Ok(crate::git::commit::numstat_size(&String::from_utf8_lossy(
            &out,
        )))
    }
}

/// The engine's [`crate::engine::core::EgressKeys`]: placeholders and grants keyed by the
/// secrets store, the egress CA's certificate.
pub struct EgressKeysPort {
    pub secrets: crate::trust::secrets::Secrets,
    pub ca_pem: String,
    pub pinned: Vec<(String, std::net::IpAddr)>,
}

impl crate::engine::core::EgressKeys for EgressKeysPort {
    fn placeholder(&self, task: &str, secret: &str) -> String {
        self.secrets.placeholder(task, secret)
    }
    fn grant(&self, task: &str, call_id: u64) -> String {
        self.secrets.tag(&["egress", task, &call_id.to_string()])
    }
    fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }
    fn pinned(&self) -> Vec<(String, std::net::IpAddr)> {
        self.pinned.clone()
    }
}
