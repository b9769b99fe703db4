//! POSIX ACLs in the client. The kernel enforces them (`FUSE_POSIX_ACL` with
//! `default_permissions`) from the `system.posix_acl_*` xattrs it reads through us,
//! checks the owner and the format before a set reaches us, and leaves the rest to the
//! file system: the servers keep the mode and the access ACL consistent
//! (`spillway_types::acl`), and the client decides what a new inode inherits, because
//! the new inode's home may not be its directory's. The directory's default ACL is
//! read from its home and cached for the attribute lifetime (dropped by this client's
//! own changes to it); the inherited ACLs travel with the create, so the inode and its
//! ACLs come into being in one transaction.

use crate::nodes::Tables;
use spillway_stubs::Instance;
use spillway_types::acl::{inherit, Acl, ACCESS_XATTR, DEFAULT_XATTR};
use spillway_types::{Errno, FileKind, InodeNo};
use spillway_wire::messages::Xattr;
use std::time::{Duration, Instant};

pub fn is_acl_name(name: &[u8]) -> bool {
    name == ACCESS_XATTR || name == DEFAULT_XATTR
}

/// A directory's default ACL (`None`: it has none), from its node's cache while that
/// is younger than `ttl`, otherwise from its home.
pub fn dir_default(
    inst: &Instance,
    t: &Tables,
    ttl: Duration,
    dir: InodeNo,
) -> Result<Option<Vec<u8>>, Errno> {
    if let Some((at, v)) = t.nodes().get(&dir).and_then(|n| n.default_acl.clone()) {
        if at.elapsed() < ttl {
            return Ok(v);
        }
    }
    let v = match inst.get_xattr(dir, DEFAULT_XATTR) {
        Ok(v) => Some(v),
        Err(e) if e == Errno::ENODATA => None,
        Err(e) => return Err(e),
    };
    remember_default(t, dir, v.clone());
    Ok(v)
}

/// What a directory's default ACL now is, as this client just made it.
pub fn remember_default(t: &Tables, dir: InodeNo, v: Option<Vec<u8>>) {
    if let Some(n) = t.nodes().get_mut(&dir) {
        n.default_acl = Some((Instant::now(), v));
    }
}

/// A change to a directory's default ACL went to its home (or may have): ask again.
pub fn forget_default(t: &Tables, dir: InodeNo) {
    if let Some(n) = t.nodes().get_mut(&dir) {
        n.default_acl = None;
    }
}

/// How a new inode is created.
pub struct NewInode {
    /// Its mode (permission and special bits).
    pub mode: u32,
    /// The ACLs it is created with.
    pub xattrs: Vec<Xattr>,
    /// A directory's default ACL, to seed its node's cache.
    pub default: Option<Vec<u8>>,
}

/// An inode's access ACL (`None`: it has none). The kernel asks for it on a
/// non-owner's permission check right after refreshing the attributes (it drops its
/// cached ACLs then), so every such check would cost a second round trip to the home.
/// Every change of an ACL (setxattr, removexattr, chmod) moves the inode's ctime in the
/// same transaction: the value is answered from the node while its attributes, fetched
/// less than `ttl` ago, show the ctime they had before the value was read.
pub fn access(inst: &Instance, t: &Tables, ttl: Duration, ino: InodeNo) -> Result<Vec<u8>, Errno> {
    let before = {
        let nodes = t.nodes();
        let n = nodes.get(&ino);
        let fresh = n
            .and_then(|n| n.fetched)
            .is_some_and(|at| at.elapsed() < ttl);
        match n {
            Some(n) if fresh => {
                if let Some((ctime, v)) = &n.access_acl {
                    if *ctime == n.attr.ctime {
                        return v.clone().ok_or(Errno::ENODATA);
                    }
                }
                Some(n.attr.ctime)
            }
            _ => None,
        }
    };
    let r = inst.get_xattr(ino, ACCESS_XATTR);
    let v = match &r {
        Ok(v) => Some(v.clone()),
        Err(e) if *e == Errno::ENODATA => None,
        Err(_) => return r,
    };
    if let Some(ctime) = before {
        if let Some(n) = t.nodes().get_mut(&ino) {
            n.access_acl = Some((ctime, v));
        }
    }
    r
}

/// This client changed (or may have changed) an inode's ACLs or mode: ask again.
pub fn forget_access(t: &Tables, ino: InodeNo) {
    if let Some(n) = t.nodes().get_mut(&ino) {
        n.access_acl = None;
    }
}

/// A new inode of `kind` and `mode` (permission and special bits) in `parent`. The
/// umask applies only when the directory has no default ACL (`posix_acl_create()`);
/// symlinks take neither.
pub fn for_create(
    inst: &Instance,
    t: &Tables,
    ttl: Duration,
    parent: InodeNo,
    kind: FileKind,
    mode: u32,
    umask: u32,
) -> Result<NewInode, Errno> {
    if kind == FileKind::Symlink {
        return Ok(NewInode {
            mode,
            xattrs: Vec::new(),
            default: None,
        });
    }
    let default = match dir_default(inst, t, ttl, parent)? {
        Some(v) => Some(Acl::parse(&v).map_err(|e| {
            // The home validated it when it stored it.
            tracing::error!(%parent, "default ACL from the server does not parse: {e}");
            Errno::EIO
        })?),
        None => None,
    };
    let got = inherit(default.as_ref(), kind == FileKind::Directory, mode, umask);
    let mut xattrs = Vec::new();
    if let Some(v) = got.access {
        xattrs.push(Xattr {
            name: ACCESS_XATTR.to_vec(),
            value: v,
        });
    }
    if let Some(v) = &got.default {
        xattrs.push(Xattr {
            name: DEFAULT_XATTR.to_vec(),
            value: v.clone(),
        });
    }
    Ok(NewInode {
        mode: got.mode,
        xattrs,
        default: got.default,
    })
}

/// Whether setting an access ACL must clear the file's set-group-ID bit, as
/// `posix_acl_update_mode()` does: the caller is not in the file's group and lacks
/// CAP_FSETID. The kernel tells the file system with FUSE_SETXATTR_ACL_KILL_SGID only
/// through FUSE_SETXATTR_EXT, which fuser does not parse, so the client asks /proc
/// for the caller's supplementary groups and capabilities. A caller that is gone is
/// judged on its uid and fsgid alone.
pub fn kill_sgid(pid: u32, uid: u32, fsgid: u32, file_gid: u32) -> bool {
    if fsgid == file_gid {
        return false;
    }
    let status = match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(s) => s,
        Err(_) => return uid != 0,
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let in_group = field("Groups:").is_some_and(|g| {
        g.split_whitespace()
            .any(|x| x.parse::<u32>() == Ok(file_gid))
    });
    const CAP_FSETID: u32 = 4;
    let fsetid = field("CapEff:")
        .and_then(|c| u64::from_str_radix(c, 16).ok())
        .is_some_and(|c| c & (1 << CAP_FSETID) != 0);
    !in_group && !fsetid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_sgid_from_proc() {
        let me = std::process::id();
        // SAFETY: getuid/getgid/getegid only read this process's credentials.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getegid()) };
        assert!(!kill_sgid(me, uid, gid, gid), "own group");
        // A group nobody here is in: killed unless this process holds CAP_FSETID
        // (root in the test environment does).
        let root = uid == 0;
        assert_eq!(kill_sgid(me, uid, gid, 4_000_000_000), !root);
        // A process that is gone: judged on the uid.
        assert!(kill_sgid(u32::MAX - 1, 1000, 1000, 5));
        assert!(!kill_sgid(u32::MAX - 1, 0, 0, 5));
    }
}
