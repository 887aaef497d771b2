//! What the brain and the workers must agree on: identities and TLS configuration, the
//! path-confinement rule for every path that comes off the wire, where state lives on disk,
//! and logging set-up.

pub mod beneath;
pub mod dirs;
pub mod exit;
pub mod fsio;
pub mod locks;
pub mod paths;
pub mod pki;
pub mod scan;
pub mod signals;
pub mod stdout;
pub mod telemetry;
pub mod tls;
pub mod visible;
pub mod workspace;

/// Limits both sides enforce on what crosses the wire.
pub mod manifest;
pub mod net;

pub mod limits {
    /// Largest gRPC message either side accepts.
    pub const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;
    /// Largest file payload one read or write call carries.
    pub const MAX_FILE_CHUNK_BYTES: u64 = 4 * 1024 * 1024;
    /// Default cap on one command's combined stdout and stderr.
    pub const DEFAULT_OUTPUT_CAP_BYTES: u64 = 4 * 1024 * 1024;
    /// Upper bound on any requested output cap.
    pub const MAX_OUTPUT_CAP_BYTES: u64 = 256 * 1024 * 1024;
    /// Default timeout of one command.
    pub const DEFAULT_EXEC_TIMEOUT_MS: u64 = 10 * 60 * 1000;
    /// Longest argv (in bytes, summed) accepted for one command.
    pub const MAX_ARGV_BYTES: usize = 256 * 1024;
    /// Most entries one directory listing returns.
    pub const MAX_LIST_ENTRIES: usize = 100_000;
}

/// Makes this process's memory closed to other processes of its user, as ssh-agent does
/// (`PR_SET_DUMPABLE` 0): `/proc/PID/environ`, `mem`, `fd` and the rest become root's, and
/// ptrace and `process_vm_readv` are refused, so a command running as the same user cannot
/// read the keys this process holds. It also means no core dumps. Programs it starts are
/// not affected (exec resets the flag).
pub fn close_memory_to_same_user() -> std::io::Result<()> {
    use rustix::process::{DumpableBehavior, set_dumpable_behavior};
    Ok(set_dumpable_behavior(DumpableBehavior::NotDumpable)?)
}

/// Kills this process with SIGKILL when `TETHER_FAILPOINT` names `point`: how the crash
/// tests stop the brain at an exact place in a flow (a provisioning, a delivery).
pub fn failpoint(point: &str) {
    if std::env::var("TETHER_FAILPOINT").is_ok_and(|v| v == point) {
        tracing::warn!(point, "failpoint reached: killing this process");
        use rustix::process::{Signal, getpid, kill_process};
        let _ = kill_process(getpid(), Signal::KILL);
    }
}

/// Milliseconds since the Unix epoch, for timestamps on the wire and in records.
pub fn now_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Why a duration, a size or a label given as text does not parse (each message shows the
/// text and what would do). Also the error of the command-line parsers built on these.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    #[error("invalid duration {text:?}: {source} (examples: 30s, 15m, 1h)")]
    Duration {
        text: String,
        #[source]
        source: humantime::DurationError,
    },
    #[error("invalid size {0:?} (examples: 512MiB, 2G, 65536)")]
    SizeNumber(String),
    #[error("invalid size {text:?}: unknown unit {unit:?}")]
    SizeUnit { text: String, unit: String },
    #[error("size {0:?} is too large")]
    SizeTooLarge(String),
    #[error("invalid label {0:?}: expected key=value")]
    LabelForm(String),
    #[error("invalid label {0:?}: keys are 1-63 and values 0-255 characters of [A-Za-z0-9._/-]")]
    LabelChars(String),
}

/// Parses a human duration such as `30s`, `15m` or `1h 30m`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, ParseError> {
    humantime::parse_duration(s.trim()).map_err(|source| ParseError::Duration {
        text: s.to_string(),
        source,
    })
}

/// Parses a size such as `512MiB`, `2G`, `64k` or `1048576` (binary units).
pub fn parse_bytes(s: &str) -> Result<u64, ParseError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| ParseError::SizeNumber(s.to_string()))?;
    let mul: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(ParseError::SizeUnit {
                text: s.to_string(),
                unit: unit.to_string(),
            });
        }
    };
    n.checked_mul(mul)
        .ok_or_else(|| ParseError::SizeTooLarge(s.to_string()))
}

/// A size for people, in binary units: `1 GiB`, `64 MiB`, `1.5 GiB`, `512 bytes`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (size, unit) in UNITS {
        if n >= size {
            return if n.is_multiple_of(size) {
                format!("{} {unit}", n / size)
            } else {
                format!("{:.1} {unit}", n as f64 / size as f64)
            };
        }
    }
    format!("{n} bytes")
}

/// Parses a `key=value` label.
pub fn parse_label(s: &str) -> Result<(String, String), ParseError> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| ParseError::LabelForm(s.to_string()))?;
    let valid = |x: &str| {
        x.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
    };
    if k.is_empty() || k.len() > 63 || !valid(k) || v.len() > 255 || !valid(v) {
        return Err(ParseError::LabelChars(s.to_string()));
    }
    Ok((k.to_string(), v.to_string()))
}
