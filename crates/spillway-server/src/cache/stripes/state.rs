//! The bookkeeping of the cached stripes: per stripe, which ranges are present, dirty,
//! being fetched, written or flushed; per inode, its write-behind schedule. Plain data,
//! no I/O: it lives under `CacheStripes`' state mutex, which is held for bookkeeping
//! and log appends only, never across a stripe file's or the PFS's I/O.
//!
//! Offsets here are stripe-relative (`0..stripe_size`), as in the stripe files and the
//! write-behind log.

use crate::cache::coherence::PfsVersion;
use crate::cache::ranges::RangeSet;
use crate::cache::wblog::LogTimes;
use spillway_types::{InodeNo, Timespec};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// A fetch from the PFS into one stripe: what it claimed and has not copied yet
/// (`pending`: a write may take ranges back out, and the fetch then leaves them
/// alone), and the piece it is copying now (`copying`: a write overlapping it waits).
pub(super) struct Fetch {
    pub id: u64,
    pub pending: RangeSet,
    pub copying: RangeSet,
}

/// One stripe of one inode.
#[derive(Default)]
pub(super) struct Stripe {
    /// Bytes of the stripe file that are the file's bytes: clean (the PFS's) or dirty.
    pub present: RangeSet,
    /// Bytes written here and not yet on the PFS (a subset of `present`).
    pub dirty: RangeSet,
    /// Fetches running into this stripe.
    pub fetches: Vec<Fetch>,
    /// Client writes between `begin_write` and their finish: (id, start, end).
    pub writes: Vec<(u64, u64, u64)>,
    /// Some while a flush of this stripe runs: the ranges written since the flush took
    /// its snapshot (or being written then), which it must leave dirty.
    pub touched: Option<RangeSet>,
    /// Readers between `prepare_read` and their read of the stripe file.
    pub pins: u32,
    /// Its file is being deleted (eviction): nothing starts on it meanwhile.
    pub evicting: bool,
    /// The clock at the last read or write (least recently used is evicted first).
    pub last_use: u64,
}

impl Stripe {
    /// Whether some fetch has claimed or is copying part of `[s, e)`.
    pub(super) fn fetch_overlaps(&self, s: u64, e: u64) -> bool {
        self.fetches
            .iter()
            .any(|f| overlaps(&f.pending, s, e) || overlaps(&f.copying, s, e))
    }

    /// Whether some fetch is copying part of `[s, e)` into the stripe file right now.
    pub(super) fn copying_overlaps(&self, s: u64, e: u64) -> bool {
        self.fetches.iter().any(|f| overlaps(&f.copying, s, e))
    }

    pub(super) fn writing_overlaps(&self, s: u64, e: u64) -> bool {
        self.writes.iter().any(|&(_, a, b)| a < e && s < b)
    }

    pub(super) fn fetch_mut(&mut self, id: u64) -> Option<&mut Fetch> {
        self.fetches.iter_mut().find(|f| f.id == id)
    }

    /// Nothing runs on it: no fetch, write, flush, reader or eviction.
    pub(super) fn idle(&self) -> bool {
        self.fetches.is_empty()
            && self.writes.is_empty()
            && self.touched.is_none()
            && self.pins == 0
            && !self.evicting
    }

    /// Its file may be deleted: idle, and nothing in it that the PFS lacks.
    pub(super) fn evictable(&self) -> bool {
        self.idle() && self.dirty.is_empty()
    }
}

/// One inode's stripes and write-behind state.
#[derive(Default)]
pub(super) struct Inode {
    pub stripes: BTreeMap<u64, Stripe>,
    /// When it went from clean to dirty (its age for write-behind).
    pub dirty_since: Option<Instant>,
    /// Its dirty ranges came from the log at open: written before a restart, due at once.
    pub recovered: bool,
    /// The last failed flush: when, and how many failed in a row (the backoff).
    pub retry: Option<(Instant, u32)>,
    /// The sequence of its last log record (`sync` waits for the log up to it).
    pub last_seq: u64,
    /// A flush, truncate or delete of the inode runs: one at a time, so that a flush
    /// never writes to the PFS bytes that a truncate has cut meanwhile.
    pub owned: bool,
    /// A truncate, delete or drop runs: no read or write starts on the inode meanwhile.
    pub blocked: bool,
    /// The PFS file's version after this server's last write-behind of it.
    pub flushed: Option<PfsVersion>,
    /// The wall-clock time of its last write absorbed here: the mtime its write-behind
    /// leaves on the PFS file (mtime.rs), not the time of the write-behind itself.
    pub wrote_at: Option<Timespec>,
    /// Times set explicitly on the file while it was dirty here (`CacheTimesReq`): its
    /// write-behinds leave them on the PFS file (mtime.rs). Gone when it is clean.
    pub times: Option<LogTimes>,
    /// Counts the times set here: a write-behind that left older ones looks again.
    pub times_gen: u64,
    /// When its last write was absorbed here (a random writer is written behind once
    /// it pauses, flush.rs).
    pub last_write: Option<Instant>,
    /// An fsync came after its last write: a random writer's burst is over.
    pub synced_after_write: bool,
    /// Stream writes going straight to the PFS file now (stream.rs).
    pub bypassing: u32,
    /// Its writes made a stream here (stream.rs): its flushes join no gaps (the bytes
    /// between two dirty ranges may be on their way to the PFS file).
    pub streamed: bool,
    /// A flush that joins gaps runs: no write bypasses the cache meanwhile.
    pub joining: bool,
}

