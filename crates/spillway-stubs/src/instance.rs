//! One instance as a client sees it: its servers (an `Endpoint` each) and the client
//! stubs. Every stub goes to the server the placement functions name; the stubs never
//! decide placement themselves.

use spillway_placement::{dentry_server, Layout};
use spillway_types::{Attr, Errno, InodeNo, InstanceDescriptor, ServerIndex, Tunables};
use spillway_wire::messages::*;
use spillway_wire::{Arena, Endpoint, Payload, PendingCall};
use std::path::Path;
use std::sync::Arc;

/// The credential of the descriptor file at `path`, if it is still a valid descriptor
/// of `instance`. Anything else (file gone, unreadable, invalid, another instance's)
/// gives `None`: the caller keeps the credential it has, which may still be good,
/// rather than trade it for one that certainly is not.
pub fn renewed_credential(path: &Path, instance: u64) -> Option<Vec<u8>> {
    match InstanceDescriptor::load(path) {
        Ok(d) if d.instance == instance => Some(d.credential_bytes()),
        Ok(d) => {
            tracing::warn!(
                "{} now describes instance {}, not {instance}: keeping the credential",
                path.display(),
                d.instance
            );
            None
        }
        Err(e) => {
            tracing::warn!("{}: {e}; keeping the credential", path.display());
            None
        }
    }
}

pub struct Instance {
    pub desc: InstanceDescriptor,
    servers: Vec<Arc<Endpoint>>,
    /// Shared memory for bulk to servers on this host (clients only).
    arena: Option<Arc<Arena>>,
    /// A load-balanced instance's client: the replica it reads from (`reading_as`).
    replicas: Option<Replicas>,
    /// A load-balanced instance's client: the endpoints its reads go through (quick
    /// to give up on a dead server, `Endpoint::failing_over`), in server order.
    replica_eps: Vec<Arc<Endpoint>>,
}

/// The replicas a client node of a load-balanced instance reads from, in the order it
/// tries them (`spillway_placement::replica_order`), and the one it reads from now.
struct Replicas {
    order: Vec<ServerIndex>,
    at: std::sync::atomic::AtomicUsize,
}

impl Replicas {
    fn current(&self) -> (usize, ServerIndex) {
        let i = self.at.load(std::sync::atomic::Ordering::Relaxed) % self.order.len();
        (i, self.order[i])
    }

    /// Replica `i` failed: go on to the next (unless another read did already).
    fn failed(&self, i: usize) {
        let next = (i + 1) % self.order.len();
        let _ = self.at.compare_exchange(
            i,
            next,
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

/// A random name for a client mount (`HelloReq::mount`): from the kernel's random
/// source, else from the process's randomly keyed hasher. Never 0 (no mount).
fn mount_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::io::Read;
    let mut b = [0u8; 8];
    let id = match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            h.finish()
        }
    };
    id.max(1)
}

/// A read answered this may go to another replica: the server could not be reached
/// (EIO, ETIMEDOUT from the endpoint) or failed reading its disk (EIO).
fn replica_down(e: Errno) -> bool {
    e == Errno::EIO || e == Errno::ETIMEDOUT
}

impl Instance {
    /// An instance whose credential stays the descriptor's.
    pub fn new(desc: InstanceDescriptor, tunables: &Tunables, peer_name: &str) -> Instance {
        let credential = desc.credential_bytes();
        Self::build(desc, Role::Client, &credential, None, tunables, peer_name)
    }

    /// The instance as one of its own servers sees it: every connection is a peer's,
    /// proved by the instance `secret` (bytes, as the fragment holds it; the
    /// descriptor's own credential is not used), for the stage coordinator, which
    /// checks the job owner's permissions itself.
    pub fn peer(
        desc: InstanceDescriptor,
        secret: &[u8],
        tunables: &Tunables,
        peer_name: &str,
    ) -> Instance {
        Self::build(desc, Role::Peer, secret, None, tunables, peer_name)
    }

    /// An instance mounted from the descriptor file `origin`: before each connection
    /// the file is read again and its credential used, so that the agent can renew
    /// the capability in place (see `renewed_credential`).
    pub fn renewing_from(
        desc: InstanceDescriptor,
        origin: &Path,
        tunables: &Tunables,
        peer_name: &str,
    ) -> Instance {
        let credential = desc.credential_bytes();
        Self::build(
            desc,
            Role::Client,
            &credential,
            Some(origin),
            tunables,
            peer_name,
        )
    }

