//! Materialising, the worker's side: making a workspace's disk equal to a manifest of the
//! brain's. The worker brings its own manifest up to date from its tracker, names that root,
//! and receives either the delta from it (a warm target) or the whole manifest; it fetches
//! only the blobs it has nowhere locally, writes only the paths that differ, and verifies the
//! root hash from a rescan.

use shared::locks::Lock;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use proto::sync_client::SyncClient;
use proto::{BlobList, SyncReport};
use shared::manifest::{self, Kind, Manifest};
use tonic::transport::Channel;

use super::{
    Error, HASH_BATCH, MAX_MANIFEST_BYTES, MAX_MANIFEST_WIRE, Staging, SyncState, Ws, raw, scan,
    scan_now,
};

pub(super) async fn materialise(
    id: u64,
    want: &str,
    root: &Path,
    ws: Arc<Mutex<Ws>>,
    client: &mut SyncClient<Channel>,
    owner: Option<(u32, u32)>,
    state: &Arc<SyncState>,
) -> Result<SyncReport, Error> {
    let t0 = std::time::Instant::now();
    let rules = &ws.locked().scanner.rules().clone();
    // What the disk holds now: from the changes the tracker saw since the last scan (a walk
    // when it cannot say, as for a workspace this worker has not scanned yet). A warm target
    // names it, and receives only the delta from it.
    let (current, _) = scan(&ws, false).await?;
    let have = if current.is_empty() {
        String::new()
    } else {
        current.root_hash()
    };
    let t_scan = t0.elapsed();
    let (target, delta, delta_from, mut wire) =
        fetch_target(client, id, &have, &current, rules, want).await?;
    let t_manifest = t0.elapsed();
    let mut local = local_copies(state, &current, &delta, root);
    // Beside the workspaces, in the worker's state: commands cannot write there.
    let staging = Staging(
        root.parent()
            .and_then(Path::parent)
            .unwrap_or(root)
            .join("staging")
            .join(id.to_string()),
    );
    let (fetched, staged, blob_wire) =
        fetch_blobs(id, client, state, &current, &delta, &mut local, &staging).await?;
    wire += blob_wire;
    let blobs_fetched = fetched.len() as u64 + staged;
    if staged > 0 {
        tracing::info!(
            staged,
            budget = state.memory_budget,
            "blobs over the memory budget waited on disk"
        );
    }
    let t_fetch = t0.elapsed();
    let (root2, ws2, want2) = (root.to_path_buf(), ws.clone(), want.to_string());
    let changes = (delta.upserts.len() + delta.deletes.len()) as u64;
    let applied =
        tokio::task::spawn_blocking(move || -> Result<manifest::write::Applied, Error> {
            let mut blob = |h: &str| -> std::io::Result<Vec<u8>> {
                if let Some(d) = fetched.get(h) {
                    return Ok(d.clone());
                }
                let p = local.get(h).ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "not sent by the brain and not on this machine",
                    )
                })?;
                // The materialiser checks the hash: a file changed since is refused.
                std::fs::read(p)
            };
            let applied =
                manifest::write::materialise_delta(&root2, &current, &delta, &target, &mut blob)?;
            let written_now = |p: &str| target.get(p).filter(|e| current.get(p) != Some(*e));
            if let Some(o) = owner {
                // What was there already was given when it was written.
                for path in delta.upserts.keys() {
                    if written_now(path).is_some() {
                        crate::files::give_path(&root2, path, o);
                    }
                }
            }
            let mut w = ws2.locked();
            // What was just written was checked against its hash: the scan that verifies the
            // tree need not read it again.
            for path in delta.upserts.keys() {
                if let Some(e) = written_now(path).filter(|e| e.kind == Kind::File) {
                    w.scanner.prime(path, &e.hash);
                }
            }
            let written = t0.elapsed();
            // The tracker saw every write: only the directories written to are listed again.
            scan_now(&mut w, false)?;
            tracing::info!(
                warm = !delta_from.is_empty(),
                changes,
                full = w.scanner.was_full,
                scan_ms = t_scan.as_millis() as u64,
                manifest_ms = (t_manifest - t_scan).as_millis() as u64,
                fetch_ms = (t_fetch - t_manifest).as_millis() as u64,
                write_ms = (written - t_fetch).as_millis() as u64,
                verify_ms = (t0.elapsed() - written).as_millis() as u64,
                "materialised"
            );
            let got = w.scanner.last().ok_or(Error::NoManifest)?;
            if !got.matches_root(&want2) {
                return Err(Error::Unverified {
                    got: got.root_hash(),
                    want: want2,
                });
            }
            let g = w.scanner.generation();
            w.scanner.mark(g, &want2);
            Ok(applied)
        })
        .await??;
    Ok(SyncReport {
        id,
        error: String::new(),
        root_hash: want.to_string(),
        files: applied.written,
        bytes: applied.written_bytes,
        blobs_sent: blobs_fetched,
        wire_bytes: wire,
        hashed: 0,
        ..Default::default()
    })
}

