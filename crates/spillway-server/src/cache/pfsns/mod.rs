//! The PFS namespace of a cache instance, on the instance's server 0: every name,
//! attribute and listing the mount shows is the PFS directory's, read and changed by
//! real system calls on it. The inode numbers shown are this server's
//! (`InodeNo::compose(home, counter)`, counter 1 the directory itself), each mapped to
//! the PFS file handle of its inode in a persistent table (`table.rs`), so that a
//! number means the same file across lookups, renames and server restarts.
//!
//! # Security model
//!
//! The server acts on the PFS as root for namespace calls. Permission checks are the
//! client kernel's: the mount uses `default_permissions` and reports the PFS's own
//! modes, owners and ACL xattrs, so a caller is allowed what the PFS's modes allow it
//! (the trust model of scratch instances: the client hosts are trusted to run the
//! kernel's checks). What keeps root's calls inside the instance's directory:
//!
//! * Every call is relative to a descriptor opened by file handle, and handles come
//!   only from this table (made from the directory given at open and names beneath
//!   it), never from a client. A client names things only by our inode numbers and
//!   single name components that passed `crate::names::check_name` (and are not `.`
//!   or `..`, refused EINVAL).
//! * No path string is ever built from names, and no symlink is ever followed: names
//!   are resolved with `openat(O_PATH | O_NOFOLLOW)`, `fstatat(AT_SYMLINK_NOFOLLOW)`,
//!   `unlinkat`, `renameat2`, `mkdirat`, ... of one component; calls on an inode use
//!   its own descriptor (`AT_EMPTY_PATH`) or its procfs magic link `/proc/self/fd/N`,
//!   which the kernel resolves to that inode itself, not to a path (chmod and truncate
//!   through it are kept away from symlinks, whose modes Linux cannot change
//!   (EOPNOTSUPP) and whose size cannot be set (EINVAL)). A directory descriptor is
//!   opened with O_DIRECTORY, so a symlink in the tree answers ENOTDIR as a parent.
//! * A name on another mount (a mount point beneath the directory) is refused EXDEV
//!   and left out of listings: its handle would not mean the same inode on the PFS's
//!   mount, and the instance is one file system.
//! * A new node is made by root in a directory others may write: a regular file comes
//!   with its descriptor (`O_CREAT | O_EXCL`); other kinds are opened again by name
//!   (`O_PATH | O_NOFOLLOW`) and must be of the kind made and owned by root, or the
//!   create answers EEXIST without touching what is there (someone swapped the name).
//!
//! Handles name inodes, not paths: an inode that someone moves out of the directory
//! directly on the PFS stays reachable through the numbers already given for it, with
//! its own modes still checked by the client kernel; that gives nobody more than the
//! mover could already do.
//!
//! Memory only (lost with the server, by design): the sizes of files the cache has
//! extended ahead of the PFS (`extend_size`), the last attributes of removed inodes
//! (so `link_count` can answer after the last link is gone), short-lived sorted
//! listings that let the later pages of one listing skip re-reading the directory,
//! and the PFS versions of coherence at open (versions.rs).

mod handles;
mod hidden;
mod sys;
mod table;
#[cfg(test)]
mod tests;
mod versions;

use self::handles::Handle;
use self::table::{Row, Table};
use crate::error::{fs, StoreResult};
use crate::meta::{
    AttrChange, DirPage, Entry, Expect, Found, NamedEntry, NewNode, RenameMode, Renamed,
    SizeChange, TimeChange, XattrMode,
};
use crate::names::{check_name, check_symlink_target, check_xattr_name, check_xattr_value};
use spillway_types::identity::{as_identity, Identity};
use spillway_types::{Attr, Errno, FileKind, InodeNo, ServerIndex, Timespec};
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most entries one listing page answers.
const MAX_PAGE: u32 = 65536;
/// How long a directory's sorted names serve the later pages of a listing (the first
/// page always reads the directory again).
const LISTING_TTL: Duration = Duration::from_secs(5);
/// Directories whose sorted names are kept at once.
const LISTINGS_KEPT: usize = 8;
/// Removed inodes whose last attributes are kept for `link_count`.
const GONE_KEPT: usize = 4096;

/// The attributes a cached write has moved ahead of the PFS.
#[derive(Clone, Copy, Debug, Default)]
struct Overlay {
    size: u64,
    mtime: Option<Timespec>,
}

struct Listing {
    ino: InodeNo,
    /// The directory's (mtime, ctime) when read: a change to it retires the listing.
    stamp: [i64; 4],
    made: Instant,
    names: Arc<Vec<Vec<u8>>>,
}

#[derive(Default)]
struct Memory {
    overlays: HashMap<InodeNo, Overlay>,
    gone: HashMap<InodeNo, Attr>,
    gone_order: VecDeque<InodeNo>,
    listings: VecDeque<Listing>,
    /// Coherence at open (versions.rs): the PFS version agreed per regular file, and
    /// the files owing a drop.
    versions: HashMap<InodeNo, crate::cache::coherence::PfsVersion>,
    owed: HashSet<InodeNo>,
    /// Files unlinked while open, under their hidden names (hidden.rs).
    hidden: HashMap<InodeNo, hidden::Hidden>,
}

