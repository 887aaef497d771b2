//! A worker that turns hostile: it holds a real worker identity, answers the brain's session
//! as a worker would, and then answers a barrier with bad workspace data over the real `Sync`
//! service. Every bad upload is refused with an error naming the path, and nothing of it
//! reaches the mirror or the task's log. A symlink pointing anywhere is data and is accepted;
//! a write through it, in the same delta or a later one, is refused.

use std::time::Duration;
use testkit::peak_rss;

use proto::sync_client::SyncClient;
use proto::worker_session_client::WorkerSessionClient;
use proto::{BlobChunk, BrainMessage, DeltaChunk, WorkerMessage, brain_message, worker_message};
use serde_json::{Value, json};
use shared::manifest;
use shared::pki::IdentityFiles;
use shared::tls::{BrainAddr, DialOptions};
use testkit::Cluster;
use tokio::sync::mpsc::Sender;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

fn file_entry(content: &[u8]) -> Value {
    json!({"kind": "file", "size": content.len(), "hash": manifest::hash(content)})
}

/// (what, delta JSON, claimed root, text the refusal must contain).
fn hostile_deltas() -> Vec<(&'static str, Value, String, &'static str)> {
    let evil = file_entry(b"evil");
    let real = |entries: Value| -> String {
        serde_json::from_value::<manifest::Manifest>(json!({ "entries": entries }))
            .map(|m| m.root_hash())
            .unwrap_or_default()
    };
    let d = |upserts: Value| json!({"upserts": upserts, "deletes": []});
    vec![
        (
            "absolute path",
            d(json!({"/etc/passwd": evil})),
            String::new(),
            "/etc/passwd",
        ),
        (
            "dot-dot",
            d(json!({"../escape": evil})),
            String::new(),
            "../escape",
        ),
        ("NUL", d(json!({"a\u{0}b": evil})), String::new(), "NUL"),
        (
            "control character",
            d(json!({"a\nb": evil})),
            String::new(),
            "control",
        ),
        (
            "under .git/",
            d(json!({".git/hooks/pre-commit": evil})),
            String::new(),
            ".git/hooks/pre-commit",
        ),
        (
            "a write through a symlink out of the root",
            d(
                json!({"link": {"kind": "symlink", "size": 9, "target": "../../etc"}, "link/passwd": evil}),
            ),
            String::new(),
            "\"link/passwd\"",
        ),
        (
            "a write through an absolute symlink",
            d(json!({"etc": {"kind": "symlink", "size": 4, "target": "/etc"}, "etc/passwd": evil})),
            String::new(),
            "\"etc/passwd\"",
        ),
        (
            "path through a symlink",
            d(
                json!({"dir": {"kind": "dir"}, "link": {"kind": "symlink", "size": 3, "target": "dir"}, "link/x": evil}),
            ),
            String::new(),
            "link/x",
        ),
        (
            "missing parent",
            d(json!({"a/b": evil})),
            String::new(),
            "a/b",
        ),
        (
            "over the size limit",
            d(
                json!({"big": {"kind": "file", "size": manifest::DEFAULT_MAX_FILE_BYTES + 1, "hash": manifest::hash(b"x")}}),
            ),
            String::new(),
            "big",
        ),
        (
            "a FIFO",
            d(json!({"pipe": {"kind": "fifo"}})),
            String::new(),
            "\"pipe\"",
        ),
        (
            "a blob never uploaded",
            d(json!({"never.txt": file_entry(b"never uploaded")})),
            real(json!({"never.txt": file_entry(b"never uploaded")})),
            "\"never.txt\"",
        ),
        (
            "a root hash that does not match",
            d(json!({"ok.txt": file_entry(b"evil")})),
            "0".repeat(64),
            "claimed",
        ),
    ]
}

/// A delta of `changes` (JSON) for sync request `request_id`, claiming `root`.
fn delta(request_id: u64, base_root: &str, root: String, changes: &Value) -> DeltaChunk {
    DeltaChunk {
        request_id,
        base_root: base_root.into(),
        root_hash: root,
        data: manifest::compress(changes.to_string().as_bytes()),
    }
}

