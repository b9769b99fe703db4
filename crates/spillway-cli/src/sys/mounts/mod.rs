//! Mounts as the kernel has them, for every command that looks at or takes down a
//! Spillway mount: the agent, `spillway umount`, `spillway cluster` and `spillway local`.
//!
//! **What is mounted** is the kernel's word, never a path string: a directory is a
//! mount point when its mount id (statx `STATX_MNT_ID`) differs from its parent's, and
//! it is Spillway's when `/proc/self/mountinfo` lists that mount id as a FUSE mount of
//! source `spillway:<instance>`.
//!
//! * `fd`     — statx, `openat(O_NOFOLLOW)`, `mkdirat` on descriptors (the unsafe calls).
//! * `table`  — the mount table: `MountEntry`, `Mounted`, `mount_state`, `is_mounted`.
//! * `umount` — unmounting: `umount_once`, `umount_if_idle`, `unmount`.
//! * `client` — a mount's `spillway mount` process: `is_client_of`, `stop_client`.
//!
//! Where root may mount (the agent's mount root) is the agent's rule, not this
//! module's: `site::agent::mount_root`.

pub mod client;
pub mod fd;
pub mod table;
pub mod umount;

pub use client::{is_client_of, stop_client};
pub use table::{is_mounted, mount_state, Mounted};
pub use umount::{umount_if_idle, unmount};
