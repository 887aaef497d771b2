//! Workspace sync, the worker's side. When the brain asks (a `SyncRequest` on the session),
//! the worker either makes the brain's mirror equal to its disk (a barrier: scan, send the
//! blobs the brain lacks, send the delta) or its disk equal to a manifest (materialise:
//! fetch the manifest, fetch only the blobs it has nowhere locally, write, verify the root
//! hash). Bulk data goes over the `Sync` service's own streams, never the session stream.
//!
//! Materialising is in `materialise.rs`; the tests are in `tests.rs`.

use shared::locks::Lock;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::sync_client::SyncClient;
use proto::{BlobChunk, BlobList, DeltaChunk, SyncReport, SyncRequest, sync_request};
use shared::manifest::{self, Kind, Manifest, Rules};
use shared::scan::Scanner;
use tonic::transport::Channel;

use crate::track::Tracker;

mod error;
mod materialise;

pub use error::Error;

/// Chunk size on the wire.
const CHUNK: usize = 1 << 20;
/// Hashes per MissingBlobs call.
const HASH_BATCH: usize = 20_000;
/// Largest compressed manifest accepted from the brain, and its decompressed size.
const MAX_MANIFEST_WIRE: usize = 256 << 20;
const MAX_MANIFEST_BYTES: u64 = 1 << 30;
/// Any one sync RPC.
const RPC_TIMEOUT: Duration = Duration::from_secs(600);

/// Most workspaces whose changes are tracked at once (each is an inotify instance, and
/// `fs.inotify.max_user_instances` is often 128); the least recently used gives its up.
const MAX_TRACKERS: usize = 32;
/// A workspace not synced for this long stops being tracked.
const TRACK_IDLE: Duration = Duration::from_secs(15 * 60);

/// Per workspace: the scanner (its hash cache, its manifest and what changed since the
/// brain last confirmed one) and the change tracker.
pub struct SyncState {
    workspaces: Mutex<HashMap<String, Arc<Mutex<Ws>>>>,
    /// Where imported content lives on this machine, by hash (checked when read).
    known: Mutex<HashMap<String, PathBuf>>,
    max_trackers: usize,
    idle: Duration,
    /// Fetched blob content kept in memory while materialising; beyond it, blobs wait in a
    /// staging directory on disk.
    memory_budget: u64,
}

/// Default of [`SyncState::memory_budget`]; `TETHER_MATERIALISE_MEMORY` (bytes) overrides it.
const MEMORY_BUDGET: u64 = 256 << 20;

impl Default for SyncState {
    fn default() -> Self {
        Self {
            workspaces: Default::default(),
            known: Default::default(),
            max_trackers: MAX_TRACKERS,
            idle: TRACK_IDLE,
            memory_budget: std::env::var("TETHER_MATERIALISE_MEMORY")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(MEMORY_BUDGET),
        }
    }
}

/// A directory removed with everything in it when dropped.
struct Staging(PathBuf);

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An import directory: absolute, an existing directory, and neither inside nor holding a
/// path the sandbox hides from commands (the worker's state, the home directory's secrets).
/// Where the brain may import from (`brain run --dir`): the worker's owner names the roots
/// (`worker run --import-root DIR`), and nothing that holds or is inside a path commands may
/// not read (the worker's state, the home directory's secrets, `--deny-read`). The worker
/// reads what it imports with its own rights, which on a root worker are more than its
/// tasks' commands have: so nothing is imported unless its owner allowed the place.
#[derive(Debug, Clone, Default)]
pub struct Imports {
    /// Resolved directories below which imports are allowed; none: no imports.
    pub roots: Vec<PathBuf>,
    /// Paths never imported, nor a directory that holds one.
    pub denied: Vec<PathBuf>,
}

