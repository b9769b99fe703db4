//! Byte-range (fcntl, OFD) and flock locks of the inodes homed on this fragment,
//! held in memory for the client sessions that took them (docs/data-plane.md, "Locks").
//!
//! * `ranges` — the pure POSIX/flock rules for one inode's locks.
//!
//! A lock belongs to a session (one client connection) and the owner id the client's
//! kernel named. A session's locks go when its connection closes (the client died or
//! its connection broke), and when it showed no life for `LOCK_LEASE` (a client
//! machine that vanished without closing its connection): expired locks are dropped
//! lazily, whenever this table is next used. A server restart loses every lock.

mod ranges;

use ranges::{Kind, Owner, RangeLocks};
use spillway_types::{Errno, InodeNo};
use spillway_wire::messages::{
    lock_class, lock_kind, GetLkReq, LockInfo, LockRenewReply, LockReq, UnlockOwnerReq, LOCK_LEASE,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A conflict: F_SETLK's answer (the client waits and asks again for F_SETLKW).
pub(crate) const EAGAIN: Errno = Errno(libc::EAGAIN);

/// A fresh id for a session's locks (ids are never reused within a server's life).
pub(crate) fn new_session_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[derive(Default)]
struct InodeLocks {
    posix: RangeLocks,
    flock: RangeLocks,
}

impl InodeLocks {
    fn is_empty(&self) -> bool {
        self.posix.is_empty() && self.flock.is_empty()
    }
    fn class(&mut self, class: u8) -> &mut RangeLocks {
        if class == lock_class::FLOCK {
            &mut self.flock
        } else {
            &mut self.posix
        }
    }
}

/// A session that holds (or held) locks here.
struct Lease {
    renewed: Instant,
    inodes: HashSet<InodeNo>,
}

#[derive(Default)]
struct State {
    inodes: HashMap<InodeNo, InodeLocks>,
    leases: HashMap<u64, Lease>,
    /// Sessions whose locks were dropped for a lapsed lease, until they renew.
    expired: HashSet<u64>,
}

pub(crate) struct LockTable {
    state: Mutex<State>,
    lease: Duration,
}

impl Default for LockTable {
    fn default() -> Self {
        LockTable::with_lease(LOCK_LEASE)
    }
}

fn kind_of(k: u8) -> Result<Option<Kind>, Errno> {
    match k {
        lock_kind::UNLOCK => Ok(None),
        lock_kind::READ => Ok(Some(Kind::Read)),
        lock_kind::WRITE => Ok(Some(Kind::Write)),
        _ => Err(Errno::EINVAL),
    }
}

impl LockTable {
    pub(crate) fn with_lease(lease: Duration) -> LockTable {
        LockTable {
            state: Mutex::new(State::default()),
            lease,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Set, change or remove a lock (LockReq). Returns how many locks the owner holds
    /// on the inode in that class afterwards; EAGAIN on a conflict.
    pub(crate) fn set(&self, session: u64, r: &LockReq, now: Instant) -> Result<u32, Errno> {
        if r.start > r.end || (r.class != lock_class::POSIX && r.class != lock_class::FLOCK) {
            return Err(Errno::EINVAL);
        }
        let kind = kind_of(r.kind)?;
        let owner = Owner {
            session,
            id: r.owner,
        };
        let mut st = self.lock();
        self.expire(&mut st, now);
        st.renew(session, now);
        let locks = st.inodes.entry(r.ino).or_default();
        let class = locks.class(r.class);
        let res = if r.class == lock_class::FLOCK {
            class.set_flock(owner, kind, r.pid)
        } else {
            class.set_posix(owner, kind, r.start, r.end, r.pid)
        };
        let held = class.count(owner);
        if locks.is_empty() {
            st.inodes.remove(&r.ino);
        }
        if let Some(l) = st.leases.get_mut(&session) {
            l.inodes.insert(r.ino);
        }
        res.map(|()| held).map_err(|_| EAGAIN)
    }

    /// F_GETLK: the conflicting lock, if any.
    pub(crate) fn test(
        &self,
        session: u64,
        r: &GetLkReq,
        now: Instant,
    ) -> Result<Option<LockInfo>, Errno> {
        let Some(kind) = kind_of(r.kind)? else {
            return Err(Errno::EINVAL);
        };
        if r.start > r.end {
            return Err(Errno::EINVAL);
        }
        let owner = Owner {
            session,
            id: r.owner,
        };
        let mut st = self.lock();
        self.expire(&mut st, now);
        let Some(locks) = st.inodes.get(&r.ino) else {
            return Ok(None);
        };
        Ok(locks
            .posix
            .conflict(owner, kind, r.start, r.end)
            .map(|h| LockInfo {
                kind: match h.kind {
                    Kind::Read => lock_kind::READ,
                    Kind::Write => lock_kind::WRITE,
                },
                start: h.start,
                end: h.end,
                pid: h.pid,
            }))
    }

    /// Drop an owner's locks on one inode (close, last close).
    pub(crate) fn unlock_owner(&self, session: u64, r: &UnlockOwnerReq) {
        let owner = Owner {
            session,
            id: r.owner,
        };
        let mut st = self.lock();
        if let Some(locks) = st.inodes.get_mut(&r.ino) {
            if r.posix {
                locks.posix.drop_owners(|o| *o == owner);
            }
            if r.flock {
                locks.flock.drop_owners(|o| *o == owner);
            }
            if locks.is_empty() {
                st.inodes.remove(&r.ino);
            }
        }
    }

    /// A session shows it is alive; tells it whether its locks were dropped for a
    /// lapsed lease since it last asked, and how many it holds.
    pub(crate) fn renew(&self, session: u64, now: Instant) -> LockRenewReply {
        let mut guard = self.lock();
        let st = &mut *guard;
        self.expire(st, now);
        let lost = st.expired.remove(&session);
        let held = match st.leases.get_mut(&session) {
            Some(l) => {
                l.renewed = now;
                let inodes: Vec<InodeNo> = l.inodes.iter().copied().collect();
                inodes
                    .iter()
                    .filter_map(|i| st.inodes.get(i))
                    .map(|locks| {
                        locks
                            .posix
                            .iter()
                            .chain(locks.flock.iter())
                            .filter(|h| h.owner.session == session)
                            .count() as u32
                    })
                    .sum()
            }
            None => 0,
        };
        LockRenewReply { lost, held }
    }

    /// The session's connection is gone: every lock it held goes too.
    pub(crate) fn drop_session(&self, session: u64) {
        let mut st = self.lock();
        st.expired.remove(&session);
        st.drop_session(session);
    }

    /// Drop the locks of sessions silent for longer than the lease.
    fn expire(&self, st: &mut State, now: Instant) {
        let lapsed: Vec<u64> = st
            .leases
            .iter()
            .filter(|(_, l)| now.saturating_duration_since(l.renewed) > self.lease)
            .map(|(s, _)| *s)
            .collect();
        for s in lapsed {
            tracing::warn!(
                session = s,
                "lock lease lapsed: dropping the session's locks"
            );
            if st.drop_session(s) > 0 {
                st.expired.insert(s);
            }
        }
    }
}

impl State {
    fn renew(&mut self, session: u64, now: Instant) {
        self.leases
            .entry(session)
            .or_insert_with(|| Lease {
                renewed: now,
                inodes: HashSet::new(),
            })
            .renewed = now;
    }

    /// Remove a session's locks and lease; how many locks went.
    fn drop_session(&mut self, session: u64) -> usize {
        let Some(lease) = self.leases.remove(&session) else {
            return 0;
        };
        let mut n = 0;
        for ino in lease.inodes {
            if let Some(locks) = self.inodes.get_mut(&ino) {
                n += locks.posix.drop_owners(|o| o.session == session);
                n += locks.flock.drop_owners(|o| o.session == session);
                if locks.is_empty() {
                    self.inodes.remove(&ino);
                }
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(owner: u64, class: u8, kind: u8, start: u64, end: u64) -> LockReq {
        LockReq {
            ino: InodeNo(5),
            owner,
            class,
            kind,
            start,
            end,
            pid: 42,
        }
    }

    fn getlk(owner: u64, start: u64, end: u64) -> GetLkReq {
        GetLkReq {
            ino: InodeNo(5),
            owner,
            kind: lock_kind::WRITE,
            start,
            end,
        }
    }

    #[test]
    fn sessions_conflict_and_owners_are_per_session() {
        let t = LockTable::default();
        let now = Instant::now();
        let w = req(7, lock_class::POSIX, lock_kind::WRITE, 0, 99);
        assert_eq!(t.set(1, &w, now), Ok(1));
        // The same owner id on another client's session is another owner.
        assert_eq!(t.set(2, &w, now), Err(EAGAIN));
        let c = t.test(2, &getlk(7, 50, 50), now).unwrap().unwrap();
        assert_eq!(
            (c.kind, c.start, c.end, c.pid),
            (lock_kind::WRITE, 0, 99, 42)
        );
        assert_eq!(t.test(1, &getlk(7, 50, 50), now).unwrap(), None);
        // flock and POSIX locks live apart.
        let f = req(9, lock_class::FLOCK, lock_kind::WRITE, 0, u64::MAX);
        assert_eq!(t.set(2, &f, now), Ok(1));
        assert_eq!(t.set(1, &f, now), Err(EAGAIN));
    }

    #[test]
    fn closing_a_session_or_an_owner_releases() {
        let t = LockTable::default();
        let now = Instant::now();
        let w = req(7, lock_class::POSIX, lock_kind::WRITE, 0, 99);
        t.set(1, &w, now).unwrap();
        t.drop_session(1);
        assert_eq!(t.set(2, &w, now), Ok(1));
        t.unlock_owner(
            2,
            &UnlockOwnerReq {
                ino: InodeNo(5),
                owner: 7,
                posix: true,
                flock: false,
            },
        );
        assert_eq!(t.set(3, &w, now), Ok(1));
    }

    #[test]
    fn a_silent_session_loses_its_locks_after_the_lease() {
        let t = LockTable::with_lease(Duration::from_secs(10));
        let t0 = Instant::now();
        let w = req(7, lock_class::POSIX, lock_kind::WRITE, 0, 99);
        t.set(1, &w, t0).unwrap();
        assert_eq!(t.renew(1, t0 + Duration::from_secs(8)).held, 1);
        // Renewed at 8 s: still held at 17 s.
        assert_eq!(t.set(2, &w, t0 + Duration::from_secs(17)), Err(EAGAIN));
        // Session 2 renews by asking; session 1 is silent past 18 s.
        assert_eq!(t.set(2, &w, t0 + Duration::from_secs(19)), Ok(1));
        let r = t.renew(1, t0 + Duration::from_secs(20));
        assert!(r.lost);
        assert_eq!(r.held, 0);
        assert!(!t.renew(1, t0 + Duration::from_secs(21)).lost, "told once");
    }

    #[test]
    fn bad_requests_are_refused() {
        let t = LockTable::default();
        let now = Instant::now();
        assert_eq!(
            t.set(1, &req(1, lock_class::POSIX, 9, 0, 1), now),
            Err(Errno::EINVAL)
        );
        assert_eq!(
            t.set(1, &req(1, 7, lock_kind::READ, 0, 1), now),
            Err(Errno::EINVAL)
        );
        assert_eq!(
            t.set(1, &req(1, lock_class::POSIX, lock_kind::READ, 5, 1), now),
            Err(Errno::EINVAL)
        );
    }
}
