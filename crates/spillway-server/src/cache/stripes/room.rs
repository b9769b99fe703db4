//! Room for a write into a full cache (docs/cache.md, "Eviction"). A cache is never
//! full the way a disk is: its clean stripes can go, its dirty ones can be written
//! behind and then go. A write that finds the fragment full therefore waits for room
//! rather than being answered short or ENOSPC (applications do not retry a short
//! write): clean stripes are evicted, and while that is not enough the writer itself
//! writes dirty files behind (oldest first), evicting what they leave clean, until
//! there is room or the wait's bound passes. Only then, with the fragment full of
//! dirty data that did not drain (a PFS that fails or is too slow), is the write
//! answered with what fit, or ENOSPC.

use super::CacheStripes;
use crate::cache::PfsFiles;
use crate::data::DataStore;
use spillway_types::InodeNo;
use std::time::{Duration, Instant};

/// How long a writer sleeps for someone else's flush or eviction before it looks
/// again (it is woken earlier when one ends).
const LOOK_AGAIN: Duration = Duration::from_millis(100);

impl CacheStripes {
    /// Make `need` bytes of the fragment's capacity claimable (`DataStore::room`) by
    /// `deadline`: evict clean stripes, and while that is not enough write dirty files
    /// behind, oldest first (those nobody else is writing behind and not waiting out a
    /// failure's backoff), or wait for those others are writing behind. True once the
    /// room is there; false at the deadline.
    pub(crate) fn make_room(
        &self,
        data: &DataStore,
        pfs: &dyn PfsFiles,
        need: u64,
        deadline: Instant,
    ) -> bool {
        loop {
            self.evict(data, need);
            if data.room() >= need {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                tracing::warn!(
                    need,
                    dirty = self.dirty_bytes(),
                    capacity = data.capacity(),
                    "a write found the cache full of data not yet written to the PFS, \
                     and it did not drain in time"
                );
                return false;
            }
            match self.oldest_flushable(now) {
                Some(ino) => {
                    if let Some(owned) = self.try_own(ino) {
                        let r = self.flush_owned(data, pfs, ino, owned);
                        if let Err(e) = self.unless_gone(data, ino, r) {
                            tracing::warn!(
                                "write-behind of inode {:#x} for room: {e} (retried later)",
                                ino.0
                            );
                        }
                    }
                }
                None => {
                    // Flushes, reads or writes of others hold what could go: wait for
                    // one of them to end.
                    let st = self.state();
                    let wait = deadline.saturating_duration_since(now).min(LOOK_AGAIN);
                    drop(
                        self.changed
                            .wait_timeout(st, wait)
                            .unwrap_or_else(|e| e.into_inner()),
                    );
                }
            }
        }
    }

    /// The dirty inode that has been dirty longest among those nobody owns and not
    /// waiting out the backoff of a failed flush.
    fn oldest_flushable(&self, now: Instant) -> Option<InodeNo> {
        let policy = super::FlushPolicy::default();
        let st = self.state();
        st.inodes
            .iter()
            .filter(|(_, i)| i.is_dirty() && !i.owned && !super::flush::waiting(i, &policy, now))
            .min_by_key(|(&ino, i)| (i.dirty_since, ino))
            .map(|(&ino, _)| ino)
    }
}
