//! Mount points and mounting helpers shared by the agent (root, on paths the manager
//! names), `spillway local` and the developer's `spillway cluster`/`umount`.
//!
//! Two rules hold here:
//! * **Where root mounts.** The agent mounts only below its own `mount_root`. The root
//!   and each of its ancestors must be root-owned directories not writable by group or
//!   other (an ancestor may be if it is sticky, like `/tmp`: its child must then still be
//!   root's). Below the root every component is opened relative to its parent with
//!   `O_NOFOLLOW` (never through a symbolic link), created `0755` by root if missing, and
//!   must be a root-owned directory not writable by group or other on the same mount as
//!   the root. A path that passes is made only of directories no user can change, so the
//!   path given to mount(2) later still names the same directory.
//! * **What is mounted.** The kernel decides, never a path string: a directory is a
//!   mount point when its mount id (statx `STATX_MNT_ID`) differs from its parent's, and
//!   it is Spillway's when `/proc/self/mountinfo` lists that mount id as a FUSE mount of
//!   source `spillway:<instance>`.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The agent's `mount_root` unless `agent.conf` names another.
pub const DEFAULT_MOUNT_ROOT: &str = "/var/opt/spillway/mounts";

/// A stack deeper than this at one mount point is not ours to unwind.
const MAX_STACKED: usize = 64;

/// How long an unmounted client gets to exit on its own before SIGTERM.
const CLIENT_EXIT_WAIT: Duration = Duration::from_secs(15);

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub id: u64,
    pub mount_point: String,
    pub fstype: String,
    pub source: String,
    pub options: String,
}

impl MountEntry {
    /// A Spillway FUSE mount (`spillway mount` sets fsname `spillway:<instance>` and
    /// subtype `spillway`).
    pub fn is_spillway(&self) -> bool {
        (self.fstype == "fuse.spillway" || self.fstype == "fuse")
            && self.source.starts_with("spillway:")
    }
}

/// What the kernel has at a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mounted {
    /// A plain directory: nothing mounted on it.
    No,
    /// A Spillway FUSE mount (the topmost one if mounts are stacked).
    Spillway(MountEntry),
    /// Something else is mounted there.
    Other(MountEntry),
}

/// What statx tells about an fd.
#[derive(Debug, Clone, Copy)]
struct Stat {
    mode: u32,
    uid: u32,
    mnt_id: u64,
}

impl Stat {
    fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }
    fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }
    fn what(&self) -> &'static str {
        match self.kind() {
            libc::S_IFLNK => "a symbolic link",
            libc::S_IFDIR => "a directory",
            libc::S_IFREG => "a regular file",
            _ => "not a directory",
        }
    }
}

fn cstr(b: &[u8], what: &Path) -> Result<CString, String> {
    CString::new(b).map_err(|_| format!("{}: a path with a NUL byte", what.display()))
}

/// statx of an fd itself. `AT_STATX_DONT_SYNC`: FUSE answers from its cache, so a hung
/// or dead client cannot block the agent here.
fn stat_fd(fd: BorrowedFd) -> io::Result<Stat> {
    // SAFETY: statx is plain data; all zeroes is a valid value.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open, the path is an empty NUL-terminated string and sx is a valid
    // out pointer.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE | libc::STATX_MODE | libc::STATX_UID | libc::STATX_MNT_ID,
            &mut sx,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if sx.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the kernel gives no mount id (statx STATX_MNT_ID needs Linux 5.8)",
        ));
    }
    Ok(Stat {
        mode: u32::from(sx.stx_mode),
        uid: sx.stx_uid,
        mnt_id: sx.stx_mnt_id,
    })
}

