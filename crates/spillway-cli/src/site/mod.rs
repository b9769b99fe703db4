//! What a site runs: the commands of a production installation (storage servers, the
//! manager, the compute nodes' agents and mounts) and its users' tools.
//!
//! * `services` — `spillway server`, `spillway manager`, `spillway agent`,
//!   `spillway tls init`; the daemons' logging.
//! * `agent`    — a compute node's agent: mounts what the manager asks for, below its
//!   mount root.
//! * `mount`    — `spillway mount` (the FUSE client) and `spillway umount`.
//! * `run`      — `spillway run`: a `#DW` job script through the burst-buffer phases.
//! * `stripes`  — `spillway stripes`, `spillway setstripe`.
//!
//! **Rule:** nothing here uses `crate::dev` (the development commands `spillway
//! cluster` and `spillway local`): a site runs this code without them. It builds on
//! `crate::sys` and `crate::args` only; `dev` may use `site`, never the reverse.

pub mod agent;
pub mod mount;
pub mod run;
pub mod services;
pub mod stripes;
