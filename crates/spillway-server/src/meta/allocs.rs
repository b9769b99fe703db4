//! What each server reports its stripes of an inode occupy on disk (`allocs`), and their
//! sum as the inode's `blocks` (`st_blocks`). The home cannot stat other servers' files
//! on every getattr, so the servers tell it whenever an inode's allocation on them
//! changed (fragment/allocs.rs); a report carries the absolute value, so a repeated or
//! lost one is corrected by the next.

use crate::error::StoreResult;
use crate::meta::{rows, MetaStore};
use rusqlite::{params, Connection};
use spillway_types::{Attr, FileKind, InodeNo};

/// A writer told the home it wrote data to `a` (ExtendSize with `touch`): while no
/// server has reported any allocation yet (the reports follow the writes by some
/// milliseconds), show one block rather than none. Tools take `st_blocks == 0` with a
/// non-zero size for a file that is all hole (GNU tar's --sparse archives it without
/// reading it); one block too many only makes them look for the data with SEEK_DATA.
/// The next report of any server replaces it with the true sum.
pub(super) fn provisional_blocks(tx: &Connection, a: &mut Attr) -> StoreResult<()> {
    if a.kind == FileKind::Regular && a.size > 0 && a.blocks == 0 {
        a.blocks = 1;
        tx.prepare_cached("UPDATE inodes SET blocks = 1 WHERE ino = ?1")?
            .execute(params![rows::ino_sql(a.ino)])?;
    }
    Ok(())
}

impl MetaStore {
    /// Record that server `server` holds `bytes` of each listed inode's stripes, and
    /// recompute the inodes' `blocks`. Inodes not homed here (or already purged) are
    /// skipped: their report came too late to matter. Returns how many were recorded.
    pub(crate) fn set_allocs(&self, server: u16, entries: &[(InodeNo, u64)]) -> StoreResult<usize> {
        self.txn(|tx| {
            let mut recorded = 0;
            for &(ino, bytes) in entries {
                let exists = tx
                    .prepare_cached("SELECT 1 FROM inodes WHERE ino = ?1")?
                    .exists(params![rows::ino_sql(ino)])?;
                if !exists {
                    continue;
                }
                if bytes == 0 {
                    tx.prepare_cached("DELETE FROM allocs WHERE ino = ?1 AND server = ?2")?
                        .execute(params![rows::ino_sql(ino), server])?;
                } else {
                    tx.prepare_cached(
                        "INSERT OR REPLACE INTO allocs(ino, server, bytes) VALUES (?1, ?2, ?3)",
                    )?
                    .execute(params![
                        rows::ino_sql(ino),
                        server,
                        rows::sql_u64(bytes)
                    ])?;
                }
                // Summed in Rust: the values are u64 stored bit for bit (rows.rs).
                let mut total = 0u64;
                {
                    let mut stmt = tx.prepare_cached("SELECT bytes FROM allocs WHERE ino = ?1")?;
                    let all =
                        stmt.query_map(params![rows::ino_sql(ino)], |r| r.get::<_, i64>(0))?;
                    for b in all {
                        total = total.saturating_add(rows::from_sql_u64(b?));
                    }
                }
                tx.prepare_cached("UPDATE inodes SET blocks = ?2 WHERE ino = ?1")?
                    .execute(params![
                        rows::ino_sql(ino),
                        rows::sql_u64(total.div_ceil(512))
                    ])?;
                recorded += 1;
            }
            Ok(recorded)
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::meta::{Home, MetaStore, NewNode};
    use spillway_types::{FileKind, InodeNo, ServerIndex};

    fn store() -> (tempfile::TempDir, MetaStore) {
        crate::meta::test_fixtures::store_with(crate::meta::RootSpec {
            uid: 0,
            gid: 0,
            mode: 0o755,
            stripe_size: 65536,
            stripe_width: 2,
        })
    }

    #[test]
    fn a_version_1_database_is_upgraded() {
        let (dir, m) = store();
        m.close().unwrap();
        let path = dir.path().join("meta.sqlite");
        {
            // What version 1 wrote: no blocks column, no allocs table.
            let c = rusqlite::Connection::open(&path).unwrap();
            c.execute_batch(
                "ALTER TABLE inodes DROP COLUMN blocks; DROP TABLE allocs; \
                 UPDATE meta SET value = 1 WHERE key = 'schema_version';",
            )
            .unwrap();
        }
        let m = MetaStore::open(&path).unwrap();
        let root = m.get_attr(spillway_types::ROOT_INODE).unwrap();
        assert_eq!(root.blocks, 0);
        assert_eq!(m.set_allocs(0, &[(root.ino, 512)]).unwrap(), 1);
        assert_eq!(m.get_attr(root.ino).unwrap().blocks, 1);
        m.close().unwrap();
        // Reopened: version 2 now, nothing to do.
        let m = MetaStore::open(&path).unwrap();
        assert_eq!(m.get_attr(root.ino).unwrap().blocks, 1);
    }

    #[test]
    fn blocks_are_the_sum_of_the_servers_reports() {
        let (_d, m) = store();
        let home = Home {
            index: ServerIndex(0),
            count: 2,
            default_stripe_size: 65536,
        };
        let f = NewNode::new(
            spillway_types::ROOT_INODE,
            b"f",
            FileKind::Regular,
            0o644,
            0,
            0,
        );
        let a = m.create(&f, home).unwrap();
        assert_eq!(a.blocks, 0);
        // A writer's size update: one block until a server reports.
        assert_eq!(m.extend_size(a.ino, 0, true).unwrap().blocks, 0, "empty");
        assert_eq!(m.extend_size(a.ino, 10, true).unwrap().blocks, 1);
        assert_eq!(m.get_attr(a.ino).unwrap().blocks, 1);
        assert_eq!(m.set_allocs(0, &[(a.ino, 4096)]).unwrap(), 1);
        assert_eq!(
            m.set_allocs(1, &[(a.ino, 8192), (InodeNo(999), 5)])
                .unwrap(),
            1
        );
        assert_eq!(m.get_attr(a.ino).unwrap().blocks, 24);
        // Absolute values: a later report replaces the earlier one.
        m.set_allocs(1, &[(a.ino, 100)]).unwrap();
        assert_eq!(
            m.get_attr(a.ino).unwrap().blocks,
            (4096 + 100u64).div_ceil(512)
        );
        m.set_allocs(0, &[(a.ino, 0)]).unwrap();
        m.set_allocs(1, &[(a.ino, 0)]).unwrap();
        assert_eq!(m.get_attr(a.ino).unwrap().blocks, 0);
    }
}
