//! The `brain` command line: `init`, `serve`, the admin commands that talk to a running brain
//! over mutual TLS, how their answers are shown, and the demo.

pub mod cli;
pub mod client;
pub mod demo;
pub mod render;
