//! Attributes of inodes homed on this server.

use crate::error::{fs, StoreResult};
use crate::meta::{rows, MetaStore};
use crate::meta::{AttrChange, SizeChange, TimeChange};
use spillway_types::tunables::MAX_STRIPE_SIZE;
use spillway_types::{Attr, Errno, FileKind, InodeNo, Timespec};

/// Apply `ch` to `a` (the data truncation a smaller size needs happens before, on
/// every server of the layout).
fn apply_setattr(a: &mut Attr, ch: &AttrChange, now: Timespec) -> StoreResult<()> {
    match ch.size {
        Some(SizeChange::Set(size)) => match a.kind {
            FileKind::Regular => {
                // POSIX: a truncate that changes the size marks mtime (and ctime) for
                // update; the kernel does not always send a time with it.
                if a.size != size && ch.mtime.is_none() {
                    a.mtime = now;
                }
                a.size = size;
            }
            FileKind::Directory => return Err(fs(Errno::EISDIR)),
            _ => return Err(fs(Errno::EINVAL)),
        },
        Some(SizeChange::AtLeast(size)) => {
            if a.kind != FileKind::Regular {
                return Err(fs(Errno::EINVAL));
            }
            a.size = a.size.max(size);
        }
        None => {}
    }
    if let Some(mode) = ch.mode {
        a.mode = mode & 0o7777;
    }
    if let Some(uid) = ch.uid {
        a.uid = uid;
    }
    if let Some(gid) = ch.gid {
        a.gid = gid;
    }
    if ch.kill_suidgid && a.kind != FileKind::Directory {
        a.mode &= !spillway_types::attr::privilege_bits(a.mode);
    }
    let time = |t: TimeChange| match t {
        TimeChange::Now => now,
        TimeChange::At(t) => t,
    };
    if let Some(t) = ch.atime {
        a.atime = time(t);
    }
    if let Some(t) = ch.mtime {
        a.mtime = time(t);
    }
    if let Some(t) = ch.ctime {
        a.ctime = t;
    } else if !ch.is_empty() {
        a.ctime = now;
    }
    Ok(())
}

/// One setattr inside the caller's transaction: apply, write, and rewrite the access
/// ACL after a chmod.
fn set_attr_in(
    tx: &rusqlite::Connection,
    ino: InodeNo,
    ch: &AttrChange,
    now: Timespec,
) -> StoreResult<Attr> {
    let mut a = rows::get_inode(tx, ino)?.ok_or(fs(Errno::ENOENT))?;
    apply_setattr(&mut a, ch, now)?;
    rows::update_inode(tx, &a)?;
    if ch.mode.is_some() {
        super::xattrs::chmod_acl(tx, &a)?;
    }
    Ok(a)
}

fn add_links(nlink: u32, delta: i32) -> u32 {
    (i64::from(nlink) + i64::from(delta)).clamp(0, i64::from(u32::MAX)) as u32
}

impl MetaStore {
    pub(crate) fn get_attr(&self, ino: InodeNo) -> StoreResult<Attr> {
        self.with(|c| rows::get_inode(c, ino)?.ok_or(fs(Errno::ENOENT)))
    }

    pub(crate) fn set_attr(&self, ino: InodeNo, ch: &AttrChange) -> StoreResult<Attr> {
        self.txn(|tx| set_attr_in(tx, ino, ch, Timespec::now()))
    }

    /// Many setattrs in one transaction (see `create_many`).
    pub(crate) fn set_attr_many(
        &self,
        changes: &[(InodeNo, AttrChange)],
    ) -> StoreResult<Vec<StoreResult<Attr>>> {
        self.txn(|tx| {
            let now = Timespec::now();
            changes
                .iter()
                .map(|(ino, ch)| super::each_outcome(set_attr_in(tx, *ino, ch, now)))
                .collect()
        })
    }

    /// nlink += delta (floored at 0), ctime = now. The caller purges the inode if this
    /// left it without links and nobody has it open.
    pub(crate) fn link_count(&self, ino: InodeNo, delta: i32) -> StoreResult<Attr> {
        self.txn(|tx| {
            let mut a = rows::get_inode(tx, ino)?.ok_or(fs(Errno::ENOENT))?;
            a.nlink = add_links(a.nlink, delta);
            a.ctime = Timespec::now();
            rows::update_inode(tx, &a)?;
            Ok(a)
        })
    }

    /// A directory's entries changed: mtime = ctime = now, nlink += delta.
    pub(crate) fn touch_dir(&self, ino: InodeNo, nlink_delta: i32) -> StoreResult<Attr> {
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

    #[cfg(test)]
    pub(crate) fn extend_size(&self, ino: InodeNo, size: u64, touch: bool) -> StoreResult<Attr> {
        self.extend_size_from(ino, size, touch).map(|(_, a)| a)
    }

    /// Data was written up to `size`: grow the size (never shrink), touch if asked.
    /// Returns the attributes just before (in the same transaction: no other change
    /// comes between) and after.
    pub(crate) fn extend_size_from(
        &self,
        ino: InodeNo,
        size: u64,
        touch: bool,
    ) -> StoreResult<(Attr, Attr)> {
        self.txn(|tx| {
            let mut a = rows::get_inode(tx, ino)?.ok_or(fs(Errno::ENOENT))?;
            let before = a.clone();
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
            Ok((before, a))
        })
    }

    /// Stripe geometry of a file without data (EBUSY once it has a size), or of a
    /// directory (the default of files created in it).
    pub(crate) fn set_layout(
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

    pub(crate) fn read_link(&self, ino: InodeNo) -> StoreResult<Vec<u8>> {
        self.with(|c| {
            let a = rows::get_inode(c, ino)?.ok_or(fs(Errno::ENOENT))?;
            if a.kind != FileKind::Symlink {
                return Err(fs(Errno::EINVAL));
            }
            rows::get_target(c, ino)?.ok_or(fs(Errno::ENOENT))
        })
    }
}