    fn build(
        desc: InstanceDescriptor,
        role: Role,
        credential: &[u8],
        origin: Option<&Path>,
        tunables: &Tunables,
        peer_name: &str,
    ) -> Instance {
        // A client's bulk goes through shared memory to the servers on its host
        // (docs/wire-protocol.md, "Shared-memory bulk"); peers and admins send little.
        let arena = (role == Role::Client && tunables.arena_size > 0)
            .then(|| Arena::create(tunables.arena_size, tunables.writeback_chunk))
            .and_then(|r| {
                r.map_err(|e| tracing::warn!("no shared-memory bulk (no arena: {e})"))
                    .ok()
            });
        // A client names its mount, so that the homes of the files it holds open tell
        // it of other mounts' changes (docs/wire-protocol.md, "Notices").
        let mount = if role == Role::Client { mount_id() } else { 0 };
        let endpoint = |addr: &String, reconnect_window: std::time::Duration| {
            let hello =
                HelloReq::new(role, desc.instance, credential.to_vec(), peer_name).for_mount(mount);
            let ep = Endpoint::new(addr.clone(), hello, tunables.rpc_deadline, reconnect_window);
            // A peer instance serves one stage, which fails as a whole when a
            // server is gone: one reconnect window, not one per call.
            let ep = if role == Role::Peer {
                ep.giving_up_once_unreachable()
            } else {
                ep
            };
            let ep = match origin {
                Some(path) => {
                    let (path, instance) = (path.to_path_buf(), desc.instance);
                    ep.with_credential_source(Box::new(move || renewed_credential(&path, instance)))
                }
                None => ep,
            };
            match &arena {
                Some(a) => ep.with_arena(a.clone()),
                None => ep,
            }
        };
        // A load-balanced instance's client reads through endpoints of their own,
        // which give up on a dead server quickly (another replica has the bytes) while
        // metadata calls ride out a restart (docs/cache.md §6).
        let replica_eps = if role == Role::Client && desc.ldbal {
            desc.servers
                .iter()
                .map(|addr| {
                    Arc::new(
                        endpoint(addr, tunables.replica_failover)
                            .failing_over(tunables.replica_rest),
                    )
                })
                .collect()
        } else {
            Vec::new()
        };
        let servers = desc
            .servers
            .iter()
            .map(|addr| Arc::new(endpoint(addr, tunables.reconnect_window)))
            .collect();
        Instance {
            desc,
            servers,
            arena,
            replicas: None,
            replica_eps,
        }
    }

    /// The client of node `node`: of a load-balanced instance it reads every stripe
    /// from one replica, chosen by the node's name, and goes on to the next when that
    /// one fails (docs/placement.md, "Load-balanced replicas"). Other instances are
    /// unchanged.
    pub fn reading_as(mut self, node: &str) -> Instance {
        if self.desc.ldbal {
            let n = self.count();
            // The manager's assignment, else the node name's hash (a mount by hand).
            let first = match self.desc.replica.filter(|&r| r < n) {
                Some(r) => ServerIndex(r),
                None => spillway_placement::replica_of(node.as_bytes(), n),
            };
            let order = spillway_placement::replica_order(first, n);
            tracing::info!(
                "load-balanced instance: node {node} reads from server {} ({})",
                order[0].0,
                self.desc.servers[usize::from(order[0].0)]
            );
            self.replicas = Some(Replicas {
                order,
                at: std::sync::atomic::AtomicUsize::new(0),
            });
        }
        self
    }

    /// The server this client reads a load-balanced instance from now (None: not
    /// load-balanced, or not a client).
    pub fn replica(&self) -> Option<ServerIndex> {
        self.replicas.as_ref().map(|r| r.current().1)
    }

    /// The most bytes one slot of the client's arena holds (0: no arena).
    pub fn arena_slot_size(&self) -> usize {
        self.arena.as_ref().map_or(0, |a| a.slot_size())
    }

    pub fn count(&self) -> u16 {
        self.servers.len() as u16
    }

