//! Write-behind: dirty ranges written to the PFS.
//!
//! A flush of an inode takes a snapshot of its dirty ranges, writes them to the PFS
//! file (merged and in file order), fdatasyncs it, and only then marks clean, with a
//! `Flushed` record, the ranges no write has touched since the snapshot: a write that
//! lands during the flush may or may not be in what was copied, so its range stays
//! dirty and goes out with the next flush. A failed flush changes nothing but the
//! inode's backoff. A flush keeps the PFS file's version it left (an `fstat` after its
//! `fdatasync`), so that the next open knows that change for its own (coherence.rs).

use super::logfile::COMPACT_MIN;
use super::state::{clip, covers, minus, Inode, STREAM_RUN};
use super::{CacheStripes, Owned};
use crate::cache::coherence::PfsVersion;
use crate::cache::ranges::RangeSet;
use crate::cache::wblog::Kind;
use crate::cache::PfsFiles;
use crate::data::DataStore;
use crate::error::{fs, StoreResult};
use spillway_types::{Errno, InodeNo, Timespec};
use std::time::{Duration, Instant};

/// Dirty ranges closer than this are written as one, with the bytes between them:
/// present ones from the stripe file, or zeros where the PFS file has a hole there
/// (the PFS sees few large writes rather than many small ones: against a PFS that
/// counts operations, absorbed random writes reach it in fewer of them than the
/// application made).
const GAP: u64 = 64 << 10;

/// How long a random writer has not written when its backlog is written behind.
const QUIET: Duration = Duration::from_millis(300);

/// When write-behind starts for an inode (docs/cache.md, "Policies and paths").
#[derive(Clone, Debug)]
pub(crate) struct FlushPolicy {
    /// An inode with more dirty bytes is written behind.
    pub modified_threshold: u64,
    /// An inode dirty for longer is written behind.
    pub max_age: Duration,
    /// After a failed flush the inode waits this long before the next try, doubled at
    /// each failure in a row, up to `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
}

impl Default for FlushPolicy {
    fn default() -> FlushPolicy {
        FlushPolicy {
            modified_threshold: 64 << 20,
            max_age: Duration::from_secs(5),
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
        }
    }
}

/// What one flush wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FlushStats {
    pub bytes: u64,
    /// Positional writes issued to the PFS file (one per merged range).
    pub writes: u64,
    /// Zeros written into holes of the PFS file to join two ranges (in `bytes` too).
    pub filled: u64,
}

/// What one `flush_pass` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FlushReport {
    /// Inodes written behind, and inodes whose flush failed (retried later).
    pub flushed: usize,
    pub failed: usize,
    pub bytes: u64,
    pub writes: u64,
    /// Bytes of clean stripes evicted.
    pub evicted: u64,
    /// The log was compacted.
    pub compacted: bool,
}

/// One stripe's part of a flush: its dirty ranges at the snapshot, and its present
/// ones (the gaps that may be filled).
struct Snap {
    stripe: u64,
    dirty: RangeSet,
    present: RangeSet,
    /// Gaps may be joined (no write bypasses the cache while the flush runs).
    join: bool,
}

impl CacheStripes {
    /// Write every dirty range of `ino` to the PFS and mark clean those no write
    /// touched meanwhile. Waits for a flush, truncate or delete of the inode that runs.
    pub(crate) fn flush_inode(
        &self,
        data: &DataStore,
        pfs: &dyn PfsFiles,
        ino: InodeNo,
    ) -> StoreResult<FlushStats> {
        let owned = self.own(ino);
        let r = self.flush_owned(data, pfs, ino, owned);
        let stats = self.unless_gone(data, ino, r)?;
        // Asked for by fsync or close (or teardown): bypassed bytes too (stream.rs).
        self.sync_stream(pfs, ino)?;
        Ok(stats)
    }

    /// The outcome of a flush whose ownership has ended: a file gone from the PFS
    /// (removed there directly, or a delete this server missed) has its cached data
    /// dropped, as it belongs to no file any more.
    pub(super) fn unless_gone(
        &self,
        data: &DataStore,
        ino: InodeNo,
        r: StoreResult<Option<FlushStats>>,
    ) -> StoreResult<FlushStats> {
        match r? {
            Some(stats) => Ok(stats),
            None => {
                tracing::warn!(
                    "write-behind of inode {:#x}: the file is gone from the PFS; its cached data is dropped",
                    ino.0
                );
                self.delete(data, ino)?;
                Ok(FlushStats::default())
            }
        }
    }

