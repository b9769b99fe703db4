//! Stage-out temporaries as the coordinator hands them out (temp.rs names them): each
//! noted in memory and in the journal (leftovers.rs) before anything may create it,
//! removed when its file will not be put in place, and swept at the stage's end.

use super::Ctx;
use crate::stage::temp;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

impl Ctx<'_> {
    /// A new temporary name beside the PFS destination `dst`, noted (in memory and in
    /// the journal) before anything may create it.
    pub(super) fn temp_for(&self, dst: &str) -> String {
        let n = self.next_temp.fetch_add(1, Ordering::Relaxed);
        let tmp = temp::path(dst, self.req.stage, n);
        if let Some(j) = &self.journal {
            j.add(&tmp);
        }
        self.temps().insert(tmp.clone());
        tmp
    }

    pub(super) fn temps(&self) -> MutexGuard<'_, HashSet<String>> {
        self.temps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remove a temporary that will not be put in place (its file failed, or the
    /// stage ends first). A removal that fails is logged: the name says what it is.
    pub(super) fn discard(&self, tmp: &str) {
        if let Err(f) = self.pfs.remove_temporary(tmp) {
            tracing::warn!(stage = self.req.stage, "{}", f.message);
        }
        self.temps().remove(tmp);
    }

    /// At the stage's end: remove every temporary still out (none after a complete
    /// stage-out).
    pub(super) fn sweep(&self) {
        let left: Vec<String> = self.temps().drain().collect();
        if left.is_empty() {
            return;
        }
        let r = self.pfs.as_owner(|| {
            for tmp in &left {
                if let Err(f) = self.pfs.remove_temporary(tmp) {
                    tracing::warn!(stage = self.req.stage, "{}", f.message);
                }
            }
        });
        if let Err(f) = r {
            tracing::warn!(stage = self.req.stage, "{}", f.message);
        }
        tracing::info!(
            stage = self.req.stage,
            "removed {} temporaries of files not put in place",
            left.len()
        );
    }
}
