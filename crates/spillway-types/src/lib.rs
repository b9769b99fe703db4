//! Types every Spillway component shares: typed ids, file attributes, the instance
//! descriptor handed to clients, client capabilities, stage tickets, and the
//! tunables; and the one way small files (keys, secrets, descriptors) are written and
//! private state is kept private (`files`); logging that never fails (`logging`).

// `pub` marks what other crates may name; everything else is `pub(crate)` or narrower.
#![warn(unreachable_pub)]

pub mod acl;
pub mod attr;
pub mod capability;
pub mod descriptor;
pub mod errno;
pub mod files;
pub mod identity;
pub mod ids;
pub mod logging;
pub mod peer;
pub mod rlimit;
mod signed;
pub mod stage_ticket;
pub mod tunables;

pub use attr::{Attr, FileKind, Timespec};
pub use capability::{Capability, CapabilityError};
pub use descriptor::{DescriptorError, InstanceDescriptor};
pub use errno::Errno;
pub use ids::{InodeNo, InstanceId, ServerIndex, StripeIndex, ROOT_INODE};
pub use stage_ticket::{StageTicket, TicketError};
pub use tunables::Tunables;
