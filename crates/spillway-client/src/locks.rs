//! fcntl byte-range locks, OFD locks and flock(2), held at each inode's home server
//! for this client's connection there (the server's `locks` module;
//! docs/data-plane.md, "Locks").
//!
//! * Blocking requests (F_SETLKW, flock without LOCK_NB) that meet a conflict wait in
//!   their home server's queue (`waiters.rs`: one thread per server, not per waiter;
//!   at most `lock_waiters_per_uid` per caller, ENOLCK past it) and are asked again
//!   with a growing pause (2 ms to 50 ms, at once when this mount drops a lock on the
//!   file), so no FUSE worker waits. fuser answers FUSE_INTERRUPT with ENOSYS, so the
//!   kernel never tells us of a signal; before each try the caller's pending signals
//!   are read in /proc instead, and a signalled waiter answers EINTR (the kernel
//!   restarts the call under SA_RESTART, as for a local lock).
//! * Locks live as long as the connection they were taken on, and while this client
//!   renews them (every `RENEW`; the home drops them after `LOCK_LEASE` of silence).
//!   A lock lost with its connection or lease is not taken again: the owner's next
//!   lock request on that file fails once with EIO.
//! * Close (FUSE flush) drops the closing process's POSIX locks on the file; the last
//!   close of an open file description (FUSE release) drops its flocks and the OFD
//!   locks taken through it.

mod waiters;

use crate::caller::{self, Waiter};
use crate::coherence::Coherence;
use fuser::{ReplyEmpty, ReplyLock};
use spillway_stubs::locks::{LockRange, LockSession};
use spillway_stubs::Instance;
use spillway_types::{Errno, InodeNo};
use spillway_wire::messages::{lock_class, lock_kind, LOCK_LEASE};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use waiters::{Admitted, Blocked, Waiters};

/// How often a client renews the locks it holds at a server.
const RENEW: Duration = Duration::from_secs(5);
/// First and longest pause between two tries of a blocked lock request.
const FIRST_PAUSE: Duration = Duration::from_millis(2);
const LONGEST_PAUSE: Duration = Duration::from_millis(50);

const EAGAIN: Errno = Errno(libc::EAGAIN);
const EINTR: Errno = Errno(libc::EINTR);
const ENOLCK: Errno = Errno(libc::ENOLCK);

fn fe(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e.0)
}

/// One server's connection as far as locks go.
struct Lease {
    /// Bumped whenever locks held there may have been lost (a new connection, a
    /// lapsed lease): grants made under an older epoch are gone.
    epoch: u64,
    session: LockSession,
    /// When the last request the server answered was sent: the server keeps this
    /// client's locks at least `LOCK_LEASE` past it.
    confirmed: Instant,
}

/// What an owner may hold on an inode in one lock space.
#[derive(Clone, Copy)]
struct Grant {
    epoch: u64,
}

type Key = (InodeNo, u64, u8);

#[derive(Default)]
struct State {
    held: HashMap<Key, Grant>,
    leases: HashMap<u16, Lease>,
    /// POSIX lock owners that took locks through each open file handle: the OFD
    /// locks among them go at the handle's release (a process's own are dropped at
    /// its close, which forgets them here).
    by_fh: HashMap<u64, HashSet<u64>>,
}

impl State {
    /// The server answered a request sent at `sent` on connection `session`; returns
    /// the epoch grants from that answer belong to.
    fn observe(&mut self, server: u16, session: &LockSession, sent: Instant) -> u64 {
        let l = self.leases.entry(server).or_insert_with(|| Lease {
            epoch: 0,
            session: session.clone(),
            confirmed: sent,
        });
        let silent = sent.saturating_duration_since(l.confirmed) >= LOCK_LEASE;
        if l.session != *session || silent {
            l.epoch += 1;
            l.session = session.clone();
        }
        if sent > l.confirmed {
            l.confirmed = sent;
        }
        l.epoch
    }

    /// Whether a grant at `server` is still good.
    fn live(&self, server: u16, g: Grant, now: Instant) -> bool {
        self.leases.get(&server).is_some_and(|l| {
            l.epoch == g.epoch && now.saturating_duration_since(l.confirmed) < LOCK_LEASE
        })
    }
}

pub struct Locks {
    inst: Arc<Instance>,
    coherence: Arc<Coherence>,
    state: Mutex<State>,
    waiters: Waiters<ReplyEmpty>,
    stopping: AtomicBool,
    renewing: AtomicBool,
}