    pub(super) fn flush_owned(
        &self,
        data: &DataStore,
        pfs: &dyn PfsFiles,
        ino: InodeNo,
        _owned: Owned<'_>,
    ) -> StoreResult<Option<FlushStats>> {
        let started = Instant::now();
        let snap = self.snapshot(ino);
        if snap.is_empty() {
            return Ok(Some(FlushStats::default()));
        }
        let r = write_out(data, pfs, ino, &snap, &|f, before| {
            self.leave_times(ino, f, before);
        });
        let ok = matches!(r, Ok(Some(_)));
        let left = match &r {
            Ok(Some((_, v))) => *v,
            _ => None,
        };
        self.complete(ino, &snap, ok, left, started);
        r.map(|o| o.map(|(stats, _)| stats))
    }

    /// After a flush's writes to the PFS file `f` (whose mtime was `before` them): the
    /// times it leaves there (mtime.rs), from the inode's state read after the writes
    /// (a write landing meanwhile only makes `wrote_at` later, and its range stays dirty
    /// for the next flush anyway). Times set explicitly while this ran are left too: the
    /// namespace server sets them on the PFS only after this server has them, so a
    /// time this flush left after that would undo them; it looks again until none came.
    fn leave_times(&self, ino: InodeNo, f: &std::fs::File, before: Option<Timespec>) {
        let mut left = None;
        loop {
            let (wrote, set, generation) = {
                let st = self.state();
                let i = st.inodes.get(&ino);
                (
                    i.and_then(|i| i.wrote_at),
                    i.and_then(|i| i.times),
                    i.map_or(0, |i| i.times_gen),
                )
            };
            if left == Some(generation) {
                return;
            }
            let (atime, mtime) =
                super::mtime::times_to_leave(before, wrote, set.as_ref(), Timespec::now());
            super::mtime::leave_times(f, ino, atime, mtime);
            left = Some(generation);
        }
    }

    /// The inode's dirty stripes, each now watched for writes (`touched`): those in
    /// progress count as touched already.
    fn snapshot(&self, ino: InodeNo) -> Vec<Snap> {
        let mut st = self.state();
        let Some(inode) = st.inodes.get_mut(&ino) else {
            return Vec::new();
        };
        // A streamed file's flush joins no gaps: bypassed bytes may be on their way
        // to them (stream.rs). Otherwise no write bypasses while this flush runs.
        let join = !inode.streamed && inode.bypassing == 0;
        inode.joining = join;
        let mut snap = Vec::new();
        for (&k, s) in inode.stripes.iter_mut() {
            if s.dirty.is_empty() {
                continue;
            }
            let mut touched = RangeSet::default();
            for &(_, a, b) in &s.writes {
                touched.add(a, b);
            }
            s.touched = Some(touched);
            snap.push(Snap {
                stripe: k,
                dirty: s.dirty.clone(),
                present: if join {
                    s.present.clone()
                } else {
                    RangeSet::default()
                },
                join,
            });
        }
        snap
    }

    /// The flush is over: on success, the snapshot's ranges that no write touched are
    /// clean (`Flushed` records), and `left` is the PFS file's version it left; either
    /// way the stripes are no longer watched.
    fn complete(
        &self,
        ino: InodeNo,
        snap: &[Snap],
        ok: bool,
        left: Option<PfsVersion>,
        started: Instant,
    ) {
        let mut st = self.state();
        let Some(inode) = st.inodes.get_mut(&ino) else {
            return;
        };
        inode.joining = false;
        for sn in snap {
            let Some(k) = inode.stripes.get_mut(&sn.stripe) else {
                continue;
            };
            let touched = k.touched.take().unwrap_or_default();
            if !ok {
                continue;
            }
            for (s, e) in sn.dirty.iter() {
                for (a, b) in minus(s, e, &[&touched]).iter() {
                    for r in clip(&k.dirty, a, b) {
                        let rec =
                            self.append(&mut inode.last_seq, Kind::Flushed, ino, sn.stripe, r);
                        if let Err(err) = rec {
                            // The range is on the PFS; the log still says dirty, which
                            // costs one more write of it after a restart.
                            tracing::warn!("write-behind log: {err}");
                        }
                        k.dirty.remove(r.0, r.1);
                    }
                }
            }
        }
        if ok {
            if left.is_some() {
                inode.flushed = left;
            }
            inode.retry = None;
            inode.recovered = false;
            // Left on the PFS file by this flush, and no write here since: done.
            if !inode.is_dirty() {
                inode.times = None;
            }
            // What is still dirty was written after `started`.
            inode.dirty_since = inode.is_dirty().then_some(started);
        } else {
            let failures = inode.retry.map_or(0, |r| r.1);
            inode.retry = Some((Instant::now(), failures.saturating_add(1)));
        }
        self.changed.notify_all();
    }

