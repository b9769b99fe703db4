//! Names: making inodes of every kind (mknod, mkdir, symlink; create's half is in
//! files.rs), hard links, unlink and rmdir, and directory listings. Each keeps the
//! parent directory's times and subdirectory count at its home (`touch_dir`).

use super::lookup::check_name;
use super::reply::file_type;
use super::{SpillwayFs, R};
use crate::acl;
use fuser::{FileType, Generation, INodeNo, ReplyDirectory, ReplyDirectoryPlus, Request};
use spillway_types::tunables::MAX_SYMLINK_LEN;
use spillway_types::{Attr, Errno, FileKind, InodeNo};
use spillway_wire::messages::{want, Caller, CreateReq, EntryRef};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

impl SpillwayFs {
    /// MKNOD: FIFOs, sockets, device and regular files (directories and symlinks
    /// have their own requests).
    pub(super) fn do_mknod(
        &self,
        req: &Request,
        parent: InodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> R<Attr> {
        match FileKind::from_mode(mode) {
            Some(FileKind::Directory) | Some(FileKind::Symlink) | None => Err(Errno::EINVAL),
            Some(kind) => self.make(req, parent, name, kind, mode, rdev, &[], false, umask),
        }
    }

    /// MKDIR; the parent's subdirectory count changes only if it happened (`make`).
    pub(super) fn do_mkdir(
        &self,
        req: &Request,
        parent: InodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> R<Attr> {
        let dir = FileKind::Directory;
        self.make(req, parent, name, dir, mode, 0, &[], false, umask)
    }

    /// SYMLINK; a target longer than the servers store: ENAMETOOLONG.
    pub(super) fn do_symlink(
        &self,
        req: &Request,
        parent: InodeNo,
        name: &OsStr,
        target: &Path,
    ) -> R<Attr> {
        let t = target.as_os_str().as_bytes();
        if t.len() > MAX_SYMLINK_LEN {
            return Err(Errno::ENAMETOOLONG);
        }
        // Symlinks are 0777: no umask, no ACL.
        self.make(req, parent, name, FileKind::Symlink, 0o777, 0, t, false, 0)
    }

    /// Create an inode of any kind under `parent`, owned by the caller, with the ACLs
    /// it inherits from `parent` (or else `umask` applied).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn make(
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
        let mut create = CreateReq {
            rdev,
            target: target.to_vec(),
            open,
            xattrs: new.xattrs,
            ..CreateReq::new(parent, name, kind, new.mode, req.uid(), gid)
        };
        // New files take their directory's stripe setting; subdirectories (and other
        // kinds) take the instance's default.
        if kind == FileKind::Regular {
            create.stripe_size = pattr.stripe_size;
            create.stripe_width = pattr.stripe_width;
        }
        if kind == FileKind::Directory {
            // The parent's link count may only change if the mkdir happened.
            let attr = self.inst.create(create)?;
            self.touch_dir(parent, 1);
            // Its default ACL is known: creates in it need not ask its home.
            self.t.remember(&attr, false);
            acl::remember_default(&self.t, attr.ino, new.default);
            return Ok(attr);
        }
        // A cache's namespace server reads the parent's times from the PFS, where the
        // create moves them: asked in parallel, it could answer before the create landed
        // and the stale times would be kept until the attributes expire (pjdfstest
        // open/00, mkfifo/00, symlink/00). One server: asking after costs little.
        if self.inst.desc.cache {
            let attr = self.inst.create(create)?;
            self.touch_dir(parent, 0);
            return Ok(attr);
        }
        // The kernel asks only after finding no such name, so the create almost always
        // succeeds: update the parent's times in parallel with it.
        let touch = self.inst.start_touch_dir(parent, 0);
        let attr = self.inst.create(create);
        self.touched(parent, touch.and_then(|t| t.wait()).map(|r| r.attr));
        attr
    }

    /// Tell a directory's home that an entry changed (mtime/ctime, subdirectory count).
    /// A failure is logged, not returned: the entry change itself already succeeded.
    pub(super) fn touch_dir(&self, dir: InodeNo, nlink_delta: i32) {
        self.touched(dir, self.inst.touch_dir(dir, nlink_delta));
    }

    /// The outcome of a TouchDir: the directory's new attributes, or (a failure is
    /// logged, not returned: the entry change itself already succeeded) not knowing
    /// them any more.
    pub(super) fn touched(&self, dir: InodeNo, r: R<Attr>) {
        match r {
            Ok(a) => self.t.remember(&a, false),
            Err(e) => {
                tracing::debug!(%dir, "touching directory failed: {e}");
                self.t.stale(dir);
            }
        }
    }

    /// Remove a name that is not a directory's; the inode's link count drops at its home.
    pub(super) fn do_unlink(&self, caller: Option<Caller>, parent: InodeNo, name: &OsStr) -> R<()> {
        let name = check_name(name)?;
        let removed = self.remove_name(caller, parent, name, want::NOT_DIR)?;
        // The entry is gone: the inode's link count and the directory's times are
        // independent updates at (possibly) two homes, made in parallel.
        let touch = self.inst.start_touch_dir(parent, 0);
        let attr = self.inst.link_count(removed.ino, -1);
        self.touched(parent, touch.and_then(|t| t.wait()).map(|r| r.attr));
        self.t.remember(&attr?, false);
        Ok(())
    }

    /// Remove `parent`/`name`: on a cache instance as `caller` (the PFS judges the
    /// entry the name holds at the moment of the removal), else at its server.
    pub(super) fn remove_name(
        &self,
        caller: Option<Caller>,
        parent: InodeNo,
        name: &[u8],
        want: u8,
    ) -> R<EntryRef> {
        match caller {
            Some(c) => self.inst.cache_remove(c, parent, name, want),
            None => self.inst.remove_entry(parent, name, want),
        }
    }

    /// Remove an empty directory, sealed on every server first so that no entry appears
    /// in it while it goes.
    pub(super) fn do_rmdir(&self, caller: Option<Caller>, parent: InodeNo, name: &OsStr) -> R<()> {
        let name = check_name(name)?;
        let entry = self.inst.lookup_entry(parent, name)?.ok_or(Errno::ENOENT)?;
        if entry.kind != FileKind::Directory {
            return Err(Errno::ENOTDIR);
        }
        self.inst.seal_dir(entry.ino)?;
        if let Err(e) = self.remove_name(caller, parent, name, want::DIR) {
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

    /// A new name for an inode that is not a directory; the name goes again when its
    /// link count cannot be raised.
    pub(super) fn do_link(&self, i: InodeNo, np: InodeNo, nn: &OsStr) -> R<Attr> {
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

    /// A handle for the listing; the listing itself is taken by the first readdir
    /// (offset 0), and again on a rewind.
    pub(super) fn do_opendir(&self) -> u64 {
        let fh = self.t.new_fh();
        self.t.dirs().insert(fh, Vec::new());
        fh
    }

    /// Add to `reply` the entries of directory `i` (the kernel's number) from
    /// `offset` on, as many as fit, from the listing handle `fh` holds.
    pub(super) fn do_readdir(
        &self,
        i: INodeNo,
        fh: u64,
        offset: u64,
        reply: &mut ReplyDirectory,
    ) -> R<()> {
        self.list_if_first(i, fh, offset, false)?;
        let dirs = self.t.dirs();
        let entries = dirs.get(&fh).ok_or(Errno::EBADF)?;
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
        Ok(())
    }

    /// READDIRPLUS: as `do_readdir`, each entry with its attributes, so that the
    /// kernel makes the dentries and inodes at once and a walk (`find`, `ls -l`,
    /// `du`) costs no LOOKUP or GETATTR per entry. Each entry added counts a kernel
    /// reference, as a LOOKUP reply does (`.` and `..` do not: the kernel links
    /// neither). An entry whose inode vanished since the listing is left out.
    pub(super) fn do_readdirplus(
        &self,
        i: INodeNo,
        fh: u64,
        offset: u64,
        reply: &mut ReplyDirectoryPlus,
    ) -> R<()> {
        self.list_if_first(i, fh, offset, true)?;
        let ttl = self.tun.entry_ttl.min(self.tun.attr_ttl);
        let mut pos = offset;
        if pos < 2 {
            // `..` carries the directory's own number and attributes, as in READDIR.
            let mut own = self.fuse_attr(&self.dir_attr(self.ino(i))?);
            own.ino = i;
            while pos < 2 {
                let name = if pos == 0 { "." } else { ".." };
                if reply.add(i, pos + 1, name, &ttl, &own, Generation(0)) {
                    return Ok(());
                }
                pos += 1;
            }
        }
        // Entries listed without attributes (a plain READDIR began this listing) are
        // asked of their homes one by one.
        let n = self.t.dirs().get(&fh).ok_or(Errno::EBADF)?.len() as u64;
        while pos < n + 2 {
            let e = {
                let dirs = self.t.dirs();
                let entries = dirs.get(&fh).ok_or(Errno::EBADF)?;
                entries[(pos - 2) as usize].clone()
            };
            let attr = match e.attr {
                Some(a) => Some(a),
                None => self.inst.getattr(e.entry.ino).ok(),
            };
            if let Some(a) = attr {
                let fa = self.fuse_attr(&a);
                if reply.add(
                    fa.ino,
                    pos + 1,
                    OsStr::from_bytes(&e.name),
                    &ttl,
                    &fa,
                    Generation(0),
                ) {
                    break;
                }
                self.t.remember(&a, true);
            }
            pos += 1;
        }
        Ok(())
    }

    /// At offset 0 (the first call, or a rewind) list what is there now into the
    /// handle `fh`, with attributes for READDIRPLUS: read ahead of this walk if it
    /// was (dirahead.rs), else from the servers; then read its subdirectories ahead.
    fn list_if_first(&self, i: INodeNo, fh: u64, offset: u64, plus: bool) -> R<()> {
        if offset == 0 {
            let dir = self.ino(i);
            let entries = match self.ahead.take(dir) {
                Some(e) => e,
                None => self.inst.read_dir(dir, self.tun.readdir_page, plus)?,
            };
            self.ahead.listed(dir, &entries);
            self.t.dirs().insert(fh, entries);
        }
        Ok(())
    }
}
