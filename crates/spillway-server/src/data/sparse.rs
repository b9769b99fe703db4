//! Sparse files on this server's stripes: fallocate (allocate, punch, zero) of a file
//! range and SEEK_DATA/SEEK_HOLE over the stripes. What the stripes occupy on disk is
//! tracked by allocs.rs.
//!
//! Capacity: the fragment counts stripe lengths (index.rs). An allocating fallocate
//! reserves the growth of each stripe it extends, exactly as a write does, so
//! preallocated space is counted. A punch frees what it can free under that rule: a
//! stripe punched whole is deleted and a stripe punched to its end is shortened, so
//! both give their space back; a hole punched inside a stripe frees the disk blocks
//! (`st_blocks` drops) but the stripe's length, and so its charge, stays: counting
//! allocated blocks instead would need every write into a hole to be charged too.

use super::DataStore;
use crate::error::{fs, StoreResult};
use spillway_placement::Layout;
use spillway_stubs::sparse::server_pieces;
use spillway_types::{Errno, InodeNo, ServerIndex};
use spillway_wire::messages::falloc_mode;
use std::fs::File;
use std::os::fd::AsRawFd;

/// fallocate(2) on one stripe file.
fn fallocate(f: &File, mode: libc::c_int, offset: u64, len: u64) -> std::io::Result<()> {
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(std::io::Error::from_raw_os_error(libc::EFBIG));
    };
    loop {
        // SAFETY: the descriptor is open for the duration of the call.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off, n) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// lseek(2) with SEEK_DATA or SEEK_HOLE on one stripe file; `None` for ENXIO (no data
/// at or after `offset`, or `offset` at or past the end).
fn seek(f: &File, offset: u64, whence: libc::c_int) -> std::io::Result<Option<u64>> {
    let Ok(off) = libc::off_t::try_from(offset) else {
        return Ok(None);
    };
    // SAFETY: the descriptor is open; lseek only moves its offset, which no other
    // operation here uses (all I/O is positional).
    let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENXIO) => Ok(None),
        _ => Err(e),
    }
}

/// What a sparse operation works on: the byte range `[offset, offset+len)` of file
/// `ino`, on the stripes that server `me` holds under `layout`.
#[derive(Clone, Copy)]
pub(crate) struct Span<'a> {
    pub ino: InodeNo,
    pub layout: &'a Layout,
    pub me: ServerIndex,
    pub offset: u64,
    pub len: u64,
}

impl Span<'_> {
    /// The pieces of the range on `me`'s stripes: (stripe, offset in it, length).
    fn pieces(&self) -> impl Iterator<Item = (u64, u32, u32)> + '_ {
        server_pieces(self.layout, self.me, self.offset, self.len)
    }
}

impl DataStore {
    /// fallocate the span on the stripes this server holds. `check`: only say whether
    /// the space needed here is free.
    pub(crate) fn fallocate(&self, span: &Span<'_>, mode: u8, check: bool) -> StoreResult<()> {
        if span.len == 0 {
            return Err(fs(Errno::EINVAL));
        }
        if span
            .offset
            .checked_add(span.len)
            .is_none_or(|e| e > i64::MAX as u64)
        {
            return Err(fs(Errno::EFBIG));
        }
        match mode {
            falloc_mode::PUNCH if check => Ok(()),
            falloc_mode::PUNCH => self.punch(span),
            falloc_mode::ALLOCATE | falloc_mode::ZERO => {
                self.check_room(span)?;
                if check {
                    return Ok(());
                }
                self.allocate(span, mode == falloc_mode::ZERO)
            }
            _ => Err(fs(Errno::EINVAL)),
        }
    }

    /// ENOSPC unless the stripes' growth fits in the free capacity (stops counting as
    /// soon as it does not: a 1 TiB request is refused without walking 1 TiB).
    fn check_room(&self, span: &Span<'_>) -> StoreResult<()> {
        let map = self.map();
        // What is neither stored nor promised to a connection (grants, index.rs).
        let free = map.unpromised(self.capacity);
        let mut growth = 0u64;
        for (k, within, n) in span.pieces() {
            let end = u64::from(within) + u64::from(n);
            growth += end.saturating_sub(map.len(span.ino, k).unwrap_or(0));
            if growth > free {
                return Err(fs(Errno::ENOSPC));
            }
        }
        Ok(())
    }