    /// The background pass (every second or so): write behind the inodes that are due
    /// (more dirty bytes than the threshold, dirty for longer than the maximum age,
    /// recovered at open, or all of them when dirty bytes exceed 75% of the capacity),
    /// except those waiting out a failure's backoff; evict clean stripes when the
    /// fragment is over 90% full; compact the log when it has grown well past its live
    /// records.
    pub(crate) fn flush_pass(
        &self,
        data: &DataStore,
        pfs: &dyn PfsFiles,
        policy: &FlushPolicy,
    ) -> FlushReport {
        if self.log().broken {
            // Before anything appends to it (or refuses to).
            self.repair_log();
        }
        let now = Instant::now();
        let capacity = data.capacity();
        let mut due = {
            let st = self.state();
            let total: u64 = st.inodes.values().map(Inode::dirty_bytes).sum();
            let pressed = total > capacity - capacity / 4;
            let mut due = Vec::new();
            for (&ino, i) in &st.inodes {
                let bytes = i.dirty_bytes();
                if bytes == 0 || i.owned || waiting(i, policy, now) {
                    continue;
                }
                let old = i.recovered
                    || i.dirty_since
                        .is_some_and(|t| now.duration_since(t) >= policy.max_age);
                let paused = i.synced_after_write
                    || i.last_write.is_some_and(|t| now.duration_since(t) >= QUIET);
                let busy = streamed(i) || (i.many_ranges() && paused);
                if pressed || old || bytes > policy.modified_threshold || busy {
                    // Recovered first, then oldest first.
                    due.push((!i.recovered, i.dirty_since, ino));
                }
            }
            due
        };
        due.sort_unstable();
        let mut report = FlushReport::default();
        for (_, _, ino) in due {
            // One flushed by someone else meanwhile is theirs.
            let Some(owned) = self.try_own(ino) else {
                continue;
            };
            let r = self.flush_owned(data, pfs, ino, owned);
            match self.unless_gone(data, ino, r) {
                Ok(s) => {
                    report.flushed += usize::from(s.writes > 0);
                    report.bytes += s.bytes;
                    report.writes += s.writes;
                }
                Err(e) => {
                    report.failed += 1;
                    tracing::warn!("write-behind of inode {:#x}: {e} (retried later)", ino.0);
                }
            }
        }
        let used = data.used();
        if used > capacity - capacity / 10 {
            // Down to 85% used, so eviction does not run again at the next pass.
            // `evict` counts space promised to connections as taken, and it is not
            // used: it comes off what is wanted free.
            let promised = capacity.saturating_sub(used).saturating_sub(data.room());
            report.evicted = self.evict(data, (capacity / 20 * 3).saturating_sub(promised));
        }
        report.compacted = self.compact_if_due(COMPACT_MIN);
        report
    }

