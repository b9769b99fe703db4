//! Directory read-ahead: a walk (`find`, `du`, `ls -R`, `rm -r`) lists a directory, then
//! each of its subdirectories in turn, and every listing is a round trip to every
//! server (a directory's entries are spread over all of them). Answered one after the
//! other, those round trips are most of a walk's time. So when a listing names
//! subdirectories, two threads list the first few of them ahead, in the order the walk
//! will take them, and each one the walk takes lets the next sibling start: a window of
//! `readdir_ahead` listings stays ahead of the walker (Lustre's statahead, for names).
//!
//! What a listing read ahead may show, and why that is safe:
//! * It is served only while younger than the entry lifetime, counted from when its
//!   round trip began: other clients' changes show within the same bound as every
//!   name the kernel caches.
//! * It is served only if this mount changed nothing since it began. Every operation
//!   that changes a name, attributes or data through this mount ends with `changed()`
//!   (fs.rs), which ends every listing already read; the kernel's own guard (a
//!   READDIRPLUS reply does not overwrite attributes changed after the request was
//!   sent) covers changes made while the listing is being answered. So a listing
//!   never hides this mount's own changes, nor undoes its own attributes.
//! * A listing the walk needs while it is still being read is waited for rather than
//!   asked twice.

use spillway_types::{Errno, FileKind, InodeNo};
use spillway_wire::messages::DirEntry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Lists one directory with attributes: `Instance::read_dir` in the mount; a fake in
/// the unit tests.
pub(crate) type Lister = dyn Fn(InodeNo) -> Result<Vec<DirEntry>, Errno> + Send + Sync;

/// Threads listing ahead: each listing is already a parallel round trip to every
/// server, and on the machines this runs on more would only take CPU from the walk.
const THREADS: usize = 2;
/// Listings held (read, not yet taken) at most, and entries in them: past either, no
/// more are read ahead until the walk takes some (or they expire). A directory of any
/// size is still read ahead, one at a time.
const MAX_READY: usize = 1024;
const MAX_READY_ENTRIES: usize = 1 << 16;
/// Directories whose subdirectories are being read ahead at once (walks in parallel).
const MAX_PLANS: usize = 256;

pub(crate) struct DirAhead {
    list: Box<Lister>,
    /// Listings older than this are not served (the entry lifetime).
    ttl: Duration,
    /// Subdirectories of one directory listed ahead at once (0: off).
    window: usize,
    /// Bumped by every change made through this mount.
    epoch: AtomicU64,
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    /// Listings read ahead, not yet taken, and how many entries they hold.
    ready: HashMap<InodeNo, Ready>,
    held: usize,
    /// Directories to list, the next first.
    queue: VecDeque<InodeNo>,
    /// Directories being listed now.
    busy: HashSet<InodeNo>,
    /// A listed directory's subdirectories, in the order a walk takes them, and how
    /// many of them were queued.
    plans: HashMap<InodeNo, Plan>,
    /// A queued subdirectory → the directory whose plan queued it.
    parent_of: HashMap<InodeNo, InodeNo>,
    stop: bool,
}

struct Ready {
    entries: Vec<DirEntry>,
    began: Instant,
    epoch: u64,
}

struct Plan {
    subdirs: Vec<InodeNo>,
    queued: usize,
}

impl DirAhead {
    /// Read-ahead with `window` listings ahead (0: none, and no threads), each served
    /// while younger than `ttl`.
    pub(crate) fn start(list: Box<Lister>, ttl: Duration, window: usize) -> Arc<DirAhead> {
        let ahead = Arc::new(DirAhead {
            list,
            ttl,
            window,
            epoch: AtomicU64::new(0),
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        });
        if window > 0 && !ttl.is_zero() {
            for n in 0..THREADS {
                let a = ahead.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("dirahead-{n}"))
                    .spawn(move || a.work());
                if let Err(e) = spawned {
                    tracing::warn!("directory read-ahead thread not started: {e}");
                }
            }
        }
        ahead
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn on(&self) -> bool {
        self.window > 0 && !self.ttl.is_zero()
    }

