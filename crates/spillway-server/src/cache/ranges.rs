//! A set of byte ranges `[start, end)`, kept merged: adding joins overlapping and
//! touching ranges, removing cuts them.

use std::collections::BTreeMap;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct RangeSet {
    /// start → end, disjoint and not touching.
    r: BTreeMap<u64, u64>,
}

impl RangeSet {
    pub(crate) fn is_empty(&self) -> bool {
        self.r.is_empty()
    }

    /// The ranges, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.r.iter().map(|(&s, &e)| (s, e))
    }

    /// Bytes covered.
    pub(crate) fn bytes(&self) -> u64 {
        self.iter().map(|(s, e)| e - s).sum()
    }

    pub(crate) fn add(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        // Every range that overlaps or touches [s, e): starts at or before e, ends at or
        // after s.
        let joined: Vec<(u64, u64)> = self
            .r
            .range(..=e)
            .rev()
            .take_while(|(_, &re)| re >= s)
            .map(|(&rs, &re)| (rs, re))
            .collect();
        for (rs, re) in joined {
            self.r.remove(&rs);
            s = s.min(rs);
            e = e.max(re);
        }
        self.r.insert(s, e);
    }

    pub(crate) fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let hit: Vec<(u64, u64)> = self
            .r
            .range(..end)
            .rev()
            .take_while(|(_, &re)| re > start)
            .map(|(&rs, &re)| (rs, re))
            .collect();
        for (rs, re) in hit {
            self.r.remove(&rs);
            if rs < start {
                self.r.insert(rs, start);
            }
            if re > end {
                self.r.insert(end, re);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RangeSet;
    use proptest::prelude::*;

    #[test]
    fn adds_merge_and_removes_cut() {
        let mut s = RangeSet::default();
        s.add(10, 20);
        s.add(30, 40);
        s.add(20, 30);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(10, 40)]);
        s.remove(15, 25);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(10, 15), (25, 40)]);
        s.remove(0, 100);
        assert!(s.is_empty());
        s.add(5, 5);
        assert!(s.is_empty());
    }

    proptest! {
        /// Against a bitmap model: any sequence of adds and removes covers exactly the
        /// bytes the model holds, in disjoint, non-touching ranges.
        #[test]
        fn matches_a_bitmap(ops in proptest::collection::vec((any::<bool>(), 0u64..200, 0u64..40), 0..60)) {
            let mut s = RangeSet::default();
            let mut model = [false; 240];
            for (add, start, len) in ops {
                let end = start + len;
                if add { s.add(start, end) } else { s.remove(start, end) }
                for b in &mut model[start as usize..end as usize] { *b = add; }
            }
            let mut got = [false; 240];
            let mut last_end = None;
            for (a, b) in s.iter() {
                prop_assert!(a < b);
                if let Some(le) = last_end { prop_assert!(a > le, "touching or overlapping ranges"); }
                last_end = Some(b);
                for x in &mut got[a as usize..b as usize] { *x = true; }
            }
            prop_assert_eq!(got, model);
        }
    }
}
