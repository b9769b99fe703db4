//! A fragment made a cache of a PFS directory (docs/cache.md): its `cache.json`, the
//! directory opened as the owner beneath a PFS root, the namespace (server 0 only),
//! the cached stripes, and how the data side reaches a file on the PFS (`Resolver`).
//!
//! A fragment is created as scratch; the manager's `CacheConfigReq` (its instance's
//! configuration of type cache) turns it into a cache before any client mounts it.
//! The choice is written to `cache.json` (0600, beside `fragment.json`), so a restarted
//! server opens the fragment as the cache it was.

use crate::cache::coherence::{judge, InodeStatus, Verdict};
use crate::cache::pfsns::{open_resolved, PfsNamespace};
use crate::cache::reach::Reach;
use crate::cache::stripes::CacheStripes;
use crate::cache::{PfsFiles, Resolved};
use crate::error::{fs, StoreError, StoreResult};
use crate::fragment::peers::Peers;
use serde::{Deserialize, Serialize};
use spillway_types::{Errno, InodeNo, ServerIndex};
use spillway_wire::{CacheConfigReq, CacheDropReq, CacheInodeReq, CacheResolveReq, Call};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

pub(super) const CACHE_FILE: &str = "cache.json";
pub(super) const NAMESPACE_FILE: &str = "pfsns.sqlite";

/// The namespace of a cache instance lives on its server 0 alone (docs/cache.md,
/// "Where a request goes").
pub(crate) const NAMESPACE_SERVER: ServerIndex = ServerIndex(0);

/// `cache.json`: which PFS directory this fragment caches, for whom, with which
/// policies (the instance's defaults).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CacheConfig {
    pub pfs_dir: String,
    pub uid: u32,
    pub gid: u32,
    pub modified_threshold: u64,
    pub read_ahead: u64,
    pub sync_on_close: bool,
    pub sync_to_pfs: bool,
}

impl From<&CacheConfigReq> for CacheConfig {
    fn from(r: &CacheConfigReq) -> CacheConfig {
        CacheConfig {
            pfs_dir: r.pfs_dir.clone(),
            uid: r.uid,
            gid: r.gid,
            modified_threshold: r.modified_threshold,
            read_ahead: r.read_ahead,
            sync_on_close: r.sync_on_close,
            sync_to_pfs: r.sync_to_pfs,
        }
    }
}

impl CacheConfig {
    fn load(path: &Path) -> StoreResult<Option<CacheConfig>> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| StoreError::Corrupt(format!("{}: {e}", path.display())))
    }

    /// Written whole under a temporary name and renamed into place, synced.
    fn save(&self, dir: &Path) -> StoreResult<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = dir.join(format!("{CACHE_FILE}.new"));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        let text = serde_json::to_vec_pretty(self)
            .map_err(|e| StoreError::Corrupt(format!("encoding {CACHE_FILE}: {e}")))?;
        f.write_all(&text)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(CACHE_FILE))?;
        File::open(dir)?.sync_all()?;
        Ok(())
    }
}

/// Opens the directory a cache configuration names (`pfs_dir`, as `uid`/`gid`,
/// beneath one of `roots`). The server hands it down (`FragmentEnv`, lib.rs): the
/// rules of the PFS are staging's (`stage::pfs`), a layer above fragments.
pub(crate) type PfsDirOpener =
    fn(pfs_dir: &str, uid: u32, gid: u32, roots: &[String]) -> StoreResult<OwnedFd>;

/// A cache fragment's state.
pub(crate) struct CacheState {
    pub config: CacheConfig,
    /// The namespace, on the namespace server only.
    pub ns: Option<PfsNamespace>,
    pub stripes: CacheStripes,
    pub resolver: Resolver,
    /// Who may reach the PFS directory (namespace server only; cache/reach.rs).
    pub reach: Option<Reach>,
    /// Files whose last name went while open (namespace server): their cached data
    /// goes at their last close.
    unlinked: Mutex<HashSet<InodeNo>>,
    /// Regular files whose times were set (namespace server, memory only): a write to
    /// one of them afterwards is made known to its servers (`cache_written`).
    timed: Mutex<Timed>,
}

/// The files whose times were set, at most `TIMED_KEPT`, the oldest forgotten first.
#[derive(Default)]
struct Timed {
    set: HashSet<InodeNo>,
    order: std::collections::VecDeque<InodeNo>,
}