/// `name` in `dir` as an O_PATH fd, never following a symbolic link (a link gives the
/// link itself, which the caller's type check refuses).
fn open_at(dir: BorrowedFd, name: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: dir is open and name NUL-terminated.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by openat and is owned here only.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_path(p: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: p is NUL-terminated.
    let fd = unsafe { libc::open(p.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by open and is owned here only.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// mkdir `name` in `dir` as mode 0755 whatever the umask. EEXIST (another process was
/// first) is fine: the caller opens and checks what is there.
fn mkdir_at(dir: BorrowedFd, name: &CStr) -> io::Result<()> {
    // SAFETY: dir is open and name NUL-terminated.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) } != 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::EEXIST) {
            Ok(())
        } else {
            Err(e)
        };
    }
    // The umask may have taken bits away: users must be able to reach their mounts.
    // SAFETY: as above; O_NOFOLLOW|O_DIRECTORY opens only the directory just made.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by openat and is owned here only.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fchmod on an fd we own.
    if unsafe { libc::fchmod(fd.as_raw_fd(), 0o755) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The check every directory of the path passes: a directory, root's, and not writable
/// by group or other (unless `sticky_ok` and the sticky bit is set: then only the owner
/// of an entry may replace it, and the next component is checked to be root's).
fn check_dir(st: &Stat, path: &Path, sticky_ok: bool) -> Result<(), String> {
    if !st.is_dir() {
        return Err(format!(
            "{} is {}, not a directory: refusing to mount through it",
            path.display(),
            st.what()
        ));
    }
    if st.uid != 0 {
        return Err(format!(
            "{} is owned by uid {}, not root: refusing to mount through it",
            path.display(),
            st.uid
        ));
    }
    let writable = st.mode & 0o022 != 0;
    let sticky = st.mode & libc::S_ISVTX != 0;
    if writable && !(sticky_ok && sticky) {
        return Err(format!(
            "{} is writable by group or other (mode {:o}): refusing to mount through it",
            path.display(),
            st.mode & 0o7777
        ));
    }
    Ok(())
}

/// The components of `p` after `root`, by component: `p` must be absolute, without `.`,
/// `..` or empty components, and strictly below `root`. None: not below it.
pub fn below<'a>(root: &Path, p: &'a Path) -> Result<Option<Vec<&'a [u8]>>, String> {
    let bytes = p.as_os_str().as_bytes();
    let Some(rest) = bytes.strip_prefix(b"/") else {
        return Err(format!("mount point {} is not absolute", p.display()));
    };
    let parts: Vec<&[u8]> = rest.split(|b| *b == b'/').collect();
    if parts
        .iter()
        .any(|c| c.is_empty() || *c == b"." || *c == b"..")
    {
        return Err(format!(
            "mount point {} has an empty, . or .. component",
            p.display()
        ));
    }
    let root: Vec<&[u8]> = root
        .as_os_str()
        .as_bytes()
        .split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    if parts.len() <= root.len() || parts[..root.len()] != root[..] {
        return Ok(None);
    }
    Ok(Some(parts[root.len()..].to_vec()))
}

/// The agent's mount root, opened and checked (see the module's comment).
pub struct MountRoot {
    /// As configured (what the manager's paths start with).
    configured: PathBuf,
    /// With symbolic links of its ancestors resolved: where mounts really go.
    pub path: PathBuf,
    fd: OwnedFd,
    mnt_id: u64,
}

/// A mount point below the root, walked and checked.
pub struct MountPoint {
    /// Its full path (below the resolved root).
    pub path: PathBuf,
    parent: OwnedFd,
    name: CString,
    /// What is mounted there now.
    pub mounted: Mounted,
}

impl MountRoot {
    /// Open `configured` (absolute), creating what is missing as root 0755, and check
    /// it and every ancestor.
    pub fn open(configured: &Path) -> Result<MountRoot, String> {
        if !configured.is_absolute() {
            return Err(format!(
                "mount_root {} is not absolute",
                configured.display()
            ));
        }
        if configured
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(format!(
                "mount_root {} has a .. component",
                configured.display()
            ));
        }
        // Resolve the existing part (an admin's symlink such as /var/run → /run is
        // fine: every directory of the result is checked below), keep the rest.
        let mut existing = configured.to_path_buf();
        let mut missing = Vec::new();
        while std::fs::symlink_metadata(&existing).is_err() {
            match (existing.file_name(), existing.parent()) {
                (Some(n), Some(p)) => {
                    missing.push(n.to_os_string());
                    existing = p.to_path_buf();
                }
                _ => break,
            }
        }
        let mut path = std::fs::canonicalize(&existing)
            .map_err(|e| format!("mount_root {}: {e}", existing.display()))?;
        for n in missing.iter().rev() {
            path.push(n);
        }
        let parts: Vec<&[u8]> = path
            .as_os_str()
            .as_bytes()
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty())
            .collect();
        let mut fd = open_path(c"/").map_err(|e| format!("/: {e}"))?;
        let st = stat_fd(std::os::fd::AsFd::as_fd(&fd)).map_err(|e| format!("/: {e}"))?;
        let mut at = PathBuf::from("/");
        check_dir(&st, &at, true)?;
        let mut mnt_id = st.mnt_id;
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            at.push(OsStr::from_bytes(part));
            let name = cstr(part, &at)?;
            let dir = std::os::fd::AsFd::as_fd(&fd);
            let next = match open_at(dir, &name) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    mkdir_at(dir, &name)
                        .map_err(|e| format!("cannot create {}: {e}", at.display()))?;
                    open_at(dir, &name)
                }
                r => r,
            }
            .map_err(|e| format!("{}: {e}", at.display()))?;
            let st = stat_fd(std::os::fd::AsFd::as_fd(&next))
                .map_err(|e| format!("{}: {e}", at.display()))?;
            // The root itself is never writable by others, even sticky: users could
            // otherwise make the directories the agent later refuses.
            check_dir(&st, &at, !last)?;
            mnt_id = st.mnt_id;
            fd = next;
        }
        Ok(MountRoot {
            configured: configured.to_path_buf(),
            path,
            fd,
            mnt_id,
        })
    }

    /// Whether `p` lies strictly below this root (as configured or resolved).
    pub fn contains(&self, p: &Path) -> bool {
        self.relative(p).is_ok()
    }

    /// The components of `p` below this root (as configured or resolved).
    fn relative<'a>(&self, p: &'a Path) -> Result<Vec<&'a [u8]>, String> {
        if let Some(r) = below(&self.configured, p)? {
            return Ok(r);
        }
        if let Some(r) = below(&self.path, p)? {
            return Ok(r);
        }
        Err(format!(
            "mount point {} is not below this node's mount root {}: refused",
            p.display(),
            self.configured.display()
        ))
    }

    /// Walk from the root to `p`, creating missing directories when `create` (None when
    /// one is missing and not `create`), checking each, and tell what is mounted at `p`.
    pub fn walk(&self, p: &Path, create: bool) -> Result<Option<MountPoint>, String> {
        let rel = self.relative(p)?;
        let mut path = self.path.clone();
        let mut parent = open_path(c"/").map_err(|e| format!("/: {e}"))?;
        // A second handle on the root: OwnedFd has no cheap clone without a syscall.
        let mut cur = self
            .fd
            .try_clone()
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        let mut name = CString::default();
        let mut mounted = Mounted::No;
        for (i, part) in rel.iter().enumerate() {
            let last = i + 1 == rel.len();
            path.push(OsStr::from_bytes(part));
            let n = cstr(part, &path)?;
            let dir = std::os::fd::AsFd::as_fd(&cur);
            let fd = match open_at(dir, &n) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    if !create {
                        return Ok(None);
                    }
                    mkdir_at(dir, &n)
                        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                    open_at(dir, &n)
                }
                r => r,
            }
            .map_err(|e| format!("{}: {e}", path.display()))?;
            let st = stat_fd(std::os::fd::AsFd::as_fd(&fd))
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if st.mnt_id != self.mnt_id {
                let entry =
                    mount_entry(st.mnt_id).map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
                if !last {
                    return Err(format!(
                        "{} is a mount point ({}): refusing to mount inside another mount",
                        path.display(),
                        describe(entry.as_ref(), st.mnt_id)
                    ));
                }
                mounted = match entry {
                    Some(e) if e.is_spillway() => Mounted::Spillway(e),
                    Some(e) => Mounted::Other(e),
                    None => {
                        return Err(format!(
                            "{}: mount {} is not in /proc/self/mountinfo",
                            path.display(),
                            st.mnt_id
                        ))
                    }
                };
            } else {
                check_dir(&st, &path, false)?;
            }
            if last {
                name = n;
            }
            parent = cur;
            cur = fd;
        }
        Ok(Some(MountPoint {
            path,
            parent,
            name,
            mounted,
        }))
    }

    /// Make `p` ready for a mount: walked, created and checked. Fails if anything but a
    /// Spillway mount is mounted there.
    pub fn prepare(&self, p: &Path) -> Result<MountPoint, String> {
        let mp = self
            .walk(p, true)?
            .ok_or_else(|| format!("{} vanished while being created", p.display()))?;
        if let Mounted::Other(e) = &mp.mounted {
            return Err(format!(
                "{}: {} is mounted there, not Spillway: refusing to mount over it",
                mp.path.display(),
                describe(Some(e), e.id)
            ));
        }
        Ok(mp)
    }

    /// Remove everything at `p`: every Spillway mount stacked there, the client
    /// process of `pidfile`, and the directory. Something else mounted there is an error.
    pub fn unmount(&self, p: &Path, pidfile: Option<&Path>) -> Result<(), String> {
        // A path the walk refuses (a symlink, someone else's directory, another
        // mount on the way) is one this agent never mounted on: nothing to take down
        // there, and nothing to remove.
        let walk = |what: &str| match self.walk(p, false) {
            Ok(mp) => mp,
            Err(e) => {
                tracing::info!("{e}: nothing of ours {what}");
                None
            }
        };
        for _ in 0..MAX_STACKED {
            let Some(mp) = walk("to unmount") else {
                break;
            };
            match &mp.mounted {
                Mounted::No => break,
                Mounted::Other(e) => {
                    return Err(format!(
                        "{}: {} is mounted there, not Spillway: left alone",
                        mp.path.display(),
                        describe(Some(e), e.id)
                    ))
                }
                // The walk checked every directory of the path: the path names this
                // mount (no user can change any of its directories).
                Mounted::Spillway(_) => umount_once(&mp.path)?,
            }
        }
        let mp = walk("to remove");
        if let Some(mp) = &mp {
            if mp.mounted != Mounted::No {
                return Err(format!(
                    "{} is still mounted after {MAX_STACKED} unmounts",
                    mp.path.display()
                ));
            }
        }
        if let Some(pf) = pidfile {
            stop_client(pf)?;
        }
        if let Some(mp) = mp {
            // SAFETY: parent is an open directory fd, name NUL-terminated.
            let r = unsafe {
                libc::unlinkat(mp.parent.as_raw_fd(), mp.name.as_ptr(), libc::AT_REMOVEDIR)
            };
            if r != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::ENOENT) {
                    tracing::warn!("cannot remove mount point {}: {e}", mp.path.display());
                }
            }
        }
        Ok(())
    }
}

