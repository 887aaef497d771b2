//! The `brain` command line: `init`, `serve`, the admin commands that talk to a running brain
//! over mutual TLS, how their answers are shown, and the demo.

/// `println!` for the CLI's answers: when stdout is a pipe whose reader has gone
/// (`brain machines | head -1`), the command ends there, quietly, with 141 (128 + SIGPIPE)
/// as a Unix tool killed by SIGPIPE would; `println!` would panic instead.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(141);
        }
    }};
}

mod args;
pub mod cli;
pub mod client;
pub mod demo;
mod follow;
mod remote;
pub mod render;
mod results;
mod web;
