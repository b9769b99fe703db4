//! The cached data of a cache instance on one server (docs/cache.md, sections 3 and
//! 5): what the stripe files of the fragment's `DataStore` mean. Stripe `k` of a file
//! with stripe size `S` caches the file's bytes `[k*S, (k+1)*S)` at stripe-file offsets
//! `0..S`; per stripe this module knows which ranges are *present* (the file's bytes:
//! clean, the same as the PFS's, or dirty) and which are *dirty* (written here, not
//! yet on the PFS).
//!
//! * Present and clean state is memory only: losing it costs a refetch, never data.
//!   Dirty state is also in the write-behind log (`wblog`, `writeback.log` in the
//!   fragment's directory), so a restart resumes write-behind.
//! * Reads (`prepare_read`, fetch.rs) fetch absent ranges from the PFS with read-ahead;
//!   writes (`begin_write`, write.rs) are bracketed so that a fetch never overwrites
//!   them and a flush never marks them clean; write-behind (flush.rs) writes dirty
//!   ranges to the PFS in merged, ordered writes; eviction (evict.rs) deletes clean
//!   stripes, least recently used first, and a write that finds the fragment full
//!   waits for room (room.rs) rather than being answered short; truncate and delete
//!   (truncate.rs) drop state; coherence at open (coherence.rs) reports an inode's
//!   state to the namespace server and drops a copy the PFS changed under.
//! * The log's appends, group-committed syncs, compaction and repair: logfile.rs.
//!
//! Locking: one state mutex (state.rs), held for bookkeeping and for appending to the
//! log (a write(2) into the page cache), never across I/O on a stripe file or the PFS,
//! so a slow PFS blocks only the requests waiting for the very bytes it is fetching or
//! flushing (the one exception: the repair of a broken log, logfile.rs, rare). Lock order: state, then log, then the sync state. Waiters (a reader
//! waiting for another's fetch, a write for a fetch's piece being copied under it)
//! sleep on one condition variable that every change of a running operation signals.

mod coherence;
mod evict;
mod fetch;
mod flush;
mod logfile;
mod mtime;
mod room;
mod state;
mod stream;
mod truncate;
mod write;

#[cfg(test)]
mod tests;

// What the request path and the fragment's write-behind thread name.
#[allow(unused_imports)]
pub(crate) use fetch::ReadGuard;
#[allow(unused_imports)]
pub(crate) use flush::{FlushPolicy, FlushReport, FlushStats};
#[allow(unused_imports)]
pub(crate) use write::WriteGuard;

use crate::cache::wblog::FileLog;
use crate::error::StoreResult;
use logfile::{open_for_sync, LogState, Synced};
use spillway_types::InodeNo;
use state::{Inode, State};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// The write-behind log's file name in the fragment's directory.
pub(crate) const LOG_NAME: &str = "writeback.log";

pub(crate) struct CacheStripes {
    read_ahead: u64,
    state: Mutex<State>,
    /// Signalled whenever a fetch, write, flush, eviction, truncate or reader ends or
    /// gives up part of what it held.
    changed: Condvar,
    log: Mutex<LogState>,
    synced: Mutex<Synced>,
    sync_done: Condvar,
    /// Eviction has taken in the stripe files found on disk (evict.rs).
    adopted: AtomicBool,
    /// Rung when a file is being streamed (flush.rs, `STREAM_RUN`): the fragment's
    /// write-behind thread starts its pass at once instead of at the next second.
    kick: Arc<Kick>,
    /// How long a write or fetch that finds the fragment full waits for room (ms; the
    /// server's `cache_room_wait`, room.rs).
    room_wait_ms: AtomicU64,
}

/// A doorbell for the write-behind thread.
#[derive(Default)]
pub(crate) struct Kick {
    rung: Mutex<bool>,
    cv: Condvar,
}

impl Kick {
    pub(crate) fn ring(&self) {
        let mut r = self.rung.lock().unwrap_or_else(|e| e.into_inner());
        if !*r {
            *r = true;
            self.cv.notify_all();
        }
    }

    /// Wait until rung or `timeout` passes, and clear it.
    pub(crate) fn wait(&self, timeout: std::time::Duration) {
        let r = self.rung.lock().unwrap_or_else(|e| e.into_inner());
        let (mut r, _) = self
            .cv
            .wait_timeout_while(r, timeout, |rung| !*rung)
            .unwrap_or_else(|e| e.into_inner());
        *r = false;
    }
}

