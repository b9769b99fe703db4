//! The locks of one inode in one lock space, with POSIX's rules: a lock conflicts with
//! another owner's overlapping lock when either is a write lock; an owner's own locks
//! never conflict and are replaced over the requested range (a lock converts, merges
//! with adjacent or overlapping locks of the same kind, and an unlock of a sub-range
//! splits a lock in two). Pure data: no time, no sessions, no I/O.

/// Who holds a lock: a client's session at the home and the owner id the client's
/// kernel gave it (a process's file table for fcntl locks, an open file description
/// for OFD locks and flocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Owner {
    pub session: u64,
    pub id: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Read,
    Write,
}

/// One held lock on bytes `[start, end]` (inclusive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Held {
    pub owner: Owner,
    pub kind: Kind,
    pub start: u64,
    pub end: u64,
    /// The holder's pid as its client's kernel saw it (for F_GETLK).
    pub pid: u32,
}

impl Held {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    fn conflicts(&self, owner: Owner, kind: Kind, start: u64, end: u64) -> bool {
        self.owner != owner
            && self.overlaps(start, end)
            && (self.kind == Kind::Write || kind == Kind::Write)
    }
}

#[derive(Debug, Default, Clone)]
pub(super) struct RangeLocks {
    held: Vec<Held>,
}

impl RangeLocks {
    pub(super) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Held> {
        self.held.iter()
    }

    /// The first lock of another owner that a `kind` lock on `[start, end]` would
    /// conflict with (lowest start first, as Linux reports).
    pub(super) fn conflict(&self, owner: Owner, kind: Kind, start: u64, end: u64) -> Option<&Held> {
        self.held
            .iter()
            .filter(|h| h.conflicts(owner, kind, start, end))
            .min_by_key(|h| h.start)
    }

    /// How many locks `owner` holds here.
    pub(super) fn count(&self, owner: Owner) -> u32 {
        self.held.iter().filter(|h| h.owner == owner).count() as u32
    }

    /// fcntl's F_SETLK: `kind` None unlocks. On a conflict nothing changes and the
    /// conflicting lock is returned.
    pub(super) fn set_posix(
        &mut self,
        owner: Owner,
        kind: Option<Kind>,
        start: u64,
        end: u64,
        pid: u32,
    ) -> Result<(), Held> {
        if let Some(k) = kind {
            if let Some(c) = self.conflict(owner, k, start, end) {
                return Err(c.clone());
            }
        }
        // Cut the owner's locks out of [start, end]; keep what lies outside.
        let mut mine = Vec::new();
        let mut rest = Vec::with_capacity(self.held.len());
        for h in self.held.drain(..) {
            if h.owner != owner {
                rest.push(h);
            } else if !h.overlaps(start, end) {
                mine.push(h);
            } else {
                if h.start < start {
                    mine.push(Held {
                        end: start - 1,
                        ..h.clone()
                    });
                }
                if h.end > end {
                    mine.push(Held {
                        start: end + 1,
                        ..h
                    });
                }
            }
        }
        if let Some(k) = kind {
            mine.push(Held {
                owner,
                kind: k,
                start,
                end,
                pid,
            });
        }
        rest.extend(merge(mine));
        self.held = rest;
        Ok(())
    }

    /// flock(2): an owner holds at most one whole-file lock. As in Linux, a change
    /// first drops the owner's lock, then takes the new one if nothing conflicts (so
    /// a refused conversion leaves the owner with no lock, and two shared holders
    /// converting at once cannot deadlock).
    pub(super) fn set_flock(
        &mut self,
        owner: Owner,
        kind: Option<Kind>,
        pid: u32,
    ) -> Result<(), Held> {
        if let Some(k) = kind {
            if let Some(h) = self.held.iter().find(|h| h.owner == owner) {
                if h.kind == k {
                    return Ok(());
                }
            }
        }
        self.held.retain(|h| h.owner != owner);
        let Some(k) = kind else { return Ok(()) };
        if let Some(c) = self.conflict(owner, k, 0, u64::MAX) {
            return Err(c.clone());
        }
        self.held.push(Held {
            owner,
            kind: k,
            start: 0,
            end: u64::MAX,
            pid,
        });
        Ok(())
    }

    /// Drop every lock whose owner `gone` says is gone; how many were dropped.
    pub(super) fn drop_owners(&mut self, gone: impl Fn(&Owner) -> bool) -> usize {
        let before = self.held.len();
        self.held.retain(|h| !gone(&h.owner));
        before - self.held.len()
    }
}

