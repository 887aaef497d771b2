//! The `worker` binary.
//!
//! Exit status: 0 done; 2 bad flags (clap); 78 (`EX_CONFIG` of sysexits.h) a configuration
//! problem that running again will not fix: not joined yet, a missing, unreadable or invalid
//! identity or membership file, a malformed brain URL or CA hash, a brain whose CA does not
//! match the pinned hash; 1 anything else. The systemd units in deploy/ restart the worker
//! on failure but not on 78 (`RestartPreventExitStatus=78`).

use std::process::ExitCode;

use shared::pki::Error as PkiError;
use shared::tls::Error as TlsError;
use worker::session::Error as SessionError;
use worker::state::Error as StateError;

/// sysexits.h: configuration error.
const EX_CONFIG: u8 = 78;

fn main() -> ExitCode {
    match worker::cli::main_with(std::env::args_os()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The same report as returning the error from `main` would print.
            eprintln!("Error: {e:?}");
            ExitCode::from(if is_config_error(&e) { EX_CONFIG } else { 1 })
        }
    }
}

/// Whether anything in the error's chain is a configuration problem.
fn is_config_error(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        if let Some(e) = c.downcast_ref::<SessionError>() {
            session_config(e)
        } else if let Some(e) = c.downcast_ref::<StateError>() {
            state_config(e)
        } else if let Some(e) = c.downcast_ref::<PkiError>() {
            pki_config(e)
        } else if let Some(e) = c.downcast_ref::<TlsError>() {
            tls_config(e)
        } else {
            false
        }
    })
}

// Variants not named here count as not configuration (exit 1), so a variant added later
// needs a look here but cannot break the build.

fn session_config(e: &SessionError) -> bool {
    match e {
        SessionError::State(e) => state_config(e),
        SessionError::Pki(e) => pki_config(e),
        SessionError::Tls(e) => tls_config(e),
        // The brain's CA is not the pinned one: the --ca-hash or the URL is wrong.
        SessionError::CaMismatch { .. } => true,
        // `Refused` carries any status the brain or the transport gave, some of them
        // transient; `AlreadyJoined` is a usage error.
        _ => false,
    }
}

fn state_config(e: &StateError) -> bool {
    match e {
        StateError::NotJoined(_) | StateError::Invalid { .. } => true,
        StateError::Pki(e) => pki_config(e),
        _ => false,
    }
}

/// Key material that is missing, unreadable or malformed, or a bad --ca-hash. Not: failing
/// to write a file or to generate a key.
fn pki_config(e: &PkiError) -> bool {
    matches!(
        e,
        PkiError::Read { .. }
            | PkiError::Pem { .. }
            | PkiError::Certificate(_)
            | PkiError::CaHash(_)
            | PkiError::Tls(_)
    )
}

/// A malformed brain URL; not a failed connection.
fn tls_config(e: &TlsError) -> bool {
    matches!(e, TlsError::Url { .. })
}
