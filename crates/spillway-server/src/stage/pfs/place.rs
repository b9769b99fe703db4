//! A stage-out's temporaries on the PFS (temp.rs names them): created new, checked
//! and renamed over their destination once durable, the directory synced after, or
//! removed. Only names of the stage's own temporaries are ever created or removed.

use super::at::{cstr, describe, errno, open_parent, openat2, replaceable, split_last};
use super::Pfs;
use crate::stage::{temp, Failure};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

impl Pfs {
    /// A stage-out's temporary (temp.rs), created as the owner: a new name only
    /// (`O_EXCL`: never an existing file, never through a symlink), opened for writing.
    pub(crate) fn create_temporary(&self, tmp: &str, mode: u32) -> Result<File, Failure> {
        let last = tmp.rsplit('/').next().unwrap_or(tmp);
        if temp::parse(last).is_none() {
            return Err(Failure::new(
                libc::EINVAL,
                format!("{tmp}: not a stage's temporary name"),
            ));
        }
        self.open(
            tmp,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            mode,
        )
        .map_err(|f| {
            let dst = temp::shown(tmp);
            Failure::new(
                f.errno,
                format!("{dst}: creating its temporary {last}: {}", f.message),
            )
        })
    }

    /// Put a complete, durable temporary in place: rename it over `dst` (its
    /// sibling), as the owner. An existing directory there fails the file (EISDIR);
    /// an existing file or symlink of that name is replaced, never written through.
    pub(crate) fn rename_into_place(&self, tmp: &str, dst: &str) -> Result<(), Failure> {
        let (tmp_dir, tmp_last) = temp::split(tmp);
        if tmp_dir != temp::split(dst).0 || temp::parse(tmp_last).is_none() {
            return Err(Failure::new(
                libc::EINVAL,
                format!("{dst}: {tmp} is not its temporary"),
            ));
        }
        self.beneath(dst, |root, rel| {
            let (pfd, name) = open_parent(root, rel, dst)?;
            replaceable(&pfd, name, dst)?;
            let from = cstr(Path::new(tmp_last))?;
            let to = cstr(Path::new(name))?;
            // SAFETY: pfd is open; both names are single NUL-terminated components.
            let rc = unsafe {
                libc::renameat(pfd.as_raw_fd(), from.as_ptr(), pfd.as_raw_fd(), to.as_ptr())
            };
            if rc != 0 {
                return Err(describe(
                    errno(),
                    dst,
                    "renaming the complete copy into place",
                ));
            }
            Ok(())
        })
    }

    /// What is at a stage-out's destination may be replaced by a rename: nothing, a
    /// regular file or a symlink. A directory fails the file (EISDIR), so does any
    /// other kind (EINVAL: a FIFO or a device never receives a stage, nor is removed
    /// by one). Checked before copying and again at the rename.
    pub(crate) fn check_destination(&self, dst: &str) -> Result<(), Failure> {
        self.beneath(dst, |root, rel| {
            let (pfd, name) = open_parent(root, rel, dst)?;
            replaceable(&pfd, name, dst)
        })
    }

    /// Make the entries of the directory holding `dst` durable (`fsync` of the
    /// directory), as the owner: what makes a rename into place survive a crash.
    pub(crate) fn sync_parent(&self, dst: &str) -> Result<(), Failure> {
        self.beneath(dst, |root, rel| {
            let (parent, _) = split_last(rel, dst)?;
            let fd = openat2(
                root,
                parent,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                0,
            )
            .map_err(|e| describe(e, dst, "opening its directory"))?;
            // SAFETY: fd is open for the call.
            if unsafe { libc::fsync(fd.as_raw_fd()) } != 0 {
                return Err(describe(errno(), dst, "fsync of its directory"));
            }
            Ok(())
        })
    }

    /// Remove a stage's temporary, as the owner; one already gone is fine. Only a
    /// temporary name is ever removed (and never a directory).
    pub(crate) fn remove_temporary(&self, tmp: &str) -> Result<(), Failure> {
        self.beneath(tmp, |root, rel| {
            let (pfd, name) = open_parent(root, rel, tmp)?;
            if temp::parse(&name.to_string_lossy()).is_none() {
                return Err(Failure::new(
                    libc::EINVAL,
                    format!("{tmp}: not a stage's temporary name"),
                ));
            }
            let c = cstr(Path::new(name))?;
            // SAFETY: pfd is open; c is one NUL-terminated component; flags 0 never
            // removes a directory.
            if unsafe { libc::unlinkat(pfd.as_raw_fd(), c.as_ptr(), 0) } != 0 {
                let e = errno();
                if e != libc::ENOENT {
                    return Err(describe(e, tmp, "removing the temporary"));
                }
            }
            Ok(())
        })
    }
}
