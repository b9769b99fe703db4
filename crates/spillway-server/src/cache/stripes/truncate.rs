//! Truncate and delete of a cached file: its stripe files cut or removed, and its state
//! with them. Dirty ranges that go get `Dropped` records, made durable before the call
//! returns (a dropped range that came back after a crash would be written to the PFS
//! past its truncation, or to a file that is gone).
//!
//! Both own the inode's write-behind, so no flush runs meanwhile: a flush that had
//! copied bytes before the cut could write them to the PFS after it. They also block
//! new reads and writes of the inode and wait for those under way. The namespace side
//! (the PFS file's own truncate or unlink) comes after.

use super::state::clip;
use super::CacheStripes;
use crate::cache::wblog::Kind;
use crate::data::DataStore;
use crate::error::{fs, StoreResult};
use spillway_types::{Errno, InodeNo};
use std::sync::atomic::Ordering;

impl CacheStripes {
    /// Cut the cached file `ino` to `size` bytes (`DataStore::truncate`, then the
    /// state): dirty and present ranges past `size` are dropped.
    pub(crate) fn truncate(
        &self,
        data: &DataStore,
        ino: InodeNo,
        size: u64,
        stripe_size: u32,
    ) -> StoreResult<()> {
        if stripe_size == 0 {
            return Err(fs(Errno::EINVAL));
        }
        let owned = self.own(ino);
        self.block(ino);
        self.end_stream(ino, &owned, false);
        let r = data.truncate(ino, size, stripe_size);
        let dropped = {
            let mut st = self.state();
            let ss = u64::from(stripe_size);
            let mut dropped = false;
            if let Some(inode) = st.inodes.get_mut(&ino) {
                let mut gone = Vec::new();
                for (&k, s) in inode.stripes.iter_mut() {
                    let cut = match k.checked_mul(ss) {
                        Some(start) if start < size => size - start,
                        _ => 0,
                    };
                    if cut >= ss {
                        continue;
                    }
                    // Clean bytes past the cut are forgotten even if the cut failed
                    // half-way: they are fetched again if still wanted.
                    s.present.remove(cut, u64::MAX);
                    if r.is_err() {
                        // Dirty ones may still be in the file: kept, and written behind.
                        continue;
                    }
                    for range in clip(&s.dirty, cut, u64::MAX) {
                        let rec = self.append(&mut inode.last_seq, Kind::Dropped, ino, k, range);
                        if let Err(e) = rec {
                            tracing::warn!("write-behind log: {e}");
                        }
                        dropped = true;
                    }
                    s.dirty.remove(cut, u64::MAX);
                    if cut == 0 {
                        gone.push(k);
                    }
                }
                for k in gone {
                    inode.stripes.remove(&k);
                }
                if !inode.is_dirty() {
                    inode.dirty_since = None;
                    inode.retry = None;
                }
            }
            dropped
        };
        drop(owned);
        if dropped {
            self.sync_log()?;
        }
        r
    }

    /// Remove the cached file `ino` (`DataStore::delete`, then the state): all of its
    /// state goes, dirty ranges included.
    pub(crate) fn delete(&self, data: &DataStore, ino: InodeNo) -> StoreResult<()> {
        let owned = self.own(ino);
        self.block(ino);
        self.end_stream(ino, &owned, true);
        let r = data.delete(ino);
        let dropped = {
            let mut st = self.state();
            let mut dropped = false;
            if let Some(inode) = st.inodes.get_mut(&ino) {
                for (&k, s) in &inode.stripes {
                    for range in s.dirty.iter() {
                        let rec = self.append(&mut inode.last_seq, Kind::Dropped, ino, k, range);
                        if let Err(e) = rec {
                            tracing::warn!("write-behind log: {e}");
                        }
                        dropped = true;
                    }
                }
                inode.stripes.clear();
                inode.dirty_since = None;
                inode.retry = None;
                inode.recovered = false;
            }
            dropped
        };
        if r.is_err() {
            // Stripe files may be left, unknown to the state: eviction looks again.
            self.adopted.store(false, Ordering::Release);
        }
        drop(owned);
        if dropped {
            self.sync_log()?;
        }
        r
    }

    /// Block new reads and writes of `ino`, and wait for those under way: fetches give
    /// up what they have not started copying, writes finish.
    fn block(&self, ino: InodeNo) {
        let mut st = self.state();
        st.inodes.entry(ino).or_default().blocked = true;
        loop {
            let busy = st.inodes.get(&ino).is_some_and(|i| {
                i.stripes
                    .values()
                    .any(|k| !k.fetches.is_empty() || !k.writes.is_empty() || k.evicting)
            });
            if !busy {
                return;
            }
            st = self.wait(st);
        }
    }
}
