//! The stage engine: copies between the PFS and this server's instances
//! (docs/staging.md).
//!
//! The owner's uid, gid and groups are worn by one thread at a time
//! (`spillway_types::identity`).
//!
//! * `pfs`         — PFS paths: only under the configured roots, only as the owner
//!   (`openat2(RESOLVE_BENEATH)`).
//! * `ns`          — the instance's namespace as the owner may see it (permission checks).
//! * `copy`        — one server's share of one file: its stripes to or from the PFS.
//! * `files`       — whole small files one server stages alone, many per request.
//! * `coordinator` — a whole stage (a directory of its parts): enumerate, create names,
//!   hand files to the servers holding their stripes, group-commit metadata, report per
//!   file.
//! * `run`         — one stage as progress requests see it: state, counters, events.
//! * `leftovers`   — a journal of a stage-out's temporaries, which a restarted server
//!   removes.
//! * `temp`        — stage-out temporaries: written beside the destination, renamed
//!   into place once complete and durable.
//! * `ticket`      — the stage ticket the manager signed: the only source of a stage's
//!   uid and PFS paths, checked on every stage request.
//!
//! The manager starts a stage on one server of the instance (the coordinator) and
//! follows it with `StageProgress`; what this module keeps is in memory only, so a
//! restarted server has forgotten its stages and the manager fails them loudly.

mod coordinator;
pub(crate) mod copy;
pub(crate) mod files;
mod leftovers;
mod ns;
pub(crate) mod pfs;
mod run;
mod temp;
mod ticket;

use crate::error::{fs, StoreResult};
use crate::registry::Registry;
use spillway_types::{Attr, Errno, InodeNo, Timespec, Tunables};
use spillway_wire::{
    setattr, stage_state, SetAttrReq, StageCancelReq, StageDir, StageForgetReq, StageProgressReply,
    StageProgressReq, StageStartReq,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub(crate) use leftovers::clean_at_start as clean_leftovers;
pub(crate) use run::Run;

/// The SetAttr that gives a staged-in file the size and times its source had: the size
/// without cutting data (the stripes were just written), atime and mtime kept.
fn staged_size_and_times(ino: InodeNo, st: &pfs::PfsStat) -> SetAttrReq {
    let ts = |t: (i64, u32)| Timespec {
        sec: t.0,
        nsec: t.1,
    };
    SetAttrReq {
        valid: setattr::SIZE_WRITTEN | setattr::ATIME | setattr::MTIME,
        size: st.size,
        atime: ts(st.atime),
        mtime: ts(st.mtime),
        ..SetAttrReq::of(ino)
    }
}

/// The SetAttr that empties an existing file a stage-in replaces, giving it the
/// source's mode too when the file is the stage owner's (or the owner is root), as
/// `open(O_TRUNC)` and `chmod` would allow.
fn replacing(a: &Attr, id: &spillway_types::identity::Identity, mode: u32) -> SetAttrReq {
    let mut valid = setattr::SIZE;
    if a.uid == id.uid || id.uid == 0 {
        valid |= setattr::MODE;
    }
    SetAttrReq {
        valid,
        mode: mode & 0o7777,
        ..SetAttrReq::of(a.ino)
    }
}

/// Why a file (or a whole stage) failed: an errno for the caller and a sentence for
/// the person reading it, naming the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    pub errno: i32,
    pub message: String,
}

impl Failure {
    pub(crate) fn new(errno: i32, message: impl Into<String>) -> Failure {
        Failure {
            errno,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Longest a progress request waits for news.
const MAX_PROGRESS_WAIT: Duration = Duration::from_secs(10);

/// The stages this server coordinates, by stage id.
pub(crate) struct Stages {
    runs: Mutex<HashMap<u64, Arc<Run>>>,
    tunables: Tunables,
}

impl Stages {
    pub(crate) fn new(tunables: Tunables) -> Stages {
        Stages {
            runs: Mutex::new(HashMap::new()),
            tunables,
        }
    }

    fn runs(&self) -> MutexGuard<'_, HashMap<u64, Arc<Run>>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// StageStart: the instance must have a fragment here and the ticket must be this
    /// stage's, covering every path the request names; a known stage id is a no-op.
    pub(crate) fn start(&self, registry: &Registry, req: StageStartReq) -> StoreResult<()> {
        let fragment = registry
            .get(req.instance)
            .filter(|f| !f.is_closed())
            .ok_or(fs(Errno::ENOENT))?;
        // A cache instance's data moves on demand (docs/cache.md): never staged.
        if fragment.cache().is_some() {
            return Err(fs(Errno::EOPNOTSUPP));
        }
        if req.pairs.is_empty() {
            return Err(fs(Errno::EINVAL));
        }
        let grant = ticket::check(
            &fragment,
            &req.ticket,
            Some(req.stage),
            req.direction,
            "StageStart",
        )
        .map_err(|f| fs(Errno(f.errno)))?;
        for p in &req.pairs {
            let (pfs, inside) = if req.direction == StageDir::In {
                (&p.source, &p.destination)
            } else {
                (&p.destination, &p.source)
            };
            if !grant.ticket.covers_pfs(pfs) || !grant.ticket.covers_instance(inside) {
                tracing::warn!(
                    stage = req.stage,
                    instance = req.instance,
                    "StageStart refused: {pfs} or {inside} is not covered by the stage's ticket"
                );
                return Err(fs(Errno::EACCES));
            }
        }
        let mut runs = self.runs();
        if runs.contains_key(&req.stage) {
            return Ok(());
        }
        let run = Arc::new(Run::new(req.stage));
        let tunables = self.tunables.clone();
        let r = run.clone();
        std::thread::Builder::new()
            .name(format!("stage-{}", req.stage))
            .spawn(move || coordinator::run(&r, &fragment, &req, grant, &tunables))
            .map_err(|e| {
                tracing::error!("cannot start a stage thread: {e}");
                fs(Errno(libc::EAGAIN))
            })?;
        runs.insert(run.stage, run);
        Ok(())
    }

    pub(crate) fn progress(&self, req: &StageProgressReq) -> StageProgressReply {
        let run = self.runs().get(&req.stage).cloned();
        match run {
            Some(run) => run.report(
                req.cursor,
                Duration::from_millis(u64::from(req.wait_ms)).min(MAX_PROGRESS_WAIT),
            ),
            None => run::empty_report(stage_state::UNKNOWN, req.cursor),
        }
    }

    pub(crate) fn cancel(&self, req: &StageCancelReq) -> StoreResult<()> {
        let run = self.runs().get(&req.stage).cloned();
        match run {
            Some(run) => {
                run.cancel();
                Ok(())
            }
            None => Err(fs(Errno::ENOENT)),
        }
    }

    /// Forget a finished stage (a running one is refused with EBUSY).
    pub(crate) fn forget(&self, req: &StageForgetReq) -> StoreResult<()> {
        let mut runs = self.runs();
        match runs.get(&req.stage) {
            None => Ok(()),
            Some(run) if run.running() => Err(fs(Errno::EBUSY)),
            Some(_) => {
                runs.remove(&req.stage);
                Ok(())
            }
        }
    }
}
