//! The PFS as a stage sees it: only what lies under the configured roots, reached only
//! with the owner's identity.
//!
//! The roots are this server's own (`pfs_roots` in its tunables), never a request's;
//! the identity and the *scope* (the PFS paths the stage named) come from the stage
//! ticket the manager signed (ticket.rs). A PFS path must be absolute, free of `..`,
//! lie (lexically, component by component) under one of the scope's paths and under
//! one of the roots. It is then
//! opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` relative to the root's
//! directory, so `..` and symlinks are followed only while they stay beneath it; a path
//! that leaves its root fails with EACCES (the kernel says EXDEV, which would only
//! puzzle a user). Every call runs on the calling thread as the owner (identity.rs).
//!
//! * `mod.rs`   — `Pfs`: where a path may lie, and the operations on the tree (open,
//!   stat, mkdir, symlinks, modes and times, walks).
//! * `place.rs` — a stage-out's temporaries: created new, renamed into place, removed.
//! * `at.rs`    — the system calls beneath a root (`openat2`, the `*at` calls).

mod at;
mod place;

pub(crate) use at::{fstat, PfsStat};

use super::Failure;
use at::{
    cstr, describe, errno, fstatat_nofollow, list_names, lstat_beneath, open_parent, openat2,
    read_link_at,
};
use spillway_types::identity::{as_identity, Identity};
use spillway_types::Timespec;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// The roots a stage may touch, the paths its ticket covers, and the identity it
/// touches them with.
pub(crate) struct Pfs {
    roots: Vec<PathBuf>,
    scope: Vec<String>,
    id: Identity,
    /// The ticket's stage: its own stage-out temporaries (temp.rs) are covered too.
    stage: Option<u64>,
}

impl Pfs {
    /// The roots must be absolute; they are taken as given (this server's
    /// configuration). `scope`: the stage ticket's PFS paths. No root means this
    /// server stages nothing.
    pub(crate) fn new(roots: &[String], scope: &[String], id: Identity) -> Result<Pfs, Failure> {
        if roots.is_empty() {
            return Err(Failure::new(
                libc::EACCES,
                "this storage server has no pfs_roots in its configuration: it stages nothing",
            ));
        }
        let mut out = Vec::new();
        for r in roots {
            let p = PathBuf::from(r);
            if !p.is_absolute() || has_dots(&p) {
                return Err(Failure::new(
                    libc::EINVAL,
                    format!("PFS root {r:?} is not an absolute, normal path"),
                ));
            }
            out.push(p);
        }
        Ok(Pfs {
            roots: out,
            scope: scope.to_vec(),
            id,
            stage: None,
        })
    }

    /// The PFS of stage `stage`: besides the scope's paths, the stage's own
    /// temporaries beside them (`temp::covered`).
    pub(crate) fn for_stage(mut self, stage: u64) -> Pfs {
        self.stage = Some(stage);
        self
    }

    /// The identity the stage runs as (the ticket's uid).
    pub(crate) fn identity(&self) -> &Identity {
        &self.id
    }

