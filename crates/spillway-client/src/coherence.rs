//! What this client's kernel caches of a file (its pages and size) against what other
//! clients did to it (docs/data-plane.md, "Consistency").
//!
//! Each file's node records the version (`Stamp`: size, mtime, and ctime on a cache)
//! its cached pages reflect. This client's own changes carry it forward exactly: the
//! home answers each size update with the version the file had just before it
//! (`ExtendSizeReply`), and only when that is the version recorded here did nobody
//! else change the file in between. The record is checked where POSIX and MPI promise
//! to see other clients' writes, and the pages dropped when it no longer holds:
//! * at open (close-to-open, fs/files.rs);
//! * when a lock is granted (an unlock first pushes this client's writes of the file
//!   to the servers), so a read-modify-write under a lock is exact from any number of
//!   nodes, as NFS gives it;
//! * at fsync, after pushing this client's writes;
//! * when the home tells that another mount changed a file open here (notices.rs):
//!   before that mount's close, fsync or unlock returns, so MPI's "sync-barrier-sync"
//!   holds even where the reading rank's own sync reaches no file system.

use crate::nodes::{Stamp, Tables};
use crate::root::MountRoot;
use fuser::Notifier;
use spillway_stubs::Instance;
use spillway_types::{Attr, Errno, InodeNo, ServerIndex, Timespec};
use spillway_wire::messages::ExtendSizeReply;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

pub(crate) struct Coherence {
    t: Arc<Tables>,
    inst: Arc<Instance>,
    notifier: Arc<OnceLock<Notifier>>,
    root: MountRoot,
}

impl Coherence {
    pub(crate) fn new(
        t: Arc<Tables>,
        inst: Arc<Instance>,
        notifier: Arc<OnceLock<Notifier>>,
        root: MountRoot,
    ) -> Coherence {
        Coherence {
            t,
            inst,
            notifier,
            root,
        }
    }

    /// The version of a file its cached pages are compared by (nodes.rs, `Stamp`).
    pub(crate) fn stamp(&self, a: &Attr) -> Stamp {
        self.stamp_of(a.size, a.mtime, a.ctime)
    }

    fn stamp_of(&self, size: u64, mtime: Timespec, ctime: Timespec) -> Stamp {
        let ctime = if self.inst.desc.cache {
            ctime
        } else {
            Timespec::default()
        };
        (size, mtime, ctime)
    }

    /// After this client told the home of its writes: the kernel's pages still
    /// reflect the file if they did just before (nobody else changed it in between);
    /// otherwise they are not known to, and the next check drops them.
    pub(crate) fn note_flushed(&self, r: Option<ExtendSizeReply>) {
        let Some(r) = r else { return };
        let prior = self.stamp_of(r.prior_size, r.prior_mtime, r.prior_ctime);
        let now = self.stamp(&r.attr);
        let mut nodes = self.t.nodes();
        if let Some(n) = nodes.get_mut(&r.attr.ino) {
            n.cached = (n.cached == Some(prior)).then_some(now);
            // A notice of a later change may have been acted on while this reply was
            // on its way: the attributes never go back to an older version.
            if !older(&r.attr, &n.attr) {
                n.attr = r.attr;
                n.fetched = Some(Instant::now());
            }
        }
    }

    /// A change this client made and the home answered with `a` (a setattr): the
    /// kernel's pages still hold the file's data.
    pub(crate) fn note_own(&self, a: &Attr) {
        let mut nodes = self.t.nodes();
        if let Some(n) = nodes.get_mut(&a.ino) {
            if !older(a, &n.attr) {
                n.cached = Some(self.stamp(a));
                n.attr = a.clone();
                n.fetched = Some(Instant::now());
            }
        }
    }

    /// This client's buffered writes of `i` to the servers, the home told.
    pub(crate) fn push(&self, i: InodeNo) -> Result<(), Errno> {
        if let Some(wb) = self.t.writeback(i) {
            self.note_flushed(wb.flush()?);
        }
        Ok(())
    }