    fn allocate(&self, span: &Span<'_>, zero: bool) -> StoreResult<()> {
        let ino = span.ino;
        let _g = self.lock_of(ino).read().unwrap_or_else(|e| e.into_inner());
        let result = (|| {
            for (k, within, n) in span.pieces() {
                let (within, n) = (u64::from(within), u64::from(n));
                self.map()
                    .reserve(ino, k, within + n, self.capacity)
                    .map_err(|_| fs(Errno::ENOSPC))?;
                let done = self.file(ino, k, true).and_then(|f| {
                    if !zero {
                        return fallocate(&f, 0, within, n);
                    }
                    // Stripe files are not KEEP_SIZE: their length is what capacity counts.
                    match fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, within, n) {
                        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                            // tmpfs and others: punch (zeros), then allocate.
                            let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                            fallocate(&f, punch, within, n)?;
                            fallocate(&f, 0, within, n)
                        }
                        r => r,
                    }
                });
                if let Err(e) = done {
                    // The reservation may overstate the stripe: take the file's length.
                    self.resync(ino, k);
                    return Err(e.into());
                }
                self.map().mark_dirty(ino, k);
            }
            Ok(())
        })();
        self.allocs.mark(ino);
        result
    }

    /// Deallocate the span on the stripes stored here: whole stripes are deleted,
    /// stripes punched to their end shortened (both free capacity), holes inside a
    /// stripe punched in its file.
    fn punch(&self, span: &Span<'_>) -> StoreResult<()> {
        let (ino, offset) = (span.ino, span.offset);
        let ss = u64::from(span.layout.stripe_size);
        let end = offset + span.len;
        let _g = self.lock_of(ino).write().unwrap_or_else(|e| e.into_inner());
        let stored = self.map().stripes(ino);
        let result = (|| {
            for (k, stored_len) in stored {
                let Some(s0) = k.checked_mul(ss) else {
                    continue;
                };
                let from = offset.max(s0) - s0;
                let to = end.min(s0.saturating_add(ss)).saturating_sub(s0);
                if from >= to || from >= stored_len {
                    continue;
                }
                if to >= stored_len {
                    if from == 0 {
                        self.delete_stripe(ino, k)?;
                    } else {
                        self.file(ino, k, false)?.set_len(from)?;
                        self.map().set(ino, k, from);
                        self.map().mark_dirty(ino, k);
                    }
                } else {
                    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                    fallocate(&*self.file(ino, k, false)?, punch, from, to - from)?;
                    self.map().mark_dirty(ino, k);
                }
            }
            Ok(())
        })();
        self.allocs.mark(ino);
        result
    }

    /// SEEK_DATA (`hole` false) or SEEK_HOLE over this server's stripes of the file:
    /// the first such offset in the span. A stripe of this server that is not stored,
    /// or the part of a stripe past its stored length, is a hole.
    pub(crate) fn seek(&self, span: &Span<'_>, hole: bool) -> StoreResult<Option<u64>> {
        if span.len == 0 {
            return Ok(None);
        }
        let (ino, offset) = (span.ino, span.offset);
        let end = offset.saturating_add(span.len);
        let ss = u64::from(span.layout.stripe_size);
        let _g = self.lock_of(ino).read().unwrap_or_else(|e| e.into_inner());
        let found = if hole {
            self.seek_hole(span)?
        } else {
            let stored: Vec<(u64, u64)> = self
                .map()
                .stripes(ino)
                .into_iter()
                .filter(|&(k, len)| {
                    let s0 = k.saturating_mul(ss);
                    s0 < end && s0.saturating_add(len) > offset
                })
                .collect();
            let mut found = None;
            for (k, _) in stored {
                let s0 = k * ss;
                let f = match self.file(ino, k, false) {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e.into()),
                };
                if let Some(p) = seek(&f, offset.saturating_sub(s0), libc::SEEK_DATA)? {
                    found = Some(s0 + p);
                    break;
                }
            }
            found
        };
        Ok(found.filter(|&p| p < end))
    }

    fn seek_hole(&self, span: &Span<'_>) -> StoreResult<Option<u64>> {
        let (ino, ss) = (span.ino, u64::from(span.layout.stripe_size));
        // Stops at the first stripe of ours that is missing or has a hole: the walk is
        // bounded by the stripes stored here.
        for (k, within, _) in span.pieces() {
            let at = k * ss + u64::from(within);
            let Some(len) = self.map().len(ino, k) else {
                return Ok(Some(at));
            };
            if u64::from(within) >= len {
                return Ok(Some(at));
            }
            let f = match self.file(ino, k, false) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Some(at)),
                Err(e) => return Err(e.into()),
            };
            match seek(&f, u64::from(within), libc::SEEK_HOLE)? {
                Some(p) if p < ss => return Ok(Some(k * ss + p)),
                Some(_) => {}
                None => return Ok(Some(at)),
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(capacity: u64) -> (tempfile::TempDir, DataStore) {
        let dir = tempfile::tempdir().unwrap();
        let d = DataStore::open(dir.path(), capacity, 16).unwrap();
        (dir, d)
    }

    const SS: u32 = 65536;

    fn layout() -> Layout {
        Layout::of(InodeNo(7), SS, 1, 1)
    }

    /// `[offset, offset+len)` of inode 7 on server 0.
    fn span(layout: &Layout, offset: u64, len: u64) -> Span<'_> {
        Span {
            ino: InodeNo(7),
            layout,
            me: ServerIndex(0),
            offset,
            len,
        }
    }

    #[test]
    fn allocate_counts_against_capacity_and_refuses_with_nothing_done() {
        let (_d, s) = store(4 * u64::from(SS));
        let (l, ino) = (layout(), InodeNo(7));
        let ss = u64::from(SS);
        assert_eq!(
            s.fallocate(&span(&l, 0, 5 * ss), falloc_mode::ALLOCATE, true)
                .unwrap_err()
                .errno(),
            Errno::ENOSPC
        );
        assert_eq!(
            s.fallocate(&span(&l, 0, 5 * ss), falloc_mode::ALLOCATE, false)
                .unwrap_err()
                .errno(),
            Errno::ENOSPC
        );
        assert_eq!(s.used(), 0, "a refused fallocate allocates nothing");
        s.fallocate(&span(&l, ss / 2, 2 * ss), falloc_mode::ALLOCATE, false)
            .unwrap();
        assert_eq!(s.used(), ss + ss / 2 + ss);
        let marks = s.take_alloc_changes();
        assert_eq!(marks, vec![(ino, super::super::allocs::Changed::All)]);
        assert!(s.allocated(ino, &marks[0].1) >= 2 * ss);
        // Punching stripes 1 and 2 (all that is stored of it) deletes them.
        s.fallocate(&span(&l, ss, ss + ss / 2), falloc_mode::PUNCH, false)
            .unwrap();
        assert_eq!(s.used(), ss, "stripe 0 left");
        // A punch to the end of a stripe shortens it; one inside keeps its charge.
        s.fallocate(&span(&l, ss / 2, ss), falloc_mode::PUNCH, false)
            .unwrap();
        assert_eq!(s.used(), ss / 2);
        s.fallocate(&span(&l, 4096, 4096), falloc_mode::PUNCH, false)
            .unwrap();
        assert_eq!(s.used(), ss / 2);
        assert_eq!(s.read(ino, 1, 0, 10).unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn punch_and_zero_read_zeros_and_seek_finds_the_holes() {
        let (_d, s) = store(1 << 30);
        let (l, ino) = (layout(), InodeNo(7));
        let ss = u64::from(SS);
        s.write(ino, 0, 0, &vec![1u8; SS as usize]).unwrap();
        s.write(ino, 2, 0, &vec![2u8; SS as usize]).unwrap();
        let end = 3 * ss;
        assert_eq!(s.seek(&span(&l, 0, end), false).unwrap(), Some(0));
        assert_eq!(s.seek(&span(&l, 0, end), true).unwrap(), Some(ss));
        assert_eq!(
            s.seek(&span(&l, ss, end - ss), false).unwrap(),
            Some(2 * ss)
        );
        assert_eq!(s.seek(&span(&l, 2 * ss, end - 2 * ss), true).unwrap(), None);
        // A hole inside stripe 0 (4 KiB aligned for the local file system).
        s.fallocate(&span(&l, 8192, 8192), falloc_mode::PUNCH, false)
            .unwrap();
        assert_eq!(s.read(ino, 0, 8192, 8192).unwrap(), vec![0u8; 8192]);
        assert_eq!(s.read(ino, 0, 0, 4).unwrap(), vec![1u8; 4]);
        assert_eq!(s.seek(&span(&l, 0, end), true).unwrap(), Some(8192));
        assert_eq!(
            s.seek(&span(&l, 8192, end - 8192), false).unwrap(),
            Some(16384)
        );
        s.fallocate(&span(&l, 2 * ss + 10, 20), falloc_mode::ZERO, false)
            .unwrap();
        let back = s.read(ino, 2, 0, 40).unwrap();
        assert_eq!(&back[..10], &[2u8; 10]);
        assert_eq!(&back[10..30], &[0u8; 20]);
        assert_eq!(&back[30..], &[2u8; 10]);
        assert_eq!(
            s.fallocate(&span(&l, 0, 1), 9, false).unwrap_err().errno(),
            Errno::EINVAL
        );
    }
}
