//! A client's write into a cached stripe. The bytes go through the data path
//! (`DataStore::write_charged`); this brackets it:
//!
//! * `begin_write` before: waits for a fetch copying into the range, and takes the
//!   range back from any fetch that has claimed it and not started on it, so no fetch
//!   ever overwrites the write; a flush running on the stripe learns the range is
//!   touched, so it leaves it dirty.
//! * `WriteGuard::finish` after, with the write's outcome: the bytes written are
//!   present and dirty, with a `Dirty` record appended to the log (into the page cache:
//!   it survives a kill -9 of the server, and reaches the device at `sync`, with the
//!   stripe bytes, which is when a scratch or cache instance promises durability).

use super::state::minus;
use super::CacheStripes;
use crate::cache::wblog::Kind;
use crate::error::{StoreError, StoreResult};
use spillway_types::{InodeNo, Timespec};
use std::time::Instant;

/// A write in progress on `[start, end)` of a stripe. Dropped without `finish`, the
/// write counts as failed.
pub(crate) struct WriteGuard<'a> {
    c: &'a CacheStripes,
    ino: InodeNo,
    stripe: u64,
    id: u64,
    start: u64,
    end: u64,
    done: bool,
}

impl CacheStripes {
    /// A client is about to write `len` bytes at `offset` of a stripe.
    pub(crate) fn begin_write(
        &self,
        ino: InodeNo,
        stripe: u64,
        offset: u32,
        len: u32,
    ) -> WriteGuard<'_> {
        let (s, e) = (u64::from(offset), u64::from(offset) + u64::from(len));
        let mut st = self.state();
        loop {
            let blocked = st.inodes.get(&ino).is_some_and(|i| i.blocked);
            let k = st.stripe_mut(ino, stripe);
            if !blocked && !k.evicting && !k.copying_overlaps(s, e) {
                break;
            }
            st = self.wait(st);
        }
        let (id, now) = (st.next_id(), st.tick());
        let k = st.stripe_mut(ino, stripe);
        let mut took = false;
        for f in &mut k.fetches {
            if super::state::overlaps(&f.pending, s, e) {
                f.pending.remove(s, e);
                took = true;
            }
        }
        k.writes.push((id, s, e));
        if let Some(t) = &mut k.touched {
            t.add(s, e);
        }
        k.last_use = now;
        if took {
            // Readers waiting for those bytes now wait for this write instead.
            self.changed.notify_all();
        }
        WriteGuard {
            c: self,
            ino,
            stripe,
            id,
            start: s,
            end: e,
            done: false,
        }
    }

    /// The write `id` on `[s, e)` ended: `written` bytes from `s` were written, or
    /// None when it failed.
    fn end_write(
        &self,
        ino: InodeNo,
        stripe: u64,
        id: u64,
        (s, e): (u64, u64),
        written: Option<u64>,
    ) -> StoreResult<()> {
        let mut st = self.state();
        let Some(inode) = st.inodes.get_mut(&ino) else {
            return Ok(());
        };
        let was_dirty = inode.is_dirty();
        let Some(k) = inode.stripes.get_mut(&stripe) else {
            return Ok(());
        };
        k.writes.retain(|w| w.0 != id);
        let r = match written {
            Some(n) if n > 0 => {
                let end = s + n.min(e - s);
                k.present.add(s, end);
                k.dirty.add(s, end);
                let run = k.dirty.iter().find(|&(a, b)| a <= s && end <= b);
                if run.is_some_and(|(a, b)| b - a >= super::state::STREAM_RUN) {
                    // A stream: written behind from now on (flush.rs, `streamed`).
                    self.kick.ring();
                }
                if !was_dirty {
                    inode.dirty_since = Some(Instant::now());
                }
                inode.wrote_at = Some(Timespec::now());
                // POSIX: a write after times were set moves the mtime again (its
                // `Dirty` record, after their `Times` record, says so in the log).
                if let Some(t) = &mut inode.times {
                    t.void = true;
                }
                inode.last_write = Some(Instant::now());
                inode.synced_after_write = false;
                self.append(&mut inode.last_seq, Kind::Dirty, ino, stripe, (s, end))
                    .map_err(|err| {
                        // The range stays dirty here and is written behind, but a
                        // restart would not know it: the write is answered with an
                        // error.
                        tracing::error!("write-behind log: {err}");
                        StoreError::Io(err)
                    })
            }
            Some(_) => Ok(()),
            None => {
                // A failed write may have changed any of its bytes: those that were
                // clean may no longer be the PFS's, so they are fetched again when
                // read. Dirty ones stay dirty (a failed write's bytes are undefined).
                let gone = minus(s, e, &[&k.dirty]);
                for (a, b) in gone.iter() {
                    k.present.remove(a, b);
                }
                Ok(())
            }
        };
        self.changed.notify_all();
        r
    }
}

impl WriteGuard<'_> {
    /// The write's inode, stripe and range in it.
    pub(super) fn span(&self) -> (InodeNo, u64, u64, u64) {
        (self.ino, self.stripe, self.start, self.end)
    }

    /// The write went straight to the PFS file (stream.rs): it ends without making
    /// anything present or dirty here.
    pub(super) fn bypassed(&mut self) {
        self.done = true;
        let mut st = self.c.state();
        if let Some(k) = st
            .inodes
            .get_mut(&self.ino)
            .and_then(|i| i.stripes.get_mut(&self.stripe))
        {
            k.writes.retain(|w| w.0 != self.id);
        }
        self.c.changed.notify_all();
    }

    /// The write ended with `outcome` (bytes written from its start, or the error).
    /// An error here (the log append failed) should answer the write with EIO.
    pub(crate) fn finish(mut self, outcome: &StoreResult<u32>) -> StoreResult<()> {
        self.done = true;
        let written = outcome.as_ref().ok().map(|&n| u64::from(n));
        self.c.end_write(
            self.ino,
            self.stripe,
            self.id,
            (self.start, self.end),
            written,
        )
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self
                .c
                .end_write(self.ino, self.stripe, self.id, (self.start, self.end), None);
        }
    }
}