impl Imports {
    /// The directory to import for the wire's `dir`, resolved, or why not.
    pub fn check(&self, dir: &str) -> Result<PathBuf, Error> {
        let p = Path::new(dir);
        if !p.is_absolute() {
            return Err(Error::ImportNotAbsolute(dir.into()));
        }
        if self.roots.is_empty() {
            return Err(Error::ImportsOff(dir.into()));
        }
        let outside = || Error::ImportOutside {
            dir: dir.into(),
            roots: self.describe_roots(),
        };
        let real = p.canonicalize().map_err(|source| {
            // Whether a path outside the roots exists is not told either.
            if self.roots.iter().any(|r| p.starts_with(r)) {
                Error::ImportUnreadable {
                    dir: dir.into(),
                    source,
                }
            } else {
                outside()
            }
        })?;
        if !self.roots.iter().any(|r| real.starts_with(r)) {
            return Err(outside());
        }
        if !real.is_dir() {
            return Err(Error::ImportNotDir(dir.into()));
        }
        if let Some(d) = self
            .denied
            .iter()
            .find(|d| real.starts_with(d) || d.starts_with(&real))
        {
            return Err(Error::ImportHidden {
                dir: dir.into(),
                hidden: d.clone(),
            });
        }
        Ok(real)
    }

    fn describe_roots(&self) -> String {
        self.roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `worker doctor`'s line on imports.
    pub fn doctor_line(&self) -> String {
        if self.roots.is_empty() {
            "imports: none (`brain run --dir` is refused here; start the worker with --import-root DIR to allow directories below DIR)".into()
        } else {
            format!(
                "imports: only below {} (--import-root), never the worker's state, secrets or --deny-read paths; read with the worker's own rights",
                self.describe_roots()
            )
        }
    }
}

struct Ws {
    scanner: Scanner,
    /// Which paths changed since the last barrier (none for an import directory, which is
    /// scanned once, or for a workspace that gave its tracker up).
    tracker: Option<Tracker>,
    /// Where the tracker's fences go (none for an import directory).
    fences: Option<PathBuf>,
    used: std::time::Instant,
    /// The tracker was not running all along: the next scan walks the whole tree.
    needs_full: bool,
    /// What was left out of the mirror as of the last barrier, already reported to the brain
    /// (each entry is named once while it stays left out).
    reported: HashMap<String, String>,
}

impl SyncState {
    fn ws(&self, name: &str, root: &Path, rules: &Rules, fences: &Path) -> Arc<Mutex<Ws>> {
        let ws = self
            .workspaces
            .locked()
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(Mutex::new(Ws {
                    scanner: Scanner::new(root, rules.clone()),
                    tracker: None,
                    fences: Some(fences.join(name)),
                    used: std::time::Instant::now(),
                    needs_full: true,
                    reported: HashMap::new(),
                }))
            })
            .clone();
        {
            let mut w = ws.locked();
            w.used = std::time::Instant::now();
            if w.tracker.is_none()
                && let Some(f) = w.fences.clone()
            {
                w.tracker = Some(Tracker::new(root, &f));
                w.needs_full = true;
            }
        }
        // Give trackers up: idle ones, then the least recently used beyond the cap. A
        // workspace busy right now is left alone.
        let all = self.workspaces.locked();
        let mut live: Vec<(std::time::Instant, std::sync::MutexGuard<'_, Ws>)> = all
            .values()
            .filter(|w| !Arc::ptr_eq(w, &ws))
            .filter_map(|w| w.try_lock().ok())
            .filter(|w| w.tracker.is_some())
            .map(|w| (w.used, w))
            .collect();
        live.sort_by_key(|(used, _)| std::cmp::Reverse(*used));
        for (i, (used, w)) in live.iter_mut().enumerate() {
            if i + 1 >= self.max_trackers || used.elapsed() > self.idle {
                w.tracker = None;
            }
        }
        ws
    }
}

