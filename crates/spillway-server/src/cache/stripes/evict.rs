//! Eviction: whole stripe files of clean stripes deleted, least recently used first,
//! never one holding a dirty range. The stripe is the unit because the `DataStore`
//! counts space by stripe length (a hole punched in a stripe file would free disk but
//! no capacity).

use super::CacheStripes;
use crate::data::DataStore;
use spillway_types::InodeNo;
use std::sync::atomic::Ordering;

impl CacheStripes {
    /// Delete clean stripes, least recently used first, until `want_free` bytes of the
    /// fragment's capacity can be claimed (`DataStore::room`: neither used nor promised
    /// to a connection, the space a write or fetch is checked against) or no clean, idle
    /// stripe is left. Returns the bytes freed. Called before a write would fail with
    /// ENOSPC, by a fetch that found the fragment full, and by `flush_pass` when the
    /// fragment is over 90% full.
    pub(crate) fn evict(&self, data: &DataStore, want_free: u64) -> u64 {
        if data.room() >= want_free {
            return 0;
        }
        self.adopt(data);
        let mut lru: Vec<(u64, InodeNo, u64)> = {
            let st = self.state();
            st.inodes
                .iter()
                .filter(|(_, i)| !i.blocked)
                .flat_map(|(&ino, i)| {
                    let clean = i.stripes.iter().filter(|(_, s)| s.evictable());
                    clean.map(move |(&k, s)| (s.last_use, ino, k))
                })
                .collect()
        };
        lru.sort_unstable();
        let mut freed = 0;
        for (_, ino, k) in lru {
            if data.room() >= want_free {
                break;
            }
            if !self.start_evicting(ino, k) {
                continue;
            }
            let r = data.delete_stripe_file(ino, k);
            self.end_evicting(ino, k, r.is_ok());
            match r {
                Ok(n) => freed += n,
                Err(e) => tracing::warn!("evicting stripe {k} of inode {:#x}: {e}", ino.0),
            }
        }
        freed
    }

    /// Take in, once, the stripe files on disk that the state does not know: after a
    /// restart, the clean stripes of before (the dirty ones came back from the log).
    /// They are the least recently used of all.
    fn adopt(&self, data: &DataStore) {
        if self.adopted.swap(true, Ordering::AcqRel) {
            return;
        }
        match data.stored_stripes() {
            Ok(found) => {
                let mut st = self.state();
                for (ino, k, _) in found {
                    st.inodes
                        .entry(ino)
                        .or_default()
                        .stripes
                        .entry(k)
                        .or_default();
                }
            }
            Err(e) => {
                tracing::warn!("listing the stripes to evict: {e}");
                self.adopted.store(false, Ordering::Release);
            }
        }
    }

    /// Mark a stripe as being evicted, if it still may be: nothing starts on it until
    /// `end_evicting`.
    fn start_evicting(&self, ino: InodeNo, stripe: u64) -> bool {
        let mut st = self.state();
        let Some(i) = st.inodes.get_mut(&ino).filter(|i| !i.blocked) else {
            return false;
        };
        match i.stripes.get_mut(&stripe) {
            Some(s) if s.evictable() => {
                s.evicting = true;
                true
            }
            _ => false,
        }
    }

    /// The stripe's file is gone (`deleted`), or may be partly: either way nothing of
    /// it is known present any more.
    fn end_evicting(&self, ino: InodeNo, stripe: u64, deleted: bool) {
        let mut st = self.state();
        if let Some(i) = st.inodes.get_mut(&ino) {
            if deleted {
                i.stripes.remove(&stripe);
            } else if let Some(s) = i.stripes.get_mut(&stripe) {
                s.present = Default::default();
                s.evicting = false;
            }
        }
        st.tidy(ino);
        self.changed.notify_all();
    }
}
