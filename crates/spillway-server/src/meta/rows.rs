//! Rows to and from the store's types (`Attr`, `types.rs`). Every value read back is checked:
//! a row this server did not write (or a damaged file) becomes `Corrupt`, not a panic.

use crate::error::{StoreError, StoreResult};
use crate::meta::{Entry, NamedEntry};
use rusqlite::{params, params_from_iter, Connection, OptionalExtension, Row, ToSql};
use spillway_types::{Attr, FileKind, InodeNo, Timespec};

/// u64 values are stored bit-for-bit in SQLite's signed INTEGER.
pub(super) fn sql_u64(v: u64) -> i64 {
    v as i64
}

pub(super) fn from_sql_u64(v: i64) -> u64 {
    v as u64
}

pub(super) fn ino_sql(ino: InodeNo) -> i64 {
    sql_u64(ino.0)
}

fn corrupt(what: &str, v: i64) -> StoreError {
    StoreError::Corrupt(format!("{what} = {v} out of range"))
}

fn u32_col(what: &str, v: i64) -> StoreResult<u32> {
    u32::try_from(v).map_err(|_| corrupt(what, v))
}

fn kind_col(v: i64) -> StoreResult<FileKind> {
    u8::try_from(v)
        .ok()
        .and_then(FileKind::from_u8)
        .ok_or_else(|| corrupt("kind", v))
}

fn time_cols(what: &str, sec: i64, nsec: i64) -> StoreResult<Timespec> {
    match u32::try_from(nsec) {
        Ok(nsec) if nsec < 1_000_000_000 => Ok(Timespec { sec, nsec }),
        _ => Err(corrupt(what, nsec)),
    }
}

const INODE_COLS: &str =
    "kind, mode, nlink, uid, gid, rdev, size, atime_s, atime_ns, mtime_s, mtime_ns, \
                          ctime_s, ctime_ns, stripe_size, stripe_width, blocks";

/// The raw integers of an inode row, read inside rusqlite's row callback (which can
/// only fail with rusqlite errors) and validated afterwards.
struct RawInode([i64; 16]);

fn raw_inode(r: &Row<'_>) -> rusqlite::Result<RawInode> {
    let mut v = [0i64; 16];
    for (i, slot) in v.iter_mut().enumerate() {
        *slot = r.get(i)?;
    }
    Ok(RawInode(v))
}

impl RawInode {
    fn into_attr(self, ino: InodeNo) -> StoreResult<Attr> {
        let v = self.0;
        Ok(Attr {
            ino,
            kind: kind_col(v[0])?,
            mode: u32_col("mode", v[1])?,
            nlink: u32_col("nlink", v[2])?,
            uid: u32_col("uid", v[3])?,
            gid: u32_col("gid", v[4])?,
            rdev: u32_col("rdev", v[5])?,
            size: from_sql_u64(v[6]),
            atime: time_cols("atime_ns", v[7], v[8])?,
            mtime: time_cols("mtime_ns", v[9], v[10])?,
            ctime: time_cols("ctime_ns", v[11], v[12])?,
            stripe_size: u32_col("stripe_size", v[13])?,
            stripe_width: u16::try_from(v[14]).map_err(|_| corrupt("stripe_width", v[14]))?,
            blocks: from_sql_u64(v[15]),
        })
    }
}

pub(super) fn get_inode(c: &Connection, ino: InodeNo) -> StoreResult<Option<Attr>> {
    let raw = c
        .prepare_cached(&format!("SELECT {INODE_COLS} FROM inodes WHERE ino = ?1"))?
        .query_row(params![ino_sql(ino)], raw_inode)
        .optional()?;
    raw.map(|r| r.into_attr(ino)).transpose()
}

pub(super) fn get_target(c: &Connection, ino: InodeNo) -> StoreResult<Option<Vec<u8>>> {
    Ok(
        c.prepare_cached("SELECT target FROM inodes WHERE ino = ?1")?
            .query_row(params![ino_sql(ino)], |r| r.get(0))
            .optional()?,
    )
}

/// The columns a setattr may change, in the order of `UPDATE_INODE`'s ?2..?13 and of
/// `INSERT_INODE`'s ?2..?13 (all integers; the u32/u64 values as rusqlite stores them).
fn mutable_cols(a: &Attr) -> [i64; 12] {
    [
        i64::from(a.mode),
        i64::from(a.nlink),
        i64::from(a.uid),
        i64::from(a.gid),
        i64::from(a.rdev),
        sql_u64(a.size),
        a.atime.sec,
        i64::from(a.atime.nsec),
        a.mtime.sec,
        i64::from(a.mtime.nsec),
        a.ctime.sec,
        i64::from(a.ctime.nsec),
    ]
}

const INSERT_INODE: &str = "INSERT INTO inodes(ino, mode, nlink, uid, gid, rdev, size, \
     atime_s, atime_ns, mtime_s, mtime_ns, ctime_s, ctime_ns, \
     kind, stripe_size, stripe_width, blocks, target) \
     VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18)";

const UPDATE_INODE: &str = "UPDATE inodes SET mode=?2, nlink=?3, uid=?4, gid=?5, rdev=?6, \
     size=?7, atime_s=?8, atime_ns=?9, mtime_s=?10, mtime_ns=?11, ctime_s=?12, ctime_ns=?13 \
     WHERE ino=?1";

