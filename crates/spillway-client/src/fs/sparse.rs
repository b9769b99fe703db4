//! fallocate(2) and lseek(SEEK_DATA/SEEK_HOLE) on a file: both first push this
//! client's write-behind of the file to the servers (so they act on the bytes the
//! application wrote), then ask every server holding stripes of the range, in
//! parallel (spillway_stubs::sparse). Size and times change at the home afterwards,
//! like a truncate's do; the servers have reported their new allocation to the home
//! by then, so the attributes it answers (and `st_blocks`) are exact.

use super::{SpillwayFs, R};
use spillway_placement::Layout;
use spillway_stubs::sparse::servers_in_range;
use spillway_types::{Attr, Errno, InodeNo};
use spillway_wire::messages::{falloc_mode, setattr, SetAttrReq};

/// fallocate(2) mode bits (linux/falloc.h).
const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
const PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;
const ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE;

/// What a fallocate mode asks of the servers, and whether the size stays; None for
/// the modes not supported here (COLLAPSE_RANGE, INSERT_RANGE, UNSHARE_RANGE, a punch
/// without KEEP_SIZE, unknown bits): EOPNOTSUPP, as Linux answers on file systems
/// without them.
pub(super) fn falloc_op(mode: i32) -> Option<(u8, bool)> {
    match mode {
        0 => Some((falloc_mode::ALLOCATE, false)),
        KEEP_SIZE => Some((falloc_mode::ALLOCATE, true)),
        m if m == PUNCH_HOLE | KEEP_SIZE => Some((falloc_mode::PUNCH, true)),
        ZERO_RANGE => Some((falloc_mode::ZERO, false)),
        m if m == ZERO_RANGE | KEEP_SIZE => Some((falloc_mode::ZERO, true)),
        _ => None,
    }
}

impl SpillwayFs {
    /// Push what this client wrote to `i` to the servers (and its size to the home).
    fn push_writes(&self, i: InodeNo) -> R<()> {
        if let Some(wb) = self.t.writeback(i) {
            self.note_flushed(wb.flush()?);
        }
        Ok(())
    }

    /// Give back this client's space grants on the servers of the range: space they
    /// promised this connection is not free to a fallocate, which is not charged to
    /// a grant (grants.rs). The next write gets a new grant as usual.
    fn return_grants(&self, layout: &Layout, offset: u64, len: u64) {
        for server in servers_in_range(layout, offset, len) {
            let Some((grant_epoch, bytes)) = self.grants.charge_upto(server, u64::MAX) else {
                continue;
            };
            if let Err(e) = self.inst.release_grant(server, grant_epoch, bytes) {
                // The server takes it back when the connection goes anyway.
                tracing::debug!(%server, "returning a grant before fallocate: {e}");
            }
        }
    }

    /// mtime and ctime = now at the home (SetAttr: an ExtendSize would count as a
    /// write, and a file without blocks would show one, meta/allocs.rs).
    fn touch(&self, i: InodeNo) -> R<Attr> {
        let mut req = SetAttrReq::of(i);
        req.valid = setattr::MTIME_NOW;
        self.inst.setattr(req)
    }

    pub(super) fn do_fallocate(&self, i: InodeNo, offset: u64, len: u64, mode: i32) -> R<Attr> {
        let (op, keep_size) = falloc_op(mode).ok_or(Errno::EOPNOTSUPP)?;
        if len == 0 {
            return Err(Errno::EINVAL);
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or(Errno::EFBIG)?;
        self.push_writes(i)?;
        let attr = self.inst.getattr(i)?;
        let layout = self.inst.layout(&attr);
        if op != falloc_mode::PUNCH {
            self.return_grants(&layout, offset, len);
            // Every server first says whether its share fits, so that a range too
            // large for the instance is refused with nothing allocated anywhere.
            self.inst
                .fallocate_data(&layout, i, offset, len, op, true)?;
        }
        let done = self.inst.fallocate_data(&layout, i, offset, len, op, false);
        if let Err(e) = done {
            // Some stripes may have changed all the same: the times move, the size not.
            if let Err(t) = self.touch(i) {
                tracing::debug!(ino = %i, "touching after a failed fallocate: {t}");
            }
            self.t.stale(i);
            return Err(e);
        }
        if keep_size {
            let attr = self.touch(i).inspect_err(|_| self.t.stale(i))?;
            self.coherence.note_own(&attr);
            return Ok(attr);
        }
        let r = self
            .inst
            .extend_size(i, end, true)
            .inspect_err(|_| self.t.stale(i))?;
        let attr = r.attr.clone();
        self.note_flushed(Some(r));
        Ok(attr)
    }

    /// lseek with SEEK_DATA or SEEK_HOLE from `offset`.
    pub(super) fn do_lseek(&self, i: InodeNo, offset: i64, whence: i32) -> R<i64> {
        // The kernel sends only these two; SEEK_SET/CUR/END it answers itself.
        let hole = match whence {
            libc::SEEK_DATA => false,
            libc::SEEK_HOLE => true,
            _ => return Err(Errno::EINVAL),
        };
        let offset = u64::try_from(offset).map_err(|_| Errno(libc::ENXIO))?;
        self.push_writes(i)?;
        let attr = self.inst.getattr(i)?;
        let size = match self.t.writeback(i) {
            Some(wb) => attr.size.max(wb.end()),
            None => attr.size,
        };
        if offset >= size {
            return Err(Errno(libc::ENXIO));
        }
        let layout = self.inst.layout(&attr);
        let found = self.inst.seek_data(&layout, i, offset, size, hole)?;
        let at = match (found, hole) {
            (Some(p), _) => p.min(size),
            // Past the last data there is only the hole that ends every file.
            (None, true) => size,
            (None, false) => return Err(Errno(libc::ENXIO)),
        };
        i64::try_from(at).map_err(|_| Errno(libc::EOVERFLOW))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(falloc_op(0), Some((falloc_mode::ALLOCATE, false)));
        assert_eq!(falloc_op(KEEP_SIZE), Some((falloc_mode::ALLOCATE, true)));
        assert_eq!(
            falloc_op(PUNCH_HOLE | KEEP_SIZE),
            Some((falloc_mode::PUNCH, true))
        );
        assert_eq!(falloc_op(ZERO_RANGE), Some((falloc_mode::ZERO, false)));
        assert_eq!(
            falloc_op(ZERO_RANGE | KEEP_SIZE),
            Some((falloc_mode::ZERO, true))
        );
        for unsupported in [
            PUNCH_HOLE,
            libc::FALLOC_FL_COLLAPSE_RANGE,
            libc::FALLOC_FL_INSERT_RANGE,
            libc::FALLOC_FL_UNSHARE_RANGE,
            PUNCH_HOLE | ZERO_RANGE | KEEP_SIZE,
            0x4000,
        ] {
            assert_eq!(falloc_op(unsupported), None, "mode {unsupported:#x}");
        }
    }
}
