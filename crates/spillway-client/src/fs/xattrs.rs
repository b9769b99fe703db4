//! Extended attributes. Most are stored at the inode's home as they are; some are
//! answered here: the virtual `user.spillway.*` ones (a file's placement, its stripe
//! geometry), the POSIX ACLs when the kernel enforces them (acl.rs), and
//! `security.capability`, which the kernel asks before every write and is cached.

use super::{SpillwayFs, LAYOUT_XATTR, R, STRIPE_SIZE_XATTR, STRIPE_WIDTH_XATTR, SYNC_XATTR};
use crate::acl;
use fuser::Request;
use spillway_types::acl::{Acl, ACCESS_XATTR, DEFAULT_XATTR};
use spillway_types::{Errno, InodeNo};
use spillway_wire::messages::xattr_flags;

/// Asked by the kernel before every write; cached per inode (see `Node::capability`).
const CAPABILITY_XATTR: &[u8] = b"security.capability";

impl SpillwayFs {
    /// Set an xattr: the virtual ones and ACLs are handled here, the rest of system.*
    /// refused, anything else stored at the home.
    pub(super) fn do_setxattr(
        &self,
        req: &Request,
        i: InodeNo,
        n: &[u8],
        value: &[u8],
        flags: i32,
    ) -> R<()> {
        if n == LAYOUT_XATTR {
            return Err(Errno::EPERM);
        }
        if n == STRIPE_SIZE_XATTR || n == STRIPE_WIDTH_XATTR {
            return self.set_stripe_param(i, n, value);
        }
        if n == SYNC_XATTR {
            return self.sync_to_pfs(i);
        }
        if self.acl && acl::is_acl_name(n) {
            return self.set_acl(req, i, n, value, flags as u32);
        }
        if n.starts_with(b"system.") {
            // Nothing else of system.* is stored (nor were ACLs, if the kernel would
            // not enforce them).
            return Err(Errno::EOPNOTSUPP);
        }
        self.forget_capability(i);
        // The change moves the inode's ctime on the server.
        self.t.stale(i);
        self.inst.set_xattr(i, n, value, flags as u32)
    }

    /// An xattr's value: the virtual ones answered here, the ACLs and the capability
    /// from this client's caches while fresh, anything else from the home.
    pub(super) fn do_getxattr(&self, i: InodeNo, n: &[u8]) -> R<Vec<u8>> {
        if self.acl && n == DEFAULT_XATTR {
            return acl::dir_default(&self.inst, &self.t, self.tun.attr_ttl, i)
                .and_then(|v| v.ok_or(Errno::ENODATA));
        }
        if self.acl && n == ACCESS_XATTR {
            return acl::access(&self.inst, &self.t, self.tun.attr_ttl, i);
        }
        if n.starts_with(b"system.") {
            return Err(Errno::ENODATA);
        }
        if n == LAYOUT_XATTR {
            return self.layout_json(i);
        }
        if n == STRIPE_SIZE_XATTR || n == STRIPE_WIDTH_XATTR {
            return self.inst.getattr(i).map(|a| {
                let v = if n == STRIPE_SIZE_XATTR {
                    u64::from(a.stripe_size)
                } else {
                    u64::from(a.stripe_width)
                };
                v.to_string().into_bytes()
            });
        }
        if n == CAPABILITY_XATTR {
            return self.capability(i);
        }
        self.inst.get_xattr(i, n)
    }

    /// The stored names, each ending in a NUL, as listxattr(2) returns them.
    pub(super) fn do_listxattr(&self, i: InodeNo) -> R<Vec<u8>> {
        self.inst.list_xattr(i).map(|names| {
            let mut buf = Vec::new();
            for n in names {
                buf.extend_from_slice(&n);
                buf.push(0);
            }
            buf
        })
    }

    /// Remove an xattr; the virtual ones cannot be, nor the rest of system.*.
    pub(super) fn do_removexattr(&self, i: InodeNo, n: &[u8]) -> R<()> {
        if self.acl && acl::is_acl_name(n) {
            // Removing the access ACL leaves the mode as it is (the server's rule).
            self.t.stale(i);
            acl::forget_default(&self.t, i);
            acl::forget_access(&self.t, i);
            return self.inst.remove_xattr(i, n);
        }
        if n.starts_with(b"system.")
            || n == LAYOUT_XATTR
            || n == STRIPE_SIZE_XATTR
            || n == STRIPE_WIDTH_XATTR
        {
            return Err(Errno::EOPNOTSUPP);
        }
        self.forget_capability(i);
        self.t.stale(i);
        self.inst.remove_xattr(i, n)
    }

