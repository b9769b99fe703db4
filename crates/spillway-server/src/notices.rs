//! Telling mounts of the changes other mounts made to files they hold open
//! (docs/data-plane.md, "Consistency"; docs/wire-protocol.md, "Notices").
//!
//! A client mount names itself in its hello (`HelloReq::mount`, random) and keeps a
//! watching connection to each server it holds files open on (`WatchReq`). The home of
//! a file counts here which mounts hold it open. When a mount's writes reach the home
//! (ExtendSize) or it cuts or extends the file (SetAttr), every other mount holding the
//! file open is sent a `ChangedNotice`, and the writer's close, fsync or unlock returns
//! only once each has answered that its kernel no longer caches the old pages
//! (`NoticeDoneReq`), or `notice_wait` passed. That is what makes MPI's
//! "sync-barrier-sync" hold across nodes: a reading rank's own sync may reach no file
//! system at all (ROMIO skips it when the rank wrote nothing).
//!
//! A mount that lets the wait pass (stopped, partitioned, or hostile) is not waited
//! for again until it answers a notice within the wait: one stuck node costs each
//! writer at most one wait, not one per change.

use spillway_types::{Attr, InodeNo};
use spillway_wire::messages::{ChangedNotice, NOTICE_CHANGED};
use spillway_wire::serve::Pusher;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The mount a client session belongs to (`HelloReq::mount`); 0 is none.
pub(crate) type MountId = u64;

/// Notices sent for one change, those the writer waits for: ids `first ..first+count`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Sent {
    pub first: u64,
    pub count: u32,
}

struct Watcher {
    /// The watching session (a newer watch of the same mount replaces it).
    session: u64,
    pusher: Pusher,
    /// Missed the last wait: not waited for until it answers one in time.
    lagging: bool,
}

struct Pending {
    mount: MountId,
    session: u64,
    sent: Instant,
    /// The session whose change it tells: the only one that may wait for it (another
    /// waiting would mark the mount lagging in its place).
    by: u64,
}

#[derive(Default)]
struct Inner {
    /// Who holds each file open here: mount → opens.
    holders: HashMap<InodeNo, HashMap<MountId, u64>>,
    watchers: HashMap<MountId, Watcher>,
    /// Notices not answered yet that a writer may wait for, by id.
    pending: HashMap<u64, Pending>,
    next_id: u64,
}

pub(crate) struct Notices {
    inner: Mutex<Inner>,
    answered: Condvar,
    wait: Duration,
}

impl Notices {
    pub(crate) fn new(wait: Duration) -> Notices {
        Notices {
            inner: Mutex::new(Inner {
                next_id: 1,
                ..Inner::default()
            }),
            answered: Condvar::new(),
            wait,
        }
    }

