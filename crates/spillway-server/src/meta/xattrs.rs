//! Extended attributes. Names are raw bytes: namespaces (user., trusted., ...) are the
//! client's and the kernel's business, except the two POSIX ACLs, whose values and
//! relation to the mode are kept here, at the inode's home, as Linux file systems keep
//! them (`spillway_types::acl`): a valid ACL only, a default ACL on directories only,
//! an access ACL that says no more than the mode stored as the mode alone, the mode's
//! permission bits following the access ACL and a chmod rewriting the ACL.

use crate::error::{fs, StoreResult};
use crate::meta::{rows, MetaStore};
use crate::meta::{NewNode, XattrMode};
use crate::names::{check_xattr_name, check_xattr_value};
use rusqlite::{params, Connection, OptionalExtension};
use spillway_types::acl::{Acl, ACCESS_XATTR, DEFAULT_XATTR};
use spillway_types::{Attr, Errno, FileKind, InodeNo, Timespec};

/// An extended attribute to store: (name, value).
pub(super) type NameValue = (Vec<u8>, Vec<u8>);

/// Most extended attributes a create may carry (the client sends at most the two ACLs).
const MAX_INITIAL_XATTRS: usize = 8;

fn get(c: &Connection, ino: InodeNo, name: &[u8]) -> StoreResult<Option<Vec<u8>>> {
    Ok(
        c.prepare_cached("SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2")?
            .query_row(params![rows::ino_sql(ino), name], |r| r.get(0))
            .optional()?,
    )
}

/// ctime = now on the inode (its xattrs changed); ENOENT if it does not exist.
fn touch_ctime(c: &Connection, ino: InodeNo) -> StoreResult<()> {
    let mut a = rows::get_inode(c, ino)?.ok_or(fs(Errno::ENOENT))?;
    a.ctime = Timespec::now();
    rows::update_inode(c, &a)
}

fn put(c: &Connection, ino: InodeNo, name: &[u8], value: &[u8]) -> StoreResult<()> {
    c.prepare_cached("INSERT OR REPLACE INTO xattrs(ino, name, value) VALUES (?1, ?2, ?3)")?
        .execute(params![rows::ino_sql(ino), name, value])?;
    Ok(())
}

fn delete(c: &Connection, ino: InodeNo, name: &[u8]) -> StoreResult<bool> {
    let n = c
        .prepare_cached("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2")?
        .execute(params![rows::ino_sql(ino), name])?;
    Ok(n > 0)
}

fn is_acl(name: &[u8]) -> bool {
    name == ACCESS_XATTR || name == DEFAULT_XATTR
}

fn acl(value: &[u8]) -> StoreResult<Acl> {
    Acl::parse(value).map_err(fs)
}

/// Set a POSIX ACL of `a` (`posix_acl_update_mode()` and `ext4_set_acl()`): the access
/// ACL sets the mode's permission bits and is stored only if it says more than they
/// do; the default ACL belongs to directories. `a` is updated, not written.
fn set_acl(
    tx: &Connection,
    a: &mut Attr,
    name: &[u8],
    value: &[u8],
    kill_sgid: bool,
) -> StoreResult<()> {
    let acl = acl(value)?;
    match a.kind {
        // Linux keeps no ACLs on symlinks (vfs_set_acl answers EOPNOTSUPP).
        FileKind::Symlink => return Err(fs(Errno::EOPNOTSUPP)),
        // set_posix_acl(): a default ACL on anything but a directory.
        k if name == DEFAULT_XATTR && k != FileKind::Directory => return Err(fs(Errno::EACCES)),
        _ => {}
    }
    if name == DEFAULT_XATTR {
        return put(tx, a.ino, name, &acl.to_bytes());
    }
    let (bits, equivalent) = acl.equiv_mode();
    a.mode = (a.mode & !0o777) | bits;
    if kill_sgid {
        a.mode &= !libc::S_ISGID;
    }
    if equivalent {
        delete(tx, a.ino, name)?;
        Ok(())
    } else {
        put(tx, a.ino, name, &acl.to_bytes())
    }
}

/// A chmod of `a` to its new mode (already set): its access ACL, if it has one, shows
/// the new owner, group (mask) and other bits (`posix_acl_chmod()`). Part of the
/// setattr's transaction.
pub(super) fn chmod_acl(tx: &Connection, a: &Attr) -> StoreResult<()> {
    let Some(value) = get(tx, a.ino, ACCESS_XATTR)? else {
        return Ok(());
    };
    // A stored ACL was valid when stored; one that no longer parses is left alone
    // rather than failing every chmod of the file.
    let Ok(mut acl) = Acl::parse(&value) else {
        tracing::warn!(ino = %a.ino, "stored access ACL does not parse; chmod leaves it");
        return Ok(());
    };
    acl.chmod(a.mode);
    put(tx, a.ino, ACCESS_XATTR, &acl.to_bytes())
}

