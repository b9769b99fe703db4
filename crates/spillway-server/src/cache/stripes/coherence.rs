//! Coherence at open, the data side (the rule: cache/coherence.rs): what this server
//! holds of a file, for the namespace server's check, and the drop of its cached copy
//! when the PFS file was changed from outside.

use super::state::Inode;
use super::CacheStripes;
use crate::cache::coherence::InodeStatus;
use crate::data::DataStore;
use crate::error::StoreResult;
use spillway_types::InodeNo;
use std::sync::atomic::Ordering;

impl CacheStripes {
    /// What this server holds of `ino`.
    pub(crate) fn inode_status(&self, data: &DataStore, ino: InodeNo) -> InodeStatus {
        let mut s = match self.state().inodes.get(&ino) {
            Some(i) => InodeStatus {
                cached: !i.stripes.is_empty(),
                dirty: i.is_dirty(),
                busy: i.owned || i.bypassing > 0,
                flushed: i.flushed,
            },
            None => InodeStatus::default(),
        };
        // Stripe files the state does not know (the clean stripes of before a restart).
        s.cached |= !data.stripe_info(ino).is_empty();
        s
    }

    /// Drop this server's cached copy of `ino`, stripe files and state, because the
    /// PFS file changed from outside: true when dropped. Some of it dirty (written here,
    /// not yet on the PFS), nothing is dropped and the answer is false: those bytes win.
    /// Waits for the fetches, writes and readers under way (a reader between
    /// `prepare_read` and its read must still find the bytes it was promised), and for
    /// a truncate or delete that runs; none starts meanwhile.
    pub(crate) fn drop_clean(&self, data: &DataStore, ino: InodeNo) -> StoreResult<bool> {
        if self.is_dirty(ino) {
            return Ok(false);
        }
        let owned = self.own(ino);
        let dirty = {
            let mut st = self.state();
            st.inodes.entry(ino).or_default().blocked = true;
            loop {
                let i = st.inodes.get(&ino);
                let busy = i.is_some_and(|i| {
                    i.stripes.values().any(|k| {
                        !k.fetches.is_empty() || !k.writes.is_empty() || k.evicting || k.pins > 0
                    })
                });
                if !busy {
                    break i.is_some_and(Inode::is_dirty);
                }
                st = self.wait(st);
            }
        };
        if dirty {
            // A write that ended meanwhile: it wins (dropping `owned` unblocks).
            return Ok(false);
        }
        // The PFS file may be another one now: a stream reopens it.
        self.end_stream(ino, &owned, true);
        let r = data.delete(ino);
        if let Some(i) = self.state().inodes.get_mut(&ino) {
            // Even if the delete failed half-way: what is left is not known present,
            // so it is fetched again (and eviction looks for the files again).
            i.stripes.clear();
            i.flushed = None;
            i.dirty_since = None;
            i.retry = None;
            i.recovered = false;
        }
        if r.is_err() {
            self.adopted.store(false, Ordering::Release);
        }
        drop(owned);
        r.map(|()| true)
    }
}
