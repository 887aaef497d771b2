//! A task's result through the admin API: the diff, stat or patch between its starting
//! workspace and its last barrier, its files, and its delivery as a branch. The work is the
//! engine's and the brain's git's; this converts and streams it in bounded pieces.

use std::sync::Arc;

use shared::manifest::{Kind, Manifest};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::Shared;
use crate::git::commit::{self, Form};
use crate::model::TaskState;
use crate::model::delivery::Mode;

/// Bytes per streamed piece.
const PIECE: usize = 1 << 20;
/// Diffs made at once, and how long one waits for its turn.
const DIFFS_AT_ONCE: usize = 4;
const DIFF_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
static DIFFS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(DIFFS_AT_ONCE);

/// The root hash of a task's workspace at `root` if its log names it (a barrier, or what it
/// was seeded with); empty `root`: the last barrier, else the seed.
pub async fn root_at(s: &Shared, task: &str, root: &str) -> Result<(TaskState, String), Status> {
    let t = s.engine.find(task)?;
    let st = t.state();
    if let Some(why) = st.attempts.as_ref().and_then(|a| a.no_result(st.id)) {
        return Err(Status::failed_precondition(why));
    }
    let last = match st.barrier_root.as_str() {
        "" => st.seed_root.clone(),
        r => r.to_string(),
    };
    if root.is_empty() || root == last || root == st.seed_root {
        let root = if root.is_empty() {
            last
        } else {
            root.to_string()
        };
        return Ok((st, root));
    }
    let log = s.engine.store().log().clone();
    let (id, want) = (t.id, root.to_string());
    let named = log.read(id, 0).await.is_ok_and(|rs| {
        rs.iter().flatten().any(|r| {
            matches!(&r.event, crate::model::Event::Barrier { root_hash, .. } if *root_hash == want)
        })
    });
    if !named {
        return Err(Status::not_found(format!(
            "task {task} never had a workspace with root {root}: see its barrier records (`brain task log {task}`)"
        )));
    }
    Ok((st, root.to_string()))
}

/// The starting workspace and the workspace at `head` (a root hash) of a task, as
/// manifests: for `--git` and `--dir` tasks what they were seeded with, else empty.
async fn ends(s: &Shared, st: &TaskState, head: &str) -> Result<(Manifest, Manifest), Status> {
    let base = st.seed_root.clone();
    let head = head.to_string();
    let m = s.mirror.clone();
    tokio::task::spawn_blocking(move || {
        let get = |root: &str| -> Result<Manifest, crate::mirror::Error> {
            if root.is_empty() {
                Ok(Manifest::default())
            } else {
                m.manifest(root)
            }
        };
        Ok::<_, crate::mirror::Error>((get(&base)?, get(&head)?))
    })
    .await
    .map_err(|e| Status::internal(e.to_string()))?
    .map_err(|e| {
        Status::failed_precondition(format!("the task's workspace is not in the mirror: {e}"))
    })
}

/// `brain task diff|patch`: the text, in pieces.
pub async fn diff(
    s: &Arc<Shared>,
    task: &str,
    form: &str,
    root: &str,
) -> Result<ReceiverStream<Result<proto::DataChunk, Status>>, Status> {
    let (st, root) = root_at(s, task, root).await?;
    let (base, head) = ends(s, &st, &root).await?;
    let settings = s.config.get().deliver.settings();
    let message = s.engine.redact(&crate::engine::commit_message(&st));
    let form = match form {
        "" | "diff" => Form::Diff,
        "stat" => Form::Stat,
        "patch" => Form::Patch {
            author: &settings.author,
            date_s: st.updated_ms / 1000,
            message: &message,
        },
        other => {
            return Err(Status::invalid_argument(format!(
                "unknown form {other:?}: diff, stat or patch"
            )));
        }
    };
    // Few diffs are made at once: each writes the changed files into a repository of its
    // own and runs git over them.
    let permit = tokio::time::timeout(DIFF_WAIT, DIFFS.acquire())
        .await
        .map_err(|_| {
            Status::resource_exhausted(format!(
                "{DIFFS_AT_ONCE} diffs are being made and none ended within {DIFF_WAIT:?}: try again shortly"
            ))
        })?
        .map_err(|e| Status::internal(e.to_string()))?;
    // Streamed from git as the reader takes it: the brain holds a few pieces, whatever the
    // diff's size, and a reader that stops (the web's cap) ends git.
    let mut pieces = commit::show_streamed(&s.mirror, &base, &head, form, PIECE)
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        let _permit = permit;
        while let Some(piece) = pieces.recv().await {
            let item = piece
                .map(|data| proto::DataChunk {
                    data,
                    ..Default::default()
                })
                .map_err(|e| Status::internal(e.to_string()));
            if tx.send(item).await.is_err() {
                return;
            }
        }
    });
    Ok(ReceiverStream::new(rx))
}