    /// The root a path lies under, and the path relative to it ("." for the root).
    fn locate(&self, path: &str) -> Result<(&Path, PathBuf), Failure> {
        let p = Path::new(path);
        if !p.is_absolute() {
            return Err(Failure::new(
                libc::EINVAL,
                format!("{path}: a PFS path must be absolute"),
            ));
        }
        if has_parent(p) {
            return Err(Failure::new(
                libc::EACCES,
                format!("{path}: a PFS path of a stage may not climb with .."),
            ));
        }
        let own_temporary = self
            .stage
            .is_some_and(|st| super::temp::covered(path, st, &self.scope));
        if !own_temporary
            && !self
                .scope
                .iter()
                .any(|s| spillway_types::stage_ticket::lies_under(path, s))
        {
            return Err(Failure::new(
                libc::EACCES,
                format!("{path}: not a path this stage's ticket covers"),
            ));
        }
        let root = self
            .roots
            .iter()
            .filter(|r| p.starts_with(r))
            .max_by_key(|r| r.as_os_str().len())
            .ok_or_else(|| {
                Failure::new(
                    libc::EACCES,
                    format!("{path}: not under a PFS root this site allows staging with"),
                )
            })?;
        let rel = p.strip_prefix(root).unwrap_or(Path::new(""));
        let rel = if rel.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            rel.to_path_buf()
        };
        Ok((root, rel))
    }

    /// Run `f` with the root's directory open (as the owner) and the relative path.
    fn beneath<T>(
        &self,
        path: &str,
        f: impl FnOnce(&OwnedFd, &Path) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        let (root, rel) = self.locate(path)?;
        let root_c = cstr(root)?;
        as_identity(&self.id, || {
            // SAFETY: root_c is NUL-terminated; the result is checked.
            let fd = unsafe {
                libc::open(
                    root_c.as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            };
            if fd < 0 {
                return Err(describe(errno(), path, "opening its PFS root"));
            }
            // SAFETY: fd was just opened and is owned here.
            let root_fd = unsafe { OwnedFd::from_raw_fd(fd) };
            f(&root_fd, &rel)
        })
        .map_err(|e| {
            Failure::new(
                libc::EPERM,
                format!("cannot take on uid {}: {e}", self.id.uid),
            )
        })?
    }

    /// Run `f` as the owner: the PFS operations inside it switch identity no more (one
    /// switch for a batch of files instead of one per operation). Nothing but PFS
    /// operations belongs inside: the server's own files must not be made as the owner.
    pub(crate) fn as_owner<T>(&self, f: impl FnOnce() -> T) -> Result<T, Failure> {
        as_identity(&self.id, f).map_err(|e| {
            Failure::new(
                libc::EPERM,
                format!("cannot take on uid {}: {e}", self.id.uid),
            )
        })
    }

    /// A stage-in source, opened as the owner: a regular file, and what it held then
    /// (the copy is checked against it, `unchanged_since`).
    pub(crate) fn open_source(&self, src: &str) -> Result<(File, PfsStat), Failure> {
        let file = self.open(src, libc::O_RDONLY, 0)?;
        let st = fstat(&file)
            .map_err(|e| super::ns::errno_failure(spillway_types::Errno(e), src, "fstat"))?;
        if !st.is_file() {
            let e = if st.is_dir() {
                libc::EISDIR
            } else {
                libc::EINVAL
            };
            return Err(Failure::new(e, format!("{src}: not a regular file")));
        }
        Ok((file, st))
    }

    /// A stage-out destination, created or truncated as the owner: a regular file (an
    /// existing FIFO, device or directory there fails the file, never receives it).
    pub(crate) fn create_destination(&self, dst: &str, mode: u32) -> Result<File, Failure> {
        let file = self.open(dst, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, mode)?;
        let st = fstat(&file)
            .map_err(|e| super::ns::errno_failure(spillway_types::Errno(e), dst, "fstat"))?;
        if !st.is_file() {
            return Err(Failure::new(
                libc::EINVAL,
                format!("{dst}: not a regular file"),
            ));
        }
        Ok(file)
    }

    /// A stage-out's temporary (temp.rs), created as the owner: a new name only
    /// (`O_EXCL`: never an existing file, never through a symlink), opened for writing.
    /// `openat2` beneath the root, as the owner. Never blocks in the open: O_NONBLOCK
    /// makes a FIFO (or a device) named by a user answer at once instead of holding a
    /// stage until a peer opens the other end; on a regular file it changes nothing.
    pub(crate) fn open(&self, path: &str, flags: i32, mode: u32) -> Result<File, Failure> {
        self.beneath(path, |root, rel| {
            let fd = openat2(root, rel, flags | libc::O_CLOEXEC | libc::O_NONBLOCK, mode)
                .map_err(|e| describe(e, path, "open"))?;
            // Blocking again once open: the copies expect ordinary descriptors.
            // SAFETY: fd is open for both calls.
            unsafe {
                let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
                if fl >= 0 {
                    libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
                }
            }
            Ok(File::from(fd))
        })
    }

    /// Give an open file its mode and times, as the owner: a file the owner does not
    /// own keeps its own (chmod and utimens would refuse the owner too).
    pub(crate) fn set_file_attrs(
        &self,
        file: &File,
        shown: &str,
        mode: u32,
        atime: Timespec,
        mtime: Timespec,
    ) -> Result<(), Failure> {
        let fd = file.as_raw_fd();
        as_identity(&self.id, || {
            // SAFETY: fd is open for the call.
            if unsafe { libc::fchmod(fd, mode & 0o7777) } != 0 && errno() != libc::EPERM {
                return Err(describe(errno(), shown, "chmod"));
            }
            let times = [
                libc::timespec {
                    tv_sec: atime.sec,
                    tv_nsec: i64::from(atime.nsec),
                },
                libc::timespec {
                    tv_sec: mtime.sec,
                    tv_nsec: i64::from(mtime.nsec),
                },
            ];
            // SAFETY: times holds two timespecs.
            if unsafe { libc::futimens(fd, times.as_ptr()) } != 0 && errno() != libc::EPERM {
                return Err(describe(errno(), shown, "setting times"));
            }
            Ok(())
        })
        .map_err(|e| {
            Failure::new(
                libc::EPERM,
                format!("cannot take on uid {}: {e}", self.id.uid),
            )
        })?
    }

    /// Mode and times of the directory `path` (a directory only: never through a
    /// symlink, never a file put there since).
    pub(crate) fn set_dir_attrs(
        &self,
        path: &str,
        mode: u32,
        atime: Timespec,
        mtime: Timespec,
    ) -> Result<(), Failure> {
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_DIRECTORY;
        let f = self.open(path, flags, 0)?;
        self.set_file_attrs(&f, path, mode, atime, mtime)
    }

    /// lstat beneath the root (the last component is not followed).
    pub(crate) fn lstat(&self, path: &str) -> Result<PfsStat, Failure> {
        self.beneath(path, |root, rel| lstat_beneath(root, rel, path))
    }

    /// Make a directory (an existing directory is fine).
    pub(crate) fn mkdir(&self, path: &str, mode: u32) -> Result<(), Failure> {
        self.beneath(path, |root, rel| {
            let (pfd, name) = open_parent(root, rel, path)?;
            let name_c = cstr(Path::new(name))?;
            // SAFETY: pfd is open; name_c is one NUL-terminated component.
            let rc = unsafe { libc::mkdirat(pfd.as_raw_fd(), name_c.as_ptr(), mode) };
            if rc == 0 {
                return Ok(());
            }
            let e = errno();
            if e == libc::EEXIST {
                let st = lstat_beneath(root, rel, path)?;
                if st.is_dir() {
                    return Ok(());
                }
                return Err(Failure::new(
                    libc::ENOTDIR,
                    format!("{path}: exists and is not a directory"),
                ));
            }
            Err(describe(e, path, "mkdir"))
        })
    }

    /// Make a symlink (replacing an existing symlink or file of that name).
    pub(crate) fn symlink(&self, target: &[u8], path: &str) -> Result<(), Failure> {
        self.beneath(path, |root, rel| {
            let (pfd, name) = open_parent(root, rel, path)?;
            let name_c = cstr(Path::new(name))?;
            let target_c = CString::new(target)
                .map_err(|_| Failure::new(libc::EINVAL, "a symlink target holds a NUL byte"))?;
            for attempt in 0..2 {
                // SAFETY: pointers are NUL-terminated; pfd is open.
                let rc =
                    unsafe { libc::symlinkat(target_c.as_ptr(), pfd.as_raw_fd(), name_c.as_ptr()) };
                if rc == 0 {
                    return Ok(());
                }
                let e = errno();
                if e == libc::EEXIST && attempt == 0 {
                    // SAFETY: as above; a directory is not removed (flags 0).
                    unsafe { libc::unlinkat(pfd.as_raw_fd(), name_c.as_ptr(), 0) };
                    continue;
                }
                return Err(describe(e, path, "symlink"));
            }
            Err(Failure::new(libc::EEXIST, format!("{path}: exists")))
        })
    }

    /// The target of a symlink.
    pub(crate) fn read_link(&self, path: &str) -> Result<Vec<u8>, Failure> {
        self.beneath(path, |root, rel| {
            let (pfd, name) = open_parent(root, rel, path)?;
            read_link_at(&pfd, name, path)
        })
    }

    /// Every entry under the directory `path`, as paths relative to it, with what lstat
    /// says of each: a directory's entries in name order, then its subdirectories'.
    /// Directories come before what they hold. Runs as
    /// the owner: a directory the owner cannot list fails the walk.
    pub(crate) fn walk(&self, path: &str) -> Result<Vec<(PathBuf, PfsStat)>, Failure> {
        self.beneath(path, |root, rel| {
            let top = lstat_beneath(root, rel, path)?;
            if !top.is_dir() {
                return Err(Failure::new(
                    libc::ENOTDIR,
                    format!("{path}: not a directory"),
                ));
            }
            let mut out = Vec::new();
            let mut stack = vec![PathBuf::new()];
            while let Some(sub) = stack.pop() {
                let dir_rel = if sub.as_os_str().is_empty() {
                    rel.to_path_buf()
                } else {
                    rel.join(&sub)
                };
                let shown = format!("{path}/{}", sub.display());
                let fd = openat2(
                    root,
                    &dir_rel,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    0,
                )
                .map_err(|e| describe(e, &shown, "opening the directory"))?;
                let names = list_names(&fd).map_err(|e| describe(e, &shown, "listing"))?;
                let mut subdirs = Vec::new();
                for name in names {
                    let st = fstatat_nofollow(&fd, &name)
                        .map_err(|e| describe(e, &shown, "lstat of an entry"))?;
                    let child = sub.join(OsStr::from_bytes(&name));
                    if st.is_dir() {
                        subdirs.push(child.clone());
                    }
                    out.push((child, st));
                }
                // Popped in reverse: keep name order within a directory.
                stack.extend(subdirs.into_iter().rev());
            }
            Ok(out)
        })
    }
}

