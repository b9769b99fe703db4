//! What stripes a fragment holds, their lengths, the fragment's used bytes, and which
//! stripes were written since their last fdatasync. Pure bookkeeping, no I/O: rebuilt
//! from a listing of `stripes/` at start.

use spillway_types::InodeNo;
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[derive(Default)]
pub struct StripeMap {
    files: HashMap<InodeNo, BTreeMap<u64, u64>>,
    dirty: HashMap<InodeNo, BTreeSet<u64>>,
    used: u64,
}

/// Writing would take the fragment over its capacity.
#[derive(Debug, PartialEq, Eq)]
pub struct NoSpace;

impl StripeMap {
    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn len(&self, ino: InodeNo, stripe: u64) -> Option<u64> {
        self.files.get(&ino).and_then(|s| s.get(&stripe)).copied()
    }

    /// Stripes of `ino` with their lengths, in stripe order.
    pub fn stripes(&self, ino: InodeNo) -> Vec<(u64, u64)> {
        self.files
            .get(&ino)
            .map(|s| s.iter().map(|(&k, &l)| (k, l)).collect())
            .unwrap_or_default()
    }

    /// Record the length of a stripe (present from now on).
    pub fn set(&mut self, ino: InodeNo, stripe: u64, len: u64) {
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
    pub fn remove(&mut self, ino: InodeNo, stripe: u64) {
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
    /// becomes at least `end`, unless the growth would exceed `capacity`.
    pub fn reserve(
        &mut self,
        ino: InodeNo,
        stripe: u64,
        end: u64,
        capacity: u64,
    ) -> Result<(), NoSpace> {
        let cur = self.len(ino, stripe).unwrap_or(0);
        let growth = end.saturating_sub(cur);
        if self.used.saturating_add(growth) > capacity {
            return Err(NoSpace);
        }
        self.set(ino, stripe, cur.max(end));
        Ok(())
    }

    pub fn mark_dirty(&mut self, ino: InodeNo, stripe: u64) {
        self.dirty.entry(ino).or_default().insert(stripe);
    }

    /// The dirty stripes of `ino`, now no longer marked.
    pub fn take_dirty(&mut self, ino: InodeNo) -> Vec<u64> {
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
}
