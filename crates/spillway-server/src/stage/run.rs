//! One stage this server coordinates, as progress requests see it: the stage's state
//! and counters, the file events the manager has not acknowledged yet, and the flag
//! that terminates it. The coordinator (coordinator/) records into it; `Stages`
//! (mod.rs) answers StageProgress, StageCancel and StageForget from it.

use super::Failure;
use spillway_wire::{stage_state, FileState, StageFileEvent, StageProgressReply};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Most events in one progress reply (bounded frames; the manager asks again).
const MAX_EVENTS_PER_REPLY: usize = 4096;

/// The reply about a stage of which nothing is known yet: in `state`, no files, no
/// bytes, no events, asked from `cursor`.
pub(super) fn empty_report(state: u8, cursor: u64) -> StageProgressReply {
    StageProgressReply {
        state,
        enumerated: false,
        files_total: 0,
        files_done: 0,
        files_failed: 0,
        bytes_total: 0,
        bytes_done: 0,
        events: Vec::new(),
        cursor,
        error: String::new(),
    }
}

/// What the coordinator knows of a stage, read by progress requests.
struct Progress {
    /// The stage as a whole, as a reply reports it: state, counters, first error (its
    /// `events` and `cursor` stay empty: the events are kept below).
    summary: StageProgressReply,
    /// Events from number `base` on; those before it were acknowledged and dropped.
    events: VecDeque<StageFileEvent>,
    base: u64,
}

/// One stage this server coordinates.
pub(crate) struct Run {
    pub stage: u64,
    progress: Mutex<Progress>,
    news: Condvar,
    cancel: AtomicBool,
}

impl Run {
    pub(super) fn new(stage: u64) -> Run {
        Run {
            stage,
            progress: Mutex::new(Progress {
                summary: empty_report(stage_state::RUNNING, 0),
                events: VecDeque::new(),
                base: 0,
            }),
            news: Condvar::new(),
            cancel: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// Terminate the stage: no new file is started (StageCancel).
    pub(super) fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.news.notify_all();
    }

    /// The stage has not ended yet.
    pub(super) fn running(&self) -> bool {
        self.lock().summary.state == stage_state::RUNNING
    }

    /// The file list is known.
    pub(super) fn enumerated(&self, files: u64, bytes: u64, pending: Vec<String>) {
        let mut p = self.lock();
        p.summary.enumerated = true;
        p.summary.files_total = files;
        p.summary.bytes_total = bytes;
        p.events.extend(
            pending
                .into_iter()
                .map(|path| StageFileEvent::new(path, FileState::Pending, 0, String::new(), 0)),
        );
        drop(p);
        self.news.notify_all();
    }

    /// Bytes copied that are not yet part of a completed file (progress of big files).
    pub(super) fn add_bytes(&self, n: u64) {
        self.lock().summary.bytes_done += n;
        self.news.notify_all();
    }

    pub(super) fn file_done(&self, path: String, bytes: u64) {
        let mut p = self.lock();
        p.summary.files_done += 1;
        p.events.push_back(StageFileEvent::new(
            path,
            FileState::Complete,
            0,
            String::new(),
            bytes,
        ));
        drop(p);
        self.news.notify_all();
    }

    pub(super) fn file_failed(&self, path: String, f: &Failure) {
        tracing::info!(stage = self.stage, "{}", f.message);
        let mut p = self.lock();
        p.summary.files_failed += 1;
        if p.summary.error.is_empty() {
            p.summary.error = f.message.clone();
        }
        p.events.push_back(StageFileEvent::new(
            path,
            FileState::Failed,
            f.errno,
            f.message.clone(),
            0,
        ));
        drop(p);
        self.news.notify_all();
    }

    /// The stage as a whole failed before or beside its files.
    pub(super) fn fail(&self, message: &str) {
        let mut p = self.lock();
        if p.summary.error.is_empty() {
            p.summary.error = message.to_string();
        }
    }

    pub(super) fn finish(&self) {
        let mut p = self.lock();
        let s = &mut p.summary;
        s.state = if self.cancelled() {
            stage_state::TERMINATED
        } else if !s.error.is_empty() || s.files_failed > 0 {
            stage_state::FAILED
        } else {
            stage_state::COMPLETE
        };
        tracing::info!(
            stage = self.stage,
            state = s.state,
            files = s.files_done,
            failed = s.files_failed,
            bytes = s.bytes_done,
            "stage ended"
        );
        drop(p);
        self.news.notify_all();
    }

    pub(super) fn report(&self, cursor: u64, wait: Duration) -> StageProgressReply {
        let mut p = self.lock();
        // Everything before the cursor has reached the manager: drop it.
        while p.base < cursor && !p.events.is_empty() {
            p.events.pop_front();
            p.base += 1;
        }
        let has_news = |p: &Progress| {
            p.summary.state != stage_state::RUNNING || p.base + (p.events.len() as u64) > cursor
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
                p.summary.state
            } else {
                stage_state::RUNNING
            },
            events,
            cursor: next,
            ..p.summary.clone()
        }
    }
}