fn describe(e: Option<&MountEntry>, id: u64) -> String {
    match e {
        Some(e) => format!("{} {} (mount {})", e.fstype, e.source, e.id),
        None => format!("mount {id}"),
    }
}

/// Unmount the topmost mount at `path` without following a final symlink; a busy one
/// is detached (its open files keep working, new lookups do not reach it).
fn umount_once(path: &Path) -> Result<(), String> {
    let c = cstr(path.as_os_str().as_bytes(), path)?;
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::UMOUNT_NOFOLLOW) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EBUSY) {
        return Err(format!("cannot unmount {}: {e}", path.display()));
    }
    tracing::warn!("{} busy ({e}); detaching it lazily", path.display());
    // SAFETY: as above.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) } != 0 {
        let e = io::Error::last_os_error();
        return Err(format!("cannot detach {}: {e}", path.display()));
    }
    Ok(())
}

/// Unmount the topmost mount at `path` only if nothing uses it (no open file, working
/// directory or mount inside it): false when it is busy, and then it stays as it is.
/// For a dead mount (its client gone): detaching one that processes still hold would
/// leave them on a dead file system under a mount point that looks fine again.
/// `path` must have been walked (`MountRoot::walk`) like `umount_once`'s.
pub fn umount_if_idle(path: &Path) -> Result<bool, String> {
    let c = cstr(path.as_os_str().as_bytes(), path)?;
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::UMOUNT_NOFOLLOW) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EBUSY) {
        return Ok(false);
    }
    Err(format!("cannot unmount {}: {e}", path.display()))
}

