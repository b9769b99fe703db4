//! SETATTR: chmod, chown, truncate and utimes, sent to the inode's home as one
//! `SetAttrReq` whose `valid` bits name what changes. A truncate or a change of times
//! first pushes this client's write-behind of the file: no buffered byte may land past
//! the new end, and no write accepted before a utimens may move the mtime it set (the
//! push tells the home "written, now" for those writes; after the utimens it would
//! overwrite the time `cp -p` and `tar -x` set on the open file before closing it).

use super::{SpillwayFs, R};
use fuser::TimeOrNow;
use spillway_types::{Attr, InodeNo, Timespec};
use spillway_wire::messages::{setattr, SetAttrReq};
use std::time::SystemTime;

/// The changes that must come after this client's buffered writes of the file: the
/// size, and the times (given or "now").
const ORDERED_AFTER_WRITES: u32 =
    setattr::SIZE | setattr::ATIME | setattr::ATIME_NOW | setattr::MTIME | setattr::MTIME_NOW;

/// What a SETATTR asks to change, as the kernel sent it (`None`: leave it as it is).
pub(super) struct AttrChanges {
    pub(super) mode: Option<u32>,
    pub(super) uid: Option<u32>,
    pub(super) gid: Option<u32>,
    pub(super) size: Option<u64>,
    pub(super) atime: Option<TimeOrNow>,
    pub(super) mtime: Option<TimeOrNow>,
    pub(super) ctime: Option<SystemTime>,
}

impl AttrChanges {
    /// The request for inode `i`'s home.
    pub(super) fn request(self, i: InodeNo) -> SetAttrReq {
        let mut valid = 0;
        let mut req = SetAttrReq::of(i);
        if let Some(m) = self.mode {
            valid |= setattr::MODE;
            req.mode = m & 0o7777;
        }
        if let Some(u) = self.uid {
            valid |= setattr::UID;
            req.uid = u;
        }
        if let Some(g) = self.gid {
            valid |= setattr::GID;
            req.gid = g;
        }
        if let Some(s) = self.size {
            valid |= setattr::SIZE;
            req.size = s;
        }
        req.atime = time_set(self.atime, setattr::ATIME, setattr::ATIME_NOW, &mut valid);
        req.mtime = time_set(self.mtime, setattr::MTIME, setattr::MTIME_NOW, &mut valid);
        if let Some(c) = self.ctime {
            valid |= setattr::CTIME;
            req.ctime = Timespec::from_system_time(c);
        }
        req.valid = valid;
        req
    }
}

/// A time to set: `bit` for a given time, `now_bit` for the home's clock (UTIME_NOW).
fn time_set(t: Option<TimeOrNow>, bit: u32, now_bit: u32, valid: &mut u32) -> Timespec {
    match t {
        None => Timespec::default(),
        Some(TimeOrNow::Now) => {
            *valid |= now_bit;
            Timespec::default()
        }
        Some(TimeOrNow::SpecificTime(st)) => {
            *valid |= bit;
            Timespec::from_system_time(st)
        }
    }
}

impl SpillwayFs {
    /// Apply `req` at the home. A truncate or a change of times first pushes this
    /// client's writes (ordering the change after every write accepted before it); a
    /// truncate then tells the write-back buffer where the file now ends.
    pub(super) fn do_setattr(&self, i: InodeNo, mut req: SetAttrReq) -> R<Attr> {
        let wb = self.t.writeback(i);
        let ordered = req.valid & ORDERED_AFTER_WRITES != 0;
        if ordered {
            if let Some(wb) = &wb {
                self.note_flushed(wb.flush()?);
            }
        }
        req.ino = i;
        let attr = self.inst.setattr(req.clone())?;
        if req.valid & setattr::SIZE != 0 {
            if let Some(wb) = &wb {
                wb.truncated(attr.size);
            }
        }
        if ordered {
            // Our own change: the kernel's cached pages still hold the file's data, so
            // the next open here must not take the new size or mtime for another
            // client's change and drop them.
            let mut nodes = self.t.nodes();
            if let Some(n) = nodes.get_mut(&i) {
                n.cached = Some(self.stamp(&attr));
                n.attr = attr.clone();
            }
        }
        Ok(attr)
    }
}
