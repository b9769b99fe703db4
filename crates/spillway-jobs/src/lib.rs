//! Job scripts and the burst-buffer phases of a job.
//!
//! * `script`    — finding `#DW`/`#BB` lines the way Slurm does (leading block,
//!   continuations).
//! * `directive` — the grammar of one directive, every value checked.
//! * `job`       — a whole script checked and resolved into a [`JobSpec`]: one job
//!   instance, stage paths with `$DW_*` expanded to (instance, path).
//! * `error`     — one message per wrong line, each naming its line.
//! * `input`     — bounded reads of the files the tools are given, and long values cut
//!   from messages.
//! * `phases`    — the burst-buffer phases of a job on the manager's REST API, shared
//!   by `dw_wlm_cli`, `burst_buffer.lua` (through it) and `spillway run`.

// `pub` marks what other crates may name; everything else is `pub(crate)` or narrower.
#![warn(unreachable_pub)]

pub mod directive;
pub mod error;
pub mod input;
pub mod job;
pub mod phases;
pub mod script;

pub use error::{ScriptError, ScriptErrors};
pub use job::JobSpec;
