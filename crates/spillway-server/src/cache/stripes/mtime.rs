//! The mtime a write-behind leaves on the PFS file: the time of the writes it carries,
//! not its own. Its `pwrite`s move the PFS file's mtime to the moment they land,
//! seconds after the application wrote (the mtime seen through the mount would jump
//! then, and a `make` or `rsync` comparing times would see a change nobody made), so
//! it puts back the time of the last write absorbed here (docs/cache.md, "File times").

use spillway_types::{InodeNo, Timespec};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

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

/// Set the mtime of the PFS file `f` (open for writing) after the writes of a
/// write-behind. A failure is logged: the bytes are on the PFS, only the time is late.
pub(super) fn keep_write_time(f: &File, ino: InodeNo, before: Option<Timespec>, wrote: Timespec) {
    let t = to_leave(before, wrote, Timespec::now());
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: t.sec,
            tv_nsec: libc::c_long::from(t.nsec),
        },
    ];
    // SAFETY: a valid descriptor and two timespecs, alive for the call.
    if unsafe { libc::futimens(f.as_raw_fd(), times.as_ptr()) } != 0 {
        tracing::warn!(
            "write-behind of inode {:#x}: cannot set the PFS file's mtime: {}",
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
}
