//! Development commands: a whole system on one machine, for developers, tests and the
//! demo. Never what a site runs.
//!
//! * `cluster` — `spillway cluster`: N storage servers and one mount of one instance,
//!   playing the manager's part (no control plane).
//! * `local`   — `spillway local`: a whole site (manager, servers, agents) on this
//!   machine, each a real process.
//!
//! These build on `crate::site` (the API client) and `crate::sys`; nothing in `site`
//! or `sys` uses them.

pub mod cluster;
pub mod local;