    pub fn server(&self, i: ServerIndex) -> Result<&Endpoint, Errno> {
        self.servers
            .get(usize::from(i.0))
            .map(|e| &**e)
            .ok_or(Errno::ESTALE)
    }

    /// The endpoint of server `i`, for calls that outlive the request starting them.
    pub fn endpoint(&self, i: ServerIndex) -> Result<Arc<Endpoint>, Errno> {
        self.servers
            .get(usize::from(i.0))
            .cloned()
            .ok_or(Errno::ESTALE)
    }

    fn home(&self, ino: InodeNo) -> Result<&Endpoint, Errno> {
        self.server(ino.home())
    }

    /// The server holding entry `name` of `parent`: spread over the servers for
    /// scratch; for a cache instance, whose names are a PFS directory's, its server 0
    /// (docs/cache.md).
    pub fn dentry_home(&self, parent: InodeNo, name: &[u8]) -> ServerIndex {
        if self.desc.cache {
            return ServerIndex(0);
        }
        dentry_server(parent, name, self.count())
    }

    fn dentry(&self, parent: InodeNo, name: &[u8]) -> Result<&Endpoint, Errno> {
        self.server(self.dentry_home(parent, name))
    }

    /// Where a file's stripes are read: its placement, or for a load-balanced
    /// instance's client, all on the replica it reads from now.
    pub fn layout(&self, attr: &Attr) -> Layout {
        match &self.replicas {
            Some(r) => Layout::replica(attr.stripe_size, r.current().1, self.count()),
            None => Layout::of(attr.ino, attr.stripe_size, attr.stripe_width, self.count()),
        }
    }

    // ---- metadata stubs -------------------------------------------------------------

    pub fn lookup(&self, parent: InodeNo, name: &[u8]) -> Result<(EntryRef, Attr), Errno> {
        let r = self.dentry(parent, name)?.call(&LookupReq {
            parent,
            name: name.to_vec(),
        })?;
        let attr = match r.attr {
            Some(a) => a,
            None => self.getattr(r.entry.ino)?,
        };
        Ok((r.entry, attr))
    }

