//! Attributes of inodes homed on this server.

use crate::error::{fs, StoreError, StoreResult};
use crate::meta::{rows, MetaStore};
use spillway_types::tunables::MAX_STRIPE_SIZE;
use spillway_types::{Attr, Errno, FileKind, InodeNo, Timespec};
use spillway_wire::{setattr, SetAttrReq};

const SETATTR_KNOWN: u32 = setattr::MODE
    | setattr::UID
    | setattr::GID
    | setattr::SIZE
    | setattr::ATIME
    | setattr::MTIME
    | setattr::ATIME_NOW
    | setattr::MTIME_NOW
    | setattr::CTIME
    | setattr::SIZE_WRITTEN;

/// Apply the `valid` fields of a SetAttr to `a` (the data truncation a smaller size
/// needs happens before, on every server of the layout). A request with bits this
/// server does not know is refused whole rather than half applied.
fn apply_setattr(a: &mut Attr, req: &SetAttrReq, now: Timespec) -> StoreResult<()> {
    let v = req.valid;
    if v & !SETATTR_KNOWN != 0 {
        return Err(fs(Errno::EINVAL));
    }
    if v & setattr::SIZE != 0 {
        match a.kind {
            FileKind::Regular => {
                // POSIX: a truncate that changes the size marks mtime (and ctime) for
                // update; the kernel does not always send a time with it.
                if a.size != req.size && v & (setattr::MTIME | setattr::MTIME_NOW) == 0 {
                    a.mtime = now;
                }
                a.size = req.size;
            }
            FileKind::Directory => return Err(fs(Errno::EISDIR)),
            _ => return Err(fs(Errno::EINVAL)),
        }
    }
    if v & setattr::SIZE_WRITTEN != 0 {
        if a.kind != FileKind::Regular {
            return Err(fs(Errno::EINVAL));
        }
        a.size = a.size.max(req.size);
    }
    if v & setattr::MODE != 0 {
        a.mode = req.mode & 0o7777;
    }
    if v & setattr::UID != 0 {
        a.uid = req.uid;
    }
    if v & setattr::GID != 0 {
        a.gid = req.gid;
    }
    // The kernel sets ATIME together with ATIME_NOW; "now" wins.
    if v & setattr::ATIME_NOW != 0 {
        a.atime = now;
    } else if v & setattr::ATIME != 0 {
        a.atime = req.atime;
    }
    if v & setattr::MTIME_NOW != 0 {
        a.mtime = now;
    } else if v & setattr::MTIME != 0 {
        a.mtime = req.mtime;
    }
    if v & setattr::CTIME != 0 {
        a.ctime = req.ctime;
    } else if v != 0 {
        a.ctime = now;
    }
    Ok(())
}

fn add_links(nlink: u32, delta: i32) -> u32 {
    (i64::from(nlink) + i64::from(delta)).clamp(0, i64::from(u32::MAX)) as u32
}

impl MetaStore {
    pub fn get_attr(&self, ino: InodeNo) -> StoreResult<Attr> {
        self.with(|c| rows::get_inode(c, ino)?.ok_or(fs(Errno::ENOENT)))
    }

    pub fn set_attr(&self, req: &SetAttrReq) -> StoreResult<Attr> {
        self.txn(|tx| {
            let mut a = rows::get_inode(tx, req.ino)?.ok_or(fs(Errno::ENOENT))?;
            apply_setattr(&mut a, req, Timespec::now())?;
            rows::update_inode(tx, &a)?;
            if req.valid & setattr::MODE != 0 {
                super::xattrs::chmod_acl(tx, &a)?;
            }
            Ok(a)
        })
    }

