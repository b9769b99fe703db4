//! The FUSE operations. Each maps a kernel request onto client stubs (instance.rs).
//!
//! Permissions: the mount uses `default_permissions`, so the kernel checks every access
//! against the attributes we report; we create files as the calling uid/gid (and the
//! directory's gid under setgid), so ownership is POSIX. Coherency is close-to-open:
//! open fetches fresh attributes from the inode's home and drops the kernel's cached
//! pages and attributes when another client changed the file; close and fsync push
//! this client's writes to the servers before they return.
//!
//! This file holds the file system's state and the `Filesystem` impl, whose methods are
//! one-line adapters: kernel numbers in (`ino`), a `do_*` method returning `R<T>`, a
//! reply helper out (fs/reply.rs). It reads as the table of contents; the `do_*` bodies
//! live by family:
//! * `session`  — INIT, statfs, the flush at unmount.
//! * `lookup`   — LOOKUP, GETATTR, the name checks.
//! * `attrs`    — SETATTR.
//! * `xattrs`   — extended attributes, the virtual `user.spillway.*` ones, ACLs.
//! * `dirs`     — mknod, mkdir, symlink, link, unlink, rmdir, readdir(plus); the
//!   listings read ahead of a walk are dirahead.rs's.
//! * `rename`   — RENAME (also across servers).
//! * `files`    — create, open, flush, fsync, release.
//! * `existing` — an O_CREAT open of a name another client made meanwhile.
//! * `io`       — READ and WRITE.
//! * `sparse`   — fallocate and SEEK_DATA/SEEK_HOLE.

