//! The FUSE operations. Each maps a kernel request onto client stubs (instance.rs).
//!
//! Permissions: the mount uses `default_permissions`, so the kernel checks every access
//! against the attributes we report; we create files as the calling uid/gid (and the
//! directory's gid under setgid), so ownership is POSIX. Coherency is close-to-open:
//! open fetches fresh attributes from the inode's home and drops the kernel's cached
//! pages and attributes when another client changed the file; close and fsync push
//! this client's writes to the servers before they return.

use crate::acl;
use crate::control::Control;
use crate::grants::Grants;
use crate::inval::invalidator;
use crate::locks::{LockArgs, Locks};
use crate::nodes::{Node, OpenFile, Tables};
use crate::root::MountRoot;
use crate::writeback::{Invalidate, WriteBack};
use fuser::{
    FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use spillway_stubs::Instance;
use spillway_types::acl::{Acl, ACCESS_XATTR, DEFAULT_XATTR};
use spillway_types::tunables::{MAX_NAME_LEN, MAX_SYMLINK_LEN};
use spillway_types::{Attr, Errno, FileKind, InodeNo, Timespec, Tunables};
use spillway_wire::messages::{
    rename_flags, setattr, want, xattr_flags, CreateReq, EntryRef, RenameReq, SetAttrReq,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

mod existing;

pub struct SpillwayFs {
    inst: Arc<Instance>,
    t: Tables,
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
    /// Space the servers promised this client (write-behind needs it; grants.rs).
    grants: Arc<Grants>,
    /// Drops the kernel's cache of a file whose written-behind bytes were lost.
    lost: Invalidate,
}

/// Asked by the kernel before every write; cached per inode (see `Node::capability`).
const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// Read-only virtual attribute describing a file's placement (for `spillway stripes`).
/// It is answered by the client and never stored or listed.
pub const LAYOUT_XATTR: &[u8] = b"user.spillway.layout";
/// Stripe geometry of a file (settable until it holds data) or of a directory (the
/// default for new files in it), as decimal text. Answered by the client, not listed.
pub const STRIPE_SIZE_XATTR: &[u8] = b"user.spillway.stripe_size";
pub const STRIPE_WIDTH_XATTR: &[u8] = b"user.spillway.stripe_width";

type R<T> = Result<T, Errno>;

mod sparse;

fn fe(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e.0)
}

/// An inode the kernel reaches through a cached name may have been removed by another
/// client (unlink, rename over it). ESTALE makes the VFS walk the path again with a fresh
/// lookup (LOOKUP_REVAL) instead of failing with ENOENT: close-to-open across clients.
fn gone(e: Errno) -> Errno {
    if e == Errno::ENOENT {
        Errno::ESTALE
    } else {
        e
    }
}

fn check_name(name: &OsStr) -> R<&[u8]> {
    let b = name.as_bytes();
    if b.len() > MAX_NAME_LEN {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(b)
}

fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

fn time_set(t: Option<TimeOrNow>, bit: u32, now_bit: u32, valid: &mut u32) -> Timespec {
    match t {
        None => Timespec::default(),
        Some(TimeOrNow::Now) => {
            *valid |= now_bit;
            Timespec::default()
        }
        Some(TimeOrNow::SpecificTime(st)) => {
            *valid |= bit;
            Timespec::from_system_time(st)
        }
    }
}

impl SpillwayFs {
    pub fn new(
        inst: Arc<Instance>,
        tun: Tunables,
        notifier: Arc<OnceLock<Notifier>>,
        origin: std::path::PathBuf,
        control: Arc<Control>,
        root: MountRoot,
    ) -> SpillwayFs {
        SpillwayFs {
            grants: Grants::new(inst.clone(), &tun),
            locks: Locks::new(inst.clone()),
            lost: invalidator(notifier.clone(), root.clone()),
            inst,
            t: Tables::default(),
            tun,
            notifier,
            origin,
            control,
            root,
            acl: false,
        }
    }

    /// The instance's inode for a node number the kernel sent (root.rs).
    fn ino(&self, i: INodeNo) -> InodeNo {
        self.root.inst(i)
    }

    /// The kernel's node number for an instance inode (root.rs).
    fn fuse_ino(&self, i: InodeNo) -> INodeNo {
        self.root.fuse(i)
    }

    /// A lock request's arguments for locks.rs.
    #[allow(clippy::too_many_arguments)]
    fn lock_args(
        &self,
        req: &Request,
        i: INodeNo,
        fh: FileHandle,
        owner: LockOwner,
        (start, end): (u64, u64),
        typ: i32,
        pid: u32,
    ) -> LockArgs {
        let (ino, fh, owner, tid) = (self.ino(i), fh.0, owner.0, req.pid());
        LockArgs {
            ino,
            fh,
            owner,
            start,
            end,
            typ,
            pid,
            tid,
        }
    }

    /// Set one stripe parameter (size or width) of a file or directory.
    fn set_stripe_param(&self, i: InodeNo, name: &[u8], value: &[u8]) -> R<()> {
        let v: u64 = std::str::from_utf8(value)
            .ok()
            .and_then(|s| s.trim().trim_end_matches('\0').parse().ok())
            .ok_or(Errno::EINVAL)?;
        // Data still buffered here counts as data: it must reach the servers first, so
        // the home can refuse a change to a file that is no longer empty.
        if let Some(wb) = self.t.writeback(i) {
            self.note_flushed(wb.flush()?);
        }
        let cur = self.inst.getattr(i)?;
        let (size, width) = if name == STRIPE_SIZE_XATTR {
            (
                u32::try_from(v).map_err(|_| Errno::EINVAL)?,
                cur.stripe_width,
            )
        } else {
            (
                cur.stripe_size,
                u16::try_from(v).map_err(|_| Errno::EINVAL)?,
            )
        };
        let attr = self.inst.set_layout(i, size, width)?;
        if let Some(wb) = self.t.writeback(i) {
            wb.relayout(&attr);
        }
        self.t.remember(&attr, false);
        Ok(())
    }

    /// Set a POSIX ACL (the kernel checked the caller owns the inode, or is root, and
    /// the format); the home updates the mode with an access ACL.
    fn set_acl(&self, req: &Request, i: InodeNo, name: &[u8], value: &[u8], flags: u32) -> R<()> {
        let mut flags = flags;
        if name == ACCESS_XATTR {
            let gid = self.dir_attr(i)?.gid;
            if acl::kill_sgid(req.pid(), req.uid(), req.gid(), gid) {
                flags |= xattr_flags::ACL_KILL_SGID;
            }
        }
        // The mode (access ACL) and ctime change at the home.
        self.t.stale(i);
        acl::forget_access(&self.t, i);
        let r = self.inst.set_xattr(i, name, value, flags);
        if name == DEFAULT_XATTR {
            // As the home stores it (canonical form), or ask it next time.
            match (&r, Acl::parse(value)) {
                (Ok(()), Ok(a)) => acl::remember_default(&self.t, i, Some(a.to_bytes())),
                _ => acl::forget_default(&self.t, i),
            }
        }
        r
    }

    /// Attributes of nothing, for negative entries (only the node id 0 matters).
    fn negative_template(&self) -> Attr {
        Attr {
            ino: InodeNo(0),
            kind: FileKind::Regular,
            mode: 0,
            nlink: 0,
            uid: 0,
            gid: 0,
            rdev: 0,
            size: 0,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            stripe_size: 4096,
            stripe_width: 1,
            blocks: 0,
        }
    }

    /// `security.capability` of an inode, from the per-node cache while it is fresh.
    fn capability(&self, i: InodeNo) -> R<Vec<u8>> {
        let fresh = |t: &std::time::Instant| t.elapsed() < self.tun.attr_ttl;
        if let Some((t, v)) = self.t.nodes().get(&i).and_then(|n| n.capability.clone()) {
            if fresh(&t) {
                return v.ok_or(Errno::ENODATA);
            }
        }
        let r = self.inst.get_xattr(i, CAPABILITY_XATTR);
        let cached = match &r {
            Ok(v) => Some(Some(v.clone())),
            Err(e) if *e == Errno::ENODATA => Some(None),
            Err(_) => None,
        };
        if let Some(c) = cached {
            if let Some(n) = self.t.nodes().get_mut(&i) {
                n.capability = Some((std::time::Instant::now(), c));
            }
        }
        r
    }

    fn forget_capability(&self, i: InodeNo) {
        if let Some(n) = self.t.nodes().get_mut(&i) {
            n.capability = None;
        }
    }

    fn layout_json(&self, i: InodeNo) -> R<Vec<u8>> {
        let attr = self.inst.getattr(i)?;
        let l = self.inst.layout(&attr);
        let doc = serde_json::json!({
            "instance": self.inst.desc.instance,
            "ino": i.0,
            "size": attr.size,
            "stripe_size": l.stripe_size,
            "stripe_width": l.width,
            "start": l.start,
            "servers": self.inst.desc.servers,
            "descriptor": self.origin,
        });
        Ok(doc.to_string().into_bytes())
    }

    /// Attributes as the kernel should see them: a file this client is writing is at
    /// least as long as what it wrote.
    fn fuse_attr(&self, a: &Attr) -> FileAttr {
        let size = match self.t.writeback(a.ino) {
            Some(wb) => a.size.max(wb.end()),
            None => a.size,
        };
        FileAttr {
            ino: self.fuse_ino(a.ino),
            size,
            // Regular files: what their stripes occupy, as the servers reported it to
            // the home (fs/sparse.rs); other kinds hold no stripes.
            blocks: if a.kind == FileKind::Regular {
                a.blocks
            } else {
                size.div_ceil(512)
            },
            atime: a.atime.to_system_time(),
            mtime: a.mtime.to_system_time(),
            ctime: a.ctime.to_system_time(),
            crtime: a.mtime.to_system_time(),
            kind: file_type(a.kind),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            blksize: a.stripe_size.min(1 << 20),
            flags: 0,
        }
    }

    fn reply_entry(&self, reply: ReplyEntry, r: R<Attr>) {
        match r {
            Ok(a) => {
                self.t.remember(&a, true);
                reply.entry(&self.tun.entry_ttl, &self.fuse_attr(&a), Generation(0));
            }
            Err(e) => reply.error(fe(e)),
        }
    }

    fn reply_attr(&self, reply: ReplyAttr, r: R<Attr>) {
        match r {
            Ok(a) => {
                self.t.remember(&a, false);
                reply.attr(&self.tun.attr_ttl, &self.fuse_attr(&a));
            }
            Err(e) => reply.error(fe(e)),
        }
    }

    fn data(reply: ReplyData, r: R<Vec<u8>>) {
        match r {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(fe(e)),
        }
    }

    fn empty(reply: ReplyEmpty, r: R<()>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fe(e)),
        }
    }

    fn dir_attr(&self, dir: InodeNo) -> R<Attr> {
        match self.t.attr(dir) {
            Some(a) => Ok(a),
            None => self.inst.getattr(dir),
        }
    }

    /// Tell a directory's home that an entry changed (mtime/ctime, subdirectory count).
    /// A failure is logged, not returned: the entry change itself already succeeded.
    fn touch_dir(&self, dir: InodeNo, nlink_delta: i32) {
        self.touched(dir, self.inst.touch_dir(dir, nlink_delta));
    }

    /// The outcome of a TouchDir: the directory's new attributes, or (a failure is
    /// logged, not returned: the entry change itself already succeeded) not knowing
    /// them any more.
    fn touched(&self, dir: InodeNo, r: R<Attr>) {
        match r {
            Ok(a) => self.t.remember(&a, false),
            Err(e) => {
                tracing::debug!(%dir, "touching directory failed: {e}");
                self.t.stale(dir);
            }
        }
    }

    /// Create an inode of any kind under `parent`, owned by the caller, with the ACLs
    /// it inherits from `parent` (or else `umask` applied).
    #[allow(clippy::too_many_arguments)]
    fn make(
        &self,
        req: &Request,
        parent: InodeNo,
        name: &OsStr,
        kind: FileKind,
        mode: u32,
        rdev: u32,
        target: &[u8],
        open: bool,
        umask: u32,
    ) -> R<Attr> {
        let name = check_name(name)?;
        let pattr = self.dir_attr(parent)?;
        let mut gid = req.gid();
        let mut mode = mode & 0o7777;
        if pattr.mode & libc::S_ISGID != 0 {
            gid = pattr.gid;
            if kind == FileKind::Directory {
                mode |= libc::S_ISGID;
            }
        }
        // Without FUSE_POSIX_ACL the kernel applied the umask itself.
        let new = if self.acl {
            let ttl = self.tun.attr_ttl;
            acl::for_create(&self.inst, &self.t, ttl, parent, kind, mode, umask)?
        } else {
            acl::NewInode {
                mode,
                xattrs: Vec::new(),
                default: None,
            }
        };
        let create = CreateReq {
            parent,
            name: name.to_vec(),
            kind,
            mode: new.mode,
            uid: req.uid(),
            gid,
            rdev,
            target: target.to_vec(),
            // New files take their directory's stripe setting; subdirectories
            // (and other kinds) take the instance's default.
            stripe_size: if kind == FileKind::Regular {
                pattr.stripe_size
            } else {
                0
            },
            stripe_width: if kind == FileKind::Regular {
                pattr.stripe_width
            } else {
                0
            },
            open,
            xattrs: new.xattrs,
        };
        if kind == FileKind::Directory {
            // The parent's link count may only change if the mkdir happened.
            let attr = self.inst.create(create)?;
            self.touch_dir(parent, 1);
            // Its default ACL is known: creates in it need not ask its home.
            self.t.remember(&attr, false);
            acl::remember_default(&self.t, attr.ino, new.default);
            return Ok(attr);
        }
        // The kernel asks only after finding no such name, so the create almost always
        // succeeds: update the parent's times in parallel with it.
        let touch = self.inst.start_touch_dir(parent, 0);
        let attr = self.inst.create(create);
        self.touched(parent, touch.and_then(|t| t.wait()).map(|r| r.attr));
        attr
    }

    /// Open inode `i` in this client; `opened` carries the attributes when the server
    /// already counted the open (a create that opened).
    fn open_file(&self, i: InodeNo, flags: u32, opened: Option<Attr>) -> R<(u64, FopenFlags)> {
        let attr = match opened {
            Some(a) => a,
            None => self.inst.open(i, flags).map_err(gone)?,
        };
        let stamp = (attr.size, attr.mtime);
        let (keep, stale) = {
            let mut nodes = self.t.nodes();
            let node = nodes.entry(i).or_insert_with(|| Node::new(&attr));
            let dirty = node.wb.as_ref().is_some_and(|w| w.is_dirty());
            let stale = !dirty && (node.attr.size != attr.size || node.attr.mtime != attr.mtime);
            let keep = dirty || node.cached == Some(stamp);
            node.cached = Some(stamp);
            node.attr = attr.clone();
            node.opens += 1;
            match &node.wb {
                None => {
                    node.wb = Some(Arc::new(WriteBack::new(
                        self.inst.clone(),
                        &attr,
                        &self.tun,
                        self.grants.clone(),
                        self.lost.clone(),
                    )))
                }
                Some(wb) if stale => wb.reset_end(attr.size),
                Some(_) => {}
            }
            (keep, stale)
        };
        if stale {
            // Another client changed the file: make the kernel fetch size and times
            // again (its page cache goes too, as we do not answer KEEP_CACHE).
            if let Some(n) = self.notifier.get() {
                let _ = n.inval_inode(self.fuse_ino(i), -1, 0);
            }
        }
        let fh = self.t.new_fh();
        self.t.files().insert(fh, OpenFile { ino: i });
        Ok((
            fh,
            if keep {
                FopenFlags::FOPEN_KEEP_CACHE
            } else {
                FopenFlags::empty()
            },
        ))
    }

    /// After a flush told the home the new size, remember what the kernel now caches.
    fn note_flushed(&self, attr: Option<Attr>) {
        if let Some(a) = attr {
            let mut nodes = self.t.nodes();
            if let Some(n) = nodes.get_mut(&a.ino) {
                n.cached = Some((a.size, a.mtime));
                n.attr = a;
                n.fetched = Some(std::time::Instant::now());
            }
        }
    }

    fn do_setattr(&self, i: InodeNo, mut req: SetAttrReq) -> R<Attr> {
        let wb = self.t.writeback(i);
        if req.valid & setattr::SIZE != 0 {
            if let Some(wb) = &wb {
                self.note_flushed(wb.flush()?);
            }
        }
        req.ino = i;
        let attr = self.inst.setattr(req.clone())?;
        if req.valid & setattr::SIZE != 0 {
            if let Some(wb) = &wb {
                wb.truncated(attr.size);
            }
            let mut nodes = self.t.nodes();
            if let Some(n) = nodes.get_mut(&i) {
                n.cached = Some((attr.size, attr.mtime));
            }
        }
        Ok(attr)
    }

    fn do_unlink(&self, parent: InodeNo, name: &OsStr) -> R<()> {
        let name = check_name(name)?;
        let removed = self.inst.remove_entry(parent, name, want::NOT_DIR)?;
        // The entry is gone: the inode's link count and the directory's times are
        // independent updates at (possibly) two homes, made in parallel.
        let touch = self.inst.start_touch_dir(parent, 0);
        let attr = self.inst.link_count(removed.ino, -1);
        self.touched(parent, touch.and_then(|t| t.wait()).map(|r| r.attr));
        self.t.remember(&attr?, false);
        Ok(())
    }

    fn do_rmdir(&self, parent: InodeNo, name: &OsStr) -> R<()> {
        let name = check_name(name)?;
        let entry = self.inst.lookup_entry(parent, name)?.ok_or(Errno::ENOENT)?;
        if entry.kind != FileKind::Directory {
            return Err(Errno::ENOTDIR);
        }
        self.inst.seal_dir(entry.ino)?;
        if let Err(e) = self.inst.remove_entry(parent, name, want::DIR) {
            self.inst.unseal_dir(entry.ino);
            return Err(e);
        }
        // A directory's own links: its entry and its ".". In parallel with the
        // parent's times and subdirectory count.
        let touch = self.inst.start_touch_dir(parent, -1);
        let attr = self.inst.link_count(entry.ino, -2);
        self.touched(parent, touch.and_then(|t| t.wait()).map(|r| r.attr));
        self.t.remember(&attr?, false);
        Ok(())
    }

    fn do_rename(&self, op: InodeNo, on: &OsStr, np: InodeNo, nn: &OsStr, flags: u32) -> R<()> {
        let (on, nn) = (check_name(on)?, check_name(nn)?);
        let exchange = flags & rename_flags::EXCHANGE != 0;
        let noreplace = flags & rename_flags::NOREPLACE != 0;
        let src = self.inst.lookup_entry(op, on)?.ok_or(Errno::ENOENT)?;
        let dst = self.inst.lookup_entry(np, nn)?;
        if let Some(d) = &dst {
            if d.ino == src.ino {
                return Ok(()); // Both names are links to one inode: POSIX says do nothing.
            }
            if noreplace {
                return Err(Errno::EEXIST);
            }
            if !exchange {
                match (
                    src.kind == FileKind::Directory,
                    d.kind == FileKind::Directory,
                ) {
                    (true, false) => return Err(Errno::ENOTDIR),
                    (false, true) => return Err(Errno::EISDIR),
                    _ => {}
                }
            }
        } else if exchange {
            return Err(Errno::ENOENT);
        }
        // A directory being replaced must be empty on every server, and stay so.
        let sealed = match &dst {
            Some(d) if !exchange && d.kind == FileKind::Directory => {
                self.inst.seal_dir(d.ino)?;
                Some(d.ino)
            }
            _ => None,
        };
        let result = self.rename_entries(op, on, np, nn, flags, &src, dst.as_ref(), exchange);
        let replaced = match result {
            Ok(r) => r,
            Err(e) => {
                if let Some(d) = sealed {
                    self.inst.unseal_dir(d);
                }
                return Err(e);
            }
        };
        // Link counts and directory times.
        let src_is_dir = src.kind == FileKind::Directory;
        if let Some(r) = &replaced {
            if !exchange {
                let delta = if r.kind == FileKind::Directory {
                    -2
                } else {
                    -1
                };
                if let Ok(a) = self.inst.link_count(r.ino, delta) {
                    self.t.remember(&a, false);
                }
            }
        }
        let _ = self.inst.link_count(src.ino, 0); // ctime of the moved inode
        let replaced_dir = replaced.is_some_and(|r| r.kind == FileKind::Directory) && !exchange;
        if op != np {
            let moved_out = i32::from(src_is_dir);
            let moved_in = i32::from(src_is_dir) - i32::from(replaced_dir);
            let (out_delta, in_delta) = if exchange {
                let d_dir = dst.as_ref().is_some_and(|d| d.kind == FileKind::Directory);
                (
                    i32::from(d_dir) - i32::from(src_is_dir),
                    i32::from(src_is_dir) - i32::from(d_dir),
                )
            } else {
                (-moved_out, moved_in)
            };
            self.touch_dir(op, out_delta);
            self.touch_dir(np, in_delta);
        } else {
            self.touch_dir(op, -i32::from(replaced_dir));
        }
        Ok(())
    }

    /// Move the entries themselves. Returns the entry that was replaced, if any.
    #[allow(clippy::too_many_arguments)]
    fn rename_entries(
        &self,
        op: InodeNo,
        on: &[u8],
        np: InodeNo,
        nn: &[u8],
        flags: u32,
        src: &EntryRef,
        dst: Option<&EntryRef>,
        exchange: bool,
    ) -> R<Option<EntryRef>> {
        if self.inst.dentry_home(op, on) == self.inst.dentry_home(np, nn) {
            let r = self.inst.rename_local(RenameReq {
                old_parent: op,
                old_name: on.to_vec(),
                new_parent: np,
                new_name: nn.to_vec(),
                flags,
            })?;
            return Ok(r.replaced);
        }
        // Across servers: add the new name first, then drop the old one, so a failure
        // in between leaves an extra name rather than a lost file.
        if exchange {
            let d = dst.cloned().ok_or(Errno::ENOENT)?;
            self.inst.insert_entry(np, nn, src.clone(), true)?;
            self.inst.insert_entry(op, on, d.clone(), true)?;
            return Ok(Some(d));
        }
        let replaced = self.inst.insert_entry(np, nn, src.clone(), dst.is_some())?;
        match self.inst.remove_entry(op, on, want::ANY) {
            Ok(_) => Ok(replaced),
            Err(e) => {
                // Put the target back as it was.
                match &replaced {
                    Some(r) => {
                        let _ = self.inst.insert_entry(np, nn, r.clone(), true);
                    }
                    None => {
                        let _ = self.inst.remove_entry(np, nn, want::ANY);
                    }
                }
                Err(e)
            }
        }
    }

    fn do_link(&self, i: InodeNo, np: InodeNo, nn: &OsStr) -> R<Attr> {
        let nn = check_name(nn)?;
        let kind = self.dir_attr(i)?.kind;
        if kind == FileKind::Directory {
            return Err(Errno::EPERM);
        }
        self.inst
            .insert_entry(np, nn, EntryRef { ino: i, kind }, false)?;
        let attr = match self.inst.link_count(i, 1) {
            Ok(a) => a,
            Err(e) => {
                let _ = self.inst.remove_entry(np, nn, want::ANY);
                return Err(e);
            }
        };
        self.touch_dir(np, 0);
        Ok(attr)
    }

    fn do_read(&self, i: InodeNo, offset: u64, size: u32) -> R<Vec<u8>> {
        let (attr, wb) = {
            let nodes = self.t.nodes();
            let n = nodes.get(&i).ok_or(Errno::EBADF)?;
            (n.attr.clone(), n.wb.clone())
        };
        let mut fsize = attr.size;
        if let Some(wb) = &wb {
            if wb.is_dirty() {
                self.note_flushed(wb.flush()?);
            }
            fsize = fsize.max(wb.end());
        }
        let layout = self.inst.layout(&attr);
        self.inst.read(&layout, i, offset, size, fsize)
    }

    /// Bytes taken: fewer than `data` when the servers had room for a part only.
    fn do_write(&self, i: InodeNo, offset: u64, data: &[u8]) -> R<usize> {
        match self.t.writeback(i) {
            Some(wb) => wb.write(offset, data),
            None => {
                // Not open here (should not happen: the kernel writes through an open
                // file); write through.
                let attr = self.inst.getattr(i)?;
                let layout = self.inst.layout(&attr);
                self.inst.write(&layout, i, offset, data)?;
                self.inst
                    .extend_size(i, offset + data.len() as u64, true)
                    .map(|_| data.len())
            }
        }
    }

    fn do_release(&self, fh: u64) -> R<()> {
        let Some(of) = self.t.files().remove(&fh) else {
            return Ok(());
        };
        let wb = {
            let mut nodes = self.t.nodes();
            match nodes.get_mut(&of.ino) {
                Some(n) => {
                    n.opens = n.opens.saturating_sub(1);
                    if n.opens == 0 {
                        n.wb.take()
                    } else {
                        None
                    }
                }
                None => None,
            }
        };
        let flushed = match wb {
            Some(wb) => wb.flush().map(|a| self.note_flushed(a)),
            None => Ok(()),
        };
        let released = self.inst.release(of.ino);
        {
            let mut nodes = self.t.nodes();
            if nodes
                .get(&of.ino)
                .is_some_and(|n| n.opens == 0 && n.lookups == 0)
            {
                nodes.remove(&of.ino);
            }
        }
        flushed.and(released)
    }

    fn do_statfs(&self) -> R<(u64, u64, u64)> {
        let frags = self.inst.statfs()?;
        let total: u64 = frags.iter().map(|f| f.capacity).sum();
        // DataWarp: free = servers × free space of the fullest fragment.
        let min_free = frags
            .iter()
            .map(|f| f.capacity.saturating_sub(f.used))
            .min()
            .unwrap_or(0);
        let free = (min_free.saturating_mul(frags.len() as u64)).min(total);
        let inodes: u64 = frags.iter().map(|f| f.inodes).sum();
        Ok((total, free, inodes))
    }

    fn xattr_reply(reply: ReplyXattr, size: u32, data: R<Vec<u8>>) {
        match data {
            Err(e) => reply.error(fe(e)),
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(fuser::Errno::ERANGE),
            Ok(v) => reply.data(&v),
        }
    }

    fn flush_all(&self) {
        let wbs: Vec<Arc<WriteBack>> = self
            .t
            .nodes()
            .values()
            .filter_map(|n| n.wb.clone())
            .collect();
        for wb in wbs {
            if let Err(e) = wb.flush() {
                tracing::error!("flush at unmount failed: {e}");
            }
        }
    }
}

