//! Blocked lock requests (F_SETLKW, flock without LOCK_NB) waiting for a conflict to
//! clear, and what they may cost the mount client, which is root's and serves every
//! user of the node.
//!
//! * No thread each: the waiters whose locks live at one home server sit in that
//!   server's queue, and one thread per server (started with its first waiter, gone
//!   with its last) asks again for each when its pause is over. However many callers
//!   wait, the mount has at most one waiting thread per server of its instance; a
//!   server that answers slowly delays only the waiters whose locks it holds.
//! * A cap per caller: one uid may have at most `lock_waiters_per_uid` requests
//!   waiting at once in this mount; past it a blocking request fails with ENOLCK at
//!   once (as a kernel out of lock records answers), so one user's waiters cannot grow
//!   the client's memory without end or crowd out another user's.

use super::LockArgs;
use crate::caller::SignalWatch;
use spillway_types::InodeNo;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One blocked request and when it is asked again; `R` is how it is answered (the
/// kernel's reply).
pub(super) struct Blocked<R> {
    pub(super) a: LockArgs,
    pub(super) class: u8,
    pub(super) kind: u8,
    pub(super) reply: R,
    pub(super) watch: SignalWatch,
    pause: Duration,
    due: Instant,
}

impl<R> Blocked<R> {
    /// A request that met a conflict just now: first asked again after `first`.
    pub(super) fn new(a: LockArgs, class: u8, kind: u8, reply: R, first: Duration) -> Self {
        Blocked {
            a,
            class,
            kind,
            reply,
            watch: SignalWatch::default(),
            pause: first,
            due: Instant::now() + first,
        }
    }

    /// The home server whose queue it waits in.
    pub(super) fn home_server(&self) -> u16 {
        self.a.ino.home().0
    }
}

struct State<R> {
    /// Waiting requests per caller uid (an entry goes when it reaches 0).
    per_uid: HashMap<u32, usize>,
    /// Per home server, its waiters. A server is listed exactly while its thread
    /// runs: the thread takes the entry away when it finds the queue empty.
    queues: HashMap<u16, Vec<Blocked<R>>>,
}

pub(super) struct Waiters<R> {
    per_uid: usize,
    longest: Duration,
    st: Mutex<State<R>>,
    /// A waiter was added, nudged or the mount is stopping.
    wake: Condvar,
}

/// Where an admitted waiter went.
pub(super) enum Admitted {
    /// Into a queue whose thread runs.
    Queued,
    /// Into a new queue: the caller starts its thread.
    StartThread(u16),
}

impl<R> Waiters<R> {
    pub(super) fn new(per_uid: usize, longest: Duration) -> Waiters<R> {
        Waiters {
            per_uid: per_uid.max(1),
            longest,
            st: Mutex::new(State {
                per_uid: HashMap::new(),
                queues: HashMap::new(),
            }),
            wake: Condvar::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<R>> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `b` unless its caller has as many waiting as it may (then `b` comes back,
    /// to be answered ENOLCK).
    pub(super) fn admit(&self, b: Blocked<R>) -> Result<Admitted, Blocked<R>> {
        let mut st = self.state();
        let n = st.per_uid.entry(b.a.uid).or_insert(0);
        if *n >= self.per_uid {
            return Err(b);
        }
        *n += 1;
        let server = b.home_server();
        let fresh = !st.queues.contains_key(&server);
        st.queues.entry(server).or_default().push(b);
        drop(st);
        self.wake.notify_all();
        Ok(if fresh {
            Admitted::StartThread(server)
        } else {
            Admitted::Queued
        })
    }

    /// For `server`'s thread: the waiters due now, after waiting for one to be (all of
    /// them at once when `stopping` says so). None once the queue is empty: the entry
    /// is gone and the thread ends (a later waiter starts a new one).
    pub(super) fn next_due(
        &self,
        server: u16,
        stopping: &dyn Fn() -> bool,
    ) -> Option<Vec<Blocked<R>>> {
        let mut st = self.state();
        loop {
            let queue = st.queues.get_mut(&server)?;
            if queue.is_empty() {
                st.queues.remove(&server);
                return None;
            }
            let now = Instant::now();
            let stop = stopping();
            if stop || queue.iter().any(|b| b.due <= now) {
                let (due, later): (Vec<_>, Vec<_>) = std::mem::take(queue)
                    .into_iter()
                    .partition(|b| stop || b.due <= now);
                *queue = later;
                return Some(due);
            }
            // Bounded, so that a stop is seen within one longest pause.
            let first = queue.iter().map(|b| b.due).min().unwrap_or(now);
            let sleep = first.saturating_duration_since(now).min(self.longest);
            st = self
                .wake
                .wait_timeout(st, sleep)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// `b` met a conflict again: back into its queue, asked again after twice its
    /// last pause (at most the longest).
    pub(super) fn again(&self, mut b: Blocked<R>) {
        b.pause = (b.pause * 2).min(self.longest);
        b.due = Instant::now() + b.pause;
        let server = b.home_server();
        self.state().queues.entry(server).or_default().push(b);
    }

    /// A waiter of `uid` was answered (granted, refused, interrupted).
    pub(super) fn answered(&self, uid: u32) {
        let mut st = self.state();
        if let Some(n) = st.per_uid.get_mut(&uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                st.per_uid.remove(&uid);
            }
        }
    }

    /// Locks on `ino` were dropped through this mount: its waiters ask again now
    /// rather than after their pause.
    pub(super) fn nudge(&self, ino: InodeNo) {
        let mut st = self.state();
        let now = Instant::now();
        let mut any = false;
        if let Some(q) = st.queues.get_mut(&ino.home().0) {
            for b in q.iter_mut().filter(|b| b.a.ino == ino) {
                b.due = now;
                any = true;
            }
        }
        drop(st);
        if any {
            self.wake.notify_all();
        }
    }

    /// The mount is stopping: every thread looks now.
    pub(super) fn stop(&self) {
        self.wake.notify_all();
    }

    /// `server`'s thread could not be started: its queue, to be answered at once.
    pub(super) fn abandon(&self, server: u16) -> Vec<Blocked<R>> {
        self.state().queues.remove(&server).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_types::InodeNo;

    fn req(ino: InodeNo, uid: u32) -> Blocked<u32> {
        let a = LockArgs {
            ino,
            fh: 1,
            owner: 1,
            start: 0,
            end: u64::MAX,
            typ: libc::F_WRLCK,
            pid: 1,
            tid: 1,
            uid,
        };
        Blocked::new(a, 0, 0, uid, Duration::from_millis(1))
    }

    const NEVER: &dyn Fn() -> bool = &|| false;

    #[test]
    fn a_caller_past_its_cap_is_refused_and_others_are_not() {
        let w = Waiters::new(2, Duration::from_millis(50));
        let ino = InodeNo(7);
        assert!(matches!(
            w.admit(req(ino, 1000)),
            Ok(Admitted::StartThread(0))
        ));
        assert!(matches!(w.admit(req(ino, 1000)), Ok(Admitted::Queued)));
        assert!(w.admit(req(ino, 1000)).is_err(), "third waiter of uid 1000");
        assert!(matches!(w.admit(req(ino, 1001)), Ok(Admitted::Queued)));
        // One answered: room for one more.
        w.answered(1000);
        assert!(w.admit(req(ino, 1000)).is_ok());
        assert!(w.admit(req(ino, 1000)).is_err());
    }

    #[test]
    fn one_queue_per_server_and_the_thread_ends_with_its_last_waiter() {
        let w = Waiters::new(8, Duration::from_millis(50));
        let other = InodeNo::compose(spillway_types::ServerIndex(3), 5);
        assert!(matches!(
            w.admit(req(InodeNo(5), 1)),
            Ok(Admitted::StartThread(0))
        ));
        assert!(matches!(
            w.admit(req(other, 1)),
            Ok(Admitted::StartThread(3))
        ));
        let due = w.next_due(0, NEVER).expect("a waiter");
        assert_eq!(due.len(), 1);
        for b in due {
            w.answered(b.reply);
        }
        assert!(w.next_due(0, NEVER).is_none(), "empty: the thread ends");
        // A new waiter for server 0 starts a new thread.
        assert!(matches!(
            w.admit(req(InodeNo(5), 1)),
            Ok(Admitted::StartThread(0))
        ));
    }

    #[test]
    fn a_waiter_asked_again_comes_back_after_its_pause_and_a_nudge_brings_it_at_once() {
        let w = Waiters::new(8, Duration::from_secs(5));
        assert!(w.admit(req(InodeNo(9), 1)).is_ok());
        let mut due = w.next_due(0, NEVER).expect("due");
        let b = due.pop().expect("one");
        w.again(b); // pause 2 ms
        let started = Instant::now();
        let b = w.next_due(0, NEVER).expect("due again").pop().expect("one");
        assert!(started.elapsed() >= Duration::from_millis(1));
        let mut b = b;
        b.pause = Duration::from_secs(2);
        w.again(b); // pause 4 s
        w.nudge(InodeNo(9));
        let started = Instant::now();
        assert_eq!(w.next_due(0, NEVER).expect("nudged").len(), 1);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn stopping_hands_every_waiter_back_at_once() {
        let w = Waiters::new(8, Duration::from_secs(5));
        let mut b = req(InodeNo(9), 1);
        b.due = Instant::now() + Duration::from_secs(60);
        assert!(w.admit(b).is_ok());
        assert!(w.admit(req(InodeNo(10), 2)).is_ok());
        let all = w.next_due(0, &|| true).expect("all");
        assert_eq!(all.len(), 2);
        assert_eq!(w.abandon(0).len(), 0);
    }
}
