//! Space grants (Lustre's model): bytes of a fragment's free capacity promised to one
//! client connection, so that the client may acknowledge a write to its application
//! before the server has stored it (write-behind) and still never lose it to ENOSPC.
//!
//! A connection (a session) holds a `GrantAccount`. A write the client charged to
//! its grant gives that many promised bytes back to the pool and claims the write's
//! real growth from it in one step under the index lock, so the growth always fits
//! (an overwrite of stored bytes needs none: the charge simply returns). A write not
//! charged (the client waits for its answer) is fitted into the unpromised space, or
//! its prefix that fits, or refused with ENOSPC. After a write the connection's grant
//! is topped up (`refill`), and the reply tells the client how much was added.
//!
//! Bounds: `used + granted <= capacity` for every fragment (index.rs), a connection
//! holds at most `GrantLimits::per_connection`, and all grants of this process
//! together stay below the free space of the file system under the fragments minus
//! `GrantLimits::disk_reserve` (statvfs, read when a grant is made), so that a
//! promise is not one the disk cannot keep. Grants live in memory only: they die with
//! their connection (`close_account`) and with the server.

use super::DataStore;
use crate::error::StoreResult;
use spillway_types::{InodeNo, Tunables};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Bytes promised by every fragment of this process (they share the disk).
static PROMISED: AtomicU64 = AtomicU64::new(0);

/// How much space connections may be promised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GrantLimits {
    /// Most bytes one connection holds (0: no grants, every write is waited for).
    pub per_connection: u64,
    /// Free space of the file system never promised.
    pub disk_reserve: u64,
}

impl Default for GrantLimits {
    fn default() -> Self {
        GrantLimits::from(&Tunables::default())
    }
}

impl From<&Tunables> for GrantLimits {
    fn from(t: &Tunables) -> Self {
        GrantLimits {
            per_connection: t.grant_per_connection,
            disk_reserve: t.grant_disk_reserve,
        }
    }
}

/// One connection's grant on one fragment. `held` changes only under the fragment's
/// index lock, together with the index's `granted` total.
pub(crate) struct GrantAccount {
    epoch: u64,
    held: AtomicU64,
}

impl Default for GrantAccount {
    fn default() -> Self {
        GrantAccount::new()
    }
}

impl GrantAccount {
    /// A new session's account, with an epoch no earlier session of this process had.
    pub(crate) fn new() -> GrantAccount {
        GrantAccount {
            epoch: next_epoch(),
            held: AtomicU64::new(0),
        }
    }

    /// Names this session's grant on the wire: a client learns from a reply with a
    /// newer epoch that its older grant died with its old connection.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

/// Epochs increase within a process and, being based on the clock at start (in
/// microseconds), across restarts of a server too: a client never mistakes a grant of
/// an earlier server process for one of the current.
fn next_epoch() -> u64 {
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    NEXT.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64);
        AtomicU64::new(now.max(1))
    })
    .fetch_add(1, Ordering::Relaxed)
}

fn unpromise(n: u64) {
    let _ = PROMISED.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
        Some(p.saturating_sub(n))
    });
}

