//! Writing a command's answer to stdout the way Unix tools do: when the reader has gone
//! (`brain machines | head -1`), the command ends there, quietly, with 141 (128 + SIGPIPE),
//! as a tool killed by SIGPIPE would. `println!` would panic instead, and an ignored error
//! would go on working for nobody.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use crate::locks::Lock;

/// The exit status of a command whose output pipe closed.
pub const CLOSED_PIPE: i32 = 141;

/// Directories to remove if the process ends on a closed pipe (an exit runs no destructors).
static TEMP_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Removes `dir` too when the process ends on a closed pipe (a temp dir the demo made).
pub fn remove_on_closed_pipe(dir: PathBuf) {
    TEMP_DIRS.locked().push(dir);
}

/// Ends the process as a closed output pipe does: quietly, with 141, leaving no temp dir.
pub fn closed() -> ! {
    for d in TEMP_DIRS.locked().drain(..) {
        let _ = std::fs::remove_dir_all(d);
    }
    std::process::exit(CLOSED_PIPE)
}

/// Writes `bytes` to stdout and flushes; a closed pipe ends the process quietly.
pub fn write_or_exit(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    if out.write_all(bytes).and_then(|()| out.flush()).is_err() {
        closed();
    }
}

/// `println!` that ends the process quietly (141) when stdout's reader has gone.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            $crate::stdout::closed();
        }
    }};
}

/// `print!` (flushed) that ends the process quietly (141) when stdout's reader has gone.
#[macro_export]
macro_rules! outp {
    ($($arg:tt)*) => {{
        $crate::stdout::write_or_exit(format!($($arg)*).as_bytes())
    }};
}
