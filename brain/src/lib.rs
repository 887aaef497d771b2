//! The brain: the long-lived process that holds every task's state and drives workers.
//!
//! Today it enrols workers (`ca`, `registry`), keeps their sessions (`hub`, `service`) and
//! offers remote execution to admins; `serve` runs it and `client` reaches it.

pub mod agent;
pub mod backup;
pub mod ca;
pub mod cli;
pub mod client;
pub mod config;
pub mod demo;
pub mod hub;
pub mod import;
pub mod llm;
pub mod mirror;
pub mod provision;
pub mod registry;
pub mod serve;
pub mod service;
pub mod sync_service;
pub mod tasks;
