//! The stream bypass (docs/cache.md, "Streams"): once a file is being written
//! sequentially here (a run of `STREAM_RUN` bytes or more), its next writes go straight
//! to the PFS file, in order, instead of into the stripe files: written once, not
//! written to the cache's disk and read back by the write-behind, so the stream moves
//! at the PFS's pace and the cache's disk is left to the writers it pays off for.
//!
//! What keeps it correct:
//!
//! * A bypass write is bracketed like any write (`begin_write` before it, so fetches
//!   never cover it and truncate, delete and drop wait for it); its bytes leave the
//!   stripe's present set, so a read fetches them from the PFS file.
//! * Order: a write whose range holds dirty bytes (an earlier write the PFS has not
//!   got) is not bypassed but absorbed, and so written behind after them; a later write
//!   into a bypassed range is absorbed as usual and written behind over it. While a
//!   flush that joins gaps (bytes between two dirty ranges, from the stripe file or
//!   zeros) runs, no write is bypassed; once a file has been bypassed, its flushes join
//!   no gaps.
//! * The PFS file is opened for each bypass and closed after it (a file held open for
//!   writing would keep the PFS from being remounted read-only, or unmounted).
//! * Durability: the bytes are in the PFS file's page cache when the write is
//!   answered (they survive a kill -9 of the server, as absorbed ones do); `sync` (an
//!   fsync through the mount) fdatasyncs the PFS file when a bypass wrote since its
//!   last sync, so what fsync acknowledges is on the PFS's device; `sync_to_pfs` and
//!   `sync_on_close` flushes do the same.
//! * A bypass that fails (the PFS full, or failing) is not an error: the write is
//!   absorbed by the cache instead and written behind as any other (retried with
//!   backoff), and the stream is not bypassed again until it restarts.
//! * Coherence: each bypass keeps the PFS file's version it left, as a write-behind
//!   does, so the next open knows that change for the cache's own.

use super::state::{overlaps, Stream, STREAM_RUN};
use super::write::WriteGuard;
use super::{CacheStripes, Owned};
use crate::cache::coherence::PfsVersion;
use crate::cache::PfsFiles;
use crate::error::StoreResult;
use spillway_types::{InodeNo, Timespec};
use std::time::Instant;

/// A write starting this close to where the run ended (before or after it) continues
/// the run: a client has several writes of a stream in flight, and they may arrive out
/// of order.
const SLACK: u64 = 8 << 20;

impl Stream {
    /// Count the write `[s, e)` of stripe `k`: whether the run it continues was a
    /// stream before it.
    fn count(&mut self, k: u64, s: u64, e: u64) -> bool {
        let near = |a: u64, b: u64| a.abs_diff(b) <= SLACK;
        let same = self.run > 0 && k == self.stripe && near(s, self.end);
        let next = self.run > 0 && k > self.stripe && s < SLACK;
        if same || next {
            let was = self.run >= STREAM_RUN && !self.off;
            self.end = if same { self.end.max(e) } else { e };
            self.stripe = k;
            self.run = self.run.saturating_add(e - s);
            was
        } else {
            self.stripe = k;
            self.end = e;
            self.run = e - s;
            self.off = false;
            false
        }
    }
}

impl CacheStripes {
    /// Write the bytes of `guard`'s write straight to the PFS file if the inode is
    /// being streamed and nothing asks for the cache: `Some(bytes written)` then (all of
    /// them), `None` when the caller is to write them to the stripe file as usual.
    pub(crate) fn try_bypass(
        &self,
        pfs: &dyn PfsFiles,
        guard: &mut WriteGuard<'_>,
        bytes: &[u8],
    ) -> Option<u32> {
        let (ino, k, s, e) = guard.span();
        let len = u32::try_from(bytes.len()).ok()?;
        if e - s != u64::from(len) || len == 0 {
            return None;
        }
        {
            let mut st = self.state();
            let x = st.streams.entry(ino).or_default();
            let streamed = x.count(k, s, e);
            let is_stream = x.run >= STREAM_RUN && !x.off;
            let i = st.inodes.entry(ino).or_default();
            if is_stream {
                // From now on its flushes join no gaps, so none of them holds the
                // bypass off (a flush that joins gaps would; under a stream the next
                // one would start as soon as it ended, each absorbing what the stream
                // wrote meanwhile).
                i.streamed = true;
            }
            let dirty_here = i.stripes.get(&k).is_some_and(|x| overlaps(&x.dirty, s, e));
            if !streamed || i.joining || i.blocked || dirty_here {
                return None;
            }
            i.bypassing += 1;
            i.streamed = true;
        };
        let r = self.bypass_write(pfs, ino, k, s, bytes);
        let mut st = self.state();
        let stream = st.streams.entry(ino).or_default();
        let version = match r {
            Ok(v) => {
                stream.unsynced = true;
                Some(v)
            }
            Err(err) => {
                tracing::info!(
                    "inode {:#x}: a stream's write could not go to the PFS ({err}); the cache absorbs it",
                    ino.0
                );
                stream.off = true;
                None
            }
        };
        let i = st.inodes.entry(ino).or_default();
        i.bypassing -= 1;
        if version.is_none() {
            self.changed.notify_all();
            return None;
        }
        if let Some(v) = version.flatten() {
            i.flushed = Some(v);
        }
        // A write-behind after this one leaves this time as the file's mtime, not an
        // older write's.
        i.wrote_at = Some(Timespec::now());
        i.last_write = Some(Instant::now());
        if let Some(x) = i.stripes.get_mut(&k) {
            // What the stripe file holds there is older than the PFS's now (but for
            // bytes a concurrent write made dirty meanwhile: those are its).
            for (a, b) in super::state::minus(s, e, &[&x.dirty]).iter() {
                x.present.remove(a, b);
            }
        }
        drop(st);
        guard.bypassed();
        Some(len)
    }