/// Speaks for worker `name` with its identity at `identity`: says hello, beats its heart,
/// and attaches its session; the way to send, what the brain sends, and the sync service.
async fn attach_as(
    url: &str,
    identity: &std::path::Path,
    name: &str,
) -> (
    Sender<WorkerMessage>,
    Streaming<BrainMessage>,
    SyncClient<Channel>,
) {
    let files = IdentityFiles::load(identity).unwrap();
    let cfg = files.client_config(identity).unwrap();
    let addr = BrainAddr::parse(url).unwrap();
    let ch = shared::tls::dial(&addr, cfg, DialOptions::default())
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tx.send(WorkerMessage {
        msg: Some(worker_message::Msg::Hello(proto::Hello {
            name: name.into(),
            protocol: proto::PROTOCOL_VERSION,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let beat = tx.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let hb = WorkerMessage {
                msg: Some(worker_message::Msg::Heartbeat(proto::Heartbeat {
                    unix_ms: 0,
                    load: None,
                })),
            };
            if beat.send(hb).await.is_err() {
                return;
            }
        }
    });
    let inbound = WorkerSessionClient::new(ch.clone())
        .attach(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, inbound, SyncClient::new(ch))
}

/// (what, the refusal's message, text it must contain).
type Refusal = (String, String, String);

/// The first barrier, answered with a blob that lies about its hash and every hostile delta
/// (each refused), then a delta of only `link` (a symlink to /etc/passwd: data, accepted)
/// reported as the barrier's root.
async fn every_bad_upload_then_a_link(
    sync: &mut SyncClient<Channel>,
    request_id: u64,
    link: &Value,
    link_root: &str,
) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    // A blob whose content does not match its hash.
    let chunk = BlobChunk {
        hash: hex::decode(manifest::hash(b"what it claims")).unwrap(),
        data: manifest::compress(b"something else"),
        last: true,
    };
    let e = sync
        .put_blobs(tokio_stream::iter(vec![chunk]))
        .await
        .expect_err("a lying blob is refused");
    refusals.push((
        "a blob that does not match its hash".into(),
        e.message().to_string(),
        "does not match".into(),
    ));
    for (what, changes, root, want) in hostile_deltas() {
        let e = sync
            .put_delta(tokio_stream::iter(vec![delta(
                request_id, "", root, &changes,
            )]))
            .await
            .expect_err(what);
        refusals.push((what.into(), e.message().to_string(), want.into()));
    }
    let chunk = delta(
        request_id,
        "",
        link_root.into(),
        &json!({"upserts": link, "deletes": []}),
    );
    sync.put_delta(tokio_stream::iter(vec![chunk]))
        .await
        .expect("a symlink pointing anywhere is data");
    sync.report(proto::SyncReport {
        id: request_id,
        root_hash: link_root.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    refusals
}

/// The second barrier, on the link's root: a write through the link the mirror holds,
/// refused; the barrier is then given up.
async fn a_write_through_the_stored_link(
    sync: &mut SyncClient<Channel>,
    request_id: u64,
    link_root: &str,
) -> Refusal {
    let through = json!({"upserts": {"pw/shadow": file_entry(b"evil")}, "deletes": []});
    let chunk = delta(request_id, link_root, "1".repeat(64), &through);
    let e = sync
        .put_delta(tokio_stream::iter(vec![chunk]))
        .await
        .expect_err("a write through a stored symlink");
    sync.report(proto::SyncReport {
        id: request_id,
        error: "gave up".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    (
        "a write through a symlink the mirror holds".into(),
        e.message().to_string(),
        "\"pw/shadow\"".into(),
    )
}

#[test]
fn hostile_workspace_data_from_a_worker_is_refused_and_changes_nothing() {
    let c = Cluster::start();
    let mut w = c.join_worker("turned");
    let identity = w.state.join("identity");
    w.kill();
    let plan = c.dir.join("plan.json");
    std::fs::write(&plan, r#"{"steps":[{"run":["true"]},{"run":["true"]}]}"#).unwrap();
    let task = c.run_plan(&plan, "turned");
    let url = c.url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let refusals: Vec<Refusal> = rt.block_on(async move {
        let (tx, mut inbound, mut sync) = attach_as(&url, &identity, "turned").await;
        // The first barrier: every bad delta, then a good one that holds only a symlink to
        // /etc/passwd (data, accepted). The second: a write through that link.
        let link = json!({"pw": {"kind": "symlink", "size": 11, "target": "/etc/passwd"}});
        let link_root = serde_json::from_value::<manifest::Manifest>(json!({ "entries": link }))
            .unwrap()
            .root_hash();
        let mut refusals = Vec::new();
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(20), inbound.message())
                .await
                .expect("the brain asks within 20 s")
                .unwrap()
                .expect("the session stays open");
            match msg.msg {
                Some(brain_message::Msg::Exec(start)) if start.durable => {
                    let r = proto::CallResult {
                        call_id: start.call_id,
                        exit: Some(proto::ExecExit {
                            call_id: start.call_id,
                            code: Some(0),
                            ..Default::default()
                        }),
                        ..Default::default()
                    };
                    tx.send(WorkerMessage {
                        msg: Some(worker_message::Msg::CallResult(r)),
                    })
                    .await
                    .unwrap();
                }
                Some(brain_message::Msg::Sync(req)) if !refusals.is_empty() => {
                    assert_eq!(
                        req.op,
                        Some(proto::sync_request::Op::BarrierBase(link_root.clone()))
                    );
                    refusals
                        .push(a_write_through_the_stored_link(&mut sync, req.id, &link_root).await);
                    return refusals;
                }
                Some(brain_message::Msg::Sync(req)) => {
                    refusals =
                        every_bad_upload_then_a_link(&mut sync, req.id, &link, &link_root).await;
                }
                _ => {}
            }
        }
    });
    assert_eq!(refusals.len(), hostile_deltas().len() + 2);
    for (what, message, want) in &refusals {
        eprintln!("{what}: {message}");
        assert!(
            message.contains(want.as_str()),
            "{what}: {message:?} does not name {want:?}"
        );
    }
    // Only the symlink reached the mirror: one barrier in the log, no blob stored.
    let log = c.task_log_json(&task);
    let barriers: Vec<&Value> = log.iter().filter(|r| r["kind"] == "barrier").collect();
    assert_eq!(barriers.len(), 1, "{log:?}");
    assert_eq!(testkit::json_u64(&barriers[0]["files"]), Some(0));
    let blobs = std::fs::read_dir(c.data.join("blobs"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(blobs, 0, "a blob was stored");
    assert!(
        log.iter()
            .any(|r| r["kind"] == "tool_call_completed"
                && testkit::json_u64(&r["call_id"]).is_some())
    );
}

/// What a hostile worker got from the mirror: the content of another task's blob by its
/// hash, whether the brain holds another task's content, and how a delta that inflates far
/// fares.
struct Probed {
    fetched: Result<Vec<u8>, String>,
    fetched_unasked: Result<Vec<u8>, String>,
    missing: Vec<String>,
    delta: String,
}

/// Reads a `GetBlobs` answer whole: the blobs' bytes, or the refusal.
async fn fetch(
    sync: &mut SyncClient<Channel>,
    hash: &str,
    request_id: u64,
) -> Result<Vec<u8>, String> {
    let mut s = sync
        .get_blobs(proto::BlobList {
            hashes: vec![hex::decode(hash).unwrap()],
            request_id,
        })
        .await
        .map_err(|e| e.message().to_string())?
        .into_inner();
    let mut got = Vec::new();
    while let Some(c) = s.message().await.map_err(|e| e.message().to_string())? {
        got.extend_from_slice(&c.data);
    }
    Ok(got)
}

/// Route: any enrolled worker read any blob of the mirror by its hash (another task's
/// files), learnt whether the brain held a given content, and one delta inflated to 1 GiB.
/// Now a worker reaches only the blobs of the workspace a materialisation of its own names;
/// "missing" is said of any content outside its workspace's last version (it must send it,
/// and the brain checks it); a delta is at most 64 MiB inflated, refused at its frame's word.
#[test]
fn a_worker_reaches_no_other_tasks_blobs_and_no_delta_inflates_far() {
    let c = Cluster::start();
    let victim = c.join_worker("victim");
    const SECRET: &[u8] = b"private notes 7f3a\n";
    let plan = c.dir.join("victim.json");
    std::fs::write(
        &plan,
        r#"{"steps":[{"run":["sh","-c","printf 'private notes 7f3a\\n' > notes.txt"]}]}"#,
    )
    .unwrap();
    let victim_task = c.run_plan(&plan, "victim");
    c.wait_status(&victim_task, &["finished"], Duration::from_secs(30));
    let hash = manifest::hash(SECRET);
    let blobs = c.task_log_json(&victim_task);
    assert!(
        blobs
            .iter()
            .any(|r| r["kind"] == "barrier" && testkit::json_u64(&r["files"]) == Some(1)),
        "the victim's file did not reach the mirror: {blobs:?}"
    );
    drop(victim);

    let mut w = c.join_worker("turned");
    let identity = w.state.join("identity");
    w.kill();
    let plan = c.dir.join("plan.json");
    std::fs::write(&plan, r#"{"steps":[{"run":["true"]}]}"#).unwrap();
    let _task = c.run_plan(&plan, "turned");
    let url = c.url();
    let pid = c.brain.as_ref().unwrap().pid();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (probed, grew) = rt.block_on(async move {
        let (tx, mut inbound, mut sync) = attach_as(&url, &identity, "turned").await;
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(20), inbound.message())
                .await
                .expect("the brain asks within 20 s")
                .unwrap()
                .expect("the session stays open");
            match msg.msg {
                Some(brain_message::Msg::Exec(start)) if start.durable => {
                    let r = proto::CallResult {
                        call_id: start.call_id,
                        exit: Some(proto::ExecExit {
                            call_id: start.call_id,
                            code: Some(0),
                            ..Default::default()
                        }),
                        ..Default::default()
                    };
                    let msg = WorkerMessage {
                        msg: Some(worker_message::Msg::CallResult(r)),
                    };
                    tx.send(msg).await.unwrap();
                }
                Some(brain_message::Msg::Sync(req)) => {
                    let fetched = fetch(&mut sync, &hash, req.id).await;
                    let fetched_unasked = fetch(&mut sync, &hash, 0).await;
                    let other = manifest::hash(b"content nobody has");
                    let missing = sync
                        .missing_blobs(proto::BlobList {
                            hashes: vec![hex::decode(&hash).unwrap(), hex::decode(&other).unwrap()],
                            request_id: req.id,
                        })
                        .await
                        .map(|r| r.into_inner().hashes.iter().map(hex::encode).collect())
                        .unwrap_or_default();
                    // 512 MiB of zeros: a few KiB on the wire.
                    let bomb = manifest::compress(&vec![0u8; 512 << 20]);
                    let before = peak_rss(pid);
                    let chunk = DeltaChunk {
                        request_id: req.id,
                        base_root: String::new(),
                        root_hash: String::new(),
                        data: bomb,
                    };
                    let delta = match sync.put_delta(tokio_stream::iter(vec![chunk])).await {
                        Ok(_) => "accepted".to_string(),
                        Err(e) => e.message().to_string(),
                    };
                    let grew = peak_rss(pid).saturating_sub(before);
                    let probed = Probed {
                        fetched,
                        fetched_unasked,
                        missing,
                        delta,
                    };
                    return (probed, grew);
                }
                _ => {}
            }
        }
    });
    for (what, got) in [
        ("in its own barrier", &probed.fetched),
        ("with no request", &probed.fetched_unasked),
    ] {
        match got {
            Ok(data) => panic!(
                "a worker fetched another task's blob {what}: {} bytes",
                data.len()
            ),
            Err(e) => assert!(
                e.contains("materialis"),
                "{what}: the refusal says why: {e}"
            ),
        }
    }
    assert_eq!(
        probed.missing.len(),
        2,
        "the brain told a worker it holds another task's content: missing {:?}",
        probed.missing
    );
    assert!(
        probed.delta.contains("over the limit"),
        "a delta inflating to 512 MiB: {}",
        probed.delta
    );
    assert!(
        grew < 64 << 20,
        "a delta inflating to 512 MiB took the brain's memory up by {} MiB",
        grew >> 20
    );
}
