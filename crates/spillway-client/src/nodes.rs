//! What this client knows about inodes (attributes, kernel lookups, its open files and
//! their write-back buffers) and its open file and directory handles.

use crate::writeback::WriteBack;
use spillway_types::{Attr, InodeNo, Timespec};
use spillway_wire::messages::DirEntry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A file's version as its cached pages know it: size, mtime, and for a cache
/// instance ctime too (a change on the PFS that kept size and mtime, e.g. `touch -r`
/// after a rewrite, still moves ctime); zero on scratch, whose servers see every change.
pub type Stamp = (u64, Timespec, Timespec);

pub struct Node {
    /// Last attributes received from the inode's home server.
    pub attr: Attr,
    /// Kernel references (lookups minus forgets).
    pub lookups: u64,
    /// Open file handles in this client.
    pub opens: u32,
    /// The write-back buffer, while the file is open here.
    pub wb: Option<Arc<WriteBack>>,
    /// What the kernel's page cache reflects (`Stamp`); a different one at open
    /// means another client changed the file and the cache must go.
    pub cached: Option<Stamp>,
    /// `security.capability` as last fetched, and when: the kernel asks for it before
    /// every write (FUSE inodes never get S_NOSEC), so it is answered from here for the
    /// attribute lifetime instead of costing a round trip per write.
    pub capability: Option<(std::time::Instant, Option<Vec<u8>>)>,
    /// A directory's default ACL as last fetched or set here, and when (acl.rs): every
    /// create in the directory needs it, answered from here for the attribute lifetime.
    pub default_acl: Option<(std::time::Instant, Option<Vec<u8>>)>,
    /// The access ACL as last fetched (acl.rs), with the inode's ctime from just before
    /// it was read: while fresh attributes show the same ctime it has not changed.
    pub access_acl: Option<(Timespec, Option<Vec<u8>>)>,
    /// When `attr` last came from the home server. A directory's attributes are
    /// answered from here within the attribute lifetime: the kernel drops its copy
    /// after every entry change in the directory, and asking the server again right
    /// after our own change (whose reply carried the new attributes) would cost a
    /// round trip per file created.
    pub fetched: Option<std::time::Instant>,
    /// The session at the home that holds this client's opens of the file
    /// (`Instance::session_at`): after the home forgot them (a restart), they are
    /// opened again there (notices.rs), so the home tells this mount of changes again.
    pub open_session: u64,
}

impl Node {
    /// A node first seen with these attributes: no lookups, opens or caches yet.
    pub fn new(attr: &Attr) -> Node {
        Node {
            attr: attr.clone(),
            lookups: 0,
            opens: 0,
            wb: None,
            cached: None,
            capability: None,
            default_acl: None,
            access_acl: None,
            fetched: None,
            open_session: 0,
        }
    }
}

pub struct OpenFile {
    pub ino: InodeNo,
}

#[derive(Default)]
pub struct Tables {
    nodes: Mutex<HashMap<InodeNo, Node>>,
    files: Mutex<HashMap<u64, OpenFile>>,
    dirs: Mutex<HashMap<u64, Vec<DirEntry>>>,
    /// (parent, name) → subdirectory, and when the server said so: see `cached_subdir`.
    subdirs: Mutex<SubdirCache>,
    next_fh: AtomicU64,
}

/// (parent, name) → (when the server said so, the subdirectory).
type SubdirCache = HashMap<(InodeNo, Vec<u8>), (Instant, InodeNo)>;

/// Bound on remembered subdirectory names; past it, expired ones are dropped.
const SUBDIR_CACHE_MAX: usize = 4096;

impl Tables {
    pub fn nodes(&self) -> MutexGuard<'_, HashMap<InodeNo, Node>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn files(&self) -> MutexGuard<'_, HashMap<u64, OpenFile>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn dirs(&self) -> MutexGuard<'_, HashMap<u64, Vec<DirEntry>>> {
        self.dirs.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn subdirs(&self) -> MutexGuard<'_, SubdirCache> {
        self.subdirs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The server just said `name` in `parent` is `child`; remembered for directories
    /// only (a file's attributes change under this client's own writes, a
    /// directory's only by entry changes, which this client hears about).
    pub fn remember_entry(&self, parent: InodeNo, name: &[u8], child: &Attr, ttl: Duration) {
        let mut map = self.subdirs();
        if child.kind != spillway_types::FileKind::Directory {
            map.remove(&(parent, name.to_vec()));
            return;
        }
        if map.len() >= SUBDIR_CACHE_MAX {
            map.retain(|_, (at, _)| at.elapsed() < ttl);
        }
        if map.len() < SUBDIR_CACHE_MAX {
            map.insert((parent, name.to_vec()), (Instant::now(), child.ino));
        }
    }

