//! This client's space grants, one per server connection (docs/data-plane.md, "Space
//! grants"; the server side is spillway-server's data/grants.rs).
//!
//! A write may be acknowledged to the application before its server answered only
//! when it is charged to the grant of that server: bytes the server promised to keep
//! free for this connection. Every write reply adds what the server topped the grant
//! up with, tagged with the session's epoch: a reply of a newer session means the
//! connection was made again and the old grant died with the old one (it restarts from
//! that reply's amount); a reply of an older session adds nothing. A grant not drawn on
//! for `grant_idle` is given back (`GrantReleaseReq`, from a background thread, never
//! on a writer's path), so that idle clients do not hold space that others need.

use spillway_stubs::Instance;
use spillway_types::{ServerIndex, Tunables};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

pub struct Grants {
    inst: Arc<Instance>,
    servers: Vec<Mutex<Grant>>,
    idle: Duration,
}

/// What this client may still charge on one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The session the grant belongs to (0: none known yet).
    pub epoch: u64,
    /// Bytes left to charge.
    pub avail: u64,
    /// Last charge or refill (a grant unused since `idle` is given back).
    pub used_at: Instant,
}

impl Grant {
    fn new() -> Grant {
        Grant {
            epoch: 0,
            avail: 0,
            used_at: Instant::now(),
        }
    }

    /// Take `n` bytes if the grant holds them; the epoch they were charged to.
    pub fn charge(&mut self, n: u64) -> Option<u64> {
        if self.epoch == 0 || self.avail < n {
            return None;
        }
        self.avail -= n;
        self.used_at = Instant::now();
        Some(self.epoch)
    }

    /// Take what the grant holds of `n` bytes (a write that is waited for spends it
    /// first, the server fits the rest into free space): the epoch and the bytes taken.
    pub fn charge_upto(&mut self, n: u64) -> Option<(u64, u64)> {
        if self.epoch == 0 || self.avail == 0 {
            return None;
        }
        let k = self.avail.min(n);
        self.avail -= k;
        self.used_at = Instant::now();
        Some((self.epoch, k))
    }

    /// A reply of session `epoch` added `granted` bytes.
    pub fn credit(&mut self, epoch: u64, granted: u64) {
        if epoch > self.epoch {
            // A new connection: whatever was left of the old grant died with it.
            self.epoch = epoch;
            self.avail = granted;
        } else if epoch == self.epoch {
            self.avail = self.avail.saturating_add(granted);
        } else {
            return;
        }
        if granted > 0 {
            self.used_at = Instant::now();
        }
    }

    /// Everything held, if unused since `idle` before `now`: (epoch, bytes), now zero.
    pub fn take_idle(&mut self, idle: Duration, now: Instant) -> Option<(u64, u64)> {
        if self.avail == 0 || now.saturating_duration_since(self.used_at) < idle {
            return None;
        }
        let bytes = std::mem::take(&mut self.avail);
        Some((self.epoch, bytes))
    }
}