use crate::coherence::Coherence;
use crate::control::Control;
use crate::dirahead::DirAhead;
use crate::gate::Gate;
use crate::grants::Grants;
use crate::inval::invalidator;
use crate::locks::Locks;
use crate::nodes::Tables;
use crate::notices::Listeners;
use crate::root::MountRoot;
use crate::writeback::Invalidate;
use attrs::AttrChanges;
use fuser::{
    FileHandle, Filesystem, FopenFlags, INodeNo, IoctlFlags, KernelConfig, LockOwner, Notifier,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use lookup::gone;
use spillway_stubs::Instance;
use spillway_types::{Errno, InodeNo, Tunables};
use spillway_wire::messages::{setattr, SetAttrReq};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

mod attrs;
mod dirs;
mod existing;
mod files;
mod io;
mod lookup;
mod rename;
mod reply;
mod session;
mod sparse;
mod xattrs;

pub struct SpillwayFs {
    inst: Arc<Instance>,
    t: Arc<Tables>,
    /// What the kernel caches of each file against other clients' changes.
    coherence: Arc<Coherence>,
    /// The homes' notices of other mounts' changes to files open here (notices.rs).
    listeners: Arc<Listeners>,
    tun: Tunables,
    notifier: Arc<OnceLock<Notifier>>,
    origin: std::path::PathBuf,
    /// libdatawarp's control channel (ioctl SPILLWAY_IOC_CALL).
    control: Arc<Control>,
    /// The directory shown as the mount's root: every inode number crossing the FUSE
    /// boundary goes through it (`ino` in, `fuse_ino` out).
    root: MountRoot,
    /// fcntl, OFD and flock locks, held at each inode's home (locks.rs).
    locks: Arc<Locks>,
    /// The kernel enforces POSIX ACLs (it granted FUSE_POSIX_ACL and FUSE_DONT_MASK):
    /// the `system.posix_acl_*` xattrs are stored and inherited, and the umask is ours
    /// to apply. Otherwise they are refused with EOPNOTSUPP rather than stored and not
    /// enforced.
    acl: bool,
    /// The kernel leaves clearing setuid and setgid on write, truncate and chown to us
    /// (it granted FUSE_HANDLE_KILLPRIV_V2; fs/session.rs).
    killpriv: bool,
    /// Opens that write a file from the start go around the page cache (the
    /// `direct_writes` tunable, and the kernel allows shared mappings of them).
    direct_writes: bool,
    /// Space the servers promised this client (write-behind needs it; grants.rs).
    grants: Arc<Grants>,
    /// Drops the kernel's cache of a file whose written-behind bytes were lost.
    lost: Invalidate,
    /// Subdirectories' listings read ahead of a walk (dirahead.rs).
    ahead: Arc<DirAhead>,
    /// A cache instance: the protection of the PFS directories above the cached one,
    /// kept at the mount root (gate.rs).
    gate: Option<Gate>,
}

/// Read-only virtual attribute describing a file's placement (for `spillway stripes`).
/// It is answered by the client and never stored or listed.
pub const LAYOUT_XATTR: &[u8] = b"user.spillway.layout";
/// Stripe geometry of a file (settable until it holds data) or of a directory (the
/// default for new files in it), as decimal text. Answered by the client, not listed.
pub const STRIPE_SIZE_XATTR: &[u8] = b"user.spillway.stripe_size";
/// Set (to anything) on a file of a cache instance: returns once the file's changes,
/// this client's written-behind ones first, are on the PFS (`dw_wait_sync_complete`,
/// docs/cache.md). EOPNOTSUPP on scratch. Never stored or listed.
pub const SYNC_XATTR: &[u8] = b"user.spillway.sync";
pub const STRIPE_WIDTH_XATTR: &[u8] = b"user.spillway.stripe_width";

type R<T> = Result<T, Errno>;

impl SpillwayFs {
    pub fn new(
        inst: Arc<Instance>,
        tun: Tunables,
        notifier: Arc<OnceLock<Notifier>>,
        origin: std::path::PathBuf,
        control: Arc<Control>,
        root: MountRoot,
    ) -> SpillwayFs {
        let lister = inst.clone();
        let page = tun.readdir_page;
        let ahead = DirAhead::start(
            Box::new(move |d| lister.read_dir(d, page, true)),
            tun.entry_ttl.min(tun.attr_ttl),
            tun.readdir_ahead,
        );
        let direct_writes = tun.direct_writes;
        let gate = inst
            .desc
            .cache
            .then(|| Gate::new(inst.clone(), tun.attr_ttl));
        let t = Arc::new(Tables::default());
        let coherence = Arc::new(Coherence::new(
            t.clone(),
            inst.clone(),
            notifier.clone(),
            root.clone(),
        ));
        SpillwayFs {
            listeners: Listeners::new(inst.clone(), coherence.clone()),
            gate,
            ahead,
            grants: Grants::new(inst.clone(), &tun),
            locks: Locks::new(inst.clone(), tun.lock_waiters_per_uid, coherence.clone()),
            lost: invalidator(notifier.clone(), root.clone()),
            inst,
            t,
            coherence,
            tun,
            notifier,
            origin,
            control,
            root,
            acl: false,
            killpriv: false,
            direct_writes,
        }
    }

    /// An operation that changed (or may have changed) names, attributes or data
    /// through this mount has its outcome: no directory listing read ahead before now
    /// is served (dirahead.rs). Called after the change, whatever its outcome.
    fn changing<T>(&self, r: T) -> T {
        self.ahead.changed();
        r
    }

    /// The instance's inode for a node number the kernel sent (root.rs).
    fn ino(&self, i: INodeNo) -> InodeNo {
        self.root.inst(i)
    }

    /// The kernel's node number for an instance inode (root.rs).
    fn fuse_ino(&self, i: InodeNo) -> INodeNo {
        self.root.fuse(i)
    }

    /// A call on the mount root of a cache instance: Ok only for a caller who can
    /// reach the cached directory on the PFS (gate.rs).
    fn gate_root(&self, req: &Request, i: INodeNo) -> R<()> {
        match &self.gate {
            Some(g) if i == INodeNo::ROOT => g.check(req.uid(), req.gid(), req.pid()),
            _ => Ok(()),
        }
    }

    /// Who a cache instance's removals and renames are made as on the PFS (the
    /// caller of the request); `None` for scratch, whose servers keep the names.
    fn ns_caller(&self, req: &Request) -> Option<spillway_wire::messages::Caller> {
        self.gate.as_ref()?;
        Some(crate::caller::Caller::of(req.uid(), req.gid(), req.pid()).wire())
    }

    /// How long the kernel may keep `a`: the mount root of a cache instance not at
    /// all, so that each of its permission checks asks us (gate.rs).
    fn attr_ttl_of(&self, a: &spillway_types::Attr, ttl: Duration) -> Duration {
        if self.gate.is_some() && self.fuse_ino(a.ino) == INodeNo::ROOT {
            Duration::ZERO
        } else {
            ttl
        }
    }
}

impl Filesystem for SpillwayFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.do_init(config)
    }

    fn destroy(&mut self) {
        self.locks.stop();
        self.ahead.stop();
        self.flush_all();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.reply_lookup(reply, self.do_lookup(self.ino(parent), name));
    }

    fn forget(&self, _req: &Request, i: INodeNo, nlookup: u64) {
        self.t.forget(self.ino(i), nlookup);
    }

    fn getattr(&self, req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let r = self
            .gate_root(req, i)
            .and_then(|()| self.do_getattr(self.ino(i)));
        self.reply_getattr(reply, r);
    }

    fn setattr(
        &self,
        req: &Request,
        i: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let changes = AttrChanges {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            ctime,
        };
        let mut sa = changes.request(self.ino(i));
        if self.killpriv {
            sa.valid |= kill_on_setattr(&sa, req.uid());
        }
        let r = self.changing(self.do_setattr(self.ino(i), sa));
        self.reply_attr(reply, r.map_err(gone));
    }

    fn readlink(&self, _req: &Request, i: INodeNo, reply: ReplyData) {
        Self::data(reply, self.inst.read_link(self.ino(i)));
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let r = self.changing(self.do_mknod(req, self.ino(parent), name, mode, umask, rdev));
        self.reply_entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.changing(self.do_mkdir(req, self.ino(parent), name, mode, umask));
        self.reply_entry(reply, r);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.changing(self.do_unlink(self.ns_caller(req), self.ino(parent), name));
        self.t.forget_entry(self.ino(parent), name.as_bytes());
        Self::empty(reply, r);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.changing(self.do_rmdir(self.ns_caller(req), self.ino(parent), name));
        self.t.forget_entry(self.ino(parent), name.as_bytes());
        Self::empty(reply, r);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self.changing(self.do_symlink(req, self.ino(parent), link_name, target));
        self.reply_entry(reply, r);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (op, np) = (self.ino(parent), self.ino(newparent));
        let r =
            self.changing(self.do_rename(self.ns_caller(req), (op, name), (np, newname), flags));
        Self::empty(reply, r);
    }

    fn link(
        &self,
        _req: &Request,
        i: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = self.changing(self.do_link(self.ino(i), self.ino(newparent), newname));
        self.reply_entry(reply, r);
    }

    fn open(&self, _req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = self.open_file(self.ino(i), flags.0 as u32, None);
        // An open for writing may truncate; one for reading changes nothing.
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            self.ahead.changed();
        }
        Self::opened(reply, r);
    }

    fn read(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        Self::data(reply, self.do_read(self.ino(i), offset, size));
    }

    fn write(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let i = self.ino(i);
        let r = if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            self.kill_privs(i)
                .and_then(|()| self.do_write(i, offset, data))
        } else {
            self.do_write(i, offset, data)
        };
        let r = self.changing(r);
        Self::written(reply, r);
    }

    fn flush(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let r = self.changing(self.do_flush(self.ino(i), lock_owner.0));
        Self::empty(reply, r);
    }

    fn release(
        &self,
        _req: &Request,
        i: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // The open file description's flocks and OFD locks (locks.rs), after this
        // client's writes of the file are on the servers (what a lock protected is
        // there before another node can take it).
        let ino = self.ino(i);
        if let Err(e) = self.coherence.push(ino) {
            tracing::warn!(%ino, "pushing writes before dropping locks at release: {e}");
        }
        self.locks.release(ino, fh.0, lock_owner.map(|o| o.0));
        let r = self.changing(self.do_release(fh.0));
        Self::empty(reply, r);
    }

    fn getlk(
        &self,
        req: &Request,
        i: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let a = self.lock_args(req, i, fh, lock_owner, (start, end), typ, pid);
        self.locks.getlk(a, reply);
    }

    fn setlk(
        &self,
        req: &Request,
        i: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let a = self.lock_args(req, i, fh, lock_owner, (start, end), typ, pid);
        self.locks.setlk(a, sleep, reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self.changing(self.do_fsync(self.ino(i)));
        Self::empty(reply, r);
    }

    fn opendir(&self, _req: &Request, _i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(self.do_opendir()), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        i: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.do_readdir(i, fh.0, offset, &mut reply);
        Self::listed(reply, r);
    }

    fn readdirplus(
        &self,
        _req: &Request,
        i: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = self.do_readdirplus(i, fh.0, offset, &mut reply);
        Self::listed_plus(reply, r);
    }

    fn releasedir(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.t.dirs().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty(reply, self.inst.sync_meta(self.ino(i)));
    }

    fn statfs(&self, req: &Request, i: INodeNo, reply: ReplyStatfs) {
        Self::reply_statfs(
            reply,
            self.gate_root(req, i).and_then(|()| self.do_statfs()),
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        i: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let r = self.changing(self.do_setxattr(req, self.ino(i), name.as_bytes(), value, flags));
        Self::empty(reply, r);
    }

    fn getxattr(&self, req: &Request, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let r = self
            .gate_root(req, i)
            .and_then(|()| self.do_getxattr(self.ino(i), name.as_bytes()));
        Self::xattr_reply(reply, size, r);
    }

    fn listxattr(&self, req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        let r = self
            .gate_root(req, i)
            .and_then(|()| self.do_listxattr(self.ino(i)));
        Self::xattr_reply(reply, size, r);
    }

    fn removexattr(&self, _req: &Request, i: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.changing(self.do_removexattr(self.ino(i), name.as_bytes()));
        Self::empty(reply, r);
    }

    /// libdatawarp's control channel (control.rs): the caller's uid is the kernel's.
    fn ioctl(
        &self,
        req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        // A stage it starts changes names as another client's would; counted anyway.
        self.ahead.changed();
        self.control
            .ioctl(req.uid(), self.ino(i), cmd, in_data, out_size, reply);
    }

    fn fallocate(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let r = self.changing(self.do_fallocate(self.ino(i), offset, length, mode));
        Self::empty(reply, r.map(|_| ()));
    }

    fn lseek(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        Self::offset(reply, self.do_lseek(self.ino(i), offset, whence));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self.changing(self.do_create(req, self.ino(parent), name, mode, umask, flags));
        self.reply_create(reply, r);
    }
}

/// Attribute and entry lifetimes as the kernel wants them.
pub fn ttl(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// `setattr::KILL_SUIDGID` when a SETATTR must clear setuid and setgid, the kernel
/// leaving that to us (FUSE_HANDLE_KILLPRIV_V2): a chown of a non-directory always (the
/// home leaves directories alone), a truncate by a caller without CAP_FSETID; else 0.
/// The kernel's `FATTR_KILL_SUIDGID`, which says which, does not reach us through
/// fuser, so a caller other than root counts as without CAP_FSETID (a root process
/// that dropped it keeps the bits through a truncate).
fn kill_on_setattr(req: &SetAttrReq, caller: u32) -> u32 {
    let chown = req.valid & (setattr::UID | setattr::GID) != 0;
    let truncate = req.valid & setattr::SIZE != 0 && caller != 0;
    if chown || truncate {
        setattr::KILL_SUIDGID
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::kill_on_setattr;
    use spillway_types::InodeNo;
    use spillway_wire::messages::{setattr, SetAttrReq};

    fn req(valid: u32) -> SetAttrReq {
        SetAttrReq {
            valid,
            ..SetAttrReq::of(InodeNo(7))
        }
    }

    /// With FUSE_HANDLE_KILLPRIV_V2 a chown clears the bits for anyone, a truncate for
    /// callers other than root; a chmod or a time change never.
    #[test]
    fn chown_always_and_truncate_by_others_clear_setuid() {
        let kill = setattr::KILL_SUIDGID;
        assert_eq!(kill_on_setattr(&req(setattr::UID), 0), kill);
        assert_eq!(kill_on_setattr(&req(setattr::GID), 1000), kill);
        assert_eq!(kill_on_setattr(&req(setattr::SIZE), 1000), kill);
        assert_eq!(kill_on_setattr(&req(setattr::SIZE), 0), 0);
        assert_eq!(kill_on_setattr(&req(setattr::MODE), 1000), 0);
        assert_eq!(kill_on_setattr(&req(setattr::MTIME_NOW), 1000), 0);
    }
}