    /// Many setattrs in one transaction (see `create_many`).
    pub fn set_attr_many(&self, reqs: &[SetAttrReq]) -> StoreResult<Vec<StoreResult<Attr>>> {
        self.txn(|tx| {
            let now = Timespec::now();
            reqs.iter()
                .map(|req| {
                    let r = rows::get_inode(tx, req.ino)
                        .and_then(|a| a.ok_or(fs(Errno::ENOENT)))
                        .and_then(|mut a| {
                            apply_setattr(&mut a, req, now)?;
                            rows::update_inode(tx, &a)?;
                            if req.valid & setattr::MODE != 0 {
                                super::xattrs::chmod_acl(tx, &a)?;
                            }
                            Ok(a)
                        });
                    match r {
                        Err(e @ StoreError::Fs(_)) => Ok(Err(e)),
                        Err(e) => Err(e),
                        Ok(a) => Ok(Ok(a)),
                    }
                })
                .collect()
        })
    }

    /// nlink += delta (floored at 0), ctime = now. The caller purges the inode if this
    /// left it without links and nobody has it open.
    pub fn link_count(&self, ino: InodeNo, delta: i32) -> StoreResult<Attr> {
        self.txn(|tx| {
            let mut a = rows::get_inode(tx, ino)?.ok_or(fs(Errno::ENOENT))?;
            a.nlink = add_links(a.nlink, delta);
            a.ctime = Timespec::now();
            rows::update_inode(tx, &a)?;
            Ok(a)
        })
    }

    /// A directory's entries changed: mtime = ctime = now, nlink += delta.
    pub fn touch_dir(&self, ino: InodeNo, nlink_delta: i32) -> StoreResult<Attr> {
        self.txn(|tx| {
            let mut a = rows::get_inode(tx, ino)?.ok_or(fs(Errno::ENOENT))?;
            a.nlink = add_links(a.nlink, nlink_delta);
            let now = Timespec::now();
            a.mtime = now;
            a.ctime = now;
            rows::update_inode(tx, &a)?;
            Ok(a)
        })
    }

    /// Data was written up to `size`: grow the size (never shrink), touch if asked.
    pub fn extend_size(&self, ino: InodeNo, size: u64, touch: bool) -> StoreResult<Attr> {
        self.txn(|tx| {
            let mut a = rows::get_inode(tx, ino)?.ok_or(fs(Errno::ENOENT))?;
            let grows = size > a.size;
            a.size = a.size.max(size);
            if touch {
                let now = Timespec::now();
                a.mtime = now;
                a.ctime = now;
            }
            if grows || touch {
                rows::update_inode(tx, &a)?;
            }
            if touch {
                super::allocs::provisional_blocks(tx, &mut a)?;
            }
            Ok(a)
        })
    }

    /// Stripe geometry of a file without data (EBUSY once it has a size), or of a
    /// directory (the default of files created in it).
    pub fn set_layout(
        &self,
        ino: InodeNo,
        stripe_size: u32,
        stripe_width: u16,
        servers: u16,
    ) -> StoreResult<Attr> {
        if stripe_size == 0 || !stripe_size.is_multiple_of(4096) || stripe_size > MAX_STRIPE_SIZE {
            return Err(fs(Errno::EINVAL));
        }
        if stripe_width > servers {
            return Err(fs(Errno::EINVAL));
        }
        let width = if stripe_width == 0 {
            servers
        } else {
            stripe_width
        };
        self.txn(|tx| {
            let mut a = rows::get_inode(tx, ino)?.ok_or(fs(Errno::ENOENT))?;
            match a.kind {
                FileKind::Regular if a.size > 0 => return Err(fs(Errno::EBUSY)),
                FileKind::Regular | FileKind::Directory => {}
                _ => return Err(fs(Errno::EINVAL)),
            }
            a.stripe_size = stripe_size;
            a.stripe_width = width;
            a.ctime = Timespec::now();
            rows::update_layout(tx, &a)?;
            Ok(a)
        })
    }

    pub fn read_link(&self, ino: InodeNo) -> StoreResult<Vec<u8>> {
        self.with(|c| {
            let a = rows::get_inode(c, ino)?.ok_or(fs(Errno::ENOENT))?;
            if a.kind != FileKind::Symlink {
                return Err(fs(Errno::EINVAL));
            }
            rows::get_target(c, ino)?.ok_or(fs(Errno::ENOENT))
        })
    }
}
