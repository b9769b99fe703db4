//! Counts of open handles per inode: one table per fragment (does anyone have it
//! open?) and one per session (what to release when the connection goes).

use spillway_types::InodeNo;
use std::collections::HashMap;

#[derive(Default, Debug)]
pub(crate) struct OpenCounts(HashMap<InodeNo, u64>);

impl OpenCounts {
    pub(crate) fn add(&mut self, ino: InodeNo, n: u64) {
        *self.0.entry(ino).or_insert(0) += n;
    }

    /// Take up to `n` opens of `ino` away; returns how many were taken and how many are
    /// left.
    pub(crate) fn sub(&mut self, ino: InodeNo, n: u64) -> (u64, u64) {
        let Some(c) = self.0.get_mut(&ino) else {
            return (0, 0);
        };
        let taken = n.min(*c);
        *c -= taken;
        let left = *c;
        if left == 0 {
            self.0.remove(&ino);
        }
        (taken, left)
    }

    pub(crate) fn count(&self, ino: InodeNo) -> u64 {
        self.0.get(&ino).copied().unwrap_or(0)
    }

    pub(crate) fn drain(&mut self) -> Vec<(InodeNo, u64)> {
        self.0.drain().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        let mut o = OpenCounts::default();
        o.add(InodeNo(1), 2);
        assert_eq!(o.sub(InodeNo(1), 1), (1, 1));
        assert_eq!(o.sub(InodeNo(1), 5), (1, 0));
        assert_eq!(o.sub(InodeNo(1), 1), (0, 0));
        assert_eq!(o.count(InodeNo(1)), 0);
        o.add(InodeNo(2), 1);
        assert_eq!(o.drain(), vec![(InodeNo(2), 1)]);
    }
}
