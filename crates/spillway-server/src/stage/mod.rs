//! The stage engine: copies between the PFS and this server's instances
//! (docs/staging.md).
//!
//! The owner's uid, gid and groups are worn by one thread at a time
//! (`spillway_types::identity`).
//!
//! * `pfs`         — PFS paths: only under the configured roots, only as the owner.
//! * `ns`          — the instance's namespace as the owner may see it (permission checks).
//! * `copy`        — one server's share of one file: its stripes to or from the PFS.
//! * `files`       — whole small files one server stages alone, many per request.
//! * `coordinator` — a whole stage: enumerate, create names, hand files to the servers
//!   holding their stripes, group-commit metadata, report per file.
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
pub mod copy;
pub mod files;
mod leftovers;
mod ns;
pub mod pfs;
mod temp;
mod ticket;

use crate::error::{fs, StoreResult};
use crate::registry::Registry;
use spillway_types::{Attr, Errno, InodeNo, Timespec, Tunables};
use spillway_wire::{
    setattr, stage_state, SetAttrReq, StageCancelReq, StageFileEvent, StageForgetReq,
    StageProgressReply, StageProgressReq, StageStartReq,
};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

pub use leftovers::clean_at_start as clean_leftovers;

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
pub struct Failure {
    pub errno: i32,
    pub message: String,
}