/// The manifest to materialise, from the brain: the delta from what the disk holds (`have`)
/// or the whole manifest, checked against `want`. Also the delta's base and the bytes that
/// crossed the wire.
async fn fetch_target(
    client: &mut SyncClient<Channel>,
    id: u64,
    have: &str,
    current: &Manifest,
    rules: &shared::manifest::Rules,
    want: &str,
) -> Result<(Manifest, manifest::Delta, String, u64), Error> {
    let mut stream = client
        .get_manifest(proto::GetManifestRequest {
            request_id: id,
            have_root: have.to_string(),
        })
        .await
        .map_err(Error::rpc("fetching the manifest"))?
        .into_inner();
    let mut buf = Vec::new();
    let mut delta_from: Option<String> = None;
    while let Some(c) = stream
        .message()
        .await
        .map_err(Error::rpc("fetching the manifest"))?
    {
        delta_from.get_or_insert(c.delta_from);
        buf.extend_from_slice(&c.data);
        if buf.len() > MAX_MANIFEST_WIRE {
            return Err(Error::ManifestTooLarge);
        }
    }
    let wire = buf.len() as u64;
    let json = manifest::decompress(&buf, MAX_MANIFEST_BYTES).map_err(Error::ManifestUnreadable)?;
    let delta_from = delta_from.unwrap_or_default();
    let (target, delta) = if delta_from.is_empty() {
        let target: Manifest = serde_json::from_slice(&json).map_err(Error::ManifestJson)?;
        target.validate(rules)?;
        let delta = current.diff(&target);
        (target, delta)
    } else {
        if delta_from != have {
            return Err(Error::DeltaFromElsewhere {
                from: delta_from,
                have: have.to_string(),
            });
        }
        let delta: manifest::Delta = serde_json::from_slice(&json).map_err(Error::DeltaJson)?;
        // Checked as it is applied: the result is a valid manifest.
        let target = current.apply(&delta, rules)?;
        (target, delta)
    };
    if !target.matches_root(want) {
        return Err(Error::WrongRoot {
            got: target.root_hash(),
            want: want.into(),
        });
    }
    Ok((target, delta, delta_from, wire))
}

/// Content this machine already has, under any path of the workspace or where an import
/// saw it: looked up for the delta's new content only.
fn local_copies(
    state: &SyncState,
    current: &Manifest,
    delta: &manifest::Delta,
    root: &Path,
) -> HashMap<String, PathBuf> {
    let new: std::collections::HashSet<&str> = delta
        .upserts
        .values()
        .filter(|e| e.kind == Kind::File)
        .map(|e| e.hash.as_str())
        .collect();
    let mut local: HashMap<String, PathBuf> = HashMap::new();
    if !new.is_empty() {
        let known = state.known.locked();
        for h in &new {
            if let Some(p) = known.get(*h) {
                local.insert(h.to_string(), p.clone());
            }
        }
        drop(known);
        for (p, e) in current.entries() {
            if e.kind == Kind::File && new.contains(e.hash.as_str()) {
                local.insert(e.hash.clone(), root.join(p));
            }
        }
    }
    local
}

/// Fetches the blobs the delta needs that are nowhere on this machine: kept in memory up to
/// the memory budget, staged on disk past it (and added to `local`). The blobs in memory,
/// how many were staged, and the bytes that crossed the wire.
async fn fetch_blobs(
    id: u64,
    client: &mut SyncClient<Channel>,
    state: &SyncState,
    current: &Manifest,
    delta: &manifest::Delta,
    local: &mut HashMap<String, PathBuf>,
    staging: &Staging,
) -> Result<(HashMap<String, Vec<u8>>, u64, u64), Error> {
    let sizes: HashMap<&str, u64> = delta
        .upserts
        .values()
        .filter(|e| e.kind == Kind::File)
        .map(|e| (e.hash.as_str(), e.size))
        .collect();
    let mut need: Vec<&str> = delta
        .upserts
        .iter()
        .filter(|(p, e)| {
            e.kind == Kind::File && current.get(p) != Some(*e) && !local.contains_key(&e.hash)
        })
        .map(|(_, e)| e.hash.as_str())
        .collect();
    need.sort();
    need.dedup();
    let mut fetched: HashMap<String, Vec<u8>> = HashMap::new();
    let mut in_memory = 0u64;
    let mut staged = 0u64;
    let mut wire = 0u64;
    for batch in need.chunks(HASH_BATCH) {
        let mut s = client
            .get_blobs(BlobList {
                hashes: batch.iter().map(|h| raw(h)).collect(),
                request_id: id,
            })
            .await
            .map_err(Error::rpc("fetching blobs"))?
            .into_inner();
        let mut cur: Option<(String, Vec<u8>)> = None;
        while let Some(c) = s.message().await.map_err(Error::rpc("fetching blobs"))? {
            wire += c.data.len() as u64;
            if !c.hash.is_empty() {
                cur = Some((hex::encode(&c.hash), Vec::new()));
            }
            let Some((h, data)) = cur.as_mut() else {
                return Err(Error::ChunkWithoutHash);
            };
            data.extend_from_slice(&c.data);
            let max = sizes.get(h.as_str()).copied().unwrap_or(0);
            if data.len() as u64 > max + 1024 + max / 8 {
                return Err(Error::BlobTooLarge(h.clone()));
            }
            if c.last {
                let (h, data) = cur.take().expect("set above");
                let content = manifest::decompress(&data, max).map_err(|source| Error::Blob {
                    hash: h.clone(),
                    source,
                })?;
                if in_memory + content.len() as u64 <= state.memory_budget {
                    in_memory += content.len() as u64;
                    fetched.insert(h, content);
                } else {
                    // Over the budget: to disk; the materialiser checks it when it reads it.
                    std::fs::create_dir_all(&staging.0).map_err(|source| Error::Staging {
                        dir: staging.0.clone(),
                        source,
                    })?;
                    let p = staging.0.join(&h);
                    if let Err(source) = std::fs::write(&p, &content) {
                        return Err(Error::Stage { hash: h, source });
                    }
                    staged += 1;
                    local.insert(h, p);
                }
            }
        }
    }
    Ok((fetched, staged, wire))
}
