//! Creating and opening a fragment's database. The DDL here is the format FORMAT.md
//! documents; `schema_version` guards against opening a database of another format.

use crate::error::{StoreError, StoreResult};
use crate::meta::rows;
use rusqlite::{params, Connection, OptionalExtension};
use spillway_types::{Attr, FileKind, Timespec, ROOT_INODE};
use std::path::Path;

pub(super) const SCHEMA_VERSION: i64 = 2;

const DDL: &str = "
CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE inodes(
    ino INTEGER PRIMARY KEY,
    kind INTEGER NOT NULL,
    mode INTEGER NOT NULL,
    nlink INTEGER NOT NULL,
    uid INTEGER NOT NULL,
    gid INTEGER NOT NULL,
    rdev INTEGER NOT NULL,
    size INTEGER NOT NULL,
    atime_s INTEGER NOT NULL, atime_ns INTEGER NOT NULL,
    mtime_s INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    ctime_s INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,
    stripe_size INTEGER NOT NULL,
    stripe_width INTEGER NOT NULL,
    target BLOB NOT NULL,
    blocks INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE dentries(
    parent INTEGER NOT NULL,
    name BLOB NOT NULL,
    child INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    PRIMARY KEY(parent, name)
) WITHOUT ROWID;
CREATE TABLE xattrs(
    ino INTEGER NOT NULL,
    name BLOB NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY(ino, name)
) WITHOUT ROWID;
CREATE TABLE sealed(ino INTEGER PRIMARY KEY);
CREATE TABLE purges(ino INTEGER PRIMARY KEY, stripe_size INTEGER NOT NULL, stripe_width INTEGER NOT NULL);
CREATE TABLE allocs(ino INTEGER NOT NULL, server INTEGER NOT NULL, bytes INTEGER NOT NULL, PRIMARY KEY(ino, server)) WITHOUT ROWID;
";

/// Version 1 to 2: the allocation of each inode's stripes (`inodes.blocks`, `allocs`).
/// The values are filled in by the servers' reports, which every server sends for all
/// its stripes when it starts (data-plane.md, "Allocation").
const MIGRATE_1_TO_2: &str = "
ALTER TABLE inodes ADD COLUMN blocks INTEGER NOT NULL DEFAULT 0;
CREATE TABLE allocs(ino INTEGER NOT NULL, server INTEGER NOT NULL, bytes INTEGER NOT NULL, PRIMARY KEY(ino, server)) WITHOUT ROWID;
UPDATE meta SET value = 2 WHERE key = 'schema_version';
";

/// Owner and mode of a new instance's root directory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RootSpec {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub stripe_size: u32,
    pub stripe_width: u16,
}

fn configure(conn: &Connection) -> StoreResult<()> {
    // This server is the database's only user: take the file lock once and keep it.
    // Every transaction then skips its lock and unlock system calls (eight per
    // metadata request otherwise) and the WAL index lives in memory instead of a
    // shared -shm mapping. Set before WAL mode, as SQLite requires for the in-memory
    // WAL index. (Tools that want to look inside must stop the server first.)
    conn.query_row("PRAGMA locking_mode = EXCLUSIVE", [], |_| Ok(()))?;
    // journal_mode answers with a row, so it is queried rather than executed.
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Corrupt(format!(
            "database refused WAL mode (got {mode})"
        )));
    }
    conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = OFF;")?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

pub(super) fn create(path: &Path, first_counter: u64) -> StoreResult<Connection> {
    // SQLite would create the file 0644 (and its WAL with the same mode): made 0600
    // first, so the metadata is never readable by others.
    spillway_types::files::precreate_private(path)?;
    let mut conn = Connection::open(path)?;
    configure(&conn)?;
    let tx = conn.transaction()?;
    tx.execute_batch(DDL)?;
    tx.execute(
        "INSERT INTO meta(key, value) VALUES ('schema_version', ?1)",
        params![SCHEMA_VERSION],
    )?;
    tx.execute(
        "INSERT INTO meta(key, value) VALUES ('next_inode', ?1)",
        params![rows::sql_u64(first_counter)],
    )?;
    tx.commit()?;
    Ok(conn)
}

pub(super) fn open(path: &Path) -> StoreResult<Connection> {
    if !path.exists() {
        return Err(StoreError::Corrupt(format!(
            "{} is missing",
            path.display()
        )));
    }
    // An older version's 0644 database becomes 0600 before SQLite opens its WAL
    // (which takes the database's mode).
    spillway_types::files::make_private(path)?;
    let mut conn = Connection::open(path)?;
    configure(&conn)?;
    let version: Option<i64> = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    let version = match version {
        Some(1) => {
            let tx = conn.transaction()?;
            tx.execute_batch(MIGRATE_1_TO_2)?;
            tx.commit()?;
            tracing::info!("{}: schema upgraded from version 1 to 2", path.display());
            Some(2)
        }
        v => v,
    };
    if version != Some(SCHEMA_VERSION) {
        return Err(StoreError::Corrupt(format!(
            "{}: schema version {version:?}, this server reads {SCHEMA_VERSION}",
            path.display()
        )));
    }
    Ok(conn)
}

pub(super) fn insert_root(conn: &Connection, root: &RootSpec) -> StoreResult<()> {
    let now = Timespec::now();
    let attr = Attr {
        ino: ROOT_INODE,
        kind: FileKind::Directory,
        mode: root.mode & 0o7777,
        nlink: 2,
        uid: root.uid,
        gid: root.gid,
        rdev: 0,
        size: 0,
        atime: now,
        mtime: now,
        ctime: now,
        stripe_size: root.stripe_size,
        stripe_width: root.stripe_width,
        blocks: 0,
    };
    rows::insert_inode(conn, &attr, &[])
}
