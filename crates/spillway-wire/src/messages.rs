//! Every message of protocol version 1, with its opcode. Opcodes are stable: add new
//! ones, never renumber. The tables in docs/wire-protocol.md list the same.
//!
//! Requests fall in four groups:
//! * connection: `Hello` (must be the first frame; proves the right to an instance);
//! * admin (role admin): fragments;
//! * metadata (sent to the server that the placement functions name);
//! * data (stripes, sent to the stripe's server).

use crate::codec::{Dec, Wire, WireError};
use crate::wire_struct;
use spillway_types::{Attr, FileKind, InodeNo, Timespec};

/// What a request type declares about itself.
pub trait Call: Wire {
    const OP: u16;
    const NAME: &'static str;
    /// Safe to send again if the connection broke before the reply arrived.
    const IDEMPOTENT: bool;
    /// The opcode of this request's twin whose bulk lies in the connection's arena
    /// (its body: this request's, then `arena_off u64, len u32`), if it has one.
    const ARENA_OP: Option<u16> = None;
    type Reply;
    fn decode_reply(body: Vec<u8>) -> Result<Self::Reply, WireError>;
}

/// Declare a one-byte enumeration of the wire: a `#[repr(u8)]` enum, its byte
/// (`u8::from`), a checked `from_u8`, and a `Wire` encoding whose decode refuses any
/// other byte with the codec's error (`WireError::Invalid`), so an undecodable request
/// is answered EPROTO like any other.
macro_rules! wire_enum {
    ($(#[$m:meta])* $name:ident $what:literal { $($(#[$vm:meta])* $v:ident = $n:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name { $($(#[$vm])* $v = $n),* }
        impl $name {
            /// The value of byte `b`, if it is one.
            pub fn from_u8(b: u8) -> Option<$name> {
                match b {
                    $( $n => Some($name::$v), )*
                    _ => None,
                }
            }
        }
        impl From<$name> for u8 {
            fn from(v: $name) -> u8 {
                v as u8
            }
        }
        impl Wire for $name {
            fn enc(&self, e: &mut crate::codec::Enc) {
                e.u8(u8::from(*self))
            }
            fn dec(d: &mut Dec<'_>) -> Result<Self, WireError> {
                $name::from_u8(d.u8()?).ok_or(WireError::Invalid($what))
            }
        }
    };
}

wire_enum!(
    /// Roles a connection may take in `Hello` (`HelloReq::role`).
    Role "role" {
        /// A FUSE client (or libdatawarp through it) of one instance.
        Client = 1,
        /// Another server of the same instance (purges, truncates, stage copies).
        Peer = 2,
        /// The manager or `spillway cluster`: fragment administration.
        Admin = 3,
    }
);

/// `SetAttrReq::valid` bits.
pub mod setattr {
    pub const MODE: u32 = 1;
    pub const UID: u32 = 2;
    pub const GID: u32 = 4;
    pub const SIZE: u32 = 8;
    pub const ATIME: u32 = 16;
    pub const MTIME: u32 = 32;
    pub const ATIME_NOW: u32 = 64;
    pub const MTIME_NOW: u32 = 128;
    pub const CTIME: u32 = 256;
    /// Data up to `size` was written (a stage-in): the size becomes at least `size`,
    /// and nothing is cut. Saves the stage a separate ExtendSize.
    pub const SIZE_WRITTEN: u32 = 512;
    /// Clear the set-user-ID bit, and the set-group-ID bit where group execute is set,
    /// from the mode the file has when the home applies the request (after any MODE
    /// in it): a chown of a non-directory, or a truncate or write by a caller without
    /// CAP_FSETID (the kernel's FUSE_HANDLE_KILLPRIV_V2 leaves this to the file
    /// system). Decided at the home, so a concurrent chmod cannot be undone by it.
    pub const KILL_SUIDGID: u32 = 1024;
}

/// `RenameReq::flags` (the Linux renameat2 values).
pub mod rename_flags {
    pub const NOREPLACE: u32 = 1;
    pub const EXCHANGE: u32 = 2;
}

/// `SetXattrReq::flags` (the Linux setxattr values).
pub mod xattr_flags {
    pub const CREATE: u32 = 1;
    pub const REPLACE: u32 = 2;
    /// Setting `system.posix_acl_access` clears the set-group-ID bit: the caller is
    /// neither in the file's group nor has CAP_FSETID (the kernel's
    /// FUSE_SETXATTR_ACL_KILL_SGID, decided by the client as fuser lacks SETXATTR_EXT).
    pub const ACL_KILL_SGID: u32 = 4;
}

/// `RemoveEntryReq::want` values.
pub mod want {
    pub const ANY: u8 = 0;
    pub const NOT_DIR: u8 = 1;
    pub const DIR: u8 = 2;
}

impl crate::codec::ListItem for InodeNo {}
impl crate::codec::ListItem for u64 {}
impl crate::codec::ListItem for u32 {}

wire_struct!(
    /// Reply of no content.
    Empty {}
);

// ---- connection -------------------------------------------------------------------
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloReq {
    pub version_min: u16,
    pub version_max: u16,
    /// A `Role`, kept as its byte: an unknown role is the server's to refuse (EINVAL,
    /// docs/wire-protocol.md), not an undecodable hello (EPROTO). Read it with
    /// `role()`.
    pub role: u8,
    pub instance: u64,
    pub credential: Vec<u8>,
    /// Free text for the server's log (hostname, pid).
    pub peer_name: String,
    /// The client mount this connection belongs to (random, chosen at mount; 0: none):
    /// the home tells a mount of other mounts' changes to the files it holds open, on
    /// the connection that mount watches with (`WatchReq`). The last field, and
    /// optional: a hello that ends before it names no mount (tools that speak the
    /// protocol themselves, and clients built before it).
    pub mount: u64,
}
impl Wire for HelloReq {
    fn enc(&self, e: &mut crate::codec::Enc) {
        self.version_min.enc(e);
        self.version_max.enc(e);
        self.role.enc(e);
        self.instance.enc(e);
        self.credential.enc(e);
        self.peer_name.enc(e);
        self.mount.enc(e);
    }
    fn dec(d: &mut Dec<'_>) -> Result<Self, WireError> {
        Ok(HelloReq {
            version_min: u16::dec(d)?,
            version_max: u16::dec(d)?,
            role: u8::dec(d)?,
            instance: u64::dec(d)?,
            credential: Vec::<u8>::dec(d)?,
            peer_name: String::dec(d)?,
            mount: if d.remaining() == 0 { 0 } else { u64::dec(d)? },
        })
    }
}
impl HelloReq {
    /// The one way to say hello: this build's protocol version as both ends of the
    /// range, so every client, peer and admin connection offers the same versions.
    pub fn new(
        role: Role,
        instance: u64,
        credential: Vec<u8>,
        peer_name: impl Into<String>,
    ) -> Self {
        HelloReq {
            version_min: crate::PROTOCOL_VERSION,
            version_max: crate::PROTOCOL_VERSION,
            role: role.into(),
            instance,
            credential,
            peer_name: peer_name.into(),
            mount: 0,
        }
    }

    /// The hello of a connection of client mount `mount` (`HelloReq::mount`).
    pub fn for_mount(mut self, mount: u64) -> Self {
        self.mount = mount;
        self
    }

    /// The role asked for; `None` for a byte this build does not know.
    pub fn role(&self) -> Option<Role> {
        Role::from_u8(self.role)
    }
}
wire_struct!(HelloReply {
    version: u16,
    server_index: u16,
    server_count: u16
});
wire_struct!(
    /// Asks whether this connection's bulk may travel through shared memory
    /// (docs/wire-protocol.md, "Shared-memory bulk"). Answered by the wire layer
    /// (`serve.rs`), never by a service: EOPNOTSUPP where the server offers no arenas,
    /// EEXIST when the connection has one.
    ArenaOfferReq {}
);
wire_struct!(
    /// The server's host (`boot_id`, and `st_dev`/`st_ino` of its network namespace),
    /// the abstract name of its door, its pid, and a token for this connection.
    ArenaOfferReply {
        boot_id: Vec<u8>,
        netns_dev: u64,
        netns_ino: u64,
        door: Vec<u8>,
        pid: u32,
        token: Vec<u8>,
    }
);

// ---- admin ------------------------------------------------------------------------
wire_struct!(FragmentCreateReq {
    instance: u64,
    index: u16,
    /// Data addresses of all servers of the instance, in order (this one included).
    peers: Vec<String>,
    capacity: u64,
    credential: Vec<u8>,
    stripe_size: u32,
    /// Owner of the instance's root directory.
    root_uid: u32,
    root_gid: u32,
    root_mode: u32,
});
wire_struct!(FragmentDestroyReq { instance: u64 });
wire_struct!(FragmentListReq {});
wire_struct!(FragmentInfo {
    instance: u64,
    index: u16,
    count: u16,
    capacity: u64,
    used: u64,
    inodes: u64,
    /// Unlinked files whose stripes on other servers are not all deleted yet.
    pending_purges: u64,
});
wire_struct!(FragmentListReply { fragments: Vec<FragmentInfo> });
wire_struct!(ServerStatusReq {});
// A server's storage as the manager's heartbeat sees it.
wire_struct!(ServerStatusReply {
    /// Bytes the server offers: the file system holding its root (or less, if the
    /// server was started with a capacity limit).
    capacity: u64,
    /// Bytes free on that file system.
    free: u64,
    /// Sum of the capacities of the fragments it holds.
    allocated: u64,
    fragments: u32,
});

// ---- metadata ---------------------------------------------------------------------
wire_struct!(EntryRef {
    ino: InodeNo,
    kind: FileKind
});
wire_struct!(LookupReq { parent: InodeNo, name: Vec<u8> });
wire_struct!(LookupReply {
    entry: EntryRef,
    /// The attributes, when this server is also the inode's home.
    attr: Option<Attr>,
});
wire_struct!(GetAttrReq { ino: InodeNo });
wire_struct!(AttrReply { attr: Attr });
// `ExtendSizeReq`'s answer: the attributes after, and the version (size, mtime,
// ctime) the file had just before this change. A client whose cached pages reflect
// that version knows nobody else changed the file in between (close-to-open with
// several writers, docs/data-plane.md "Consistency").
wire_struct!(ExtendSizeReply {
    attr: Attr,
    prior_size: u64,
    prior_mtime: Timespec,
    prior_ctime: Timespec,
    /// Other mounts holding the file open were sent `ChangedNotice`, ids
    /// `notice_first ..` (`notices` of them, those the home waits for): the writer
    /// waits for their answers (`NoticeWaitReq`) before its close or fsync returns.
    notice_first: u64,
    notices: u32,
});
impl ExtendSizeReply {
    /// The reply for a change from `before` to `attr`.
    pub fn of(before: Attr, attr: Attr) -> ExtendSizeReply {
        ExtendSizeReply {
            prior_size: before.size,
            prior_mtime: before.mtime,
            prior_ctime: before.ctime,
            attr,
            notice_first: 0,
            notices: 0,
        }
    }
}
wire_struct!(SetAttrReq {
    ino: InodeNo,
    valid: u32,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    atime: Timespec,
    mtime: Timespec,
    ctime: Timespec,
});
impl SetAttrReq {
    /// A SetAttr of `ino` that changes nothing yet: callers set `valid` and the
    /// fields it names.
    pub fn of(ino: InodeNo) -> SetAttrReq {
        SetAttrReq {
            ino,
            valid: 0,
            mode: 0,
            uid: 0,
            gid: 0,
            size: 0,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
        }
    }
}
wire_struct!(CreateReq {
    parent: InodeNo,
    name: Vec<u8>,
    kind: FileKind,
    mode: u32,
    uid: u32,
    gid: u32,
    rdev: u32,
    /// Symlink target (empty otherwise).
    target: Vec<u8>,
    stripe_size: u32,
    stripe_width: u16,
    /// Also open the new inode for this connection (create + open in one round trip).
    open: bool,
    /// Extended attributes the inode is created with, in the same transaction: the
    /// POSIX ACLs it inherits from its directory's default ACL (docs/data-plane.md).
    xattrs: Vec<Xattr>,
});
impl CreateReq {
    /// A create of `name` in `parent` owned by `uid`:`gid` with `mode`, and nothing
    /// else: no device, no symlink target, the default stripe geometry, not opened, no
    /// extended attributes. Callers set the rest with `CreateReq { .., ..new(..) }`.
    pub fn new(
        parent: InodeNo,
        name: impl Into<Vec<u8>>,
        kind: FileKind,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> CreateReq {
        CreateReq {
            parent,
            name: name.into(),
            kind,
            mode,
            uid,
            gid,
            rdev: 0,
            target: Vec::new(),
            stripe_size: 0,
            stripe_width: 0,
            open: false,
            xattrs: Vec::new(),
        }
    }
}
wire_struct!(
    /// One extended attribute (name, value).
    Xattr {
        name: Vec<u8>,
        value: Vec<u8>
    }
);
wire_struct!(RemoveEntryReq { parent: InodeNo, name: Vec<u8>, want: u8 });
wire_struct!(RemoveEntryReply { removed: EntryRef });
wire_struct!(InsertEntryReq {
    parent: InodeNo,
    name: Vec<u8>,
    entry: EntryRef,
    /// Replace an existing entry (returned) instead of failing with EEXIST.
    replace: bool,
});
wire_struct!(InsertEntryReply { replaced: Option<EntryRef> });
wire_struct!(RenameReq {
    old_parent: InodeNo,
    old_name: Vec<u8>,
    new_parent: InodeNo,
    new_name: Vec<u8>,
    flags: u32,
});
wire_struct!(RenameReply { moved: EntryRef, replaced: Option<EntryRef> });
wire_struct!(LinkCountReq {
    ino: InodeNo,
    /// Added to nlink (negative to drop links). An inode left with no link and no open
    /// handle is purged: its stripes deleted on every server.
    delta: i32,
});
wire_struct!(TouchDirReq {
    ino: InodeNo,
    nlink_delta: i32
});
wire_struct!(SealDirReq { ino: InodeNo });
wire_struct!(UnsealDirReq { ino: InodeNo });
wire_struct!(ReadDirReq {
    dir: InodeNo,
    after: Vec<u8>,
    max: u32,
    /// Also the attributes of the entries whose inode this server homes (READDIRPLUS:
    /// a listing that costs no LOOKUP or GETATTR per entry afterwards).
    plus: bool,
});
wire_struct!(DirEntry {
    name: Vec<u8>,
    entry: EntryRef,
    /// The inode's attributes: asked for (`plus`) and this server is its home.
    attr: Option<Attr>,
});
wire_struct!(ReadDirReply { entries: Vec<DirEntry>, more: bool });
wire_struct!(OpenReq {
    ino: InodeNo,
    flags: u32
});
wire_struct!(ReleaseReq { ino: InodeNo });
wire_struct!(ExtendSizeReq {
    ino: InodeNo,
    /// New size if larger than the stored one.
    size: u64,
    /// Set mtime and ctime to now (data was written).
    touch: bool,
    /// Make the metadata durable before replying (fsync).
    sync: bool,
});
wire_struct!(SetXattrReq { ino: InodeNo, name: Vec<u8>, value: Vec<u8>, flags: u32 });
wire_struct!(GetXattrReq { ino: InodeNo, name: Vec<u8> });
wire_struct!(BytesReply { value: Vec<u8> });
wire_struct!(ListXattrReq { ino: InodeNo });
wire_struct!(NamesReply { names: Vec<Vec<u8>> });
wire_struct!(RemoveXattrReq { ino: InodeNo, name: Vec<u8> });
wire_struct!(StatFsReq {});
wire_struct!(StatFsReply {
    capacity: u64,
    used: u64,
    inodes: u64
});
wire_struct!(SyncMetaReq {});

// ---- notices (docs/wire-protocol.md, "Notices") -------------------------------------
wire_struct!(
    /// This connection receives the notices for its mount (`HelloReq::mount`, not 0):
    /// the home sends them as frames of kind `Notice`.
    WatchReq {}
);
wire_struct!(
    /// The notice `id` was acted on: what this mount's kernel cached of the file is gone.
    NoticeDoneReq { id: u64 }
);
wire_struct!(
    /// Wait until the mounts sent notices `first ..` (`count`, from an
    /// `ExtendSizeReply`) answered, or the server's `notice_wait` since they were sent
    /// passed.
    NoticeWaitReq {
        ino: InodeNo,
        first: u64,
        count: u32,
    }
);
/// The opcode of `ChangedNotice` frames.
pub const NOTICE_CHANGED: u16 = 140;
wire_struct!(
    /// Another mount changed a file this mount holds open: its attributes now. The
    /// mount drops its kernel's pages and attributes of the file unless they reflect
    /// this version, then answers `NoticeDoneReq` with the frame's id.
    ChangedNotice { attr: Attr }
);
wire_struct!(
    /// This fragment's usage counters (libdatawarp's accounting). Counters run from the
    /// server's start; `max_used` is the most data stored at once since then.
    FragmentStatsReq {}
);
wire_struct!(FragmentStatsReply {
    capacity: u64,
    used: u64,
    max_used: u64,
    bytes_written: u64,
    bytes_read: u64,
    inodes: u64,
    files_created: u64,
    stage_bytes_read: u64,
    stage_bytes_written: u64,
});
wire_struct!(
    /// Set the stripe geometry of a regular file that holds no data yet, or of a
    /// directory (then the default for files created in it; subdirectories do not
    /// inherit it). `stripe_width` 0 means all servers.
    SetLayoutReq { ino: InodeNo, stripe_size: u32, stripe_width: u16 }
);
wire_struct!(
    /// The target of a symlink (BytesReply).
    ReadLinkReq { ino: InodeNo }
);

// ---- data -------------------------------------------------------------------------
wire_struct!(
    /// Followed by the data itself as bulk (the rest of the frame).
    /// `sync`: fdatasync this file's dirty stripes on this server before replying.
    /// `charged`: bytes the client took for this write from its space grant of the
    /// session `grant_epoch` (docs/data-plane.md, "Space grants"); 0 for a write the
    /// client waits for, which the server fits into free space or refuses (a shorter
    /// `written` when only a prefix fits).
    WriteReq {
        ino: InodeNo,
        stripe: u64,
        offset: u32,
        sync: bool,
        grant_epoch: u64,
        charged: u32,
    }
);
wire_struct!(
    /// `written` may be less than the data sent when the fragment is full. `granted`:
    /// bytes newly added to the grant of session `grant_epoch` (this connection's).
    WriteReply { written: u32, grant_epoch: u64, granted: u64 }
);
wire_struct!(
    /// Reply body is the data itself (bulk); shorter than `len` past the stripe's end.
    ReadReq { ino: InodeNo, stripe: u64, offset: u32, len: u32 }
);
wire_struct!(
    /// A `Write` whose `len` bytes lie at `arena_off` of the connection's arena
    /// instead of following as bulk.
    WriteArenaReq { write: WriteReq, arena_off: u64, len: u32 }
);
wire_struct!(
    /// A `Read` whose data the server puts at `arena_off` of the connection's arena
    /// (room for `read.len` bytes there) instead of sending it as bulk.
    ReadArenaReq { read: ReadReq, arena_off: u64 }
);
wire_struct!(
    /// The bytes a `ReadArena` put in the arena; fewer than asked past the stripe's end.
    ReadArenaReply { len: u32 }
);
wire_struct!(TruncateDataReq {
    ino: InodeNo,
    size: u64,
    stripe_size: u32
});
wire_struct!(SyncDataReq { ino: InodeNo });
wire_struct!(DeleteDataReq { ino: InodeNo });
wire_struct!(StripeInfoReq { ino: InodeNo });
wire_struct!(StripeLen {
    stripe: u64,
    len: u64
});
wire_struct!(StripeInfoReply { stripes: Vec<StripeLen> });
wire_struct!(
    /// Give back `bytes` of this connection's space grant (a client gone idle). Only
    /// a grant of session `grant_epoch` is returned: after a reconnect it is a no-op.
    GrantReleaseReq { grant_epoch: u64, bytes: u64 }
);

// ---- sparse files: fallocate, SEEK_DATA/SEEK_HOLE, allocation reports (opcodes 100-109)
/// `FallocateDataReq::mode`: what to do with the range on this server's stripes.
pub mod falloc_mode {
    /// Allocate (FALLOC_FL_KEEP_SIZE or not: the file's size is the home's business).
    pub const ALLOCATE: u8 = 0;
    /// Deallocate: the range reads as zeros and frees its space.
    pub const PUNCH: u8 = 1;
    /// Zero the range and leave it allocated.
    pub const ZERO: u8 = 2;
}
wire_struct!(
    /// Apply a fallocate to the stripes this server holds in `[offset, offset+len)` of
    /// the file (its layout from `stripe_size`, `stripe_width`). `check`: only answer
    /// whether the space the range needs here is free (ENOSPC if not), change nothing.
    FallocateDataReq {
        ino: InodeNo,
        stripe_size: u32,
        stripe_width: u16,
        offset: u64,
        len: u64,
        mode: u8,
        check: bool
    }
);
wire_struct!(
    /// SEEK_DATA (`hole` false) or SEEK_HOLE over this server's stripes of the file:
    /// the first such offset in `[offset, end)`, a stripe of this server that is not
    /// stored counting as a hole.
    SeekDataReq {
        ino: InodeNo,
        stripe_size: u32,
        stripe_width: u16,
        offset: u64,
        end: u64,
        hole: bool
    }
);
wire_struct!(SeekDataReply { found: Option<u64> });
wire_struct!(InoBytes {
    ino: InodeNo,
    bytes: u64
});
wire_struct!(
    /// Peer role only: server `server` holds `bytes` of disk space of each inode's
    /// stripes (absolute values, for inodes homed at the receiver).
    AllocReportReq { server: u16, entries: Vec<InoBytes> }
);

// ---- cache instances (opcodes 110-119, docs/cache.md) ------------------------------
wire_struct!(
    /// Peer role only (the manager, proving the instance secret): make this fragment a
    /// cache of PFS directory `pfs_dir`, which must lie beneath one of the server's
    /// `pfs_roots` and be reachable by `uid`/`gid` (the instance owner). Sent to every
    /// server of the instance; sending it again with the same directory is a no-op,
    /// with another one EEXIST.
    CacheConfigReq {
        pfs_dir: String,
        uid: u32,
        gid: u32,
        /// Bytes dirty in one file that start its write-behind.
        modified_threshold: u64,
        /// Bytes fetched past a read that missed.
        read_ahead: u64,
        /// Closing a file writes its changes to the PFS before the close returns.
        sync_on_close: bool,
        /// fsync writes a file's changes to the PFS (not only the servers' SSDs).
        sync_to_pfs: bool
    }
);
wire_struct!(
    /// Peer role only: what the data side needs to reach a cached file on the PFS,
    /// answered by the instance's namespace server (server 0).
    CacheResolveReq { ino: InodeNo }
);
wire_struct!(CacheResolveReply {
    handle_type: i32,
    handle: Vec<u8>,
    uid: u32,
    gid: u32,
    stripe_size: u32,
    stripe_width: u16
});
/// `CacheFlushReq::scope` values.
pub mod flush_scope {
    /// This server's stripes of the file.
    pub const HERE: u8 = 0;
    /// Every server of the file's layout (sent to the namespace server, which asks
    /// them): `dw_wait_sync_complete`.
    pub const FILE: u8 = 1;
    /// As `FILE`, if the instance's `sync_on_close` policy is on (a close; otherwise
    /// answered at once).
    pub const ON_CLOSE: u8 = 2;
    /// As `FILE`, if the instance's `sync_to_pfs` policy is on (an fsync or fdatasync,
    /// after the file's bytes are durable on the servers; otherwise answered at once).
    pub const ON_FSYNC: u8 = 3;
}
wire_struct!(
    /// Write a file's cached changes to the PFS and wait until they are there
    /// (`dw_wait_sync_complete`, `sync_on_close`); `scope` from `flush_scope`.
    CacheFlushReq { ino: InodeNo, scope: u8 }
);
/// `CacheTimesReq::set` bits.
pub mod times_set {
    /// `atime` is set.
    pub const ATIME: u8 = 1;
    /// `mtime` is set.
    pub const MTIME: u8 = 2;
    /// Not a time set: a write came after the times kept, and `mtime` is the time the
    /// namespace server shows for it.
    pub const VOID: u8 = 4;
}
wire_struct!(
    /// Peer role only (the namespace server, at a SETATTR that sets times): times set
    /// explicitly on a cached file (`set` from `times_set`; `set_at`: the namespace
    /// server's clock then). A server holding writes of the file not yet on the PFS
    /// keeps them (in its write-behind log) and leaves them on the PFS file after each
    /// of its write-behinds, until a later write voids the mtime (docs/cache.md,
    /// "File times"); a server holding none has nothing to do.
    CacheTimesReq { ino: InodeNo, set: u8, atime: Timespec, mtime: Timespec, set_at: Timespec }
);
wire_struct!(
    /// Bytes of an instance's cached data not yet on the PFS, on this server.
    CacheStatusReply { dirty_bytes: u64, dirty_files: u64 }
);
wire_struct!(CacheStatusReq {});
wire_struct!(
    /// Peer role only (the manager, proving the instance secret): this fragment holds a
    /// whole replica of every file of a load-balanced instance (docs/cache.md §6). It
    /// stages in every stripe, and answers every change a client asks for EROFS.
    /// Recorded on the fragment's disk; sending it again is a no-op.
    LdbalConfigReq {}
);
wire_struct!(
    /// A PFS file's version as a server saw it (`fstat`): coherence at open compares
    /// them (docs/cache.md section 7).
    PfsVersion { size: u64, mtime: Timespec, ctime: Timespec, ino: u64 }
);
wire_struct!(
    /// Peer role only (the namespace server, at an open that found the PFS file changed
    /// by someone else): drop this server's cached copy of the file, unless it holds
    /// writes not yet on the PFS (then nothing is dropped, and `kept` says so).
    CacheDropReq { ino: InodeNo }
);
wire_struct!(CacheDropReply { kept: bool });
wire_struct!(
    /// Peer role only (the namespace server, at an open that found the PFS file's
    /// version moved): what this server holds of a cached file.
    CacheInodeReq { ino: InodeNo }
);
wire_struct!(CacheInodeReply {
    /// Some of its bytes are cached here (or stripe files of it are on disk).
    cached: bool,
    /// Some are written here and not yet on the PFS.
    dirty: bool,
    /// A write-behind, truncate or drop of it runs here now.
    busy: bool,
    /// The PFS file's version right after this server's last write-behind of it.
    flushed: Option<PfsVersion>
});

wire_struct!(
    /// Who asks, as the client's kernel saw the calling thread: its file-system uid and
    /// gid and its supplementary groups (at most `MAX_CALLER_GROUPS`).
    Caller {
        uid: u32,
        gid: u32,
        groups: Vec<u32>
    }
);
/// The most supplementary groups a `Caller` carries (Linux's NGROUPS_MAX).
pub const MAX_CALLER_GROUPS: usize = 65536;
wire_struct!(
    /// Client role, to a cache instance's namespace server: may `caller` reach the
    /// cached PFS directory on the PFS itself, i.e. search every directory above it?
    /// Answered EACCES when not (docs/cache.md section 1, docs/security.md section 8).
    CacheAccessReq { caller: Caller }
);
wire_struct!(CacheAccessReply {
    /// Every directory above the cached one lets anybody through (search for owner,
    /// group and others, no ACL): the answer is the same for every caller.
    open_to_all: bool
});
wire_struct!(
    /// Client role, cache instances: `RemoveEntryReq` carried out on the PFS as
    /// `caller`, so the PFS's own checks (write and search on the directory, the sticky
    /// rule) judge the entry the name holds at the moment of the removal.
    CacheRemoveReq {
        caller: Caller,
        parent: InodeNo,
        name: Vec<u8>,
        want: u8
    }
);
wire_struct!(
    /// Client role, cache instances: `RenameReq` carried out on the PFS as `caller`.
    CacheRenameReq {
        caller: Caller,
        old_parent: InodeNo,
        old_name: Vec<u8>,
        new_parent: InodeNo,
        new_name: Vec<u8>,
        flags: u32
    }
);

// ---- locks: fcntl byte ranges, OFD locks, flock (opcodes 90-99, docs/data-plane.md) --
/// `LockReq::class`: Linux keeps two lock spaces that never conflict with each other.
pub mod lock_class {
    /// fcntl byte-range locks (F_SETLK/F_SETLKW, OFD locks).
    pub const POSIX: u8 = 0;
    /// flock(2): whole-file locks of an open file description.
    pub const FLOCK: u8 = 1;
}
/// `LockReq::kind`, `LockInfo::kind`.
pub mod lock_kind {
    pub const UNLOCK: u8 = 0;
    pub const READ: u8 = 1;
    pub const WRITE: u8 = 2;
}
/// A session holding locks must show life (any lock request or `LockRenew`) within this
/// long, or its home drops its locks (a client machine that vanished without closing
/// its connection).
pub const LOCK_LEASE: std::time::Duration = std::time::Duration::from_secs(30);
wire_struct!(
    /// Set, change or remove (`kind` UNLOCK) `owner`'s lock on bytes `[start, end]`
    /// (inclusive) of `ino`, at its home. A conflict answers EAGAIN, changing nothing
    /// (flock: the owner's earlier lock is dropped first, as Linux does). `pid` is shown
    /// to F_GETLK callers.
    LockReq {
        ino: InodeNo,
        owner: u64,
        class: u8,
        kind: u8,
        start: u64,
        end: u64,
        pid: u32
    }
);
wire_struct!(
    /// How many locks `owner` still holds on the inode in that class afterwards.
    LockReply { held: u32 }
);
wire_struct!(
    /// F_GETLK: the first lock of another owner that conflicts with `kind` on
    /// `[start, end]`.
    GetLkReq { ino: InodeNo, owner: u64, kind: u8, start: u64, end: u64 }
);
wire_struct!(LockInfo {
    kind: u8,
    start: u64,
    end: u64,
    pid: u32
});
wire_struct!(GetLkReply { conflict: Option<LockInfo> });
wire_struct!(
    /// Drop every lock of `owner` on `ino`: its POSIX locks (close: FUSE flush), its
    /// flocks (last close of the open file description: FUSE release), or both.
    UnlockOwnerReq { ino: InodeNo, owner: u64, posix: bool, flock: bool }
);
wire_struct!(
    /// Keep this session's locks (see `LOCK_LEASE`).
    LockRenewReq {}
);
wire_struct!(
    /// `lost`: this session's locks were dropped since it last renewed (lease lapsed).
    LockRenewReply { lost: bool, held: u32 }
);

// ---- staging (docs/staging.md) ------------------------------------------------------
wire_enum!(
    /// Which way a stage copies (`direction` of the stage requests): the same bytes as
    /// a stage ticket's direction (`spillway_types::stage_ticket::DIRECTION_IN`, `_OUT`).
    StageDir "stage direction" {
        /// PFS → instance.
        In = 0,
        /// Instance → PFS.
        Out = 1,
    }
);
/// What a stage names: one file, a directory tree, or a list of file pairs.
pub mod stage_kind {
    pub const FILE: u8 = 0;
    pub const DIRECTORY: u8 = 1;
    pub const LIST: u8 = 2;
}
/// A stage as its coordinator reports it.
pub mod stage_state {
    /// The server does not know the stage (never started here, forgotten, or lost in a
    /// restart).
    pub const UNKNOWN: u8 = 0;
    pub const RUNNING: u8 = 1;
    pub const COMPLETE: u8 = 2;
    pub const FAILED: u8 = 3;
    pub const TERMINATED: u8 = 4;
}
wire_enum!(
    /// One file of a stage (`StageFileEvent::state`).
    FileState "file state" {
        /// Found by the enumeration, not copied yet.
        Pending = 0,
        /// Copied, byte count checked, destination fsynced.
        Complete = 1,
        Failed = 2,
    }
);
wire_struct!(StagePair {
    source: String,
    destination: String
});
wire_struct!(
    /// Start a stage on this server as its coordinator (admin role: the manager).
    /// Paths inside the instance are absolute from its root (`/in/x`); PFS paths are
    /// absolute and must lie under one of the server's own `pfs_roots` and under the
    /// ticket's PFS paths. Starting a stage id that this server already knows is a
    /// no-op.
    StageStartReq {
        stage: u64,
        instance: u64,
        direction: StageDir,
        kind: u8,
        /// One pair for file and directory stages, any number for lists.
        pairs: Vec<StagePair>,
        /// The stage ticket the manager signed (spillway_types::stage_ticket): the
        /// identity the stage runs as and the paths it may touch come from it alone.
        ticket: Vec<u8>,
        /// Files copied at once.
        files_in_flight: u32,
    }
);
wire_struct!(
    /// Progress of a stage since `cursor` (0 at first); waits up to `wait_ms` for
    /// something new (a file event or the end).
    StageProgressReq { stage: u64, cursor: u64, wait_ms: u32 }
);
wire_struct!(StageFileEvent {
    /// The file's path inside the instance.
    path: String,
    /// A `FileState`, kept as its byte: the manager reads one it does not know (a
    /// newer server's) as pending rather than refuse the whole progress reply. Read it
    /// with `file_state()`.
    state: u8,
    /// Positive errno of a failed file (0 otherwise).
    errno: i32,
    message: String,
    bytes: u64,
});
impl StageFileEvent {
    /// The event of file `path` reaching `state`.
    pub fn new(path: String, state: FileState, errno: i32, message: String, bytes: u64) -> Self {
        StageFileEvent {
            path,
            state: state.into(),
            errno,
            message,
            bytes,
        }
    }

    /// The file's state; `None` for a byte this build does not know.
    pub fn file_state(&self) -> Option<FileState> {
        FileState::from_u8(self.state)
    }
}
wire_struct!(StageProgressReply {
    /// `stage_state`.
    state: u8,
    /// True once every file of the stage is known (`files_total` is final).
    enumerated: bool,
    files_total: u64,
    files_done: u64,
    files_failed: u64,
    bytes_total: u64,
    bytes_done: u64,
    /// File events after the request's cursor, in order (at most a few thousand).
    events: Vec<StageFileEvent>,
    /// The cursor to ask from next.
    cursor: u64,
    /// Why the stage failed (the first failure), empty otherwise.
    error: String,
});
wire_struct!(
    /// Stop a running stage: no new file is started; files in flight finish or fail.
    StageCancelReq { stage: u64 }
);
wire_struct!(
    /// Drop a finished stage's record on this server (the manager has recorded it).
    StageForgetReq { stage: u64 }
);
wire_struct!(
    /// Peer role: copy the stripes of one file that this server holds between its
    /// fragment and the PFS file `pfs_path`, as the ticket's uid; `pfs_ino` is the PFS file's inode
    /// number as the coordinator opened it (a file swapped since is refused). Replies
    /// once the bytes are checked; durability comes from `StageSyncReq`.
    StageStripesReq {
        ino: InodeNo,
        stripe_size: u32,
        stripe_width: u16,
        /// The file's size (the source's, as the coordinator opened it).
        size: u64,
        /// The byte range of the file this request covers: this server copies the
        /// parts of its stripes inside `[from, to)` (a large file goes in several
        /// requests, so a stage can be stopped between them and no call runs long).
        from: u64,
        to: u64,
        direction: StageDir,
        pfs_path: String,
        pfs_ino: u64,
        /// The stage's ticket, as the manager gave it to the coordinator.
        ticket: Vec<u8>,
    }
);
wire_struct!(
    /// Peer role: make what this server wrote for stages durable (stage-in: `syncfs` of
    /// the file system under its fragment, which holds stripes and metadata; stage-out:
    /// `syncfs` of each of this server's PFS roots). The coordinator sends it to every
    /// server of the instance before it counts a group of files complete (group
    /// commit).
    StageSyncReq { direction: StageDir, ticket: Vec<u8> }
);
/// What became of one file of a `StageFilesReq`.
pub mod stage_file_outcome {
    /// Copied and sized (durable after the next `StageSyncReq`); `bytes` copied.
    pub const DONE: u8 = 0;
    /// Failed; `errno` and `message` say why.
    pub const FAILED: u8 = 1;
    /// Not a file this server can stage alone (several stripes, its first stripe or
    /// attributes elsewhere, an entry already there that is not simple to replace):
    /// nothing was changed for it, and the coordinator copies it the long way.
    pub const ELSEWHERE: u8 = 2;
}
wire_struct!(
    /// One file of a `StageFilesReq`. Stage-in uses `parent`, `name`, `gid` and the
    /// stripe geometry (the coordinator applied the owner rules, the directory's setgid
    /// and its geometry; the mode is the source's); stage-out uses `ino`. `pfs_path` is the
    /// PFS source (in) or destination (out).
    StageFileSpec {
        parent: InodeNo,
        name: Vec<u8>,
        gid: u32,
        stripe_size: u32,
        stripe_width: u16,
        ino: InodeNo,
        pfs_path: String,
        /// The file's path inside the instance, for messages.
        shown: String,
    }
);
wire_struct!(StageFileResult {
    /// `stage_file_outcome`.
    outcome: u8,
    /// Positive errno of a failed file (0 otherwise).
    errno: i32,
    message: String,
    bytes: u64,
});
wire_struct!(
    /// Peer role: stage whole files that this server can do alone, as the ticket's uid: a file of
    /// one stripe whose entry (in) or attributes (out) and first stripe live here
    /// (placement.md: servers allocate inodes so that they do). Stage-in creates the
    /// entry and inode, fills the stripe from the PFS file, checks the byte count and
    /// that the source did not change, and sets size, atime and mtime; stage-out writes
    /// the PFS file (created or truncated, mode and times kept). One result per file,
    /// in order. Durability comes from `StageSyncReq`, as for `StageStripesReq`.
    StageFilesReq {
        direction: StageDir,
        /// The stage's ticket, as the manager gave it to the coordinator.
        ticket: Vec<u8>,
        files: Vec<StageFileSpec>,
    }
);
wire_struct!(StageFilesReply {
    results: Vec<StageFileResult>
});
wire_struct!(StageStripesReply {
    /// Bytes of the range this server's stripes cover (holes included).
    bytes: u64
});

macro_rules! calls {
    ($( $op:literal $req:ident -> $reply:ty, $idem:literal; )*) => {
        $(
            impl Call for $req {
                const OP: u16 = $op;
                const NAME: &'static str = stringify!($req);
                const IDEMPOTENT: bool = $idem;
                type Reply = $reply;
                fn decode_reply(body: Vec<u8>) -> Result<$reply, WireError> {
                    <$reply as Wire>::from_bytes(&body)
                }
            }
        )*

        /// A decoded request, as the server dispatches it.
        #[derive(Debug)]
        pub enum Request {
            $( $req($req), )*
            Write(WriteReq, crate::codec::BulkBody),
            Read(ReadReq),
            /// A `Read` whose data goes into the client's arena (`ReadArenaReq`,
            /// made by the wire layer): answered with `ReadArenaReply`.
            ReadInto(ReadReq, crate::arena::ArenaSlice),
        }

        impl Request {
            /// Decode the body of a request frame. Takes the body by value so that bulk
            /// data is handed on without a copy.
            pub fn decode(opcode: u16, body: Vec<u8>) -> Result<Request, WireError> {
                Request::decode_at(opcode, body, 0)
            }

            /// `decode` of the body `buf[at..]` (a received frame's buffer, whose
            /// leading bytes are padding: `Frame::into_parts`).
            pub fn decode_at(opcode: u16, buf: Vec<u8>, at: usize) -> Result<Request, WireError> {
                let body = buf.get(at..).ok_or(WireError::Invalid("body offset"))?;
                match opcode {
                    $( $op => Ok(Request::$req(<$req as Wire>::from_bytes(body)?)), )*
                    OP_WRITE => {
                        let mut d = Dec::new(body);
                        let req = WriteReq::dec(&mut d)?;
                        let start = at + d.position();
                        Ok(Request::Write(req, crate::codec::BulkBody::framed(buf, start)))
                    }
                    OP_READ => Ok(Request::Read(ReadReq::from_bytes(body)?)),
                    _ => Err(WireError::Invalid("unknown opcode")),
                }
            }

            pub fn name(&self) -> &'static str {
                match self {
                    $( Request::$req(_) => stringify!($req), )*
                    Request::Write(..) => "WriteReq",
                    Request::Read(_) => "ReadReq",
                    Request::ReadInto(..) => "ReadArenaReq",
                }
            }
        }

        /// Opcode → request name, for docs and logs.
        pub const OPCODES: &[(u16, &str)] = &[ $( ($op, stringify!($req)), )* (OP_WRITE, "WriteReq"), (OP_READ, "ReadReq") ];
    };
}

pub const OP_WRITE: u16 = 60;
pub const OP_READ: u16 = 61;

calls! {
    1 HelloReq -> HelloReply, true;
    2 ArenaOfferReq -> ArenaOfferReply, true;
    10 FragmentCreateReq -> Empty, true;
    11 FragmentDestroyReq -> Empty, true;
    12 FragmentListReq -> FragmentListReply, true;
    13 ServerStatusReq -> ServerStatusReply, true;
    20 LookupReq -> LookupReply, true;
    21 GetAttrReq -> AttrReply, true;
    22 SetAttrReq -> AttrReply, true;
    23 CreateReq -> AttrReply, false;
    24 RemoveEntryReq -> RemoveEntryReply, false;
    25 InsertEntryReq -> InsertEntryReply, false;
    26 RenameReq -> RenameReply, false;
    27 LinkCountReq -> AttrReply, false;
    28 TouchDirReq -> AttrReply, false;
    29 SealDirReq -> Empty, true;
    30 UnsealDirReq -> Empty, true;
    31 ReadDirReq -> ReadDirReply, true;
    // Open and Release change only the connection's own session, which the server
    // drops when the connection breaks: resending them on a new connection is safe.
    32 OpenReq -> AttrReply, true;
    33 ReleaseReq -> Empty, true;
    34 ExtendSizeReq -> ExtendSizeReply, true;
    35 SetXattrReq -> Empty, true;
    36 GetXattrReq -> BytesReply, true;
    37 ListXattrReq -> NamesReply, true;
    38 RemoveXattrReq -> Empty, false;
    39 StatFsReq -> StatFsReply, true;
    40 SyncMetaReq -> Empty, true;
    41 ReadLinkReq -> BytesReply, true;
    42 SetLayoutReq -> AttrReply, true;
    43 FragmentStatsReq -> FragmentStatsReply, true;
    62 TruncateDataReq -> Empty, true;
    63 SyncDataReq -> Empty, true;
    64 DeleteDataReq -> Empty, true;
    65 StripeInfoReq -> StripeInfoReply, true;
    66 StageStripesReq -> StageStripesReply, true;
    67 StageSyncReq -> Empty, true;
    // Resent after a lost connection, the files made the first time are found and
    // replaced: the same outcome.
    68 StageFilesReq -> StageFilesReply, true;
    70 StageStartReq -> Empty, true;
    71 StageProgressReq -> StageProgressReply, true;
    72 StageCancelReq -> Empty, true;
    73 StageForgetReq -> Empty, true;
    // Not resent after a lost connection: the session holding the locks is gone with it.
    90 LockReq -> LockReply, false;
    91 GetLkReq -> GetLkReply, true;
    92 UnlockOwnerReq -> Empty, true;
    93 LockRenewReq -> LockRenewReply, true;
    // A resend lands on a new session, whose epoch differs: nothing is returned twice.
    80 GrantReleaseReq -> Empty, true;
    100 FallocateDataReq -> Empty, true;
    101 SeekDataReq -> SeekDataReply, true;
    102 AllocReportReq -> Empty, true;
    // Answered by the wire layer as Write and ReadInto (serve.rs).
    69 WriteArenaReq -> WriteReply, true;
    103 ReadArenaReq -> ReadArenaReply, true;
    110 CacheConfigReq -> Empty, true;
    111 CacheResolveReq -> CacheResolveReply, true;
    112 CacheFlushReq -> Empty, true;
    113 CacheStatusReq -> CacheStatusReply, true;
    114 CacheDropReq -> CacheDropReply, true;
    115 CacheInodeReq -> CacheInodeReply, true;
    116 LdbalConfigReq -> Empty, true;
    117 CacheAccessReq -> CacheAccessReply, true;
    // Not resent: a resent removal or rename would answer ENOENT for its own success.
    118 CacheRemoveReq -> RemoveEntryReply, false;
    119 CacheRenameReq -> RenameReply, false;
    120 CacheTimesReq -> Empty, true;
    130 WatchReq -> Empty, true;
    131 NoticeDoneReq -> Empty, true;
    132 NoticeWaitReq -> Empty, true;
}

impl Call for WriteReq {
    const OP: u16 = OP_WRITE;
    const NAME: &'static str = "WriteReq";
    const IDEMPOTENT: bool = true;
    const ARENA_OP: Option<u16> = Some(<WriteArenaReq as Call>::OP);
    type Reply = WriteReply;
    fn decode_reply(body: Vec<u8>) -> Result<WriteReply, WireError> {
        WriteReply::from_bytes(&body)
    }
}

impl Call for ReadReq {
    const OP: u16 = OP_READ;
    const NAME: &'static str = "ReadReq";
    const IDEMPOTENT: bool = true;
    /// The data, straight from the frame.
    type Reply = Vec<u8>;
    fn decode_reply(body: Vec<u8>) -> Result<Vec<u8>, WireError> {
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_are_unique() {
        let mut ops: Vec<u16> = OPCODES.iter().map(|x| x.0).collect();
        ops.sort();
        let n = ops.len();
        ops.dedup();
        assert_eq!(ops.len(), n);
    }

    #[test]
    fn write_request_hands_bulk_on() {
        let req = WriteReq {
            ino: InodeNo(3),
            stripe: 2,
            offset: 7,
            sync: false,
            grant_epoch: 9,
            charged: 5,
        };
        let mut body = req.to_bytes();
        body.extend_from_slice(b"hello");
        match Request::decode(OP_WRITE, body).unwrap() {
            Request::Write(r, bulk) => {
                assert_eq!(r, req);
                assert_eq!(bulk.data(), b"hello");
            }
            other => panic!("decoded as {other:?}"),
        }
    }

    #[test]
    fn wire_enums_keep_their_bytes() {
        assert_eq!(Role::Client.to_bytes(), [1]);
        assert_eq!(Role::Peer.to_bytes(), [2]);
        assert_eq!(Role::Admin.to_bytes(), [3]);
        assert_eq!(StageDir::In.to_bytes(), [0]);
        assert_eq!(StageDir::Out.to_bytes(), [1]);
        assert_eq!(FileState::Pending.to_bytes(), [0]);
        assert_eq!(FileState::Complete.to_bytes(), [1]);
        assert_eq!(FileState::Failed.to_bytes(), [2]);
        // Every other byte is refused by the checked decode.
        for b in 0..=u8::MAX {
            let known = |r: Result<u8, WireError>| r.ok();
            let dir = StageDir::from_bytes(&[b]).map(u8::from);
            assert_eq!(known(dir), (b <= 1).then_some(b));
            let role = Role::from_bytes(&[b]).map(u8::from);
            assert_eq!(known(role), (1..=3).contains(&b).then_some(b));
            let state = FileState::from_bytes(&[b]).map(u8::from);
            assert_eq!(known(state), (b <= 2).then_some(b));
        }
    }

    #[test]
    fn an_unknown_direction_does_not_decode_an_unknown_role_or_file_state_does() {
        // A stage request with a direction no build sends is undecodable (EPROTO).
        let mut body = StageSyncReq {
            direction: StageDir::Out,
            ticket: Vec::new(),
        }
        .to_bytes();
        body[0] = 2;
        assert_eq!(
            Request::decode(StageSyncReq::OP, body).unwrap_err(),
            WireError::Invalid("stage direction")
        );
        // The server refuses an unknown role itself (EINVAL), so the hello decodes.
        let mut hello = HelloReq::new(Role::Client, 5, b"c".to_vec(), "t");
        hello.role = 77;
        let back = HelloReq::from_bytes(&hello.to_bytes()).unwrap();
        assert_eq!((back.role, back.role()), (77, None));
        // The manager reads a file state it does not know as pending.
        let mut ev = StageFileEvent::new("/a".into(), FileState::Failed, 5, "m".into(), 0);
        assert_eq!(ev.file_state(), Some(FileState::Failed));
        ev.state = 9;
        let back = StageFileEvent::from_bytes(&ev.to_bytes()).unwrap();
        assert_eq!(back.file_state(), None);
    }

    #[test]
    fn a_hello_names_its_mount_or_ends_before_it() {
        let hello = HelloReq::new(Role::Client, 5, b"c".to_vec(), "t").for_mount(0xfeed);
        let bytes = hello.to_bytes();
        assert_eq!(HelloReq::from_bytes(&bytes).unwrap(), hello);
        // Without the last field: no mount (tools and older clients).
        let short = HelloReq::from_bytes(&bytes[..bytes.len() - 8]).unwrap();
        assert_eq!(short.mount, 0);
        assert_eq!(short.peer_name, "t");
        // A part of one is not a mount.
        assert!(HelloReq::from_bytes(&bytes[..bytes.len() - 3]).is_err());
    }

    #[test]
    fn unknown_opcode_and_truncation_are_errors() {
        assert!(Request::decode(9999, vec![]).is_err());
        let body = LookupReq {
            parent: InodeNo(1),
            name: b"abc".to_vec(),
        }
        .to_bytes();
        assert!(Request::decode(LookupReq::OP, body[..body.len() - 1].to_vec()).is_err());
        let mut long = body.clone();
        long.push(0);
        assert_eq!(
            Request::decode(LookupReq::OP, long).unwrap_err(),
            WireError::Trailing
        );
    }
}