/// What a create's extended attributes make of the new inode, checked before anything
/// is written: its mode (an access ACL sets the permission bits) and the xattrs to
/// store with it. Protocol errors only (EINVAL for a bad list or ACL).
pub(super) fn initial(req: &NewNode) -> StoreResult<(u32, Vec<NameValue>)> {
    let mut mode = req.mode & 0o7777;
    if req.xattrs.len() > MAX_INITIAL_XATTRS {
        return Err(fs(Errno::EINVAL));
    }
    let mut out: Vec<NameValue> = Vec::with_capacity(req.xattrs.len());
    for (name, value) in &req.xattrs {
        check_xattr_name(name)?;
        check_xattr_value(value)?;
        if out.iter().any(|(n, _)| n == name) {
            return Err(fs(Errno::EINVAL));
        }
        let mut value = value.clone();
        if is_acl(name) {
            let acl = acl(&value)?;
            let wrong_kind = req.kind == FileKind::Symlink
                || (name == DEFAULT_XATTR && req.kind != FileKind::Directory);
            if wrong_kind {
                return Err(fs(Errno::EINVAL));
            }
            if name == ACCESS_XATTR {
                let (bits, equivalent) = acl.equiv_mode();
                mode = (mode & !0o777) | bits;
                if equivalent {
                    continue;
                }
            }
            value = acl.to_bytes();
        }
        out.push((name.clone(), value));
    }
    Ok((mode, out))
}

/// Store a new inode's extended attributes (from `initial`), in the create's
/// transaction.
pub(super) fn insert_initial(
    tx: &Connection,
    ino: InodeNo,
    xattrs: &[NameValue],
) -> StoreResult<()> {
    for (name, value) in xattrs {
        put(tx, ino, name, value)?;
    }
    Ok(())
}

impl MetaStore {
    pub(crate) fn set_xattr(
        &self,
        ino: InodeNo,
        name: &[u8],
        value: &[u8],
        how: XattrMode,
    ) -> StoreResult<()> {
        check_xattr_name(name)?;
        check_xattr_value(value)?;
        if is_acl(name) {
            // Linux ignores XATTR_CREATE/REPLACE for ACLs (vfs_set_acl takes no flags).
            return self.txn(|tx| {
                let mut a = rows::get_inode(tx, ino)?.ok_or(fs(Errno::ENOENT))?;
                set_acl(tx, &mut a, name, value, how.acl_kill_sgid)?;
                a.ctime = Timespec::now();
                rows::update_inode(tx, &a)
            });
        }
        self.txn(|tx| {
            touch_ctime(tx, ino)?;
            let present = get(tx, ino, name)?.is_some();
            if how.must_create && present {
                return Err(fs(Errno::EEXIST));
            }
            if how.must_replace && !present {
                return Err(fs(Errno::ENODATA));
            }
            put(tx, ino, name, value)
        })
    }

    pub(crate) fn get_xattr(&self, ino: InodeNo, name: &[u8]) -> StoreResult<Vec<u8>> {
        check_xattr_name(name)?;
        self.with(|c| {
            rows::get_inode(c, ino)?.ok_or(fs(Errno::ENOENT))?;
            get(c, ino, name)?.ok_or(fs(Errno::ENODATA))
        })
    }

    pub(crate) fn list_xattrs(&self, ino: InodeNo) -> StoreResult<Vec<Vec<u8>>> {
        self.with(|c| {
            rows::get_inode(c, ino)?.ok_or(fs(Errno::ENOENT))?;
            let mut stmt =
                c.prepare_cached("SELECT name FROM xattrs WHERE ino = ?1 ORDER BY name")?;
            let names = stmt.query_map(params![rows::ino_sql(ino)], |r| r.get(0))?;
            Ok(names.collect::<Result<Vec<Vec<u8>>, _>>()?)
        })
    }

    pub(crate) fn remove_xattr(&self, ino: InodeNo, name: &[u8]) -> StoreResult<()> {
        check_xattr_name(name)?;
        self.txn(|tx| {
            touch_ctime(tx, ino)?;
            // Removing the access ACL leaves the mode as it is (its group bits keep
            // the mask's), as on ext4.
            if !delete(tx, ino, name)? {
                return Err(fs(Errno::ENODATA));
            }
            Ok(())
        })
    }
}
