//! Finding names and attributes: LOOKUP and GETATTR, answered from this client's
//! caches (nodes.rs) while they are fresh and from the homes otherwise, plus the
//! checks every name-taking operation shares.

use super::{SpillwayFs, R};
use spillway_types::tunables::MAX_NAME_LEN;
use spillway_types::{Attr, Errno, FileKind, InodeNo, Timespec};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

/// Attributes for a reply, and where they came from: this client's cache (with the
/// lifetime they have left) or the home just now (remembered as the reply goes out).
pub(super) enum Fresh {
    Cached(Attr, Duration),
    Fetched(Attr),
}

/// An inode the kernel reaches through a cached name may have been removed by another
/// client (unlink, rename over it). ESTALE makes the VFS walk the path again with a fresh
/// lookup (LOOKUP_REVAL) instead of failing with ENOENT: close-to-open across clients.
pub(super) fn gone(e: Errno) -> Errno {
    if e == Errno::ENOENT {
        Errno::ESTALE
    } else {
        e
    }
}

/// A name from the kernel as bytes; longer than any the servers store: ENAMETOOLONG.
pub(super) fn check_name(name: &OsStr) -> R<&[u8]> {
    let b = name.as_bytes();
    if b.len() > MAX_NAME_LEN {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(b)
}

impl SpillwayFs {
    /// `name` in `parent`: a subdirectory from this client's cache while it is fresh,
    /// else from the entry's server. `None`: there is no such name, and the kernel may
    /// remember that.
    pub(super) fn do_lookup(&self, parent: InodeNo, name: &OsStr) -> R<Option<Fresh>> {
        let n = name.as_bytes();
        if let Some((a, ttl)) =
            self.t
                .cached_subdir(parent, n, self.tun.entry_ttl, self.tun.attr_ttl)
        {
            return Ok(Some(Fresh::Cached(a, ttl)));
        }
        let r = check_name(name)
            .and_then(|n| self.inst.lookup(parent, n))
            .map(|(_, a)| a);
        match &r {
            Ok(a) => self.t.remember_entry(parent, n, a, self.tun.entry_ttl),
            Err(_) => self.t.forget_entry(parent, n),
        }
        match r {
            Ok(a) => Ok(Some(Fresh::Fetched(a))),
            // A negative entry (node id 0), only when the site allows the kernel to
            // remember misses (`negative_ttl`): then another client's create shows
            // only after that lifetime. Otherwise ENOENT itself, which the kernel
            // does not keep: the next open or stat of the name asks again and finds
            // what another node made meanwhile.
            Err(e) if e == Errno::ENOENT && !self.tun.negative_ttl.is_zero() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Attributes of `i`: cached while fresh, else from its home.
    pub(super) fn do_getattr(&self, i: InodeNo) -> R<Fresh> {
        if let Some((a, ttl)) = self.t.fresh_attr(i, self.tun.attr_ttl) {
            // A cached "no blocks" of a non-empty file may predate the servers' report
            // (a flush's reply races it): ask the home, as tools read st_blocks 0 as
            // "all hole" (fs/sparse.rs).
            if !(a.kind == FileKind::Regular && a.blocks == 0 && a.size > 0) {
                return Ok(Fresh::Cached(a, ttl));
            }
        }
        self.inst.getattr(i).map(Fresh::Fetched).map_err(gone)
    }

    /// Attributes of nothing, for negative entries (only the node id 0 matters).
    pub(super) fn negative_template(&self) -> Attr {
        Attr {
            ino: InodeNo(0),
            kind: FileKind::Regular,
            mode: 0,
            nlink: 0,
            uid: 0,
            gid: 0,
            rdev: 0,
            size: 0,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            stripe_size: 4096,
            stripe_width: 1,
            blocks: 0,
        }
    }

    /// A directory's attributes, from this client's cache when it has them.
    pub(super) fn dir_attr(&self, dir: InodeNo) -> R<Attr> {
        match self.t.attr(dir) {
            Some(a) => Ok(a),
            None => self.inst.getattr(dir),
        }
    }
}
