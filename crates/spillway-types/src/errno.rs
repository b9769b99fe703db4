//! Errors travel as POSIX errno values end to end: the server produces them, the wire
//! carries them, and the FUSE client hands them to the kernel unchanged.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const EROFS: Errno = Errno(libc::EROFS);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const EXDEV: Errno = Errno(libc::EXDEV);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const EFBIG: Errno = Errno(libc::EFBIG);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const ENAMETOOLONG: Errno = Errno(libc::ENAMETOOLONG);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const ENOTEMPTY: Errno = Errno(libc::ENOTEMPTY);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    pub const ETIMEDOUT: Errno = Errno(libc::ETIMEDOUT);
    pub const ECONNREFUSED: Errno = Errno(libc::ECONNREFUSED);
    pub const EPROTO: Errno = Errno(libc::EPROTO);
    pub const ESTALE: Errno = Errno(libc::ESTALE);
    pub const EMLINK: Errno = Errno(libc::EMLINK);
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    pub const E2BIG: Errno = Errno(libc::E2BIG);

    /// Map an I/O error to the errno it carries, EIO when it carries none.
    pub fn from_io(e: &std::io::Error) -> Errno {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

/// The symbolic name of a (positive) errno, e.g. `EACCES`, as the command line and
/// the manager show a failed file; `errno N` for one not listed.
pub fn errno_name(e: i32) -> String {
    let n = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EACCES => "EACCES",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::ENOSYS => "ENOSYS",
        libc::EBUSY => "EBUSY",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ELOOP => "ELOOP",
        libc::EXDEV => "EXDEV",
        libc::ESTALE => "ESTALE",
        libc::EFBIG => "EFBIG",
        libc::EROFS => "EROFS",
        libc::EDQUOT => "EDQUOT",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ECANCELED => "ECANCELED",
        _ => return format!("errno {e}"),
    };
    n.to_string()
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let msg = std::io::Error::from_raw_os_error(self.0);
        write!(f, "errno {} ({})", self.0, msg)
    }
}

impl std::error::Error for Errno {}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Errno {
        Errno::from_io(&e)
    }
}