impl CacheStripes {
    /// Open the cached data of the fragment in `dir`: recover its write-behind log
    /// (created when missing). The dirty ranges the log names are present and dirty,
    /// and due for write-behind at once (`flush_pass`). `read_ahead`: bytes read past
    /// a missed read (0: none).
    pub(crate) fn open(dir: &Path, read_ahead: u64) -> StoreResult<CacheStripes> {
        let path = dir.join(LOG_NAME);
        let log = FileLog::open(&path)?;
        let file = open_for_sync(&path)?;
        // What was recovered may be in the page cache only (a kill -9 before its sync):
        // made durable now, before any write here depends on it.
        file.sync_data()?;
        let mut state = State::default();
        for (&ino, d) in &log.dirty().inodes {
            let inode = state.inodes.entry(InodeNo(ino)).or_insert_with(|| Inode {
                recovered: true,
                dirty_since: Some(Instant::now()),
                // Times set before the restart: its write-behind leaves them.
                times: d.times,
                ..Inode::default()
            });
            for (&k, ranges) in &d.stripes {
                let s = inode.stripes.entry(k).or_default();
                s.dirty = ranges.clone();
                s.present = ranges.clone();
            }
        }
        Ok(CacheStripes {
            read_ahead,
            state: Mutex::new(state),
            changed: Condvar::new(),
            log: Mutex::new(LogState::new(path, log, file)),
            synced: Mutex::new(Synced::default()),
            sync_done: Condvar::new(),
            adopted: AtomicBool::new(false),
            kick: Arc::default(),
            room_wait_ms: AtomicU64::new(20_000),
        })
    }

    /// How long a write or fetch that finds the fragment full waits for room.
    pub(crate) fn room_wait(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.room_wait_ms.load(Ordering::Relaxed))
    }

    pub(crate) fn set_room_wait(&self, wait: std::time::Duration) {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        self.room_wait_ms.store(ms, Ordering::Relaxed);
    }

    /// The doorbell of the write-behind thread (it outlives a fragment that goes).
    pub(crate) fn kick(&self) -> Arc<Kick> {
        self.kick.clone()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sleep until something changes (`changed`), with the state lock given back.
    fn wait<'a>(&self, g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    /// Dirty bytes of every inode.
    pub(crate) fn dirty_bytes(&self) -> u64 {
        self.state().inodes.values().map(Inode::dirty_bytes).sum()
    }

    /// The inodes with dirty ranges.
    pub(crate) fn dirty_inodes(&self) -> Vec<InodeNo> {
        let st = self.state();
        let mut v: Vec<InodeNo> = st
            .inodes
            .iter()
            .filter(|(_, i)| i.is_dirty())
            .map(|(&ino, _)| ino)
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether `ino` has dirty ranges here.
    pub(crate) fn is_dirty(&self, ino: InodeNo) -> bool {
        self.state().inodes.get(&ino).is_some_and(Inode::is_dirty)
    }

    /// Own the inode's write-behind (flush, truncate, delete: one at a time), waiting
    /// for the one that runs.
    fn own(&self, ino: InodeNo) -> Owned<'_> {
        let mut st = self.state();
        loop {
            let i = st.inodes.entry(ino).or_default();
            if !i.owned {
                i.owned = true;
                return Owned { c: self, ino };
            }
            st = self.wait(st);
        }
    }

    /// `own`, unless someone else owns it now.
    fn try_own(&self, ino: InodeNo) -> Option<Owned<'_>> {
        let mut st = self.state();
        let i = st.inodes.entry(ino).or_default();
        if i.owned {
            return None;
        }
        i.owned = true;
        Some(Owned { c: self, ino })
    }
}

/// The inode's write-behind, owned until dropped. Dropping also clears what an owner
/// that failed half-way may have left set (a flush's `touched`, a truncate's block).
struct Owned<'a> {
    c: &'a CacheStripes,
    ino: InodeNo,
}

impl Drop for Owned<'_> {
    fn drop(&mut self) {
        let mut st = self.c.state();
        if let Some(i) = st.inodes.get_mut(&self.ino) {
            i.owned = false;
            i.blocked = false;
            i.joining = false;
            for s in i.stripes.values_mut() {
                s.touched = None;
            }
        }
        st.tidy(self.ino);
        self.c.changed.notify_all();
    }
}
