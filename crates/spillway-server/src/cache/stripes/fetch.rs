//! Reads: the bytes asked are made present before the stripe file is read, fetched
//! from the PFS where absent, with read-ahead.
//!
//! A fetch first *claims*, under the state lock, every absent byte of its window that
//! no other fetch or write holds: a second reader of the same bytes waits for it
//! instead of fetching them again. It then copies the claim in pieces; before each
//! piece it takes back what a write took from it meanwhile (`begin_write` removes its
//! range from every claim, and waits only for a piece being copied under it), so a
//! fetch never overwrites a write. What a fetch copied is clean and present.
//!
//! A read is never refused for want of room. A fetch that finds the fragment full
//! makes room (room.rs) for the bytes asked, within the room wait (at most 1 s for a
//! read: `READ_ROOM_WAIT`); read-ahead does
//! not wait for room. When none could be made (the cache full of data the PFS did not
//! take in time, or others took each stripe's worth freed first), the bytes asked and
//! absent are read from the PFS straight into the reply (`ReadGuard::through`), not
//! kept in the cache.

use super::state::{clip, covers, minus, overlaps, Fetch};
use super::CacheStripes;
use crate::cache::ranges::RangeSet;
use crate::cache::PfsFiles;
use crate::data::DataStore;
use crate::error::{fs, StoreError, StoreResult};
use spillway_types::{Errno, InodeNo};
use std::fs::File;

/// A fetch copies at most this much per piece: a write waits for at most one piece,
/// and readers of the first bytes are released before the read-ahead is done.
pub(super) const PIECE: u64 = 4 << 20;

/// The longest a read miss waits for room before it reads through to the PFS.
const READ_ROOM_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Fetch windows start on a page boundary, so the stripe file gets whole pages.
const PAGE: u64 = 4096;

/// The stripe is pinned while this lives: eviction leaves it alone, so the read that
/// follows finds the bytes `prepare_read` made present. Bytes it could not make
/// present for want of room are read from the PFS instead: the reader passes what
/// it read from the stripe file through `through`/`through_vec`.
pub(crate) struct ReadGuard<'a> {
    c: &'a CacheStripes,
    ino: InodeNo,
    stripe: u64,
    from_pfs: Option<FromPfs>,
}

/// Absent bytes of a read to take from the PFS file itself.
struct FromPfs {
    file: File,
    /// The PFS offset of the stripe's first byte.
    base: u64,
    /// The read's first byte in the stripe.
    start: u64,
    /// Stripe-relative ranges inside the read and before the PFS file's end.
    ranges: Vec<(u64, u64)>,
}

impl ReadGuard<'_> {
    /// `into` holds `got` bytes read from the stripe file at the read's offset: lay
    /// the bytes read through from the PFS over it. The bytes now valid (what the
    /// stripe file gave, or further where the PFS gave more; the gap between is a
    /// hole, zeros).
    pub(crate) fn through(&self, into: &mut [u8], got: usize) -> StoreResult<usize> {
        let Some(t) = &self.from_pfs else {
            return Ok(got);
        };
        let mut valid = got.min(into.len());
        for &(a, b) in &t.ranges {
            let (i, j) = ((a - t.start) as usize, (b - t.start) as usize);
            if j > into.len() {
                return Err(fs(Errno::EINVAL));
            }
            if i > valid {
                into[valid..i].fill(0);
            }
            let n = pread_full(&t.file, &mut into[i..j], t.base + a)?;
            valid = valid.max(i + n);
            if n < j - i {
                // The PFS file ended early (it shrank): nothing past it.
                break;
            }
        }
        Ok(valid)
    }

    /// `through` for a read whose bytes came back as a vector.
    pub(crate) fn through_vec(&self, buf: &mut Vec<u8>) -> StoreResult<()> {
        let Some(t) = &self.from_pfs else {
            return Ok(());
        };
        let Some(&(_, last)) = t.ranges.last() else {
            return Ok(());
        };
        let got = buf.len();
        buf.resize(got.max((last - t.start) as usize), 0);
        let valid = self.through(buf, got)?;
        buf.truncate(valid);
        Ok(())
    }
}

