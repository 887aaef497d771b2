//! Task routes: list (with filters), show, create, approve, deny, cancel, move, resume,
//! deliver, and the workspace at any barrier its log names (tree, a file, the diff against
//! the base).

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use proto::admin_server::Admin;
use serde::Deserialize;
use tokio_stream::StreamExt;

use super::auth::Authed;
use super::extract::{Answer, Body, Params, request, within};
use super::{ApiError, Web};

/// Largest file shown by `/files/content`.
const MAX_FILE_SHOWN: u64 = 4 * 1024 * 1024;

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct TaskFilter {
    /// A status (`running`, `waiting`, `finished`, `budget_exhausted`, ...), or `active`
    /// for every task that has not ended.
    pub status: String,
    /// Worker id or name.
    pub worker: String,
    /// verified, unverified, failing, pending.
    pub verification: String,
    /// Text the goal contains (case-insensitive).
    pub q: String,
    /// At most this many, newest first (0: all).
    pub limit: usize,
}

fn matches(f: &TaskFilter, t: &proto::TaskSummary) -> bool {
    let status_ok = match f.status.as_str() {
        "" => true,
        "active" => !matches!(
            t.status.as_str(),
            "finished" | "failed" | "cancelled" | "stuck" | "stalled"
        ),
        s => t.status == s,
    };
    status_ok
        && (f.worker.is_empty() || t.worker == f.worker)
        && (f.verification.is_empty() || t.verification == f.verification)
        && (f.q.is_empty() || t.goal.to_lowercase().contains(&f.q.to_lowercase()))
}

pub(super) async fn list_tasks(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Params(f): Params<TaskFilter>,
) -> Answer<proto::ListTasksResponse> {
    let mut r = within(web.services.list_tasks(request(
        &a,
        "Admin/ListTasks",
        proto::ListTasksRequest {},
    )?))
    .await?;
    r.tasks.retain(|t| matches(&f, t));
    r.tasks.reverse();
    if f.limit > 0 {
        r.tasks.truncate(f.limit);
    }
    Ok(Json(r))
}

pub(super) async fn show_task(
    State(web): State<Web>,
    Extension(_): Extension<Authed>,
    Path(id): Path<String>,
) -> Answer<proto::TaskSummary> {
    let task = web.shared().engine.find(&id).map_err(tonic::Status::from)?;
    Ok(Json(crate::api::convert::summary_in(
        &web.shared().engine,
        task.state(),
    )))
}

