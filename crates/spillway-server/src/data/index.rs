//! What stripes a fragment holds, their lengths, the fragment's used bytes, the bytes
//! promised to clients as space grants (grants.rs), and which stripes were written
//! since their last fdatasync. Pure bookkeeping, no I/O: rebuilt from a listing of
//! `stripes/` at start (grants start at zero: they die with the connections).
//!
//! The invariant: `used + granted <= capacity` whenever space is claimed. Every
//! reservation (a client's write, a stage-in, an allocation) is checked against what
//! is neither used nor promised.

use spillway_types::InodeNo;
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[derive(Default)]
pub(super) struct StripeMap {
    files: HashMap<InodeNo, BTreeMap<u64, u64>>,
    dirty: HashMap<InodeNo, BTreeSet<u64>>,
    used: u64,
    /// Bytes promised to connections and not yet written (sum of their grants).
    granted: u64,
}

/// Writing would take the fragment over its capacity.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct NoSpace;

impl StripeMap {
    pub(super) fn used(&self) -> u64 {
        self.used
    }

    #[cfg(test)]
    pub(super) fn granted(&self) -> u64 {
        self.granted
    }

    /// Bytes neither stored nor promised.
    pub(super) fn unpromised(&self, capacity: u64) -> u64 {
        capacity.saturating_sub(self.used.saturating_add(self.granted))
    }

    /// Promise `n` more bytes (the caller checked `unpromised`).
    pub(super) fn add_granted(&mut self, n: u64) {
        self.granted = self.granted.saturating_add(n);
    }

    /// `n` promised bytes are given back (or about to be claimed by a write).
    pub(super) fn sub_granted(&mut self, n: u64) {
        self.granted = self.granted.saturating_sub(n);
    }

    pub(super) fn len(&self, ino: InodeNo, stripe: u64) -> Option<u64> {
        self.files.get(&ino).and_then(|s| s.get(&stripe)).copied()
    }

    /// Stripes of `ino` with their lengths, in stripe order.
    pub(super) fn stripes(&self, ino: InodeNo) -> Vec<(u64, u64)> {
        self.files
            .get(&ino)
            .map(|s| s.iter().map(|(&k, &l)| (k, l)).collect())
            .unwrap_or_default()
    }

    /// Record the length of a stripe (present from now on).
    pub(super) fn set(&mut self, ino: InodeNo, stripe: u64, len: u64) {
        let slot = self
            .files
            .entry(ino)
            .or_default()
            .entry(stripe)
            .or_insert(0);
        self.used = self.used - *slot + len;
        *slot = len;
    }

    /// Forget a stripe (its file is gone).
    pub(super) fn remove(&mut self, ino: InodeNo, stripe: u64) {
        if let Some(stripes) = self.files.get_mut(&ino) {
            if let Some(len) = stripes.remove(&stripe) {
                self.used -= len;
            }
            if stripes.is_empty() {
                self.files.remove(&ino);
            }
        }
        if let Some(d) = self.dirty.get_mut(&ino) {
            d.remove(&stripe);
            if d.is_empty() {
                self.dirty.remove(&ino);
            }
        }
    }

    /// Claim room for a write ending at byte `end` of the stripe: the stripe's length
    /// becomes at least `end`, unless the growth would exceed what is neither used
    /// nor promised to a connection (`capacity - used - granted`).
    pub(super) fn reserve(
        &mut self,
        ino: InodeNo,
        stripe: u64,
        end: u64,
        capacity: u64,
    ) -> Result<(), NoSpace> {
        let cur = self.len(ino, stripe).unwrap_or(0);
        let growth = end.saturating_sub(cur);
        if growth > self.unpromised(capacity) {
            return Err(NoSpace);
        }
        self.set(ino, stripe, cur.max(end));
        Ok(())
    }

