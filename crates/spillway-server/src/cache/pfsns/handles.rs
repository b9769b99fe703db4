//! PFS file handles (`name_to_handle_at`, `open_by_handle_at`): how an inode of the
//! instance is found again on the PFS without a path, across renames and restarts.

use spillway_types::Errno;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The kernel's own limit on a handle's bytes.
const MAX_HANDLE_BYTES: usize = libc::MAX_HANDLE_SZ as usize;
/// `struct file_handle` is two 32-bit words before its bytes.
const HEADER: usize = std::mem::size_of::<libc::file_handle>();
/// The buffer in u32 units, so that it is aligned as `struct file_handle` needs.
const WORDS: usize = (HEADER + MAX_HANDLE_BYTES).div_ceil(4);

/// A PFS inode's handle as `name_to_handle_at` gave it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Handle {
    pub kind: i32,
    pub bytes: Vec<u8>,
}

fn last_errno() -> Errno {
    Errno::from_io(&std::io::Error::last_os_error())
}

/// The handle of the inode `fd` refers to (any kind of descriptor, O_PATH included),
/// and the id of the mount it is on.
pub(super) fn handle_of(fd: &impl AsRawFd) -> Result<(Handle, i32), Errno> {
    let mut buf = [0u32; WORDS];
    let fh = buf.as_mut_ptr().cast::<libc::file_handle>();
    // SAFETY: buf is aligned for file_handle and holds its header plus
    // MAX_HANDLE_BYTES bytes.
    unsafe { (*fh).handle_bytes = MAX_HANDLE_BYTES as u32 };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: the name is an empty NUL-terminated string (AT_EMPTY_PATH: fd itself);
    // fh has room for handle_bytes bytes; mount_id is a valid out pointer.
    let rc = unsafe {
        libc::name_to_handle_at(
            fd.as_raw_fd(),
            c"".as_ptr(),
            fh,
            &mut mount_id,
            libc::AT_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(last_errno());
    }
    // SAFETY: the kernel filled the header; handle_bytes is at most what we offered.
    let (kind, len) = unsafe { ((*fh).handle_type, (*fh).handle_bytes as usize) };
    let len = len.min(MAX_HANDLE_BYTES);
    // SAFETY: buf is WORDS * 4 bytes, at least HEADER + len; u8 has no alignment.
    let all = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), HEADER + len) };
    Ok((
        Handle {
            kind,
            bytes: all[HEADER..].to_vec(),
        },
        mount_id,
    ))
}

/// The inode of the handle (`kind`, `bytes`) opened with `flags` (O_CLOEXEC added).
/// `mount_fd` is any descriptor on the same file system that is not O_PATH (the
/// kernel refuses those with EBADF). Root only (CAP_DAC_READ_SEARCH). ESTALE when the
/// inode is gone.
pub(super) fn open_handle(
    mount_fd: &impl AsRawFd,
    kind: i32,
    bytes: &[u8],
    flags: i32,
) -> Result<OwnedFd, Errno> {
    if bytes.len() > MAX_HANDLE_BYTES {
        return Err(Errno::ESTALE);
    }
    let mut buf = [0u32; WORDS];
    let fh = buf.as_mut_ptr().cast::<libc::file_handle>();
    // SAFETY: buf is aligned for file_handle and long enough for the header and
    // bytes (checked above); the bytes go right after the header.
    unsafe {
        (*fh).handle_bytes = bytes.len() as u32;
        (*fh).handle_type = kind;
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            buf.as_mut_ptr().cast::<u8>().add(HEADER),
            bytes.len(),
        );
    }
    loop {
        // SAFETY: fh points at a complete handle in buf, alive for the call.
        let fd =
            unsafe { libc::open_by_handle_at(mount_fd.as_raw_fd(), fh, flags | libc::O_CLOEXEC) };
        if fd >= 0 {
            // SAFETY: a new descriptor, owned here.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = last_errno();
        if e != Errno(libc::EINTR) {
            return Err(e);
        }
    }
}