    /// Flush every dirty inode (teardown), failures' backoff notwithstanding: an error
    /// if any range remains dirty.
    pub(crate) fn flush_all(&self, data: &DataStore, pfs: &dyn PfsFiles) -> StoreResult<()> {
        let mut first = None;
        for ino in self.dirty_inodes() {
            if let Err(e) = self.flush_inode(data, pfs, ino) {
                tracing::warn!("write-behind of inode {:#x}: {e}", ino.0);
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(e),
            // Written meanwhile.
            None if self.dirty_bytes() > 0 => Err(fs(Errno::EBUSY)),
            None => Ok(()),
        }
    }
}

/// Whether the inode is being streamed (`STREAM_RUN`).
pub(super) fn streamed(i: &Inode) -> bool {
    i.stripes
        .values()
        .any(|s| s.dirty.iter().any(|(a, b)| b - a >= STREAM_RUN))
}

/// Whether the inode is waiting out the backoff of a failed flush.
pub(super) fn waiting(i: &Inode, policy: &FlushPolicy, now: Instant) -> bool {
    let Some((at, failures)) = i.retry else {
        return false;
    };
    let factor = 1u32
        .checked_shl(failures.saturating_sub(1))
        .unwrap_or(u32::MAX);
    let wait = policy
        .retry_min
        .saturating_mul(factor)
        .min(policy.retry_max);
    at.checked_add(wait).is_some_and(|t| now < t)
}

/// Write the snapshot's dirty ranges to the PFS file, have `times` leave its times
/// (given the file and its mtime before the writes: mtime.rs), and fdatasync it; with
/// what was written, the file's version after it (None if it could not be stat'ed).
fn write_out(
    data: &DataStore,
    pfs: &dyn PfsFiles,
    ino: InodeNo,
    snap: &[Snap],
    times: &dyn Fn(&std::fs::File, Option<Timespec>),
) -> StoreResult<Option<(FlushStats, Option<PfsVersion>)>> {
    let ss = u64::from(pfs.stripe_size(ino)?);
    if ss == 0 {
        return Err(fs(Errno::EINVAL));
    }
    let Some(f) = pfs.open_write(ino)? else {
        return Ok(None);
    };
    let before = super::mtime::mtime_of(&f);
    let mut stats = FlushStats::default();
    // Where the previous write ended, in the PFS file, if it was in the same stripe.
    let mut last: Option<(u64, u64)> = None;
    let join = snap.iter().all(|s| s.join);
    for (k, s, e) in plan(snap) {
        let at = k
            .checked_mul(ss)
            .and_then(|b| b.checked_add(s))
            .ok_or(fs(Errno::EFBIG))?;
        let joined = match last {
            Some((lk, end))
                if join
                    && lk == k
                    && at.checked_sub(end).is_some_and(|g| g < GAP)
                    && pfs_hole(&f, end, at) =>
            {
                write_zeros(&f, end, at - end)?;
                stats.filled += at - end;
                stats.bytes += at - end;
                true
            }
            _ => false,
        };
        let n = data.copy_out(ino, k, s, e - s, &f, at)?;
        last = (n == e - s).then_some((k, at + n));
        if n < e - s {
            // Only a stripe file cut without this module knowing (a truncate that did
            // not go through `truncate`) ends before a dirty range: its bytes are gone.
            tracing::warn!(
                "write-behind of inode {:#x}: stripe {k} ends at {}, before its dirty range's end {e}",
                ino.0,
                s + n
            );
        }
        stats.writes += u64::from(!joined);
        stats.bytes += n;
    }
    times(&f, before);
    f.sync_data()?;
    Ok(Some((stats, PfsVersion::of_file(&f).ok())))
}

/// Whether the PFS file `f` holds no data in `[from, to)` (a hole, or past its end):
/// zeros written there change no byte a reader sees. When in doubt, no.
fn pfs_hole(f: &std::fs::File, from: u64, to: u64) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(off) = libc::off_t::try_from(from) else {
        return false;
    };
    // SAFETY: lseek on an open descriptor; no memory is passed.
    let data = unsafe { libc::lseek(f.as_raw_fd(), off, libc::SEEK_DATA) };
    if data < 0 {
        // ENXIO: no data at or after `from`.
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
    }
    u64::try_from(data).is_ok_and(|d| d >= to)
}

/// `len` (at most `GAP`) zero bytes at `at` of `f`.
fn write_zeros(f: &std::fs::File, at: u64, len: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    static ZEROS: [u8; GAP as usize] = [0; GAP as usize];
    let n = usize::try_from(len).map_or(ZEROS.len(), |n| n.min(ZEROS.len()));
    f.write_all_at(&ZEROS[..n], at)
}

/// The writes of a flush, in file order (stripe, then offset): each stripe's dirty
/// ranges, those closer than `GAP` joined with the bytes between them when those are
/// present (clean or dirty bytes the stripe file holds, the same as the PFS's or newer).
fn plan(snap: &[Snap]) -> Vec<(u64, u64, u64)> {
    let mut sorted: Vec<&Snap> = snap.iter().collect();
    sorted.sort_unstable_by_key(|s| s.stripe);
    let mut out = Vec::new();
    for sn in sorted {
        let mut cur: Option<(u64, u64)> = None;
        for (s, e) in sn.dirty.iter() {
            cur = match cur {
                Some((a, b)) if sn.join && s - b < GAP && covers(&sn.present, b, s) => Some((a, e)),
                Some(run) => {
                    out.push((sn.stripe, run.0, run.1));
                    Some((s, e))
                }
                None => Some((s, e)),
            };
        }
        if let Some((a, b)) = cur {
            out.push((sn.stripe, a, b));
        }
    }
    out
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
    fn plan_joins_near_present_gaps_only() {
        let snap = [
            Snap {
                stripe: 3,
                dirty: set(&[(0, 10), (100, 200)]),
                present: set(&[]),
                join: true,
            },
            Snap {
                stripe: 1,
                dirty: set(&[
                    (0, 10),
                    (100, 200),
                    (GAP + 300, GAP + 400),
                    (GAP + 500, GAP + 600),
                ]),
                present: set(&[(0, 200), (GAP + 300, GAP + 600)]),
                join: true,
            },
        ];
        assert_eq!(
            plan(&snap),
            vec![
                (1, 0, 200),
                (1, GAP + 300, GAP + 600),
                (3, 0, 10),
                (3, 100, 200)
            ]
        );
    }
}