    /// Claim room for as much of a write of `[offset, end)` of the stripe as fits:
    /// what overwrites the stored stripe, and growth up to the unpromised space.
    /// Returns the end of the part claimed, always past `offset`; NoSpace when not
    /// one byte fits.
    pub(super) fn reserve_prefix(
        &mut self,
        ino: InodeNo,
        stripe: u64,
        offset: u64,
        end: u64,
        capacity: u64,
    ) -> Result<u64, NoSpace> {
        let cur = self.len(ino, stripe).unwrap_or(0);
        let fits = end.min(cur.saturating_add(self.unpromised(capacity)));
        if fits <= offset {
            return Err(NoSpace);
        }
        self.set(ino, stripe, cur.max(fits));
        Ok(fits)
    }

    pub(super) fn mark_dirty(&mut self, ino: InodeNo, stripe: u64) {
        self.dirty.entry(ino).or_default().insert(stripe);
    }

    /// The dirty stripes of `ino`, now no longer marked.
    pub(super) fn take_dirty(&mut self, ino: InodeNo) -> Vec<u64> {
        self.dirty
            .remove(&ino)
            .map(|s| s.into_iter().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounting() {
        let mut m = StripeMap::default();
        let a = InodeNo(1);
        assert_eq!(m.reserve(a, 0, 100, 150), Ok(()));
        assert_eq!(
            m.reserve(a, 0, 50, 150),
            Ok(()),
            "overwrite within the stripe"
        );
        assert_eq!(m.len(a, 0), Some(100));
        assert_eq!(m.reserve(a, 1, 51, 150), Err(NoSpace));
        assert_eq!(m.len(a, 1), None, "a refused write claims nothing");
        assert_eq!(m.reserve(a, 1, 50, 150), Ok(()));
        assert_eq!(m.used(), 150);
        m.set(a, 0, 10);
        assert_eq!(m.used(), 60);
        assert_eq!(m.stripes(a), vec![(0, 10), (1, 50)]);
        m.mark_dirty(a, 1);
        m.remove(a, 1);
        assert!(
            m.take_dirty(a).is_empty(),
            "removing a stripe clears its dirty mark"
        );
        m.remove(a, 0);
        assert_eq!(m.used(), 0);
        assert!(m.stripes(a).is_empty());
        m.mark_dirty(a, 5);
        assert_eq!(m.take_dirty(a), vec![5]);
        assert!(m.take_dirty(a).is_empty());
    }

    #[test]
    fn grants_count_against_every_reservation() {
        let mut m = StripeMap::default();
        let a = InodeNo(1);
        m.add_granted(60);
        assert_eq!(m.unpromised(100), 40);
        assert_eq!(
            m.reserve(a, 0, 41, 100),
            Err(NoSpace),
            "the promise is kept"
        );
        assert_eq!(m.reserve(a, 0, 40, 100), Ok(()));
        assert_eq!(m.unpromised(100), 0);
        // A grant's owner turns its promise into stored bytes.
        m.sub_granted(10);
        assert_eq!(m.reserve(a, 0, 50, 100), Ok(()));
        assert_eq!(m.used() + m.granted(), 100);
        m.sub_granted(1000);
        assert_eq!(m.granted(), 0, "never below zero");
    }

    #[test]
    fn a_prefix_reservation_takes_what_fits() {
        let mut m = StripeMap::default();
        let a = InodeNo(1);
        assert_eq!(m.reserve(a, 0, 80, 100), Ok(()));
        // 20 bytes free: a write of [70, 130) keeps [70, 100).
        assert_eq!(m.reserve_prefix(a, 0, 70, 130, 100), Ok(100));
        assert_eq!(m.len(a, 0), Some(100));
        // Full: an overwrite inside the stripe still fits, growth does not.
        assert_eq!(m.reserve_prefix(a, 0, 10, 20, 100), Ok(20));
        assert_eq!(m.reserve_prefix(a, 0, 90, 150, 100), Ok(100));
        assert_eq!(m.reserve_prefix(a, 0, 100, 101, 100), Err(NoSpace));
        assert_eq!(m.reserve_prefix(a, 1, 0, 1, 100), Err(NoSpace));
        assert_eq!(m.len(a, 1), None, "a refused write claims nothing");
        assert_eq!(m.used(), 100);
    }
}
