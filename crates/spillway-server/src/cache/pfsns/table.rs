//! The persistent table of the instance's inodes: counter (the low bits of the inode
//! number shown) to PFS file handle, and the file's stripe geometry. Rows are never
//! deleted, so a counter is never given to a second handle (AUTOINCREMENT: not even
//! the largest one, after its row would be gone). Counter 1 is the instance's root.
//!
//! Durability: WAL with `synchronous = NORMAL`, as the metadata store: a committed row
//! survives the server being killed; a crash of the host can lose the last rows, and
//! then their counters are given again (to whatever handle is seen next).

use super::handles::Handle;
use crate::error::{StoreError, StoreResult};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

const SCHEMA_VERSION: i64 = 1;

const DDL: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS inodes (
    counter      INTEGER PRIMARY KEY AUTOINCREMENT,
    handle_type  INTEGER NOT NULL,
    handle       BLOB NOT NULL,
    stripe_size  INTEGER NOT NULL DEFAULT 0,
    stripe_width INTEGER NOT NULL DEFAULT 0,
    UNIQUE (handle_type, handle)
);
CREATE TABLE IF NOT EXISTS hidden (
    counter INTEGER PRIMARY KEY,
    parent  INTEGER NOT NULL,
    name    BLOB NOT NULL
);
";

/// The root directory's counter.
pub(super) const ROOT_COUNTER: u64 = 1;

/// What the table says of one inode. A geometry of 0 is the instance's default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Row {
    pub handle: Handle,
    pub stripe_size: u32,
    pub stripe_width: u16,
}

/// A handle's counter and geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Known {
    pub counter: u64,
    pub stripe_size: u32,
    pub stripe_width: u16,
}

pub(super) struct Table {
    conn: Connection,
}

/// Create the database file 0600 if missing, and refuse it if it is a symlink or not
/// a regular file: root opens it, and a planted link must not make root write
/// elsewhere.
fn vet_file(path: &Path) -> StoreResult<()> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(StoreError::Corrupt(format!(
            "{}: the namespace table is not a regular file",
            path.display()
        )));
    }
    if m.permissions().mode() & 0o077 != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

fn u64_of(v: i64) -> StoreResult<u64> {
    u64::try_from(v)
        .map_err(|_| StoreError::Corrupt(format!("negative counter {v} in the namespace table")))
}