/// One owner's locks with overlapping or adjacent ranges of one kind joined.
fn merge(mut mine: Vec<Held>) -> Vec<Held> {
    mine.sort_by_key(|h| h.start);
    let mut out: Vec<Held> = Vec::with_capacity(mine.len());
    for h in mine {
        if let Some(last) = out.last_mut() {
            let touches = last.end == u64::MAX || last.end + 1 >= h.start;
            if last.kind == h.kind && touches {
                if h.end > last.end {
                    last.end = h.end;
                }
                // The newest request's pid is the one F_GETLK reports.
                last.pid = h.pid;
                continue;
            }
        }
        out.push(h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: Owner = Owner { session: 1, id: 10 };
    const B: Owner = Owner { session: 2, id: 10 };

    fn ranges(l: &RangeLocks, o: Owner) -> Vec<(Kind, u64, u64)> {
        let mut v: Vec<_> = l
            .iter()
            .filter(|h| h.owner == o)
            .map(|h| (h.kind, h.start, h.end))
            .collect();
        v.sort_by_key(|x| x.1);
        v
    }

    #[test]
    fn write_conflicts_read_shares_disjoint_is_free() {
        let mut l = RangeLocks::default();
        l.set_posix(A, Some(Kind::Write), 0, 99, 7).unwrap();
        let c = l.set_posix(B, Some(Kind::Read), 50, 60, 8).unwrap_err();
        assert_eq!((c.start, c.end, c.pid), (0, 99, 7));
        l.set_posix(B, Some(Kind::Write), 100, 199, 8).unwrap();
        l.set_posix(A, Some(Kind::Read), 1000, 1099, 7).unwrap();
        l.set_posix(B, Some(Kind::Read), 1050, 1060, 8).unwrap();
        assert!(l.set_posix(B, Some(Kind::Write), 1050, 1060, 8).is_err());
        // A refused request changed nothing.
        assert_eq!(
            ranges(&l, B),
            vec![(Kind::Write, 100, 199), (Kind::Read, 1050, 1060)]
        );
    }

    #[test]
    fn own_locks_merge_split_and_convert() {
        let mut l = RangeLocks::default();
        l.set_posix(A, Some(Kind::Write), 0, 9, 1).unwrap();
        l.set_posix(A, Some(Kind::Write), 10, 19, 1).unwrap();
        assert_eq!(ranges(&l, A), vec![(Kind::Write, 0, 19)], "adjacent merge");
        l.set_posix(A, None, 5, 14, 1).unwrap();
        assert_eq!(
            ranges(&l, A),
            vec![(Kind::Write, 0, 4), (Kind::Write, 15, 19)],
            "unlock of a sub-range splits"
        );
        l.set_posix(A, Some(Kind::Read), 3, 16, 1).unwrap();
        assert_eq!(
            ranges(&l, A),
            vec![
                (Kind::Write, 0, 2),
                (Kind::Read, 3, 16),
                (Kind::Write, 17, 19)
            ],
            "conversion of the overlap"
        );
        l.set_posix(A, None, 0, u64::MAX, 1).unwrap();
        assert!(l.is_empty());
    }

    #[test]
    fn to_end_of_file() {
        let mut l = RangeLocks::default();
        l.set_posix(A, Some(Kind::Write), 100, u64::MAX, 1).unwrap();
        l.set_posix(A, Some(Kind::Write), 0, 99, 1).unwrap();
        assert_eq!(ranges(&l, A), vec![(Kind::Write, 0, u64::MAX)]);
        l.set_posix(A, None, 50, 59, 1).unwrap();
        assert_eq!(
            ranges(&l, A),
            vec![(Kind::Write, 0, 49), (Kind::Write, 60, u64::MAX)]
        );
        assert!(l.conflict(B, Kind::Read, u64::MAX, u64::MAX).is_some());
        assert!(l.conflict(B, Kind::Read, 50, 59).is_none());
    }

    #[test]
    fn flock_drops_before_converting() {
        let mut l = RangeLocks::default();
        l.set_flock(A, Some(Kind::Read), 1).unwrap();
        l.set_flock(B, Some(Kind::Read), 2).unwrap();
        // A's upgrade is refused and, as in Linux, A's shared lock is gone.
        assert!(l.set_flock(A, Some(Kind::Write), 1).is_err());
        assert_eq!(l.count(A), 0);
        l.set_flock(B, Some(Kind::Write), 2).unwrap();
        assert_eq!(ranges(&l, B), vec![(Kind::Write, 0, u64::MAX)]);
        l.set_flock(B, None, 2).unwrap();
        assert!(l.is_empty());
    }

    /// A model: which kind (if any) each owner holds on each byte of a small file.
    type Model = Vec<[Option<Kind>; 2]>;

    fn apply(model: &mut Model, who: usize, kind: Option<Kind>, s: u64, e: u64) -> bool {
        let other = 1 - who;
        if let Some(k) = kind {
            let clash = (s..=e).any(|b| match model[b as usize][other] {
                Some(o) => o == Kind::Write || k == Kind::Write,
                None => false,
            });
            if clash {
                return false;
            }
        }
        for b in s..=e {
            model[b as usize][who] = kind;
        }
        true
    }

    proptest! {
        /// Any sequence of locks and unlocks by two owners over 64 bytes leaves exactly
        /// the byte-wise model's state, with every owner's ranges disjoint, sorted-
        /// mergeable (no two adjacent ranges of one kind) and never conflicting.
        #[test]
        fn matches_a_bytewise_model(ops in proptest::collection::vec(
            (0usize..2, 0u8..3, 0u64..64, 0u64..64), 1..60)) {
            let owners = [A, B];
            let mut l = RangeLocks::default();
            let mut model: Model = vec![[None, None]; 64];
            for (who, k, a, b) in ops {
                let (s, e) = (a.min(b), a.max(b));
                let kind = match k { 0 => None, 1 => Some(Kind::Read), _ => Some(Kind::Write) };
                let ok = l.set_posix(owners[who], kind, s, e, who as u32).is_ok();
                prop_assert_eq!(ok, apply(&mut model, who, kind, s, e));
            }
            for (w, o) in owners.iter().enumerate() {
                let rs = ranges(&l, *o);
                for pair in rs.windows(2) {
                    prop_assert!(pair[0].2 < pair[1].1, "overlap {:?}", pair);
                    prop_assert!(!(pair[0].0 == pair[1].0 && pair[0].2 + 1 == pair[1].1),
                        "unmerged {:?}", pair);
                }
                for b in 0..64u64 {
                    let held = rs.iter().find(|r| r.1 <= b && b <= r.2).map(|r| r.0);
                    prop_assert_eq!(held, model[b as usize][w], "byte {}", b);
                }
            }
        }
    }
}