pub(super) async fn create_task(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Body(req): Body<proto::RunAgentRequest>,
) -> Result<(StatusCode, Json<proto::RunPlanResponse>), ApiError> {
    let r = within(web.services.run_agent(request(&a, "Admin/RunAgent", req)?)).await?;
    Ok((StatusCode::CREATED, Json(r)))
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Reason {
    pub reason: String,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct ApproveHow {
    /// The same command in the same directory (or any change to the same file) is approved
    /// for the rest of the task, not asked again.
    pub always: bool,
}

pub(super) async fn approve(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
    Body(b): Body<ApproveHow>,
) -> Answer<proto::DecideResponse> {
    let req = proto::DecideRequest {
        task_id: id,
        approve: true,
        always: b.always,
        ..Default::default()
    };
    Ok(Json(
        within(web.services.decide(request(&a, "Admin/Decide", req)?)).await?,
    ))
}

pub(super) async fn deny(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
    Body(b): Body<Reason>,
) -> Answer<proto::DecideResponse> {
    let req = proto::DecideRequest {
        task_id: id,
        approve: false,
        reason: b.reason.chars().take(4096).collect(),
        always: false,
    };
    Ok(Json(
        within(web.services.decide(request(&a, "Admin/Decide", req)?)).await?,
    ))
}

pub(super) async fn cancel(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
) -> Answer<proto::CancelTaskResponse> {
    let req = proto::CancelTaskRequest { task_id: id };
    Ok(Json(
        within(
            web.services
                .cancel_task(request(&a, "Admin/CancelTask", req)?),
        )
        .await?,
    ))
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct MoveTo {
    /// Worker id or name.
    pub to: String,
}

pub(super) async fn move_task(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
    Body(b): Body<MoveTo>,
) -> Answer<proto::MoveTaskResponse> {
    let req = proto::MoveTaskRequest {
        task_id: id,
        to: b.to,
    };
    Ok(Json(
        within(web.services.move_task(request(&a, "Admin/MoveTask", req)?)).await?,
    ))
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct MoreBudget {
    pub budget: proto::Budget,
}

pub(super) async fn resume(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
    Body(b): Body<MoreBudget>,
) -> Answer<proto::ResumeTaskResponse> {
    let req = proto::ResumeTaskRequest {
        task_id: id,
        budget: Some(b.budget),
    };
    Ok(Json(
        within(
            web.services
                .resume_task(request(&a, "Admin/ResumeTask", req)?),
        )
        .await?,
    ))
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct DeliverHow {
    pub pull_request: bool,
}

pub(super) async fn deliver(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
    Body(b): Body<DeliverHow>,
) -> Answer<proto::DeliverTaskResponse> {
    let req = proto::DeliverTaskRequest {
        task_id: id,
        pull_request: b.pull_request,
    };
    Ok(Json(
        within(
            web.services
                .deliver_task(request(&a, "Admin/DeliverTask", req)?),
        )
        .await?,
    ))
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct DiffForm {
    /// diff (default), stat or patch.
    pub form: String,
    /// The workspace at this root hash (a barrier the task's log names); empty: the last.
    pub root: String,
}

/// The header that says how many bytes of a diff the API answers at most.
const DIFF_LIMIT_HEADER: &str = "x-tether-diff-limit";

/// The workspace against its base, as text, streamed as it comes and cut at `[web]
/// max_diff_bytes` (said in the `X-Tether-Diff-Limit` header; a cut diff's last line says so).
pub(super) async fn diff(
    State(web): State<Web>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
    Params(f): Params<DiffForm>,
) -> Result<Response, ApiError> {
    let req = proto::TaskDiffRequest {
        task_id: id.clone(),
        form: f.form,
        root: f.root,
    };
    let pieces = within(web.services.task_diff(request(&a, "Admin/TaskDiff", req)?)).await?;
    let cap = web.opts.max_diff_bytes;
    let pieces = pieces.map(|p| p.map(|p| p.data));
    let body = capped(pieces, cap, cut_line(cap, &id));
    Ok((
        [
            (
                header::CONTENT_TYPE,
                "text/plain; charset=utf-8".to_string(),
            ),
            (
                axum::http::HeaderName::from_static(DIFF_LIMIT_HEADER),
                cap.to_string(),
            ),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response())
}

/// The last line of a diff cut at `cap` bytes.
fn cut_line(cap: u64, id: &str) -> String {
    format!(
        "[tether: the diff is cut at {cap} bytes, the most the web API answers ([web] max_diff_bytes); `brain task diff {id}` shows all of it]\n"
    )
}

/// `pieces` as they come, up to `cap` bytes; past it, what fits up to its last line break,
/// then `cut` (on a line of its own), and the rest is not read. An error ends the answer
/// (the client sees it cut short).
fn capped(
    pieces: impl futures_util::Stream<Item = Result<Vec<u8>, tonic::Status>> + Send + Unpin + 'static,
    cap: u64,
    cut: String,
) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> + Send + 'static {
    // The state: the pieces, bytes sent, whether the last byte sent ends a line, done.
    futures_util::stream::unfold(
        (pieces, 0u64, true, false),
        move |(mut pieces, sent, at_line, done)| {
            let cut = cut.clone();
            async move {
                if done {
                    return None;
                }
                let piece = match pieces.next().await? {
                    Ok(p) => p,
                    Err(e) => {
                        let e = std::io::Error::other(format!("the diff failed: {}", e.message()));
                        return Some((Err(e), (pieces, sent, at_line, true)));
                    }
                };
                let room = cap - sent;
                if (piece.len() as u64) <= room {
                    let at_line = piece.last().map_or(at_line, |b| *b == b'\n');
                    let sent = sent + piece.len() as u64;
                    return Some((Ok(piece), (pieces, sent, at_line, false)));
                }
                let fits = &piece[..room as usize];
                // Whole lines only, unless not even one line fits.
                let mut last = match memchr::memrchr(b'\n', fits) {
                    Some(i) => fits[..=i].to_vec(),
                    None if sent == 0 => fits.to_vec(),
                    None => Vec::new(),
                };
                let ends_line = last.last().map_or(at_line, |b| *b == b'\n');
                if !ends_line {
                    last.push(b'\n');
                }
                last.extend_from_slice(cut.as_bytes());
                Some((Ok(last), (pieces, cap, true, true)))
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn cut(pieces: &[&str], cap: u64) -> String {
        let pieces: Vec<Result<Vec<u8>, tonic::Status>> =
            pieces.iter().map(|p| Ok(p.as_bytes().to_vec())).collect();
        let out: Vec<_> = capped(futures_util::stream::iter(pieces), cap, "CUT\n".into())
            .collect()
            .await;
        let out: Vec<u8> = out.into_iter().flat_map(|p| p.unwrap()).collect();
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn a_diff_past_its_cap_is_cut_at_a_line_and_says_so() {
        assert_eq!(
            cut(&["a\nb\n", "c\n"], 100).await,
            "a\nb\nc\n",
            "under the cap: whole"
        );
        assert_eq!(
            cut(&["a\nb\n", "c\n"], 6).await,
            "a\nb\nc\n",
            "at the cap: whole"
        );
        assert_eq!(cut(&["a\nbb\n", "c\n"], 4).await, "a\nCUT\n");
        assert_eq!(cut(&["a\n", "bbbb\n"], 4).await, "a\nCUT\n");
        // One line longer than the cap: what fits, on a line of its own.
        assert_eq!(cut(&["abcdef"], 3).await, "abc\nCUT\n");
        // The cut line is on a line of its own whatever came before it.
        assert_eq!(cut(&["abc", "def\n"], 3).await, "abc\nCUT\n");
        assert_eq!(cut(&["ab", "cdef"], 4).await, "ab\nCUT\n");
        // Nothing after the cut is read.
        let out = cut(&["aaaa\n", "b\n", "c\n"], 5).await;
        assert_eq!(out, "aaaa\nCUT\n");
    }
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct At {
    /// A root hash the task's log names (a barrier, or its starting workspace); empty: the
    /// last barrier.
    pub root: String,
    /// For `content`: the file's path.
    pub path: String,
}

#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct TreeEntry {
    pub path: String,
    /// file, dir or symlink.
    pub kind: &'static str,
    /// A 64-bit integer: a decimal string, as every one in the API.
    #[serde(with = "proto::json64")]
    #[schemars(with = "proto::json64::Int64")]
    pub size: u64,
    pub exec: bool,
    pub target: String,
}

#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct Tree {
    pub root: String,
    pub entries: Vec<TreeEntry>,
}

/// The manifest at `root` if the task's log names it (empty: the last barrier).
pub(super) async fn manifest_at(
    web: &Web,
    id: &str,
    root: &str,
) -> Result<(String, shared::manifest::Manifest), ApiError> {
    let (_, root) = crate::api::results::root_at(web.shared(), id, root).await?;
    if root.is_empty() {
        return Ok((root, shared::manifest::Manifest::default()));
    }
    let m = web.shared().mirror.clone();
    let r = root.clone();
    let manifest = tokio::task::spawn_blocking(move || m.manifest(&r))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map_err(tonic::Status::from)?;
    Ok((root, manifest))
}

/// The file tree of a task's workspace at a barrier.
pub(super) async fn files(
    State(web): State<Web>,
    Extension(_): Extension<Authed>,
    Path(id): Path<String>,
    Params(at): Params<At>,
) -> Answer<Tree> {
    use shared::manifest::Kind as K;
    let (root, m) = manifest_at(&web, &id, &at.root).await?;
    let entries = m
        .entries()
        .iter()
        .map(|(path, e)| TreeEntry {
            path: path.clone(),
            kind: match e.kind {
                K::File => "file",
                K::Dir => "dir",
                K::Symlink => "symlink",
            },
            size: e.size,
            exec: e.exec,
            target: e.target.clone(),
        })
        .collect();
    Ok(Json(Tree { root, entries }))
}

/// One file's content at a barrier, as bytes (`application/octet-stream`: a browser shows it
/// as text it builds itself, never as a page).
pub(super) async fn file_content(
    State(web): State<Web>,
    Extension(_): Extension<Authed>,
    Path(id): Path<String>,
    Params(at): Params<At>,
) -> Result<Response, ApiError> {
    let (_, m) = manifest_at(&web, &id, &at.root).await?;
    let Some(e) = m.entries().get(&at.path) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no file {:?} in that workspace: see /files", at.path),
        ));
    };
    if e.kind != shared::manifest::Kind::File {
        return Err(ApiError::bad_request(format!(
            "{:?} is not a file",
            at.path
        )));
    }
    if e.size > MAX_FILE_SHOWN {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "{:?} is {} bytes, over the {} shown here: use `brain task export`",
                at.path, e.size, MAX_FILE_SHOWN
            ),
        ));
    }
    let (mirror, hash) = (web.shared().mirror.clone(), e.hash.clone());
    let data = tokio::task::spawn_blocking(move || mirror.get(&hash))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map_err(tonic::Status::from)?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response())
}
