//! Coherence with the PFS at open (docs/cache.md section 7): whether a file's cached
//! copy may still be served, or the PFS file was changed by someone other than the
//! cache since it was cached.
//!
//! # The rule
//!
//! A PFS file's *version* is `(size, mtime, ctime, st_ino)` from `fstat`. Every change
//! the cache itself makes to a PFS file is followed by an `fstat` of it, kept as the
//! version that change left:
//!
//! * the namespace server keeps one per file (`PfsNamespace`): the version it agreed
//!   on at the file's last open, replaced after each of its own calls on the file
//!   (setattr, xattrs, link, rename, unlink);
//! * each data server keeps the version its last write-behind of the file left
//!   (`CacheStripes`: an `fstat` of the PFS file after its `fdatasync`).
//!
//! At open the namespace server stats the file. The file is *as the cache left it*
//! when that version is the namespace server's own or one of the data servers' last
//! write-behinds': whoever of them changed it last took the last `fstat`, which sees
//! every change of the others before it, so without a foreign change the file is still
//! at that version. Any other version is a change from outside. The data servers write
//! behind independently; a version is compared for equality only, so their order
//! never matters, and no report has to reach the namespace server in time: it asks
//! them (`CacheInodeReq`) only when the version differs from its own.
//!
//! What the open then does (`judge`):
//!
//! * as the cache left it: nothing is dropped; the version is agreed;
//! * changed from outside, no server holds unwritten writes: every server drops its
//!   copy (`CacheDropReq`), and the namespace's size overlay goes;
//! * changed from outside while servers hold unwritten writes: they win (nothing is
//!   dropped, a warning names the inode), and a drop is *owed*: the first open that
//!   finds no unwritten writes left drops the copy, whose clean bytes predate the
//!   outside change;
//! * a server not reached, or a write-behind running (its writes may be what moved
//!   the version): nothing is decided; the next open asks again.
//!
//! Limits, by design: a change from outside that lands between the last check and a
//! change of our own (a write-behind, a chmod through the mount) is taken for ours,
//! as the version our change left includes it; this needs the PFS file written from
//! outside while the job is changing it, which section 7 leaves to the user. Between
//! opens nothing is checked (close-to-open).

use spillway_types::Timespec;

/// A PFS file's version: what `fstat` says of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PfsVersion {
    pub size: u64,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub ino: u64,
}

impl PfsVersion {
    pub(crate) fn of(st: &libc::stat) -> PfsVersion {
        let t = |sec: i64, nsec: i64| Timespec {
            sec,
            nsec: nsec.clamp(0, 999_999_999) as u32,
        };
        PfsVersion {
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime: t(st.st_mtime, st.st_mtime_nsec),
            ctime: t(st.st_ctime, st.st_ctime_nsec),
            ino: st.st_ino,
        }
    }

    /// The version of an open file.
    pub(crate) fn of_file(f: &std::fs::File) -> std::io::Result<PfsVersion> {
        use std::os::unix::fs::MetadataExt;
        let m = f.metadata()?;
        Ok(PfsVersion {
            size: m.len(),
            mtime: Timespec {
                sec: m.mtime(),
                nsec: m.mtime_nsec().clamp(0, 999_999_999) as u32,
            },
            ctime: Timespec {
                sec: m.ctime(),
                nsec: m.ctime_nsec().clamp(0, 999_999_999) as u32,
            },
            ino: m.ino(),
        })
    }
}

impl From<PfsVersion> for spillway_wire::PfsVersion {
    fn from(v: PfsVersion) -> Self {
        spillway_wire::PfsVersion {
            size: v.size,
            mtime: v.mtime,
            ctime: v.ctime,
            ino: v.ino,
        }
    }
}

impl From<spillway_wire::PfsVersion> for PfsVersion {
    fn from(v: spillway_wire::PfsVersion) -> Self {
        PfsVersion {
            size: v.size,
            mtime: v.mtime,
            ctime: v.ctime,
            ino: v.ino,
        }
    }
}

/// What one data server holds of a file (`CacheStripes::inode_status`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct InodeStatus {
    /// Some of its bytes are cached there, or stripe files of it are on its disk.
    pub cached: bool,
    /// Some of its bytes are written there and not yet on the PFS.
    pub dirty: bool,
    /// A write-behind, truncate or drop of it runs there now.
    pub busy: bool,
    /// The version its last write-behind of the file left.
    pub flushed: Option<PfsVersion>,
}

impl From<InodeStatus> for spillway_wire::CacheInodeReply {
    fn from(s: InodeStatus) -> Self {
        spillway_wire::CacheInodeReply {
            cached: s.cached,
            dirty: s.dirty,
            busy: s.busy,
            flushed: s.flushed.map(Into::into),
        }
    }
}

impl From<spillway_wire::CacheInodeReply> for InodeStatus {
    fn from(r: spillway_wire::CacheInodeReply) -> Self {
        InodeStatus {
            cached: r.cached,
            dirty: r.dirty,
            busy: r.busy,
            flushed: r.flushed.map(Into::into),
        }
    }
}