fn has_parent(p: &Path) -> bool {
    p.components().any(|c| matches!(c, Component::ParentDir))
}

fn has_dots(p: &Path) -> bool {
    p.components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
}

/// A copy of `src` counts only if the source still has the size and mtime it had when
/// the stage opened it (`st`): a file written during the stage fails with EIO.
pub(crate) fn unchanged_since(file: &File, st: &PfsStat, src: &str) -> Result<(), Failure> {
    let now = fstat(file)
        .map_err(|e| super::ns::errno_failure(spillway_types::Errno(e), src, "fstat"))?;
    if now.size != st.size || now.mtime != st.mtime {
        return Err(Failure::new(
            libc::EIO,
            format!(
                "{src}: changed during the stage ({} bytes when opened, {} now)",
                st.size, now.size
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

/// The directory a cache configuration names (docs/cache.md), opened as its owner
/// (`uid`, with `gid` as primary group) beneath one of this server's PFS roots, by the
/// rules of a stage: a directory the owner cannot reach is refused, whatever root
/// could. Handed to the fragments as their `PfsDirOpener` (lib.rs).
pub(crate) fn open_cache_dir(
    pfs_dir: &str,
    uid: u32,
    gid: u32,
    roots: &[String],
) -> crate::error::StoreResult<OwnedFd> {
    use crate::error::fs;
    use spillway_types::Errno;
    let id = match Identity::of_uid(uid) {
        Ok(mut id) => {
            id.gid = gid;
            id
        }
        Err(e) => {
            tracing::warn!("cache of {pfs_dir}: {e}");
            return Err(fs(Errno::EPERM));
        }
    };
    let refused = |f: Failure| {
        tracing::warn!("cache of {pfs_dir}: {}", f.message);
        fs(Errno(f.errno))
    };
    let pfs = Pfs::new(roots, &[pfs_dir.to_string()], id).map_err(refused)?;
    let dir = pfs
        .open(pfs_dir, libc::O_RDONLY | libc::O_DIRECTORY, 0)
        .map_err(refused)?;
    Ok(OwnedFd::from(dir))
}
