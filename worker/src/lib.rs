//! The worker: enrols with a brain, keeps one session open to it, and runs the brain's calls
//! (commands and file operations) inside workspace directories under its state dir.

pub mod caps;
pub mod cli;
pub mod durable;
pub mod egress;
pub mod exec;
pub mod files;
pub mod giveup;
pub mod journal;
pub mod pulse;
pub mod sandbox;
pub mod session;
pub mod state;
pub mod sync;
pub mod track;
pub mod usage;
pub mod watch;

/// The exit status for an error that ended the worker (78 for configuration problems; see
/// `main.rs`).
pub fn exit_code(e: &anyhow::Error) -> shared::exit::ExitCode {
    use shared::exit::{by, classify};
    classify(
        e,
        &[
            by::<session::Error>,
            by::<state::Error>,
            by::<shared::pki::Error>,
            by::<shared::tls::Error>,
            by::<sandbox::Error>,
        ],
    )
}
