//! The `brain` command line: `init`, `serve`, the admin commands that talk to a running brain
//! over mutual TLS, how their answers are shown, and the demo.

/// `println!` for the CLI's answers: a closed output pipe ends the command quietly (141),
/// see `shared::stdout`; control characters in what it shows (a task's output, the model's
/// words) are written out, not obeyed (`shared::visible`).
macro_rules! out {
    ($($arg:tt)*) => {
        shared::outln!("{}", shared::visible::visible(&format!($($arg)*)))
    };
}

/// `eprintln!` for the CLI's messages, with control characters written out as `out!` does:
/// an error can quote what a task or a worker said.
macro_rules! err {
    ($($arg:tt)*) => {
        eprintln!("{}", shared::visible::visible(&format!($($arg)*)))
    };
}

mod args;
mod assists;
pub mod cli;
pub mod client;
pub mod demo;
mod follow;
mod glance;
mod progress;
mod prompt;
mod remote;
pub mod render;
mod results;
mod run_args;
mod secrets;
mod sent;
mod tasks;
mod web;
