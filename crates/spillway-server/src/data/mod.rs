//! The stripe store of one fragment: one sparse file per stripe under `stripes/`
//! (FORMAT.md), an in-memory index of what is there, capacity enforcement, and an LRU of
//! open files. All I/O is positional, so requests on one stripe never share a file
//! offset.
//!
//! Locking: reads, writes and syncs of an inode share its lock; truncate and delete
//! take it exclusively, so a write can never recreate a stripe file that a concurrent
//! delete is removing. The index mutex is held only for bookkeeping, never during I/O.

mod allocs;
mod direct;
mod fdcache;
mod grants;
mod index;
mod naming;
mod sparse;

pub(crate) use allocs::Changed;
pub(crate) use grants::{GrantAccount, GrantLimits};
pub(crate) use sparse::Span;

use crate::error::{fs, StoreError, StoreResult};
use direct::{copy_direct, DirectError, DirectWrites, DIRECT_ALIGN};
use fdcache::FdCache;
use index::StripeMap;
use spillway_types::tunables::MAX_STRIPE_SIZE;
use spillway_types::{Errno, InodeNo};
use spillway_wire::StripeLen;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// Inode locks are striped over this many RwLocks (a lock per inode would need a map
/// that grows with the files).
const INODE_LOCKS: usize = 64;

pub(crate) struct DataStore {
    dir: PathBuf,
    capacity: u64,
    map: Mutex<StripeMap>,
    cache: FdCache,
    locks: Vec<RwLock<()>>,
    counters: Counters,
    /// What changed of the stripes' disk allocation, to report to the homes (allocs.rs).
    allocs: allocs::AllocTracker,
    /// How much a connection may be promised (grants.rs).
    grant_limits: GrantLimits,
    /// Which writes skip the page cache (direct.rs).
    direct: DirectWrites,
    /// Drop the page cache behind large reads into a client's arena (the
    /// `drop_behind_reads` tunable; `read_into`).
    drop_behind: bool,
}

/// Usage counters since the server started (libdatawarp's accounting).
#[derive(Default)]
pub(crate) struct Counters {
    pub bytes_written: AtomicU64,
    pub bytes_read: AtomicU64,
    pub max_used: AtomicU64,
}

/// Bytes moved per copy_file_range call (and buffer size of the fallback).
const COPY_CHUNK: usize = 8 << 20;

impl DataStore {
    /// Open the stripes under `dir` (created by the fragment), indexing what is there.
    pub(crate) fn open(dir: &Path, capacity: u64, fd_cache_size: usize) -> StoreResult<DataStore> {
        let map = scan(dir)?;
        Ok(DataStore {
            dir: dir.to_path_buf(),
            capacity,
            map: Mutex::new(map),
            cache: FdCache::new(fd_cache_size),
            locks: (0..INODE_LOCKS).map(|_| RwLock::new(())).collect(),
            counters: Counters::default(),
            allocs: allocs::AllocTracker::default(),
            grant_limits: GrantLimits::default(),
            direct: DirectWrites::new(0),
            drop_behind: false,
        })
    }

    /// Set how much space connections may be promised (the server's tunables).
    pub(crate) fn with_grant_limits(mut self, limits: GrantLimits) -> DataStore {
        self.grant_limits = limits;
        self
    }

    /// Write requests of at least `min` bytes go to the disk with O_DIRECT (0: none;
    /// the server's `direct_write_min` tunable).
    pub(crate) fn with_direct_writes(mut self, min: u64) -> DataStore {
        self.direct = DirectWrites::new(min);
        self
    }

    /// Writes go through the page cache from now on, whatever their size: a cache
    /// fragment's writes are read again by its write-behind (a stream at once), which
    /// then copies them from memory instead of reading them back from the device.
    pub(crate) fn no_direct_writes(&self) {
        self.direct.turn_off();
    }

    /// Large reads into a client's arena leave no pages behind in this server's page
    /// cache (the server's `drop_behind_reads` tunable).
    pub(crate) fn with_drop_behind(mut self, on: bool) -> DataStore {
        self.drop_behind = on;
        self
    }

