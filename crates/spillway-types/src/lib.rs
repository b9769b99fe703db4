//! Types every Spillway component shares: typed ids, file attributes, the instance
//! descriptor handed to clients, client capabilities, and the tunables; and the one way
//! small files (keys, secrets, descriptors) are written (`files`).

pub mod attr;
pub mod capability;
pub mod descriptor;
pub mod errno;
pub mod files;
pub mod ids;
pub mod tunables;

pub use attr::{Attr, FileKind, Timespec};
pub use capability::{Capability, CapabilityError};
pub use descriptor::{DescriptorError, InstanceDescriptor};
pub use errno::Errno;
pub use ids::{InodeNo, InstanceId, ServerIndex, StripeIndex, ROOT_INODE};
pub use tunables::Tunables;