/// Files whose times were set that the namespace server remembers. A file forgotten
/// (or set before a restart of the namespace server) and written afterwards on some of
/// its servers only may keep the time set as its mtime on the PFS.
const TIMED_KEPT: usize = 1 << 16;

impl CacheState {
    /// Open the cache state of fragment `dir`, if it is a cache.
    pub(super) fn open(
        dir: &Path,
        index: ServerIndex,
        stripe_size: u32,
        count: u16,
        roots: &[String],
        opener: PfsDirOpener,
    ) -> StoreResult<Option<CacheState>> {
        let Some(config) = CacheConfig::load(&dir.join(CACHE_FILE))? else {
            return Ok(None);
        };
        Self::start(dir, config, index, stripe_size, count, roots, opener).map(Some)
    }

    /// Make fragment `dir` a cache of `config`'s directory.
    pub(super) fn configure(
        dir: &Path,
        config: CacheConfig,
        index: ServerIndex,
        stripe_size: u32,
        count: u16,
        roots: &[String],
        opener: PfsDirOpener,
    ) -> StoreResult<CacheState> {
        // Checked before anything is written: a refused directory leaves no trace.
        let state = Self::start(dir, config, index, stripe_size, count, roots, opener)?;
        state.config.save(dir)?;
        Ok(state)
    }

    fn start(
        dir: &Path,
        config: CacheConfig,
        index: ServerIndex,
        stripe_size: u32,
        count: u16,
        roots: &[String],
        opener: PfsDirOpener,
    ) -> StoreResult<CacheState> {
        let pfs_dir = opener(&config.pfs_dir, config.uid, config.gid, roots)?;
        let mount = pfs_dir.try_clone()?;
        let reach = if index == NAMESPACE_SERVER {
            Some(Reach::new(&config.pfs_dir, &pfs_dir)?)
        } else {
            None
        };
        let ns = if index == NAMESPACE_SERVER {
            Some(PfsNamespace::open(
                pfs_dir,
                &dir.join(NAMESPACE_FILE),
                index,
                stripe_size,
                count,
            )?)
        } else {
            None
        };
        let stripes = CacheStripes::open(dir, config.read_ahead)?;
        Ok(CacheState {
            config,
            ns,
            stripes,
            resolver: Resolver {
                mount,
                known: Mutex::new(HashMap::new()),
            },
            reach,
            unlinked: Mutex::new(HashSet::new()),
            timed: Mutex::new(Timed::default()),
        })
    }
}

/// How this server reaches a cached file on the PFS: by its file handle, which the
/// namespace server knows (asked once per file and kept; a file's handle never
/// changes while it exists).
pub(crate) struct Resolver {
    /// The instance's directory: a descriptor on the PFS for `open_by_handle_at`.
    mount: OwnedFd,
    known: Mutex<HashMap<InodeNo, Resolved>>,
}

/// A `Resolver` with what it needs to ask: the namespace (here) or the peers.
pub(super) struct Resolving<'a> {
    pub resolver: &'a Resolver,
    pub ns: Option<&'a PfsNamespace>,
    pub peers: &'a Peers,
}

impl Resolving<'_> {
    fn resolve(&self, ino: InodeNo) -> StoreResult<Resolved> {
        let known = |r: &Resolver| {
            r.known
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&ino)
                .cloned()
        };
        if let Some(r) = known(self.resolver) {
            return Ok(r);
        }
        let r = match self.ns {
            Some(ns) => ns.resolve(ino)?,
            None => {
                let ep = self.peers.get(NAMESPACE_SERVER).ok_or(fs(Errno::ESTALE))?;
                let r = ep.call(&CacheResolveReq { ino }).map_err(fs)?;
                Resolved {
                    handle_type: r.handle_type,
                    handle: r.handle,
                    uid: r.uid,
                    gid: r.gid,
                    stripe_size: r.stripe_size,
                    stripe_width: r.stripe_width,
                }
            }
        };
        self.resolver
            .known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ino, r.clone());
        Ok(r)
    }
}

impl Resolver {
    /// Forget a file (removed, or its layout may change): the next use asks again.
    pub(crate) fn forget(&self, ino: InodeNo) {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ino);
    }
}

