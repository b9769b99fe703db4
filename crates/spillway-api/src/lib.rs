//! The manager's REST API as Rust types, and the client the command line and the agent
//! use to reach it.
//!
//! * `model`  — resources as the manager returns them (DataWarp's JSON shapes) and the
//!   bodies of create/update requests.
//! * `client` — HTTPS with the site CA, one fresh MUNGE credential per request.
//! * `config` — the `key = value` files every Spillway daemon and tool reads.
//! * `size`   — byte counts as people write them (`200GiB`) and as `dwstat` prints them.

pub mod client;
pub mod config;
pub mod model;
pub mod size;

pub use client::{ApiClient, ApiError};
pub use model::*;