    pub fn lookup_entry(&self, parent: InodeNo, name: &[u8]) -> Result<Option<EntryRef>, Errno> {
        match self.dentry(parent, name)?.call(&LookupReq {
            parent,
            name: name.to_vec(),
        }) {
            Ok(r) => Ok(Some(r.entry)),
            Err(e) if e == Errno::ENOENT => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn getattr(&self, ino: InodeNo) -> Result<Attr, Errno> {
        Ok(self.home(ino)?.call(&GetAttrReq { ino })?.attr)
    }

    pub fn setattr(&self, req: SetAttrReq) -> Result<Attr, Errno> {
        Ok(self.home(req.ino)?.call(&req)?.attr)
    }

    /// Create an inode and its entry on the entry's server (one round trip).
    pub fn create(&self, req: CreateReq) -> Result<Attr, Errno> {
        Ok(self.dentry(req.parent, &req.name)?.call(&req)?.attr)
    }

    pub fn remove_entry(&self, parent: InodeNo, name: &[u8], want: u8) -> Result<EntryRef, Errno> {
        Ok(self
            .dentry(parent, name)?
            .call(&RemoveEntryReq {
                parent,
                name: name.to_vec(),
                want,
            })?
            .removed)
    }

    /// A cache instance's removal, made on the PFS as `caller` (its namespace server
    /// answers for every name).
    pub fn cache_remove(
        &self,
        caller: Caller,
        parent: InodeNo,
        name: &[u8],
        want: u8,
    ) -> Result<EntryRef, Errno> {
        let req = CacheRemoveReq {
            caller,
            parent,
            name: name.to_vec(),
            want,
        };
        Ok(self.dentry(parent, name)?.call(&req)?.removed)
    }

    /// A cache instance's rename, made on the PFS as `caller`.
    pub fn cache_rename(
        &self,
        caller: Caller,
        old: (InodeNo, &[u8]),
        new: (InodeNo, &[u8]),
        flags: u32,
    ) -> Result<RenameReply, Errno> {
        let req = CacheRenameReq {
            caller,
            old_parent: old.0,
            old_name: old.1.to_vec(),
            new_parent: new.0,
            new_name: new.1.to_vec(),
            flags,
        };
        self.dentry(old.0, old.1)?.call(&req)
    }

    /// A cache instance: may `caller` reach the cached directory on the PFS? `Ok(true)`
    /// when every caller may (nothing above it is closed to anybody), `Ok(false)` when
    /// this one may, EACCES when it may not.
    pub fn cache_access(&self, caller: Caller) -> Result<bool, Errno> {
        if !self.desc.cache {
            return Err(Errno::EOPNOTSUPP);
        }
        let ep = self.server(ServerIndex(0))?;
        Ok(ep.call(&CacheAccessReq { caller })?.open_to_all)
    }

    pub fn insert_entry(
        &self,
        parent: InodeNo,
        name: &[u8],
        entry: EntryRef,
        replace: bool,
    ) -> Result<Option<EntryRef>, Errno> {
        let req = InsertEntryReq {
            parent,
            name: name.to_vec(),
            entry,
            replace,
        };
        Ok(self.dentry(parent, name)?.call(&req)?.replaced)
    }

    /// Rename when both entries live on one server (`flags`: `rename_flags`).
    pub fn rename_local(
        &self,
        old_parent: InodeNo,
        old_name: &[u8],
        new_parent: InodeNo,
        new_name: &[u8],
        flags: u32,
    ) -> Result<RenameReply, Errno> {
        let req = RenameReq {
            old_parent,
            old_name: old_name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            flags,
        };
        self.dentry(old_parent, old_name)?.call(&req)
    }

    pub fn link_count(&self, ino: InodeNo, delta: i32) -> Result<Attr, Errno> {
        Ok(self.home(ino)?.call(&LinkCountReq { ino, delta })?.attr)
    }

    /// Update a directory's times (and subdirectory count); its new attributes.
    pub fn touch_dir(&self, ino: InodeNo, nlink_delta: i32) -> Result<Attr, Errno> {
        Ok(self
            .home(ino)?
            .call(&TouchDirReq { ino, nlink_delta })?
            .attr)
    }

    /// The servers that may hold directory entries: all of them, or a cache
    /// instance's server 0 alone (`dentry_home`).
    fn entry_servers(&self) -> &[Arc<Endpoint>] {
        let n = if self.desc.cache {
            1
        } else {
            self.servers.len()
        };
        &self.servers[..n.min(self.servers.len())]
    }

    /// Seal a directory on every server (it must be empty everywhere). On ENOTEMPTY
    /// anywhere the seals already made are undone.
    pub fn seal_dir(&self, ino: InodeNo) -> Result<(), Errno> {
        let calls: Vec<_> = self
            .entry_servers()
            .iter()
            .map(|s| s.start(&SealDirReq { ino }, &[]))
            .collect();
        let results: Vec<Result<Empty, Errno>> = calls.into_iter().map(PendingCall::wait).collect();
        if let Some(err) = results.iter().find_map(|r| r.as_ref().err().copied()) {
            for (s, r) in self.entry_servers().iter().zip(&results) {
                if r.is_ok() {
                    let _ = s.call(&UnsealDirReq { ino });
                }
            }
            return Err(err);
        }
        Ok(())
    }

    pub fn unseal_dir(&self, ino: InodeNo) {
        for s in self.entry_servers() {
            let _ = s.call(&UnsealDirReq { ino });
        }
    }

    /// Every entry of a directory: its entries are spread over all servers, so ask
    /// each (in parallel), page by page. With `plus`, every entry also carries its
    /// inode's attributes (READDIRPLUS): a server sends those of the inodes it homes,
    /// which is nearly all of its entries as an inode is made where its first name
    /// lives; the rest (renamed or linked in from another server) are asked of their
    /// homes, in parallel. An entry whose inode vanished meanwhile stays without.
    pub fn read_dir(&self, dir: InodeNo, page: u32, plus: bool) -> Result<Vec<DirEntry>, Errno> {
        let mut out = Vec::new();
        let servers = self.entry_servers();
        let mut cursors: Vec<Option<Vec<u8>>> = vec![Some(Vec::new()); servers.len()];
        while cursors.iter().any(Option::is_some) {
            let calls: Vec<_> = servers
                .iter()
                .zip(&cursors)
                .map(|(s, c)| {
                    c.as_ref().map(|after| {
                        s.start(
                            &ReadDirReq {
                                dir,
                                after: after.clone(),
                                max: page,
                                plus,
                            },
                            &[],
                        )
                    })
                })
                .collect();
            for (i, call) in calls.into_iter().enumerate() {
                let Some(call) = call else { continue };
                let r = call.wait()?;
                cursors[i] = if r.more {
                    r.entries.last().map(|e| e.name.clone())
                } else {
                    None
                };
                out.extend(r.entries);
            }
        }
        if plus {
            self.attach_missing_attrs(&mut out);
        }
        Ok(out)
    }

    /// The attributes of listed entries whose server was not their inode's home, a
    /// bounded number of calls in flight at once.
    fn attach_missing_attrs(&self, entries: &mut [DirEntry]) {
        const IN_FLIGHT: usize = 128;
        let missing: Vec<usize> = (0..entries.len())
            .filter(|&i| entries[i].attr.is_none())
            .collect();
        for batch in missing.chunks(IN_FLIGHT) {
            let calls: Vec<_> = batch
                .iter()
                .filter_map(|&i| {
                    let ino = entries[i].entry.ino;
                    let home = self.home(ino).ok()?;
                    Some((i, home.start(&GetAttrReq { ino }, &[])))
                })
                .collect();
            for (i, call) in calls {
                entries[i].attr = call.wait().ok().map(|r| r.attr);
            }
        }
    }

    pub fn open(&self, ino: InodeNo, flags: u32) -> Result<Attr, Errno> {
        Ok(self.home(ino)?.call(&OpenReq { ino, flags })?.attr)
    }

    pub fn release(&self, ino: InodeNo) -> Result<(), Errno> {
        self.home(ino)?.call(&ReleaseReq { ino }).map(|_| ())
    }

    /// The new attributes, and the version the file had just before (`ExtendSizeReply`),
    /// once the other mounts holding the file open dropped what they cached of it.
    pub fn extend_size(
        &self,
        ino: InodeNo,
        size: u64,
        touch: bool,
    ) -> Result<ExtendSizeReply, Errno> {
        let r = self.home(ino)?.call(&ExtendSizeReq {
            ino,
            size,
            touch,
            sync: false,
        })?;
        self.await_notices(ino, &r);
        Ok(r)
    }

    /// Wait until the mounts an ExtendSize's change was told to (`r`) dropped what they
    /// cached of the file, or the home's `notice_wait` passed. A failure leaves those
    /// mounts' caches as the home's own wait left them: logged, not the caller's error
    /// (its change is made).
    pub fn await_notices(&self, ino: InodeNo, r: &ExtendSizeReply) {
        if r.notices == 0 {
            return;
        }
        let req = NoticeWaitReq {
            ino,
            first: r.notice_first,
            count: r.notices,
        };
        if let Err(e) = self.home(ino).and_then(|h| h.call(&req)) {
            tracing::debug!(%ino, "waiting for other mounts to drop their caches: {e}");
        }
    }

    /// `extend_size`, started: the caller overlaps it with other calls.
    pub fn start_extend_size(
        &self,
        ino: InodeNo,
        size: u64,
        touch: bool,
        sync: bool,
    ) -> Result<PendingCall<'_, ExtendSizeReq>, Errno> {
        Ok(self.home(ino)?.start(
            &ExtendSizeReq {
                ino,
                size,
                touch,
                sync,
            },
            &[],
        ))
    }

    /// `touch_dir`, started.
    pub fn start_touch_dir(
        &self,
        ino: InodeNo,
        nlink_delta: i32,
    ) -> Result<PendingCall<'_, TouchDirReq>, Errno> {
        Ok(self
            .home(ino)?
            .start(&TouchDirReq { ino, nlink_delta }, &[]))
    }