/// A lock request as the kernel sent it.
#[derive(Clone, Copy, Debug)]
pub struct LockArgs {
    pub ino: InodeNo,
    pub fh: u64,
    pub owner: u64,
    pub start: u64,
    pub end: u64,
    /// F_RDLCK, F_WRLCK or F_UNLCK.
    pub typ: i32,
    /// The lock's pid (shown to F_GETLK callers).
    pub pid: u32,
    /// The calling thread (its /proc entry).
    pub tid: u32,
    /// The caller's uid (whose cap of waiting requests it counts against).
    pub uid: u32,
}

impl LockArgs {
    /// The owner's bytes, as the lock stubs name them.
    fn range(&self) -> LockRange {
        LockRange {
            ino: self.ino,
            owner: self.owner,
            start: self.start,
            end: self.end,
        }
    }
}

fn kind_of(typ: i32) -> Result<u8, Errno> {
    match typ {
        libc::F_RDLCK => Ok(lock_kind::READ),
        libc::F_WRLCK => Ok(lock_kind::WRITE),
        libc::F_UNLCK => Ok(lock_kind::UNLOCK),
        _ => Err(Errno::EINVAL),
    }
}

impl Locks {
    /// `waiters_per_uid`: blocked requests one uid may have waiting at once.
    /// `coherence`: what the kernel caches of a file, pushed before an unlock and
    /// checked when a lock is granted.
    pub(crate) fn new(
        inst: Arc<Instance>,
        waiters_per_uid: usize,
        coherence: Arc<Coherence>,
    ) -> Arc<Locks> {
        Arc::new(Locks {
            coherence,
            inst,
            state: Mutex::new(State::default()),
            waiters: Waiters::new(waiters_per_uid, LONGEST_PAUSE),
            stopping: AtomicBool::new(false),
            renewing: AtomicBool::new(false),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The mount is going: waiting requests end with EINTR, renewals stop.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.waiters.stop();
    }

    /// FUSE setlk (fcntl F_SETLK/F_SETLKW, OFD locks, flock).
    pub fn setlk(self: &Arc<Self>, a: LockArgs, sleep: bool, reply: ReplyEmpty) {
        let class = if caller::in_flock(a.tid) {
            lock_class::FLOCK
        } else {
            lock_class::POSIX
        };
        let kind = match kind_of(a.typ) {
            Ok(k) => k,
            Err(e) => return reply.error(fe(e)),
        };
        if let Err(e) = self.check_lost(a.ino, a.owner, class) {
            return reply.error(fe(e));
        }
        // What the lock protected reaches the servers before another node can take
        // it: this client's writes of the file are pushed first. Failed, the lock is
        // dropped all the same and the caller hears of the lost writes.
        let pushed = if kind == lock_kind::UNLOCK {
            self.coherence.push(a.ino)
        } else {
            Ok(())
        };
        match self.attempt(&a, class, kind) {
            Err(e) if e == EAGAIN && sleep && kind != lock_kind::UNLOCK => {
                self.block(Blocked::new(a, class, kind, reply, FIRST_PAUSE))
            }
            Ok(()) if kind == lock_kind::UNLOCK => {
                self.waiters.nudge(a.ino);
                match pushed {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(fe(e)),
                }
            }
            Ok(()) => {
                self.granted(a.ino);
                reply.ok()
            }
            Err(e) => reply.error(fe(e)),
        }
    }

    /// A lock was granted: what the kernel caches of the file is checked against the
    /// home's version (another node may have written under the lock before), so a
    /// read under the lock sees the last holder's writes. Not answering would leave the
    /// lock held at the home with the caller told it failed: a failed check drops the
    /// kernel's cache of the file instead.
    fn granted(&self, ino: InodeNo) {
        if let Err(e) = self.coherence.revalidate(ino) {
            tracing::warn!(%ino, "checking the cache of a file at a lock: {e}");
            self.coherence.drop_cached(ino);
        }
    }

    /// FUSE getlk (F_GETLK, F_OFD_GETLK): the conflicting lock, or F_UNLCK.
    pub fn getlk(&self, a: LockArgs, reply: ReplyLock) {
        let kind = match kind_of(a.typ) {
            Ok(k) if k != lock_kind::UNLOCK => k,
            Ok(_) | Err(_) => return reply.error(fuser::Errno::EINVAL),
        };
        match self.inst.get_lk(a.range(), kind) {
            Ok(Some(c)) => {
                let typ = if c.kind == lock_kind::WRITE {
                    libc::F_WRLCK
                } else {
                    libc::F_RDLCK
                };
                reply.locked(c.start, c.end, typ, c.pid)
            }
            Ok(None) => reply.locked(a.start, a.end, libc::F_UNLCK, 0),
            Err(e) => reply.error(fe(e)),
        }
    }

    /// Close of a file by a process (FUSE flush): its POSIX locks on the file go.
    pub fn flush(&self, ino: InodeNo, owner: u64) -> Result<(), Errno> {
        let had = {
            let mut st = self.state();
            for owners in st.by_fh.values_mut() {
                owners.remove(&owner);
            }
            st.held.remove(&(ino, owner, lock_class::POSIX)).is_some()
        };
        if had {
            self.inst.unlock_owner(ino, owner, true, false)?;
            self.waiters.nudge(ino);
        }
        Ok(())
    }

    /// Last close of an open file description (FUSE release): its flocks (the kernel
    /// names their owner) and the OFD locks taken through it go.
    pub fn release(&self, ino: InodeNo, fh: u64, flock_owner: Option<u64>) {
        let (flock, ofd) = {
            let mut st = self.state();
            let flock =
                flock_owner.filter(|o| st.held.remove(&(ino, *o, lock_class::FLOCK)).is_some());
            let ofd: Vec<u64> = st
                .by_fh
                .remove(&fh)
                .unwrap_or_default()
                .into_iter()
                .filter(|o| st.held.remove(&(ino, *o, lock_class::POSIX)).is_some())
                .collect();
            (flock, ofd)
        };
        if let Some(o) = flock {
            if let Err(e) = self.inst.unlock_owner(ino, o, false, true) {
                tracing::warn!(%ino, "dropping a flock at release failed: {e}");
            }
        }
        let dropped = flock.is_some() || !ofd.is_empty();
        for o in ofd {
            if let Err(e) = self.inst.unlock_owner(ino, o, true, false) {
                tracing::warn!(%ino, "dropping OFD locks at release failed: {e}");
            }
        }
        if dropped {
            self.waiters.nudge(ino);
        }
    }

    /// An owner whose locks on the file went with a connection or a lease hears of it
    /// once, at its next lock request there.
    fn check_lost(&self, ino: InodeNo, owner: u64, class: u8) -> Result<(), Errno> {
        let mut st = self.state();
        let key = (ino, owner, class);
        let Some(g) = st.held.get(&key).copied() else {
            return Ok(());
        };
        if st.live(ino.home().0, g, Instant::now()) {
            return Ok(());
        }
        st.held.remove(&key);
        tracing::warn!(%ino, owner, "locks lost with the connection to their server");
        Err(Errno::EIO)
    }

    /// One try at the home.
    fn attempt(self: &Arc<Self>, a: &LockArgs, class: u8, kind: u8) -> Result<(), Errno> {
        let server = a.ino.home();
        let before = self.inst.lock_session(server)?;
        let sent = Instant::now();
        let r = self.inst.lock(a.range(), class, kind, a.pid);
        let after = self.inst.lock_session(server).ok();
        let key = (a.ino, a.owner, class);
        let mut st = self.state();
        // Grants belong to the connection the request went out on; if another one
        // took its place meanwhile, they count as lost already.
        let epoch = match &r {
            Ok(_) => st.observe(server.0, &before, sent),
            Err(_) => st.leases.get(&server.0).map_or(0, |l| l.epoch),
        };
        if let Some(after) = after.filter(|c| *c != before) {
            st.observe(server.0, &after, sent);
        }
        let held = match r {
            Ok(n) => n > 0,
            // A conflict changes nothing, except that flock drops the old lock first.
            Err(e) if e == EAGAIN => class == lock_class::POSIX && st.held.contains_key(&key),
            Err(e) if e == Errno::EINVAL => st.held.contains_key(&key),
            // No answer: the lock may have been taken; release it at close.
            Err(_) => kind != lock_kind::UNLOCK || st.held.contains_key(&key),
        };
        if held {
            let g = st.held.get(&key).copied().filter(|_| r.is_err());
            st.held.insert(key, g.unwrap_or(Grant { epoch }));
            if class == lock_class::POSIX {
                st.by_fh.entry(a.fh).or_default().insert(a.owner);
            }
        } else {
            st.held.remove(&key);
        }
        drop(st);
        if r.is_ok() && held {
            self.start_renewing();
        }
        r.map(|_| ())
    }

    /// A blocked request: into its server's queue (that queue's thread started if it
    /// is the first), or ENOLCK when its caller has as many waiting as it may.
    fn block(self: &Arc<Self>, b: Blocked<ReplyEmpty>) {
        match self.waiters.admit(b) {
            Ok(Admitted::Queued) => {}
            Ok(Admitted::StartThread(server)) => {
                let me = self.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("lock waits {server}"))
                    .spawn(move || me.serve_waiters(server));
                if let Err(e) = spawned {
                    tracing::error!("cannot start the lock waits of server {server}: {e}");
                    for b in self.waiters.abandon(server) {
                        self.waiters.answered(b.a.uid);
                        b.reply.error(fe(ENOLCK));
                    }
                }
            }
            Err(b) => {
                tracing::info!(
                    uid = b.a.uid,
                    "a blocking lock request refused (ENOLCK): the caller has as many waiting as it may"
                );
                b.reply.error(fe(ENOLCK));
            }
        }
    }

    /// The thread of `server`'s waiters: ask each again when its pause is over, until
    /// none is left.
    fn serve_waiters(self: Arc<Self>, server: u16) {
        let stopping = || self.stopping.load(Ordering::SeqCst);
        while let Some(due) = self.waiters.next_due(server, &stopping) {
            for mut b in due {
                match self.ask_again(&mut b) {
                    None => self.waiters.again(b),
                    Some(r) => {
                        self.waiters.answered(b.a.uid);
                        match r {
                            Ok(()) => {
                                self.granted(b.a.ino);
                                b.reply.ok()
                            }
                            Err(e) => b.reply.error(fe(e)),
                        }
                    }
                }
            }
        }
    }

    /// One more try of a blocked request: None while it still meets a conflict, else
    /// its answer (EINTR when its caller was signalled or is gone, or the mount stops).
    fn ask_again(self: &Arc<Self>, b: &mut Blocked<ReplyEmpty>) -> Option<Result<(), Errno>> {
        if self.stopping.load(Ordering::SeqCst) {
            return Some(Err(EINTR));
        }
        match b.watch.look(b.a.tid) {
            Waiter::Waiting => {}
            // The kernel turns EINTR from a lock request into ERESTARTSYS: the call
            // restarts after a handler with SA_RESTART, as a local one does.
            Waiter::Signalled | Waiter::Gone => return Some(Err(EINTR)),
        }
        match self.attempt(&b.a, b.class, b.kind) {
            Err(e) if e == EAGAIN => None,
            r => Some(r),
        }
    }

    /// Start the thread renewing this client's locks, once.
    fn start_renewing(self: &Arc<Self>) {
        if self.renewing.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = Arc::downgrade(self);
        let started = std::thread::Builder::new()
            .name("lock renew".into())
            .spawn(move || loop {
                std::thread::sleep(RENEW);
                let Some(locks) = me.upgrade() else { return };
                if locks.stopping.load(Ordering::SeqCst) {
                    return;
                }
                locks.renew_all();
            });
        if let Err(e) = started {
            self.renewing.store(false, Ordering::SeqCst);
            tracing::error!("cannot start the lock renewal thread: {e}");
        }
    }

    /// Renew at every server where this client holds live locks.
    fn renew_all(&self) {
        let servers: HashSet<u16> = {
            let st = self.state();
            let now = Instant::now();
            st.held
                .iter()
                .filter(|((ino, _, _), g)| st.live(ino.home().0, **g, now))
                .map(|((ino, _, _), _)| ino.home().0)
                .collect()
        };
        for s in servers {
            let server = spillway_types::ServerIndex(s);
            let Ok(before) = self.inst.lock_session(server) else {
                continue;
            };
            let sent = Instant::now();
            match self.inst.lock_renew(server) {
                Ok(r) => {
                    let mut st = self.state();
                    st.observe(s, &before, sent);
                    if r.lost {
                        if let Some(l) = st.leases.get_mut(&s) {
                            l.epoch += 1;
                        }
                    }
                }
                Err(e) => tracing::warn!(server = s, "renewing locks failed: {e}"),
            }
        }
    }
}