    /// A name this client changed (or found missing): ask the server next time.
    pub fn forget_entry(&self, parent: InodeNo, name: &[u8]) {
        self.subdirs().remove(&(parent, name.to_vec()));
    }

    /// Answer a lookup of a subdirectory from what the server said less than
    /// `entry_ttl` ago, with the directory's attributes if they are fresh too: the
    /// kernel forces a lookup for every `mkdir`/`O_EXCL` create of an existing name
    /// (`LOOKUP_EXCL`) even while its own entry is valid, and this keeps the answer
    /// within the same staleness bound as the kernel's cache. Counts a kernel
    /// reference, as a lookup reply does. Returns the attributes and the lifetime left.
    pub fn cached_subdir(
        &self,
        parent: InodeNo,
        name: &[u8],
        entry_ttl: Duration,
        attr_ttl: Duration,
    ) -> Option<(Attr, Duration)> {
        let (at, child) = *self.subdirs().get(&(parent, name.to_vec()))?;
        let entry_left = entry_ttl.checked_sub(at.elapsed())?;
        let (attr, attr_left) = self.fresh_dir_attr(child, attr_ttl)?;
        let mut nodes = self.nodes();
        nodes.get_mut(&child)?.lookups += 1;
        Some((attr, entry_left.min(attr_left)))
    }

    pub fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Record attributes from a server; `lookup` counts a kernel reference.
    pub fn remember(&self, attr: &Attr, lookup: bool) {
        let mut nodes = self.nodes();
        let n = nodes.entry(attr.ino).or_insert_with(|| Node::new(attr));
        n.attr = attr.clone();
        n.fetched = Some(std::time::Instant::now());
        if lookup {
            n.lookups += 1;
        }
    }

    /// A directory's attributes if they came from its home less than `ttl` ago, with
    /// what is left of that lifetime.
    pub fn fresh_dir_attr(&self, ino: InodeNo, ttl: Duration) -> Option<(Attr, Duration)> {
        let nodes = self.nodes();
        let n = nodes.get(&ino)?;
        if n.attr.kind != spillway_types::FileKind::Directory {
            return None;
        }
        let left = ttl.checked_sub(n.fetched?.elapsed())?;
        Some((n.attr.clone(), left))
    }

    /// The attributes of an inode to answer the kernel with, without asking its home:
    /// a directory's as in `fresh_dir_attr`; a regular file's if it is open here and
    /// nothing written here since the server's last answer is still unflushed (the
    /// kernel drops its copy after every write, and a process that writes, fsyncs and
    /// fstats, as SQLite does at every transaction, would otherwise cost a round trip
    /// per fstat). `None`: ask the server.
    pub fn fresh_attr(&self, ino: InodeNo, ttl: Duration) -> Option<(Attr, Duration)> {
        let nodes = self.nodes();
        let n = nodes.get(&ino)?;
        match n.attr.kind {
            spillway_types::FileKind::Directory => {}
            spillway_types::FileKind::Regular if n.wb.as_ref().is_some_and(|w| !w.is_dirty()) => {}
            _ => return None,
        }
        let left = ttl.checked_sub(n.fetched?.elapsed())?;
        Some((n.attr.clone(), left))
    }

    /// Forget that a node's attributes are current (a change to it may have failed
    /// half-way).
    pub fn stale(&self, ino: InodeNo) {
        if let Some(n) = self.nodes().get_mut(&ino) {
            n.fetched = None;
        }
    }

    pub fn attr(&self, ino: InodeNo) -> Option<Attr> {
        self.nodes().get(&ino).map(|n| n.attr.clone())
    }

    /// The cached mode of `ino` (what `attr` gives, without copying the rest).
    pub fn mode(&self, ino: InodeNo) -> Option<u32> {
        self.nodes().get(&ino).map(|n| n.attr.mode)
    }

    pub fn writeback(&self, ino: InodeNo) -> Option<Arc<WriteBack>> {
        self.nodes().get(&ino).and_then(|n| n.wb.clone())
    }

    pub fn forget(&self, ino: InodeNo, n: u64) {
        let mut nodes = self.nodes();
        if let Some(node) = nodes.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(n);
            if node.lookups == 0 && node.opens == 0 {
                nodes.remove(&ino);
            }
        }
    }
}