    pub fn set_xattr(
        &self,
        ino: InodeNo,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<(), Errno> {
        let req = SetXattrReq {
            ino,
            name: name.to_vec(),
            value: value.to_vec(),
            flags,
        };
        self.home(ino)?.call(&req).map(|_| ())
    }

    pub fn get_xattr(&self, ino: InodeNo, name: &[u8]) -> Result<Vec<u8>, Errno> {
        Ok(self
            .home(ino)?
            .call(&GetXattrReq {
                ino,
                name: name.to_vec(),
            })?
            .value)
    }

    pub fn list_xattr(&self, ino: InodeNo) -> Result<Vec<Vec<u8>>, Errno> {
        Ok(self.home(ino)?.call(&ListXattrReq { ino })?.names)
    }

    pub fn remove_xattr(&self, ino: InodeNo, name: &[u8]) -> Result<(), Errno> {
        self.home(ino)?
            .call(&RemoveXattrReq {
                ino,
                name: name.to_vec(),
            })
            .map(|_| ())
    }

    pub fn set_layout(
        &self,
        ino: InodeNo,
        stripe_size: u32,
        stripe_width: u16,
    ) -> Result<Attr, Errno> {
        let req = SetLayoutReq {
            ino,
            stripe_size,
            stripe_width,
        };
        Ok(self.home(ino)?.call(&req)?.attr)
    }

    pub fn read_link(&self, ino: InodeNo) -> Result<Vec<u8>, Errno> {
        Ok(self.home(ino)?.call(&ReadLinkReq { ino })?.value)
    }

    /// `req` to every server at once; the replies in server order, or the first error
    /// (the calls after it are dropped unanswered).
    fn on_every_server<C: Call>(&self, req: &C) -> Result<Vec<C::Reply>, Errno> {
        let calls: Vec<_> = self.servers.iter().map(|s| s.start(req, &[])).collect();
        calls.into_iter().map(PendingCall::wait).collect()
    }

    /// Per-server space: (capacity, used, inodes) of each fragment.
    pub fn statfs(&self) -> Result<Vec<StatFsReply>, Errno> {
        self.on_every_server(&StatFsReq {})
    }

    pub fn sync_meta(&self, ino: InodeNo) -> Result<(), Errno> {
        self.home(ino)?.call(&SyncMetaReq {}).map(|_| ())
    }

    /// A cache instance: write the file's cached changes to the PFS and wait until
    /// they are there (`flush_scope::FILE`), or do so if the instance's `sync_on_close`
    /// policy says a close must (`ON_CLOSE`). Asked of the namespace server, which asks
    /// every server of the file's layout.
    pub fn cache_flush(&self, ino: InodeNo, scope: u8) -> Result<(), Errno> {
        if !self.desc.cache {
            return Err(Errno::EOPNOTSUPP);
        }
        self.home(ino)?
            .call(&spillway_wire::CacheFlushReq { ino, scope })
            .map(|_| ())
    }

    // ---- data stubs -----------------------------------------------------------------

    /// Read `[offset, offset+len)` of a file of `size` bytes: pieces from their stripes'
    /// servers in parallel; holes and the part past a stripe's stored end read as zeros.
    pub fn read(
        &self,
        layout: &Layout,
        ino: InodeNo,
        offset: u64,
        len: u32,
        size: u64,
    ) -> Result<Payload, Errno> {
        let Some(r) = &self.replicas else {
            return self.read_from(&self.servers, layout, ino, offset, len, size);
        };
        // A load-balanced instance: from the current replica, then each other in
        // turn while they fail (reads change nothing, so trying again is safe).
        let mut last = Errno::EIO;
        for _ in 0..r.order.len() {
            let (i, server) = r.current();
            let layout = Layout::replica(layout.stripe_size, server, self.count());
            match self.read_from(&self.replica_eps, &layout, ino, offset, len, size) {
                Err(e) if replica_down(e) => {
                    tracing::warn!(
                        "reading inode {ino} from replica {} ({}): {e}; trying the next",
                        server.0,
                        self.desc.servers[usize::from(server.0)]
                    );
                    r.failed(i);
                    last = e;
                }
                other => return other,
            }
        }
        Err(last)
    }

    /// Read through `eps` (the instance's endpoints, or its replica endpoints).
    fn read_from(
        &self,
        eps: &[Arc<Endpoint>],
        layout: &Layout,
        ino: InodeNo,
        offset: u64,
        len: u32,
        size: u64,
    ) -> Result<Payload, Errno> {
        let end = offset.saturating_add(u64::from(len)).min(size);
        if end <= offset {
            return Ok(Payload::default());
        }
        let pieces = layout.pieces(offset, end - offset);
        let mut calls = Vec::with_capacity(pieces.len());
        for &(stripe, within, n) in &pieces {
            let ep = eps
                .get(usize::from(layout.server_of(stripe).0))
                .ok_or(Errno::ESTALE)?;
            calls.push(ep.start_read(&ReadReq {
                ino,
                stripe: stripe.0,
                offset: within,
                len: n,
            }));
        }
        // A short answer means a hole up to the stripe's end: zeroes.
        if calls.len() == 1 {
            // The common case (a read within one stripe): hand the reply on as it is
            // (in the arena's slot when it came through shared memory).
            let mut data = calls
                .into_iter()
                .next()
                .map_or(Ok(Payload::default()), |c| c.wait())?;
            data.zero_fill_to((end - offset) as usize);
            return Ok(data);
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let mut pos = 0usize;
        for (call, &(_, _, n)) in calls.into_iter().zip(&pieces) {
            let data = call.wait()?;
            let take = data.len().min(n as usize);
            out[pos..pos + take].copy_from_slice(&data[..take]);
            pos += n as usize;
        }
        Ok(Payload::Heap(out))
    }

    /// fdatasync a file's dirty stripes on the given servers, started.
    pub fn start_sync_data(
        &self,
        ino: InodeNo,
        servers: &[ServerIndex],
    ) -> Result<Vec<PendingCall<'_, SyncDataReq>>, Errno> {
        servers
            .iter()
            .map(|&s| Ok(self.server(s)?.start(&SyncDataReq { ino }, &[])))
            .collect()
    }

    /// Make a file's data durable on the given servers.
    pub fn sync_data(&self, ino: InodeNo, servers: &[ServerIndex]) -> Result<(), Errno> {
        let mut calls = Vec::new();
        for &s in servers {
            calls.push(self.server(s)?.start(&SyncDataReq { ino }, &[]));
        }
        calls.into_iter().try_for_each(|c| c.wait().map(|_| ()))
    }

    /// Where a file's stripes are and how many bytes each server holds of it.
    pub fn stripe_info(
        &self,
        layout: &Layout,
        ino: InodeNo,
    ) -> Result<Vec<(ServerIndex, StripeLen)>, Errno> {
        let mut out = Vec::new();
        for s in layout.servers() {
            let r = self.server(s)?.call(&StripeInfoReq { ino })?;
            out.extend(r.stripes.into_iter().map(|x| (s, x)));
        }
        out.sort_by_key(|(_, x)| x.stripe);
        Ok(out)
    }

    /// Every fragment's usage counters (libdatawarp's accounting), in server order.
    pub fn fragment_stats(&self) -> Result<Vec<FragmentStatsReply>, Errno> {
        self.on_every_server(&FragmentStatsReq {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_types::descriptor::encode_hex;

    fn descriptor(instance: u64, credential: &[u8]) -> String {
        InstanceDescriptor {
            instance,
            servers: vec!["127.0.0.1:1".into()],
            capacity: 1 << 30,
            stripe_size: 1 << 20,
            credential: encode_hex(credential),
            cache: false,
            ldbal: false,
            replica: None,
        }
        .to_json()
    }

    #[test]
    fn renewed_credential_follows_the_file_only_when_it_is_valid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("instance.json");
        assert_eq!(renewed_credential(&path, 7), None, "no file");
        std::fs::write(&path, descriptor(7, b"first")).unwrap();
        assert_eq!(renewed_credential(&path, 7).as_deref(), Some(&b"first"[..]));
        std::fs::write(&path, descriptor(7, b"second")).unwrap();
        assert_eq!(
            renewed_credential(&path, 7).as_deref(),
            Some(&b"second"[..])
        );
        std::fs::write(&path, descriptor(8, b"other")).unwrap();
        assert_eq!(renewed_credential(&path, 7), None, "another instance");
        std::fs::write(&path, "{ torn").unwrap();
        assert_eq!(renewed_credential(&path, 7), None, "not JSON");
        std::fs::write(&path, descriptor(7, b"x").replace("\"78\"", "\"zz\"")).unwrap();
        assert_eq!(renewed_credential(&path, 7), None, "credential not hex");
    }
}