/// Free bytes of the file system holding `dir` for unprivileged writers.
fn disk_free(dir: &Path) -> Option<u64> {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated and st is a valid out-pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// How much to add to a grant of `held` bytes: nothing while it holds at least half
/// the cap (refills come in batches, so few replies pay for a statvfs), otherwise up
/// to the cap but at most half of `room`, the space that may still be promised. The
/// halving keeps some room for other connections as a fragment fills: grants shrink
/// near full (writes are then waited for, and fail with ENOSPC at write(2)).
pub(super) fn refill_amount(held: u64, cap: u64, room: u64) -> u64 {
    if held >= cap / 2 {
        return 0;
    }
    (cap - held).min(room / 2)
}

impl DataStore {
    /// Write `data` for a connection. `charged` bytes of the connection's grant of
    /// session `epoch` pay for it: they go back to the pool, from which the write then
    /// claims its real growth (what it charged always covers that). A write not
    /// charged, or charged to an older session's grant (resent after a reconnect),
    /// claims from the unpromised space, as much of it as fits: fewer bytes written
    /// than sent, or ENOSPC when none fits.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write_charged(
        &self,
        acct: &GrantAccount,
        epoch: u64,
        charged: u32,
        ino: InodeNo,
        stripe: u64,
        offset: u32,
        data: &[u8],
    ) -> StoreResult<u32> {
        self.write_claimed(ino, stripe, offset, data, |map, end| {
            if epoch == acct.epoch && charged > 0 {
                let take = u64::from(charged).min(acct.held());
                acct.held.fetch_sub(take, Ordering::Relaxed);
                map.sub_granted(take);
                unpromise(take);
            }
            map.reserve_prefix(ino, stripe, u64::from(offset), end, self.capacity)
        })
    }

    /// Top up a connection's grant after a write (`refill_amount`); the bytes added.
    pub(crate) fn refill(&self, acct: &GrantAccount) -> u64 {
        let limits = self.grant_limits;
        if acct.held() >= limits.per_connection / 2 {
            return 0;
        }
        // Outside the index lock: a system call. A file system that cannot say how
        // full it is gets no promises (writes are then waited for).
        let Some(free) = disk_free(&self.dir) else {
            return 0;
        };
        let disk = free.saturating_sub(limits.disk_reserve);
        let mut map = self.map();
        let room = map
            .unpromised(self.capacity)
            .min(disk.saturating_sub(PROMISED.load(Ordering::Relaxed)));
        let give = refill_amount(acct.held(), limits.per_connection, room);
        if give > 0 {
            map.add_granted(give);
            acct.held.fetch_add(give, Ordering::Relaxed);
            PROMISED.fetch_add(give, Ordering::Relaxed);
        }
        give
    }

    /// Give back up to `bytes` of a connection's grant of session `epoch` (a grant of
    /// another session is no longer held: nothing happens).
    pub(crate) fn release_grant(&self, acct: &GrantAccount, epoch: u64, bytes: u64) {
        if epoch != acct.epoch {
            return;
        }
        let mut map = self.map();
        let take = bytes.min(acct.held());
        acct.held.fetch_sub(take, Ordering::Relaxed);
        map.sub_granted(take);
        unpromise(take);
    }

    /// The connection is gone: everything it held returns to the pool.
    pub(crate) fn close_account(&self, acct: &GrantAccount) {
        self.release_grant(acct, acct.epoch, u64::MAX);
    }

    /// Bytes promised to connections and not yet written.
    #[cfg(test)]
    pub(crate) fn granted(&self) -> u64 {
        self.map().granted()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_types::Errno;

    const A: InodeNo = InodeNo(7);

    fn store(capacity: u64, per_connection: u64) -> (tempfile::TempDir, DataStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = DataStore::open(dir.path(), capacity, 16)
            .unwrap()
            .with_grant_limits(GrantLimits {
                per_connection,
                disk_reserve: 0,
            });
        (dir, s)
    }

    #[test]
    fn refill_amounts() {
        assert_eq!(refill_amount(0, 64, 1000), 64);
        assert_eq!(refill_amount(31, 64, 1000), 33);
        assert_eq!(
            refill_amount(32, 64, 1000),
            0,
            "at least half held: no refill"
        );
        assert_eq!(refill_amount(0, 64, 40), 20, "half of what is left");
        assert_eq!(refill_amount(0, 64, 1), 0);
        assert_eq!(refill_amount(0, 0, 1000), 0, "grants off");
    }

    #[test]
    fn a_charged_write_never_fails_for_space() {
        let (_d, s) = store(1000, 400);
        let a = GrantAccount::new();
        assert_eq!(s.refill(&a), 400);
        assert_eq!(s.granted(), 400);
        // Someone without a grant fills what is not promised.
        assert_eq!(s.write(A, 1, 0, &[1; 600]).unwrap(), 600);
        assert_eq!(
            s.write(A, 2, 0, &[1; 1]).err().map(|e| e.errno()),
            Some(Errno::ENOSPC),
            "the promised 400 bytes are not free for others"
        );
        // The grant's owner still writes all it was promised.
        for k in 0..4 {
            let n = s
                .write_charged(&a, a.epoch(), 100, A, 10 + k, 0, &[2; 100])
                .unwrap();
            assert_eq!(n, 100);
        }
        assert_eq!(a.held(), 0);
        assert_eq!(s.used(), 1000);
        assert_eq!(s.granted(), 0);
        assert_eq!(s.refill(&a), 0, "full: nothing more to promise");
    }

    #[test]
    fn an_overwrite_returns_its_charge_and_uncharged_writes_get_a_prefix() {
        let (_d, s) = store(100, 40);
        let a = GrantAccount::new();
        assert_eq!(s.write(A, 0, 0, &[1; 90]).unwrap(), 90);
        assert_eq!(s.refill(&a), 5, "half of the 10 bytes left");
        // An overwrite charged 5 needs no growth: the 5 go back to the pool.
        assert_eq!(
            s.write_charged(&a, a.epoch(), 5, A, 0, 0, &[3; 5]).unwrap(),
            5
        );
        assert_eq!((a.held(), s.granted(), s.used()), (0, 0, 90));
        // Uncharged: 10 bytes free, a write of 30 past the end keeps its first 10.
        assert_eq!(
            s.write_charged(&a, a.epoch(), 0, A, 0, 85, &[4; 30])
                .unwrap(),
            15
        );
        assert_eq!(s.used(), 100);
        let full = s.write_charged(&a, a.epoch(), 0, A, 0, 100, &[4; 1]);
        assert_eq!(full.err().map(|e| e.errno()), Some(Errno::ENOSPC));
        // Full, an overwrite inside stored bytes still lands.
        assert_eq!(
            s.write_charged(&a, a.epoch(), 0, A, 0, 10, &[5; 20])
                .unwrap(),
            20
        );
    }

    #[test]
    fn an_old_sessions_charge_and_release_are_ignored() {
        let (_d, s) = store(1000, 200);
        let a = GrantAccount::new();
        let b = GrantAccount::new();
        assert!(b.epoch() > a.epoch());
        assert_eq!(s.refill(&b), 200);
        // A resend charged to `a`'s grant, arriving on `b`, does not touch `b`'s.
        assert_eq!(
            s.write_charged(&b, a.epoch(), 50, A, 0, 0, &[1; 50])
                .unwrap(),
            50
        );
        assert_eq!(b.held(), 200);
        s.release_grant(&b, a.epoch(), 200);
        assert_eq!(b.held(), 200);
        s.release_grant(&b, b.epoch(), 150);
        assert_eq!((b.held(), s.granted()), (50, 50));
        s.close_account(&b);
        assert_eq!((b.held(), s.granted()), (0, 0));
        assert_eq!(s.used(), 50);
    }

    #[test]
    fn stage_style_reservations_respect_grants() {
        let (_d, s) = store(100, 80);
        let a = GrantAccount::new();
        assert_eq!(s.refill(&a), 50);
        assert_eq!(
            s.write(A, 0, 0, &[1; 51]).err().map(|e| e.errno()),
            Some(Errno::ENOSPC)
        );
        assert_eq!(s.write(A, 0, 0, &[1; 50]).unwrap(), 50);
        assert!(s.used() + s.granted() <= 100);
    }
}