/// Who a removal or rename is made for: the caller it is made as on the PFS (`None`:
/// root, for calls whose checks the client kernel made), and which files are open now
/// (their last name is not removed but hidden until their last close, hidden.rs).
pub(crate) struct By<'a> {
    pub caller: Option<&'a Identity>,
    pub open: Option<&'a dyn Fn(InodeNo) -> bool>,
}

impl By<'_> {
    /// Root, with no file open.
    #[cfg(test)]
    pub(crate) const ROOT: By<'static> = By {
        caller: None,
        open: None,
    };

    fn is_open(&self, ino: InodeNo) -> bool {
        self.open.is_some_and(|f| f(ino))
    }
}

/// An inode opened by handle (O_PATH unless said), with its row and status.
struct Opened {
    fd: OwnedFd,
    st: libc::stat,
    row: Row,
}

/// A name beneath a directory: its inode (O_PATH), status and handle.
struct Child {
    fd: OwnedFd,
    st: libc::stat,
    handle: Handle,
}

pub(crate) struct PfsNamespace {
    /// The instance's PFS directory, readable (not O_PATH: `open_by_handle_at` wants
    /// a real descriptor on the file system).
    dir: OwnedFd,
    /// The mount the directory is on; names on other mounts are refused.
    mount_id: i32,
    home: ServerIndex,
    stripe_size: u32,
    stripe_width: u16,
    /// None once closed.
    table: Mutex<Option<Table>>,
    memory: Mutex<Memory>,
}

/// A name from a client as the C string of one component.
fn cname(name: &[u8]) -> StoreResult<CString> {
    check_name(name)?;
    // The names of files unlinked while open are the server's (hidden.rs).
    if hidden::is_hidden_name(name) {
        return Err(fs(Errno::EPERM));
    }
    if name == b"." || name == b".." {
        return Err(fs(Errno::EINVAL));
    }
    CString::new(name).map_err(|_| fs(Errno::EINVAL))
}

fn xattr_cname(name: &[u8]) -> StoreResult<CString> {
    check_xattr_name(name)?;
    CString::new(name).map_err(|_| fs(Errno::EINVAL))
}

fn kind_of(st: &libc::stat) -> StoreResult<FileKind> {
    FileKind::from_mode(st.st_mode).ok_or(fs(Errno::EOPNOTSUPP))
}

fn stamp(sec: i64, nsec: i64) -> Timespec {
    Timespec {
        sec,
        nsec: nsec.clamp(0, 999_999_999) as u32,
    }
}

fn same_inode(a: &libc::stat, b: &libc::stat) -> bool {
    a.st_dev == b.st_dev && a.st_ino == b.st_ino
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn utime(t: Option<TimeChange>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeChange::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeChange::At(t)) => libc::timespec {
            tv_sec: t.sec,
            tv_nsec: libc::c_long::from(t.nsec),
        },
    }
}

impl PfsNamespace {
    /// `dir`: the instance's PFS directory, already opened (O_DIRECTORY) and vetted by
    /// the caller; `db`: the table's file (created 0600 if missing; refused if it is a
    /// symlink; it must lie outside `dir`, or clients would see it); `home`: this
    /// server's index; `stripe_size`/`stripe_width`: the
    /// instance's default geometry for files.
    pub(crate) fn open(
        dir: OwnedFd,
        db: &Path,
        home: ServerIndex,
        stripe_size: u32,
        stripe_width: u16,
    ) -> StoreResult<PfsNamespace> {
        // The caller's descriptor may be O_PATH, which open_by_handle_at refuses as
        // its mount descriptor: work from a reading one of the same directory.
        let dir = sys::reopen(&dir, libc::O_RDONLY | libc::O_DIRECTORY)?;
        let (root, mount_id) = handles::handle_of(&dir)?;
        let table = Table::open(db, &root)?;
        let ns = PfsNamespace {
            dir,
            mount_id,
            home,
            stripe_size,
            stripe_width,
            table: Mutex::new(Some(table)),
            memory: Mutex::new(Memory::default()),
        };
        ns.load_hidden()?;
        Ok(ns)
    }

    fn with_table<T>(&self, f: impl FnOnce(&mut Table) -> StoreResult<T>) -> StoreResult<T> {
        let mut t = lock(&self.table);
        match t.as_mut() {
            Some(t) => f(t),
            None => Err(fs(Errno::ESTALE)),
        }
    }

    fn ino(&self, counter: u64) -> InodeNo {
        InodeNo::compose(self.home, counter)
    }

    fn row_of(&self, ino: InodeNo) -> StoreResult<Row> {
        if ino.home() != self.home {
            return Err(fs(Errno::ESTALE));
        }
        self.with_table(|t| t.row(ino.counter()))?
            .ok_or(fs(Errno::ESTALE))
    }

    fn open_ino(&self, ino: InodeNo, flags: i32) -> StoreResult<(OwnedFd, Row)> {
        let row = self.row_of(ino)?;
        let fd = handles::open_handle(&self.dir, row.handle.kind, &row.handle.bytes, flags)?;
        Ok((fd, row))
    }

    /// The inode itself (O_PATH: a symlink's own inode, a FIFO without opening it).
    fn inode(&self, ino: InodeNo) -> StoreResult<Opened> {
        let (fd, row) = self.open_ino(ino, libc::O_PATH | libc::O_NOFOLLOW)?;
        let st = sys::fstat(&fd)?;
        Ok(Opened { fd, st, row })
    }