    /// How long a change waits for the mounts it told (`notice_wait`).
    pub(crate) fn wait(&self) -> Duration {
        self.wait
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mount `m` opened `ino` (`n` times).
    pub(crate) fn opened(&self, m: MountId, ino: InodeNo, n: u64) {
        if m == 0 {
            return;
        }
        *self
            .lock()
            .holders
            .entry(ino)
            .or_default()
            .entry(m)
            .or_insert(0) += n;
    }

    /// Mount `m` released `n` opens of `ino`.
    pub(crate) fn released(&self, m: MountId, ino: InodeNo, n: u64) {
        if m == 0 {
            return;
        }
        let mut g = self.lock();
        if let Some(by) = g.holders.get_mut(&ino) {
            if let Some(c) = by.get_mut(&m) {
                *c = c.saturating_sub(n);
                if *c == 0 {
                    by.remove(&m);
                }
            }
            if by.is_empty() {
                g.holders.remove(&ino);
            }
        }
    }

    /// Session `session` of mount `m` receives the mount's notices from now on. A
    /// watch the mount had (a connection it replaced) is closed.
    pub(crate) fn watch(&self, m: MountId, session: u64, pusher: Pusher) {
        let old = self.lock().watchers.insert(
            m,
            Watcher {
                session,
                pusher,
                lagging: false,
            },
        );
        if let Some(old) = old.filter(|o| o.session != session) {
            old.pusher.close();
        }
    }

    /// Session `session` is gone: if it watched for its mount, nobody does now.
    pub(crate) fn unwatch(&self, m: MountId, session: u64) {
        let mut g = self.lock();
        if g.watchers.get(&m).is_some_and(|w| w.session == session) {
            g.watchers.remove(&m);
            g.pending.retain(|_, p| p.mount != m);
            drop(g);
            self.answered.notify_all();
        }
    }

    /// Session `by_session` of mount `by` (0: none, such as a server) changed
    /// `attr.ino`, whose attributes are now `attr`: tell every other mount holding it
    /// open. Returns the notices to wait for.
    pub(crate) fn changed(&self, by: MountId, by_session: u64, attr: &Attr) -> Sent {
        let now = Instant::now();
        let mut sends = Vec::new();
        let sent = {
            let mut g = self.lock();
            let g = &mut *g;
            // A file no other mount holds open (the common case) costs one lookup.
            if !g
                .holders
                .get(&attr.ino)
                .is_some_and(|h| h.keys().any(|&m| m != by))
            {
                return Sent::default();
            }
            // Answers nobody waited for long enough to matter are forgotten.
            let stale = self.wait * 2;
            g.pending.retain(|_, p| now.duration_since(p.sent) < stale);
            let Some(by_mount) = g.holders.get(&attr.ino) else {
                return Sent::default();
            };
            // (mount, its watching session, how to reach it, waited for)
            let mut told: Vec<(MountId, u64, Pusher, bool)> = by_mount
                .keys()
                .filter(|&&m| m != by)
                .filter_map(|m| {
                    g.watchers
                        .get(m)
                        .map(|w| (*m, w.session, w.pusher.clone(), !w.lagging))
                })
                .collect();
            // Waited-for notices first, with consecutive ids, so one range names them.
            // A lagging mount's notices are recorded too: an answer in time ends its
            // lagging.
            told.sort_by_key(|t| !t.3);
            let first = g.next_id;
            let mut count = 0;
            for (m, session, pusher, waited) in told {
                let id = g.next_id;
                g.next_id += 1;
                count += u32::from(waited);
                g.pending.insert(
                    id,
                    Pending {
                        mount: m,
                        session,
                        sent: now,
                        by: by_session,
                    },
                );
                sends.push((id, pusher));
            }
            Sent { first, count }
        };
        if sends.is_empty() {
            return Sent::default();
        }
        let notice = ChangedNotice { attr: attr.clone() };
        let mut failed = Vec::new();
        for (id, pusher) in sends {
            // A mount whose connection does not take a small frame within its send
            // timeout loses the connection (Pusher::notice): not waited for.
            if pusher.notice(NOTICE_CHANGED, id, &notice).is_err() {
                failed.push(id);
            }
        }
        if !failed.is_empty() {
            let mut g = self.lock();
            for id in failed {
                g.pending.remove(&id);
            }
        }
        sent
    }

    /// Notice `id` to mount `m` was acted on (answered on session `session`).
    pub(crate) fn done(&self, m: MountId, session: u64, id: u64) {
        let mut g = self.lock();
        let in_time = match g.pending.get(&id) {
            Some(p) if p.mount == m && p.session == session => {
                let in_time = p.sent.elapsed() < self.wait;
                g.pending.remove(&id);
                in_time
            }
            Some(_) => return,
            // Answered long after the wait (forgotten), or never sent.
            None => false,
        };
        if in_time {
            if let Some(w) = g.watchers.get_mut(&m) {
                if w.session == session {
                    w.lagging = false;
                }
            }
        }
        drop(g);
        self.answered.notify_all();
    }

    /// Session `by_session` waits until the notices `s` of its change are answered or
    /// `notice_wait` since they were sent passed; the mounts that let it pass are
    /// lagging from now on.
    pub(crate) fn wait_for(&self, by_session: u64, s: Sent) {
        // The range comes from a client (NoticeWaitReq): only the pending notices of
        // the session's own changes are looked at, never every id it names.
        let first = s.first;
        let end = s.first.saturating_add(u64::from(s.count));
        let ids = move |id: &u64, p: &Pending| first <= *id && *id < end && p.by == by_session;
        let mut g = self.lock();
        loop {
            let now = Instant::now();
            let until = g
                .pending
                .iter()
                .filter(|(id, p)| ids(id, p))
                .map(|(_, p)| p.sent + self.wait)
                .max();
            let Some(until) = until else {
                return;
            };
            if until <= now {
                break;
            }
            g = self
                .answered
                .wait_timeout(g, until - now)
                .map_or_else(|e| e.into_inner().0, |r| r.0);
        }
        let late: Vec<u64> = g
            .pending
            .iter()
            .filter(|(id, p)| ids(id, p))
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            let Some(p) = g.pending.remove(&id) else {
                continue;
            };
            if let Some(w) = g.watchers.get_mut(&p.mount) {
                if w.session == p.session && !w.lagging {
                    // Not its id: whoever knows a mount's id can watch in its place.
                    tracing::info!(
                        "a mount did not answer a change notice in time: not waited for until it does"
                    );
                    w.lagging = true;
                }
            }
        }
    }
}
