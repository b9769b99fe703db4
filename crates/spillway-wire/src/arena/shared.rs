//! The memfd behind an arena: made and sealed by the client, checked and mapped by the
//! server. The server maps memory a client hands it, so it checks what it maps: a file
//! that could shrink under the mapping would fault the server with SIGBUS at the first
//! access past its new end, so only a memfd sealed against shrinking is taken.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `statfs.f_type` of shmem (tmpfs and plain memfds); hugetlbfs memfds, whose pages
/// may be missing when touched, are refused.
const TMPFS_MAGIC: i64 = 0x0102_1994;

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

/// A shared, read-write mapping of a whole memfd; unmapped when dropped.
#[derive(Debug)]
pub(crate) struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory, valid until drop; who may write which part of
// it is the business of its users (slots on the client, requests on the server).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping chosen by the kernel; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            base: p.cast(),
            len,
        })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.base
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped; nothing refers to it any more
        // (every user holds the mapping's owner alive).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A memfd of `len` bytes sealed so that its size never changes (and no more seals
/// can be added, so it can never be made read-only under a server's mapping), mapped.
pub(crate) fn create_sealed(len: usize) -> io::Result<(OwnedFd, Mapping)> {
    // SAFETY: a NUL-terminated name; the result is checked.
    let raw = cvt(unsafe {
        libc::memfd_create(
            c"spillway-arena".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    })?;
    // SAFETY: a descriptor just returned to us and owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain syscalls on our descriptor.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) })?;
    // SAFETY: as above.
    cvt(unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        )
    })?;
    let map = Mapping::map(&fd, len)?;
    Ok((fd, map))
}

/// Map a descriptor a client handed over, after checking it is what an arena must be:
/// a shmem memfd, sealed against shrinking (the SIGBUS above), of a whole number of
/// pages up to `max` bytes, mappable for writing (a write seal would refuse). The
/// reason for a refusal is for the server's log.
pub(crate) fn map_checked(fd: &OwnedFd, max: usize) -> Result<Mapping, String> {
    // SAFETY: plain syscalls on a descriptor we own; the structs are written by them.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(format!(
            "not a sealable memfd ({})",
            io::Error::last_os_error()
        ));
    }
    if seals & libc::F_SEAL_SHRINK == 0 {
        return Err("not sealed against shrinking".into());
    }
    // SAFETY: statfs is plain old data; all zeroes is a valid value.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes one statfs into `fs`.
    cvt(unsafe { libc::fstatfs(fd.as_raw_fd(), &mut fs) }).map_err(|e| e.to_string())?;
    if fs.f_type as i64 != TMPFS_MAGIC {
        return Err(format!("not shmem (file system type {:#x})", fs.f_type));
    }
    // SAFETY: stat is plain old data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one stat into `st`.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }).map_err(|e| e.to_string())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err("not a regular file".into());
    }
    let len = usize::try_from(st.st_size).map_err(|_| "negative size".to_string())?;
    if len == 0 || len > max || !len.is_multiple_of(page_size()) {
        return Err(format!(
            "size {len} not a whole number of pages within {max}"
        ));
    }
    Mapping::map(fd, len).map_err(|e| format!("cannot map it: {e}"))
}

#[cfg(test)]
// Tests: raw syscalls on descriptors and mappings they made themselves.
#[allow(clippy::undocumented_unsafe_blocks)]
mod tests {
    use super::*;

    fn memfd(len: usize, seals: libc::c_int) -> OwnedFd {
        let raw = unsafe {
            libc::memfd_create(
                c"test".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        assert!(raw >= 0);
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        assert_eq!(unsafe { libc::ftruncate(raw, len as libc::off_t) }, 0);
        if seals != 0 {
            assert_eq!(unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, seals) }, 0);
        }
        fd
    }

    #[test]
    fn what_a_client_made_maps_and_is_shared() {
        let (fd, map) = create_sealed(1 << 20).unwrap();
        let other = map_checked(&fd, 1 << 20).unwrap();
        unsafe { *map.ptr().add(4097) = 42 };
        assert_eq!(unsafe { *other.ptr().add(4097) }, 42);
        // The size cannot change any more.
        assert_ne!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
    }

    #[test]
    fn a_server_refuses_what_could_fault_it_or_is_too_big() {
        let unsealed = memfd(1 << 20, 0);
        assert!(map_checked(&unsealed, 1 << 30)
            .unwrap_err()
            .contains("shrinking"));
        let sealed = memfd(1 << 20, libc::F_SEAL_SHRINK);
        assert!(map_checked(&sealed, 1 << 30).is_ok());
        assert!(map_checked(&sealed, 1 << 19)
            .unwrap_err()
            .contains("within"));
        let ragged = memfd(5000, libc::F_SEAL_SHRINK);
        assert!(map_checked(&ragged, 1 << 30).is_err());
        let empty = memfd(0, libc::F_SEAL_SHRINK);
        assert!(map_checked(&empty, 1 << 30).is_err());
        let readonly = memfd(1 << 20, libc::F_SEAL_SHRINK | libc::F_SEAL_WRITE);
        assert!(map_checked(&readonly, 1 << 30).unwrap_err().contains("map"));
        // A regular file is not a memfd: no seals at all.
        let f = tempfile_fd();
        assert!(map_checked(&f, 1 << 30).is_err());
    }

    fn tempfile_fd() -> OwnedFd {
        let path = std::env::temp_dir().join(format!("arena-test-{}", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(1 << 20).unwrap();
        let _ = std::fs::remove_file(&path);
        f.into()
    }
}