/// Handles one request and reports how it ended.
pub async fn handle(
    req: SyncRequest,
    workspaces: PathBuf,
    channel: Channel,
    state: Arc<SyncState>,
    owner: Option<(u32, u32)>,
    imports: Imports,
) {
    let id = req.id;
    let mut client = SyncClient::new(channel)
        .max_decoding_message_size(shared::limits::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(shared::limits::MAX_MESSAGE_BYTES);
    let r = match tokio::time::timeout(
        RPC_TIMEOUT,
        run(&req, &workspaces, &mut client, &state, owner, &imports),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => Err(Error::TimedOut {
            workspace: req.workspace.clone(),
            after: RPC_TIMEOUT,
        }),
    };
    let report = r.unwrap_or_else(|error| {
        tracing::warn!(workspace = %req.workspace, %error, "sync failed");
        SyncReport {
            id,
            error: error.to_string(),
            ..Default::default()
        }
    });
    if let Err(e) = client.report(report).await {
        tracing::warn!(error = %e.message(), "cannot report a sync to the brain");
    }
}

async fn run(
    req: &SyncRequest,
    workspaces: &Path,
    client: &mut SyncClient<Channel>,
    state: &Arc<SyncState>,
    owner: Option<(u32, u32)>,
    imports: &Imports,
) -> Result<SyncReport, Error> {
    let mut rules = Rules {
        include_git: req.include_git,
        ..Rules::default()
    };
    if req.no_default_excludes {
        rules.excludes.clear();
    }
    rules.extend_excludes(&req.extra_excludes);
    if let Some(sync_request::Op::ImportDir(dir)) = &req.op {
        let dir = imports.check(dir)?;
        let ws = Arc::new(Mutex::new(Ws {
            scanner: Scanner::new(&dir, rules),
            tracker: None,
            fences: None,
            used: std::time::Instant::now(),
            needs_full: true,
            reported: HashMap::new(),
        }));
        let report = barrier(req.id, "", &dir, ws.clone(), client, true).await?;
        // Its files can seed the task's workspace without crossing the wire again.
        if let Some(m) = ws.locked().scanner.last() {
            let mut known = state.known.locked();
            for (p, e) in m.entries().iter().filter(|(_, e)| e.kind == Kind::File) {
                known.insert(e.hash.clone(), dir.join(p));
            }
        }
        return Ok(report);
    }
    let root = crate::state::workspace(workspaces, &req.workspace)?;
    // Fences live beside the workspaces, in the worker's state, where commands cannot write.
    let fences = workspaces.parent().unwrap_or(workspaces).join("fences");
    let ws = state.ws(&req.workspace, &root, &rules, &fences);
    match &req.op {
        Some(sync_request::Op::BarrierBase(base)) => {
            let mut report = barrier(req.id, base, &root, ws, client, req.full_scan).await?;
            // The workspace's temp dir counts towards the task's disk quota too.
            let tmp = workspaces.with_file_name("tmp").join(&req.workspace);
            (report.tmp_bytes, report.tmp_files) =
                tokio::task::spawn_blocking(move || crate::usage::of(&tmp))
                    .await
                    .unwrap_or_default();
            Ok(report)
        }
        Some(sync_request::Op::MaterialiseRoot(want)) => {
            materialise::materialise(req.id, want, &root, ws, client, owner, state).await
        }
        Some(sync_request::Op::ImportDir(_)) | None => Err(Error::NoOperation),
    }
}

fn raw(hash: &str) -> Vec<u8> {
    hex::decode(hash).unwrap_or_default()
}

/// Brings the scanner's manifest up to date: from the paths its tracker saw change, or a
/// walk of the whole tree when `full` or when the tracker cannot say.
fn scan_now(w: &mut Ws, full: bool) -> Result<(), Error> {
    let full = full || w.needs_full;
    let Ws {
        scanner,
        tracker,
        needs_full,
        ..
    } = w;
    let r = match tracker {
        Some(t) => match if full { None } else { t.take() } {
            Some(changed) => scanner.scan_changes(&changed, &mut |d| t.watch_dir(d)),
            None => {
                t.drain();
                scanner.scan_full(&mut |d| t.watch_dir(d))
            }
        },
        None => scanner.scan_full(&mut |_| {}),
    };
    r?;
    *needs_full = false;
    tracing::debug!(
        full = scanner.was_full,
        listed = scanner.listed,
        hashed = scanner.hashed,
        "scanned"
    );
    Ok(())
}

/// A barrier's scan: what to send.
struct Scanned {
    delta: manifest::Delta,
    /// The brain's manifest the delta is from ("" for none: the delta is everything).
    base_root: String,
    root_hash: String,
    files: u64,
    bytes: u64,
    hashed: u64,
    generation: u64,
    /// Entries left out that were not reported before, at most [`manifest::MAX_LEFT_OUT`],
    /// and how many more.
    left_out: Vec<proto::LeftOut>,
    left_out_more: u64,
}

/// The entries the last scan left out that were not reported yet (each once while it stays
/// left out): at most [`manifest::MAX_LEFT_OUT`] of them, and how many more. Marks them all
/// reported.
fn new_left_out(w: &mut Ws) -> (Vec<proto::LeftOut>, u64) {
    let now = w.scanner.left_out();
    let fresh: Vec<(&String, &String)> = now
        .iter()
        .filter(|(p, why)| w.reported.get(*p) != Some(*why))
        .collect();
    let more = fresh.len().saturating_sub(manifest::MAX_LEFT_OUT) as u64;
    let list: Vec<proto::LeftOut> = fresh
        .into_iter()
        .take(manifest::MAX_LEFT_OUT)
        .map(|(p, why)| proto::LeftOut {
            path: p.clone(),
            reason: why.clone(),
        })
        .collect();
    for l in &list {
        tracing::warn!(path = %l.path, reason = %l.reason, "left out of the workspace's mirror");
    }
    if more > 0 {
        tracing::warn!(more, "more entries left out of the workspace's mirror");
    }
    w.reported = now.iter().map(|(p, r)| (p.clone(), r.clone())).collect();
    (list, more)
}

/// Scans, and makes the delta from `brain_base` when the scanner knows the changes since
/// that manifest (it was the last one the brain confirmed), else from nothing.
fn scan_for_barrier(w: &mut Ws, full: bool, brain_base: &str) -> Result<Scanned, Error> {
    scan_now(w, full)?;
    let s = &w.scanner;
    let m = s.last().ok_or(Error::NoManifest)?;
    let since = s
        .changes_since_mark()
        .filter(|_| !brain_base.is_empty() && s.marked_root() == Some(brain_base));
    let (delta, base_root) = match since {
        Some(d) => (d, brain_base.to_string()),
        None => (Manifest::default().diff(m), String::new()),
    };
    let (root_hash, files, bytes, hashed, generation) = (
        m.root_hash(),
        m.files(),
        m.bytes(),
        s.hashed,
        s.generation(),
    );
    let (left_out, left_out_more) = new_left_out(w);
    Ok(Scanned {
        delta,
        base_root,
        root_hash,
        files,
        bytes,
        hashed,
        generation,
        left_out,
        left_out_more,
    })
}

/// The workspace's manifest now (a copy), and the files hashed to make it.
async fn scan(ws: &Arc<Mutex<Ws>>, full: bool) -> Result<(Manifest, u64), Error> {
    let ws = ws.clone();
    tokio::task::spawn_blocking(move || {
        let mut w = ws.locked();
        scan_now(&mut w, full)?;
        let m = w.scanner.last().cloned().ok_or(Error::NoManifest)?;
        Ok((m, w.scanner.hashed))
    })
    .await?
}

/// How many times a barrier is taken again when a file changes between its scan and its
/// upload.
const BARRIER_TRIES: usize = 3;

async fn barrier(
    id: u64,
    base_root: &str,
    root: &Path,
    ws: Arc<Mutex<Ws>>,
    client: &mut SyncClient<Channel>,
    full: bool,
) -> Result<SyncReport, Error> {
    let t0 = std::time::Instant::now();
    let mut tries = 0;
    // Left-out entries a try named before it had to scan again.
    let mut named: (Vec<proto::LeftOut>, u64) = (Vec::new(), 0);
    let (scanned, t_scan, missing, wire) = loop {
        tries += 1;
        let (ws2, brain_base) = (ws.clone(), base_root.to_string());
        // After a file changed under the upload, walk everything: the tracker may not have
        // seen how (a write through a memory mapping).
        let walk = full || tries > 1;
        let scanned = tokio::task::spawn_blocking(move || {
            scan_for_barrier(&mut ws2.locked(), walk, &brain_base)
        })
        .await??;
        let t_scan = t0.elapsed();
        match upload(id, &scanned.delta, root, client).await {
            Ok((missing, wire)) => break (scanned, t_scan, missing, wire),
            Err(why) if why.changed_under_us() && tries < BARRIER_TRIES => {
                tracing::info!(reason = %why, "a file changed during the barrier; scanning again");
                // Marked reported by this try: the report of the try that succeeds names them.
                named.0.extend(scanned.left_out);
                named.1 += scanned.left_out_more;
                continue;
            }
            Err(why) => return Err(why),
        }
    };
    let Scanned {
        delta,
        base_root,
        root_hash,
        files,
        bytes,
        hashed,
        generation,
        left_out,
        left_out_more,
    } = scanned;
    let (mut all, mut left_out_more) = (named.0, named.1 + left_out_more);
    all.extend(left_out);
    left_out_more += all.len().saturating_sub(manifest::MAX_LEFT_OUT) as u64;
    all.truncate(manifest::MAX_LEFT_OUT);
    let left_out = all;
    let mut wire = wire;
    let json = serde_json::to_vec(&delta).map_err(Error::Encode)?;
    let compressed = manifest::compress(&json);
    wire += compressed.len() as u64;
    let mut parts: Vec<DeltaChunk> = compressed
        .chunks(CHUNK)
        .map(|c| DeltaChunk {
            data: c.to_vec(),
            ..Default::default()
        })
        .collect();
    if parts.is_empty() {
        parts.push(DeltaChunk::default());
    }
    parts[0].request_id = id;
    parts[0].base_root = base_root;
    parts[0].root_hash = root_hash.clone();
    client
        .put_delta(tokio_stream::iter(parts))
        .await
        .map_err(Error::rpc("sending the delta"))?;
    let mut w = ws.locked();
    w.scanner.mark(generation, &root_hash);
    tracing::info!(
        full = w.scanner.was_full,
        listed = w.scanner.listed,
        hashed,
        changes = delta.upserts.len() + delta.deletes.len(),
        blobs = missing,
        left_out = w.scanner.left_out().len(),
        tries,
        scan_ms = t_scan.as_millis() as u64,
        send_ms = (t0.elapsed() - t_scan).as_millis() as u64,
        "barrier"
    );
    drop(w);
    Ok(SyncReport {
        id,
        error: String::new(),
        root_hash,
        files,
        bytes,
        blobs_sent: missing,
        wire_bytes: wire,
        hashed,
        left_out,
        left_out_more,
        ..Default::default()
    })
}

/// Blob chunks read and compressed ahead of the upload stream (each at most [`CHUNK`]): the
/// most a barrier holds in memory for its blobs, however large the tree.
const UPLOAD_AHEAD: usize = 16;

/// Sends the blobs of a delta's new content that the brain lacks; returns how many and the
/// compressed bytes sent.
///
/// One thread reads, checks and compresses the files while the stream carries what it has
/// made so far, so the brain decompresses, verifies and stores blob N while this side works
/// on blob N+1 (before, every blob was compressed before the first byte left, and the brain
/// sat idle until then). A file that changed since the scan ends the stream between two
/// blobs: the brain keeps the whole blobs it got, and the barrier scans again.
async fn upload(
    id: u64,
    delta: &manifest::Delta,
    root: &Path,
    client: &mut SyncClient<Channel>,
) -> Result<(u64, u64), Error> {
    // Only blobs of new content, and of those only what the brain lacks.
    let mut want: Vec<&str> = delta
        .upserts
        .values()
        .filter(|e| e.kind == Kind::File)
        .map(|e| e.hash.as_str())
        .collect();
    want.sort();
    want.dedup();
    let mut missing = Vec::new();
    for batch in want.chunks(HASH_BATCH) {
        let r = client
            .missing_blobs(BlobList {
                hashes: batch.iter().map(|h| raw(h)).collect(),
                request_id: id,
            })
            .await
            .map_err(Error::rpc("asking which blobs the brain lacks"))?;
        missing.extend(r.into_inner().hashes.into_iter().map(hex::encode));
    }
    if missing.is_empty() {
        return Ok((0, 0));
    }
    let by_hash: HashMap<&str, &str> = delta
        .upserts
        .iter()
        .filter(|(_, e)| e.kind == Kind::File)
        .map(|(p, e)| (e.hash.as_str(), p.as_str()))
        .collect();
    let mut jobs = Vec::with_capacity(missing.len());
    for h in missing {
        let Some(path) = by_hash.get(h.as_str()) else {
            return Err(Error::NotHere(h));
        };
        jobs.push((h, path.to_string()));
    }
    let count = jobs.len() as u64;
    let (tx, rx) = tokio::sync::mpsc::channel(UPLOAD_AHEAD);
    let root = root.to_path_buf();
    let producer = tokio::task::spawn_blocking(move || produce(&root, jobs, &tx));
    let sent = client
        .put_blobs(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await;
    match (producer.await?, sent) {
        // The file's own reason, not the short stream it made.
        (Produced::Stopped(why), _) => Err(why),
        (_, Err(s)) => Err(Error::rpc("uploading blobs")(s)),
        (Produced::Closed, Ok(_)) => Err(Error::StreamClosed),
        (Produced::All { wire }, Ok(_)) => Ok((count, wire)),
    }
}

/// How the reading side of an upload ended.
enum Produced {
    /// Every blob went into the stream: the compressed bytes.
    All { wire: u64 },
    /// A file could not be sent as scanned.
    Stopped(Error),
    /// The stream went away (the call failed: its status says why).
    Closed,
}

/// Reads, checks against its hash, compresses and queues each blob, a whole blob at a time.
fn produce(
    root: &Path,
    jobs: Vec<(String, String)>,
    tx: &tokio::sync::mpsc::Sender<BlobChunk>,
) -> Produced {
    let mut z = manifest::Compressor::new();
    let mut wire = 0u64;
    for (h, path) in jobs {
        let data = match read_nofollow(&root.join(&path)) {
            Ok(d) => d,
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(libc::ELOOP) =>
            {
                return Produced::Stopped(Error::Gone(path));
            }
            Err(source) => return Produced::Stopped(Error::Read { path, source }),
        };
        if manifest::hash(&data) != h {
            return Produced::Stopped(Error::Changed(path));
        }
        let compressed = z.compress(&data);
        drop(data);
        wire += compressed.len() as u64;
        let n = compressed.len().div_ceil(CHUNK).max(1);
        for (i, part) in compressed
            .chunks(CHUNK)
            .chain(std::iter::once(&[][..]))
            .take(n)
            .enumerate()
        {
            let chunk = BlobChunk {
                hash: if i == 0 { raw(&h) } else { vec![] },
                data: part.to_vec(),
                last: i + 1 == n,
            };
            if tx.blocking_send(chunk).is_err() {
                return Produced::Closed;
            }
        }
    }
    Produced::All { wire }
}

/// A regular file's content, never through a symlink.
fn read_nofollow(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::from_raw_os_error(libc::ELOOP));
    }
    let mut data = Vec::new();
    f.read_to_end(&mut data)?;
    Ok(data)
}

#[cfg(test)]
mod tests;