pub(super) fn insert_inode(c: &Connection, a: &Attr, target: &[u8]) -> StoreResult<()> {
    let ino = ino_sql(a.ino);
    let cols = mutable_cols(a);
    let (kind, blocks) = (a.kind as u8, sql_u64(a.blocks));
    let mut values: Vec<&dyn ToSql> = Vec::with_capacity(18);
    values.push(&ino);
    values.extend(cols.iter().map(|v| v as &dyn ToSql));
    values.extend([
        &kind as &dyn ToSql,
        &a.stripe_size,
        &a.stripe_width,
        &blocks,
        &target,
    ]);
    c.prepare_cached(INSERT_INODE)?
        .execute(params_from_iter(values))?;
    Ok(())
}

/// Write back the mutable attributes (the kind and target never change; the stripe
/// geometry only through `update_layout`).
pub(super) fn update_inode(c: &Connection, a: &Attr) -> StoreResult<()> {
    let values = std::iter::once(ino_sql(a.ino)).chain(mutable_cols(a));
    c.prepare_cached(UPDATE_INODE)?
        .execute(params_from_iter(values))?;
    Ok(())
}

/// The stripe geometry (SetLayout only: everything else keeps it for life).
pub(super) fn update_layout(c: &Connection, a: &Attr) -> StoreResult<()> {
    c.prepare_cached(
        "UPDATE inodes SET stripe_size=?2, stripe_width=?3, ctime_s=?4, ctime_ns=?5 WHERE ino=?1",
    )?
    .execute(params![
        ino_sql(a.ino),
        a.stripe_size,
        a.stripe_width,
        a.ctime.sec,
        a.ctime.nsec
    ])?;
    Ok(())
}

pub(super) fn delete_inode(c: &Connection, ino: InodeNo) -> StoreResult<()> {
    c.prepare_cached("DELETE FROM inodes WHERE ino = ?1")?
        .execute(params![ino_sql(ino)])?;
    c.prepare_cached("DELETE FROM xattrs WHERE ino = ?1")?
        .execute(params![ino_sql(ino)])?;
    c.prepare_cached("DELETE FROM sealed WHERE ino = ?1")?
        .execute(params![ino_sql(ino)])?;
    c.prepare_cached("DELETE FROM allocs WHERE ino = ?1")?
        .execute(params![ino_sql(ino)])?;
    Ok(())
}

fn entry_ref(child: i64, kind: i64) -> StoreResult<Entry> {
    Ok(Entry {
        ino: InodeNo(from_sql_u64(child)),
        kind: kind_col(kind)?,
    })
}

pub(super) fn get_entry(
    c: &Connection,
    parent: InodeNo,
    name: &[u8],
) -> StoreResult<Option<Entry>> {
    let raw: Option<(i64, i64)> = c
        .prepare_cached("SELECT child, kind FROM dentries WHERE parent = ?1 AND name = ?2")?
        .query_row(params![ino_sql(parent), name], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    raw.map(|(child, kind)| entry_ref(child, kind)).transpose()
}

/// Insert or overwrite the entry `(parent, name)`.
pub(super) fn put_entry(
    c: &Connection,
    parent: InodeNo,
    name: &[u8],
    e: &Entry,
) -> StoreResult<()> {
    c.prepare_cached(
        "INSERT OR REPLACE INTO dentries(parent, name, child, kind) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![ino_sql(parent), name, ino_sql(e.ino), e.kind as u8])?;
    Ok(())
}

pub(super) fn delete_entry(c: &Connection, parent: InodeNo, name: &[u8]) -> StoreResult<()> {
    c.prepare_cached("DELETE FROM dentries WHERE parent = ?1 AND name = ?2")?
        .execute(params![ino_sql(parent), name])?;
    Ok(())
}

/// Up to `limit` entries of `dir` named after `after` (byte order).
pub(super) fn list_entries(
    c: &Connection,
    dir: InodeNo,
    after: &[u8],
    limit: u32,
) -> StoreResult<Vec<NamedEntry>> {
    let mut stmt = c.prepare_cached(
        "SELECT name, child, kind FROM dentries WHERE parent = ?1 AND name > ?2 ORDER BY name LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![ino_sql(dir), after, i64::from(limit)], |r| {
        Ok((
            r.get::<_, Vec<u8>>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (name, child, kind) = row?;
        out.push(NamedEntry {
            name,
            entry: entry_ref(child, kind)?,
        });
    }
    Ok(out)
}

pub(super) fn has_entries(c: &Connection, dir: InodeNo) -> StoreResult<bool> {
    Ok(
        c.prepare_cached("SELECT 1 FROM dentries WHERE parent = ?1 LIMIT 1")?
            .query_row(params![ino_sql(dir)], |_| Ok(()))
            .optional()?
            .is_some(),
    )
}

pub(super) fn is_sealed(c: &Connection, dir: InodeNo) -> StoreResult<bool> {
    Ok(c.prepare_cached("SELECT 1 FROM sealed WHERE ino = ?1")?
        .query_row(params![ino_sql(dir)], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Take the next inode counter value of this server.
/// Take the next inode counter: the one `pick` chooses at or after the stored next
/// counter (skipped counters are never used).
pub(super) fn next_counter(c: &Connection, pick: impl Fn(u64) -> u64) -> StoreResult<u64> {
    let v: i64 = c
        .prepare_cached("SELECT value FROM meta WHERE key = 'next_inode'")?
        .query_row([], |r| r.get(0))
        .optional()?
        .ok_or_else(|| StoreError::Corrupt("meta.next_inode missing".into()))?;
    let chosen = pick(from_sql_u64(v));
    c.prepare_cached("UPDATE meta SET value = ?1 WHERE key = 'next_inode'")?
        .execute(params![sql_u64(chosen).wrapping_add(1)])?;
    Ok(chosen)
}
