//! `open(O_CREAT)` of a name another client created meanwhile.
//!
//! The kernel sends CREATE only when it believes the name absent (its cached negative
//! entry, or a lookup that another client's create overtook). The create then finds
//! the name taken; without O_EXCL, open(2) must open what is there. The kernel marks
//! the file "created" whatever we answer, and so skips what it does for an existing
//! file: the permission check, O_TRUNC, O_NOATIME's owner check, the protected_regular
//! rule. Here they are done for a regular file as `may_open` and `handle_truncate`
//! would; anything the kernel must do itself (follow a symlink, open a FIFO or a
//! device, check a file carrying an ACL) is answered with ESTALE, on which the VFS
//! walks the path again with LOOKUP_REVAL, finds the name with a fresh lookup and
//! opens it in the ordinary way.

use super::{SpillwayFs, R};
use crate::caller::{Caller, CAP_FOWNER};
use fuser::{FileHandle, FopenFlags, Generation, ReplyCreate, Request};
use spillway_types::{Attr, Errno, FileKind, InodeNo};
use spillway_wire::messages::{setattr, SetAttrReq};

const ACL_ACCESS: &[u8] = b"system.posix_acl_access";

/// What `open_existing` opened: the file's attributes, the handle, its open flags.
pub(super) type Opened = (Attr, u64, FopenFlags);

/// fs.protected_regular (0, 1 or 2; missing: 0).
fn protected_regular() -> u32 {
    std::fs::read_to_string("/proc/sys/fs/protected_regular")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The kernel's `may_create_in_sticky` for an existing regular file: in a sticky
/// directory writable by others (by its group too, at level 2), O_CREAT may not open
/// a file the caller does not own unless the directory's owner owns it.
/// `dir` and `file` are (mode, uid).
fn sticky_refuses(level: u32, dir: (u32, u32), file_uid: u32, who: u32) -> bool {
    let (mode, dir_uid) = dir;
    if level == 0 || mode & libc::S_ISVTX == 0 {
        return false;
    }
    let world = mode & 0o002 != 0;
    let group = mode & 0o020 != 0;
    if !(world || (level >= 2 && group)) {
        return false;
    }
    file_uid != who && file_uid != dir_uid
}

/// The access open(2) asks for: 4 read, 2 write (O_TRUNC implies write).
fn wanted(flags: i32) -> u32 {
    let mut want = match flags & libc::O_ACCMODE {
        libc::O_RDONLY => 4,
        libc::O_WRONLY => 2,
        _ => 6,
    };
    if flags & libc::O_TRUNC != 0 {
        want |= 2;
    }
    want
}

impl SpillwayFs {
    /// Answer the kernel's CREATE with the file `open_existing` opened.
    pub(super) fn reply_existing(&self, (attr, fh, fopen): Opened, reply: ReplyCreate) {
        // The kernel counts the answer as a lookup of the inode.
        self.t.remember(&attr, true);
        let fattr = self.fuse_attr(&attr);
        let ttl = self.tun.entry_ttl;
        reply.created(&ttl, &fattr, Generation(0), FileHandle(fh), fopen);
    }

    /// Open the existing `name` in `parent` as open(2) would have, for a CREATE that
    /// found it taken. ENOENT: the name went again (the caller creates it afresh).
    pub(super) fn open_existing(
        &self,
        req: &Request,
        parent: InodeNo,
        name: &[u8],
        flags: i32,
    ) -> R<Opened> {
        if flags & libc::O_EXCL != 0 {
            return Err(Errno::EEXIST);
        }
        let (_, attr) = self.inst.lookup(parent, name)?;
        match attr.kind {
            FileKind::Regular => {}
            FileKind::Directory => return Err(Errno::EISDIR),
            _ => return Err(Errno::ESTALE),
        }
        match self.inst.get_xattr(attr.ino, ACL_ACCESS) {
            Ok(v) if !v.is_empty() => return Err(Errno::ESTALE),
            _ => {}
        }
        let who = Caller::of(req.uid(), req.gid(), req.pid());
        if !who.may(attr.mode, attr.uid, attr.gid, wanted(flags)) {
            return Err(Errno::EACCES);
        }
        if flags & libc::O_NOATIME != 0 && who.uid != attr.uid && !who.has_cap(CAP_FOWNER) {
            return Err(Errno::EPERM);
        }
        let dir = self.dir_attr(parent)?;
        if sticky_refuses(protected_regular(), (dir.mode, dir.uid), attr.uid, who.uid) {
            return Err(Errno::EACCES);
        }
        let (fh, fopen) = self.open_file(attr.ino, flags as u32, None)?;
        if flags & libc::O_TRUNC == 0 {
            let attr = self.t.attr(attr.ino).unwrap_or(attr);
            return Ok((attr, fh, fopen));
        }
        let mut trunc = SetAttrReq::of(attr.ino);
        trunc.valid = setattr::SIZE;
        trunc.size = 0;
        match self.do_setattr(attr.ino, trunc) {
            Ok(a) => {
                self.t.remember(&a, false);
                Ok((a, fh, fopen))
            }
            Err(e) => {
                let _ = self.do_release(fh);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_wanted_by_open_flags() {
        assert_eq!(wanted(libc::O_RDONLY), 4);
        assert_eq!(wanted(libc::O_WRONLY | libc::O_APPEND), 2);
        assert_eq!(wanted(libc::O_RDWR), 6);
        assert_eq!(wanted(libc::O_RDONLY | libc::O_TRUNC), 6);
    }

    #[test]
    fn protected_regular_in_sticky_directories() {
        let tmp = (0o1777, 0);
        assert!(sticky_refuses(1, tmp, 2000, 1000));
        assert!(!sticky_refuses(0, tmp, 2000, 1000), "off");
        assert!(!sticky_refuses(1, tmp, 1000, 1000), "the caller's own");
        assert!(!sticky_refuses(1, tmp, 0, 1000), "the directory owner's");
        let group_sticky = (0o1770, 0);
        assert!(!sticky_refuses(1, group_sticky, 2000, 1000));
        assert!(sticky_refuses(2, group_sticky, 2000, 1000));
        assert!(!sticky_refuses(2, (0o777, 0), 2000, 1000), "not sticky");
    }
}
