//! The wire layer: how bytes on a TCP connection become requests and replies.
//! Kept apart from what the requests mean (the server's handlers, the client's file
//! system), as `fuser` keeps the FUSE wire apart from its API.
//!
//! * `codec`   — the field encodings (little-endian, length-prefixed), bounds-checked.
//! * `frame`   — the 20-byte frame header and frame reading with a size limit.
//! * `messages`— every request and reply, with its opcode.
//! * `conn`    — a client connection: many calls in flight, each with a deadline.
//!   (`conn/sendq` — its send queue: write-behind frames written by a thread of its own;
//!   `conn/attach` — attaching the client's arena to a new connection.)
//! * `serve`   — the server side: handshake, dispatch to a worker pool, replies.
//! * `arena`   — shared-memory bulk between a client and a server on one host.

// `pub` marks what other crates may name; everything else is `pub(crate)` or narrower.
#![warn(unreachable_pub)]

pub mod arena;
pub mod codec;
pub mod conn;
pub mod frame;
pub mod messages;
pub mod serve;
// The arena end to end (door, connections, a server), beside the parts it joins.
#[cfg(test)]
// Tests: raw syscalls on descriptors they made themselves.
#[allow(clippy::undocumented_unsafe_blocks)]
mod arena_tests;
#[cfg(test)]
mod testkit;

pub use arena::{Arena, ArenaBuf, ArenaLink, ArenaSlice, Payload};
pub use codec::{Bulk, Dec, Enc, Wire, WireError};
pub use conn::{
    ArenaRead, Conn, CredentialSource, Endpoint, Notice, OwnedCall, PendingCall, PendingRead,
    Watch, WatchCloser,
};
pub use frame::{FrameHeader, FrameKind, HEADER_LEN};
pub use messages::*;

/// Protocol versions this build speaks. Negotiated in `Hello`.
pub const PROTOCOL_VERSION: u16 = 1;
