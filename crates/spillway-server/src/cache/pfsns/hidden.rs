//! Files whose last name goes while they are open (DataWarp's promise for a cache:
//! "if the file is open, the invalidate and removal is deferred until the last close",
//! docs/cache.md section 5, "Unlink").
//!
//! Removing the PFS file at once would leave its open descriptors with nothing behind
//! them: its bytes not cached yet could not be read, its dirty ones had nowhere to go,
//! and fsync and close answered ESTALE (the create, unlink, write, fsync pattern of
//! temporary files failed). So before the last name of an open regular file goes, the
//! namespace server gives the file a second, hidden name in the same directory (a hard
//! link, made as root; the removal itself is then the caller's, with the PFS's
//! checks), as NFS clients do. The mount never shows hidden names (lookups answer
//! ENOENT, listings leave them out, and no name of that form can be made through it),
//! the file shows no link for it, and its last close removes it with the file's
//! cached state.
//!
//! The hidden names are recorded in the namespace table, so that a server restarted
//! meanwhile still removes them: once nothing has had such a file open for
//! `REAP_AFTER` since the server started or the name was made (a client reconnecting
//! after a restart opens its files again within that time).
//!
//! Root removes a hidden name only while it still holds the very inode it was made
//! for (compared by device and inode number through the file's handle).

use super::{fs, lock, sys, PfsNamespace};
use crate::error::StoreResult;
use spillway_types::{Errno, InodeNo};
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// The names kept for files unlinked while open begin so; the mount shows none.
pub(super) const HIDDEN_PREFIX: &[u8] = b".spillway-unlinked-";

/// How long a hidden file nobody has open stays after a restart (or after it was
/// hidden, if no close came): longer than clients take to reconnect and reopen.
pub(crate) const REAP_AFTER: Duration = Duration::from_secs(60);

pub(super) struct Hidden {
    pub parent: InodeNo,
    pub name: CString,
    pub since: Instant,
}

pub(super) fn is_hidden_name(name: &[u8]) -> bool {
    name.starts_with(HIDDEN_PREFIX)
}

fn hidden_name(ino: InodeNo) -> CString {
    let mut v = HIDDEN_PREFIX.to_vec();
    v.extend_from_slice(format!("{:016x}", ino.0).as_bytes());
    // No NUL in a prefix and hex digits.
    CString::new(v).unwrap_or_default()
}

impl PfsNamespace {
    /// Load the hidden names recorded before a restart.
    pub(super) fn load_hidden(&self) -> StoreResult<()> {
        let rows = self.with_table(|t| t.hidden())?;
        let now = Instant::now();
        let mut m = lock(&self.memory);
        for (counter, parent, name) in rows {
            let Ok(name) = CString::new(name) else {
                continue;
            };
            m.hidden.insert(
                self.ino(counter),
                Hidden {
                    parent: self.ino(parent),
                    name,
                    since: now,
                },
            );
        }
        Ok(())
    }

    pub(super) fn is_hidden(&self, ino: InodeNo) -> bool {
        lock(&self.memory).hidden.contains_key(&ino)
    }

    /// Give open regular file `ino` (`fd`: its O_PATH descriptor) a hidden name in
    /// `dir` (inode `parent`) before its last name goes.
    pub(super) fn hide(
        &self,
        parent: InodeNo,
        dir: &OwnedFd,
        ino: InodeNo,
        fd: &OwnedFd,
    ) -> StoreResult<()> {
        let name = hidden_name(ino);
        // Recorded first: a crash between the two leaves a record of a name that may
        // not exist, never a name nobody will remove.
        self.with_table(|t| t.set_hidden(ino.counter(), parent.counter(), name.as_bytes()))?;
        match sys::link_inode(fd, dir, &name) {
            Ok(()) => {}
            // Left by an earlier hide of the same file (it was linked again, then
            // removed again): its own inode already holds the name.
            Err(Errno::EEXIST) if self.holds(dir, &name, fd) => {}
            Err(e) => {
                let _ = self.with_table(|t| t.forget_hidden(ino.counter()));
                return Err(fs(e));
            }
        }
        lock(&self.memory).hidden.insert(
            ino,
            Hidden {
                parent,
                name,
                since: Instant::now(),
            },
        );
        Ok(())
    }

    /// `hide`, or when it cannot (a name of that form planted by someone on the PFS,
    /// a full directory), the plain removal the file had before: a user who can write
    /// the directory must not be able to make another's unlink fail. Whether it hid.
    pub(super) fn try_hide(
        &self,
        parent: InodeNo,
        dir: &OwnedFd,
        ino: InodeNo,
        fd: &OwnedFd,
    ) -> bool {
        match self.hide(parent, dir, ino, fd) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(%ino, "cannot keep a file unlinked while open under a hidden name ({e}): removed at once");
                false
            }
        }
    }

    /// Whether `dir`/`name` is the inode of `fd`.
    fn holds(&self, dir: &OwnedFd, name: &CString, fd: &OwnedFd) -> bool {
        matches!(
            (sys::fstatat_nofollow(dir, name), sys::fstat(fd)),
            (Ok(a), Ok(b)) if super::same_inode(&a, &b)
        )
    }

    /// Remove `ino`'s hidden name, if it has one (its last close, or a removal that
    /// failed after the name was made).
    pub(crate) fn reap(&self, ino: InodeNo) -> StoreResult<()> {
        let Some(h) = lock(&self.memory).hidden.remove(&ino) else {
            return Ok(());
        };
        let removed = (|| -> StoreResult<()> {
            let dir = self.dir_fd(h.parent)?;
            let (fd, _) = self.open_ino(ino, libc::O_PATH | libc::O_NOFOLLOW)?;
            if self.holds(&dir, &h.name, &fd) {
                sys::unlinkat(&dir, &h.name, false)?;
                self.changed(h.parent);
            }
            Ok(())
        })();
        match removed {
            // Gone already (removed on the PFS, or its directory with it).
            Ok(()) | Err(crate::error::StoreError::Fs(Errno::ESTALE | Errno::ENOENT)) => {
                self.with_table(|t| t.forget_hidden(ino.counter()))
            }
            Err(e) => {
                lock(&self.memory).hidden.insert(ino, h);
                Err(e)
            }
        }
    }

    /// Hidden files nobody has had open for `REAP_AFTER` (`open`: whether a file is
    /// open now), to be reaped.
    pub(crate) fn hidden_due(&self, open: &dyn Fn(InodeNo) -> bool) -> Vec<InodeNo> {
        let mut m = lock(&self.memory);
        let now = Instant::now();
        let mut due = Vec::new();
        for (ino, h) in m.hidden.iter_mut() {
            if open(*ino) {
                h.since = now;
            } else if now.duration_since(h.since) >= REAP_AFTER {
                due.push(*ino);
            }
        }
        due
    }
}
