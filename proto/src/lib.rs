//! The wire contract: generated prost messages and tonic services for package `tether.v1`.
//!
//! Only this crate knows the generated types' layout; conversions to domain types live next to
//! those types and reject bad input there.

#[allow(clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("tether.v1");
}

pub use v1::*;
