//! The worker: enrols with a brain, keeps one session open to it, and runs the brain's calls
//! (commands and file operations) inside workspace directories under its state dir.

pub mod caps;
pub mod cli;
pub mod durable;
pub mod exec;
pub mod files;
pub mod journal;
pub mod sandbox;
pub mod session;
pub mod state;
pub mod sync;
pub mod track;
pub mod watch;