/// A file with this many dirty ranges here is written behind as soon as its writer
/// pauses (`QUIET`, or an fsync after its last write): a PFS counts operations as well
/// as bytes, and a random writer's backlog in operations grows long before its bytes
/// reach the threshold or its age the maximum. Not while it writes: a write-behind
/// under a random writer takes the disk and CPU the writer is absorbed with (on one
/// machine the application ran at half its speed), and writes fewer, larger merged
/// ranges once the writer has paused.
pub(super) const MANY_RANGES: usize = 1024;

impl Inode {
    /// Whether its writer is a random writer whose backlog is written behind once it
    /// pauses (`MANY_RANGES`, flush.rs).
    pub(super) fn many_ranges(&self) -> bool {
        let ranges: usize = self.stripes.values().map(|s| s.dirty.iter().count()).sum();
        ranges >= MANY_RANGES
    }

    pub(super) fn dirty_bytes(&self) -> u64 {
        self.stripes.values().map(|s| s.dirty.bytes()).sum()
    }

    pub(super) fn is_dirty(&self) -> bool {
        self.stripes.values().any(|s| !s.dirty.is_empty())
    }

    /// Nothing worth keeping: no stripe known, nothing running or owed.
    pub(super) fn forgettable(&self) -> bool {
        self.stripes.is_empty()
            && !self.owned
            && !self.blocked
            && self.retry.is_none()
            && self.bypassing == 0
    }
}

#[derive(Default)]
pub(super) struct State {
    pub inodes: HashMap<InodeNo, Inode>,
    /// Sequential writers, per inode (stream.rs).
    pub streams: HashMap<InodeNo, Stream>,
    next_id: u64,
    clock: u64,
}

impl State {
    /// A fresh id for a fetch or a write.
    pub(super) fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The next tick of the use clock (a counter: only the order matters).
    pub(super) fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    pub(super) fn stripe_mut(&mut self, ino: InodeNo, stripe: u64) -> &mut Stripe {
        self.inodes
            .entry(ino)
            .or_default()
            .stripes
            .entry(stripe)
            .or_default()
    }

    /// Drop the inode's entry if it holds nothing.
    pub(super) fn tidy(&mut self, ino: InodeNo) {
        if self.inodes.get(&ino).is_some_and(Inode::forgettable) {
            self.inodes.remove(&ino);
        }
    }
}

/// Whether `set` has a byte in `[s, e)`.
pub(super) fn overlaps(set: &RangeSet, s: u64, e: u64) -> bool {
    set.iter().take_while(|&(a, _)| a < e).any(|(_, b)| b > s)
}

/// Whether `set` holds every byte of `[s, e)` (the set is merged: one range must).
pub(super) fn covers(set: &RangeSet, s: u64, e: u64) -> bool {
    s >= e || set.iter().take_while(|&(a, _)| a <= s).any(|(_, b)| b >= e)
}

/// `[s, e)` without the bytes of any of `sets`.
pub(super) fn minus(s: u64, e: u64, sets: &[&RangeSet]) -> RangeSet {
    let mut r = RangeSet::default();
    r.add(s, e);
    for set in sets {
        for (a, b) in clip(set, s, e) {
            r.remove(a, b);
        }
    }
    r
}

/// The ranges of `set` within `[s, e)`.
pub(super) fn clip(set: &RangeSet, s: u64, e: u64) -> Vec<(u64, u64)> {
    set.iter()
        .take_while(|&(a, _)| a < e)
        .filter(|&(_, b)| b > s)
        .map(|(a, b)| (a.max(s), b.min(e)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(r: &[(u64, u64)]) -> RangeSet {
        let mut s = RangeSet::default();
        for &(a, b) in r {
            s.add(a, b);
        }
        s
    }

    #[test]
    fn range_helpers() {
        let s = set(&[(10, 20), (30, 40)]);
        assert!(overlaps(&s, 15, 16) && overlaps(&s, 0, 11) && overlaps(&s, 39, 100));
        assert!(!overlaps(&s, 20, 30) && !overlaps(&s, 0, 10) && !overlaps(&s, 40, 50));
        assert!(covers(&s, 10, 20) && covers(&s, 31, 35) && covers(&s, 50, 50));
        assert!(!covers(&s, 10, 31) && !covers(&s, 5, 12) && !covers(&s, 20, 21));
        let m = minus(0, 50, &[&s, &set(&[(0, 5)])]);
        assert_eq!(
            m.iter().collect::<Vec<_>>(),
            vec![(5, 10), (20, 30), (40, 50)]
        );
        assert_eq!(clip(&s, 15, 35), vec![(15, 20), (30, 35)]);
    }
}

/// A run of sequential writes this long (here) makes a stream: its next writes are
/// bypassed. The same length rings early write-behind for an absorbed run (flush.rs).
pub(super) const STREAM_RUN: u64 = 1 << 20;

/// One inode's sequential writer here (stream.rs, which keeps its run).
#[derive(Default)]
pub(crate) struct Stream {
    /// The stripe of the run's last write, and where its bytes end there.
    pub(super) stripe: u64,
    pub(super) end: u64,
    /// Bytes in the run.
    pub(super) run: u64,
    /// A bypass of this run failed: the run's writes are absorbed.
    pub(super) off: bool,
    /// A bypass wrote since the last fdatasync of the PFS file.
    pub(super) unsynced: bool,
}
