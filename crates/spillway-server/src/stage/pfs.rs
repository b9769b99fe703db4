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

use super::Failure;
use spillway_types::identity::{as_identity, Identity};
use spillway_types::Timespec;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// The roots a stage may touch, the paths its ticket covers, and the identity it
/// touches them with.
pub struct Pfs {
    roots: Vec<PathBuf>,
    scope: Vec<String>,
    id: Identity,
    /// The ticket's stage: its own stage-out temporaries (temp.rs) are covered too.
    stage: Option<u64>,
}

/// What a PFS entry is, as `lstat` saw it.
#[derive(Clone, Debug)]
pub struct PfsStat {
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
    pub fn is_file(&self) -> bool {
        self.kind == libc::S_IFREG
    }
    pub fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }
    pub fn is_symlink(&self) -> bool {
        self.kind == libc::S_IFLNK
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn cstr(p: &Path) -> Result<CString, Failure> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Failure::new(libc::EINVAL, "a path holds a NUL byte"))
}

/// A path error as the user should read it.
fn describe(e: i32, path: &str, doing: &str) -> Failure {
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

impl Pfs {
    /// The roots must be absolute; they are taken as given (this server's
    /// configuration). `scope`: the stage ticket's PFS paths. No root means this
    /// server stages nothing.
    pub fn new(roots: &[String], scope: &[String], id: Identity) -> Result<Pfs, Failure> {
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
    pub fn for_stage(mut self, stage: u64) -> Pfs {
        self.stage = Some(stage);
        self
    }

    /// The identity the stage runs as (the ticket's uid).
    pub fn identity(&self) -> &Identity {
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
    pub fn as_owner<T>(&self, f: impl FnOnce() -> T) -> Result<T, Failure> {
        as_identity(&self.id, f).map_err(|e| {
            Failure::new(
                libc::EPERM,
                format!("cannot take on uid {}: {e}", self.id.uid),
            )
        })
    }

    /// A stage-in source, opened as the owner: a regular file, and what it held then
    /// (the copy is checked against it, `unchanged_since`).
    pub fn open_source(&self, src: &str) -> Result<(File, PfsStat), Failure> {
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
    pub fn create_destination(&self, dst: &str, mode: u32) -> Result<File, Failure> {
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
    pub fn create_temporary(&self, tmp: &str, mode: u32) -> Result<File, Failure> {
        let last = tmp.rsplit('/').next().unwrap_or(tmp);
        if super::temp::parse(last).is_none() {
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
            let dst = super::temp::shown(tmp);
            Failure::new(
                f.errno,
                format!("{dst}: creating its temporary {last}: {}", f.message),
            )
        })
    }

    /// Put a complete, durable temporary in place: rename it over `dst` (its
    /// sibling), as the owner. An existing directory there fails the file (EISDIR);
    /// an existing file or symlink of that name is replaced, never written through.
    pub fn rename_into_place(&self, tmp: &str, dst: &str) -> Result<(), Failure> {
        let (tmp_dir, tmp_last) = super::temp::split(tmp);
        if tmp_dir != super::temp::split(dst).0 || super::temp::parse(tmp_last).is_none() {
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
    pub fn check_destination(&self, dst: &str) -> Result<(), Failure> {
        self.beneath(dst, |root, rel| {
            let (pfd, name) = open_parent(root, rel, dst)?;
            replaceable(&pfd, name, dst)
        })
    }

    /// Make the entries of the directory holding `dst` durable (`fsync` of the
    /// directory), as the owner: what makes a rename into place survive a crash.
    pub fn sync_parent(&self, dst: &str) -> Result<(), Failure> {
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
    pub fn remove_temporary(&self, tmp: &str) -> Result<(), Failure> {
        self.beneath(tmp, |root, rel| {
            let (pfd, name) = open_parent(root, rel, tmp)?;
            if super::temp::parse(&name.to_string_lossy()).is_none() {
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

    /// `openat2` beneath the root, as the owner. Never blocks in the open: O_NONBLOCK
    /// makes a FIFO (or a device) named by a user answer at once instead of holding a
    /// stage until a peer opens the other end; on a regular file it changes nothing.
    pub fn open(&self, path: &str, flags: i32, mode: u32) -> Result<File, Failure> {
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
    pub fn set_file_attrs(
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

    /// Mode and times of the directory (or file) `path`.
    pub fn set_attrs(
        &self,
        path: &str,
        dir: bool,
        mode: u32,
        atime: Timespec,
        mtime: Timespec,
    ) -> Result<(), Failure> {
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | if dir { libc::O_DIRECTORY } else { 0 };
        let f = self.open(path, flags, 0)?;
        self.set_file_attrs(&f, path, mode, atime, mtime)
    }

    /// lstat beneath the root (the last component is not followed).
    pub fn lstat(&self, path: &str) -> Result<PfsStat, Failure> {
        self.beneath(path, |root, rel| lstat_beneath(root, rel, path))
    }

    /// Make a directory (an existing directory is fine).
    pub fn mkdir(&self, path: &str, mode: u32) -> Result<(), Failure> {
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
    pub fn symlink(&self, target: &[u8], path: &str) -> Result<(), Failure> {
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
    pub fn read_link(&self, path: &str) -> Result<Vec<u8>, Failure> {
        self.beneath(path, |root, rel| {
            let (pfd, name) = open_parent(root, rel, path)?;
            read_link_at(&pfd, name, path)
        })
    }

    /// Every entry under the directory `path`, as paths relative to it, with what lstat
    /// says of each: a directory's entries in name order, then its subdirectories'.
    /// Directories come before what they hold. Runs as
    /// the owner: a directory the owner cannot list fails the walk.
    pub fn walk(&self, path: &str) -> Result<Vec<(PathBuf, PfsStat)>, Failure> {
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

fn split_last<'a>(rel: &'a Path, shown: &str) -> Result<(&'a Path, &'a OsStr), Failure> {
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

fn openat2(dir: &OwnedFd, rel: &Path, flags: i32, mode: u32) -> Result<OwnedFd, i32> {
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
fn open_parent<'a>(
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

fn lstat_beneath(root: &OwnedFd, rel: &Path, shown: &str) -> Result<PfsStat, Failure> {
    if rel == Path::new(".") {
        let fd = openat2(root, rel, libc::O_PATH | libc::O_CLOEXEC, 0)
            .map_err(|e| describe(e, shown, "stat"))?;
        return fstat(&fd).map_err(|e| describe(e, shown, "stat"));
    }
    let (pfd, name) = open_parent(root, rel, shown)?;
    fstatat_nofollow(&pfd, name.as_bytes()).map_err(|e| describe(e, shown, "lstat"))
}

/// A copy of `src` counts only if the source still has the size and mtime it had when
/// the stage opened it (`st`): a file written during the stage fails with EIO.
pub fn unchanged_since(file: &File, st: &PfsStat, src: &str) -> Result<(), Failure> {
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

pub fn fstat(fd: &impl AsRawFd) -> Result<PfsStat, i32> {
    // SAFETY: stat is plain old data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out pointer; fd is open.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(errno());
    }
    Ok(PfsStat::of(&st))
}

fn fstatat_nofollow(dir: &OwnedFd, name: &[u8]) -> Result<PfsStat, i32> {
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
fn replaceable(dir: &OwnedFd, name: &OsStr, shown: &str) -> Result<(), Failure> {
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

fn read_link_at(dir: &OwnedFd, name: &OsStr, shown: &str) -> Result<Vec<u8>, Failure> {
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
fn list_names(dir: &OwnedFd) -> Result<Vec<Vec<u8>>, i32> {
    // fdopendir takes the descriptor over: give it a duplicate.
    // SAFETY: dup of an open descriptor.
    let fd = unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: fd is a fresh duplicate; on failure it is closed here.
    let d = unsafe { libc::fdopendir(fd) };
    if d.is_null() {
        let e = errno();
        // SAFETY: fdopendir failed, so fd is still ours to close, once.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    let mut names = Vec::new();
    let result = loop {
        // readdir signals the end and errors both with NULL: errno tells them apart.
        // SAFETY: __errno_location points at this thread's errno.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: d is an open DIR*.
        let ent = unsafe { libc::readdir64(d) };
        if ent.is_null() {
            let e = errno_raw();
            break if e == 0 { Ok(()) } else { Err(e) };
        }
        // SAFETY: d_name is NUL-terminated within the entry.
        let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    };
    // SAFETY: d is open; closes fd too.
    unsafe { libc::closedir(d) };
    result?;
    names.sort();
    Ok(names)
}

fn errno_raw() -> i32 {
    // SAFETY: reading this thread's errno.
    unsafe { *libc::__errno_location() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn root_pfs(roots: &[&Path]) -> Pfs {
        let roots: Vec<String> = roots.iter().map(|p| p.display().to_string()).collect();
        Pfs::new(&roots, &roots, Identity::of_uid(0).unwrap()).unwrap()
    }

    #[test]
    fn paths_must_be_under_the_tickets_scope_and_a_root() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("pfs");
        std::fs::create_dir_all(root.join("alice")).unwrap();
        std::fs::create_dir_all(root.join("bob")).unwrap();
        std::fs::write(root.join("alice/a"), b"a").unwrap();
        std::fs::write(root.join("bob/b"), b"b").unwrap();
        let roots = vec![root.display().to_string()];
        let scope = vec![format!("{}/alice", root.display())];
        let pfs = Pfs::new(&roots, &scope, Identity::of_uid(0).unwrap()).unwrap();
        assert!(pfs
            .open(&format!("{}/alice/a", root.display()), libc::O_RDONLY, 0)
            .is_ok());
        for bad in [
            format!("{}/bob/b", root.display()),
            format!("{}/alice/../bob/b", root.display()),
            format!("{}/alicex", root.display()),
            "/etc/shadow".to_string(),
        ] {
            let e = pfs.open(&bad, libc::O_RDONLY, 0).unwrap_err();
            assert_eq!(e.errno, libc::EACCES, "{bad}: {}", e.message);
        }
        // A scope beyond the server's roots opens nothing outside them.
        let wide = Pfs::new(&roots, &["/".to_string()], Identity::of_uid(0).unwrap()).unwrap();
        let e = wide.open("/etc/shadow", libc::O_RDONLY, 0).unwrap_err();
        assert_eq!(e.errno, libc::EACCES, "{}", e.message);
        // No roots configured: no stage at all.
        assert_eq!(
            Pfs::new(&[], &scope, Identity::of_uid(0).unwrap())
                .err()
                .map(|f| f.errno),
            Some(libc::EACCES)
        );
    }

    #[test]
    fn paths_must_be_under_a_root() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("pfs");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("a"), b"hello").unwrap();
        std::fs::write(d.path().join("outside"), b"no").unwrap();
        let pfs = root_pfs(&[&root]);
        let a = format!("{}/a", root.display());
        assert_eq!(pfs.lstat(&a).unwrap().size, 5);
        let e = pfs
            .open(
                &format!("{}/outside", d.path().display()),
                libc::O_RDONLY,
                0,
            )
            .unwrap_err();
        assert_eq!(e.errno, libc::EACCES, "{}", e.message);
        let e = pfs
            .open(&format!("{}/../outside", root.display()), libc::O_RDONLY, 0)
            .unwrap_err();
        assert_eq!(e.errno, libc::EACCES, "{}", e.message);
        let e = pfs.open("relative/a", libc::O_RDONLY, 0).unwrap_err();
        assert_eq!(e.errno, libc::EINVAL);
        // A root "/pfs" does not admit "/pfs2/x".
        let sibling = d.path().join("pfs2");
        std::fs::create_dir(&sibling).unwrap();
        std::fs::write(sibling.join("x"), b"x").unwrap();
        let e = pfs
            .open(&format!("{}/x", sibling.display()), libc::O_RDONLY, 0)
            .unwrap_err();
        assert_eq!(e.errno, libc::EACCES);
    }

    #[test]
    fn symlinks_are_followed_only_beneath_the_root() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("pfs");
        std::fs::create_dir_all(root.join("dir")).unwrap();
        std::fs::write(root.join("dir/real"), b"inside").unwrap();
        std::fs::write(d.path().join("secret"), b"outside").unwrap();
        std::os::unix::fs::symlink("real", root.join("dir/rel")).unwrap();
        std::os::unix::fs::symlink("../../secret", root.join("dir/climb")).unwrap();
        std::os::unix::fs::symlink(d.path().join("secret"), root.join("dir/abs")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
        let pfs = root_pfs(&[&root]);
        let p = |n: &str| format!("{}/{n}", root.display());
        assert!(pfs.open(&p("dir/rel"), libc::O_RDONLY, 0).is_ok());
        for bad in ["dir/climb", "dir/abs", "etc/passwd"] {
            let e = pfs.open(&p(bad), libc::O_RDONLY, 0).unwrap_err();
            assert_eq!(e.errno, libc::EACCES, "{bad}: {}", e.message);
            assert!(e.message.contains("leaves the PFS root"), "{}", e.message);
        }
    }

    #[test]
    fn a_temporary_is_created_new_renamed_into_place_or_removed() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("pfs");
        std::fs::create_dir_all(root.join("a")).unwrap();
        let r = root.display().to_string();
        let dst = format!("{r}/a/out");
        std::fs::write(&dst, b"old").unwrap();
        let pfs = Pfs::new(
            std::slice::from_ref(&r),
            std::slice::from_ref(&dst),
            Identity::of_uid(0).unwrap(),
        )
        .unwrap()
        .for_stage(9);
        let tmp = super::super::temp::path(&dst, 9, 0);
        // Not this stage's, not a temporary name: refused.
        let other = super::super::temp::path(&dst, 8, 0);
        assert_eq!(
            pfs.create_temporary(&other, 0o644).unwrap_err().errno,
            libc::EACCES
        );
        assert_eq!(
            pfs.create_temporary(&dst, 0o644).unwrap_err().errno,
            libc::EINVAL
        );
        {
            use std::io::Write;
            let mut f = pfs.create_temporary(&tmp, 0o644).unwrap();
            f.write_all(b"new").unwrap();
        }
        // O_EXCL: never an existing file (nor through a symlink).
        assert_eq!(
            pfs.create_temporary(&tmp, 0o644).unwrap_err().errno,
            libc::EEXIST
        );
        assert_eq!(
            std::fs::read(&dst).unwrap(),
            b"old",
            "the destination is untouched"
        );
        pfs.rename_into_place(&tmp, &dst).unwrap();
        pfs.sync_parent(&dst).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), b"new");
        assert!(!Path::new(&tmp).exists());
        // A temporary elsewhere is not this destination's.
        let tmp2 = super::super::temp::path(&dst, 9, 1);
        pfs.create_temporary(&tmp2, 0o644).unwrap();
        let e = pfs
            .rename_into_place(&tmp2, &format!("{r}/b/out"))
            .unwrap_err();
        assert_eq!(e.errno, libc::EINVAL);
        pfs.remove_temporary(&tmp2).unwrap();
        pfs.remove_temporary(&tmp2).unwrap(); // gone already: fine
        assert!(!Path::new(&tmp2).exists());
        assert_eq!(pfs.remove_temporary(&dst).unwrap_err().errno, libc::EINVAL);
        // A directory at the destination fails the file; a FIFO is never replaced.
        std::fs::create_dir(root.join("a/dir")).unwrap();
        let dir = format!("{r}/a/dir");
        let pfs = Pfs::new(
            std::slice::from_ref(&r),
            &[format!("{r}/a")],
            Identity::of_uid(0).unwrap(),
        )
        .unwrap()
        .for_stage(9);
        assert_eq!(pfs.check_destination(&dir).unwrap_err().errno, libc::EISDIR);
        let fifo = CString::new(format!("{r}/a/fifo")).unwrap();
        // SAFETY: a valid path string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let t = super::super::temp::path(&format!("{r}/a/fifo"), 9, 2);
        pfs.create_temporary(&t, 0o644).unwrap();
        let e = pfs
            .rename_into_place(&t, &format!("{r}/a/fifo"))
            .unwrap_err();
        assert_eq!(e.errno, libc::EINVAL, "{}", e.message);
    }

    #[test]
    fn walk_lists_a_tree_depth_first_in_name_order() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_path_buf();
        std::fs::create_dir_all(root.join("t/b/c")).unwrap();
        std::fs::write(root.join("t/a"), b"1").unwrap();
        std::fs::write(root.join("t/b/c/d"), b"22").unwrap();
        std::fs::write(root.join("t/z"), b"333").unwrap();
        std::os::unix::fs::symlink("a", root.join("t/l")).unwrap();
        let pfs = root_pfs(&[&root]);
        let w = pfs.walk(&format!("{}/t", root.display())).unwrap();
        let names: Vec<String> = w.iter().map(|(p, _)| p.display().to_string()).collect();
        assert_eq!(names, ["a", "b", "l", "z", "b/c", "b/c/d"]);
        assert!(w[2].1.is_symlink());
        assert_eq!(w[3].1.size, 3);
    }

    #[test]
    fn the_owner_needs_permission() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let f = d.path().join("private");
        std::fs::write(&f, b"x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let nobody = Identity {
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
        };
        let roots = [d.path().display().to_string()];
        let pfs = Pfs::new(&roots, &roots, nobody).unwrap();
        let e = pfs
            .open(&f.display().to_string(), libc::O_RDONLY, 0)
            .unwrap_err();
        assert_eq!(e.errno, libc::EACCES);
        let e = pfs
            .open(
                &format!("{}/new", d.path().display()),
                libc::O_WRONLY | libc::O_CREAT,
                0o644,
            )
            .unwrap_err();
        assert_eq!(
            e.errno,
            libc::EACCES,
            "cannot create in root's 0755 directory"
        );
    }
}
