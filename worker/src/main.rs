//! The `worker` binary.
//!
//! Exit status ([`shared::exit::ExitCode`]): 0 done; 2 bad flags (clap); 78 (`EX_CONFIG` of
//! sysexits.h) a configuration problem that running again will not fix: not joined yet, a
//! missing, unreadable or invalid identity or membership file, a malformed brain URL or CA
//! hash, a brain whose CA does not match the pinned hash, a brain that no longer takes this
//! worker (revoked, removed, or given a newer certificate); 1 anything else. The systemd units
//! in deploy/ restart the worker on failure but not on 78 (`RestartPreventExitStatus=78`).

fn main() -> std::process::ExitCode {
    match worker::cli::main_with(std::env::args_os()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // What failed and why, each cause after a colon: never a backtrace, whatever
            // RUST_BACKTRACE says (the message names the fix; frames would hide it).
            eprintln!("Error: {e:#}");
            worker::exit_code(&e).into()
        }
    }
}