fn parse_mountinfo_line(l: &str) -> Option<MountEntry> {
    let (left, right) = l.split_once(" - ")?;
    let mut f = left.split(' ');
    let id = f.next()?.parse().ok()?;
    let _parent = f.next()?;
    let _dev = f.next()?;
    let _root = f.next()?;
    let mount_point = unescape(f.next()?);
    let options = f.next()?.to_string();
    let mut r = right.split(' ');
    let fstype = r.next()?.to_string();
    let source = unescape(r.next()?);
    Some(MountEntry {
        id,
        mount_point,
        fstype,
        source,
        options,
    })
}

/// mountinfo's escapes (`\ooo` octal for space, tab, newline, backslash): the client's
/// reader of the same table.
use spillway_client::mount::unescape_mountinfo as unescape;

/// The mount table's entry for mount `id`.
pub fn mount_entry(id: u64) -> io::Result<Option<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text
        .lines()
        .filter_map(parse_mountinfo_line)
        .find(|e| e.id == id))
}

/// What the kernel has at `path` (None: nothing there). For the developer's tools and
/// `spillway local`, on paths root gave them: the parent is opened as given (following
/// links), the last component never.
pub fn mount_state(path: &Path) -> Result<Option<Mounted>, String> {
    let name = path
        .file_name()
        .ok_or_else(|| format!("{} names no directory", path.display()))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let pc = cstr(parent.as_os_str().as_bytes(), parent)?;
    let pfd = match open_path(&pc) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        r => r.map_err(|e| format!("{}: {e}", parent.display()))?,
    };
    let n = cstr(name.as_bytes(), path)?;
    let fd = match open_at(std::os::fd::AsFd::as_fd(&pfd), &n) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        r => r.map_err(|e| format!("{}: {e}", path.display()))?,
    };
    let pst = stat_fd(std::os::fd::AsFd::as_fd(&pfd))
        .map_err(|e| format!("{}: {e}", parent.display()))?;
    let st =
        stat_fd(std::os::fd::AsFd::as_fd(&fd)).map_err(|e| format!("{}: {e}", path.display()))?;
    if st.mnt_id == pst.mnt_id {
        return Ok(Some(Mounted::No));
    }
    match mount_entry(st.mnt_id).map_err(|e| format!("/proc/self/mountinfo: {e}"))? {
        Some(e) if e.is_spillway() => Ok(Some(Mounted::Spillway(e))),
        Some(e) => Ok(Some(Mounted::Other(e))),
        None => Err(format!(
            "{}: mount {} is not in /proc/self/mountinfo",
            path.display(),
            st.mnt_id
        )),
    }
}

