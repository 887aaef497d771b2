//! The `brain` command line: `init`, `serve`, the admin commands that talk to a running brain
//! over mutual TLS, how their answers are shown, and the demo.

/// `println!` for the CLI's answers: a closed output pipe ends the command quietly (141),
/// see `shared::stdout`.
macro_rules! out {
    ($($arg:tt)*) => {
        shared::outln!($($arg)*)
    };
}

mod args;
pub mod cli;
pub mod client;
pub mod demo;
mod follow;
mod progress;
mod remote;
pub mod render;
mod results;
mod run_args;
mod secrets;
mod tasks;
mod web;
