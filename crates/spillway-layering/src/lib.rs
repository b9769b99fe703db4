//! The layering of Spillway's crates and files, read from their sources and checked by
//! `tests/layering.rs` (the rules, and why, are in docs/layering.md). No dependencies and
//! no compiler: the sources are read as text, well enough for the way this workspace
//! writes Rust (`use` declarations, `mod` declarations, `crate::`/`super::` paths).
//!
//! * `lex`       — comments and literals blanked out, lines kept.
//! * `tokens`    — tokens with line numbers; `#[cfg(test)]` items removed.
//! * `uses`      — `use` declarations as leaves (grouped, nested, aliased, globs).
//! * `model`     — one target's modules, items, imports and named paths; path resolution.
//! * `deps`      — a target's file → file dependencies.
//! * `graph`     — cycles as strongly connected components, shown as chains.
//! * `manifest`  — package name and normal dependencies from a `Cargo.toml`.
//! * `workspace` — every crate of the workspace: manifest and targets.

// `pub` marks what other crates may name; everything else is `pub(crate)` or narrower.
#![warn(unreachable_pub)]

pub mod deps;
pub mod graph;
pub mod lex;
pub mod manifest;
pub mod model;
pub mod tokens;
pub mod uses;
pub mod workspace;