/// What an open does with a file's cached copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Undecided (a server not reached, a write-behind running): nothing changes, the
    /// next open asks again.
    Unsure,
    /// The PFS file is as the cache left it: agree on its version. `dirty`: some
    /// server still holds unwritten writes (the size overlay stays).
    Ours { dirty: bool },
    /// Changed from outside, and no server holds unwritten writes: drop every copy
    /// (when some server has one: `cached`), then agree on the version.
    Drop { cached: bool },
    /// Changed from outside while servers hold unwritten writes (or a drop is owed
    /// since such a change): they win, nothing is dropped now, a drop is owed.
    /// `warn`: a new change from outside, to be named in the log.
    Conflict { warn: bool },
}

/// The verdict at an open that found the PFS file at version `now`, when the
/// namespace server's own version is `known` (None: none since it started), a drop
/// is `owed` (a change from outside was found under unwritten writes), and the data
/// servers of the file's layout answered `servers` (None: not reached).
pub(crate) fn judge(
    now: PfsVersion,
    known: Option<PfsVersion>,
    owed: bool,
    servers: &[Option<InodeStatus>],
) -> Verdict {
    if servers.iter().any(|s| s.is_none_or(|s| s.busy)) {
        return Verdict::Unsure;
    }
    let servers = || servers.iter().flatten();
    let dirty = servers().any(|s| s.dirty);
    let cached = servers().any(|s| s.cached);
    let ours = known == Some(now) || servers().any(|s| s.flushed == Some(now));
    match (ours && !owed, dirty) {
        (true, dirty) => Verdict::Ours { dirty },
        (false, false) => Verdict::Drop { cached },
        // With no version of its own (the namespace server restarted), nothing says
        // whether the file changed from outside: the drop is owed, without a warning.
        (false, true) => Verdict::Conflict {
            warn: !owed && known.is_some(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: i64) -> PfsVersion {
        PfsVersion {
            size: n as u64 * 100,
            mtime: Timespec { sec: n, nsec: 1 },
            ctime: Timespec { sec: n, nsec: 2 },
            ino: 7,
        }
    }

    fn st(cached: bool, dirty: bool, flushed: Option<PfsVersion>) -> Option<InodeStatus> {
        Some(InodeStatus {
            cached,
            dirty,
            busy: false,
            flushed,
        })
    }

    #[test]
    fn an_own_version_is_ours() {
        // The namespace server's own, whatever the data servers say.
        assert_eq!(
            judge(v(1), Some(v(1)), false, &[st(true, false, None)]),
            Verdict::Ours { dirty: false }
        );
        // A data server's last write-behind left it: ours, even with the namespace
        // server's version older or unknown, and another server's write-behind older.
        let servers = [st(true, false, Some(v(2))), st(true, false, Some(v(3)))];
        assert_eq!(
            judge(v(3), Some(v(1)), false, &servers),
            Verdict::Ours { dirty: false }
        );
        assert_eq!(
            judge(v(2), None, false, &servers),
            Verdict::Ours { dirty: false }
        );
        // Writes since the write-behind: still ours, and the overlay stays.
        let servers = [st(true, true, Some(v(2))), st(true, false, None)];
        assert_eq!(
            judge(v(2), Some(v(1)), false, &servers),
            Verdict::Ours { dirty: true }
        );
    }

    #[test]
    fn another_version_without_unwritten_writes_drops() {
        let servers = [st(true, false, Some(v(2))), st(false, false, None)];
        assert_eq!(
            judge(v(3), Some(v(2)), false, &servers),
            Verdict::Drop { cached: true }
        );
        // Size, mtime, ctime and inode each count.
        for other in [
            PfsVersion { size: 1, ..v(2) },
            PfsVersion {
                mtime: v(9).mtime,
                ..v(2)
            },
            PfsVersion {
                ctime: v(9).ctime,
                ..v(2)
            },
            PfsVersion { ino: 8, ..v(2) },
        ] {
            assert_eq!(
                judge(other, Some(v(2)), false, &servers),
                Verdict::Drop { cached: true }
            );
        }
        // Nothing cached anywhere (a first open): nothing to drop, the version agreed.
        assert_eq!(
            judge(v(3), None, false, &[st(false, false, None)]),
            Verdict::Drop { cached: false }
        );
    }

    #[test]
    fn unwritten_writes_win_and_owe_a_drop() {
        let dirty = [st(true, true, None), st(true, false, None)];
        assert_eq!(
            judge(v(3), Some(v(2)), false, &dirty),
            Verdict::Conflict { warn: true }
        );
        // Owed already: no second warning, even when the version is ours again
        // (the writes were written behind since: their version).
        let flushed_dirty = [st(true, true, Some(v(4))), st(true, false, None)];
        assert_eq!(
            judge(v(4), Some(v(3)), true, &flushed_dirty),
            Verdict::Conflict { warn: false }
        );
        // Once no server holds unwritten writes, the owed drop is done.
        let flushed = [st(true, false, Some(v(4))), st(true, false, None)];
        assert_eq!(
            judge(v(4), Some(v(3)), true, &flushed),
            Verdict::Drop { cached: true }
        );
        // No version of its own: owed, not warned (a restart, not a known change).
        assert_eq!(
            judge(v(3), None, false, &dirty),
            Verdict::Conflict { warn: false }
        );
    }

    #[test]
    fn a_server_not_reached_or_busy_decides_nothing() {
        let busy = Some(InodeStatus {
            busy: true,
            ..InodeStatus::default()
        });
        for servers in [
            vec![st(true, false, None), None],
            vec![busy, st(true, false, Some(v(3)))],
        ] {
            assert_eq!(judge(v(3), Some(v(2)), false, &servers), Verdict::Unsure);
        }
    }
}
