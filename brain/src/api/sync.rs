//! The `Sync` service: bulk workspace data from and to workers, on its own streams. Every
//! upload is checked: blobs against their hash (and a size bound), deltas against the
//! request they answer (same worker, same base) and, once applied, against the manifest
//! rules and the root hash the worker claimed. A bad upload changes nothing.

use std::pin::Pin;

use proto::sync_server::Sync as SyncService;
use proto::{
    BlobChunk, BlobList, DataChunk, DeltaChunk, GetManifestRequest, PutBlobsResponse,
    PutDeltaResponse, SyncReport, SyncReportAck,
};
use shared::manifest::{self, Delta, Rules};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::api::Services;

/// Chunk size on the wire.
const CHUNK: usize = 1 << 20;
/// Most hashes per request.
const MAX_HASHES: usize = 100_000;
/// Largest compressed delta accepted, and its decompressed size.
const MAX_DELTA_WIRE: usize = 256 << 20;
/// Decompressed: a full manifest of the most entries a workspace may have
/// ([`manifest::DEFAULT_MAX_ENTRIES`], 200,000) at over 300 bytes each; a frame that says
/// it is larger is refused before anything is inflated.
const MAX_DELTA_BYTES: u64 = 64 << 20;

fn hex_hashes(list: &BlobList) -> Result<Vec<String>, Status> {
    if list.hashes.len() > MAX_HASHES {
        return Err(Status::invalid_argument(format!(
            "at most {MAX_HASHES} hashes per request"
        )));
    }
    list.hashes
        .iter()
        .map(|h| {
            if h.len() == 32 {
                Ok(hex::encode(h))
            } else {
                Err(Status::invalid_argument("a blob hash must be 32 bytes"))
            }
        })
        .collect()
}

/// Parses a delta, naming the path of an entry that does not parse.
fn parse_delta(json: &[u8]) -> Result<Delta, Status> {
    #[derive(serde::Deserialize)]
    struct Raw {
        #[serde(default)]
        upserts: std::collections::BTreeMap<String, serde_json::Value>,
        #[serde(default)]
        deletes: Vec<String>,
    }
    let raw: Raw = serde_json::from_slice(json)
        .map_err(|e| Status::invalid_argument(format!("the delta: {e}")))?;
    let mut d = Delta {
        deletes: raw.deletes,
        ..Default::default()
    };
    for (path, v) in raw.upserts {
        let e = serde_json::from_value(v).map_err(|e| {
            Status::invalid_argument(format!("workspace entry {path:?} rejected: {e}"))
        })?;
        d.upserts.insert(path, e);
    }
    Ok(d)
}

/// `hashes` split into those of files of `m` and the others, each in the order given.
fn among_files(m: &shared::manifest::Manifest, hashes: Vec<String>) -> (Vec<String>, Vec<String>) {
    let mut found: std::collections::HashMap<&str, bool> =
        hashes.iter().map(|h| (h.as_str(), false)).collect();
    for e in m.entries().values() {
        if e.kind == shared::manifest::Kind::File
            && let Some(f) = found.get_mut(e.hash.as_str())
        {
            *f = true;
        }
    }
    let (known, unknown): (Vec<&String>, Vec<&String>) =
        hashes.iter().partition(|h| found[h.as_str()]);
    let owned = |v: Vec<&String>| v.into_iter().cloned().collect();
    (owned(known), owned(unknown))
}

type ChunkStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn chunks<T: Send + 'static>(items: Vec<T>) -> ChunkStream<T> {
    Box::pin(tokio_stream::iter(items.into_iter().map(Ok)))
}

