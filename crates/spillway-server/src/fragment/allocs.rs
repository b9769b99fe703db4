//! Reporting allocation to the homes. `st_blocks` of a file is the disk space its
//! stripes occupy on every server of its layout; the home answers getattr and cannot
//! stat other servers' files each time. So every server tells the home of each inode
//! whose allocation changed here (a write, fill, truncate or fallocate marks it, data/
//! allocs.rs) how many bytes its stripes now occupy: one `AllocReportReq` per home,
//! batched, sent by a thread per fragment within `COALESCE` of the change. Reports
//! carry absolute values, so a lost one is made good by the next and a failed one is
//! retried; at start every stripe's inode is reported once (a restart, or a fragment
//! made by a version that did not track allocation). A fallocate or a truncation
//! reports before it answers (`report_now`), so the attributes the home gives the
//! caller right after are exact. Writes are not held up by a report: the home shows
//! at least one block for a written file until the first report arrives
//! (meta/allocs.rs, `provisional_blocks`).

use crate::data::{Changed, Span};
use crate::error::{fs, StoreResult};
use crate::fragment::Fragment;
use spillway_placement::Layout;
use spillway_types::{Errno, InodeNo, ServerIndex};
use spillway_wire::messages::{AllocReportReq, FallocateDataReq, InoBytes, SeekDataReq};
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How long the thread waits after a change for more to report together.
const COALESCE: Duration = Duration::from_millis(20);
/// Retry interval after a failed report (the home may be restarting).
const RETRY: Duration = Duration::from_secs(1);
/// Inodes per report request.
const BATCH: usize = 4096;

/// Start the fragment's reporting thread; it ends when the fragment is closed or gone.
pub(super) fn start(frag: &Arc<Fragment>) {
    if let Err(e) = frag.data.mark_all_allocs() {
        tracing::warn!(
            instance = frag.config.instance,
            "listing stripes to report: {e}"
        );
    }
    let weak = Arc::downgrade(frag);
    let bell = frag.data.alloc_bell().clone();
    let name = format!("allocs-{}", frag.config.instance);
    let spawned = std::thread::Builder::new()
        .name(name)
        .spawn(move || run(&weak, &bell));
    if let Err(e) = spawned {
        tracing::error!("cannot start the allocation reporter: {e}");
    }
}

fn run(weak: &Weak<Fragment>, bell: &crossbeam_channel::Receiver<()>) {
    loop {
        // Woken by a change, or once a second to notice the fragment closing.
        let rang = bell.recv_timeout(Duration::from_secs(1)).is_ok();
        let Some(f) = weak.upgrade() else { return };
        if f.is_closed() {
            return;
        }
        if !rang {
            continue;
        }
        std::thread::sleep(COALESCE);
        if f.report(f.data.take_alloc_changes()).is_err() {
            // What failed was marked again (the bell rang): wait before retrying.
            drop(f);
            std::thread::sleep(RETRY);
        }
    }
}

impl Fragment {
    /// Report `ino`'s allocation here to its home before returning.
    pub(crate) fn report_now(&self, ino: InodeNo) -> StoreResult<()> {
        let changed = self.data.take_alloc_change(ino);
        self.report(vec![(ino, changed)])
            .map_err(|()| fs(Errno::EIO))
    }

    /// Report before answering, after a truncation of `ino` here, so that the
    /// attributes of the SetAttr that cut it are exact. A failure leaves it to the
    /// thread (logged): the truncation itself is done.
    pub(crate) fn report_after_change(&self, ino: InodeNo) {
        if let Err(e) = self.report_now(ino) {
            tracing::debug!(%ino, "allocation report: {e}");
        }
    }

    /// Report the allocation of `inos` to their homes; what could not be reported is
    /// put back on the work list (and Err returned, to retry later).
    fn report(&self, inos: Vec<(InodeNo, Changed)>) -> Result<(), ()> {
        let mut by_home: BTreeMap<ServerIndex, Vec<InoBytes>> = BTreeMap::new();
        for (ino, changed) in inos {
            let bytes = self.data.allocated(ino, &changed);
            by_home
                .entry(ino.home())
                .or_default()
                .push(InoBytes { ino, bytes });
        }
        let me = self.index();
        let mut ok = true;
        for (home, entries) in by_home {
            for batch in entries.chunks(BATCH) {
                let sent = if home == me {
                    let list: Vec<(InodeNo, u64)> =
                        batch.iter().map(|e| (e.ino, e.bytes)).collect();
                    self.meta
                        .set_allocs(me.0, &list)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                } else {
                    let req = AllocReportReq {
                        server: me.0,
                        entries: batch.to_vec(),
                    };
                    match self.purge_peers.get(home) {
                        Some(ep) => ep.call(&req).map(|_| ()).map_err(|e| e.to_string()),
                        None => Err("no such server".into()),
                    }
                };
                if let Err(e) = sent {
                    tracing::debug!(instance = self.config.instance, %home, "allocation report failed: {e}");
                    self.data.remark_allocs(batch.iter().map(|e| e.ino));
                    ok = false;
                }
            }
        }
        if ok {
            Ok(())
        } else {
            Err(())
        }
    }
}

impl Fragment {
    /// FallocateData: the range on this server's stripes of the file, then (when
    /// something changed) this server's new allocation of it to its home, so that
    /// the attributes the client asks the home for next are exact.
    pub(crate) fn fallocate_data(&self, r: &FallocateDataReq) -> StoreResult<()> {
        let layout = self.layout(r.ino, r.stripe_size, r.stripe_width);
        let span = self.span(r.ino, &layout, r.offset, r.len);
        let done = self.data.fallocate(&span, r.mode, r.check);
        if !r.check {
            if let Err(e) = self.report_now(r.ino) {
                // Left on the work list: the thread reports it later.
                tracing::debug!(ino = %r.ino, "allocation report after fallocate: {e}");
            }
        }
        done
    }

    /// `[offset, offset+len)` of `ino` on this server's stripes.
    fn span<'l>(&self, ino: InodeNo, layout: &'l Layout, offset: u64, len: u64) -> Span<'l> {
        Span {
            ino,
            layout,
            me: self.index(),
            offset,
            len,
        }
    }

    /// SeekData over this server's stripes of the file.
    pub(crate) fn seek_data(&self, r: &SeekDataReq) -> StoreResult<Option<u64>> {
        let layout = self.layout(r.ino, r.stripe_size, r.stripe_width);
        // Empty when `end` is not past `offset`: nothing is found.
        let span = self.span(r.ino, &layout, r.offset, r.end.saturating_sub(r.offset));
        self.data.seek(&span, r.hole)
    }

    /// AllocReport from server `r.server` about inodes homed here.
    pub(crate) fn record_allocs(&self, r: &AllocReportReq) -> StoreResult<()> {
        if r.server >= self.config.count() {
            return Err(fs(Errno::EINVAL));
        }
        let list: Vec<(InodeNo, u64)> = r.entries.iter().map(|e| (e.ino, e.bytes)).collect();
        self.meta.set_allocs(r.server, &list).map(|_| ())
    }
}
