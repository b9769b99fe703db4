//! The system calls beneath a PFS root, for `Pfs` (mod.rs): `openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` relative to the root's descriptor, the
//! `*at` calls relative to an opened parent directory, stat, readlink and listing,
//! and errnos turned into what a user should read. Every unsafe block is here or in
//! mod.rs, each with its SAFETY line.

use crate::stage::Failure;
use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What a PFS entry is, as `lstat` saw it.
#[derive(Clone, Debug)]
pub(crate) struct PfsStat {
    pub kind: u32,
    pub size: u64,
    pub mode: u32,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ino: u64,
}

impl PfsStat {
    fn of(st: &libc::stat) -> PfsStat {
        PfsStat {
            kind: st.st_mode & libc::S_IFMT,
            size: st.st_size as u64,
            mode: st.st_mode & 0o7777,
            atime: (st.st_atime, st.st_atime_nsec as u32),
            mtime: (st.st_mtime, st.st_mtime_nsec as u32),
            ino: st.st_ino,
        }
    }
    pub(crate) fn is_file(&self) -> bool {
        self.kind == libc::S_IFREG
    }
    pub(crate) fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }
    pub(crate) fn is_symlink(&self) -> bool {
        self.kind == libc::S_IFLNK
    }
}

pub(super) fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

pub(super) fn cstr(p: &Path) -> Result<CString, Failure> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Failure::new(libc::EINVAL, "a path holds a NUL byte"))
}

/// A path error as the user should read it.
pub(super) fn describe(e: i32, path: &str, doing: &str) -> Failure {
    match e {
        libc::EXDEV | libc::ELOOP => Failure::new(
            libc::EACCES,
            format!("{path}: {doing}: the path leaves the PFS root (through .. or a symlink)"),
        ),
        _ => Failure::new(
            e,
            format!("{path}: {doing}: {}", std::io::Error::from_raw_os_error(e)),
        ),
    }
}

pub(super) fn split_last<'a>(rel: &'a Path, shown: &str) -> Result<(&'a Path, &'a OsStr), Failure> {
    match (rel.parent(), rel.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            Ok((parent, name))
        }
        _ => Err(Failure::new(
            libc::EINVAL,
            format!("{shown}: names a PFS root or ends in .."),
        )),
    }
}

pub(super) fn openat2(dir: &OwnedFd, rel: &Path, flags: i32, mode: u32) -> Result<OwnedFd, i32> {
    let c = CString::new(rel.as_os_str().as_bytes()).map_err(|_| libc::EINVAL)?;
    // SAFETY: open_how is plain old data; all zeroes is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        u64::from(mode)
    } else {
        0
    };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    loop {
        // SAFETY: c and how live across the call; size is how's size.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: a new descriptor, owned here.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        let e = errno();
        // openat2 asks for a retry when a rename raced the lookup.
        if e != libc::EAGAIN && e != libc::EINTR {
            return Err(e);
        }
    }
}

/// The parent directory of `rel` (opened O_PATH beneath the root) and the last name.
pub(super) fn open_parent<'a>(
    root: &OwnedFd,
    rel: &'a Path,
    shown: &str,
) -> Result<(OwnedFd, &'a OsStr), Failure> {
    let (parent, name) = split_last(rel, shown)?;
    let pfd = openat2(
        root,
        parent,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    )
    .map_err(|e| describe(e, shown, "opening the parent directory"))?;
    Ok((pfd, name))
}

pub(super) fn lstat_beneath(root: &OwnedFd, rel: &Path, shown: &str) -> Result<PfsStat, Failure> {
    if rel == Path::new(".") {
        let fd = openat2(root, rel, libc::O_PATH | libc::O_CLOEXEC, 0)
            .map_err(|e| describe(e, shown, "stat"))?;
        return fstat(&fd).map_err(|e| describe(e, shown, "stat"));
    }
    let (pfd, name) = open_parent(root, rel, shown)?;
    fstatat_nofollow(&pfd, name.as_bytes()).map_err(|e| describe(e, shown, "lstat"))
}

pub(crate) fn fstat(fd: &impl AsRawFd) -> Result<PfsStat, i32> {
    // SAFETY: stat is plain old data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out pointer; fd is open.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(errno());
    }
    Ok(PfsStat::of(&st))
}

pub(super) fn fstatat_nofollow(dir: &OwnedFd, name: &[u8]) -> Result<PfsStat, i32> {
    let c = CString::new(name).map_err(|_| libc::EINVAL)?;
    // SAFETY: stat is plain old data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: c is one NUL-terminated component; st is a valid out pointer.
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(errno());
    }
    Ok(PfsStat::of(&st))
}

/// The entry `name` of `dir` may be replaced by a stage-out (`Pfs::check_destination`).
pub(super) fn replaceable(dir: &OwnedFd, name: &OsStr, shown: &str) -> Result<(), Failure> {
    match fstatat_nofollow(dir, name.as_bytes()) {
        Err(libc::ENOENT) => Ok(()),
        Err(e) => Err(describe(e, shown, "lstat")),
        Ok(st) if st.is_file() || st.is_symlink() => Ok(()),
        Ok(st) if st.is_dir() => Err(Failure::new(
            libc::EISDIR,
            format!("{shown}: exists and is a directory, not a regular file"),
        )),
        Ok(_) => Err(Failure::new(
            libc::EINVAL,
            format!("{shown}: exists and is not a regular file (a FIFO, socket or device)"),
        )),
    }
}

pub(super) fn read_link_at(dir: &OwnedFd, name: &OsStr, shown: &str) -> Result<Vec<u8>, Failure> {
    let c = cstr(Path::new(name))?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: buf's length is passed; c is NUL-terminated.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            c.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(describe(errno(), shown, "readlink"));
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// The names in an open directory (without `.` and `..`), sorted.
pub(super) fn list_names(dir: &OwnedFd) -> Result<Vec<Vec<u8>>, i32> {
    spillway_types::files::list_names(dir).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}
