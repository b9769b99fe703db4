//! The wire layer: how bytes on a TCP connection become requests and replies.
//! Kept apart from what the requests mean (the server's handlers, the client's file
//! system), as `fuser` keeps the FUSE wire apart from its API.
//!
//! * `codec`   — the field encodings (little-endian, length-prefixed), bounds-checked.
//! * `frame`   — the 20-byte frame header and frame reading with a size limit.
//! * `messages`— every request and reply, with its opcode.
//! * `conn`    — a client connection: many calls in flight, each with a deadline.
//!   (`conn/sendq` — its send queue: write-behind frames written by a thread of its own.)
//! * `serve`   — the server side: handshake, dispatch to a worker pool, replies.

// `pub` marks what other crates may name; everything else is `pub(crate)` or narrower.
#![warn(unreachable_pub)]

pub mod codec;
pub mod conn;
pub mod frame;
pub mod messages;
pub mod serve;

pub use codec::{Bulk, Dec, Enc, Wire, WireError};
pub use conn::{Conn, CredentialSource, Endpoint, OwnedCall, PendingCall};
pub use frame::{FrameHeader, FrameKind, HEADER_LEN};
pub use messages::*;

/// Protocol versions this build speaks. Negotiated in `Hello`.
pub const PROTOCOL_VERSION: u16 = 1;
