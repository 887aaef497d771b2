//! The `brain` command line: `init`, `serve`, the admin commands that talk to a running brain
//! over mutual TLS, how their answers are shown, and the demo.

mod args;
pub mod cli;
pub mod client;
pub mod demo;
mod follow;
mod remote;
pub mod render;