    /// Another client may have changed `i` (a lock was just granted; an fsync): push
    /// this client's own writes (the kernel's pages are all that serve them until
    /// they are on the servers), then drop what the kernel caches of the file, pages
    /// and size, unless the home's version is the one those pages reflect.
    pub(crate) fn revalidate(&self, i: InodeNo) -> Result<(), Errno> {
        self.push(i)?;
        let attr = self.inst.getattr(i)?;
        self.adopt(attr);
        Ok(())
    }

    /// `revalidate` right after a push that told the home: its reply carries the
    /// home's version, so no round trip more.
    pub(crate) fn settle(&self, r: ExtendSizeReply) {
        let attr = r.attr.clone();
        self.note_flushed(Some(r));
        self.adopt(attr);
    }

    /// The home's attributes `attr` of a file, just fetched or told: unless they are
    /// the version the kernel's pages reflect, the pages and attributes go. Either way
    /// the pages reflect that version from now on. Attributes older than the ones
    /// this client holds (a notice overtaken by the reply to this client's own later
    /// change) stand for those.
    fn adopt(&self, attr: Attr) {
        let i = attr.ino;
        let stale = {
            let mut nodes = self.t.nodes();
            let Some(n) = nodes.get_mut(&i) else {
                // Not open here and nothing cached by this client.
                return;
            };
            let attr = if older(&attr, &n.attr) {
                n.attr.clone()
            } else {
                attr
            };
            let stamp = self.stamp(&attr);
            let stale = n.cached != Some(stamp);
            if stale {
                if let Some(wb) = &n.wb {
                    wb.reset_end(attr.size);
                }
            }
            n.cached = Some(stamp);
            n.attr = attr;
            n.fetched = Some(Instant::now());
            stale
        };
        if stale {
            self.drop_cached(i);
        }
    }

    /// The home told that another mount changed a file this mount holds open, to
    /// `attr` (notices.rs): unless the kernel's pages reflect that version, they go.
    pub(crate) fn changed_elsewhere(&self, attr: Attr) {
        self.adopt(attr);
    }

    /// Every file open here that server `s` is the home of: no longer known to be as
    /// the kernel caches it (a watch of `s` broke, so changes may have gone untold).
    pub(crate) fn drop_all_homed_on(&self, s: ServerIndex) {
        let open: Vec<InodeNo> = {
            let mut nodes = self.t.nodes();
            nodes
                .iter_mut()
                .filter(|(i, n)| i.home() == s && n.opens > 0)
                .map(|(i, n)| {
                    n.cached = None;
                    n.fetched = None;
                    *i
                })
                .collect()
        };
        for i in open {
            self.drop_cached(i);
        }
    }

    /// The files open here that server `s` is the home of whose opens its session
    /// `session` does not hold (it is a newer one: the server forgot them), with how
    /// many opens each.
    pub(crate) fn opens_forgotten_by(&self, s: ServerIndex, session: u64) -> Vec<(InodeNo, u32)> {
        self.t
            .nodes()
            .iter()
            .filter(|(i, n)| i.home() == s && n.opens > 0 && n.open_session != session)
            .map(|(i, n)| (*i, n.opens))
            .collect()
    }

    /// The opens of `i` here are held by the home's session `session` again.
    pub(crate) fn opens_held_by(&self, i: InodeNo, session: u64) {
        if let Some(n) = self.t.nodes().get_mut(&i) {
            n.open_session = session;
        }
    }

    /// The kernel's pages and attributes of `i` go: the next read asks the servers,
    /// the next stat the home.
    pub(crate) fn drop_cached(&self, i: InodeNo) {
        if let Some(n) = self.notifier.get() {
            if let Err(e) = n.inval_inode(self.root.fuse(i), 0, 0) {
                tracing::debug!(%i, "invalidation: {e}");
            }
        }
    }
}

/// Whether attributes `a` of a file are of an older version than `b`: the home sets
/// ctime to its clock at every change, so the later change has the later ctime.
fn older(a: &Attr, b: &Attr) -> bool {
    (a.ctime, a.mtime) < (b.ctime, b.mtime)
}
