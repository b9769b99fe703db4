//! What the stripes of each inode occupy on this server's disk (`st_blocks` × 512 of
//! their files), for the reports to the inodes' homes (fragment/allocs.rs). Writes,
//! fills, truncations and fallocates mark what changed; the reporter takes the marks
//! and `allocated` re-stats only the stripes marked (a streaming writer of a 100 GiB
//! file does not cost a stat of every stripe file per report), keeping the last value
//! of each stripe.

use super::{naming, DataStore};
use crate::error::StoreResult;
use spillway_types::InodeNo;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;
use std::sync::{Mutex, MutexGuard};

/// What changed of one inode since its last report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Changed {
    /// These stripes were written.
    Stripes(BTreeSet<u64>),
    /// Anything may have changed (truncation, fallocate, start, a failed report).
    All,
}

impl Changed {
    fn merge(&mut self, other: Changed) {
        match (&mut *self, other) {
            (Changed::All, _) => {}
            (_, Changed::All) => *self = Changed::All,
            (Changed::Stripes(a), Changed::Stripes(b)) => a.extend(b),
        }
    }
}

/// Marks and the last known allocation per stripe, with a doorbell for the reporter
/// (rings coalesce).
pub(super) struct AllocTracker {
    changed: Mutex<HashMap<InodeNo, Changed>>,
    known: Mutex<HashMap<InodeNo, BTreeMap<u64, u64>>>,
    bell_tx: crossbeam_channel::Sender<()>,
    bell_rx: crossbeam_channel::Receiver<()>,
}

impl Default for AllocTracker {
    fn default() -> Self {
        let (bell_tx, bell_rx) = crossbeam_channel::bounded(1);
        AllocTracker {
            changed: Mutex::default(),
            known: Mutex::default(),
            bell_tx,
            bell_rx,
        }
    }
}

impl AllocTracker {
    fn changed(&self) -> MutexGuard<'_, HashMap<InodeNo, Changed>> {
        self.changed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn known(&self) -> MutexGuard<'_, HashMap<InodeNo, BTreeMap<u64, u64>>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, ino: InodeNo, c: Changed) {
        let fresh = {
            let mut m = self.changed();
            match m.get_mut(&ino) {
                Some(cur) => {
                    cur.merge(c);
                    false
                }
                None => {
                    m.insert(ino, c);
                    true
                }
            }
        };
        if fresh {
            let _ = self.bell_tx.try_send(());
        }
    }

    /// A stripe of `ino` was written (on every write: no allocation once the inode and
    /// stripe are marked).
    pub(super) fn mark_stripe(&self, ino: InodeNo, stripe: u64) {
        {
            let mut m = self.changed();
            match m.get_mut(&ino) {
                Some(Changed::All) => return,
                Some(Changed::Stripes(s)) => {
                    s.insert(stripe);
                    return;
                }
                None => {}
            }
        }
        self.add(ino, Changed::Stripes(BTreeSet::from([stripe])));
    }

    /// Anything of `ino` may have changed.
    pub(super) fn mark(&self, ino: InodeNo) {
        self.add(ino, Changed::All);
    }

    /// `ino`'s data is gone for good (purged): nothing to report or remember.
    pub(super) fn forget(&self, ino: InodeNo) {
        self.changed().remove(&ino);
        self.known().remove(&ino);
    }
}

impl DataStore {
    /// The inodes marked since they were last taken (the reporter's work list).
    pub(crate) fn take_alloc_changes(&self) -> Vec<(InodeNo, Changed)> {
        self.allocs.changed().drain().collect()
    }

    /// One inode's marks (it is being reported right now).
    pub(crate) fn take_alloc_change(&self, ino: InodeNo) -> Changed {
        self.allocs
            .changed()
            .remove(&ino)
            .unwrap_or(Changed::Stripes(BTreeSet::new()))
    }

    /// Mark inodes again (their report failed).
    pub(crate) fn remark_allocs(&self, inos: impl IntoIterator<Item = InodeNo>) {
        for ino in inos {
            self.allocs.mark(ino);
        }
    }

