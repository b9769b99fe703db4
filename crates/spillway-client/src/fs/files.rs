//! Open files: create, open, flush (close), fsync and release, and the arguments of
//! their byte-range and flock locks (held at the homes by locks.rs). Opening is where
//! close-to-open coherency is kept (a file another client changed loses the kernel's
//! cached pages and attributes); flush and fsync push this client's write-behind to
//! the servers and the size to the home before they return.

use super::existing::Opened;
use super::lookup::gone;
use super::{SpillwayFs, R};
use crate::locks::LockArgs;
use crate::nodes::{Node, OpenFile};
use crate::writeback::WriteBack;
use fuser::{FileHandle, FopenFlags, INodeNo, LockOwner, Request};
use spillway_types::{Attr, Errno, FileKind, InodeNo};
use spillway_wire::messages::{flush_scope, ExtendSizeReply};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

/// What a CREATE opened: a file it made, or the one another client made meanwhile
/// (fs/existing.rs).
pub(super) enum Created {
    New(Opened),
    Existing(Opened),
}

impl SpillwayFs {
    /// CREATE: make a regular file and open it, or open the one another client made
    /// meanwhile.
    pub(super) fn do_create(
        &self,
        req: &Request,
        parent: InodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> R<Created> {
        let make = || {
            let r = FileKind::Regular;
            self.make(req, parent, name, r, mode, 0, &[], true, umask)
        };
        let mut made = make();
        if made.as_ref().err() == Some(&Errno::EEXIST) {
            // Another client made the name since the kernel looked (fs/existing.rs).
            match self.open_existing(req, parent, name.as_bytes(), flags) {
                Ok(opened) => return Ok(Created::Existing(opened)),
                // It went again: create it after all.
                Err(e) if e == Errno::ENOENT => made = make(),
                Err(e) => return Err(e),
            }
        }
        let attr = made?;
        self.t.remember(&attr, true);
        // A new file has no xattrs: answer the kernel's pre-write capability check
        // without asking the server.
        if let Some(n) = self.t.nodes().get_mut(&attr.ino) {
            n.capability = Some((std::time::Instant::now(), None));
        }
        let (fh, f) = self.open_file(attr.ino, flags as u32, Some(attr.clone()))?;
        Ok(Created::New((attr, fh, f)))
    }

    /// Open inode `i` in this client; `opened` carries the attributes when the server
    /// already counted the open (a create that opened).
    pub(super) fn open_file(
        &self,
        i: InodeNo,
        flags: u32,
        opened: Option<Attr>,
    ) -> R<(u64, FopenFlags)> {
        let created = opened.is_some();
        // Told of other mounts' changes from before the open on (notices.rs). A file
        // just created here has no pages yet to go stale: listening from now is soon
        // enough for it.
        self.listeners.ensure(i.home());
        let attr = match opened {
            Some(a) => a,
            None => self.inst.open(i, flags).map_err(gone)?,
        };
        // The home's session now holding this open (notices.rs: opened again there if
        // the home forgets it).
        let session = self.inst.session_at(i.home()).unwrap_or(0);
        let stamp = self.stamp(&attr);
        let (keep, stale) = {
            let mut nodes = self.t.nodes();
            let node = nodes.entry(i).or_insert_with(|| Node::new(&attr));
            let dirty = node.wb.as_ref().is_some_and(|w| w.is_dirty());
            let stale = !dirty && self.stamp(&node.attr) != stamp;
            let keep = dirty || node.cached == Some(stamp);
            node.cached = Some(stamp);
            node.attr = attr.clone();
            node.opens += 1;
            node.open_session = session;
            match &node.wb {
                None => {
                    node.wb = Some(Arc::new(WriteBack::new(
                        self.inst.clone(),
                        &attr,
                        &self.tun,
                        self.grants.clone(),
                        self.lost.clone(),
                    )))
                }
                Some(wb) if stale => wb.reset_end(attr.size),
                Some(_) => {}
            }
            (keep, stale)
        };
        if stale {
            // Another client changed the file: make the kernel fetch size and times
            // again (its page cache goes too, as we do not answer KEEP_CACHE).
            if let Some(n) = self.notifier.get() {
                let _ = n.inval_inode(self.fuse_ino(i), -1, 0);
            }
        }
        let fh = self.t.new_fh();
        self.t.files().insert(fh, OpenFile { ino: i });
        let mut fl = if keep {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        if self.direct_writes && written_from_start(flags, created) {
            fl |= FopenFlags::FOPEN_DIRECT_IO;
        }
        Ok((fh, fl))
    }

    /// The version of a file its cached pages are compared by (nodes.rs, `Stamp`).
    pub(super) fn stamp(&self, a: &Attr) -> crate::nodes::Stamp {
        self.coherence.stamp(a)
    }

    /// After a flush told the home the new size: what the kernel's pages now reflect
    /// (coherence.rs).
    pub(super) fn note_flushed(&self, r: Option<ExtendSizeReply>) {
        self.coherence.note_flushed(r)
    }

    /// A close: this client's writes reach the servers, and the process's POSIX locks
    /// on the file go (locks.rs).
    pub(super) fn do_flush(&self, i: InodeNo, lock_owner: u64) -> R<()> {
        let r = match self.t.writeback(i) {
            Some(wb) => wb.flush().map(|a| self.note_flushed(a)).and_then(|()| {
                // A cache with `sync_on_close`: the close returns once the file's
                // changes are on the PFS (the namespace server knows the policy).
                if self.inst.desc.cache {
                    self.inst.cache_flush(i, flush_scope::ON_CLOSE)
                } else {
                    Ok(())
                }
            }),
            None => Ok(()),
        };
        // A process's close drops its POSIX locks on the file (locks.rs).
        let unlocked = self.locks.flush(i, lock_owner);
        r.and(unlocked)
    }

    /// This client's writes durable on the servers; without any, the inode's metadata.
    /// A cache whose `sync_to_pfs` policy is on: then the file's changes on every
    /// server are written to the PFS and synced there before the fsync returns (the
    /// namespace server knows the policy; DataWarp's definition, docs/cache.md).
    ///
    /// Then what the kernel caches of the file is checked against the home's version
    /// and dropped if another client changed it (coherence.rs): MPI's
    /// "sync-barrier-sync" (`MPI_File_sync` is fsync in ROMIO) reads what every other
    /// rank wrote and synced before the barrier.
    pub(super) fn do_fsync(&self, i: InodeNo) -> R<()> {
        let told = match self.t.writeback(i) {
            Some(wb) => wb.fsync()?,
            None => {
                self.inst.sync_meta(i)?;
                None
            }
        };
        if self.inst.desc.cache {
            self.inst.cache_flush(i, flush_scope::ON_FSYNC)?;
        }
        match told {
            // The home's version came back with the size: no round trip more.
            Some(r) => {
                self.coherence.settle(r);
                Ok(())
            }
            None => self.coherence.revalidate(i),
        }
    }

    /// The end of an open file description. The file's last release here flushes and
    /// drops its write-back buffer; the home counts one open less.
    pub(super) fn do_release(&self, fh: u64) -> R<()> {
        let Some(of) = self.t.files().remove(&fh) else {
            return Ok(());
        };
        let wb = {
            let mut nodes = self.t.nodes();
            match nodes.get_mut(&of.ino) {
                Some(n) => {
                    n.opens = n.opens.saturating_sub(1);
                    if n.opens == 0 {
                        n.wb.take()
                    } else {
                        None
                    }
                }
                None => None,
            }
        };
        let flushed = match wb {
            Some(wb) => wb.flush().map(|a| self.note_flushed(a)),
            None => Ok(()),
        };
        let released = self.inst.release(of.ino);
        {
            let mut nodes = self.t.nodes();
            if nodes
                .get(&of.ino)
                .is_some_and(|n| n.opens == 0 && n.lookups == 0)
            {
                nodes.remove(&of.ino);
            }
        }
        flushed.and(released)
    }

    /// A lock request's arguments for locks.rs.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn lock_args(
        &self,
        req: &Request,
        i: INodeNo,
        fh: FileHandle,
        owner: LockOwner,
        (start, end): (u64, u64),
        typ: i32,
        pid: u32,
    ) -> LockArgs {
        let (ino, fh, owner, tid) = (self.ino(i), fh.0, owner.0, req.pid());
        LockArgs {
            ino,
            fh,
            owner,
            start,
            end,
            typ,
            pid,
            tid,
            uid: req.uid(),
        }
    }
}

/// Whether an open is of a file about to be written from the start: write-only, or
/// read-write and made by this very open (an application writing a checkpoint, fio,
/// an archive being unpacked). Such an open goes around the page cache
/// (docs/data-plane.md, "Writes go around the page cache"). A read-write open of an
/// existing file keeps the page cache: what it reads may be read again, and through
/// the page cache it gets the kernel's readahead.
fn written_from_start(flags: u32, created: bool) -> bool {
    match flags as i32 & libc::O_ACCMODE {
        libc::O_WRONLY => true,
        libc::O_RDWR => created,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::written_from_start;

    #[test]
    fn only_opens_that_write_from_the_start_go_around_the_page_cache() {
        let f = |m: i32| m as u32;
        assert!(written_from_start(f(libc::O_WRONLY), false));
        assert!(written_from_start(
            f(libc::O_WRONLY | libc::O_APPEND),
            false
        ));
        assert!(written_from_start(f(libc::O_RDWR | libc::O_CREAT), true));
        assert!(!written_from_start(f(libc::O_RDWR), false));
        assert!(!written_from_start(f(libc::O_RDONLY), false));
        assert!(!written_from_start(f(libc::O_RDONLY | libc::O_CREAT), true));
    }
}
