//! The mtime a write-behind leaves on the PFS file: the time of the writes it carries,
//! not its own. Its `pwrite`s move the PFS file's mtime to the moment they land,
//! seconds after the application wrote (the mtime seen through the mount would jump
//! then, and a `make` or `rsync` comparing times would see a change nobody made), so
//! it puts back the time of the last write absorbed here (docs/cache.md, "File times").
//!
//! Times set explicitly (utime, futimens: `tar -x`, `cp -p`, `rsync -a`) while the
//! file had dirty ranges here are kept with them (`LogTimes`, in the write-behind log)
//! and left instead, so the later write-behind does not undo them; a write here after
//! them voids their mtime (POSIX: a write moves the mtime).

use crate::cache::wblog::LogTimes;
use spillway_types::{InodeNo, Timespec};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

impl super::CacheStripes {
    /// `CacheTimesReq`: times set explicitly on `ino`, answered by the namespace server
    /// only once every server of the file has taken them. Kept (with a `Times` record,
    /// appended as a write's `Dirty` record is: it survives a kill -9) while the inode
    /// has dirty ranges here, a flush's snapshot included; merged with times set before
    /// (a time not given now stays as set then). Without dirty ranges there is nothing
    /// to do: no write-behind of this server will move the PFS file's times. `void`
    /// in `new`: a write came after the times kept (on any server), at `new.mtime`.
    pub(crate) fn set_times(&self, ino: InodeNo, new: LogTimes) -> std::io::Result<()> {
        let mut st = self.state();
        let Some(i) = st.inodes.get_mut(&ino) else {
            return Ok(());
        };
        let t = match (i.times, new.void) {
            // A write after the times, on some server of the file (the namespace server
            // heard of it): its time is the mtime now.
            (Some(old), true) => LogTimes {
                mtime: new.mtime,
                void: false,
                ..old
            },
            (None, true) => return Ok(()),
            _ if !i.is_dirty() => return Ok(()),
            (None, false) => new,
            (Some(old), false) => LogTimes {
                atime: new.atime.or(old.atime),
                mtime: new.mtime.or(if old.void { None } else { old.mtime }),
                set_at: new.set_at,
                void: new.mtime.is_none() && old.void,
            },
        };
        i.times = Some(t);
        i.times_gen += 1;
        self.append_times(&mut i.last_seq, ino, &t)
    }
}

/// The file's mtime now, if it can be read.
pub(super) fn mtime_of(f: &File) -> Option<Timespec> {
    let m = f.metadata().ok()?;
    Some(Timespec {
        sec: m.mtime(),
        nsec: u32::try_from(m.mtime_nsec()).ok()?,
    })
}

/// The mtime to leave: the last write's (`wrote`), unless the file already had a later
/// one (`before`, read before this write-behind's writes) that is not in the future:
/// another server's write-behind of a later write. A time in the future was set
/// explicitly (utime) before these writes, which come after it and win.
fn to_leave(before: Option<Timespec>, wrote: Timespec, now: Timespec) -> Timespec {
    match before {
        Some(b) if b > wrote && b <= now => b,
        _ => wrote,
    }
}

/// The (atime, mtime) a write-behind leaves (None: as they are): `before` is the PFS
/// file's mtime read before its writes, `wrote` the time of the last write here (None
/// after a restart), `set` the times set explicitly while this server held writes.
///
/// With times set: the set mtime, unless a write here came after it (`void`), whose
/// time is left then as without times set (the namespace server may have put a later
/// one there for that write already: `cache_written`). A write after the set on
/// another server only is made known here by the namespace server (`set_times` with
/// `VOID`: the mtime becomes the time it shows for the write). The PFS file's own mtime
/// does not tell whether the set mtime still holds: another server's write-behind
/// running at the same moment shows its landing time there.
pub(super) fn times_to_leave(
    before: Option<Timespec>,
    wrote: Option<Timespec>,
    set: Option<&LogTimes>,
    now: Timespec,
) -> (Option<Timespec>, Option<Timespec>) {
    let by_write = || wrote.map(|w| to_leave(before, w, now));
    let Some(t) = set else {
        return (None, by_write());
    };
    let mtime = match (t.void, t.mtime) {
        (false, Some(m)) => Some(m),
        (false, None) => by_write(),
        (true, _) => by_write(),
    };
    (t.atime, mtime)
}

