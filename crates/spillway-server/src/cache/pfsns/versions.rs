//! The namespace server's side of coherence at open (the rule: cache/coherence.rs):
//! per regular file, the PFS version it agreed on at the file's last open, replaced by
//! the version each of its own calls on the file leaves; and the files owing a drop
//! (changed from outside while servers held unwritten writes). Memory only: after a
//! restart the first open of a file asks the data servers again.

use super::{kind_of, lock, sys, PfsNamespace};
use crate::cache::coherence::PfsVersion;
use crate::error::StoreResult;
use spillway_types::{FileKind, InodeNo};
use std::os::fd::OwnedFd;

/// Files whose version is kept at once; past it the table starts again (each file's
/// next open then asks the data servers once).
const VERSIONS_KEPT: usize = 1 << 20;

/// A regular file at an open: its version now, the one agreed before, and its geometry
/// (which servers may hold its stripes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub now: PfsVersion,
    pub known: Option<PfsVersion>,
    pub owed: bool,
    pub stripe_size: u32,
    pub stripe_width: u16,
}

impl Seen {
    /// Nothing to ask: the file is at the version agreed, and no drop is owed.
    pub(crate) fn unchanged(&self) -> bool {
        !self.owed && self.known == Some(self.now)
    }
}

impl PfsNamespace {
    /// `ino` as coherence at open sees it; None unless a regular file.
    pub(crate) fn seen(&self, ino: InodeNo) -> StoreResult<Option<Seen>> {
        let o = self.inode(ino)?;
        if kind_of(&o.st)? != FileKind::Regular {
            return Ok(None);
        }
        let m = lock(&self.memory);
        Ok(Some(Seen {
            now: PfsVersion::of(&o.st),
            known: m.versions.get(&ino).copied(),
            owed: m.owed.contains(&ino),
            stripe_size: if o.row.stripe_size == 0 {
                self.stripe_size
            } else {
                o.row.stripe_size
            },
            stripe_width: if o.row.stripe_width == 0 {
                self.stripe_width
            } else {
                o.row.stripe_width
            },
        }))
    }

    /// The cache's copy of `ino` agrees with the PFS file at version `v`.
    pub(crate) fn agree(&self, ino: InodeNo, v: PfsVersion) {
        let mut m = lock(&self.memory);
        if m.versions.len() >= VERSIONS_KEPT && !m.versions.contains_key(&ino) {
            m.versions.clear();
        }
        m.versions.insert(ino, v);
    }

    /// A change from outside was found under unwritten writes: the copy is dropped at
    /// the first open that finds none left. True when newly owed.
    pub(crate) fn owe_drop(&self, ino: InodeNo) -> bool {
        lock(&self.memory).owed.insert(ino)
    }

    /// The owed drop was done.
    pub(crate) fn drop_paid(&self, ino: InodeNo) {
        lock(&self.memory).owed.remove(&ino);
    }

    /// The write-behind of `ino` reached the PFS, whose size is now `size`: the size
    /// overlay goes when the PFS has caught up with it (a smaller PFS size means a
    /// write on its way: it stays).
    pub(crate) fn settled_at(&self, ino: InodeNo, size: u64) {
        let mut m = lock(&self.memory);
        if m.overlays.get(&ino).is_some_and(|o| o.size <= size) {
            m.overlays.remove(&ino);
        }
    }

    /// One of our own calls changed `ino` on the PFS (its ctime at least), leaving it
    /// as `st` says: that is the version agreed now, if one was (a file never opened
    /// since this server started has none, and its first open asks the data servers).
    pub(super) fn ours(&self, ino: InodeNo, st: &libc::stat) {
        if FileKind::from_mode(st.st_mode) != Some(FileKind::Regular) {
            return;
        }
        if let Some(v) = lock(&self.memory).versions.get_mut(&ino) {
            *v = PfsVersion::of(st);
        }
    }

    /// `ours`, stat'ing the inode through `fd`, when a version is kept for it.
    pub(super) fn ours_fd(&self, ino: InodeNo, fd: &OwnedFd) {
        if !lock(&self.memory).versions.contains_key(&ino) {
            return;
        }
        if let Ok(st) = sys::fstat(fd) {
            self.ours(ino, &st);
        }
    }

    /// `ours`, opening the inode, when a version is kept for it (gone: nothing to do).
    pub(super) fn ours_ino(&self, ino: InodeNo) {
        if !lock(&self.memory).versions.contains_key(&ino) {
            return;
        }
        if let Ok(o) = self.inode(ino) {
            self.ours(ino, &o.st);
        }
    }
}