impl Table {
    /// Open (or create) the table, for the instance whose root has handle `root`. A
    /// table made for another directory is refused: its handles mean other files.
    pub(super) fn open(path: &Path, root: &Handle) -> StoreResult<Table> {
        vet_file(path)?;
        // NOFOLLOW again in SQLite's own open, so that a link swapped in after the
        // check above is refused too.
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_NOFOLLOW;
        let mut conn = Connection::open_with_flags(path, flags)?;
        // The server is the file's only user: one lock, held (as the metadata store).
        conn.query_row("PRAGMA locking_mode = EXCLUSIVE", [], |_| Ok(()))?;
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Corrupt(format!(
                "{}: database refused WAL mode (got {mode})",
                path.display()
            )));
        }
        conn.execute_batch("PRAGMA synchronous = NORMAL;")?;
        conn.set_prepared_statement_cache_capacity(16);
        let tx = conn.transaction()?;
        tx.execute_batch(DDL)?;
        let version: Option<i64> = tx
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()?;
        match version {
            None => {
                tx.execute(
                    "INSERT INTO meta(key, value) VALUES ('schema_version', ?1)",
                    params![SCHEMA_VERSION],
                )?;
            }
            Some(SCHEMA_VERSION) => {}
            Some(v) => {
                return Err(StoreError::Corrupt(format!(
                    "{}: namespace table version {v}, this server reads {SCHEMA_VERSION}",
                    path.display()
                )))
            }
        }
        let stored: Option<(i32, Vec<u8>)> = tx
            .query_row(
                "SELECT handle_type, handle FROM inodes WHERE counter = ?1",
                params![ROOT_COUNTER as i64],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        match stored {
            None => {
                tx.execute(
                    "INSERT INTO inodes(counter, handle_type, handle) VALUES (?1, ?2, ?3)",
                    params![ROOT_COUNTER as i64, root.kind, root.bytes],
                )?;
            }
            Some((kind, bytes)) if kind == root.kind && bytes == root.bytes => {}
            Some(_) => {
                return Err(StoreError::Corrupt(format!(
                    "{}: the namespace table belongs to another PFS directory",
                    path.display()
                )))
            }
        }
        tx.commit()?;
        Ok(Table { conn })
    }

    pub(super) fn row(&self, counter: u64) -> StoreResult<Option<Row>> {
        let Ok(key) = i64::try_from(counter) else {
            return Ok(None);
        };
        let mut st = self.conn.prepare_cached(
            "SELECT handle_type, handle, stripe_size, stripe_width FROM inodes WHERE counter = ?1",
        )?;
        let row = st
            .query_row(params![key], |r| {
                Ok((
                    r.get::<_, i32>(0)?,
                    r.get::<_, Vec<u8>>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })
            .optional()?;
        let Some((kind, bytes, size, width)) = row else {
            return Ok(None);
        };
        let corrupt = || StoreError::Corrupt(format!("bad stripe geometry of counter {counter}"));
        Ok(Some(Row {
            handle: Handle { kind, bytes },
            stripe_size: u32::try_from(size).map_err(|_| corrupt())?,
            stripe_width: u16::try_from(width).map_err(|_| corrupt())?,
        }))
    }

    /// The counters and geometries of `handles`, in order, giving new counters (and
    /// the default geometry) to handles never seen; one transaction for all.
    pub(super) fn counters(&mut self, handles: &[&Handle]) -> StoreResult<Vec<Known>> {
        let tx = self.conn.transaction()?;
        let mut out = Vec::with_capacity(handles.len());
        {
            let mut find = tx.prepare_cached(
                "SELECT counter, stripe_size, stripe_width FROM inodes
                 WHERE handle_type = ?1 AND handle = ?2",
            )?;
            let mut add =
                tx.prepare_cached("INSERT INTO inodes(handle_type, handle) VALUES (?1, ?2)")?;
            for h in handles {
                let found: Option<(i64, i64, i64)> = find
                    .query_row(params![h.kind, h.bytes], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })
                    .optional()?;
                let (counter, size, width) = match found {
                    Some(f) => f,
                    None => {
                        add.execute(params![h.kind, h.bytes])?;
                        (tx.last_insert_rowid(), 0, 0)
                    }
                };
                let corrupt =
                    || StoreError::Corrupt(format!("bad stripe geometry of counter {counter}"));
                out.push(Known {
                    counter: u64_of(counter)?,
                    stripe_size: u32::try_from(size).map_err(|_| corrupt())?,
                    stripe_width: u16::try_from(width).map_err(|_| corrupt())?,
                });
            }
        }
        tx.commit()?;
        Ok(out)
    }

    pub(super) fn counter(&mut self, h: &Handle) -> StoreResult<Known> {
        let v = self.counters(&[h])?;
        v.first()
            .copied()
            .ok_or_else(|| StoreError::Corrupt("no counter for a handle".into()))
    }

    /// Set the stripe geometry of `counter`'s row; false when there is no such row.
    pub(super) fn set_layout(
        &self,
        counter: u64,
        stripe_size: u32,
        stripe_width: u16,
    ) -> StoreResult<bool> {
        let Ok(key) = i64::try_from(counter) else {
            return Ok(false);
        };
        let n = self.conn.execute(
            "UPDATE inodes SET stripe_size = ?2, stripe_width = ?3 WHERE counter = ?1",
            params![key, i64::from(stripe_size), i64::from(stripe_width)],
        )?;
        Ok(n == 1)
    }

    /// Files unlinked while open, kept under a hidden name until their last close
    /// (hidden.rs): counter → (parent counter, hidden name).
    pub(super) fn hidden(&self) -> StoreResult<Vec<(u64, u64, Vec<u8>)>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT counter, parent, name FROM hidden")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, Vec<u8>>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (c, p, n) = row?;
            out.push((u64_of(c)?, u64_of(p)?, n));
        }
        Ok(out)
    }

    pub(super) fn set_hidden(&self, counter: u64, parent: u64, name: &[u8]) -> StoreResult<()> {
        let (Ok(c), Ok(p)) = (i64::try_from(counter), i64::try_from(parent)) else {
            return Err(StoreError::Corrupt(format!(
                "counter {counter} out of range"
            )));
        };
        self.conn.execute(
            "INSERT OR REPLACE INTO hidden(counter, parent, name) VALUES (?1, ?2, ?3)",
            params![c, p, name],
        )?;
        Ok(())
    }

    pub(super) fn forget_hidden(&self, counter: u64) -> StoreResult<()> {
        if let Ok(c) = i64::try_from(counter) {
            self.conn
                .execute("DELETE FROM hidden WHERE counter = ?1", params![c])?;
        }
        Ok(())
    }

    pub(super) fn count(&self) -> StoreResult<u64> {
        let n: i64 = self
            .conn
            .query_row("SELECT COUNT(*) FROM inodes", [], |r| r.get(0))?;
        u64_of(n)
    }
}
