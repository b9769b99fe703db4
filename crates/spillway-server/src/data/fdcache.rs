//! An LRU of open stripe files. The fd limit here (20,000, not raisable) is far below
//! the number of stripe files a fragment holds, so files are opened on demand and at
//! most `capacity` stay open; the least recently used is closed to make room.
//! Handles are `Arc`s: one evicted while a request uses it closes when that request
//! ends, so open fds never exceed capacity + requests in flight.

use spillway_types::InodeNo;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::sync::{Arc, Mutex};

pub(super) type Key = (InodeNo, u64);

struct Slot {
    file: Arc<File>,
    used: u64,
}

#[derive(Default)]
struct Lru {
    slots: HashMap<Key, Slot>,
    /// Last-use stamp → key; the first entry is the least recently used.
    order: BTreeMap<u64, Key>,
    clock: u64,
}

impl Lru {
    fn touch(&mut self, key: Key) -> Option<Arc<File>> {
        let slot = self.slots.get_mut(&key)?;
        self.order.remove(&slot.used);
        self.clock += 1;
        slot.used = self.clock;
        self.order.insert(self.clock, key);
        Some(slot.file.clone())
    }
}

pub(super) struct FdCache {
    capacity: usize,
    lru: Mutex<Lru>,
}

impl FdCache {
    pub(super) fn new(capacity: usize) -> FdCache {
        FdCache {
            capacity: capacity.max(1),
            lru: Mutex::new(Lru::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.lru.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn get(&self, key: Key) -> Option<Arc<File>> {
        self.lock().touch(key)
    }

    /// Cache a newly opened file and return the handle to use: when another request
    /// opened the same stripe meanwhile, its handle wins and `file` is closed.
    pub(super) fn insert(&self, key: Key, file: File) -> Arc<File> {
        let mut lru = self.lock();
        if let Some(existing) = lru.touch(key) {
            return existing;
        }
        while lru.slots.len() >= self.capacity {
            let Some((_, oldest)) = lru.order.pop_first() else {
                break;
            };
            lru.slots.remove(&oldest);
        }
        lru.clock += 1;
        let used = lru.clock;
        let file = Arc::new(file);
        lru.slots.insert(
            key,
            Slot {
                file: file.clone(),
                used,
            },
        );
        lru.order.insert(used, key);
        file
    }

    pub(super) fn evict(&self, key: Key) {
        let mut lru = self.lock();
        if let Some(slot) = lru.slots.remove(&key) {
            lru.order.remove(&slot.used);
        }
    }

    pub(super) fn clear(&self) {
        let mut lru = self.lock();
        lru.slots.clear();
        lru.order.clear();
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> File {
        tempfile::tempfile().unwrap()
    }

    #[test]
    fn evicts_least_recently_used() {
        let c = FdCache::new(2);
        let k = |i| (InodeNo(i), 0);
        c.insert(k(1), file());
        c.insert(k(2), file());
        assert!(c.get(k(1)).is_some());
        c.insert(k(3), file());
        assert_eq!(c.len(), 2);
        assert!(c.get(k(2)).is_none(), "2 was least recently used");
        assert!(c.get(k(1)).is_some() && c.get(k(3)).is_some());
        c.evict(k(1));
        assert!(c.get(k(1)).is_none());
        assert_eq!(c.len(), 1);
        c.clear();
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn a_racing_insert_keeps_the_first_handle() {
        let c = FdCache::new(4);
        let a = c.insert((InodeNo(1), 1), file());
        let b = c.insert((InodeNo(1), 1), file());
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(c.len(), 1);
    }
}
