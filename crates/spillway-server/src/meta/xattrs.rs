//! Extended attributes. Names are raw bytes: namespaces (user., trusted., ...) are the
//! client's and the kernel's business.

use crate::error::{fs, StoreResult};
use crate::meta::{rows, MetaStore};
use crate::names::{check_xattr_name, check_xattr_value};
use rusqlite::{params, Connection, OptionalExtension};
use spillway_types::{Errno, InodeNo, Timespec};
use spillway_wire::xattr_flags;

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

impl MetaStore {
    pub fn set_xattr(
        &self,
        ino: InodeNo,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> StoreResult<()> {
        check_xattr_name(name)?;
        check_xattr_value(value)?;
        if flags & !(xattr_flags::CREATE | xattr_flags::REPLACE) != 0 {
            return Err(fs(Errno::EINVAL));
        }
        self.txn(|tx| {
            touch_ctime(tx, ino)?;
            let present = get(tx, ino, name)?.is_some();
            if flags & xattr_flags::CREATE != 0 && present {
                return Err(fs(Errno::EEXIST));
            }
            if flags & xattr_flags::REPLACE != 0 && !present {
                return Err(fs(Errno::ENODATA));
            }
            tx.prepare_cached(
                "INSERT OR REPLACE INTO xattrs(ino, name, value) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![rows::ino_sql(ino), name, value])?;
            Ok(())
        })
    }

    pub fn get_xattr(&self, ino: InodeNo, name: &[u8]) -> StoreResult<Vec<u8>> {
        check_xattr_name(name)?;
        self.with(|c| {
            rows::get_inode(c, ino)?.ok_or(fs(Errno::ENOENT))?;
            get(c, ino, name)?.ok_or(fs(Errno::ENODATA))
        })
    }

    pub fn list_xattrs(&self, ino: InodeNo) -> StoreResult<Vec<Vec<u8>>> {
        self.with(|c| {
            rows::get_inode(c, ino)?.ok_or(fs(Errno::ENOENT))?;
            let mut stmt =
                c.prepare_cached("SELECT name FROM xattrs WHERE ino = ?1 ORDER BY name")?;
            let names = stmt.query_map(params![rows::ino_sql(ino)], |r| r.get(0))?;
            Ok(names.collect::<Result<Vec<Vec<u8>>, _>>()?)
        })
    }

    pub fn remove_xattr(&self, ino: InodeNo, name: &[u8]) -> StoreResult<()> {
        check_xattr_name(name)?;
        self.txn(|tx| {
            touch_ctime(tx, ino)?;
            let n = tx
                .prepare_cached("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2")?
                .execute(params![rows::ino_sql(ino), name])?;
            if n == 0 {
                return Err(fs(Errno::ENODATA));
            }
            Ok(())
        })
    }
}
