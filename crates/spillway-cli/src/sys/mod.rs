//! The operating system as the commands use it: processes, this host, mounts,
//! daemonizing and SIGPIPE. The lowest layer of the crate: it knows no command and
//! uses neither `crate::site` nor `crate::dev`.
//!
//! * `proc`    — pids: alive, stop, start a detached daemon with a log.
//! * `host`    — the host name, a free port.
//! * `mounts`  — the mount table, unmounting, a mount's client process.
//! * `daemon`  — fork into the background, the parent waiting until the child is ready.
//! * `pipe`    — SIGPIPE's default action for one-shot commands; `say!`.

pub mod daemon;
pub mod host;
pub mod mounts;
pub mod pipe;
pub mod proc;