#[tonic::async_trait]
impl SyncService for Services {
    async fn missing_blobs(&self, req: Request<BlobList>) -> Result<Response<BlobList>, Status> {
        let worker = self.worker_caller(&req)?.id;
        let pending = self
            .0
            .hub
            .sync_pending(req.get_ref().request_id, &worker)
            .filter(|p| p.materialise.is_empty())
            .ok_or_else(|| {
                Status::failed_precondition("no barrier of this worker asks about these blobs")
            })?;
        let hashes = hex_hashes(req.get_ref())?;
        let mirror = self.0.mirror.clone();
        let missing = tokio::task::spawn_blocking(move || -> Result<Vec<String>, Status> {
            // Whether the mirror holds a blob is said only of the workspace's own last
            // version: any other content is "missing", so the worker sends it and the brain
            // checks it against its hash. No worker learns what other tasks' files hold.
            let base = mirror
                .manifest_shared(&pending.base)
                .map_err(Status::from)?;
            let (known, unknown) = among_files(&base, hashes);
            let mut missing = mirror.missing(&known).map_err(Status::from)?;
            missing.extend(unknown);
            Ok(missing)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??
        .iter()
        .map(|h| hex::decode(h).expect("hex we made"))
        .collect();
        Ok(Response::new(BlobList {
            hashes: missing,
            request_id: 0,
        }))
    }

    async fn put_blobs(
        &self,
        req: Request<Streaming<BlobChunk>>,
    ) -> Result<Response<PutBlobsResponse>, Status> {
        let max = Rules::default().max_file_bytes;
        let mut stream = req.into_inner();
        let mut cur: Option<(String, Vec<u8>)> = None;
        // Whole blobs are stored a batch at a time on a blocking thread, one batch in
        // flight while the stream goes on (a thread hand-off per blob cost as much as
        // storing a small one).
        let mut batch = StoreBatch::default();
        let mut storing: Option<
            tokio::task::JoinHandle<Result<Vec<String>, crate::mirror::Error>>,
        > = None;
        let mut fresh: Vec<String> = Vec::new();
        while let Some(c) = stream.message().await? {
            if !c.hash.is_empty() {
                if c.hash.len() != 32 {
                    return Err(Status::invalid_argument("a blob hash must be 32 bytes"));
                }
                cur = Some((hex::encode(&c.hash), Vec::new()));
            }
            let Some((hash, data)) = cur.as_mut() else {
                return Err(Status::invalid_argument(
                    "a blob chunk came before its hash",
                ));
            };
            data.extend_from_slice(&c.data);
            if data.len() as u64 > max + max / 8 + 1024 {
                return Err(Status::invalid_argument(format!(
                    "blob {hash} is over the file size limit"
                )));
            }
            if c.last {
                batch.push(cur.take().expect("set above"));
                if batch.full() {
                    if let Some(prev) = storing.take() {
                        fresh.extend(joined(prev.await)?);
                    }
                    let mirror = self.0.mirror.clone();
                    let blobs = std::mem::take(&mut batch).blobs;
                    storing = Some(tokio::task::spawn_blocking(move || {
                        store(&mirror, blobs, max)
                    }));
                }
            }
        }
        if let Some((hash, _)) = cur {
            return Err(Status::invalid_argument(format!(
                "blob {hash} was cut short"
            )));
        }
        if let Some(prev) = storing.take() {
            fresh.extend(joined(prev.await)?);
        }
        if !batch.blobs.is_empty() {
            let mirror = self.0.mirror.clone();
            let blobs = batch.blobs;
            fresh.extend(joined(
                tokio::task::spawn_blocking(move || store(&mirror, blobs, max)).await,
            )?);
        }
        let stored = fresh.len() as u32;
        if stored > 0 {
            // Durable before any manifest names them.
            let mirror = self.0.mirror.clone();
            let t = std::time::Instant::now();
            tokio::task::spawn_blocking(move || mirror.sync_blobs(&fresh))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(Status::from)?;
            tracing::debug!(
                stored,
                sync_ms = t.elapsed().as_millis() as u64,
                "blobs stored"
            );
        }
        Ok(Response::new(PutBlobsResponse { stored }))
    }

    async fn put_delta(
        &self,
        req: Request<Streaming<DeltaChunk>>,
    ) -> Result<Response<PutDeltaResponse>, Status> {
        let worker = self.worker_caller(&req)?.id;
        let mut stream = req.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("an empty delta upload"))?;
        let pending = self
            .0
            .hub
            .sync_pending(first.request_id, &worker)
            .ok_or_else(|| {
                Status::failed_precondition("no barrier of this worker awaits this delta")
            })?;
        if !first.base_root.is_empty() && first.base_root != pending.base {
            return Err(Status::invalid_argument(
                "the delta is against a manifest the brain did not offer",
            ));
        }
        let mut buf = first.data;
        while let Some(c) = stream.message().await? {
            buf.extend_from_slice(&c.data);
            if buf.len() > MAX_DELTA_WIRE {
                return Err(Status::invalid_argument(
                    "the delta is over 256 MiB compressed",
                ));
            }
        }
        let mirror = self.0.mirror.clone();
        let rules = Rules {
            include_git: pending.include_git,
            ..Rules::default()
        };
        let (base_root, claimed) = (first.base_root, first.root_hash);
        let t = std::time::Instant::now();
        let who = worker.clone();
        let root = tokio::task::spawn_blocking(move || -> Result<String, Status> {
            let json = manifest::decompress(&buf, MAX_DELTA_BYTES)
                .map_err(|e| Status::invalid_argument(format!("the delta: {e}")))?;
            let delta = parse_delta(&json)?;
            let base = mirror.take_manifest(&base_root).map_err(Status::from)?;
            let new = base
                .apply_owned(&delta, &rules)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            let root = new.root_hash();
            if root != claimed {
                if new.matches_root(&claimed) {
                    // The flat hash earlier versions named manifests by.
                    return Err(Status::failed_precondition(format!(
                        "worker {who} runs an earlier version of Tether (it names workspace manifests by a flat hash, not by the hash tree this brain uses): upgrade it to the brain's version"
                    )));
                }
                return Err(Status::invalid_argument(format!(
                    "the delta gives root {root}, the worker claimed {claimed}"
                )));
            }
            mirror
                .put_manifest_delta(new, &root, &base_root, &delta)
                .map_err(Status::from)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??;
        tracing::debug!(%worker, workspace = %pending.workspace, %root, ms = t.elapsed().as_millis() as u64, "mirror updated");
        Ok(Response::new(PutDeltaResponse {}))
    }

    type GetManifestStream = ChunkStream<DataChunk>;

    async fn get_manifest(
        &self,
        req: Request<GetManifestRequest>,
    ) -> Result<Response<Self::GetManifestStream>, Status> {
        let worker = self.worker_caller(&req)?.id;
        let pending = self
            .0
            .hub
            .sync_pending(req.get_ref().request_id, &worker)
            .filter(|p| !p.materialise.is_empty())
            .ok_or_else(|| {
                Status::failed_precondition("no materialisation of this worker awaits a manifest")
            })?;
        let have = req.get_ref().have_root.clone();
        let mirror = self.0.mirror.clone();
        let (data, delta_from) =
            tokio::task::spawn_blocking(move || -> Result<(Vec<u8>, String), Status> {
                let m = mirror
                    .manifest_shared(&pending.materialise)
                    .map_err(Status::from)?;
                // A warm target gets what changed since the version it holds, found by the
                // directory hashes; one the mirror no longer holds gets the whole manifest.
                let json = match mirror.manifest_shared(&have) {
                    Ok(base) if !have.is_empty() => {
                        let delta = base.diff(&m);
                        let json = serde_json::to_vec(&delta).expect("deltas serialise");
                        (json, have)
                    }
                    _ => (
                        serde_json::to_vec(&*m).expect("manifests serialise"),
                        String::new(),
                    ),
                };
                Ok((manifest::compress(&json.0), json.1))
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))??;
        let mut parts: Vec<DataChunk> = data
            .chunks(CHUNK)
            .map(|c| DataChunk {
                data: c.to_vec(),
                ..Default::default()
            })
            .collect();
        if parts.is_empty() {
            parts.push(DataChunk::default());
        }
        parts[0].delta_from = delta_from;
        Ok(Response::new(chunks(parts)))
    }

    type GetBlobsStream = ChunkStream<BlobChunk>;

    async fn get_blobs(
        &self,
        req: Request<BlobList>,
    ) -> Result<Response<Self::GetBlobsStream>, Status> {
        let worker = self.worker_caller(&req)?.id;
        let pending = self
            .0
            .hub
            .sync_pending(req.get_ref().request_id, &worker)
            .filter(|p| !p.materialise.is_empty())
            .ok_or_else(|| {
                Status::failed_precondition("no materialisation of this worker asks for blobs")
            })?;
        let hashes = hex_hashes(req.get_ref())?;
        let mirror = self.0.mirror.clone();
        // Only the blobs of the workspace this worker is materialising: not another task's.
        let hashes = tokio::task::spawn_blocking({
            let mirror = mirror.clone();
            move || -> Result<Vec<String>, Status> {
                let m = mirror
                    .manifest_shared(&pending.materialise)
                    .map_err(Status::from)?;
                let (known, unknown) = among_files(&m, hashes);
                match unknown.first() {
                    Some(h) => Err(Status::permission_denied(format!(
                        "blob {h} is not in the workspace this worker is materialising"
                    ))),
                    None => Ok(known),
                }
            }
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            for h in hashes {
                let data = match mirror.get_compressed(&h) {
                    Ok(d) => d,
                    Err(e) => {
                        let _ = tx.blocking_send(Err(Status::from(e)));
                        return;
                    }
                };
                let n = data.len().div_ceil(CHUNK).max(1);
                for i in 0..n {
                    let part =
                        &data[(i * CHUNK).min(data.len())..((i + 1) * CHUNK).min(data.len())];
                    let c = BlobChunk {
                        hash: if i == 0 {
                            hex::decode(&h).expect("checked hex")
                        } else {
                            vec![]
                        },
                        data: part.to_vec(),
                        last: i + 1 == n,
                    };
                    if tx.blocking_send(Ok(c)).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn report(&self, req: Request<SyncReport>) -> Result<Response<SyncReportAck>, Status> {
        let worker = self.worker_caller(&req)?.id;
        self.0.hub.deliver_sync(&worker, req.into_inner());
        Ok(Response::new(SyncReportAck {}))
    }
}

/// Whole blobs waiting to be stored: at most [`StoreBatch::BLOBS`] of them or about
/// [`StoreBatch::BYTES`].
#[derive(Default)]
struct StoreBatch {
    blobs: Vec<(String, Vec<u8>)>,
    bytes: usize,
}

impl StoreBatch {
    const BLOBS: usize = 64;
    const BYTES: usize = 4 << 20;

    fn push(&mut self, blob: (String, Vec<u8>)) {
        self.bytes += blob.1.len();
        self.blobs.push(blob);
    }

    fn full(&self) -> bool {
        self.blobs.len() >= Self::BLOBS || self.bytes >= Self::BYTES
    }
}

/// Stores compressed blobs, each checked against its hash; the hashes that were new.
fn store(
    mirror: &crate::mirror::Mirror,
    blobs: Vec<(String, Vec<u8>)>,
    max: u64,
) -> Result<Vec<String>, crate::mirror::Error> {
    let mut fresh = Vec::new();
    for (hash, data) in blobs {
        if mirror.put_compressed(&hash, &data, max)? {
            fresh.push(hash);
        }
    }
    Ok(fresh)
}

fn joined<T>(
    r: Result<Result<T, crate::mirror::Error>, tokio::task::JoinError>,
) -> Result<T, Status> {
    r.map_err(|e| Status::internal(e.to_string()))?
        .map_err(Status::from)
}
