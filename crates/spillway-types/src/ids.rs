//! Typed ids, so that an inode number is never passed where a stripe index belongs.

use std::fmt;

/// An inode number inside one instance. The top 16 bits name the server that allocated
/// it (its *home*, which holds its attributes); the low 48 bits count on that server.
/// The root directory is inode 1, homed on server 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InodeNo(pub u64);

pub const ROOT_INODE: InodeNo = InodeNo(1);

/// Bits of an inode number that count inodes on their home server.
pub const INODE_COUNTER_BITS: u32 = 48;

impl InodeNo {
    /// The inode number server `home` gives its `counter`-th inode.
    pub fn compose(home: ServerIndex, counter: u64) -> InodeNo {
        InodeNo(
            (u64::from(home.0) << INODE_COUNTER_BITS) | (counter & ((1 << INODE_COUNTER_BITS) - 1)),
        )
    }
    /// The server that holds this inode's attributes.
    pub fn home(self) -> ServerIndex {
        ServerIndex((self.0 >> INODE_COUNTER_BITS) as u16)
    }
    pub fn counter(self) -> u64 {
        self.0 & ((1 << INODE_COUNTER_BITS) - 1)
    }
}

impl fmt::Display for InodeNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Position of a server (fragment) in an instance's ordered server list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServerIndex(pub u16);

impl fmt::Display for ServerIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}

/// Index of a stripe within one file: bytes `[k*stripe_size, (k+1)*stripe_size)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StripeIndex(pub u64);

/// Id of an instance (allocated by the manager; chosen by `spillway cluster` locally).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId(pub u64);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_homed_on_server_zero() {
        assert_eq!(ROOT_INODE.home(), ServerIndex(0));
        assert_eq!(ROOT_INODE.counter(), 1);
    }

    #[test]
    fn compose_round_trips() {
        let ino = InodeNo::compose(ServerIndex(7), 12345);
        assert_eq!(ino.home(), ServerIndex(7));
        assert_eq!(ino.counter(), 12345);
        assert_eq!(ino.0, (7u64 << 48) | 12345);
    }
}
