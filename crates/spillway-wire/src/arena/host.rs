//! What "the same host" means for shared-memory bulk: the same kernel, since its boot
//! (`/proc/sys/kernel/random/boot_id`), and the same network namespace. The second
//! condition keeps hosts that tests and developer clusters model with network
//! namespaces apart, as they would be on separate machines, and matches the door's
//! abstract socket, which is visible only within its namespace.

use std::os::unix::fs::MetadataExt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostId {
    pub(crate) boot_id: Vec<u8>,
    /// `st_dev` and `st_ino` of `/proc/self/ns/net`.
    pub(crate) netns: (u64, u64),
}

impl HostId {
    /// This process's host, or None where /proc does not tell (then nothing is shared).
    pub(crate) fn current() -> Option<HostId> {
        let boot = std::fs::read("/proc/sys/kernel/random/boot_id").ok()?;
        let boot_id = boot.trim_ascii().to_vec();
        if boot_id.is_empty() {
            return None;
        }
        let ns = std::fs::metadata("/proc/self/ns/net").ok()?;
        Some(HostId {
            boot_id,
            netns: (ns.dev(), ns.ino()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_host_is_itself() {
        let a = HostId::current().unwrap();
        assert_eq!(a.boot_id.len(), 36, "a UUID");
        assert_eq!(Some(a), HostId::current());
    }
}
