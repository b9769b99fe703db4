//! The manager's REST API as Rust types, and the client the command line and the agent
//! use to reach it.
//!
//! * `model`  — resources as the manager returns them (DataWarp's JSON shapes) and the
//!   bodies of create/update requests.
//! * `client` — HTTPS with the site CA, one fresh MUNGE credential per request.
//! * `routes` — every route's pattern as the manager's router matches it.
//! * `paths`  — the path of every request (one builder per route), and `query` its
//!   query string (one struct per query, shared with the manager).
//! * `calls`  — the typed calls (`ApiClient::create_stage`, `list_pools`, ...).
//! * `config` — the `key = value` files every Spillway daemon and tool reads.
//! * `size`   — byte counts as people write them (`200GiB`) and as `dwstat` prints them.
//! * `stage_path` — the one rule for stage paths (instance and PFS sides) and their
//!   normal form, shared by the manager, job scripts and the client's ioctl.

// `pub` marks what other crates may name; everything else is `pub(crate)` or narrower.
#![warn(unreachable_pub)]

pub mod calls;
pub mod client;
pub mod config;
pub mod model;
pub mod paths;
pub mod query;
pub mod routes;
pub mod size;
pub mod stage_path;

pub use calls::{Destroyed, Resources};
pub use client::{ApiClient, ApiError};
pub use model::*;