/// Whether a Spillway FUSE mount is at `path` (the kernel's word, never a string match).
pub fn is_mounted(path: &Path) -> bool {
    matches!(mount_state(path), Ok(Some(Mounted::Spillway(_))))
}

/// Unmount every Spillway mount stacked at `path` and stop the client of `pidfile`
/// (root's tools; the agent uses `MountRoot::unmount`). Something else mounted there
/// is an error.
pub fn unmount(path: &Path, pidfile: Option<&Path>) -> Result<(), String> {
    for _ in 0..MAX_STACKED {
        match mount_state(path)? {
            Some(Mounted::Spillway(_)) => umount_once(path)?,
            Some(Mounted::Other(e)) => {
                return Err(format!(
                    "{}: {} is mounted there, not Spillway: left alone",
                    path.display(),
                    describe(Some(&e), e.id)
                ))
            }
            _ => break,
        }
    }
    if is_mounted(path) {
        return Err(format!(
            "{} is still mounted after {MAX_STACKED} unmounts",
            path.display()
        ));
    }
    if let Some(pf) = pidfile {
        stop_client(pf)?;
    }
    Ok(())
}

/// Stop the FUSE client whose pid `pidfile` holds (a file in a root-only directory, so
/// its content is trusted) once it is verified to be that mount's client: a
/// `spillway mount` writing that very pidfile. It normally exits by itself once its
/// mount is gone; it gets CLIENT_EXIT_WAIT, then SIGTERM, then SIGKILL.
pub fn stop_client(pidfile: &Path) -> Result<(), String> {
    let pid = match std::fs::read_to_string(pidfile) {
        Ok(s) => s.trim().parse::<i32>().ok().filter(|p| *p > 0),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("{}: {e}", pidfile.display())),
    };
    let Some(pid) = pid else {
        let _ = std::fs::remove_file(pidfile);
        return Ok(());
    };
    // A pidfd pins the process: the checks and signals below reach the same one even
    // if the pid were reused.
    // SAFETY: pidfd_open(pid, 0) has no memory arguments.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        // ESRCH: already gone.
        let _ = std::fs::remove_file(pidfile);
        return Ok(());
    }
    // SAFETY: the kernel just returned this fd to us.
    let pidfd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    if !is_client_of(pid, pidfile) {
        tracing::warn!(
            pid,
            "{}: the process is not this mount's client: not stopped",
            pidfile.display()
        );
        let _ = std::fs::remove_file(pidfile);
        return Ok(());
    }
    let signal = |sig: i32| {
        // SAFETY: pidfd_send_signal with a valid pidfd and no siginfo.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    };
    let exited = |wait: Duration| {
        let mut p = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, left.as_millis().min(60_000) as i32) };
            if r > 0 {
                return true;
            }
            if r == 0 || Instant::now() >= deadline {
                return false;
            }
        }
    };
    if !exited(CLIENT_EXIT_WAIT) {
        signal(libc::SIGTERM);
        if !exited(Duration::from_secs(10)) {
            signal(libc::SIGKILL);
            if !exited(Duration::from_secs(10)) {
                return Err(format!(
                    "client {pid} of {} does not exit",
                    pidfile.display()
                ));
            }
        }
    }
    // A child of ours (spillway cluster's foreground mounts are not) would stay a zombie.
    // SAFETY: waitpid with WNOHANG; harmless if it is not our child.
    unsafe {
        let mut st = 0;
        libc::waitpid(pid, &mut st, libc::WNOHANG);
    }
    let _ = std::fs::remove_file(pidfile);
    Ok(())
}