    /// Something changed through this mount: no listing read before now is served.
    pub(crate) fn changed(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// The listing of `dir` read ahead, if there is a fresh one (waiting for it if it
    /// is being read now). `None`: list it yourself.
    pub(crate) fn take(&self, dir: InodeNo) -> Option<Vec<DirEntry>> {
        if !self.on() {
            return None;
        }
        let mut st = self.state();
        self.advance(&mut st, dir);
        st.queue.retain(|&d| d != dir);
        while st.busy.contains(&dir) && !st.stop {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        let r = st.ready.remove(&dir)?;
        st.held -= r.entries.len();
        let fresh = r.began.elapsed() < self.ttl && r.epoch == self.epoch.load(Ordering::SeqCst);
        fresh.then_some(r.entries)
    }

    /// `dir` was just listed (read ahead or not): read its subdirectories ahead, the
    /// first `window` of them now, depth first as a walk goes.
    pub(crate) fn listed(&self, dir: InodeNo, entries: &[DirEntry]) {
        if !self.on() {
            return;
        }
        let subdirs: Vec<InodeNo> = entries
            .iter()
            .filter(|e| e.entry.kind == FileKind::Directory)
            .map(|e| e.entry.ino)
            .collect();
        if subdirs.is_empty() {
            return;
        }
        let mut st = self.state();
        if st.plans.len() >= MAX_PLANS {
            // Many walks at once, or plans nobody followed: start over.
            st.plans.clear();
            st.parent_of.clear();
        }
        let first = subdirs.len().min(self.window);
        // Queued at the front, in order: a walk descends into the first subdirectory
        // before it visits the siblings queued earlier.
        for &s in subdirs[..first].iter().rev() {
            st.parent_of.insert(s, dir);
            st.queue.push_front(s);
        }
        st.plans.insert(
            dir,
            Plan {
                subdirs,
                queued: first,
            },
        );
        drop(st);
        self.cv.notify_all();
    }

    /// The walk reached `dir`: queue the next subdirectory of its parent's plan, so
    /// that the window stays ahead.
    fn advance(&self, st: &mut State, dir: InodeNo) {
        let Some(parent) = st.parent_of.remove(&dir) else {
            return;
        };
        let Some(plan) = st.plans.get_mut(&parent) else {
            return;
        };
        if let Some(&next) = plan.subdirs.get(plan.queued) {
            plan.queued += 1;
            st.parent_of.insert(next, parent);
            st.queue.push_back(next);
            self.cv.notify_all();
        } else {
            st.plans.remove(&parent);
        }
    }

    /// A thread listing ahead until the mount stops.
    fn work(&self) {
        loop {
            let mut st = self.state();
            let dir = loop {
                if st.stop {
                    return;
                }
                self.purge(&mut st);
                if st.ready.len() < MAX_READY && st.held < MAX_READY_ENTRIES {
                    if let Some(d) = st.queue.pop_front() {
                        if !st.busy.contains(&d) && !st.ready.contains_key(&d) {
                            break d;
                        }
                        continue;
                    }
                }
                // Woken by new work or a take; and when what is held expires.
                st = self
                    .cv
                    .wait_timeout(st, self.ttl)
                    .map_or_else(|e| e.into_inner().0, |r| r.0);
            };
            st.busy.insert(dir);
            drop(st);
            let began = Instant::now();
            let epoch = self.epoch.load(Ordering::SeqCst);
            let listed = (self.list)(dir);
            let mut st = self.state();
            st.busy.remove(&dir);
            match listed {
                Ok(entries) => {
                    st.held += entries.len();
                    let r = Ready {
                        entries,
                        began,
                        epoch,
                    };
                    if let Some(old) = st.ready.insert(dir, r) {
                        st.held -= old.entries.len();
                    }
                }
                Err(e) => tracing::debug!(%dir, "listing ahead failed: {e}"),
            }
            drop(st);
            self.cv.notify_all();
        }
    }

    /// Drop the listings that can no longer be served (too old, or read before a
    /// change through the mount).
    fn purge(&self, st: &mut State) {
        let epoch = self.epoch.load(Ordering::SeqCst);
        let ttl = self.ttl;
        let mut dropped = 0;
        st.ready.retain(|_, r| {
            let keep = r.epoch == epoch && r.began.elapsed() < ttl;
            if !keep {
                dropped += r.entries.len();
            }
            keep
        });
        st.held -= dropped;
    }

    /// Stop the threads (at unmount).
    pub(crate) fn stop(&self) {
        self.state().stop = true;
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_wire::messages::EntryRef;
    use std::sync::atomic::AtomicUsize;

    fn entry(name: &str, ino: u64, kind: FileKind) -> DirEntry {
        DirEntry {
            name: name.as_bytes().to_vec(),
            entry: EntryRef {
                ino: InodeNo(ino),
                kind,
            },
            attr: None,
        }
    }

    /// A tree: directory n has a file and, while n < 10000, subdirectories 10n+1..10n+3:
    /// from the root 1, four levels of 3, 9, 27 and 81 directories.
    fn tree(calls: Arc<AtomicUsize>) -> Box<Lister> {
        Box::new(move |d: InodeNo| {
            calls.fetch_add(1, Ordering::SeqCst);
            let mut v = vec![entry("f", 1_000_000 + d.0, FileKind::Regular)];
            if d.0 < 10_000 {
                for k in 1..=3 {
                    v.push(entry(&format!("d{k}"), d.0 * 10 + k, FileKind::Directory));
                }
            }
            Ok(v)
        })
    }

    fn walk(a: &DirAhead, list: &Lister, d: InodeNo, hits: &mut usize) {
        let entries = match a.take(d) {
            Some(e) => {
                *hits += 1;
                e
            }
            None => list(d).unwrap(),
        };
        a.listed(d, &entries);
        for e in entries {
            if e.entry.kind == FileKind::Directory {
                walk(a, list, e.entry.ino, hits);
            }
        }
    }

    #[test]
    fn a_walk_finds_its_listings_read_ahead() {
        let calls = Arc::new(AtomicUsize::new(0));
        let a = DirAhead::start(tree(calls.clone()), Duration::from_secs(30), 4);
        // The walker's own listings take a while, as a round trip does, so that the
        // threads get ahead of it.
        let inner = tree(Arc::new(AtomicUsize::new(0)));
        let own: Box<Lister> = Box::new(move |d| {
            std::thread::sleep(Duration::from_millis(3));
            inner(d)
        });
        let mut hits = 0;
        walk(&a, &own, InodeNo(1), &mut hits);
        a.stop();
        // 3 + 9 + 27 + 81 directories below the root. Most are served from
        // read-ahead (how many depends on the threads' scheduling); none is read
        // ahead twice.
        let below = 3 + 9 + 27 + 81;
        assert!(
            hits >= below / 2,
            "{hits} of {below} served from read-ahead"
        );
        let calls = calls.load(Ordering::SeqCst);
        assert!(
            hits <= calls && calls <= below,
            "{calls} listings read ahead for {below}"
        );
    }

    #[test]
    fn a_change_through_the_mount_voids_what_was_read() {
        let calls = Arc::new(AtomicUsize::new(0));
        let a = DirAhead::start(tree(calls.clone()), Duration::from_secs(30), 4);
        let root = tree(Arc::new(AtomicUsize::new(0)))(InodeNo(1)).unwrap();
        a.listed(InodeNo(1), &root);
        // Let the threads read the three subdirectories.
        let t0 = Instant::now();
        while calls.load(Ordering::SeqCst) < 3 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        a.changed();
        for d in [11, 12, 13] {
            assert!(
                a.take(InodeNo(d)).is_none(),
                "a listing read before a change served"
            );
        }
        a.stop();
    }

    #[test]
    fn what_is_held_stays_bounded() {
        // 100 subdirectories of 20,000 entries each, all in the window: the threads
        // stop reading ahead once the entries held pass the bound.
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let big: Box<Lister> = Box::new(move |d: InodeNo| {
            c.fetch_add(1, Ordering::SeqCst);
            Ok((0..20_000)
                .map(|k| entry(&format!("e{k}"), d.0 * 100_000 + k, FileKind::Regular))
                .collect())
        });
        let a = DirAhead::start(big, Duration::from_secs(30), 256);
        let parent: Vec<DirEntry> = (0..100)
            .map(|k| entry(&format!("d{k}"), 1000 + k, FileKind::Directory))
            .collect();
        a.listed(InodeNo(1), &parent);
        std::thread::sleep(Duration::from_millis(500));
        let held = a.state().held;
        a.stop();
        assert!(
            held <= MAX_READY_ENTRIES + THREADS * 20_000,
            "{held} entries held"
        );
        assert!(
            calls.load(Ordering::SeqCst) < 100,
            "read ahead past the bound"
        );
    }

    #[test]
    fn old_listings_are_not_served_and_off_means_off() {
        let calls = Arc::new(AtomicUsize::new(0));
        let a = DirAhead::start(tree(calls.clone()), Duration::from_millis(50), 4);
        let root = tree(Arc::new(AtomicUsize::new(0)))(InodeNo(1)).unwrap();
        a.listed(InodeNo(1), &root);
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            a.take(InodeNo(11)).is_none(),
            "a listing older than the entry lifetime"
        );
        a.stop();

        let calls = Arc::new(AtomicUsize::new(0));
        let off = DirAhead::start(tree(calls.clone()), Duration::from_secs(30), 0);
        off.listed(InodeNo(1), &root);
        std::thread::sleep(Duration::from_millis(50));
        assert!(off.take(InodeNo(11)).is_none());
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "window 0 lists nothing ahead"
        );
    }
}
