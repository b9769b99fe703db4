//! The Spillway client: a FUSE file system process behind a mount, talking to the
//! instance's storage servers directly.
//!
//! * `spillway_stubs::Instance` — the servers of one instance and the client stubs,
//!   one per server handler (`lookup` here ↔ `LookupReq` there), placed by
//!   `spillway-placement` (its own crate: the servers' stage coordinator uses it too).
//! * `nodes`    — what this client knows of inodes and open files.
//! * `coherence`— what the kernel caches of a file against other clients' changes:
//!   checked at open, when a lock is granted and at fsync (docs/data-plane.md).
//! * `notices`  — the homes' notices of other mounts' changes to files open here, each
//!   dropping what the kernel caches of the file before the writer's fsync returns.
//! * `writeback`— the per-file write-back buffer (close-to-open: flushed at close/fsync),
//!   sent through the write stubs (`spillway_stubs::write`).
//! * `grants`   — the space each server promised this client (write-behind needs it).
//! * `inval`    — dropping the kernel's cache of a file whose written-behind bytes were lost.
//! * `dirahead` — listing subdirectories ahead of a walk (`find`, `du`, `rm -r`).
//! * `fs`       — the FUSE operations, each mapped onto the stubs (`fs/existing.rs`:
//!   an O_CREAT open of a name another client made meanwhile).
//! * `gate`     — a cache mount's root refused to callers who cannot reach the cached
//!   directory on the PFS (the protection of the directories above it).
//! * `locks`    — fcntl, OFD and flock locks held at the inodes' homes.
//! * `caller`   — the calling thread's groups, capabilities, syscall and signals.
//! * `acl`      — POSIX ACLs: what a new inode inherits, the directories' default ACLs.
//! * `mount`    — mounting, the kernel connection's settings, and unmount on SIGTERM.
//! * `control`  — libdatawarp's ioctl channel: its codec, the bridge to the manager's
//!   REST API, and what each request does.
//! * `root`     — which directory of the instance the mount shows as its root (private
//!   mounts), and the translation of inode numbers and paths across the FUSE boundary.

// `pub` marks what other crates may name; everything else is `pub(crate)` or narrower.
#![warn(unreachable_pub)]

pub mod acl;
mod caller;
mod coherence;
pub mod control;
mod dirahead;
pub mod fs;
mod gate;
pub mod grants;
mod inval;
pub mod locks;
pub mod mount;
pub mod nodes;
mod notices;
pub mod root;
pub mod writeback;

pub use mount::{mount_foreground, MountArgs};
pub use root::MountRoot;
pub use spillway_stubs::{instance, Instance};
