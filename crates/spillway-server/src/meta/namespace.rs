//! Directory entries: everything keyed by (parent, name). A request reaches the server
//! that `dentry_server(parent, name)` names, so every check here is local; what spans
//! servers (a directory's emptiness, a rename across servers) the client composes from
//! these steps and the seal.

use crate::error::{fs, StoreResult};
use crate::meta::{rows, MetaStore};
use crate::meta::{DirPage, Entry, Expect, Found, NewNode, RenameMode, Renamed};
use crate::names::{check_name, check_symlink_target};
use rusqlite::Transaction;
use spillway_types::ids::INODE_COUNTER_BITS;
use spillway_types::tunables::MAX_STRIPE_SIZE;
use spillway_types::{Attr, Errno, FileKind, InodeNo, ServerIndex, Timespec};

/// Most entries one readdir page returns, whatever the caller asks.
pub(super) const MAX_READDIR_PAGE: u32 = 65536;

/// Where this store sits in its instance: what a create needs to place and shape a
/// new inode.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Home {
    pub index: ServerIndex,
    pub count: u16,
    pub default_stripe_size: u32,
}

impl MetaStore {
    pub(crate) fn lookup(
        &self,
        parent: InodeNo,
        name: &[u8],
        here: ServerIndex,
    ) -> StoreResult<Found> {
        check_name(name)?;
        self.with(|c| {
            let entry = rows::get_entry(c, parent, name)?.ok_or(fs(Errno::ENOENT))?;
            let attr = if entry.ino.home() == here {
                rows::get_inode(c, entry.ino)?
            } else {
                None
            };
            Ok(Found { entry, attr })
        })
    }

    /// Create an inode homed here and its entry, in one transaction.
    pub(crate) fn create(&self, node: &NewNode, home: Home) -> StoreResult<Attr> {
        let checked = checked_create(node, &home)?;
        self.txn(|tx| create_in(tx, node, &home, checked))
    }

    /// Many creates in one transaction (a batch of staged files: one commit instead of
    /// one per file). Each create answers for itself; a protocol outcome (EEXIST,
    /// ENOENT, ...) of one does not stop the others, a database failure stops all.
    pub(crate) fn create_many(
        &self,
        nodes: &[NewNode],
        home: Home,
    ) -> StoreResult<Vec<StoreResult<Attr>>> {
        self.txn(|tx| {
            nodes
                .iter()
                .map(|node| {
                    super::each_outcome(
                        checked_create(node, &home).and_then(|c| create_in(tx, node, &home, c)),
                    )
                })
                .collect()
        })
    }

    pub(crate) fn remove_entry(
        &self,
        parent: InodeNo,
        name: &[u8],
        wanted: Expect,
    ) -> StoreResult<Entry> {
        check_name(name)?;
        self.txn(|tx| {
            let entry = rows::get_entry(tx, parent, name)?.ok_or(fs(Errno::ENOENT))?;
            let is_dir = entry.kind == FileKind::Directory;
            match wanted {
                Expect::NotDir if is_dir => return Err(fs(Errno::EISDIR)),
                Expect::Dir if !is_dir => return Err(fs(Errno::ENOTDIR)),
                Expect::Any | Expect::NotDir | Expect::Dir => {}
            }
            rows::delete_entry(tx, parent, name)?;
            Ok(entry)
        })
    }

    pub(crate) fn insert_entry(
        &self,
        parent: InodeNo,
        name: &[u8],
        entry: &Entry,
        replace: bool,
    ) -> StoreResult<Option<Entry>> {
        check_name(name)?;
        self.txn(|tx| {
            if rows::is_sealed(tx, parent)? {
                return Err(fs(Errno::ENOENT));
            }
            let old = rows::get_entry(tx, parent, name)?;
            if old.is_some() && !replace {
                return Err(fs(Errno::EEXIST));
            }
            rows::put_entry(tx, parent, name, entry)?;
            Ok(old)
        })
    }

    /// Rename with both entries on this server, atomically (renameat2 semantics for the
    /// flags; the checks that need other servers are the client's).
    pub(crate) fn rename(
        &self,
        old_parent: InodeNo,
        old_name: &[u8],
        new_parent: InodeNo,
        new_name: &[u8],
        mode: RenameMode,
    ) -> StoreResult<Renamed> {
        check_name(old_name)?;
        check_name(new_name)?;
        let noreplace = mode == RenameMode::NoReplace;
        let exchange = mode == RenameMode::Exchange;
        let same_slot = old_parent == new_parent && old_name == new_name;
        self.txn(|tx| {
            let src = rows::get_entry(tx, old_parent, old_name)?.ok_or(fs(Errno::ENOENT))?;
            let dst = rows::get_entry(tx, new_parent, new_name)?;
            if noreplace && dst.is_some() {
                return Err(fs(Errno::EEXIST));
            }
            if exchange {
                let dst = dst.ok_or(fs(Errno::ENOENT))?;
                if !same_slot {
                    rows::put_entry(tx, old_parent, old_name, &dst)?;
                    rows::put_entry(tx, new_parent, new_name, &src)?;
                }
                return Ok(Renamed {
                    moved: src,
                    replaced: Some(dst),
                });
            }
            if let Some(d) = &dst {
                let (src_dir, dst_dir) = (
                    src.kind == FileKind::Directory,
                    d.kind == FileKind::Directory,
                );
                if src_dir && !dst_dir {
                    return Err(fs(Errno::ENOTDIR));
                }
                if !src_dir && dst_dir {
                    return Err(fs(Errno::EISDIR));
                }
                if d.ino == src.ino {
                    // Two names of one inode (or the same name): POSIX says do nothing.
                    return Ok(Renamed {
                        moved: src,
                        replaced: None,
                    });
                }
            }
            if rows::is_sealed(tx, new_parent)? {
                return Err(fs(Errno::ENOENT));
            }
            rows::delete_entry(tx, old_parent, old_name)?;
            rows::put_entry(tx, new_parent, new_name, &src)?;
            Ok(Renamed {
                moved: src,
                replaced: dst,
            })
        })
    }

