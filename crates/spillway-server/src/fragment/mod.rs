//! One fragment: this server's share of one instance. Owns the fragment's metadata
//! store, stripe store, open-handle counts and peer connections, and carries out what
//! spans them: truncation on every server of a layout, and purging inodes left with no
//! link and no open handle.
//!
//! Lock order: `opens` before the metadata store's lock. Open, release and the purge
//! decision all run under `opens`, so an inode cannot be opened while it is purged, and
//! the last unlink racing the last close purges exactly once (each side writes its own
//! state, then reads the other's, under the same lock).

mod allocs;
pub(crate) mod cache;
pub(crate) mod config;
mod opens;
mod peers;
pub(crate) mod purge_bell;
pub(crate) mod replicas;

pub(crate) use opens::OpenCounts;

use crate::data::DataStore;
use crate::error::{fs, StoreError, StoreResult};
use crate::meta::{AttrChange, Home, MetaStore, PurgeRecord, RootSpec, SizeChange};
use config::FragmentConfig;
use peers::Peers;
use purge_bell::PurgeWaker;
use spillway_placement::Layout;
use spillway_types::{Attr, Errno, FileKind, InodeNo, ServerIndex, Tunables};
use spillway_wire::{
    DeleteDataReq, FragmentCreateReq, FragmentInfo, FragmentStatsReply, TruncateDataReq,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

const CONFIG_FILE: &str = "fragment.json";
const META_FILE: &str = "meta.sqlite";
const STRIPES_DIR: &str = "stripes";

/// What every fragment of a server shares: tunables and the purge thread's doorbell.
#[derive(Clone)]
pub(crate) struct FragmentEnv {
    pub tunables: Tunables,
    pub waker: PurgeWaker,
    /// How a cache's PFS directory is opened (cache.rs, `PfsDirOpener`).
    pub open_pfs_dir: cache::PfsDirOpener,
}

/// Counters of a fragment since the server started (beside the data store's).
#[derive(Default)]
pub(crate) struct FragmentStats {
    pub files_created: AtomicU64,
    /// Bytes this server read from the PFS into the fragment (stage-in).
    pub stage_bytes_read: AtomicU64,
    /// Bytes this server wrote from the fragment to the PFS (stage-out).
    pub stage_bytes_written: AtomicU64,
}

pub(crate) struct Fragment {
    pub config: FragmentConfig,
    pub stats: FragmentStats,
    dir: PathBuf,
    pub meta: MetaStore,
    pub data: DataStore,
    opens: Mutex<OpenCounts>,
    /// For calls made while a request waits (truncation).
    peers: Peers,
    /// For the purge thread: no reconnect window, because the purge loop retries on its
    /// own every few seconds and must not sit in one peer's window while stopping.
    purge_peers: Peers,
    closed: AtomicBool,
    waker: PurgeWaker,
    /// This server's PFS roots (its tunables): the only PFS a stage may touch here.
    pub pfs_roots: Vec<String>,
    /// How long a write or fetch into a full cache waits for room (`cache_room_wait`).
    cache_room_wait: Duration,
    /// Locks of the inodes homed here (crate::locks), held for client sessions.
    pub locks: crate::locks::LockTable,
    /// Which mounts hold the inodes homed here open, and their watches (crate::notices).
    pub notices: crate::notices::Notices,
    /// Set once the fragment is a cache of a PFS directory (cache.rs).
    cache: std::sync::OnceLock<cache::CacheState>,
    open_pfs_dir: cache::PfsDirOpener,
    /// Set once the fragment holds whole replicas (replicas.rs).
    ldbal: AtomicBool,
}

/// Directory 0700, every file of the fragment's own 0600 (the stripes' buckets and
/// files are the data store's, `DataStore::open`).
fn make_private(dir: &Path) -> std::io::Result<()> {
    use spillway_types::files::make_private as private;
    private(dir)?;
    private(&dir.join(STRIPES_DIR))?;
    for f in [
        CONFIG_FILE,
        cache::CACHE_FILE,
        META_FILE,
        "meta.sqlite-wal",
        "meta.sqlite-shm",
        "meta.sqlite-journal",
        crate::cache::stripes::LOG_NAME,
        cache::NAMESPACE_FILE,
        replicas::LDBAL_FILE,
        "pfsns.sqlite-wal",
        "pfsns.sqlite-shm",
    ] {
        private(&dir.join(f))?;
    }
    Ok(())
}

impl Fragment {
    /// Build a new fragment directory for `req` under `fragments` and open it. The
    /// directory is assembled under a temporary name and renamed into place, so a
    /// crash never leaves half a fragment (FORMAT.md).
    pub(crate) fn create(
        fragments: &Path,
        req: &FragmentCreateReq,
        env: &FragmentEnv,
    ) -> StoreResult<Arc<Fragment>> {
        let config = FragmentConfig::from_request(req)?;
        let dir = fragments.join(req.instance.to_string());
        let tmp = fragments.join(format!(".{}.creating", req.instance));
        remove_tree(&tmp)?;
        // Private from the start: the configuration holds the instance secret, the
        // database every name and owner of the instance, the stripes its data.
        {
            use std::os::unix::fs::DirBuilderExt;
            let mut b = std::fs::DirBuilder::new();
            b.mode(spillway_types::files::PRIVATE_DIR_MODE);
            b.create(&tmp)?;
            b.create(tmp.join(STRIPES_DIR))?;
        }
        config.save(&tmp.join(CONFIG_FILE))?;
        // Counter 1 of server 0 is the root directory.
        let (first_counter, root) = if req.index == 0 {
            let root = RootSpec {
                uid: req.root_uid,
                gid: req.root_gid,
                mode: req.root_mode,
                stripe_size: req.stripe_size,
                stripe_width: config.count(),
            };
            (2, Some(root))
        } else {
            (1, None)
        };
        MetaStore::init(&tmp.join(META_FILE), first_counter, root)?.close()?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &dir)?;
        std::fs::File::open(fragments)?.sync_all()?;
        Fragment::open(&dir, env)
    }

    /// Open an existing fragment directory (made private first, if an older version
    /// left any of it readable by others).
    pub(crate) fn open(dir: &Path, env: &FragmentEnv) -> StoreResult<Arc<Fragment>> {
        make_private(dir)?;
        let config = FragmentConfig::load(&dir.join(CONFIG_FILE))?;
        let meta = MetaStore::open(&dir.join(META_FILE))?;
        let data = DataStore::open(
            &dir.join(STRIPES_DIR),
            config.capacity,
            env.tunables.fd_cache_size,
        )?
        .with_grant_limits((&env.tunables).into())
        .with_direct_writes(env.tunables.direct_write_min)
        .with_drop_behind(env.tunables.drop_behind_reads);
        let t = &env.tunables;
        let cached = cache::CacheState::open(
            dir,
            config.server_index(),
            config.stripe_size,
            config.count(),
            &t.pfs_roots,
            env.open_pfs_dir,
        )?;
        let frag = Arc::new(Fragment {
            stats: FragmentStats::default(),
            peers: Peers::new(&config, t.rpc_deadline, t.reconnect_window),
            purge_peers: Peers::new(&config, t.rpc_deadline, Duration::ZERO),
            config,
            dir: dir.to_path_buf(),
            meta,
            data,
            opens: Mutex::new(OpenCounts::default()),
            closed: AtomicBool::new(false),
            waker: env.waker.clone(),
            pfs_roots: env.tunables.pfs_roots.clone(),
            cache_room_wait: t.cache_room_wait,
            locks: crate::locks::LockTable::default(),
            notices: crate::notices::Notices::new(t.notice_wait),
            cache: std::sync::OnceLock::new(),
            open_pfs_dir: env.open_pfs_dir,
            ldbal: AtomicBool::new(replicas::marked(dir)),
        });
        if let Some(c) = cached {
            frag.data.no_direct_writes();
            c.stripes.set_room_wait(frag.cache_room_wait);
            let _ = frag.cache.set(c);
        }
        allocs::start(&frag);
        cache::start_write_behind(&frag);
        Ok(frag)
    }

    /// The fragment's directory (its file system is what a stage-in syncs).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// True once destroyed or closed: requests then get ESTALE.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Stop serving: close the database (checkpointing it) and every open file.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Err(e) = self.meta.close() {
            tracing::error!(
                instance = self.config.instance,
                "closing metadata store: {e}"
            );
        }
        if let Some(ns) = self.cache().and_then(|c| c.ns.as_ref()) {
            if let Err(e) = ns.close() {
                tracing::error!(
                    instance = self.config.instance,
                    "closing the PFS namespace: {e}"
                );
            }
        }
        self.data.close();
        self.peers.disconnect_all();
        self.purge_peers.disconnect_all();
    }

    /// Close, then remove the fragment from disk: renamed away first (so it is gone at
    /// once, even if the removal is cut short) then deleted.
    pub(crate) fn destroy(&self, fragments: &Path) -> StoreResult<()> {
        self.cache_flush_all()?;
        self.close();
        let doomed = fragments.join(format!(".{}.destroying", self.config.instance));
        remove_tree(&doomed)?;
        std::fs::rename(&self.dir, &doomed)?;
        std::fs::File::open(fragments)?.sync_all()?;
        remove_tree(&doomed)
    }

    pub(crate) fn index(&self) -> ServerIndex {
        self.config.server_index()
    }

    pub(crate) fn home(&self) -> Home {
        Home {
            index: self.index(),
            count: self.config.count(),
            default_stripe_size: self.config.stripe_size,
        }
    }

    /// FragmentStats: usage counters for accounting.
    pub(crate) fn stats_reply(&self) -> StoreResult<FragmentStatsReply> {
        let c = self.data.counters();
        let used = self.data.used();
        Ok(FragmentStatsReply {
            capacity: self.data.capacity(),
            used,
            max_used: c.max_used.load(Ordering::Relaxed).max(used),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            inodes: self.meta.inode_count()?,
            files_created: self.stats.files_created.load(Ordering::Relaxed),
            stage_bytes_read: self.stats.stage_bytes_read.load(Ordering::Relaxed),
            stage_bytes_written: self.stats.stage_bytes_written.load(Ordering::Relaxed),
        })
    }

    pub(crate) fn info(&self) -> StoreResult<FragmentInfo> {
        Ok(FragmentInfo {
            instance: self.config.instance,
            index: self.config.index,
            count: self.config.count(),
            capacity: self.config.capacity,
            used: self.data.used(),
            inodes: self.meta.inode_count()?,
            pending_purges: self.meta.purge_count()?,
        })
    }

    /// SetAttr. A size change on a regular file first cuts the data on every server of
    /// its layout. Not only when shrinking below the stored size: the stored size may lag
    /// behind data a writer has not reported yet, and bytes past the new size must be
    /// gone whatever the stored size says.
    /// A size change commits the size and the data in the order that never leaves a
    /// size covering bytes that are gone: shrinking commits the new size first and then
    /// cuts the stripes (when the metadata log cannot be written, e.g. on a full disk,
    /// nothing has changed and the caller gets the error); growing cuts first (a no-op
    /// on stripes wholly inside the old size) and commits after.
    pub(crate) fn set_attr(&self, ino: InodeNo, ch: &AttrChange) -> StoreResult<Attr> {
        let Some(SizeChange::Set(size)) = ch.size else {
            return self.meta.set_attr(ino, ch);
        };
        let cur = self.meta.get_attr(ino)?;
        if cur.kind != FileKind::Regular {
            return self.meta.set_attr(ino, ch);
        }
        if size < cur.size {
            let attr = self.meta.set_attr(ino, ch)?;
            // The size is committed; a server that could not cut its stripes keeps
            // bytes past the end of file, which reads never return (they stop at the
            // size) and the error tells the caller.
            self.truncate_everywhere(&cur, size)?;
            // Re-read: the truncation reported the stripes' new allocation (blocks).
            return Ok(self.meta.get_attr(ino).unwrap_or(attr));
        }
        self.truncate_everywhere(&cur, size)?;
        self.meta.set_attr(ino, ch)
    }

    fn truncate_everywhere(&self, a: &Attr, size: u64) -> StoreResult<()> {
        let req = TruncateDataReq {
            ino: a.ino,
            size,
            stripe_size: a.stripe_size,
        };
        let layout = self.layout(a.ino, a.stripe_size, a.stripe_width);
        // Every server's truncation in flight at once, ours meanwhile.
        let results = self.on_servers(&self.with_layout(&layout), a.ino, &req, || {
            let local = self.data.truncate(a.ino, size, a.stripe_size);
            self.report_after_change(a.ino);
            local.map(|()| spillway_wire::Empty {})
        });
        first_error(results)
    }

    /// This server, then every other server of `layout`: where a change to a file's
    /// stripes is made (this server's part may hold nothing, which costs nothing).
    fn with_layout(&self, layout: &Layout) -> Vec<ServerIndex> {
        let me = self.index();
        std::iter::once(me)
            .chain(self.data_servers(layout).into_iter().filter(|&s| s != me))
            .collect()
    }

    /// `req` (about `ino`) on each of `servers` at once, this server's part through
    /// `here` while the others work: each outcome, in the order of `servers` (a failure
    /// logged with the server it came from).
    fn on_servers<C: spillway_wire::Call>(
        &self,
        servers: &[ServerIndex],
        ino: InodeNo,
        req: &C,
        here: impl FnOnce() -> StoreResult<C::Reply>,
    ) -> Vec<StoreResult<C::Reply>> {
        let me = self.index();
        let calls: Vec<_> = servers
            .iter()
            .map(|&s| {
                let call = (s != me).then(|| self.peers.get(s).map(|ep| ep.start(req, &[])));
                (s, call)
            })
            .collect();
        let mut here = Some(here);
        calls
            .into_iter()
            .map(|(s, call)| {
                let r = match call {
                    None => here.take().map_or(Err(fs(Errno::EIO)), |f| f()),
                    Some(None) => Err(fs(Errno::EIO)),
                    Some(Some(call)) => call.wait().map_err(fs),
                };
                r.inspect_err(|e| {
                    tracing::warn!("{} of inode {ino} on server {}: {e}", C::NAME, s.0)
                })
            })
            .collect()
    }

    fn lock_opens(&self) -> MutexGuard<'_, OpenCounts> {
        self.opens.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Purge `ino` if nothing has it open and it has no link; the caller holds `opens`.
    fn purge_if_unused(&self, opens: &OpenCounts, ino: InodeNo) {
        if opens.count(ino) > 0 || self.is_closed() {
            return;
        }
        let unlinked = matches!(self.meta.get_attr(ino), Ok(a) if a.nlink == 0);
        if !unlinked {
            return;
        }
        match self.meta.begin_purge(ino) {
            Ok(true) => self.waker.wake(),
            Ok(false) => {}
            // The inode stays an orphan: purged at the next start.
            Err(e) => tracing::warn!(ino = %ino, "cannot purge: {e}"),
        }
    }

    /// LinkCount: the reply shows the new count even when the inode was purged.
    pub(crate) fn link_count(&self, ino: InodeNo, delta: i32) -> StoreResult<Attr> {
        let a = self.meta.link_count(ino, delta)?;
        if a.nlink == 0 {
            self.purge_if_unused(&self.lock_opens(), ino);
        }
        Ok(a)
    }

    /// Count one open of `ino` (which must exist).
    pub(crate) fn open_inode(&self, ino: InodeNo) -> StoreResult<Attr> {
        let mut opens = self.lock_opens();
        let a = match self.cache() {
            Some(c) => c.ns.as_ref().ok_or(fs(Errno::ESTALE))?.get_attr(ino)?,
            None => self.meta.get_attr(ino)?,
        };
        opens.add(ino, 1);
        Ok(a)
    }

    /// Whether some session has `ino` open here.
    pub(crate) fn is_open(&self, ino: InodeNo) -> bool {
        self.lock_opens().count(ino) > 0
    }

    /// Drop `n` opens of `ino`; the last one purges an unlinked inode.
    pub(crate) fn release(&self, ino: InodeNo, n: u64) {
        let mut opens = self.lock_opens();
        let (taken, left) = opens.sub(ino, n);
        if taken > 0 && left == 0 {
            if self.cache().is_some() {
                drop(opens);
                self.cache_released(ino);
                return;
            }
            self.purge_if_unused(&opens, ino);
        }
    }

    /// Purge every inode left without links (at start, when nothing is open).
    pub(crate) fn purge_orphans(&self) -> StoreResult<usize> {
        let orphans = self.meta.orphans()?;
        let opens = self.lock_opens();
        for &ino in &orphans {
            self.purge_if_unused(&opens, ino);
        }
        Ok(orphans.len())
    }

    /// Try every pending purge once; returns how many are still pending.
    pub(crate) fn purge_pass(&self) -> usize {
        if self.is_closed() {
            return 0;
        }
        let pending = match self.meta.pending_purges() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(instance = self.config.instance, "cannot read purges: {e}");
                return 0;
            }
        };
        let mut left = 0;
        for rec in pending {
            if self.is_closed() {
                break;
            }
            match self
                .purge_data(&rec)
                .and_then(|()| self.meta.finish_purge(rec.ino))
            {
                Ok(()) => {
                    tracing::debug!(instance = self.config.instance, ino = %rec.ino, "purged")
                }
                Err(e) => {
                    tracing::debug!(instance = self.config.instance, ino = %rec.ino, "purge pending: {e}");
                    left += 1;
                }
            }
        }
        left
    }

    /// Delete the stripes of a purged inode here and on every other server of its layout.
    fn purge_data(&self, rec: &PurgeRecord) -> StoreResult<()> {
        let req = DeleteDataReq { ino: rec.ino };
        let layout = self.layout(rec.ino, rec.stripe_size, rec.stripe_width);
        let endpoints = layout
            .servers()
            .filter(|&s| s != self.index())
            .map(|s| self.purge_peers.get(s).ok_or(fs(Errno::EIO)))
            .collect::<StoreResult<Vec<_>>>()?;
        let calls: Vec<_> = endpoints.iter().map(|ep| ep.start(&req, &[])).collect();
        let mut result = self.data.delete(rec.ino);
        for call in calls {
            match call.wait() {
                // DeleteData itself never fails with these: they are the handshake's
                // "no such fragment" and "fragment destroyed". Either way the peer's
                // data is gone, which is all the purge wants.
                Ok(_) | Err(Errno::ENOENT) | Err(Errno::ESTALE) => {}
                Err(e) => result = result.and(Err(StoreError::Fs(e))),
            }
        }
        result
    }
}

fn remove_tree(p: &Path) -> StoreResult<()> {
    match std::fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The first failure of a change made on several servers, or success.
fn first_error<T>(results: Vec<StoreResult<T>>) -> StoreResult<()> {
    results
        .into_iter()
        .find_map(Result::err)
        .map_or(Ok(()), Err)
}