/// Read until `buf` is full or the file ends: the bytes read.
fn pread_full(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        let mut st = self.c.state();
        let k = st
            .inodes
            .get_mut(&self.ino)
            .and_then(|i| i.stripes.get_mut(&self.stripe));
        if let Some(k) = k {
            k.pins = k.pins.saturating_sub(1);
            if k.pins == 0 {
                self.c.changed.notify_all();
            }
        }
    }
}

/// What a look at the state decided.
enum Next {
    /// Everything asked is present (or all that can be): read.
    Read,
    /// The stripe size is needed to claim a window.
    AskSize,
    /// Claimed: fetch these ranges (fetch id, ranges).
    Fetch(u64, RangeSet),
}

impl CacheStripes {
    /// Make `[offset, offset+len)` of a stripe present before the caller reads it from
    /// the stripe file (`DataStore::read`/`read_into`), fetching what is absent from
    /// the PFS with read-ahead; the returned guard keeps the stripe from eviction until
    /// that read is done. Bytes past the PFS file's end are not fetched: they are a hole
    /// in the stripe file, as in the PFS file (or past its end, as there).
    pub(crate) fn prepare_read(
        &self,
        data: &DataStore,
        pfs: &dyn PfsFiles,
        ino: InodeNo,
        stripe: u64,
        offset: u32,
        len: u32,
    ) -> StoreResult<ReadGuard<'_>> {
        let s = u64::from(offset);
        let mut e = s + u64::from(len);
        let mut size = None;
        // Where the PFS file's data in this stripe ended when this reader last fetched.
        let mut eof = None;
        loop {
            match self.next_step(ino, stripe, s, e, size, eof) {
                Next::Read => {
                    return Ok(ReadGuard {
                        c: self,
                        ino,
                        stripe,
                        from_pfs: None,
                    })
                }
                Next::AskSize => {
                    // Outside the lock: the PFS side may ask another server.
                    let ss = u64::from(pfs.stripe_size(ino)?);
                    if ss == 0 {
                        return Err(fs(Errno::EINVAL));
                    }
                    e = e.min(ss);
                    size = Some(ss);
                }
                Next::Fetch(id, want) => {
                    let ss = size.unwrap_or(0);
                    let r = self.fetch(data, pfs, ino, stripe, ss, id, &want, e);
                    self.end_fetch(ino, stripe, id);
                    eof = Some(match r {
                        Err(StoreError::Fs(Errno::ENOSPC)) => {
                            return self.read_through(pfs, ino, stripe, ss, s, e);
                        }
                        r => r?,
                    });
                }
            }
        }
    }

    /// No room could be made for the bytes asked: pin the stripe and read what of
    /// `[s, e)` is absent from the PFS itself (present bytes, dirty ones among them,
    /// still come from the stripe file).
    fn read_through(
        &self,
        pfs: &dyn PfsFiles,
        ino: InodeNo,
        stripe: u64,
        stripe_size: u64,
        s: u64,
        e: u64,
    ) -> StoreResult<ReadGuard<'_>> {
        let absent = {
            let mut st = self.state();
            let now = st.tick();
            let k = st.stripe_mut(ino, stripe);
            k.pins += 1;
            k.last_use = now;
            minus(s, e, &[&k.present])
        };
        // Pinned from here: the guard unpins it, on every path below too.
        let mut guard = ReadGuard {
            c: self,
            ino,
            stripe,
            from_pfs: None,
        };
        let file = pfs.open_read(ino)?;
        let base = stripe.checked_mul(stripe_size).ok_or(fs(Errno::EFBIG))?;
        let eof = file.metadata()?.len().saturating_sub(base).min(stripe_size);
        let ranges = clip(&absent, s, e.min(eof));
        tracing::debug!(
            ino = ino.0,
            stripe,
            bytes = ranges.iter().map(|(a, b)| b - a).sum::<u64>(),
            "read through to the PFS: no room in the cache"
        );
        guard.from_pfs = Some(FromPfs {
            file,
            base,
            start: s,
            ranges,
        });
        Ok(guard)
    }

    /// Under the lock: read (pinning the stripe), wait, or claim a window to fetch.
    /// After a fetch of its own found the PFS file's data ending at `eof` in this
    /// stripe, a reader reads what is absent past it as the stripe file has it (a
    /// hole, or nothing) rather than fetch again; what is absent before it (evicted
    /// meanwhile, for another reader's room) is fetched again, never read as zeros.
    fn next_step(
        &self,
        ino: InodeNo,
        stripe: u64,
        s: u64,
        e: u64,
        size: Option<u64>,
        eof: Option<u64>,
    ) -> Next {
        let mut st = self.state();
        loop {
            let blocked = st.inodes.get(&ino).is_some_and(|i| i.blocked);
            let now = st.tick();
            let k = st.stripe_mut(ino, stripe);
            if blocked || k.evicting {
                st = self.wait(st);
                continue;
            }
            if covers(&k.present, s, e) {
                // The common case, without building a set.
                k.pins += 1;
                k.last_use = now;
                return Next::Read;
            }
            let need = minus(s, e, &[&k.present]);
            let busy = need
                .iter()
                .any(|(a, b)| k.fetch_overlaps(a, b) || k.writing_overlaps(a, b));
            let past_eof = eof.is_some_and(|eof| need.iter().all(|(a, _)| a >= eof));
            if need.is_empty() || (past_eof && !busy) {
                k.pins += 1;
                k.last_use = now;
                return Next::Read;
            }
            if busy {
                st = self.wait(st);
                continue;
            }
            let Some(ss) = size else {
                return Next::AskSize;
            };
            // The window: from the page holding the first byte asked to read-ahead
            // past the last, within the stripe; less what is present or held.
            let end = e.saturating_add(self.read_ahead).min(ss);
            let mut want = minus(s - s % PAGE, end, &[&k.present]);
            for f in &k.fetches {
                for (a, b) in f.pending.iter().chain(f.copying.iter()) {
                    want.remove(a, b);
                }
            }
            for &(_, a, b) in &k.writes {
                want.remove(a, b);
            }
            let id = st.next_id();
            st.stripe_mut(ino, stripe).fetches.push(Fetch {
                id,
                pending: want.clone(),
                copying: RangeSet::default(),
            });
            return Next::Fetch(id, want);
        }
    }

    /// Copy the claimed `want` of a stripe from the PFS, piece by piece.
    #[allow(clippy::too_many_arguments)]
    fn fetch(
        &self,
        data: &DataStore,
        pfs: &dyn PfsFiles,
        ino: InodeNo,
        stripe: u64,
        stripe_size: u64,
        id: u64,
        want: &RangeSet,
        asked_end: u64,
    ) -> StoreResult<u64> {
        let file = pfs.open_read(ino)?;
        let pfs_size = file.metadata()?.len();
        let base = stripe
            .checked_mul(stripe_size)
            .filter(|b| b.checked_add(stripe_size).is_some())
            .ok_or(fs(Errno::EFBIG))?;
        let eof = pfs_size.saturating_sub(base).min(stripe_size);
        {
            // Past the PFS file's end there is nothing to fetch now. Those claimed bytes
            // stay absent, not present: the reader that asked reads them as the stripe
            // file has them (a hole, or nothing), and a later read after the PFS file
            // grew (a reader holding it open sees the new size) fetches them then,
            // rather than reading zeros where the PFS now has data.
            let mut st = self.state();
            let k = st.stripe_mut(ino, stripe);
            if let Some(f) = k.fetch_mut(id) {
                f.pending.remove(eof, u64::MAX);
            }
            self.changed.notify_all();
        }
        let mut at = want.iter().next().map_or(eof, |(a, _)| a);
        while at < eof {
            let piece_end = (at - at % PIECE + PIECE).min(eof);
            if overlaps(want, at, piece_end) {
                let piece = (at, piece_end);
                // Read-ahead (a piece past the bytes asked) does not wait for room.
                let wait = at < asked_end;
                match self.copy_piece(data, pfs, ino, stripe, id, piece, &file, base, wait)? {
                    Copied::All => {}
                    Copied::Stop => return Ok(eof),
                    Copied::Ended(at) => return Ok(at),
                }
            }
            at = piece_end;
        }
        Ok(eof)
    }

    /// Copy what of `[s, e)` the fetch `id` still holds.
    #[allow(clippy::too_many_arguments)]
    fn copy_piece(
        &self,
        data: &DataStore,
        pfs: &dyn PfsFiles,
        ino: InodeNo,
        stripe: u64,
        id: u64,
        (s, e): (u64, u64),
        file: &File,
        base: u64,
        wait: bool,
    ) -> StoreResult<Copied> {
        let ranges = {
            let mut st = self.state();
            if st.inodes.get(&ino).is_some_and(|i| i.blocked) {
                // A truncate or delete waits for this fetch: it gives up the rest.
                return Ok(Copied::Stop);
            }
            let Some(f) = st.stripe_mut(ino, stripe).fetch_mut(id) else {
                return Ok(Copied::Stop);
            };
            let ranges = clip(&f.pending, s, e);
            for &(a, b) in &ranges {
                f.pending.remove(a, b);
                f.copying.add(a, b);
            }
            ranges
        };
        let mut copied = Vec::new();
        let mut outcome = Ok(Copied::All);
        for (a, b) in ranges {
            match self.fill(data, pfs, ino, stripe, (a, b), file, base + a, wait) {
                Ok(n) => {
                    copied.push((a, a + n));
                    if n < b - a {
                        // The PFS file is shorter than its size said: it shrank.
                        outcome = Ok(Copied::Ended(a + n));
                        break;
                    }
                }
                // Read-ahead that found no room is given up, not an error.
                Err(StoreError::Fs(Errno::ENOSPC)) if !wait => {
                    outcome = Ok(Copied::Stop);
                    break;
                }
                Err(err) => {
                    outcome = Err(err);
                    break;
                }
            }
        }
        let mut st = self.state();
        let k = st.stripe_mut(ino, stripe);
        if let Some(f) = k.fetch_mut(id) {
            f.copying = RangeSet::default();
        }
        for (a, b) in copied {
            k.present.add(a, b);
        }
        self.changed.notify_all();
        outcome
    }

    /// One range from the PFS into the stripe file. When the fragment is full and
    /// `wait` is set, room is made (room.rs: clean stripes evicted, dirty ones
    /// written behind) and the copy tried again until it fits or the room wait is
    /// over: concurrent fetches take the room each other made, so one more try is
    /// not enough. ENOSPC at the end (the caller reads through to the PFS).
    #[allow(clippy::too_many_arguments)]
    fn fill(
        &self,
        data: &DataStore,
        pfs: &dyn PfsFiles,
        ino: InodeNo,
        stripe: u64,
        (a, b): (u64, u64),
        file: &File,
        src: u64,
        wait: bool,
    ) -> StoreResult<u64> {
        // Stripe offsets fit in u32 (stripes are at most MAX_STRIPE_SIZE).
        let (Ok(off), Ok(len)) = (u32::try_from(a), u32::try_from(b - a)) else {
            return Err(fs(Errno::EINVAL));
        };
        // Buffered, not O_DIRECT: what is fetched is read at once (the bytes asked) or
        // soon (the read-ahead), best from the page cache.
        // A reader waits for room at most READ_ROOM_WAIT: whoever keeps the fragment
        // full of data the PFS does not take (one user of a shared instance) then
        // slows others' reads by that much, not by the writers' room wait.
        let deadline = std::time::Instant::now() + self.room_wait().min(READ_ROOM_WAIT);
        loop {
            match data.fill_from(ino, stripe, off, len, file, src, false) {
                Err(StoreError::Fs(Errno::ENOSPC))
                    if wait
                        && std::time::Instant::now() < deadline
                        && self.make_room(data, pfs, data.growth(ino, stripe, b), deadline) => {}
                r => return r,
            }
        }
    }

    /// The fetch `id` is over: what it still held is released.
    fn end_fetch(&self, ino: InodeNo, stripe: u64, id: u64) {
        let mut st = self.state();
        if let Some(k) = st
            .inodes
            .get_mut(&ino)
            .and_then(|i| i.stripes.get_mut(&stripe))
        {
            k.fetches.retain(|f| f.id != id);
        }
        self.changed.notify_all();
    }
}

enum Copied {
    All,
    /// Nothing more to copy (a truncate took over, or read-ahead found no room).
    Stop,
    /// The PFS file ended here, before the size it had when the fetch began.
    Ended(u64),
}