/// Whether process `pid` is `spillway mount ... --pidfile <pidfile> ...`.
pub fn is_client_of(pid: i32, pidfile: &Path) -> bool {
    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
    let want = pidfile.as_os_str().as_bytes();
    args.get(1) == Some(&&b"mount"[..])
        && args
            .windows(2)
            .any(|w| w[0] == b"--pidfile" && w[1] == want)
}

pub fn alive(pid: i32) -> bool {
    // A zombie child of ours still "exists": reap it first.
    // SAFETY: waitpid with WNOHANG on a pid; harmless if it is not our child.
    unsafe {
        let mut st = 0;
        libc::waitpid(pid, &mut st, libc::WNOHANG);
    }
    // SAFETY: signal 0 only checks existence.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    // An exited process that is not our child stays a zombie until its parent (often
    // init) reaps it: it is gone for our purposes.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z') | Some('X') | None)
}

pub fn stop_pid(pid: i32, first: i32) {
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid, first) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(pid) {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        while alive(pid) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{chown, PermissionsExt};

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    #[test]
    fn below_is_by_component() {
        let r = p("/m/root");
        assert_eq!(
            below(r, p("/m/root/a/b")).unwrap(),
            Some(vec![&b"a"[..], &b"b"[..]])
        );
        assert_eq!(below(r, p("/m/root")).unwrap(), None);
        assert_eq!(below(r, p("/m/rootx/a")).unwrap(), None);
        assert_eq!(below(r, p("/m")).unwrap(), None);
        assert_eq!(
            below(p("/m/root/"), p("/m/root/a")).unwrap(),
            Some(vec![&b"a"[..]])
        );
        for bad in [
            "/m/root/./a",
            "/m/root/../x",
            "/m/root//a",
            "/m/root/a/",
            "m/root/a",
        ] {
            assert!(below(r, p(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn mountinfo_lines_parse() {
        let l = "812 29 0:77 / /tmp/a\\040b rw,nosuid,nodev,relatime shared:400 - fuse.spillway spillway:12 rw,user_id=0";
        let e = parse_mountinfo_line(l).unwrap();
        assert_eq!(e.id, 812);
        assert_eq!(e.mount_point, "/tmp/a b");
        assert_eq!(e.fstype, "fuse.spillway");
        assert_eq!(e.source, "spillway:12");
        assert!(e.options.contains("nosuid"));
        assert!(e.is_spillway());
        let l = "30 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw";
        assert!(!parse_mountinfo_line(l).unwrap().is_spillway());
        assert!(parse_mountinfo_line("garbage").is_none());
        assert_eq!(unescape("/x\\011y\\134z"), "/x\ty\\z");
        assert_eq!(unescape("/bad\\9"), "/bad\\9");
    }

    /// A directory of one test's own (0755).
    fn scratch(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("spillway-mountpoint-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    fn as_root() -> bool {
        // SAFETY: geteuid has no arguments.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn the_walk_creates_checks_and_refuses() {
        if !as_root() {
            eprintln!("skipped: needs root (ancestors of the temp dir are root's)");
            return;
        }
        let d = scratch("walk");
        let root = d.join("mounts");
        let r = MountRoot::open(&root).unwrap();
        let md = std::fs::metadata(&root).unwrap();
        assert!(md.is_dir());
        assert_eq!(md.permissions().mode() & 0o7777, 0o755);

        // Created component by component, 0755, not mounted.
        let mp = r
            .walk(&root.join("batch/1_striped_scratch"), true)
            .unwrap()
            .unwrap();
        assert_eq!(mp.mounted, Mounted::No);
        assert_eq!(mp.path, root.join("batch/1_striped_scratch"));
        let m = std::fs::metadata(root.join("batch")).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o755);
        // Without create, a missing one is None.
        assert!(r.walk(&root.join("nope/x"), false).unwrap().is_none());

        // Not below the root: refused.
        let e = r.walk(&d.join("elsewhere"), true).err().unwrap();
        assert!(e.contains("not below"), "{e}");
        let e = r.walk(&root, true).err().unwrap();
        assert!(e.contains("not below"), "{e}");

        // A symlink anywhere in the path: refused, nothing created at its target.
        let target = d.join("target");
        std::fs::create_dir(&target).unwrap();
        std::os::unix::fs::symlink(&target, root.join("link")).unwrap();
        for p in [root.join("link"), root.join("link/x")] {
            let e = r.walk(&p, true).err().unwrap();
            assert!(e.contains("symbolic link"), "{e}");
        }
        assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);

        // A component owned by someone else, or writable by others: refused.
        std::fs::create_dir(root.join("theirs")).unwrap();
        chown(root.join("theirs"), Some(1234), None).unwrap();
        let e = r.walk(&root.join("theirs/x"), true).err().unwrap();
        assert!(e.contains("owned by uid 1234"), "{e}");
        assert!(!root.join("theirs/x").exists());
        let e = r.walk(&root.join("theirs"), true).err().unwrap();
        assert!(e.contains("owned by uid 1234"), "{e}");
        std::fs::create_dir(root.join("open")).unwrap();
        std::fs::set_permissions(root.join("open"), std::fs::Permissions::from_mode(0o1777))
            .unwrap();
        let e = r.walk(&root.join("open/x"), true).err().unwrap();
        assert!(e.contains("writable"), "{e}");
        // A file in the way.
        std::fs::write(root.join("file"), b"x").unwrap();
        let e = r.walk(&root.join("file/x"), true).err().unwrap();
        assert!(e.contains("regular file"), "{e}");

        // Unmount of a plain directory removes it; of a missing one is a no-op.
        r.unmount(&root.join("batch/1_striped_scratch"), None)
            .unwrap();
        assert!(!root.join("batch/1_striped_scratch").exists());
        r.unmount(&root.join("batch/1_striped_scratch"), None)
            .unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_root_and_its_ancestors_are_checked() {
        if !as_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let d = scratch("root");
        // A user-owned ancestor.
        let user = d.join("user");
        std::fs::create_dir(&user).unwrap();
        chown(&user, Some(1234), Some(1234)).unwrap();
        let e = MountRoot::open(&user.join("mounts")).err().unwrap();
        assert!(e.contains("owned by uid 1234"), "{e}");
        assert!(!user.join("mounts").exists());
        // A world-writable root, sticky or not.
        let ww = d.join("ww");
        std::fs::create_dir(&ww).unwrap();
        std::fs::set_permissions(&ww, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = MountRoot::open(&ww).err().unwrap();
        assert!(e.contains("writable"), "{e}");
        // A sticky world-writable ancestor with a root-owned child is fine (/tmp).
        MountRoot::open(&ww.join("mounts")).unwrap();
        // A non-sticky group-writable ancestor is not.
        let gw = d.join("gw");
        std::fs::create_dir(&gw).unwrap();
        std::fs::set_permissions(&gw, std::fs::Permissions::from_mode(0o775)).unwrap();
        let e = MountRoot::open(&gw.join("mounts")).err().unwrap();
        assert!(e.contains("writable"), "{e}");
        // A root symlink to a good directory resolves; mount points below it are
        // accepted by either name.
        std::os::unix::fs::symlink(ww.join("mounts"), d.join("alias")).unwrap();
        let r = MountRoot::open(&d.join("alias")).unwrap();
        assert_eq!(r.path, ww.join("mounts"));
        let mp = r.walk(&d.join("alias/a"), true).unwrap().unwrap();
        assert_eq!(mp.path, ww.join("mounts/a"));
        assert!(r.walk(&ww.join("mounts/a"), false).unwrap().is_some());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_plain_directory_is_not_mounted_and_a_mount_point_is_seen() {
        let d = scratch("state");
        assert_eq!(mount_state(&d).unwrap(), Some(Mounted::No));
        assert!(!is_mounted(&d));
        assert_eq!(mount_state(&d.join("missing")).unwrap(), None);
        // /proc is a mount point of its own, not Spillway's.
        match mount_state(p("/proc")).unwrap() {
            Some(Mounted::Other(e)) => assert_eq!(e.fstype, "proc"),
            other => panic!("{other:?}"),
        }
        let e = unmount(p("/proc"), None).err().unwrap();
        assert!(e.contains("not Spillway"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