    fn map(&self) -> MutexGuard<'_, StripeMap> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_of(&self, ino: InodeNo) -> &RwLock<()> {
        // Counters are sequential, so the low bits spread; fold in the home server too.
        let h = ino.0 ^ (ino.0 >> 48);
        &self.locks[(h % INODE_LOCKS as u64) as usize]
    }

    pub(crate) fn used(&self) -> u64 {
        self.map().used()
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    fn note_written(&self, n: u64) {
        self.counters.bytes_written.fetch_add(n, Ordering::Relaxed);
        let used = self.used();
        self.counters.max_used.fetch_max(used, Ordering::Relaxed);
    }

    /// Open stripe files currently cached (tests watch this stay bounded).
    #[cfg(test)]
    pub(crate) fn cached_files(&self) -> usize {
        self.cache.len()
    }

    /// The open file of a stripe, from the cache or opened (and created when `create`).
    fn file(&self, ino: InodeNo, stripe: u64, create: bool) -> std::io::Result<Arc<File>> {
        if let Some(f) = self.cache.get((ino, stripe)) {
            return Ok(f);
        }
        let path = naming::stripe_path(&self.dir, ino, stripe);
        let open = |p: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(create)
                .mode(0o600)
                .open(p)
        };
        let f = match open(&path) {
            Err(e) if create && e.kind() == ErrorKind::NotFound => {
                // The bucket directory is made on first use. create_dir, not
                // create_dir_all: a destroyed fragment's directory must stay gone.
                if let Some(bucket) = path.parent() {
                    use std::os::unix::fs::DirBuilderExt;
                    match std::fs::DirBuilder::new().mode(0o700).create(bucket) {
                        Ok(()) => {}
                        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(e),
                    }
                }
                open(&path)?
            }
            r => r?,
        };
        Ok(self.cache.insert((ino, stripe), f))
    }

    /// The stripe's file opened again with O_DIRECT (not cached: a stage-in opens it
    /// once per piece of up to a stripe). Err where the file system refuses direct I/O.
    fn direct_file(&self, ino: InodeNo, stripe: u64) -> std::io::Result<File> {
        OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(naming::stripe_path(&self.dir, ino, stripe))
    }

    /// Write the leading whole blocks of `data` (at `off` of a stripe) with O_DIRECT,
    /// when they are many enough (direct.rs); the bytes written so, which the caller
    /// follows with a buffered write of the rest.
    fn write_direct_part(
        &self,
        ino: InodeNo,
        stripe: u64,
        off: u64,
        data: &[u8],
    ) -> std::io::Result<usize> {
        let part = self.direct.part(off, data.len());
        if part == 0 {
            return Ok(0);
        }
        let d = match self.direct_file(ino, stripe) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.direct.refuse(&e);
                return Ok(0);
            }
            Err(e) => return Err(e),
        };
        match direct::write_direct(&d, off, &data[..part]) {
            Ok(n) => Ok(n),
            Err(DirectError::Refused(n, e)) => {
                self.direct.refuse(&e);
                Ok(n)
            }
            Err(DirectError::Io(e)) => Err(e),
        }
    }

    /// Write all of `data` at `offset` of a stripe, or nothing (ENOSPC) when its
    /// growth does not fit into the space neither used nor promised to a connection
    /// (tests; requests go through `write_charged`).
    #[cfg(test)]
    pub(crate) fn write(
        &self,
        ino: InodeNo,
        stripe: u64,
        offset: u32,
        data: &[u8],
    ) -> StoreResult<u32> {
        self.write_claimed(ino, stripe, offset, data, |map, end| {
            map.reserve(ino, stripe, end, self.capacity).map(|()| end)
        })
    }

    /// Write the part of `data` that `claim` reserves room for: `claim` gets the index
    /// (locked) and the write's end, and returns the end it reserved, or NoSpace.
    fn write_claimed(
        &self,
        ino: InodeNo,
        stripe: u64,
        offset: u32,
        data: &[u8],
        claim: impl FnOnce(&mut StripeMap, u64) -> Result<u64, index::NoSpace>,
    ) -> StoreResult<u32> {
        let end = u64::from(offset) + data.len() as u64;
        if end > u64::from(MAX_STRIPE_SIZE) {
            return Err(fs(Errno::EINVAL));
        }
        if data.is_empty() {
            return Ok(0);
        }
        let _g = self.lock_of(ino).read().unwrap_or_else(|e| e.into_inner());
        let claimed = claim(&mut self.map(), end).map_err(|_| fs(Errno::ENOSPC))?;
        let n = (claimed.min(end) - u64::from(offset)) as usize;
        let data = &data[..n];
        let write = || {
            self.file(ino, stripe, true).and_then(|f| {
                let off = u64::from(offset);
                let done = self.write_direct_part(ino, stripe, off, data)?;
                f.write_all_at(&data[done..], off + done as u64)
            })
        };
        let mut written = write();
        if written
            .as_ref()
            .is_err_and(|e| e.raw_os_error() == Some(libc::ENOSPC))
        {
            // A full disk may hold blocks freed a moment ago (a truncate or delete, this
            // write's own open(O_TRUNC) among them) that the file system hands out
            // again only once its journal commits: commit, then try once more. The
            // client may already have told its application this write was stored
            // (its space grant), so it is worth the wait of one commit.
            self.commit_frees();
            written = write();
        }
        if let Err(e) = written {
            // The reservation may now overstate the stripe: take the file's real length.
            self.resync(ino, stripe);
            return Err(e.into());
        }
        self.map().mark_dirty(ino, stripe);
        self.allocs.mark_stripe(ino, stripe);
        self.note_written(data.len() as u64);
        Ok(data.len() as u32)
    }

    /// Make the file system under the stripes commit its journal (`syncfs`), so that
    /// blocks freed by recent truncates and deletes can be allocated again.
    fn commit_frees(&self) {
        use std::os::fd::AsRawFd;
        if let Ok(d) = File::open(&self.dir) {
            // SAFETY: syncfs on a descriptor this function owns; no memory is passed.
            unsafe { libc::syncfs(d.as_raw_fd()) };
        }
    }

    /// Set the index entry of a stripe from the file itself, after a failed write.
    fn resync(&self, ino: InodeNo, stripe: u64) {
        let path = naming::stripe_path(&self.dir, ino, stripe);
        match std::fs::metadata(&path) {
            Ok(m) => self.map().set(ino, stripe, m.len()),
            Err(_) => {
                self.cache.evict((ino, stripe));
                self.map().remove(ino, stripe);
            }
        }
    }

    pub(crate) fn read(
        &self,
        ino: InodeNo,
        stripe: u64,
        offset: u32,
        len: u32,
    ) -> StoreResult<Vec<u8>> {
        if len > MAX_STRIPE_SIZE {
            return Err(fs(Errno::EINVAL));
        }
        let _g = self.lock_of(ino).read().unwrap_or_else(|e| e.into_inner());
        // Allocate no more than the stripe holds: a hostile len cannot cost memory.
        let Some((f, n)) = self.to_read(ino, stripe, offset, len as usize)? else {
            return Ok(Vec::new());
        };
        let buf = read_into_new(&f, u64::from(offset), n)?;
        self.note_read(buf.len());
        Ok(buf)
    }

    /// `read` into `into` (a client's arena: `into.len()` bytes asked): the bytes
    /// read, fewer past the stripe's stored end. The kernel copies straight into the
    /// client's memory; no buffer of the server's in between.
    ///
    /// A client with an arena runs on this host, and its kernel caches what it reads
    /// (the FUSE page cache): the same bytes in this server's page cache are a second
    /// copy on one machine. So with `drop_behind` the pages of a large read are dropped
    /// once copied (the device's readahead ahead of the reader stays): a stream reuses
    /// the pages it just freed instead of taking fresh ones, which on this VM cost a
    /// fault to the host each (docs/data-plane.md, "Reads drop behind them").
    pub(crate) fn read_into(
        &self,
        ino: InodeNo,
        stripe: u64,
        offset: u32,
        into: &mut [u8],
    ) -> StoreResult<u32> {
        let _g = self.lock_of(ino).read().unwrap_or_else(|e| e.into_inner());
        let Some((f, n)) = self.to_read(ino, stripe, offset, into.len())? else {
            return Ok(0);
        };
        let got = read_full(&f, u64::from(offset), &mut into[..n])?;
        if self.drop_behind && got >= DROP_BEHIND_MIN {
            drop_cached(&f, u64::from(offset), got);
        }
        self.note_read(got);
        Ok(got as u32)
    }

    /// The open file of a stripe and how many of `len` bytes at `offset` it holds;
    /// None when there is nothing to read (no such stripe, past its end, or its file
    /// gone). Called under the inode's lock.
    fn to_read(
        &self,
        ino: InodeNo,
        stripe: u64,
        offset: u32,
        len: usize,
    ) -> StoreResult<Option<(Arc<File>, usize)>> {
        let Some(stripe_len) = self.map().len(ino, stripe) else {
            return Ok(None);
        };
        let n = stripe_len.saturating_sub(u64::from(offset)).min(len as u64) as usize;
        if n == 0 {
            return Ok(None);
        }
        match self.file(ino, stripe, false) {
            Ok(f) => Ok(Some((f, n))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn note_read(&self, n: usize) {
        self.counters
            .bytes_read
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Fill `[offset, offset+len)` of a stripe from `src` at `src_offset` (a stage-in):
    /// room is reserved first (ENOSPC with nothing written), the bytes move inside the
    /// kernel where it can. Returns the bytes copied: fewer than `len` means `src`
    /// ended early. `direct`: write the block-aligned bulk with O_DIRECT (large files'
    /// stripes, which nothing reads soon; small files stay buffered, made durable
    /// together by one syncfs instead of a synchronous write each).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fill_from(
        &self,
        ino: InodeNo,
        stripe: u64,
        offset: u32,
        len: u32,
        src: &File,
        src_offset: u64,
        direct: bool,
    ) -> StoreResult<u64> {
        let end = u64::from(offset) + u64::from(len);
        if end > u64::from(MAX_STRIPE_SIZE) {
            return Err(fs(Errno::EINVAL));
        }
        if len == 0 {
            return Ok(0);
        }
        let _g = self.lock_of(ino).read().unwrap_or_else(|e| e.into_inner());
        self.map()
            .reserve(ino, stripe, end, self.capacity)
            .map_err(|_| fs(Errno::ENOSPC))?;
        let copied = self.file(ino, stripe, true).and_then(|f| {
            // The block-aligned bulk with O_DIRECT (no copy into the page cache, nothing
            // left to write back at the stage's sync), the rest buffered.
            let (off, len) = (u64::from(offset), u64::from(len));
            let mut n = 0;
            if direct && off.is_multiple_of(DIRECT_ALIGN) && len >= DIRECT_ALIGN {
                if let Ok(d) = self.direct_file(ino, stripe) {
                    n = copy_direct(src, src_offset, &d, off, len - len % DIRECT_ALIGN)?;
                }
            }
            if n < len {
                n += copy_range(src, src_offset + n, &f, off + n, len - n)?;
            }
            Ok(n)
        });
        // Short or failed: the stripe's real length is whatever reached the file.
        match copied {
            Ok(n) if n == u64::from(len) => {}
            _ => self.resync(ino, stripe),
        }
        let n = copied?;
        self.map().mark_dirty(ino, stripe);
        self.allocs.mark_stripe(ino, stripe);
        self.note_written(n);
        Ok(n)
    }

    /// Start reading the first `len` bytes of a stripe from the disk (a stage-out asks
    /// for all of a range's stripes at once, so their reads queue together instead of
    /// readahead starting small in each stripe file in turn). Only a hint: a stripe
    /// not stored, or a failed open, is left to the copy that follows to report.
    pub(crate) fn will_read(&self, ino: InodeNo, stripe: u64, len: u64) {
        use std::os::fd::AsRawFd;
        if self.map().len(ino, stripe).is_none() {
            return;
        }
        if let Ok(f) = self.file(ino, stripe, false) {
            let len = libc::off_t::try_from(len).unwrap_or(libc::off_t::MAX);
            // SAFETY: the descriptor is open; the call only starts readahead.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, len, libc::POSIX_FADV_WILLNEED) };
        }
    }

    /// Copy up to `len` bytes from the start of a stripe into `dst` at `dst_offset` (a
    /// stage-out). Returns the bytes copied: the stripe's stored length if shorter (the
    /// rest is a hole, which reads as zeros).
    ///
    /// `direct`, when given, is the same destination opened with `O_DIRECT`: the
    /// block-aligned bulk goes through it (read into an aligned buffer, written by DMA),
    /// the unaligned tail through `dst`. Several servers drain into one PFS file at
    /// once; buffered writes to one file serialise on its inode lock while each copies
    /// into the page cache, and the waiting writer spins on a CPU (perf: a third of
    /// the stage's CPU time), where direct writes sleep. A file system that refuses a
    /// direct write (EINVAL) gets the buffered copy instead.
    pub(crate) fn drain_to(
        &self,
        ino: InodeNo,
        stripe: u64,
        len: u64,
        dst: &File,
        direct: Option<&File>,
        dst_offset: u64,
    ) -> StoreResult<u64> {
        let _g = self.lock_of(ino).read().unwrap_or_else(|e| e.into_inner());
        let Some(stored) = self.map().len(ino, stripe) else {
            return Ok(0);
        };
        let want = stored.min(len);
        if want == 0 {
            return Ok(0);
        }
        let f = self.file(ino, stripe, false)?;
        let mut n = 0;
        if let Some(d) = direct.filter(|_| dst_offset.is_multiple_of(DIRECT_ALIGN)) {
            n = copy_direct(&f, 0, d, dst_offset, want - want % DIRECT_ALIGN)?;
        }
        if n < want {
            n += copy_range(&f, n, dst, dst_offset + n, want - n)?;
        }
        if n != want {
            return Err(StoreError::Io(std::io::Error::new(
                ErrorKind::UnexpectedEof,
                format!("stripe {stripe} of {ino} holds {n} bytes, the index said {want}"),
            )));
        }
        self.counters.bytes_read.fetch_add(n, Ordering::Relaxed);
        Ok(n)
    }

    /// Cut the file of `ino` to `size` bytes: stripes wholly past it go, the stripe it
    /// falls in is shortened.
    pub(crate) fn truncate(&self, ino: InodeNo, size: u64, stripe_size: u32) -> StoreResult<()> {
        if stripe_size == 0 {
            return Err(fs(Errno::EINVAL));
        }
        let _g = self.lock_of(ino).write().unwrap_or_else(|e| e.into_inner());
        self.allocs.mark(ino);
        let stripes = self.map().stripes(ino);
        for (k, len) in stripes {
            match k.checked_mul(u64::from(stripe_size)) {
                Some(start) if start < size => {
                    let keep = size - start;
                    if keep < len {
                        self.file(ino, k, false)?.set_len(keep)?;
                        self.map().set(ino, k, keep);
                    }
                }
                _ => self.delete_stripe(ino, k)?,
            }
        }
        Ok(())
    }

    /// Remove one stripe file; the caller holds the inode's lock exclusively.
    fn delete_stripe(&self, ino: InodeNo, stripe: u64) -> StoreResult<()> {
        self.cache.evict((ino, stripe));
        match std::fs::remove_file(naming::stripe_path(&self.dir, ino, stripe)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        self.map().remove(ino, stripe);
        Ok(())
    }

    pub(crate) fn delete(&self, ino: InodeNo) -> StoreResult<()> {
        let _g = self.lock_of(ino).write().unwrap_or_else(|e| e.into_inner());
        self.allocs.forget(ino);
        let stripes = self.map().stripes(ino);
        for (k, _) in stripes {
            self.delete_stripe(ino, k)?;
        }
        Ok(())
    }

    /// fdatasync every stripe of `ino` written since its last sync.
    pub(crate) fn sync(&self, ino: InodeNo) -> StoreResult<()> {
        let _g = self.lock_of(ino).read().unwrap_or_else(|e| e.into_inner());
        let dirty = self.map().take_dirty(ino);
        for (i, &k) in dirty.iter().enumerate() {
            let r = match self.file(ino, k, false) {
                Ok(f) => f.sync_data(),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                // Whatever was not synced stays owed to the next sync.
                let mut map = self.map();
                for &k in &dirty[i..] {
                    map.mark_dirty(ino, k);
                }
                return Err(e.into());
            }
        }
        Ok(())
    }

    pub(crate) fn stripe_info(&self, ino: InodeNo) -> Vec<StripeLen> {
        self.map()
            .stripes(ino)
            .into_iter()
            .map(|(stripe, len)| StripeLen { stripe, len })
            .collect()
    }

    /// Close every cached file (fragment destroyed or server stopping).
    pub(crate) fn close(&self) {
        self.cache.clear();
    }

    // ---- Cache instances (cache/stripes) -------------------------------------------
    // What a cache fragment's cached stripes need beyond scratch's: the room a write or
    // fetch may claim, one stripe evicted, the stripe files on disk, and a range of a
    // stripe written behind to the PFS.

    /// Bytes of capacity neither used nor promised to a connection: what a write or
    /// a fetch may still claim (eviction makes room until this is enough).
    pub(crate) fn room(&self) -> u64 {
        self.map().unpromised(self.capacity)
    }

    /// The capacity a stripe's file would claim to reach `end` (what it grows by).
    pub(crate) fn growth(&self, ino: InodeNo, stripe: u64, end: u64) -> u64 {
        end.saturating_sub(self.map().len(ino, stripe).unwrap_or(0))
    }

    /// Remove one stripe file (a clean cached stripe evicted): the bytes of capacity
    /// freed.
    pub(crate) fn delete_stripe_file(&self, ino: InodeNo, stripe: u64) -> StoreResult<u64> {
        let _g = self.lock_of(ino).write().unwrap_or_else(|e| e.into_inner());
        let len = self.map().len(ino, stripe).unwrap_or(0);
        self.allocs.mark(ino);
        self.delete_stripe(ino, stripe)?;
        Ok(len)
    }

    /// Every stripe with a file here, with its length. Listed from the directory (the
    /// index is looked up by inode): eviction takes in, once after a restart, the clean
    /// stripes it did not see being fetched.
    pub(crate) fn stored_stripes(&self) -> StoreResult<Vec<(InodeNo, u64, u64)>> {
        let inos = self.inodes_on_disk()?;
        let map = self.map();
        let stripes = inos.into_iter().flat_map(|ino| {
            let s = map.stripes(ino);
            s.into_iter().map(move |(k, len)| (ino, k, len))
        });
        Ok(stripes.collect())
    }

    /// Copy `len` bytes at `offset` of a stripe into `dst` at `dst_offset` (a dirty
    /// range written behind to the PFS file): the bytes copied, fewer where the
    /// stripe's file ends first.
    pub(crate) fn copy_out(
        &self,
        ino: InodeNo,
        stripe: u64,
        offset: u64,
        len: u64,
        dst: &File,
        dst_offset: u64,
    ) -> StoreResult<u64> {
        let _g = self.lock_of(ino).read().unwrap_or_else(|e| e.into_inner());
        let Some(stored) = self.map().len(ino, stripe) else {
            return Ok(0);
        };
        let want = stored.saturating_sub(offset).min(len);
        if want == 0 {
            return Ok(0);
        }
        let f = self.file(ino, stripe, false)?;
        let n = copy_range(&f, offset, dst, dst_offset, want)?;
        self.counters.bytes_read.fetch_add(n, Ordering::Relaxed);
        Ok(n)
    }
}

/// Reads into an arena of at least this many bytes drop their pages behind them:
/// a stream's pieces (1 MiB), not the small reads a file's reader may repeat.
const DROP_BEHIND_MIN: usize = 256 << 10;

/// Drop the clean cached pages of `len` bytes at `offset` of `f` (dirty ones stay
/// until written back). Advice only: a failure changes no byte, so it is ignored.
fn drop_cached(f: &File, offset: u64, len: usize) {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return;
    };
    // SAFETY: advice on an open descriptor; no memory is passed.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), off, len, libc::POSIX_FADV_DONTNEED) };
}

/// Read up to `n` bytes of `f` at `offset` into a new buffer, fewer where the file
/// ends first. The buffer is not zero-filled first: perf of a streaming read showed the
/// memset of every reply buffer at 6% of the read path's CPU, for bytes the read
/// overwrites at once.
fn read_into_new(f: &File, offset: u64, n: usize) -> std::io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut buf: Vec<u8> = Vec::with_capacity(n);
    let mut got = 0usize;
    while got < n {
        let at = libc::off_t::try_from(offset + got as u64)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the destination is the vector's spare capacity, `n - got` bytes
        // from `got` (within the `n` allocated); pread writes at most that many.
        let k =
            unsafe { libc::pread(f.as_raw_fd(), buf.as_mut_ptr().add(got).cast(), n - got, at) };
        match k {
            0 => break,
            k if k > 0 => {
                got += k as usize;
                // SAFETY: the first `got` bytes were written by pread above.
                unsafe { buf.set_len(got) };
            }
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(buf)
}

/// Read `buf.len()` bytes of `f` at `offset` into `buf`, fewer where the file ends
/// first: the bytes read.
fn read_full(f: &File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0usize;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Index every stripe file under `dir`. Names this server did not write are logged and
/// left alone: deleting what we do not understand could destroy data. Bucket
/// directories and stripe files an older version left readable by others are made
/// private (0700, 0600) on the way.
fn scan(dir: &Path) -> StoreResult<StripeMap> {
    use std::os::unix::fs::PermissionsExt;
    let mut map = StripeMap::default();
    for bucket in std::fs::read_dir(dir)? {
        let bucket = bucket?;
        let bname = bucket.file_name();
        let Some(bname) = bname
            .to_str()
            .filter(|b| b.len() == 2 && bucket.path().is_dir())
        else {
            tracing::warn!("ignoring unexpected {}", bucket.path().display());
            continue;
        };
        spillway_types::files::make_private(&bucket.path())?;
        for file in std::fs::read_dir(bucket.path())? {
            let file = file?;
            let fname = file.file_name();
            let parsed = fname.to_str().and_then(|f| naming::parse(bname, f));
            let meta = file.metadata()?;
            if meta.permissions().mode() & 0o077 != 0 {
                spillway_types::files::make_private(&file.path())?;
            }
            match parsed {
                Some((ino, stripe)) if meta.is_file() => map.set(ino, stripe, meta.len()),
                _ => tracing::warn!("ignoring unexpected {}", file.path().display()),
            }
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests;

/// Copy `len` bytes between two files at the given offsets, with `copy_file_range`
/// (no trip through user space; the kernel may share or splice pages), falling back to
/// read and write where the kernel cannot (different file systems, old kernels).
/// Returns fewer than `len` only when `src` ends first.
fn copy_range(
    src: &File,
    mut src_off: u64,
    dst: &File,
    mut dst_off: u64,
    len: u64,
) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    let mut done = 0u64;
    let mut kernel = true;
    let mut buf = Vec::new();
    while done < len {
        let want = (len - done).min(COPY_CHUNK as u64) as usize;
        if kernel {
            let mut so = src_off as libc::loff_t;
            let mut doff = dst_off as libc::loff_t;
            // SAFETY: both descriptors are open; the offsets are valid out pointers.
            let n = unsafe {
                libc::copy_file_range(
                    src.as_raw_fd(),
                    &mut so,
                    dst.as_raw_fd(),
                    &mut doff,
                    want,
                    0,
                )
            };
            if n > 0 {
                let n = n as u64;
                done += n;
                src_off += n;
                dst_off += n;
                continue;
            }
            if n == 0 {
                return Ok(done);
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(
                    libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | libc::EPERM,
                ) => {
                    kernel = false;
                    continue;
                }
                _ => return Err(e),
            }
        }
        if buf.len() < want {
            buf.resize(want, 0);
        }
        let n = loop {
            match src.read_at(&mut buf[..want], src_off) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        if n == 0 {
            return Ok(done);
        }
        dst.write_all_at(&buf[..n], dst_off)?;
        done += n as u64;
        src_off += n as u64;
        dst_off += n as u64;
    }
    Ok(done)
}
