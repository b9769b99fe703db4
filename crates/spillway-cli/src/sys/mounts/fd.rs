//! The file-descriptor calls every mount-point check is made of: statx of an fd (its
//! type, mode, owner and mount id), opening a name relative to its directory without
//! following links, and making a directory `0755` whatever the umask. Kept apart so
//! that the agent's walk (`site::agent::mount_root`) and the mount table's reader
//! (`table`) share one set of `unsafe` calls, each with its SAFETY line.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

/// What statx tells about an fd.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    pub mode: u32,
    pub uid: u32,
    pub mnt_id: u64,
}

impl Stat {
    pub fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }
    pub fn what(&self) -> &'static str {
        match self.kind() {
            libc::S_IFLNK => "a symbolic link",
            libc::S_IFDIR => "a directory",
            libc::S_IFREG => "a regular file",
            _ => "not a directory",
        }
    }
}

/// `b` as a C string; `what` names the path in the error.
pub fn cstr(b: &[u8], what: &Path) -> Result<CString, String> {
    CString::new(b).map_err(|_| format!("{}: a path with a NUL byte", what.display()))
}

/// statx of an fd itself. `AT_STATX_DONT_SYNC`: FUSE answers from its cache, so a hung
/// or dead client cannot block the agent here.
pub fn stat_fd(fd: BorrowedFd) -> io::Result<Stat> {
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
pub fn open_at(dir: BorrowedFd, name: &CStr) -> io::Result<OwnedFd> {
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

/// A path as an O_PATH fd, links followed (`/`, and the parent of a path root's own
/// tools name).
pub fn open_path(p: &CStr) -> io::Result<OwnedFd> {
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
pub fn mkdir_at(dir: BorrowedFd, name: &CStr) -> io::Result<()> {
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

/// `name` in `dir` (`path` is its full path, for messages) opened as `open_at` does,
/// with its statx. A missing one is made (`mkdir_at`) when `create`, else None.
pub fn open_checked(
    dir: BorrowedFd,
    name: &CStr,
    path: &Path,
    create: bool,
) -> Result<Option<(OwnedFd, Stat)>, String> {
    let fd = match open_at(dir, name) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            if !create {
                return Ok(None);
            }
            mkdir_at(dir, name).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
            open_at(dir, name)
        }
        r => r,
    }
    .map_err(|e| format!("{}: {e}", path.display()))?;
    let st = stat_fd(fd.as_fd()).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some((fd, st)))
}
