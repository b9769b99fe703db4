//! The system calls the namespace makes on the PFS, each relative to a descriptor: a
//! directory and one name (never followed), or an inode's own descriptor (usually
//! O_PATH). What an O_PATH descriptor cannot do directly goes through its procfs
//! magic link `/proc/self/fd/N`, which the kernel resolves to the descriptor's inode
//! itself, whatever it is (a symlink included), never to a path; callers keep the
//! calls that would then act on a symlink's target (chmod, truncate) away from
//! symlinks. Errors are the PFS's errno, unchanged.

use spillway_types::Errno;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

fn last_errno() -> Errno {
    Errno::from_io(&std::io::Error::last_os_error())
}

/// Run a system call until it is not interrupted; a negative result is its errno.
fn retry(mut call: impl FnMut() -> libc::c_long) -> Result<libc::c_long, Errno> {
    loop {
        let rc = call();
        if rc >= 0 {
            return Ok(rc);
        }
        let e = last_errno();
        if e != Errno(libc::EINTR) {
            return Err(e);
        }
    }
}

/// The procfs magic link of one of this process's descriptors.
pub(super) fn proc_path(fd: &impl AsRawFd) -> CString {
    // A decimal number never holds a NUL.
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful open; nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) }
}

/// `openat(dir, name, flags | O_CLOEXEC, mode)`.
pub(super) fn open_at(
    dir: &impl AsRawFd,
    name: &CStr,
    flags: i32,
    mode: u32,
) -> Result<OwnedFd, Errno> {
    let fd = retry(|| {
        // SAFETY: name is NUL-terminated and alive for the call.
        libc::c_long::from(unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                flags | libc::O_CLOEXEC,
                mode,
            )
        })
    })?;
    Ok(owned(fd))
}

/// A new open file description of `fd`'s inode, with `flags`: the way from an O_PATH
/// descriptor to one that reads or writes. No O_NOFOLLOW: the magic link must be
/// followed (to the inode, not a path).
pub(super) fn reopen(fd: &impl AsRawFd, flags: i32) -> Result<OwnedFd, Errno> {
    let p = proc_path(fd);
    let fd = retry(|| {
        // SAFETY: p is NUL-terminated and alive for the call.
        libc::c_long::from(unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC) })
    })?;
    Ok(owned(fd))
}

pub(super) fn fstat(fd: &impl AsRawFd) -> Result<libc::stat, Errno> {
    // SAFETY: stat is plain old data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the empty name with AT_EMPTY_PATH names fd itself (O_PATH allowed); st
    // is a valid out pointer.
    let rc = unsafe {
        libc::fstatat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            &mut st,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(last_errno());
    }
    Ok(st)
}

pub(super) fn fstatat_nofollow(dir: &impl AsRawFd, name: &CStr) -> Result<libc::stat, Errno> {
    // SAFETY: stat is plain old data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: name is NUL-terminated; st is a valid out pointer.
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(last_errno());
    }
    Ok(st)
}

pub(super) fn mkdirat(dir: &impl AsRawFd, name: &CStr, mode: u32) -> Result<(), Errno> {
    retry(|| {
        // SAFETY: name is NUL-terminated and alive for the call.
        libc::c_long::from(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) })
    })?;
    Ok(())
}

pub(super) fn symlinkat(target: &CStr, dir: &impl AsRawFd, name: &CStr) -> Result<(), Errno> {
    retry(|| {
        // SAFETY: both strings are NUL-terminated and alive for the call.
        libc::c_long::from(unsafe {
            libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr())
        })
    })?;
    Ok(())
}

pub(super) fn mknodat(dir: &impl AsRawFd, name: &CStr, mode: u32, rdev: u64) -> Result<(), Errno> {
    retry(|| {
        // SAFETY: name is NUL-terminated and alive for the call.
        libc::c_long::from(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, rdev) })
    })?;
    Ok(())
}

pub(super) fn unlinkat(dir: &impl AsRawFd, name: &CStr, is_dir: bool) -> Result<(), Errno> {
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    retry(|| {
        // SAFETY: name is NUL-terminated and alive for the call.
        libc::c_long::from(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })
    })?;
    Ok(())
}

/// `renameat2` by its system call number (older C libraries lack the wrapper).
pub(super) fn renameat2(
    old_dir: &impl AsRawFd,
    old: &CStr,
    new_dir: &impl AsRawFd,
    new: &CStr,
    flags: u32,
) -> Result<(), Errno> {
    retry(|| {
        // SAFETY: both names are NUL-terminated and alive for the call.
        unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                old_dir.as_raw_fd(),
                old.as_ptr(),
                new_dir.as_raw_fd(),
                new.as_ptr(),
                flags,
            )
        }
    })?;
    Ok(())
}

/// A new name `dir/name` for the inode of `fd`: the magic link followed is the inode
/// itself (a symlink's own inode too), not a path.
pub(super) fn link_inode(fd: &impl AsRawFd, dir: &impl AsRawFd, name: &CStr) -> Result<(), Errno> {
    let p = proc_path(fd);
    retry(|| {
        // SAFETY: both names are NUL-terminated and alive for the call.
        libc::c_long::from(unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                p.as_ptr(),
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        })
    })?;
    Ok(())
}

