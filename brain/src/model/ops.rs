//! What the engine asks of a worker and what comes back, in the brain's own terms. The
//! conversions to and from the wire are written once, in `api::convert`.

use serde::{Deserialize, Serialize};

use super::event::ToolResult;

/// How much a task may keep on its worker's disk, in its workspace and temp dir together;
/// 0 leaves one unset. Checked at every barrier: a task over it is stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskQuota {
    pub bytes: u64,
    pub files: u64,
}

impl DiskQuota {
    /// Why a task holding `bytes` in `files` entries is over the quota, if it is.
    pub fn exceeded(&self, bytes: u64, files: u64) -> Option<String> {
        if self.bytes > 0 && bytes > self.bytes {
            return Some(format!(
                "over its disk quota: the workspace and its temp dir hold {} (the quota is {}); delete what the task does not need, or raise the brain's disk quota",
                shared::human_bytes(bytes),
                shared::human_bytes(self.bytes)
            ));
        }
        if self.files > 0 && files > self.files {
            return Some(format!(
                "over its disk quota: the workspace and its temp dir hold {files} files and directories (the quota is {}); delete what the task does not need, or raise the brain's quota of files",
                self.files
            ));
        }
        None
    }
}

/// Resource limits for a command; 0 (or `false`) leaves one unset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub memory_bytes: u64,
    pub pids: u32,
    pub cpus: f64,
    pub file_size_bytes: u64,
    pub cpu_seconds: u64,
    pub network_off: bool,
}

impl Limits {
    /// The tighter of `self` and `other`, field by field (an unset field takes the other's).
    pub fn tighten(&self, other: &Limits) -> Limits {
        let min = |a: u64, b: u64| match (a, b) {
            (0, x) | (x, 0) => x,
            (a, b) => a.min(b),
        };
        Limits {
            memory_bytes: min(self.memory_bytes, other.memory_bytes),
            pids: min(u64::from(self.pids), u64::from(other.pids)) as u32,
            cpus: match (self.cpus, other.cpus) {
                (a, b) if a <= 0.0 => b.max(0.0),
                (a, b) if b <= 0.0 => a,
                (a, b) => a.min(b),
            },
            file_size_bytes: min(self.file_size_bytes, other.file_size_bytes),
            cpu_seconds: min(self.cpu_seconds, other.cpu_seconds),
            network_off: self.network_off || other.network_off,
        }
    }
}

/// A durable command: the worker that gets it journals it under `call_id` and runs it at
/// most once, however often it is asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Command {
    pub call_id: u64,
    pub workspace: String,
    pub argv: Vec<String>,
    /// Workspace-relative directory to start in; empty: the root.
    pub cwd: String,
    pub timeout_ms: u64,
    pub output_cap_bytes: u64,
    pub limits: Limits,
    /// Added to the command's environment: placeholders of the task's secrets, never values.
    pub env: Vec<(String, String)>,
    /// The command runs behind its worker's egress proxy.
    pub egress: Option<Egress>,
}

/// What a worker needs to run a call behind its egress proxy (see [`crate::model::egress`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Egress {
    pub task: String,
    /// The call's grant, which the worker shows when it opens a tunnel for the call.
    pub grant: String,
    /// Where the worker connects by itself; everything else is asked of the brain.
    pub direct: Vec<crate::model::egress::AllowRule>,
    /// The egress CA's certificate, for the commands' CA bundle.
    pub ca_pem: String,
    /// Names the operator pinned to addresses (`[egress.resolve]`).
    pub resolve: Vec<(String, std::net::IpAddr)>,
}

/// How a durable command ended, as far as the brain can tell.
#[derive(Debug, Clone, PartialEq)]
pub enum CommandEnd {
    /// The worker ran it (now or before): its result and captured output.
    Finished {
        result: ToolResult,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
    },
    /// The worker says a process of its died while the call ran: nobody can tell what the
    /// call did.
    Interrupted(String),
    /// The worker did not come back within the wait.
    WorkerGone,
}

/// Which output stream a chunk is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// A piece of a running command's output, as it is produced (not logged).
#[derive(Debug, Clone, PartialEq)]
pub struct OutputChunk {
    pub call_id: u64,
    pub stream: Stream,
    pub data: Vec<u8>,
}

/// A file operation in a task's workspace. Paths are workspace-relative.
#[derive(Debug, Clone, PartialEq)]
pub enum FileOp {
    /// `length` 0: to the end (the worker caps one read).
    Read {
        path: String,
        offset: u64,
        length: u64,
    },
    Write {
        path: String,
        data: Vec<u8>,
        mode: u32,
        create_dirs: bool,
    },
    /// `max_results` 0: the worker's default.
    Find { glob: String, max_results: u32 },
    Search {
        pattern: String,
        glob: String,
        max_matches: u32,
    },
}

/// One line a search found.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchMatch {
    pub path: String,
    pub line: u32,
    pub text: String,
}

/// The answer to a [`FileOp`].
#[derive(Debug, Clone, PartialEq)]
pub enum FileAnswer {
    Data {
        data: Vec<u8>,
        file_size: u64,
    },
    Done,
    Paths {
        paths: Vec<String>,
        truncated: bool,
    },
    Matches {
        matches: Vec<SearchMatch>,
        truncated: bool,
        files_searched: u32,
    },
    /// The worker refused or failed it; the message says why.
    Error(String),
    /// An answer of a kind the operation does not have.
    Unexpected(&'static str),
}

/// What a sync request asks of a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncOp {
    /// Make the mirror equal to the worker's disk; `base` is the root the brain holds.
    Barrier { base: String },
    /// Make the worker's disk equal to the mirror's manifest `root`.
    Materialise { root: String },
    /// Store a directory of the worker's own (outside its workspaces) in the mirror.
    ImportDir { dir: String },
}

/// A worker's report of a sync request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Empty when it worked.
    pub error: String,
    pub root_hash: String,
    pub files: u64,
    pub bytes: u64,
    pub blobs_sent: u64,
    pub wire_bytes: u64,
    pub hashed: u64,
    /// Entries the worker left out of the mirror (bounded, names escaped), and how many more
    /// it left out without naming them.
    pub left_out: Vec<shared::manifest::LeftOut>,
    pub left_out_more: u64,
    /// Barriers: what the workspace's temp dir holds (bytes of files, entries).
    pub tmp_bytes: u64,
    pub tmp_files: u64,
}

/// Files a worker's watcher saw change in a workspace (a live hint, not a barrier).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsChange {
    pub workspace: String,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
    /// More changed than these lists name (the watcher fell behind, or cut the list).
    pub incomplete: bool,
}

/// Where a task is, for placement's count of what runs on each worker: the worker it runs
/// on (or is moving to), and whether it is moving there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occupancy {
    pub worker: String,
    pub moving: bool,
}