    /// The PFS side of a bypass: the file opened, written at the write's place, and
    /// its version after it.
    fn bypass_write(
        &self,
        pfs: &dyn PfsFiles,
        ino: InodeNo,
        k: u64,
        s: u64,
        bytes: &[u8],
    ) -> StoreResult<Option<PfsVersion>> {
        use crate::error::fs;
        use spillway_types::Errno;
        use std::os::unix::fs::FileExt;
        let ss = u64::from(pfs.stripe_size(ino)?);
        let at = k
            .checked_mul(ss)
            .and_then(|b| b.checked_add(s))
            .filter(|_| ss > 0)
            .ok_or(fs(Errno::EFBIG))?;
        let f = pfs.open_write(ino)?.ok_or(fs(Errno::ENOENT))?;
        f.write_all_at(bytes, at)?;
        start_write_out(&f, at, bytes.len());
        Ok(PfsVersion::of_file(&f).ok())
    }

    /// fdatasync the PFS file of `ino` if a bypass wrote to it since the last one: the
    /// part of `sync` (and of a flush asked for by fsync or close) for bypassed bytes.
    pub(super) fn sync_stream(&self, pfs: &dyn PfsFiles, ino: InodeNo) -> StoreResult<()> {
        {
            let mut st = self.state();
            match st.streams.get_mut(&ino) {
                // Cleared first: a bypass that ends meanwhile sets it again.
                Some(x) if x.unsynced => x.unsynced = false,
                _ => return Ok(()),
            }
        }
        // Gone from the PFS: nothing of it to sync.
        let r = match pfs.open_write(ino) {
            Ok(Some(f)) => f.sync_data().map_err(Into::into),
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        if r.is_err() {
            if let Some(x) = self.state().streams.get_mut(&ino) {
                x.unsynced = true;
            }
        }
        r
    }

    /// The inode's stream ends (truncate, delete, a drop of its copy): a new run
    /// starts from nothing. After a truncate, bypassed bytes not yet synced stay owed
    /// to the next fsync; after a delete or a drop (the PFS file changed from outside)
    /// nothing is.
    pub(super) fn end_stream(&self, ino: InodeNo, _owned: &Owned<'_>, gone: bool) {
        let mut st = self.state();
        match st.streams.get_mut(&ino) {
            Some(x) if x.unsynced && !gone => {
                *x = Stream {
                    unsynced: true,
                    ..Stream::default()
                }
            }
            _ => {
                st.streams.remove(&ino);
            }
        }
    }
}

/// Start the write-out of `[at, at + len)` of the PFS file to its device without waiting
/// for it (`sync_file_range(SYNC_FILE_RANGE_WRITE)`): a stream's bytes head for the PFS
/// as they pass, rather than sitting dirty in the server's page cache until the
/// writer's fsync (or the kernel's dirty expiry) writes them all at once. On a host with
/// much memory a whole stream fits under the dirty limit, and the PFS then starts its
/// work only at the fsync: started now, it runs while the stream is still arriving. It
/// also bounds what a host crash could lose of a stream to what is still in flight. A
/// failure here is no failure of the write (the bytes are written; fsync still syncs
/// them): only logged.
fn start_write_out(f: &std::fs::File, at: u64, len: usize) {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(n)) = (libc::off64_t::try_from(at), libc::off64_t::try_from(len)) else {
        return;
    };
    // SAFETY: a plain system call on a descriptor this function borrows for its duration.
    let r = unsafe { libc::sync_file_range(f.as_raw_fd(), off, n, libc::SYNC_FILE_RANGE_WRITE) };
    if r != 0 {
        tracing::debug!(
            "sync_file_range of a stream's write: {}",
            std::io::Error::last_os_error()
        );
    }
}