    /// One page of `dir`'s entries after the name `after`. With `plus` (this
    /// server's index) also the attributes of the entries whose inode is homed here,
    /// read in the same snapshot as the entries; the others the client asks their
    /// homes for.
    pub(crate) fn read_dir(
        &self,
        dir: InodeNo,
        after: &[u8],
        max: u32,
        plus: Option<ServerIndex>,
    ) -> StoreResult<DirPage> {
        let max = max.min(MAX_READDIR_PAGE);
        self.with(|c| {
            // One row more than asked tells whether another page follows.
            let mut entries = rows::list_entries(c, dir, after, max + 1)?;
            let more = entries.len() > max as usize;
            entries.truncate(max as usize);
            let mut attrs = Vec::new();
            if let Some(here) = plus {
                for e in &entries {
                    attrs.push(if e.entry.ino.home() == here {
                        rows::get_inode(c, e.entry.ino)?
                    } else {
                        None
                    });
                }
            }
            Ok(DirPage {
                entries,
                attrs,
                more,
            })
        })
    }

    /// Seal `dir` on this server if it holds none of its entries.
    pub(crate) fn seal_dir(&self, dir: InodeNo) -> StoreResult<()> {
        self.txn(|tx| {
            if rows::has_entries(tx, dir)? {
                return Err(fs(Errno::ENOTEMPTY));
            }
            tx.prepare_cached("INSERT OR IGNORE INTO sealed(ino) VALUES (?1)")?
                .execute([rows::ino_sql(dir)])?;
            Ok(())
        })
    }

    pub(crate) fn unseal_dir(&self, dir: InodeNo) -> StoreResult<()> {
        self.with(|c| {
            c.prepare_cached("DELETE FROM sealed WHERE ino = ?1")?
                .execute([rows::ino_sql(dir)])?;
            Ok(())
        })
    }
}

/// What a create's request alone decides: (symlink target, stripe size, stripe width).
fn checked_create<'r>(req: &'r NewNode, home: &Home) -> StoreResult<(&'r [u8], u32, u16)> {
    check_name(&req.name)?;
    let target: &[u8] = if req.kind == FileKind::Symlink {
        &req.target
    } else {
        &[]
    };
    check_symlink_target(target)?;
    let stripe_size = if req.stripe_size == 0 {
        home.default_stripe_size
    } else {
        req.stripe_size
    };
    if stripe_size == 0 || !stripe_size.is_multiple_of(4096) || stripe_size > MAX_STRIPE_SIZE {
        return Err(fs(Errno::EINVAL));
    }
    let count = home.count.max(1);
    let stripe_width = if req.stripe_width == 0 {
        count
    } else {
        req.stripe_width.min(count)
    };
    Ok((target, stripe_size, stripe_width))
}

/// The create itself, inside the caller's transaction. Protocol outcomes are found
/// before anything is written.
fn create_in(
    tx: &Transaction<'_>,
    req: &NewNode,
    home: &Home,
    (target, stripe_size, stripe_width): (&[u8], u32, u16),
) -> StoreResult<Attr> {
    let count = home.count.max(1);
    // The ACLs it inherits (and the mode they give), checked before anything is written.
    let (mode, xattrs) = super::xattrs::initial(req)?;
    if rows::is_sealed(tx, req.parent)? {
        return Err(fs(Errno::ENOENT));
    }
    if rows::get_entry(tx, req.parent, &req.name)?.is_some() {
        return Err(fs(Errno::EEXIST));
    }
    let counter = rows::next_counter(tx, |from| {
        spillway_placement::counter_starting_at_home(home.index, count, from)
    })?;
    if counter >= 1 << INODE_COUNTER_BITS {
        // Inode numbers of this server are used up; nothing more can be created.
        return Err(fs(Errno::ENOSPC));
    }
    let now = Timespec::now();
    let attr = Attr {
        ino: InodeNo::compose(home.index, counter),
        kind: req.kind,
        mode,
        nlink: if req.kind == FileKind::Directory {
            2
        } else {
            1
        },
        uid: req.uid,
        gid: req.gid,
        rdev: req.rdev,
        size: target.len() as u64,
        atime: now,
        mtime: now,
        ctime: now,
        stripe_size,
        stripe_width,
        blocks: 0,
    };
    rows::insert_inode(tx, &attr, target)?;
    super::xattrs::insert_initial(tx, attr.ino, &xattrs)?;
    rows::put_entry(
        tx,
        req.parent,
        &req.name,
        &Entry {
            ino: attr.ino,
            kind: attr.kind,
        },
    )?;
    Ok(attr)
}