impl Failure {
    pub fn new(errno: i32, message: impl Into<String>) -> Failure {
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
/// Most events in one progress reply (bounded frames; the manager asks again).
const MAX_EVENTS_PER_REPLY: usize = 4096;

/// What the coordinator knows of a stage, read by progress requests.
#[derive(Default)]
struct Progress {
    state: u8,
    enumerated: bool,
    files_total: u64,
    files_done: u64,
    files_failed: u64,
    bytes_total: u64,
    bytes_done: u64,
    /// Events from number `base` on; those before it were acknowledged and dropped.
    events: VecDeque<StageFileEvent>,
    base: u64,
    error: String,
}

/// One stage this server coordinates.
pub struct Run {
    pub stage: u64,
    progress: Mutex<Progress>,
    news: Condvar,
    cancel: AtomicBool,
}

impl Run {
    fn new(stage: u64) -> Run {
        Run {
            stage,
            progress: Mutex::new(Progress {
                state: stage_state::RUNNING,
                ..Progress::default()
            }),
            news: Condvar::new(),
            cancel: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// The file list is known.
    fn enumerated(&self, files: u64, bytes: u64, pending: Vec<String>) {
        let mut p = self.lock();
        p.enumerated = true;
        p.files_total = files;
        p.bytes_total = bytes;
        p.events
            .extend(pending.into_iter().map(|path| StageFileEvent {
                path,
                state: spillway_wire::file_state::PENDING,
                errno: 0,
                message: String::new(),
                bytes: 0,
            }));
        drop(p);
        self.news.notify_all();
    }

    /// Bytes copied that are not yet part of a completed file (progress of big files).
    fn add_bytes(&self, n: u64) {
        self.lock().bytes_done += n;
        self.news.notify_all();
    }

    fn file_done(&self, path: String, bytes: u64) {
        let mut p = self.lock();
        p.files_done += 1;
        p.events.push_back(StageFileEvent {
            path,
            state: spillway_wire::file_state::COMPLETE,
            errno: 0,
            message: String::new(),
            bytes,
        });
        drop(p);
        self.news.notify_all();
    }

    fn file_failed(&self, path: String, f: &Failure) {
        tracing::info!(stage = self.stage, "{}", f.message);
        let mut p = self.lock();
        p.files_failed += 1;
        if p.error.is_empty() {
            p.error = f.message.clone();
        }
        p.events.push_back(StageFileEvent {
            path,
            state: spillway_wire::file_state::FAILED,
            errno: f.errno,
            message: f.message.clone(),
            bytes: 0,
        });
        drop(p);
        self.news.notify_all();
    }

    /// The stage as a whole failed before or beside its files.
    fn fail(&self, message: &str) {
        let mut p = self.lock();
        if p.error.is_empty() {
            p.error = message.to_string();
        }
    }

    fn finish(&self) {
        let mut p = self.lock();
        p.state = if self.cancelled() {
            stage_state::TERMINATED
        } else if !p.error.is_empty() || p.files_failed > 0 {
            stage_state::FAILED
        } else {
            stage_state::COMPLETE
        };
        tracing::info!(
            stage = self.stage,
            state = p.state,
            files = p.files_done,
            failed = p.files_failed,
            bytes = p.bytes_done,
            "stage ended"
        );
        drop(p);
        self.news.notify_all();
    }

    fn report(&self, cursor: u64, wait: Duration) -> StageProgressReply {
        let mut p = self.lock();
        // Everything before the cursor has reached the manager: drop it.
        while p.base < cursor && !p.events.is_empty() {
            p.events.pop_front();
            p.base += 1;
        }
        let has_news = |p: &Progress| {
            p.state != stage_state::RUNNING || p.base + (p.events.len() as u64) > cursor
        };
        if !has_news(&p) && !wait.is_zero() {
            let (g, _) = self
                .news
                .wait_timeout_while(p, wait, |p| !has_news(p))
                .unwrap_or_else(|e| e.into_inner());
            p = g;
        }
        let skip = cursor.saturating_sub(p.base) as usize;
        let events: Vec<StageFileEvent> = p
            .events
            .iter()
            .skip(skip)
            .take(MAX_EVENTS_PER_REPLY)
            .cloned()
            .collect();
        let next = p.base + skip as u64 + events.len() as u64;
        // The end is only reported once every event has been handed out.
        let all_out = next == p.base + p.events.len() as u64;
        StageProgressReply {
            state: if all_out {
                p.state
            } else {
                stage_state::RUNNING
            },
            enumerated: p.enumerated,
            files_total: p.files_total,
            files_done: p.files_done,
            files_failed: p.files_failed,
            bytes_total: p.bytes_total,
            bytes_done: p.bytes_done,
            events,
            cursor: next,
            error: p.error.clone(),
        }
    }
}

/// The stages this server coordinates, by stage id.
pub struct Stages {
    runs: Mutex<HashMap<u64, Arc<Run>>>,
    tunables: Tunables,
}

impl Stages {
    pub fn new(tunables: Tunables) -> Stages {
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
    pub fn start(&self, registry: &Registry, req: StageStartReq) -> StoreResult<()> {
        let fragment = registry
            .get(req.instance)
            .filter(|f| !f.is_closed())
            .ok_or(fs(Errno::ENOENT))?;
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
            let (pfs, inside) = if req.direction == spillway_wire::stage_dir::IN {
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

    pub fn progress(&self, req: &StageProgressReq) -> StageProgressReply {
        let run = self.runs().get(&req.stage).cloned();
        match run {
            Some(run) => run.report(
                req.cursor,
                Duration::from_millis(u64::from(req.wait_ms)).min(MAX_PROGRESS_WAIT),
            ),
            None => StageProgressReply {
                state: stage_state::UNKNOWN,
                enumerated: false,
                files_total: 0,
                files_done: 0,
                files_failed: 0,
                bytes_total: 0,
                bytes_done: 0,
                events: Vec::new(),
                cursor: req.cursor,
                error: String::new(),
            },
        }
    }

    pub fn cancel(&self, req: &StageCancelReq) -> StoreResult<()> {
        let run = self.runs().get(&req.stage).cloned();
        match run {
            Some(run) => {
                run.cancel.store(true, Ordering::SeqCst);
                run.news.notify_all();
                Ok(())
            }
            None => Err(fs(Errno::ENOENT)),
        }
    }

    /// Forget a finished stage (a running one is refused with EBUSY).
    pub fn forget(&self, req: &StageForgetReq) -> StoreResult<()> {
        let mut runs = self.runs();
        match runs.get(&req.stage) {
            None => Ok(()),
            Some(run) if run.lock().state == stage_state::RUNNING => Err(fs(Errno::EBUSY)),
            Some(_) => {
                runs.remove(&req.stage);
                Ok(())
            }
        }
    }
}