/// `brain task export`: every entry of the last barrier outside `.git/`, files' contents in
/// pieces after their entry.
/// Why an export leaves a repository out.
const LEFT_OUT: &str = "git would take it for a repository, whose config or hooks run commands as whoever runs git there";

pub async fn export(
    s: &Arc<Shared>,
    task: &str,
) -> Result<ReceiverStream<Result<proto::ExportEntry, Status>>, Status> {
    let (st, root) = root_at(s, task, "").await?;
    let (_, head) = ends(s, &st, &root).await?;
    let (tx, rx) = mpsc::channel(8);
    let mirror = s.mirror.clone();
    tokio::task::spawn_blocking(move || {
        // What git would take for a repository runs code as whoever runs git there: it is
        // left out (and so is in no diff either), and the export says so.
        let repos = crate::git::commit::repositories(&head);
        for r in &repos {
            let entry = proto::ExportEntry {
                path: r.clone(),
                kind: "left_out".into(),
                target: LEFT_OUT.into(),
                last: true,
                ..Default::default()
            };
            if r != ".git" && tx.blocking_send(Ok(entry)).is_err() {
                return;
            }
        }
        for (path, e) in head.entries() {
            if crate::git::commit::in_repository(path, &repos) {
                continue;
            }
            let kind = match e.kind {
                Kind::File => "file",
                Kind::Dir => "dir",
                Kind::Symlink => "symlink",
            };
            let entry = proto::ExportEntry {
                path: path.clone(),
                kind: kind.into(),
                exec: e.exec,
                target: e.target.clone(),
                size: e.size,
                last: e.kind != Kind::File,
                data: vec![],
            };
            if tx.blocking_send(Ok(entry)).is_err() {
                return;
            }
            if e.kind != Kind::File {
                continue;
            }
            let data = match mirror.get(&e.hash) {
                Ok(d) => d,
                Err(err) => {
                    let _ = tx.blocking_send(Err(Status::internal(format!("{path}: {err}"))));
                    return;
                }
            };
            let mut pieces = data.chunks(PIECE).peekable();
            if pieces.peek().is_none() {
                let _ = tx.blocking_send(Ok(proto::ExportEntry {
                    path: path.clone(),
                    last: true,
                    ..Default::default()
                }));
                continue;
            }
            while let Some(p) = pieces.next() {
                let last = pieces.peek().is_none();
                if tx
                    .blocking_send(Ok(proto::ExportEntry {
                        path: path.clone(),
                        data: p.to_vec(),
                        last,
                        ..Default::default()
                    }))
                    .is_err()
                {
                    return;
                }
            }
        }
    });
    Ok(ReceiverStream::new(rx))
}

/// `brain task deliver`.
pub async fn deliver(
    s: &Arc<Shared>,
    task: &str,
    pull_request: bool,
) -> Result<proto::DeliverTaskResponse, Status> {
    let mode = if pull_request { Mode::Pr } else { Mode::Branch };
    let d = s.engine.deliver(task, mode).await?;
    Ok(proto::DeliverTaskResponse {
        branch: d.branch,
        commit: d.commit,
        pull_request_url: d.pr_url,
        wip: d.wip,
    })
}
