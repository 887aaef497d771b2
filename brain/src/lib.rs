//! The brain: the long-lived process that holds every task's state and drives workers.
//!
//! Layers, lowest first; a module uses only those below it (the tidy test checks):
//! `storage` (the sled database, backups) · `llm` (model providers) · `model` (pure: events,
//! task state, `apply`, agent state, tools) · `trust` (CA, registry) · `mirror` (workspace
//! blobs and manifests) · `git` (the brain's own git: imports, commits, pushes, pull
//! requests) · `egress` (the brain's side of the egress proxy: TLS termination, placeholder
//! swaps, upstream TLS, masking) · `fleet` (worker sessions, placement) · `provision` (machines) ·
//! `engine` (log, store, supervisor, drivers, ports) · `config` (the config file) · `api`
//! (tonic adapters) · `web` (the HTTP API, event streams and the page) · `app` (the composition root) · `admin` (the CLI, rendering, demo).
//! ARCHITECTURE.md has the map.

pub mod admin;
pub mod api;
pub mod app;
pub mod config;
pub mod egress;
pub mod engine;
pub mod fleet;
pub mod git;
pub mod llm;
pub mod mirror;
pub mod model;
pub mod provision;
pub mod storage;
pub mod trust;
pub mod web;