    /// The doorbell that rings when an inode is marked.
    pub(crate) fn alloc_bell(&self) -> &crossbeam_channel::Receiver<()> {
        &self.allocs.bell_rx
    }

    /// Mark every inode with a stripe file here (at start: each is reported once, which
    /// also fills in the homes of fragments made before allocation was tracked).
    pub(crate) fn mark_all_allocs(&self) -> StoreResult<()> {
        for ino in self.inodes_on_disk()? {
            self.allocs.mark(ino);
        }
        Ok(())
    }

    /// Every inode with a stripe file here, listed from the directory (the index is
    /// looked up by inode).
    pub(crate) fn inodes_on_disk(&self) -> StoreResult<BTreeSet<InodeNo>> {
        let mut inos = BTreeSet::new();
        for bucket in std::fs::read_dir(&self.dir)? {
            let bucket = bucket?;
            let bname = bucket.file_name();
            let (Some(bname), Ok(files)) = (bname.to_str(), std::fs::read_dir(bucket.path()))
            else {
                continue;
            };
            for file in files {
                let fname = file?.file_name();
                if let Some((ino, _)) = fname.to_str().and_then(|f| naming::parse(bname, f)) {
                    inos.insert(ino);
                }
            }
        }
        Ok(inos)
    }

    /// Bytes of disk the stripes of `ino` occupy here, re-reading what `changed` says.
    pub(crate) fn allocated(&self, ino: InodeNo, changed: &Changed) -> u64 {
        let _g = self.lock_of(ino).read().unwrap_or_else(|e| e.into_inner());
        let blocks = |k: u64| {
            std::fs::metadata(naming::stripe_path(&self.dir, ino, k))
                .ok()
                .map(|m| m.blocks().saturating_mul(512))
        };
        let fresh: Vec<(u64, Option<u64>)> = match changed {
            Changed::All => self
                .map()
                .stripes(ino)
                .into_iter()
                .map(|(k, _)| (k, blocks(k)))
                .collect(),
            Changed::Stripes(s) => s.iter().map(|&k| (k, blocks(k))).collect(),
        };
        let mut known = self.allocs.known();
        let entry = known.entry(ino).or_default();
        if *changed == Changed::All {
            entry.clear();
        }
        for (k, b) in fresh {
            match b {
                Some(b) => entry.insert(k, b),
                None => entry.remove(&k),
            };
        }
        let total = entry.values().fold(0u64, |a, &b| a.saturating_add(b));
        if entry.is_empty() {
            known.remove(&ino);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_marked_stripes_are_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let s = DataStore::open(dir.path(), 1 << 30, 8).unwrap();
        let ino = InodeNo(3);
        s.write(ino, 0, 0, &[1u8; 8192]).unwrap();
        s.write(ino, 1, 0, &[1u8; 8192]).unwrap();
        let marks = s.take_alloc_changes();
        assert_eq!(marks, vec![(ino, Changed::Stripes(BTreeSet::from([0, 1])))]);
        assert!(s.alloc_bell().try_recv().is_ok(), "the first mark rang");
        let both = s.allocated(ino, &marks[0].1);
        assert!(both >= 16384, "{both}");
        // Stripe 1 grows behind the tracker's back: not read again until marked.
        std::fs::OpenOptions::new()
            .write(true)
            .open(naming::stripe_path(dir.path(), ino, 1))
            .and_then(|f| std::os::unix::fs::FileExt::write_all_at(&f, &[2u8; 65536], 8192))
            .unwrap();
        let none = Changed::Stripes(BTreeSet::new());
        assert_eq!(s.allocated(ino, &none), both);
        assert!(s.allocated(ino, &Changed::Stripes(BTreeSet::from([1]))) > both);
        s.truncate(ino, 0, 65536).unwrap();
        assert_eq!(s.take_alloc_change(ino), Changed::All);
        assert_eq!(s.allocated(ino, &Changed::All), 0);
    }
}
