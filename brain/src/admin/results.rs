//! `brain task diff|patch|export|deliver`: a task's result on the admin's side: text to
//! stdout, files written under a directory (each path checked, nothing outside it), the
//! delivery's branch and pull request in words or `--json`.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail};

use super::client::{Target, status};

/// Writes the diff (`form`: diff, stat or patch) of the workspace at `root` (empty: the last
/// barrier) to stdout as it arrives.
pub async fn diff(target: &Target, task: &str, form: &str, root: &str) -> anyhow::Result<i32> {
    let mut stream = target
        .rpc(async |mut c| {
            c.task_diff(proto::TaskDiffRequest {
                task_id: task.into(),
                form: form.into(),
                root: root.into(),
            })
            .await
        })
        .await?;
    let mut out = std::io::stdout().lock();
    // On a terminal the diff is for a person: a file's control characters are written out,
    // not obeyed. Into a pipe it stays byte for byte what `git apply` takes.
    let mut shown =
        std::io::IsTerminal::is_terminal(&out).then(shared::visible::VisibleStream::default);
    while let Some(piece) = stream.message().await.map_err(|s| status(s, &target.url))? {
        let written = match &mut shown {
            Some(v) => out.write_all(v.push(&piece.data).as_bytes()),
            None => out.write_all(&piece.data),
        };
        if written.is_err() {
            // The reader went away (`| head`): quietly, as a pipe expects.
            std::process::exit(shared::stdout::CLOSED_PIPE);
        }
    }
    if let Some(v) = &mut shown
        && out.write_all(v.finish().as_bytes()).is_err()
    {
        std::process::exit(shared::stdout::CLOSED_PIPE);
    }
    if out.flush().is_err() {
        std::process::exit(shared::stdout::CLOSED_PIPE);
    }
    Ok(0)
}

/// Writes the task's last barrier into `dir` (created; it must be empty if it exists).
pub async fn export(target: &Target, task: &str, dir: &Path) -> anyhow::Result<i32> {
    if dir.exists() {
        let mut entries =
            std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "{} is not empty: export into a new or empty directory, so nothing of yours is overwritten",
                dir.display()
            );
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let root = dir
        .canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))?;
    let mut stream = target
        .rpc(async |mut c| {
            c.export_task(proto::ExportTaskRequest {
                task_id: task.into(),
            })
            .await
        })
        .await?;
    let (mut files, mut bytes) = (0u64, 0u64);
    // What the brain did not export, and why.
    let mut left_out: Vec<(String, String)> = Vec::new();
    // The file being received: its path, exec bit and content so far.
    let mut open: Option<(String, bool, Vec<u8>)> = None;
    while let Some(e) = stream.message().await.map_err(|s| status(s, &target.url))? {
        if let Some((path, exec, mut data)) = open.take() {
            if e.path != path || !e.kind.is_empty() {
                bail!("the brain's export broke off in {path}");
            }
            data.extend_from_slice(&e.data);
            if e.last {
                write_file(&root, &path, exec, &data)?;
                files += 1;
                bytes += data.len() as u64;
            } else {
                open = Some((path, exec, data));
            }
            continue;
        }
        match e.kind.as_str() {
            "dir" => {
                let p = shared::paths::confine(&root, &e.path)
                    .with_context(|| format!("the export names {:?}", e.path))?;
                std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
            }
            "symlink" => {
                let (parent, name) = shared::paths::confine_parent(&root, &e.path)
                    .with_context(|| format!("the export names {:?}", e.path))?;
                std::os::unix::fs::symlink(&e.target, parent.join(name))
                    .with_context(|| format!("creating the link {}", e.path))?;
            }
            "file" if e.last => {
                write_file(&root, &e.path, e.exec, &e.data)?;
                files += 1;
                bytes += e.data.len() as u64;
            }
            "file" => open = Some((e.path, e.exec, e.data)),
            "left_out" => left_out.push((e.path, e.target)),
            other => bail!(
                "the export has an entry {:?} of unknown kind {other:?}",
                e.path
            ),
        }
    }
    if let Some((path, ..)) = open {
        bail!("the brain's export ended in the middle of {path}");
    }
    err!(
        "exported {files} files ({}) of {task} to {}",
        shared::human_bytes(bytes),
        dir.display()
    );
    for (path, why) in &left_out {
        err!("  left out {path}: {why}");
    }
    Ok(0)
}

fn write_file(root: &Path, path: &str, exec: bool, data: &[u8]) -> anyhow::Result<()> {
    let (parent, name) = shared::paths::confine_parent(root, path)
        .with_context(|| format!("the export names {path:?}"))?;
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    shared::fsio::write_atomic(
        &parent.join(name),
        data,
        if exec { 0o755 } else { 0o644 },
        shared::fsio::Durability::Deferred,
    )
    .with_context(|| format!("writing {path}"))
}

/// After `brain run` saw its task finish: waits for the delivery the task owes (if it owes
/// one; at most ten minutes) and says how it went. False: it failed.
pub async fn wait_delivery(target: &Target, task: &str) -> anyhow::Result<bool> {
    let mut c = target.connect().await?;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(600);
    let progress = super::progress::Progress::start(format!("delivering {task}"), false);
    loop {
        let list = c
            .list_tasks(proto::ListTasksRequest {})
            .await
            .map_err(|s| status(s, &target.url))?
            .into_inner();
        let Some(t) = list.tasks.into_iter().find(|t| t.id == task) else {
            return Ok(true);
        };
        if t.origin.is_empty() || (t.deliver == "none" && t.delivery.is_empty()) {
            return Ok(true);
        }
        if !t.delivery.is_empty()
            && !t.delivery.contains("in progress")
            && !t.delivery.contains("pending")
        {
            progress.done().await;
            out!("delivery: {}", t.delivery);
            return Ok(!t.delivery.starts_with("failed"));
        }
        if !t.delivery.is_empty() {
            progress.set(format!("delivering {task}: {}", t.delivery));
        }
        if tokio::time::Instant::now() > deadline {
            progress.done().await;
            err!("the delivery goes on: see `brain task show {task}`");
            return Ok(true);
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
}

/// Delivers the task and says where it went.
pub async fn deliver(target: &Target, task: &str, pr: bool, json: bool) -> anyhow::Result<i32> {
    let mut c = target.connect().await?;
    let progress = super::progress::Progress::start(
        format!(
            "delivering {task}: committing and pushing its branch{}",
            if pr {
                ", then opening a pull request"
            } else {
                ""
            }
        ),
        json,
    );
    let r = c
        .deliver_task(proto::DeliverTaskRequest {
            task_id: task.into(),
            pull_request: pr,
        })
        .await;
    progress.done().await;
    let r = r.map_err(|s| status(s, &target.url))?.into_inner();
    if json {
        out!(
            "{}",
            serde_json::json!({
                "branch": r.branch, "commit": r.commit,
                "pull_request_url": r.pull_request_url, "wip": r.wip,
            })
        );
        return Ok(0);
    }
    out!(
        "{task} delivered as branch {} at {}{}",
        r.branch,
        &r.commit[..r.commit.len().min(12)],
        if r.wip {
            " (work in progress: the task had not finished)"
        } else {
            ""
        }
    );
    if !r.pull_request_url.is_empty() {
        out!("pull request: {}", r.pull_request_url);
    }
    Ok(0)
}