    /// Set one stripe parameter (size or width) of a file or directory.
    fn set_stripe_param(&self, i: InodeNo, name: &[u8], value: &[u8]) -> R<()> {
        let v: u64 = std::str::from_utf8(value)
            .ok()
            .and_then(|s| s.trim().trim_end_matches('\0').parse().ok())
            .ok_or(Errno::EINVAL)?;
        // Data still buffered here counts as data: it must reach the servers first, so
        // the home can refuse a change to a file that is no longer empty.
        if let Some(wb) = self.t.writeback(i) {
            self.note_flushed(wb.flush()?);
        }
        let cur = self.inst.getattr(i)?;
        let (size, width) = if name == STRIPE_SIZE_XATTR {
            (
                u32::try_from(v).map_err(|_| Errno::EINVAL)?,
                cur.stripe_width,
            )
        } else {
            (
                cur.stripe_size,
                u16::try_from(v).map_err(|_| Errno::EINVAL)?,
            )
        };
        let attr = self.inst.set_layout(i, size, width)?;
        if let Some(wb) = self.t.writeback(i) {
            wb.relayout(&attr);
        }
        self.t.remember(&attr, false);
        Ok(())
    }

    /// Set a POSIX ACL (the kernel checked the caller owns the inode, or is root, and
    /// the format); the home updates the mode with an access ACL.
    fn set_acl(&self, req: &Request, i: InodeNo, name: &[u8], value: &[u8], flags: u32) -> R<()> {
        let mut flags = flags;
        if name == ACCESS_XATTR {
            let gid = self.dir_attr(i)?.gid;
            if acl::kill_sgid(req.pid(), req.uid(), req.gid(), gid) {
                flags |= xattr_flags::ACL_KILL_SGID;
            }
        }
        // The mode (access ACL) and ctime change at the home.
        self.t.stale(i);
        acl::forget_access(&self.t, i);
        let r = self.inst.set_xattr(i, name, value, flags);
        if name == DEFAULT_XATTR {
            // As the home stores it (canonical form), or ask it next time.
            match (&r, Acl::parse(value)) {
                (Ok(()), Ok(a)) => acl::remember_default(&self.t, i, Some(a.to_bytes())),
                _ => acl::forget_default(&self.t, i),
            }
        }
        r
    }

    /// `security.capability` of an inode, from the per-node cache while it is fresh.
    fn capability(&self, i: InodeNo) -> R<Vec<u8>> {
        let fresh = |t: &std::time::Instant| t.elapsed() < self.tun.attr_ttl;
        if let Some((t, v)) = self.t.nodes().get(&i).and_then(|n| n.capability.clone()) {
            if fresh(&t) {
                return v.ok_or(Errno::ENODATA);
            }
        }
        let r = self.inst.get_xattr(i, CAPABILITY_XATTR);
        let cached = match &r {
            Ok(v) => Some(Some(v.clone())),
            Err(e) if *e == Errno::ENODATA => Some(None),
            Err(_) => None,
        };
        if let Some(c) = cached {
            if let Some(n) = self.t.nodes().get_mut(&i) {
                n.capability = Some((std::time::Instant::now(), c));
            }
        }
        r
    }

    fn forget_capability(&self, i: InodeNo) {
        if let Some(n) = self.t.nodes().get_mut(&i) {
            n.capability = None;
        }
    }

    fn layout_json(&self, i: InodeNo) -> R<Vec<u8>> {
        let attr = self.inst.getattr(i)?;
        let l = self.inst.layout(&attr);
        let doc = serde_json::json!({
            "instance": self.inst.desc.instance,
            "ino": i.0,
            "size": attr.size,
            "stripe_size": l.stripe_size,
            "stripe_width": l.width,
            "start": l.start,
            "servers": self.inst.desc.servers,
            "descriptor": self.origin,
        });
        Ok(doc.to_string().into_bytes())
    }
}

impl SpillwayFs {
    /// `user.spillway.sync`: this client's written-behind changes of the file to the
    /// servers, then the servers' to the PFS (a cache instance's; `SYNC_XATTR`).
    fn sync_to_pfs(&self, i: InodeNo) -> R<()> {
        if !self.inst.desc.cache {
            return Err(Errno::EOPNOTSUPP);
        }
        if let Some(wb) = self.t.writeback(i) {
            wb.flush().map(|a| self.note_flushed(a))?;
        }
        self.inst
            .cache_flush(i, spillway_wire::messages::flush_scope::FILE)
    }
}
