//! READ and WRITE. Reads go to the servers holding the stripes (after pushing this
//! client's own unsent writes, so a process reads back what it wrote); writes go
//! into the file's write-back buffer (writeback.rs), flushed at close and fsync.

use super::{SpillwayFs, R};
use spillway_types::{Errno, InodeNo};
use spillway_wire::messages::{setattr, SetAttrReq};

impl SpillwayFs {
    /// Read from the servers. This client's unsent writes go first, and the file is at
    /// least as long as what it wrote.
    pub(super) fn do_read(&self, i: InodeNo, offset: u64, size: u32) -> R<spillway_stubs::Payload> {
        let (attr, wb) = {
            let nodes = self.t.nodes();
            let n = nodes.get(&i).ok_or(Errno::EBADF)?;
            (n.attr.clone(), n.wb.clone())
        };
        let mut fsize = attr.size;
        if let Some(wb) = &wb {
            if wb.is_dirty() {
                self.note_flushed(wb.flush()?);
            }
            fsize = fsize.max(wb.end());
        }
        let layout = self.inst.layout(&attr);
        self.inst.read(&layout, i, offset, size, fsize)
    }

    /// A write by a caller without CAP_FSETID (`FUSE_WRITE_KILL_SUIDGID`): the kernel
    /// leaves the setuid and setgid bits to us, on a descriptor that goes around the
    /// page cache (`direct_writes`) and, with FUSE_HANDLE_KILLPRIV_V2 (fs/session.rs),
    /// on every write. As the kernel does: setuid goes, setgid only with group execute
    /// (without it the bit marks mandatory locking, not privilege). Judged on this
    /// mount's cached mode, as the kernel judged on its own; the home clears the bits
    /// from the mode the file has then (`setattr::KILL_SUIDGID`). The kernel's cached
    /// attributes are dropped so that a stat right after shows the new mode.
    pub(super) fn kill_privs(&self, i: InodeNo) -> R<()> {
        // Asked before every write by a user: the cached mode alone, no copy of the rest.
        let Some(mode) = self.t.mode(i) else {
            return Ok(());
        };
        if spillway_types::attr::privilege_bits(mode) == 0 {
            return Ok(());
        }
        let mut req = SetAttrReq::of(i);
        req.valid = setattr::KILL_SUIDGID;
        // The same path as a chmod through the mount (fs/attrs.rs).
        let attr = self.do_setattr(i, req)?;
        self.t.remember(&attr, false);
        if let Some(n) = self.notifier.get() {
            // Attributes only (negative offset): no page is touched, so this cannot
            // wait on the write the kernel is holding for us.
            let _ = n.inval_inode(self.fuse_ino(i), -1, 0);
        }
        Ok(())
    }

    /// Bytes taken: fewer than `data` when the servers had room for a part only.
    pub(super) fn do_write(&self, i: InodeNo, offset: u64, data: &[u8]) -> R<usize> {
        match self.t.writeback(i) {
            Some(wb) => wb.write(offset, data),
            None => {
                // Not open here (should not happen: the kernel writes through an open
                // file); write through.
                let attr = self.inst.getattr(i)?;
                let layout = self.inst.layout(&attr);
                self.inst.write(&layout, i, offset, data)?;
                let r = self.inst.extend_size(i, offset + data.len() as u64, true)?;
                self.note_flushed(Some(r));
                Ok(data.len())
            }
        }
    }
}
