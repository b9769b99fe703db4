//! Group commit: a file copied waits in `unsynced` until one thread has every server
//! of the instance sync what it wrote (`StageSyncReq`) for all files copied since its
//! last round; then stage-out temporaries are renamed into place and their directories
//! synced, and only then do the files count as complete.

use super::{Copied, Ctx, CANCELLED};
use crate::stage::{ns, temp, Failure};
use spillway_wire::{PendingCall, StageSyncReq};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

impl Ctx<'_> {
    /// A file is copied: it counts complete once the next group sync is done (and, for
    /// a stage-out, its temporary is renamed into place).
    pub(super) fn copied_file(&self, dw: String, bytes: u64, place: Option<(String, String)>) {
        self.unsynced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Copied { dw, bytes, place });
        self.copied.notify_one();
    }

    /// Sync what has been copied, again and again, until the workers are done and
    /// nothing is left.
    pub(super) fn syncer(&self) {
        loop {
            let batch = {
                let mut u = self.unsynced.lock().unwrap_or_else(|e| e.into_inner());
                while u.is_empty() && !self.workers_done.load(Ordering::SeqCst) {
                    u = self
                        .copied
                        .wait_timeout(u, std::time::Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                if u.is_empty() {
                    return;
                }
                std::mem::take(&mut *u)
            };
            self.sync_batch(batch);
        }
    }

    /// Make the copied files durable on every server, put stage-outs in place (rename,
    /// then the directories synced), then count them complete.
    pub(super) fn sync_batch(&self, batch: Vec<Copied>) {
        let req = StageSyncReq {
            direction: self.req.direction,
            ticket: self.req.ticket.clone(),
        };
        let calls: Vec<_> = (0..self.inst.count())
            .filter_map(|i| self.inst.server(spillway_types::ServerIndex(i)).ok())
            .map(|s| s.start(&req, &[]))
            .collect();
        let err = calls
            .into_iter()
            .map(PendingCall::wait)
            .find_map(Result::err);
        if let Some(e) = err {
            for c in batch {
                let f = ns::errno_failure(e, &c.dw, "making the copy durable");
                if let Some((tmp, _)) = &c.place {
                    self.discard(tmp);
                }
                self.run.file_failed(c.dw, &f);
            }
            return;
        }
        for (c, r) in self.put_in_place(&batch).into_iter() {
            match r {
                Ok(()) => self.run.file_done(c.dw, c.bytes),
                // A stage terminated before its files were in place: not complete,
                // and their temporaries go with the sweep.
                Err(f) if f.errno == CANCELLED => {}
                Err(f) => self.run.file_failed(c.dw, &f),
            }
        }
    }

    /// Rename each durable stage-out temporary over its destination, as the owner,
    /// then sync each directory renamed into once. Stage-ins (no temporary) are in
    /// place already.
    pub(super) fn put_in_place(&self, batch: &[Copied]) -> Vec<(Copied, Result<(), Failure>)> {
        if batch.iter().all(|c| c.place.is_none()) {
            return batch.iter().map(|c| (c.clone(), Ok(()))).collect();
        }
        let done = self.pfs.as_owner(|| {
            let mut out: Vec<(Copied, Result<(), Failure>)> = Vec::new();
            // Per directory: one destination in it (to reach it by) and the files.
            let mut dirs: BTreeMap<String, (String, Vec<usize>)> = BTreeMap::new();
            for c in batch {
                let Some((tmp, dst)) = &c.place else {
                    out.push((c.clone(), Ok(())));
                    continue;
                };
                if self.run.cancelled() {
                    out.push((c.clone(), Err(Failure::new(CANCELLED, "terminated"))));
                    continue;
                }
                let r = self.pfs.rename_into_place(tmp, dst);
                match &r {
                    Ok(()) => {
                        self.temps().remove(tmp);
                        let (dir, _) = temp::split(dst);
                        dirs.entry(dir.to_string())
                            .or_insert_with(|| (dst.clone(), Vec::new()))
                            .1
                            .push(out.len());
                    }
                    Err(_) => self.discard(tmp),
                }
                out.push((c.clone(), r));
            }
            for (_, (dst, idx)) in dirs {
                if let Err(f) = self.pfs.sync_parent(&dst) {
                    for i in idx {
                        let dw = out[i].0.dw.clone();
                        out[i].1 = Err(Failure::new(
                            f.errno,
                            format!("{dw}: renamed into place, but {}", f.message),
                        ));
                    }
                }
            }
            out
        });
        match done {
            Ok(v) => v,
            Err(f) => batch.iter().map(|c| (c.clone(), Err(f.clone()))).collect(),
        }
    }
}