/// Change the owner and/or group of `fd`'s inode (a symlink's own, with O_PATH).
pub(super) fn chown_fd(fd: &impl AsRawFd, uid: Option<u32>, gid: Option<u32>) -> Result<(), Errno> {
    let uid = uid.unwrap_or(u32::MAX);
    let gid = gid.unwrap_or(u32::MAX);
    retry(|| {
        // SAFETY: the empty name with AT_EMPTY_PATH names fd itself.
        libc::c_long::from(unsafe {
            libc::fchownat(fd.as_raw_fd(), c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH)
        })
    })?;
    Ok(())
}

/// chmod of `fd`'s inode, which must not be a symlink (the call would follow it).
pub(super) fn chmod_fd(fd: &impl AsRawFd, mode: u32) -> Result<(), Errno> {
    let p = proc_path(fd);
    retry(|| {
        // SAFETY: p is NUL-terminated and alive for the call.
        libc::c_long::from(unsafe { libc::chmod(p.as_ptr(), mode) })
    })?;
    Ok(())
}

/// truncate of `fd`'s inode, which must be a regular file.
pub(super) fn truncate_fd(fd: &impl AsRawFd, size: u64) -> Result<(), Errno> {
    let size = libc::off_t::try_from(size).map_err(|_| Errno::EFBIG)?;
    let p = proc_path(fd);
    retry(|| {
        // SAFETY: p is NUL-terminated and alive for the call.
        libc::c_long::from(unsafe { libc::truncate(p.as_ptr(), size) })
    })?;
    Ok(())
}

/// Set the access and modification times of `fd`'s inode (UTIME_OMIT / UTIME_NOW
/// allowed). A symlink's own times through AT_EMPTY_PATH (Linux 5.8+); other kinds
/// through the magic link, which any kernel takes.
pub(super) fn utimens_fd(
    fd: &impl AsRawFd,
    times: &[libc::timespec; 2],
    symlink: bool,
) -> Result<(), Errno> {
    let p = proc_path(fd);
    retry(|| {
        // SAFETY: the names are NUL-terminated; times points at two timespecs; all
        // alive for the call.
        libc::c_long::from(unsafe {
            if symlink {
                libc::utimensat(
                    fd.as_raw_fd(),
                    c"".as_ptr(),
                    times.as_ptr(),
                    libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                )
            } else {
                libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0)
            }
        })
    })?;
    Ok(())
}

/// The target of the symlink `fd` (O_PATH) refers to.
pub(super) fn readlink_fd(fd: &impl AsRawFd) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; 4096];
    loop {
        let n = retry(|| {
            // SAFETY: buf's length is passed; the empty name names fd itself.
            unsafe {
                libc::readlinkat(
                    fd.as_raw_fd(),
                    c"".as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                ) as libc::c_long
            }
        })? as usize;
        // A full buffer may have cut the target: ask again with more room.
        if n < buf.len() || buf.len() >= 1 << 20 {
            buf.truncate(n);
            return Ok(buf);
        }
        buf.resize(buf.len() * 4, 0);
    }
}

/// Call `f(buf)` (a getxattr-like call answering the length it needs or wrote), with
/// a buffer grown until the answer fits.
fn sized(mut f: impl FnMut(&mut [u8]) -> libc::c_long) -> Result<Vec<u8>, Errno> {
    for _ in 0..8 {
        let need = retry(|| f(&mut []))? as usize;
        let mut buf = vec![0u8; need];
        match retry(|| f(&mut buf)) {
            Ok(n) => {
                buf.truncate(n as usize);
                return Ok(buf);
            }
            // It grew between the two calls.
            Err(e) if e == Errno::ERANGE => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Errno::ERANGE)
}

// The xattr calls below are the following variants (getxattr, not lgetxattr) on the
// magic link: that reaches the inode of `fd` itself (a symlink's own attributes for an
// O_PATH symlink descriptor), where the l* variants would reach the procfs link.

pub(super) fn getxattr_fd(fd: &impl AsRawFd, name: &CStr) -> Result<Vec<u8>, Errno> {
    let p = proc_path(fd);
    sized(|buf| {
        // SAFETY: names NUL-terminated; buf's length is passed (0 asks the size).
        unsafe {
            libc::getxattr(
                p.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            ) as libc::c_long
        }
    })
}

pub(super) fn listxattr_fd(fd: &impl AsRawFd) -> Result<Vec<u8>, Errno> {
    let p = proc_path(fd);
    sized(|buf| {
        // SAFETY: p NUL-terminated; buf's length is passed (0 asks the size).
        unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) as libc::c_long }
    })
}

pub(super) fn setxattr_fd(
    fd: &impl AsRawFd,
    name: &CStr,
    value: &[u8],
    flags: i32,
) -> Result<(), Errno> {
    let p = proc_path(fd);
    retry(|| {
        // SAFETY: names NUL-terminated; value's pointer and length describe it.
        libc::c_long::from(unsafe {
            libc::setxattr(
                p.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        })
    })?;
    Ok(())
}

pub(super) fn removexattr_fd(fd: &impl AsRawFd, name: &CStr) -> Result<(), Errno> {
    let p = proc_path(fd);
    retry(|| {
        // SAFETY: both names NUL-terminated and alive for the call.
        libc::c_long::from(unsafe { libc::removexattr(p.as_ptr(), name.as_ptr()) })
    })?;
    Ok(())
}