impl Filesystem for SpillwayFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Not FUSE_AUTO_INVAL_DATA: with it the kernel drops a file's page cache
        // whenever a fresh GETATTR shows a new mtime, and every write of our own moves
        // the mtime on the server, so a process reading back what it wrote (SQLite's
        // page 1 at every transaction) would read from the servers each time. Another
        // client's change is caught at open instead (`do_open` compares size and mtime
        // with what the cache holds and invalidates): close-to-open, as promised.
        let wanted = InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_MAX_PAGES;
        if let Err(missing) = config.add_capabilities(wanted) {
            tracing::warn!("kernel lacks FUSE capabilities {missing:?}");
        }
        // fcntl and flock locks held at the servers, across clients (locks.rs); with
        // `locks = node` the kernel keeps them, exclusive among this node's processes.
        let locks = InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS;
        if !self.tun.cluster_locks {
            tracing::info!("locks = node: fcntl and flock locks are local to this node");
        } else if let Err(missing) = config.add_capabilities(locks) {
            tracing::warn!("kernel lacks {missing:?}: those locks stay local to this node");
        }
        // POSIX ACLs enforced by the kernel from the xattrs it reads (acl.rs). With
        // them the VFS leaves the umask to the file system, and DONT_MASK keeps FUSE
        // from applying it before we know whether the directory has a default ACL.
        let acls = InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK;
        match config.add_capabilities(acls) {
            Ok(()) => self.acl = true,
            Err(missing) => tracing::warn!("kernel lacks {missing:?}: POSIX ACLs refused"),
        }
        let _ = config.set_max_write(self.tun.max_write);
        let _ = config.set_max_readahead(self.tun.max_readahead);
        let _ = config.set_max_background(64);
        // The root must exist: fail the mount now rather than every call later.
        let root = self
            .inst
            .getattr(self.root.ino())
            .map_err(|e| std::io::Error::from_raw_os_error(e.0))?;
        self.t.remember(&root, true);
        Ok(())
    }

    fn destroy(&mut self) {
        self.locks.stop();
        self.flush_all();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let parent = self.ino(parent);
        let n = name.as_bytes();
        if let Some((a, ttl)) =
            self.t
                .cached_subdir(parent, n, self.tun.entry_ttl, self.tun.attr_ttl)
        {
            return reply.entry(&ttl, &self.fuse_attr(&a), Generation(0));
        }
        let r = check_name(name)
            .and_then(|n| self.inst.lookup(parent, n))
            .map(|(_, a)| a);
        match &r {
            Ok(a) => self.t.remember_entry(parent, n, a, self.tun.entry_ttl),
            Err(_) => self.t.forget_entry(parent, n),
        }
        match r {
            // A negative entry (node id 0): the kernel remembers the miss for the entry
            // lifetime, so the lookups before a create do not each cost a round trip.
            // Our own create replaces it; another client's create shows within the same
            // lifetime as any other name change.
            Err(e) if e == Errno::ENOENT && !self.tun.entry_ttl.is_zero() => {
                let mut none = self.fuse_attr(&self.negative_template());
                none.ino = INodeNo(0);
                reply.entry(&self.tun.entry_ttl, &none, Generation(0));
            }
            other => self.reply_entry(reply, other),
        }
    }

    fn forget(&self, _req: &Request, i: INodeNo, nlookup: u64) {
        self.t.forget(self.ino(i), nlookup);
    }

    fn getattr(&self, _req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if let Some((a, ttl)) = self.t.fresh_attr(self.ino(i), self.tun.attr_ttl) {
            // A cached "no blocks" of a non-empty file may predate the servers' report
            // (a flush's reply races it): ask the home, as tools read st_blocks 0 as
            // "all hole" (fs/sparse.rs).
            if !(a.kind == FileKind::Regular && a.blocks == 0 && a.size > 0) {
                return reply.attr(&ttl, &self.fuse_attr(&a));
            }
        }
        self.reply_attr(reply, self.inst.getattr(self.ino(i)).map_err(gone));
    }

    fn setattr(
        &self,
        _req: &Request,
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
        let mut valid = 0;
        let mut req = SetAttrReq::of(self.ino(i));
        if let Some(m) = mode {
            valid |= setattr::MODE;
            req.mode = m & 0o7777;
        }
        if let Some(u) = uid {
            valid |= setattr::UID;
            req.uid = u;
        }
        if let Some(g) = gid {
            valid |= setattr::GID;
            req.gid = g;
        }
        if let Some(s) = size {
            valid |= setattr::SIZE;
            req.size = s;
        }
        req.atime = time_set(atime, setattr::ATIME, setattr::ATIME_NOW, &mut valid);
        req.mtime = time_set(mtime, setattr::MTIME, setattr::MTIME_NOW, &mut valid);
        if let Some(c) = ctime {
            valid |= setattr::CTIME;
            req.ctime = Timespec::from_system_time(c);
        }
        req.valid = valid;
        self.reply_attr(reply, self.do_setattr(self.ino(i), req).map_err(gone));
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
        let r = match FileKind::from_mode(mode) {
            Some(FileKind::Directory) | Some(FileKind::Symlink) | None => Err(Errno::EINVAL),
            Some(kind) => {
                let p = self.ino(parent);
                self.make(req, p, name, kind, mode, rdev, &[], false, umask)
            }
        };
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
        let r = self.make(
            req,
            self.ino(parent),
            name,
            FileKind::Directory,
            mode,
            0,
            &[],
            false,
            umask,
        );
        self.reply_entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.do_unlink(self.ino(parent), name);
        self.t.forget_entry(self.ino(parent), name.as_bytes());
        Self::empty(reply, r);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.do_rmdir(self.ino(parent), name);
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
        let t = target.as_os_str().as_bytes();
        let r = if t.len() > MAX_SYMLINK_LEN {
            Err(Errno::ENAMETOOLONG)
        } else {
            self.make(
                req,
                self.ino(parent),
                link_name,
                FileKind::Symlink,
                0o777,
                0,
                t,
                false,
                0, // symlinks are 0777: no umask, no ACL
            )
        };
        self.reply_entry(reply, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(fuser::Errno::EINVAL);
        }
        let mut f = 0;
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            f |= rename_flags::NOREPLACE;
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            f |= rename_flags::EXCHANGE;
        }
        let r = self.do_rename(self.ino(parent), name, self.ino(newparent), newname, f);
        self.t.forget_entry(self.ino(parent), name.as_bytes());
        self.t.forget_entry(self.ino(newparent), newname.as_bytes());
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
        let r = self.do_link(self.ino(i), self.ino(newparent), newname);
        self.reply_entry(reply, r);
    }

    fn open(&self, _req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(self.ino(i), flags.0 as u32, None) {
            Ok((fh, f)) => reply.opened(FileHandle(fh), f),
            Err(e) => reply.error(fe(e)),
        }
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
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.do_write(self.ino(i), offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(fe(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let r = match self.t.writeback(self.ino(i)) {
            Some(wb) => wb.flush().map(|a| self.note_flushed(a)),
            None => Ok(()),
        };
        // A process's close drops its POSIX locks on the file (locks.rs).
        let unlocked = self.locks.flush(self.ino(i), lock_owner.0);
        Self::empty(reply, r.and(unlocked));
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
        // The open file description's flocks and OFD locks (locks.rs).
        self.locks
            .release(self.ino(i), fh.0, lock_owner.map(|o| o.0));
        Self::empty(reply, self.do_release(fh.0));
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
        let r = match self.t.writeback(self.ino(i)) {
            Some(wb) => wb.fsync().map(|a| self.note_flushed(a)),
            None => self.inst.sync_meta(self.ino(i)),
        };
        Self::empty(reply, r);
    }

    fn opendir(&self, _req: &Request, _i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // The listing is taken by the first readdir (offset 0), and again on a rewind.
        let fh = self.t.new_fh();
        self.t.dirs().insert(fh, Vec::new());
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        i: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if offset == 0 {
            // The first call, or a rewind: list what is there now.
            match self.inst.read_dir(self.ino(i), self.tun.readdir_page) {
                Ok(entries) => {
                    self.t.dirs().insert(fh.0, entries);
                }
                Err(e) => return reply.error(fe(e)),
            }
        }
        let dirs = self.t.dirs();
        let Some(entries) = dirs.get(&fh.0) else {
            return reply.error(fuser::Errno::EBADF);
        };
        // `..` carries the directory's own number: the kernel resolves `..` itself,
        // and at the mount root (node 1) nothing above the root is ever named.
        let dots = [(b".".as_slice(), i), (b"..".as_slice(), i)];
        let total = entries.len() as u64 + 2;
        let mut pos = offset;
        while pos < total {
            let full = if pos < 2 {
                let (n, d) = dots[pos as usize];
                reply.add(d, pos + 1, FileType::Directory, OsStr::from_bytes(n))
            } else {
                let e = &entries[(pos - 2) as usize];
                reply.add(
                    self.fuse_ino(e.entry.ino),
                    pos + 1,
                    file_type(e.entry.kind),
                    OsStr::from_bytes(&e.name),
                )
            };
            if full {
                break;
            }
            pos += 1;
        }
        reply.ok();
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

    fn statfs(&self, _req: &Request, _i: INodeNo, reply: ReplyStatfs) {
        match self.do_statfs() {
            Ok((total, free, inodes)) => {
                let bs = 4096u64;
                let ffree = u64::from(u32::MAX);
                reply.statfs(
                    total / bs,
                    free / bs,
                    free / bs,
                    inodes + ffree,
                    ffree,
                    bs as u32,
                    MAX_NAME_LEN as u32,
                    bs as u32,
                )
            }
            Err(e) => reply.error(fe(e)),
        }
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
        let n = name.as_bytes();
        if n == LAYOUT_XATTR {
            return reply.error(fuser::Errno::EPERM);
        }
        if n == STRIPE_SIZE_XATTR || n == STRIPE_WIDTH_XATTR {
            return Self::empty(reply, self.set_stripe_param(self.ino(i), n, value));
        }
        if self.acl && acl::is_acl_name(n) {
            let r = self.set_acl(req, self.ino(i), n, value, flags as u32);
            return Self::empty(reply, r);
        }
        if n.starts_with(b"system.") {
            // Nothing else of system.* is stored (nor were ACLs, if the kernel would
            // not enforce them).
            return reply.error(fuser::Errno::EOPNOTSUPP);
        }
        self.forget_capability(self.ino(i));
        // The change moves the inode's ctime on the server.
        self.t.stale(self.ino(i));
        Self::empty(
            reply,
            self.inst.set_xattr(self.ino(i), n, value, flags as u32),
        );
    }

    fn getxattr(&self, _req: &Request, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let n = name.as_bytes();
        if self.acl && n == DEFAULT_XATTR {
            let r = acl::dir_default(&self.inst, &self.t, self.tun.attr_ttl, self.ino(i))
                .and_then(|v| v.ok_or(Errno::ENODATA));
            return Self::xattr_reply(reply, size, r);
        }
        if self.acl && n == ACCESS_XATTR {
            let r = acl::access(&self.inst, &self.t, self.tun.attr_ttl, self.ino(i));
            return Self::xattr_reply(reply, size, r);
        }
        if n.starts_with(b"system.") {
            return reply.error(fuser::Errno::ENODATA);
        }
        if n == LAYOUT_XATTR {
            return Self::xattr_reply(reply, size, self.layout_json(self.ino(i)));
        }
        if n == STRIPE_SIZE_XATTR || n == STRIPE_WIDTH_XATTR {
            let r = self.inst.getattr(self.ino(i)).map(|a| {
                let v = if n == STRIPE_SIZE_XATTR {
                    u64::from(a.stripe_size)
                } else {
                    u64::from(a.stripe_width)
                };
                v.to_string().into_bytes()
            });
            return Self::xattr_reply(reply, size, r);
        }
        if n == CAPABILITY_XATTR {
            return Self::xattr_reply(reply, size, self.capability(self.ino(i)));
        }
        Self::xattr_reply(reply, size, self.inst.get_xattr(self.ino(i), n));
    }

    fn listxattr(&self, _req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        let r = self.inst.list_xattr(self.ino(i)).map(|names| {
            let mut buf = Vec::new();
            for n in names {
                buf.extend_from_slice(&n);
                buf.push(0);
            }
            buf
        });
        Self::xattr_reply(reply, size, r);
    }

    fn removexattr(&self, _req: &Request, i: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let n = name.as_bytes();
        if self.acl && acl::is_acl_name(n) {
            // Removing the access ACL leaves the mode as it is (the server's rule).
            self.t.stale(self.ino(i));
            acl::forget_default(&self.t, self.ino(i));
            acl::forget_access(&self.t, self.ino(i));
            return Self::empty(reply, self.inst.remove_xattr(self.ino(i), n));
        }
        if n.starts_with(b"system.")
            || n == LAYOUT_XATTR
            || n == STRIPE_SIZE_XATTR
            || n == STRIPE_WIDTH_XATTR
        {
            return reply.error(fuser::Errno::EOPNOTSUPP);
        }
        self.forget_capability(self.ino(i));
        self.t.stale(self.ino(i));
        Self::empty(reply, self.inst.remove_xattr(self.ino(i), n));
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
        let r = self.do_fallocate(self.ino(i), offset, length, mode);
        Self::empty(reply, r.map(|_| ()));
    }

    fn lseek(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        // The kernel sends only these two; SEEK_SET/CUR/END it answers itself.
        let hole = match whence {
            libc::SEEK_DATA => false,
            libc::SEEK_HOLE => true,
            _ => return reply.error(fuser::Errno::EINVAL),
        };
        match self.do_lseek(self.ino(i), offset, hole) {
            Ok(at) => reply.offset(at),
            Err(e) => reply.error(fe(e)),
        }
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
        let parent = self.ino(parent);
        let make = || {
            let r = FileKind::Regular;
            self.make(req, parent, name, r, mode, 0, &[], true, umask)
        };
        let mut made = make();
        if made.as_ref().err() == Some(&Errno::EEXIST) {
            // Another client made the name since the kernel looked (fs/existing.rs).
            match self.open_existing(req, parent, name.as_bytes(), flags) {
                Ok(opened) => return self.reply_existing(opened, reply),
                // It went again: create it after all.
                Err(e) if e == Errno::ENOENT => made = make(),
                Err(e) => return reply.error(fe(e)),
            }
        }
        let attr = match made {
            Ok(a) => a,
            Err(e) => return reply.error(fe(e)),
        };
        self.t.remember(&attr, true);
        // A new file has no xattrs: answer the kernel's pre-write capability check
        // without asking the server.
        if let Some(n) = self.t.nodes().get_mut(&attr.ino) {
            n.capability = Some((std::time::Instant::now(), None));
        }
        match self.open_file(attr.ino, flags as u32, Some(attr.clone())) {
            Ok((fh, f)) => reply.created(
                &self.tun.entry_ttl,
                &self.fuse_attr(&attr),
                Generation(0),
                FileHandle(fh),
                f,
            ),
            Err(e) => reply.error(fe(e)),
        }
    }
}

/// Attribute and entry lifetimes as the kernel wants them.
pub fn ttl(ms: u64) -> Duration {
    Duration::from_millis(ms)
}
