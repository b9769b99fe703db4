//! The metadata store of one fragment: one SQLite database (format in FORMAT.md) behind
//! one mutex. SQLite serialises writers anyway, and one connection lets every request
//! reuse cached prepared statements; each request holds the lock for one short
//! transaction only, never across network calls.
//!
//! * `schema`    — creating and opening the database.
//! * `types`     — what the store's methods take and return (no wire types here).
//! * `rows`      — inode and entry rows to and from `Attr`/`Entry`.
//! * `namespace` — directory entries: create, remove, insert, rename, readdir, seal.
//! * `inodes`    — attributes: getattr, setattr, link counts, sizes, symlinks.
//! * `xattrs`    — extended attributes.
//! * `purges`    — the purge log of inodes whose data is being deleted.
//! * `allocs`    — the servers' reports of what an inode's stripes occupy (`st_blocks`).

mod allocs;
mod inodes;
mod namespace;
mod purges;
mod rows;
mod schema;
mod types;
mod xattrs;

pub(crate) use namespace::Home;
pub(crate) use purges::PurgeRecord;
pub(crate) use schema::RootSpec;
pub(crate) use types::{
    AttrChange, DirPage, Entry, Expect, Found, NamedEntry, NewNode, RenameMode, Renamed,
    SizeChange, TimeChange, XattrMode,
};

use crate::error::{fs, StoreError, StoreResult};
use rusqlite::{Connection, Transaction, TransactionBehavior};
use spillway_types::Errno;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub(crate) struct MetaStore {
    path: PathBuf,
    /// `None` once closed (fragment destroyed or server stopping): requests get ESTALE.
    conn: Mutex<Option<Connection>>,
}

impl MetaStore {
    /// Create a new database at `path` (which must not exist) with its first inode
    /// counter, and the root directory when `root` is given.
    pub(crate) fn init(
        path: &Path,
        first_counter: u64,
        root: Option<RootSpec>,
    ) -> StoreResult<MetaStore> {
        let mut conn = schema::create(path, first_counter)?;
        if let Some(root) = root {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            schema::insert_root(&tx, &root)?;
            tx.commit()?;
        }
        Ok(MetaStore {
            path: path.to_path_buf(),
            conn: Mutex::new(Some(conn)),
        })
    }

    /// Open an existing database.
    pub(crate) fn open(path: &Path) -> StoreResult<MetaStore> {
        let conn = schema::open(path)?;
        Ok(MetaStore {
            path: path.to_path_buf(),
            conn: Mutex::new(Some(conn)),
        })
    }

    /// Run `f` on the connection (no transaction: single statements are atomic).
    /// A SQLite failure is classified with the OS errno behind it, so that a log or
    /// database that cannot grow answers ENOSPC (`StoreError::from_sqlite`).
    fn with<R>(&self, f: impl FnOnce(&mut Connection) -> StoreResult<R>) -> StoreResult<R> {
        let mut guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let conn = guard.as_mut().ok_or(fs(Errno::ESTALE))?;
        match f(conn) {
            Err(StoreError::Db(e)) => {
                // SAFETY: the handle is this open connection's, used under its lock;
                // sqlite3_system_errno only reads a field of it.
                let os = unsafe { rusqlite::ffi::sqlite3_system_errno(conn.handle()) };
                Err(StoreError::from_sqlite(e, os))
            }
            r => r,
        }
    }

    /// Run `f` in one write transaction, committed if `f` succeeds and rolled back
    /// (by dropping it) otherwise.
    fn txn<R>(&self, f: impl FnOnce(&Transaction<'_>) -> StoreResult<R>) -> StoreResult<R> {
        self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let r = f(&tx)?;
            tx.commit()?;
            Ok(r)
        })
    }

    /// Make every committed transaction durable: with `synchronous = NORMAL` commits
    /// reach the WAL file without an fsync, so sync the WAL. (The main file needs no
    /// sync here: SQLite syncs it after every checkpoint, before the WAL is reused.)
    /// Holding the lock keeps a commit from racing the sync.
    pub(crate) fn sync(&self) -> StoreResult<()> {
        self.with(|_conn| {
            let mut wal = self.path.clone().into_os_string();
            wal.push("-wal");
            match std::fs::File::open(&wal) {
                Ok(f) => f.sync_data()?,
                // No log (just checkpointed away): everything is in the synced main file.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
            Ok(())
        })
    }

    /// Checkpoint the WAL into the main file and close the database. Later calls fail
    /// with ESTALE. Closing twice is fine.
    pub(crate) fn close(&self) -> StoreResult<()> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(conn) = conn {
            conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
            conn.close().map_err(|(_, e)| e)?;
        }
        Ok(())
    }

    /// Number of inodes homed here.
    pub(crate) fn inode_count(&self) -> StoreResult<u64> {
        self.count("SELECT COUNT(*) FROM inodes")
    }

    /// The single number a `SELECT COUNT(*)` query answers.
    fn count(&self, sql: &str) -> StoreResult<u64> {
        self.with(|c| {
            let n: i64 = c.prepare_cached(sql)?.query_row([], |r| r.get(0))?;
            Ok(n.max(0) as u64)
        })
    }
}

/// One item's outcome in a batch (`create_many`, `set_attr_many`): a protocol outcome
/// (EEXIST, ENOENT, ...) answers for that item alone; any other failure (the
/// database's) stops the whole batch, whose transaction is then rolled back.
fn each_outcome<T>(r: StoreResult<T>) -> StoreResult<StoreResult<T>> {
    match r {
        Err(e @ StoreError::Fs(_)) => Ok(Err(e)),
        Err(e) => Err(e),
        Ok(v) => Ok(Ok(v)),
    }
}

#[cfg(test)]
mod acl_tests;
#[cfg(test)]
mod test_fixtures;
#[cfg(test)]
mod tests;