impl Grants {
    /// The grants of `inst`'s servers (none held yet), and the thread that gives idle
    /// ones back; it ends when the returned value is dropped.
    pub fn new(inst: Arc<Instance>, tun: &Tunables) -> Arc<Grants> {
        let g = Arc::new(Grants {
            servers: (0..inst.count())
                .map(|_| Mutex::new(Grant::new()))
                .collect(),
            inst,
            idle: tun.grant_idle,
        });
        let weak = Arc::downgrade(&g);
        let tick = (tun.grant_idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let spawned = std::thread::Builder::new()
            .name("grant-release".into())
            .spawn(move || release_loop(weak, tick));
        if let Err(e) = spawned {
            // Grants are then only returned when the connections close.
            tracing::warn!("cannot start the grant release thread: {e}");
        }
        g
    }

    fn slot(&self, server: ServerIndex) -> Option<MutexGuard<'_, Grant>> {
        self.servers
            .get(usize::from(server.0))
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Charge `n` bytes to the grant of `server`: the epoch charged, or None when the
    /// grant does not cover them.
    pub fn charge(&self, server: ServerIndex, n: u64) -> Option<u64> {
        self.slot(server)?.charge(n)
    }

    /// Take up to `n` bytes of the grant of `server` (`Grant::charge_upto`).
    pub fn charge_upto(&self, server: ServerIndex, n: u64) -> Option<(u64, u64)> {
        self.slot(server)?.charge_upto(n)
    }

    /// A write reply from `server` of session `epoch` added `granted` bytes.
    pub fn credit(&self, server: ServerIndex, epoch: u64, granted: u64) {
        if let Some(mut g) = self.slot(server) {
            g.credit(epoch, granted);
        }
    }

    /// Give back every grant unused for `idle`.
    fn release_idle(&self) {
        let now = Instant::now();
        for (i, m) in self.servers.iter().enumerate() {
            let taken = m
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take_idle(self.idle, now);
            if let Some((epoch, bytes)) = taken {
                self.give_back(ServerIndex(i as u16), epoch, bytes);
            }
        }
    }

    /// Give back all of this client's grant on `server` now (one round trip), so that
    /// the space it promised is free for something that cannot charge a grant (an
    /// allocation). Writes after it earn a new grant.
    pub fn release(&self, server: ServerIndex) {
        let taken = self.slot(server).and_then(|mut g| {
            let bytes = std::mem::take(&mut g.avail);
            (bytes > 0).then_some((g.epoch, bytes))
        });
        if let Some((epoch, bytes)) = taken {
            self.give_back(server, epoch, bytes);
        }
    }

    fn give_back(&self, server: ServerIndex, epoch: u64, bytes: u64) {
        if let Err(e) = self.inst.release_grant(server, epoch, bytes) {
            // The server takes the grant back when the connection goes anyway.
            tracing::debug!(server = server.0, "grant release failed: {e}");
        }
    }
}

fn release_loop(grants: Weak<Grants>, tick: Duration) {
    loop {
        std::thread::sleep(tick);
        match grants.upgrade() {
            Some(g) => g.release_idle(),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_need_a_known_grant_that_covers_them() {
        let mut g = Grant::new();
        assert_eq!(g.charge(1), None, "no session known yet");
        g.credit(5, 100);
        assert_eq!(g.charge(60), Some(5));
        assert_eq!(g.charge(41), None);
        assert_eq!(g.charge(40), Some(5));
        assert_eq!(g.avail, 0);
        assert_eq!(g.charge(0), Some(5));
    }

    #[test]
    fn a_waited_write_spends_what_is_left() {
        let mut g = Grant::new();
        assert_eq!(g.charge_upto(10), None);
        g.credit(4, 30);
        assert_eq!(g.charge_upto(10), Some((4, 10)));
        assert_eq!(g.charge_upto(100), Some((4, 20)));
        assert_eq!(g.charge_upto(1), None, "nothing left");
    }

    #[test]
    fn a_newer_session_replaces_the_grant_and_an_older_one_adds_nothing() {
        let mut g = Grant::new();
        g.credit(5, 100);
        g.credit(5, 20);
        assert_eq!(g.avail, 120);
        g.credit(7, 30);
        assert_eq!(
            (g.epoch, g.avail),
            (7, 30),
            "the old 120 died with session 5"
        );
        g.credit(5, 1000);
        assert_eq!((g.epoch, g.avail), (7, 30), "a late reply of session 5");
        g.credit(7, 0);
        assert_eq!(g.avail, 30);
    }

    #[test]
    fn only_idle_grants_are_taken_back() {
        let mut g = Grant::new();
        g.credit(3, 50);
        let t = g.used_at;
        let idle = Duration::from_secs(2);
        assert_eq!(g.take_idle(idle, t + Duration::from_secs(1)), None);
        assert_eq!(g.take_idle(idle, t + idle), Some((3, 50)));
        assert_eq!(g.avail, 0);
        assert_eq!(g.take_idle(idle, t + idle * 5), None, "nothing left");
        assert_eq!(g.charge(1), None);
    }
}