impl PfsFiles for Resolving<'_> {
    fn open_read(&self, ino: InodeNo) -> StoreResult<File> {
        open_resolved(&self.resolver.mount, &self.resolve(ino)?, false)
    }

    fn open_write(&self, ino: InodeNo) -> StoreResult<Option<File>> {
        let r = self.resolve(ino)?;
        match open_resolved(&self.resolver.mount, &r, true) {
            Ok(f) => Ok(Some(f)),
            // The handle itself opens nothing on this host: the file is gone.
            Err(StoreError::Fs(Errno::ESTALE)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn stripe_size(&self, ino: InodeNo) -> StoreResult<u32> {
        Ok(self.resolve(ino)?.stripe_size)
    }
}

impl super::Fragment {
    /// The fragment's cache state, if it is a cache.
    pub(crate) fn cache(&self) -> Option<&CacheState> {
        self.cache.get()
    }

    /// `CacheConfigReq`: make this fragment a cache of the request's directory. The
    /// same directory again is a no-op (a manager retrying); another one is EEXIST, as
    /// is a fragment whose scratch namespace already holds files.
    pub(crate) fn configure_cache(&self, req: &CacheConfigReq) -> StoreResult<()> {
        let wanted = CacheConfig::from(req);
        if let Some(c) = self.cache.get() {
            return if c.config == wanted {
                Ok(())
            } else {
                Err(fs(Errno::EEXIST))
            };
        }
        // Only the root directory: a scratch instance in use is never turned over.
        if self.meta.inode_count()? > u64::from(self.index() == NAMESPACE_SERVER) {
            return Err(fs(Errno::EEXIST));
        }
        let state = CacheState::configure(
            &self.dir,
            wanted,
            self.index(),
            self.config.stripe_size,
            self.config.count(),
            &self.pfs_roots,
            self.open_pfs_dir,
        )?;
        // Two configure requests racing: the second one's state is dropped unused.
        self.data.no_direct_writes();
        state.stripes.set_room_wait(self.cache_room_wait);
        let _ = self.cache.set(state);
        Ok(())
    }

    /// How the data side reaches the PFS from here.
    pub(crate) fn resolving<'a>(&'a self, c: &'a CacheState) -> impl PfsFiles + 'a {
        Resolving {
            resolver: &c.resolver,
            ns: c.ns.as_ref(),
            peers: &self.peers,
        }
    }
}

impl super::Fragment {
    /// A file's last name went on the PFS: its cached data (dirty ranges included:
    /// the file they belonged to is gone) goes now, or at its last close.
    pub(crate) fn cache_unlinked(&self, ino: InodeNo) {
        let Some(c) = self.cache() else { return };
        if self.lock_opens().count(ino) > 0 {
            c.unlinked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(ino);
            return;
        }
        self.cache_drop_everywhere(ino);
    }

    /// The last open of `ino` here went.
    pub(crate) fn cache_released(&self, ino: InodeNo) {
        let Some(c) = self.cache() else { return };
        let gone = c
            .unlinked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ino);
        if gone {
            self.cache_drop_everywhere(ino);
        }
        // Its hidden name, if its last name went while it was open (pfsns/hidden.rs).
        if let Some(ns) = &c.ns {
            if let Err(e) = ns.reap(ino) {
                tracing::warn!(instance = self.config.instance, %ino, "removing a file unlinked while open: {e}");
            }
        }
    }

    /// Delete a removed file's cached stripes on every server of the instance (its
    /// layout may be gone with it, so all of them). Best effort: a server that misses
    /// it keeps unreachable bytes until its write-behind finds the file gone from the
    /// PFS (`PfsFiles::open_write` answers `None`) and drops them.
    fn cache_drop_everywhere(&self, ino: InodeNo) {
        let Some(c) = self.cache() else { return };
        let me = self.index();
        let all: Vec<ServerIndex> = std::iter::once(me)
            .chain(
                (0..self.config.count())
                    .map(ServerIndex)
                    .filter(|&s| s != me),
            )
            .collect();
        // Failures are logged by `on_servers`: best effort, as said above.
        self.on_servers(&all, ino, &spillway_wire::DeleteDataReq { ino }, || {
            let r = c.stripes.delete(&self.data, ino);
            c.resolver.forget(ino);
            r.map(|()| spillway_wire::Empty {})
        });
    }

    /// Cut a cached file's stripes on every server of its layout to `size`, before
    /// the PFS file is cut (`service::cache`).
    pub(crate) fn cache_truncate(
        &self,
        c: &CacheState,
        a: &spillway_types::Attr,
        size: u64,
    ) -> StoreResult<()> {
        let req = spillway_wire::TruncateDataReq {
            ino: a.ino,
            size,
            stripe_size: a.stripe_size,
        };
        let layout = self.layout(a.ino, a.stripe_size, a.stripe_width);
        let results = self.on_servers(&self.with_layout(&layout), a.ino, &req, || {
            c.stripes
                .truncate(&self.data, a.ino, size, a.stripe_size)
                .map(|()| spillway_wire::Empty {})
        });
        super::first_error(results)
    }

    /// Coherence at open (docs/cache.md section 7; the rule: cache/coherence.rs), on
    /// the namespace server before an open of `ino` is answered: a regular file whose
    /// PFS version is not the one agreed has its data servers asked, and its cached copy
    /// dropped when someone else changed it. Errors are the namespace's (the file is
    /// gone); a server not reached only leaves the question to the next open.
    pub(crate) fn cache_open_check(&self, c: &CacheState, ino: InodeNo) -> StoreResult<()> {
        let ns = c.ns.as_ref().ok_or(fs(Errno::ESTALE))?;
        let Some(seen) = ns.seen(ino)? else {
            return Ok(());
        };
        if seen.unchanged() {
            return Ok(());
        }
        let layout = self.layout(ino, seen.stripe_size, seen.stripe_width);
        let servers = self.data_servers(&layout);
        let statuses: Vec<Option<InodeStatus>> = self
            .cache_on_servers(&servers, ino, &CacheInodeReq { ino }, || {
                Ok(c.stripes.inode_status(&self.data, ino).into())
            })
            .into_iter()
            .map(|r| r.map(InodeStatus::from))
            .collect();
        // Changed while the servers answered (a write-behind writing now): the next
        // open decides.
        if ns.seen(ino)?.is_none_or(|again| again.now != seen.now) {
            return Ok(());
        }
        match judge(seen.now, seen.known, seen.owed, &statuses) {
            Verdict::Unsure => {
                tracing::debug!("coherence of inode {:#x}: undecided at this open", ino.0);
            }
            Verdict::Ours { dirty } => {
                ns.agree(ino, seen.now);
                if !dirty {
                    ns.settled_at(ino, seen.now.size);
                }
            }
            Verdict::Conflict { warn } => {
                if ns.owe_drop(ino) && warn {
                    conflict_warning(ino);
                }
                ns.agree(ino, seen.now);
            }
            Verdict::Drop { cached } => {
                let left = if cached {
                    self.cache_drop(c, &servers, ino)
                } else {
                    Left::Nothing
                };
                match left {
                    Left::Nothing => {
                        ns.drop_paid(ino);
                        ns.settled(ino);
                    }
                    // Writes arrived since the servers answered: they win, as above.
                    Left::Dirty => {
                        if ns.owe_drop(ino) {
                            conflict_warning(ino);
                        }
                    }
                    // The next open tries again.
                    Left::Unreached => {
                        ns.owe_drop(ino);
                    }
                }
                ns.agree(ino, seen.now);
            }
        }
        Ok(())
    }

    /// Drop the cached copy of `ino` on `servers`.
    fn cache_drop(&self, c: &CacheState, servers: &[ServerIndex], ino: InodeNo) -> Left {
        let replies = self.cache_on_servers(servers, ino, &CacheDropReq { ino }, || {
            let dropped = c.stripes.drop_clean(&self.data, ino)?;
            Ok(spillway_wire::CacheDropReply { kept: !dropped })
        });
        if replies.iter().any(Option::is_none) {
            Left::Unreached
        } else if replies.iter().flatten().any(|r| r.kept) {
            Left::Dirty
        } else {
            tracing::info!(
                "inode {:#x} changed on the PFS since it was cached: cached copy dropped",
                ino.0
            );
            Left::Nothing
        }
    }

    /// `req` (about `ino`) on each of `servers` (this one through `here`), at once:
    /// their replies in the order of `servers`, None where it failed (logged).
    fn cache_on_servers<C: Call>(
        &self,
        servers: &[ServerIndex],
        ino: InodeNo,
        req: &C,
        here: impl FnOnce() -> StoreResult<C::Reply>,
    ) -> Vec<Option<C::Reply>> {
        self.on_servers(servers, ino, req, here)
            .into_iter()
            .map(Result::ok)
            .collect()
    }

    /// A write found the fragment full: make room for `need` bytes by `deadline`
    /// (evicting, writing behind: `CacheStripes::make_room`). True when there is.
    pub(crate) fn cache_make_room(&self, c: &CacheState, need: u64, deadline: Instant) -> bool {
        c.stripes
            .make_room(&self.data, &self.resolving(c), need, deadline)
    }

    /// Before the fragment goes: every dirty byte to the PFS, or refuse (EBUSY), so a
    /// teardown never drops data silently (docs/cache.md, "What survives what").
    pub(crate) fn cache_flush_all(&self) -> StoreResult<()> {
        let Some(c) = self.cache() else {
            return Ok(());
        };
        c.stripes
            .flush_all(&self.data, &self.resolving(c))
            .map_err(|e| {
                tracing::warn!(
                    instance = self.config.instance,
                    dirty = c.stripes.dirty_bytes(),
                    "cache not written back, so not destroyed: {e}"
                );
                fs(Errno::EBUSY)
            })
    }
}

/// What a drop of a cached copy left behind.
enum Left {
    Nothing,
    /// Some server holds writes not yet on the PFS, and kept its copy.
    Dirty,
    /// Some server was not reached.
    Unreached,
}

fn conflict_warning(ino: InodeNo) {
    tracing::warn!(
        "inode {:#x} changed on the PFS while the cache holds writes to it not yet written \
         there: the cached writes win; its cached copy is dropped once they are written",
        ino.0
    );
}

/// The write-behind thread of a fragment: once a second (while the fragment is a
/// cache) a pass of write-behind and eviction (`CacheStripes::flush_pass`).
pub(super) fn start_write_behind(frag: &Arc<super::Fragment>) {
    let weak = Arc::downgrade(frag);
    let name = format!("writebehind-{}", frag.config.instance);
    if let Err(e) = std::thread::Builder::new()
        .name(name)
        .spawn(move || write_behind(&weak))
    {
        tracing::error!("cannot start the write-behind thread: {e}");
    }
}

fn write_behind(weak: &Weak<super::Fragment>) {
    // A pass that wrote something is followed by the next at once (a stream is
    // written behind at the PFS's pace); otherwise a pass a second, or when rung.
    let mut kick: Option<Arc<crate::cache::stripes::Kick>> = None;
    let mut again = false;
    loop {
        match (&kick, again) {
            (_, true) => {}
            (Some(k), false) => k.wait(Duration::from_secs(1)),
            (None, false) => std::thread::sleep(Duration::from_secs(1)),
        }
        let Some(f) = weak.upgrade() else { return };
        if f.is_closed() {
            return;
        }
        let Some(c) = f.cache() else { continue };
        kick.get_or_insert_with(|| c.stripes.kick());
        let policy = crate::cache::stripes::FlushPolicy {
            modified_threshold: c.config.modified_threshold,
            ..Default::default()
        };
        let report = c.stripes.flush_pass(&f.data, &f.resolving(c), &policy);
        again = report.bytes > 0;
        tracing::debug!(instance = f.config.instance, ?report, "write-behind pass");
        f.reap_hidden(c);
    }
}

impl super::Fragment {
    /// Files unlinked while open that nobody has opened again since a restart (or
    /// for long): their hidden names and cached data go (pfsns/hidden.rs).
    fn reap_hidden(&self, c: &CacheState) {
        let Some(ns) = &c.ns else { return };
        for ino in ns.hidden_due(&|ino| self.is_open(ino)) {
            self.cache_drop_everywhere(ino);
            if let Err(e) = ns.reap(ino) {
                tracing::warn!(instance = self.config.instance, %ino, "removing a file unlinked while open: {e}");
            }
        }
    }
}

impl super::Fragment {
    /// Times set explicitly on `ino` (a SETATTR, on the namespace server), given to
    /// every server of its layout before the namespace sets them on the PFS file: each
    /// keeps them while it holds writes of the file not yet there, and leaves them on
    /// the PFS file after its write-behinds (stripes/mtime.rs). Nothing for what is not
    /// a regular file (no write-behind).
    pub(crate) fn cache_times(
        &self,
        c: &CacheState,
        ino: InodeNo,
        times: &crate::cache::wblog::LogTimes,
    ) -> StoreResult<()> {
        let ns = c.ns.as_ref().ok_or(fs(Errno::ESTALE))?;
        let a = ns.get_attr(ino)?;
        if a.kind != spillway_types::FileKind::Regular {
            return Ok(());
        }
        let req = times.request(ino);
        let layout = self.layout(ino, a.stripe_size, a.stripe_width);
        let servers = self.data_servers(&layout);
        let results = self.on_servers(&servers, ino, &req, || {
            c.stripes
                .set_times(ino, *times)
                .map(|()| spillway_wire::Empty {})
                .map_err(StoreError::Io)
        });
        super::first_error(results)?;
        if !times.void && times.mtime.is_some() {
            let mut t = c.timed.lock().unwrap_or_else(|e| e.into_inner());
            if t.set.insert(ino) {
                t.order.push_back(ino);
            }
            while t.order.len() > TIMED_KEPT {
                if let Some(old) = t.order.pop_front() {
                    t.set.remove(&old);
                }
            }
        }
        Ok(())
    }

    /// A client wrote `ino` (its `ExtendSizeReq` with `touch`), and the mount shows
    /// `mtime` for it now. If its mtime was set before, its servers learn that the
    /// write voids it, on all of them, not only those the write reached: each leaves
    /// this time after its write-behinds rather than the one set (stripes/mtime.rs),
    /// and the PFS file takes it now. Best effort: a server not reached keeps the time
    /// set (logged).
    pub(crate) fn cache_written(
        &self,
        c: &CacheState,
        ino: InodeNo,
        mtime: spillway_types::Timespec,
    ) {
        let was_set = {
            let mut t = c.timed.lock().unwrap_or_else(|e| e.into_inner());
            let was = t.set.remove(&ino);
            if was {
                t.order.retain(|&i| i != ino);
            }
            was
        };
        if !was_set {
            return;
        }
        let void = crate::cache::wblog::LogTimes {
            atime: None,
            mtime: Some(mtime),
            set_at: mtime,
            void: true,
        };
        // Failures are logged by `on_servers`.
        let _ = self.cache_times(c, ino, &void);
        // A server whose write-behind left the time set before it learnt of the write
        // has forgotten it (clean since): the PFS file takes the write's time here, and
        // the write-behinds still to come keep it (it is later than their writes).
        if let Some(ns) = &c.ns {
            let change = crate::meta::AttrChange {
                mtime: Some(crate::meta::TimeChange::At(mtime)),
                ..Default::default()
            };
            if let Err(e) = ns.set_attr(ino, &change) {
                tracing::warn!(%ino, "the mtime of a write after a time set: {e}");
            }
        }
    }
}

impl super::Fragment {
    /// `CacheFlushReq`: write a file's cached changes to the PFS and return once they
    /// are there: this server's stripes (`HERE`), or, on the namespace server, those
    /// of every server of the file's layout (`FILE`; `ON_CLOSE` only when the
    /// instance's `sync_on_close` is on, `ON_FSYNC` only when its `sync_to_pfs` is).
    pub(crate) fn cache_flush(&self, c: &CacheState, ino: InodeNo, scope: u8) -> StoreResult<()> {
        use spillway_wire::flush_scope;
        let here = || {
            c.stripes
                .flush_inode(&self.data, &self.resolving(c), ino)
                .map(|_| ())
        };
        match scope {
            flush_scope::HERE => return here(),
            flush_scope::ON_CLOSE if !c.config.sync_on_close => return Ok(()),
            flush_scope::ON_FSYNC if !c.config.sync_to_pfs => return Ok(()),
            flush_scope::FILE | flush_scope::ON_CLOSE | flush_scope::ON_FSYNC => {}
            _ => return Err(fs(Errno::EINVAL)),
        }
        let ns = c.ns.as_ref().ok_or(fs(Errno::ESTALE))?;
        let a = ns.get_attr(ino)?;
        if a.kind != spillway_types::FileKind::Regular {
            return Ok(());
        }
        let req = spillway_wire::CacheFlushReq {
            ino,
            scope: flush_scope::HERE,
        };
        let layout = self.layout(ino, a.stripe_size, a.stripe_width);
        let servers = self.data_servers(&layout);
        let results = self.on_servers(&servers, ino, &req, || {
            here().map(|()| spillway_wire::Empty {})
        });
        super::first_error(results)
    }
}
