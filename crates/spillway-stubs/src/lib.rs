//! The client stubs of one instance: its servers (an `Endpoint` each) and one call per
//! server handler (`lookup` here ↔ `LookupReq` there), each sent to the server the
//! placement functions name. Used by the FUSE client (`spillway-client`) and by the
//! storage servers' stage coordinator, which walks and fills an instance's namespace as
//! a peer.
//!
//! * `instance` — the servers, placement helpers and the metadata and read stubs;
//! * `write`    — the write stubs (a piece waited for, a piece in flight owning its
//!   bytes for write-behind, a write-through run) and grant release;
//! * `sparse`   — fallocate and SEEK_DATA/SEEK_HOLE over the servers of a range;
//! * `locks`    — byte-range and flock locks at the inodes' homes;
//! * `watch`    — a mount's watch of a server: the change notices it sends.

// `pub` marks what other crates may name; everything else is `pub(crate)` or narrower.
#![warn(unreachable_pub)]

pub mod instance;
pub mod locks;
pub mod sparse;
pub mod watch;
pub mod write;

pub use instance::Instance;
/// The buffer a write's or a read's bytes live in: the heap, or a slot of the client's
/// shared-memory arena (docs/wire-protocol.md, "Shared-memory bulk").
pub use spillway_wire::Payload;
pub use watch::{Told, Watching, WatchingCloser};
pub use write::{Charge, PendingWrite};