/// Set the atime and mtime (None: left as they are) of the PFS file `f` (open for
/// writing) after the writes of a write-behind. A failure is logged: the bytes are on
/// the PFS, only the times are late.
pub(super) fn leave_times(
    f: &File,
    ino: InodeNo,
    atime: Option<Timespec>,
    mtime: Option<Timespec>,
) {
    if atime.is_none() && mtime.is_none() {
        return;
    }
    let spec = |t: Option<Timespec>| match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(t) => libc::timespec {
            tv_sec: t.sec,
            tv_nsec: libc::c_long::from(t.nsec),
        },
    };
    let times = [spec(atime), spec(mtime)];
    // SAFETY: a valid descriptor and two timespecs, alive for the call.
    if unsafe { libc::futimens(f.as_raw_fd(), times.as_ptr()) } != 0 {
        tracing::warn!(
            "write-behind of inode {:#x}: cannot set the PFS file's times: {}",
            ino.0,
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(sec: i64) -> Timespec {
        Timespec { sec, nsec: 0 }
    }

    #[test]
    fn the_write_s_time_unless_a_later_past_one_is_there() {
        let now = at(100);
        // The write-behind's own time is never left: the write's is.
        assert_eq!(to_leave(Some(at(50)), at(60), now), at(60));
        assert_eq!(to_leave(None, at(60), now), at(60));
        // Another server wrote behind a later write first: its time stays.
        assert_eq!(to_leave(Some(at(70)), at(60), now), at(70));
        // A time set in the future before these writes: the writes come later and win.
        assert_eq!(to_leave(Some(at(500)), at(60), now), at(60));
    }

    fn set(mtime: Option<i64>, set_at: i64, void: bool) -> LogTimes {
        LogTimes {
            atime: Some(at(7)),
            mtime: mtime.map(at),
            set_at: at(set_at),
            void,
        }
    }

    #[test]
    fn times_set_stay_unless_a_later_write_moved_them() {
        let now = at(100);
        let leave = |before: Option<i64>, wrote: Option<i64>, t: Option<LogTimes>| {
            times_to_leave(before.map(at), wrote.map(at), t.as_ref(), now)
        };
        // No times set: the write's time, nothing for the atime.
        assert_eq!(leave(Some(50), Some(60), None), (None, Some(at(60))));
        assert_eq!(leave(Some(50), None, None), (None, None));
        // Set at 80 to 10 (tar's old time): left over the write's (60, before the set),
        // whatever the PFS shows now (the set time, this write-behind's earlier one, or
        // another server's landing at this moment).
        let t = Some(set(Some(10), 80, false));
        for before in [10, 60, 90] {
            assert_eq!(
                leave(Some(before), Some(60), t),
                (Some(at(7)), Some(at(10)))
            );
        }
        // After a restart the write's time is not known: the set time all the same.
        assert_eq!(leave(Some(10), None, t), (Some(at(7)), Some(at(10))));
        // A time set in the future stays too (it is the one set).
        let future = Some(set(Some(500), 80, false));
        assert_eq!(
            leave(Some(500), Some(60), future),
            (Some(at(7)), Some(at(500)))
        );
        // A write here after the set (void): its time, the atime set stays.
        let void = Some(set(Some(10), 80, true));
        assert_eq!(leave(Some(10), Some(85), void), (Some(at(7)), Some(at(85))));
        // ... or the later time the namespace server set for it.
        assert_eq!(leave(Some(95), Some(85), void), (Some(at(7)), Some(at(95))));
        let void_future = Some(set(Some(500), 80, true));
        assert_eq!(
            leave(Some(500), Some(85), void_future),
            (Some(at(7)), Some(at(85)))
        );
        // Only the atime set: the mtime is the write's.
        let atime_only = Some(set(None, 80, false));
        assert_eq!(
            leave(Some(50), Some(60), atime_only),
            (Some(at(7)), Some(at(60)))
        );
    }
}
