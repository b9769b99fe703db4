//! The purge log. Purging an inode (no link left, no open handle) drops its metadata at
//! once but its stripes live on several servers, which may be unreachable: the `purges`
//! row, written in the same transaction that drops the inode, remembers the data still
//! to delete until every server has confirmed (FORMAT.md, "purges").

use crate::error::{StoreError, StoreResult};
use crate::meta::{rows, MetaStore};
use rusqlite::params;
use spillway_types::{FileKind, InodeNo};

/// A purge whose data deletion is still owed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PurgeRecord {
    pub ino: InodeNo,
    pub stripe_size: u32,
    pub stripe_width: u16,
}

impl MetaStore {
    /// Purge `ino` if it still exists with no link: drop its rows and, for a regular
    /// file (the only kind with stripes), log the data deletion. Returns whether a data
    /// deletion was logged. Purging an absent or linked inode does nothing, so racing
    /// callers (last close vs. last unlink) cannot purge twice.
    pub(crate) fn begin_purge(&self, ino: InodeNo) -> StoreResult<bool> {
        self.txn(|tx| {
            let Some(a) = rows::get_inode(tx, ino)? else {
                return Ok(false);
            };
            if a.nlink != 0 {
                return Ok(false);
            }
            rows::delete_inode(tx, ino)?;
            if a.kind != FileKind::Regular {
                return Ok(false);
            }
            tx.prepare_cached(
                "INSERT OR REPLACE INTO purges(ino, stripe_size, stripe_width) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![rows::ino_sql(ino), a.stripe_size, a.stripe_width])?;
            Ok(true)
        })
    }

    /// How many purges are still owed (for operators: `FragmentList`).
    pub(crate) fn purge_count(&self) -> StoreResult<u64> {
        self.count("SELECT COUNT(*) FROM purges")
    }

    pub(crate) fn pending_purges(&self) -> StoreResult<Vec<PurgeRecord>> {
        self.with(|c| {
            let mut stmt =
                c.prepare_cached("SELECT ino, stripe_size, stripe_width FROM purges ORDER BY ino")?;
            let raw = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in raw {
                let (ino, ss, sw) = row?;
                let (Ok(stripe_size), Ok(stripe_width)) = (u32::try_from(ss), u16::try_from(sw))
                else {
                    return Err(StoreError::Corrupt(format!(
                        "purges row {ino}: bad geometry {ss}/{sw}"
                    )));
                };
                out.push(PurgeRecord {
                    ino: InodeNo(rows::from_sql_u64(ino)),
                    stripe_size,
                    stripe_width,
                });
            }
            Ok(out)
        })
    }

    /// Every server has deleted the data of `ino`.
    pub(crate) fn finish_purge(&self, ino: InodeNo) -> StoreResult<()> {
        self.with(|c| {
            c.prepare_cached("DELETE FROM purges WHERE ino = ?1")?
                .execute(params![rows::ino_sql(ino)])?;
            Ok(())
        })
    }

    /// Inodes with no link left: after a restart nothing has them open, so all are
    /// purged at start.
    pub(crate) fn orphans(&self) -> StoreResult<Vec<InodeNo>> {
        self.with(|c| {
            let mut stmt = c.prepare_cached("SELECT ino FROM inodes WHERE nlink = 0")?;
            let inos = stmt.query_map([], |r| r.get::<_, i64>(0))?;
            Ok(inos
                .collect::<Result<Vec<i64>, _>>()?
                .into_iter()
                .map(|i| InodeNo(rows::from_sql_u64(i)))
                .collect())
        })
    }
}