    /// A directory to make calls beneath: ENOTDIR for anything else (a symlink too).
    fn dir_fd(&self, ino: InodeNo) -> StoreResult<OwnedFd> {
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        Ok(self.open_ino(ino, flags)?.0)
    }

    fn child(&self, dir: &OwnedFd, name: &CString) -> StoreResult<Child> {
        let fd = sys::open_at(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        let st = sys::fstat(&fd)?;
        let (handle, mount_id) = handles::handle_of(&fd)?;
        if mount_id != self.mount_id {
            return Err(fs(Errno::EXDEV));
        }
        Ok(Child { fd, st, handle })
    }

    /// The attributes shown for `ino`: the PFS's, with the geometry of its row and
    /// what cached writes added.
    fn attr_of(
        &self,
        ino: InodeNo,
        st: &libc::stat,
        stripe_size: u32,
        stripe_width: u16,
    ) -> StoreResult<Attr> {
        let kind = kind_of(st)?;
        let mut a = Attr {
            ino,
            kind,
            mode: st.st_mode & 0o7777,
            nlink: u32::try_from(st.st_nlink).unwrap_or(u32::MAX),
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev as u32,
            size: u64::try_from(st.st_size).unwrap_or(0),
            atime: stamp(st.st_atime, st.st_atime_nsec),
            mtime: stamp(st.st_mtime, st.st_mtime_nsec),
            ctime: stamp(st.st_ctime, st.st_ctime_nsec),
            stripe_size: if stripe_size == 0 {
                self.stripe_size
            } else {
                stripe_size
            },
            stripe_width: if stripe_width == 0 {
                self.stripe_width
            } else {
                stripe_width
            },
            blocks: u64::try_from(st.st_blocks).unwrap_or(0),
        };
        if kind == FileKind::Regular {
            let m = lock(&self.memory);
            // Its hidden name is not one of its links (hidden.rs).
            if m.hidden.contains_key(&ino) {
                a.nlink = a.nlink.saturating_sub(1);
            }
            if let Some(o) = m.overlays.get(&ino) {
                a.size = a.size.max(o.size);
                if let Some(t) = o.mtime {
                    a.mtime = a.mtime.max(t);
                    a.ctime = a.ctime.max(t);
                }
            }
        }
        Ok(a)
    }

    fn opened_attr(&self, ino: InodeNo, o: &Opened) -> StoreResult<Attr> {
        self.attr_of(ino, &o.st, o.row.stripe_size, o.row.stripe_width)
    }

    fn entry_of(&self, c: &Child) -> StoreResult<(Entry, Attr)> {
        let known = self.with_table(|t| t.counter(&c.handle))?;
        let ino = self.ino(known.counter);
        let attr = self.attr_of(ino, &c.st, known.stripe_size, known.stripe_width)?;
        Ok((
            Entry {
                ino,
                kind: attr.kind,
            },
            attr,
        ))
    }

    /// `dir` changed through us: its kept listing is no longer the directory's.
    fn changed(&self, dir: InodeNo) {
        lock(&self.memory).listings.retain(|l| l.ino != dir);
    }

    /// Keep the last attributes of an inode whose last link may just have gone.
    fn remember_gone(&self, mut attr: Attr) {
        attr.nlink = 0;
        let mut m = lock(&self.memory);
        let ino = attr.ino;
        if m.gone.insert(ino, attr).is_none() {
            m.gone_order.push_back(ino);
        }
        while m.gone_order.len() > GONE_KEPT {
            if let Some(old) = m.gone_order.pop_front() {
                m.gone.remove(&old);
            }
        }
    }

    pub(crate) fn lookup(&self, parent: InodeNo, name: &[u8]) -> StoreResult<Found> {
        if hidden::is_hidden_name(name) {
            check_name(name)?;
            return Err(fs(Errno::ENOENT));
        }
        let name = cname(name)?;
        let dir = self.dir_fd(parent)?;
        let c = self.child(&dir, &name)?;
        let (entry, attr) = self.entry_of(&c)?;
        Ok(Found {
            entry,
            attr: Some(attr),
        })
    }

    /// The attributes of `ino`; for an inode whose last name went through us (a
    /// directory removed, or replaced by a rename, while a process holds it open, as
    /// `fstat` asks then), its last ones with no link, as a local file system answers.
    pub(crate) fn get_attr(&self, ino: InodeNo) -> StoreResult<Attr> {
        match self.inode(ino) {
            Ok(o) => self.opened_attr(ino, &o),
            // Directories only: a file whose last name went is ESTALE, on which the
            // kernel walks the path again (an open unlinked file keeps a hidden name).
            Err(crate::error::StoreError::Fs(e @ (Errno::ESTALE | Errno::ENOENT))) => {
                lock(&self.memory)
                    .gone
                    .get(&ino)
                    .filter(|a| a.kind == FileKind::Directory)
                    .cloned()
                    .ok_or(fs(e))
            }
            Err(e) => Err(e),
        }
    }

    /// Mode, owner, size (regular files only) and times; ctime is the PFS's own.
    pub(crate) fn set_attr(&self, ino: InodeNo, ch: &AttrChange) -> StoreResult<Attr> {
        let o = self.inode(ino)?;
        let kind = kind_of(&o.st)?;
        // Refused before anything changes, so that a refusal leaves the inode as it was.
        if ch.mode.is_some() && kind == FileKind::Symlink {
            return Err(fs(Errno::EOPNOTSUPP));
        }
        if ch.size.is_some() && kind != FileKind::Regular {
            return Err(fs(if kind == FileKind::Directory {
                Errno::EISDIR
            } else {
                Errno::EINVAL
            }));
        }
        if ch.uid.is_some() || ch.gid.is_some() {
            sys::chown_fd(&o.fd, ch.uid, ch.gid)?;
        }
        // After the chown, which clears set-user-ID: the mode asked is the mode kept.
        if let Some(mode) = ch.mode {
            sys::chmod_fd(&o.fd, mode & 0o7777)?;
        }
        // Made as root, the chown and truncate below kept what the PFS would have
        // cleared for the caller: the mode is read again and the bits cleared here.
        if ch.kill_suidgid && kind != FileKind::Directory {
            let mode = sys::fstat(&o.fd)?.st_mode & 0o7777;
            let kill = spillway_types::attr::privilege_bits(mode);
            if kill != 0 {
                sys::chmod_fd(&o.fd, mode & !kill)?;
            }
        }
        if let Some(size) = ch.size {
            let target = match size {
                SizeChange::Set(n) => Some(n),
                SizeChange::AtLeast(n) => {
                    (u64::try_from(o.st.st_size).unwrap_or(0) < n).then_some(n)
                }
            };
            if let Some(n) = target {
                let shown = self.opened_attr(ino, &o)?.size;
                sys::truncate_fd(&o.fd, n)?;
                if let Some(ov) = lock(&self.memory).overlays.get_mut(&ino) {
                    ov.size = ov.size.min(n);
                }
                // The size changes, but only in the cache (its bytes not yet written
                // behind): the PFS file keeps its size, so its truncate moved neither
                // mtime nor ctime. A size change moves both (open O_TRUNC, pjdfstest
                // open/00), unless the caller sets the mtime itself below.
                let pfs_size = u64::try_from(o.st.st_size).unwrap_or(0);
                if shown != n && pfs_size == n && ch.mtime.is_none() {
                    let now = utime(Some(TimeChange::Now));
                    let omit = utime(None);
                    sys::utimens_fd(&o.fd, &[omit, now], false)?;
                }
            }
        }
        if ch.atime.is_some() || ch.mtime.is_some() {
            let times = [utime(ch.atime), utime(ch.mtime)];
            sys::utimens_fd(&o.fd, &times, kind == FileKind::Symlink)?;
            if ch.mtime.is_some() {
                if let Some(ov) = lock(&self.memory).overlays.get_mut(&ino) {
                    ov.mtime = None;
                }
            }
        }
        let st = sys::fstat(&o.fd)?;
        self.ours(ino, &st);
        self.attr_of(ino, &st, o.row.stripe_size, o.row.stripe_width)
    }

    /// Make a node as root, then give it the caller's owner, inherited xattrs and
    /// exact mode (whatever the server's umask); on failure the node is removed.
    pub(crate) fn create(&self, node: &NewNode) -> StoreResult<Attr> {
        let name = cname(&node.name)?;
        let dir = self.dir_fd(node.parent)?;
        // Private until finished: nobody else opens it before it has its owner.
        const FIRST: u32 = 0o600;
        let fd = match node.kind {
            FileKind::Regular => sys::open_at(
                &dir,
                &name,
                libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_WRONLY,
                FIRST,
            )?,
            FileKind::Directory => {
                sys::mkdirat(&dir, &name, 0o700)?;
                self.made(&dir, &name, node.kind)?
            }
            FileKind::Symlink => {
                check_symlink_target(&node.target)?;
                if node.target.is_empty() {
                    return Err(fs(Errno::ENOENT));
                }
                let target = CString::new(node.target.as_slice()).map_err(|_| fs(Errno::EINVAL))?;
                sys::symlinkat(&target, &dir, &name)?;
                self.made(&dir, &name, node.kind)?
            }
            FileKind::Fifo | FileKind::Socket | FileKind::CharDevice | FileKind::BlockDevice => {
                sys::mknodat(
                    &dir,
                    &name,
                    node.kind.mode_bits() | FIRST,
                    u64::from(node.rdev),
                )?;
                self.made(&dir, &name, node.kind)?
            }
        };
        let finish = || -> StoreResult<(Handle, i32)> {
            sys::chown_fd(&fd, Some(node.uid), Some(node.gid))?;
            for (k, v) in &node.xattrs {
                let k = xattr_cname(k)?;
                check_xattr_value(v)?;
                match sys::setxattr_fd(&fd, &k, v, 0) {
                    Ok(()) | Err(Errno::EOPNOTSUPP) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            // Last: setting an access ACL rewrote the group bits; the mode asked wins,
            // and chmod brings the ACL's mask in line with it.
            if node.kind != FileKind::Symlink {
                sys::chmod_fd(&fd, node.mode & 0o7777)?;
            }
            Ok(handles::handle_of(&fd)?)
        };
        let handle = match finish() {
            Ok((h, mount_id)) if mount_id == self.mount_id => h,
            Ok(_) => {
                self.discard(&dir, &name, &fd, node.kind);
                return Err(fs(Errno::EXDEV));
            }
            Err(e) => {
                self.discard(&dir, &name, &fd, node.kind);
                return Err(e);
            }
        };
        let known = self.with_table(|t| {
            let k = t.counter(&handle)?;
            t.set_layout(k.counter, node.stripe_size, node.stripe_width)?;
            Ok(k)
        });
        // Without a number the client never learns of the node: it must not stay.
        let known = known.inspect_err(|_| self.discard(&dir, &name, &fd, node.kind))?;
        let ino = self.ino(known.counter);
        self.changed(node.parent);
        let st = sys::fstat(&fd)?;
        if node.kind == FileKind::Regular {
            // A new file: nothing of it is cached anywhere, its version is agreed.
            self.agree(ino, crate::cache::coherence::PfsVersion::of(&st));
        }
        self.attr_of(ino, &st, node.stripe_size, node.stripe_width)
    }

    /// The node just made at `dir`/`name` by root, opened O_PATH; EEXIST if what is
    /// there now is not it (the name was swapped meanwhile).
    fn made(&self, dir: &OwnedFd, name: &CString, kind: FileKind) -> StoreResult<OwnedFd> {
        let fd = sys::open_at(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        let st = sys::fstat(&fd)?;
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if FileKind::from_mode(st.st_mode) != Some(kind) || st.st_uid != me {
            return Err(fs(Errno::EEXIST));
        }
        Ok(fd)
    }

    /// Remove a node this create made and could not finish, if the name still holds it.
    fn discard(&self, dir: &OwnedFd, name: &CString, fd: &OwnedFd, kind: FileKind) {
        let ours = match (sys::fstat(fd), sys::fstatat_nofollow(dir, name)) {
            (Ok(a), Ok(b)) => same_inode(&a, &b),
            _ => false,
        };
        if ours {
            if let Err(e) = sys::unlinkat(dir, name, kind == FileKind::Directory) {
                tracing::warn!("cache namespace: cannot remove a node whose create failed: {e}");
            }
        }
    }

    /// Whether removing name `c` of `ino` takes the last name of a file open now.
    fn must_hide(&self, c: &Child, ino: InodeNo, by: &By<'_>) -> bool {
        kind_of(&c.st).ok() == Some(FileKind::Regular)
            && c.st.st_nlink == 1
            && !self.is_hidden(ino)
            && by.is_open(ino)
    }

    /// Remove `parent`/`name`; the entry removed, its number from the table. With a
    /// `caller`, the removal itself is made as that user, so the PFS's own checks
    /// (write and search on the directory, the sticky rule) judge whatever the name
    /// holds at that moment, not what the client kernel checked a moment before.
    pub(crate) fn remove_entry(
        &self,
        parent: InodeNo,
        name: &[u8],
        wanted: Expect,
        by: &By<'_>,
    ) -> StoreResult<Entry> {
        let cn = cname(name)?;
        let dir = self.dir_fd(parent)?;
        let c = self.child(&dir, &cn)?;
        let is_dir = kind_of(&c.st)? == FileKind::Directory;
        match (wanted, is_dir) {
            (Expect::NotDir, true) => return Err(fs(Errno::EISDIR)),
            (Expect::Dir, false) => return Err(fs(Errno::ENOTDIR)),
            _ => {}
        }
        let (entry, attr) = self.entry_of(&c)?;
        let hide =
            self.must_hide(&c, entry.ino, by) && self.try_hide(parent, &dir, entry.ino, &c.fd);
        if let Err(e) = as_caller(by.caller, || sys::unlinkat(&dir, &cn, is_dir)) {
            if hide {
                let _ = self.reap(entry.ino);
            }
            return Err(e);
        }
        self.changed(parent);
        self.remember_gone(attr);
        // Its other links, if any, saw its ctime change.
        self.ours_ino(entry.ino);
        Ok(entry)
    }

    /// A hard link of `entry.ino` at `parent`/`name`. `replace` is for renames across
    /// servers, which a cache instance never makes: an existing name answers EXDEV
    /// then, EEXIST otherwise.
    pub(crate) fn insert_entry(
        &self,
        parent: InodeNo,
        name: &[u8],
        entry: &Entry,
        replace: bool,
    ) -> StoreResult<Option<Entry>> {
        let cn = cname(name)?;
        if entry.kind == FileKind::Directory {
            return Err(fs(Errno::EPERM));
        }
        let dir = self.dir_fd(parent)?;
        match sys::fstatat_nofollow(&dir, &cn) {
            Ok(_) => return Err(fs(if replace { Errno::EXDEV } else { Errno::EEXIST })),
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(e.into()),
        }
        let o = self.inode(entry.ino)?;
        if kind_of(&o.st)? == FileKind::Directory {
            return Err(fs(Errno::EPERM));
        }
        sys::link_inode(&o.fd, &dir, &cn)?;
        self.changed(parent);
        self.ours_fd(entry.ino, &o.fd);
        Ok(None)
    }

    pub(crate) fn rename(
        &self,
        old_parent: InodeNo,
        old_name: &[u8],
        new_parent: InodeNo,
        new_name: &[u8],
        mode: RenameMode,
        by: &By<'_>,
    ) -> StoreResult<Renamed> {
        let on = cname(old_name)?;
        let nn = cname(new_name)?;
        let od = self.dir_fd(old_parent)?;
        let nd = self.dir_fd(new_parent)?;
        let moved = self.child(&od, &on)?;
        let target = match self.child(&nd, &nn) {
            Ok(c) => Some(c),
            Err(crate::error::StoreError::Fs(Errno::ENOENT)) => None,
            Err(e) => return Err(e),
        };
        let (moved, _) = self.entry_of(&moved)?;
        let replaced = match &target {
            Some(t) => Some(self.entry_of(t)?),
            None => None,
        };
        let flags = match mode {
            RenameMode::Replace => 0,
            RenameMode::NoReplace => libc::RENAME_NOREPLACE,
            RenameMode::Exchange => libc::RENAME_EXCHANGE,
        };
        // An open file replaced loses its last name: hidden first (hidden.rs).
        let hide = match (&target, &replaced) {
            (Some(t), Some((e, _))) if mode == RenameMode::Replace && e.ino != moved.ino => {
                (self.must_hide(t, e.ino, by) && self.try_hide(new_parent, &nd, e.ino, &t.fd))
                    .then_some(e.ino)
            }
            _ => None,
        };
        if let Err(e) = as_caller(by.caller, || sys::renameat2(&od, &on, &nd, &nn, flags)) {
            if let Some(ino) = hide {
                let _ = self.reap(ino);
            }
            return Err(e);
        }
        self.changed(old_parent);
        self.changed(new_parent);
        // The inodes moved or unlinked saw their ctime change.
        self.ours_ino(moved.ino);
        if let Some((e, _)) = &replaced {
            self.ours_ino(e.ino);
        }
        // Two names of one inode: rename does nothing, and nothing was replaced.
        let replaced = replaced.filter(|(e, _)| mode == RenameMode::Exchange || e.ino != moved.ino);
        if let (RenameMode::Replace, Some((_, attr))) = (mode, &replaced) {
            self.remember_gone(attr.clone());
        }
        Ok(Renamed {
            moved,
            replaced: replaced.map(|(e, _)| e),
        })
    }

    /// The PFS already counted the links: fresh attributes, or, when the inode no
    /// longer opens (its last link went), its last attributes with nlink 0.
    pub(crate) fn link_count(&self, ino: InodeNo, _delta: i32) -> StoreResult<Attr> {
        let row = self.row_of(ino)?;
        match handles::open_handle(
            &self.dir,
            row.handle.kind,
            &row.handle.bytes,
            libc::O_PATH | libc::O_NOFOLLOW,
        ) {
            Ok(fd) => {
                let st = sys::fstat(&fd)?;
                self.attr_of(ino, &st, row.stripe_size, row.stripe_width)
            }
            Err(Errno::ESTALE) | Err(Errno::ENOENT) => lock(&self.memory)
                .gone
                .get(&ino)
                .cloned()
                .ok_or(fs(Errno::ESTALE)),
            Err(e) => Err(e.into()),
        }
    }

    /// The PFS updated the directory itself: its fresh attributes.
    pub(crate) fn touch_dir(&self, ino: InodeNo, _nlink_delta: i32) -> StoreResult<Attr> {
        self.get_attr(ino)
    }

    /// The sorted names of `dir` (open for reading): read afresh for a listing's first
    /// page, kept for its later ones while the directory's times stay the same.
    fn sorted_names(
        &self,
        ino: InodeNo,
        fd: &OwnedFd,
        first_page: bool,
    ) -> StoreResult<Arc<Vec<Vec<u8>>>> {
        let st = sys::fstat(fd)?;
        let stamp = [st.st_mtime, st.st_mtime_nsec, st.st_ctime, st.st_ctime_nsec];
        if !first_page {
            let m = lock(&self.memory);
            let kept = m
                .listings
                .iter()
                .find(|l| l.ino == ino && l.stamp == stamp && l.made.elapsed() < LISTING_TTL);
            if let Some(l) = kept {
                return Ok(l.names.clone());
            }
        }
        let names = spillway_types::files::list_names(fd)?;
        let names = Arc::new(names);
        let mut m = lock(&self.memory);
        m.listings
            .retain(|l| l.ino != ino && l.made.elapsed() < LISTING_TTL);
        m.listings.push_back(Listing {
            ino,
            stamp,
            made: Instant::now(),
            names: names.clone(),
        });
        while m.listings.len() > LISTINGS_KEPT {
            m.listings.pop_front();
        }
        Ok(names)
    }

    /// Names in byte order strictly after `after`, at most `max` (capped at 65536).
    /// Names gone between the listing and their lookup, on another mount, or of a
    /// kind the protocol cannot show are left out.
    pub(crate) fn read_dir(
        &self,
        dir: InodeNo,
        after: &[u8],
        max: u32,
        plus: bool,
    ) -> StoreResult<DirPage> {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        let fd = match self.open_ino(dir, flags) {
            Ok((fd, _)) => fd,
            // A symlink's handle opened for reading.
            Err(crate::error::StoreError::Fs(Errno(libc::ELOOP))) => {
                return Err(fs(Errno::ENOTDIR))
            }
            Err(e) => return Err(e),
        };
        let names = self.sorted_names(dir, &fd, after.is_empty())?;
        let start = names.partition_point(|n| n.as_slice() <= after);
        let max = max.min(MAX_PAGE) as usize;
        let mut found: Vec<(&[u8], Child)> = Vec::new();
        let mut more = false;
        for name in &names[start..] {
            if hidden::is_hidden_name(name) {
                continue;
            }
            if found.len() == max {
                more = true;
                break;
            }
            let Ok(cn) = CString::new(name.as_slice()) else {
                continue;
            };
            match self.child(&fd, &cn) {
                Ok(c) if FileKind::from_mode(c.st.st_mode).is_some() => found.push((name, c)),
                Ok(_) => {}
                Err(crate::error::StoreError::Fs(Errno::ENOENT | Errno::EXDEV)) => {}
                Err(e) => return Err(e),
            }
        }
        let handles: Vec<&Handle> = found.iter().map(|(_, c)| &c.handle).collect();
        let known = self.with_table(|t| t.counters(&handles))?;
        let mut page = DirPage {
            entries: Vec::with_capacity(found.len()),
            attrs: Vec::new(),
            more,
        };
        for ((name, c), k) in found.iter().zip(known) {
            let ino = self.ino(k.counter);
            let attr = self.attr_of(ino, &c.st, k.stripe_size, k.stripe_width)?;
            page.entries.push(NamedEntry {
                name: name.to_vec(),
                entry: Entry {
                    ino,
                    kind: attr.kind,
                },
            });
            if plus {
                page.attrs.push(Some(attr));
            }
        }
        Ok(page)
    }

    pub(crate) fn read_link(&self, ino: InodeNo) -> StoreResult<Vec<u8>> {
        let o = self.inode(ino)?;
        if kind_of(&o.st)? != FileKind::Symlink {
            return Err(fs(Errno::EINVAL));
        }
        Ok(sys::readlink_fd(&o.fd)?)
    }

    pub(crate) fn get_xattr(&self, ino: InodeNo, name: &[u8]) -> StoreResult<Vec<u8>> {
        let name = xattr_cname(name)?;
        let (fd, _) = self.open_ino(ino, libc::O_PATH | libc::O_NOFOLLOW)?;
        Ok(sys::getxattr_fd(&fd, &name)?)
    }

    pub(crate) fn set_xattr(
        &self,
        ino: InodeNo,
        name: &[u8],
        value: &[u8],
        how: XattrMode,
    ) -> StoreResult<()> {
        let cn = xattr_cname(name)?;
        check_xattr_value(value)?;
        let o = self.inode(ino)?;
        let mut flags = 0;
        if how.must_create {
            flags |= libc::XATTR_CREATE;
        }
        if how.must_replace {
            flags |= libc::XATTR_REPLACE;
        }
        sys::setxattr_fd(&o.fd, &cn, value, flags)?;
        // Root wrote the ACL, and root keeps set-group-ID: drop it as the caller's
        // write would have.
        if how.acl_kill_sgid
            && name == b"system.posix_acl_access"
            && kind_of(&o.st)? != FileKind::Symlink
        {
            let st = sys::fstat(&o.fd)?;
            if st.st_mode & libc::S_ISGID != 0 {
                sys::chmod_fd(&o.fd, st.st_mode & 0o7777 & !libc::S_ISGID)?;
            }
        }
        self.ours_fd(ino, &o.fd);
        Ok(())
    }

    pub(crate) fn list_xattrs(&self, ino: InodeNo) -> StoreResult<Vec<Vec<u8>>> {
        let (fd, _) = self.open_ino(ino, libc::O_PATH | libc::O_NOFOLLOW)?;
        let all = sys::listxattr_fd(&fd)?;
        Ok(all
            .split(|&b| b == 0)
            .filter(|n| !n.is_empty())
            .map(<[u8]>::to_vec)
            .collect())
    }

    pub(crate) fn remove_xattr(&self, ino: InodeNo, name: &[u8]) -> StoreResult<()> {
        let name = xattr_cname(name)?;
        let (fd, _) = self.open_ino(ino, libc::O_PATH | libc::O_NOFOLLOW)?;
        sys::removexattr_fd(&fd, &name)?;
        self.ours_fd(ino, &fd);
        Ok(())
    }

    /// The stripe geometry of `ino` (0: the instance's default).
    pub(crate) fn set_layout(
        &self,
        ino: InodeNo,
        stripe_size: u32,
        stripe_width: u16,
    ) -> StoreResult<Attr> {
        let o = self.inode(ino)?;
        if !self.with_table(|t| t.set_layout(ino.counter(), stripe_size, stripe_width))? {
            return Err(fs(Errno::ESTALE));
        }
        self.attr_of(ino, &o.st, stripe_size, stripe_width)
    }

    #[cfg(test)]
    pub(crate) fn extend_size(&self, ino: InodeNo, size: u64, touch: bool) -> StoreResult<Attr> {
        self.extend_size_from(ino, size, touch).map(|(_, a)| a)
    }

    /// Writes absorbed by the cache extend a file before the PFS sees them: the size
    /// (and mtime when `touch`) shown stays at least `size` until an open finds the
    /// write-behind done (`settled_at`) or the copy dropped (`settled`). Memory only.
    /// Returns the attributes shown just before (from the same look at the PFS file)
    /// and after.
    pub(crate) fn extend_size_from(
        &self,
        ino: InodeNo,
        size: u64,
        touch: bool,
    ) -> StoreResult<(Attr, Attr)> {
        let o = self.inode(ino)?;
        let before = self.opened_attr(ino, &o)?;
        if kind_of(&o.st)? == FileKind::Regular {
            let mut m = lock(&self.memory);
            let ov = m.overlays.entry(ino).or_default();
            ov.size = ov.size.max(size);
            if touch {
                let now = Timespec::now();
                ov.mtime = Some(ov.mtime.map_or(now, |t| t.max(now)));
            }
        }
        Ok((before, self.opened_attr(ino, &o)?))
    }

    /// The PFS file of `ino` is all there is of it (coherence at open dropped the
    /// cache's copy): show the PFS's size and mtime again.
    pub(crate) fn settled(&self, ino: InodeNo) {
        lock(&self.memory).overlays.remove(&ino);
    }

    /// For the data side: handle, owner, geometry. Regular files only.
    pub(crate) fn resolve(&self, ino: InodeNo) -> StoreResult<super::Resolved> {
        let o = self.inode(ino)?;
        match kind_of(&o.st)? {
            FileKind::Regular => {}
            FileKind::Directory => return Err(fs(Errno::EISDIR)),
            _ => return Err(fs(Errno::EINVAL)),
        }
        let attr = self.opened_attr(ino, &o)?;
        Ok(super::Resolved {
            handle_type: o.row.handle.kind,
            handle: o.row.handle.bytes,
            uid: attr.uid,
            gid: attr.gid,
            stripe_size: attr.stripe_size,
            stripe_width: attr.stripe_width,
        })
    }

    pub(crate) fn inode_count(&self) -> StoreResult<u64> {
        self.with_table(|t| t.count())
    }

    /// Close the database (later calls answer ESTALE).
    pub(crate) fn close(&self) -> StoreResult<()> {
        let table = lock(&self.table).take();
        drop(table);
        *lock(&self.memory) = Memory::default();
        Ok(())
    }
}

/// `call` made as `caller` (this thread's file-system identity only), or as root.
fn as_caller<T>(
    caller: Option<&Identity>,
    call: impl FnOnce() -> Result<T, Errno>,
) -> StoreResult<T> {
    Ok(match caller {
        Some(id) => as_identity(id, call)??,
        None => call()?,
    })
}

/// The identity a write-behind wears: the owner, with the owner's groups when the
/// user is known on this host.
fn owner_identity(uid: u32, gid: u32) -> Identity {
    let groups = match Identity::of_uid(uid) {
        Ok(id) => id.groups,
        Err(_) => vec![gid],
    };
    Identity { uid, gid, groups }
}

/// `fd`'s inode opened anew with `flags` by user `uid`:`gid`: the kernel checks the
/// user's permission, not root's. The outer error is failing to take on the identity.
fn reopen_as(fd: &OwnedFd, uid: u32, gid: u32, flags: i32) -> StoreResult<Result<OwnedFd, Errno>> {
    let id = owner_identity(uid, gid);
    Ok(as_identity(&id, || sys::reopen(fd, flags))?)
}

/// Open a resolved file on this host (any server of the instance; `mount_fd`: a
/// descriptor on the PFS that is not O_PATH, e.g. the instance directory). Reading:
/// as root. Writing: as the file's owner (so that the PFS sees the owner write, as
/// without the cache), falling back to root when the owner's own modes refuse it.
/// Anything but a regular file is refused (EISDIR, EINVAL) before it is opened for
/// I/O, so a FIFO never blocks the caller.
pub(crate) fn open_resolved(
    mount_fd: &impl AsRawFd,
    r: &super::Resolved,
    write: bool,
) -> StoreResult<File> {
    let fd = handles::open_handle(
        mount_fd,
        r.handle_type,
        &r.handle,
        libc::O_PATH | libc::O_NOFOLLOW,
    )?;
    let st = sys::fstat(&fd)?;
    match FileKind::from_mode(st.st_mode) {
        Some(FileKind::Regular) => {}
        Some(FileKind::Directory) => return Err(fs(Errno::EISDIR)),
        _ => return Err(fs(Errno::EINVAL)),
    }
    if !write {
        return Ok(File::from(sys::reopen(&fd, libc::O_RDONLY)?));
    }
    // The owner now, not when resolved: a chown since moves the write-behind along.
    match reopen_as(&fd, st.st_uid, st.st_gid, libc::O_WRONLY)? {
        Ok(f) => Ok(File::from(f)),
        // The owner's own modes refuse writing (a file made 0444 after its writes were
        // absorbed, as `cp -p` or a job's chmod does): writes the cache already
        // answered must still reach the PFS, and the owner could chmod the file
        // anyway, so root writes them.
        Err(Errno::EACCES) if st.st_uid != 0 => Ok(File::from(sys::reopen(&fd, libc::O_WRONLY)?)),
        Err(e) => Err(e.into()),
    }
}
