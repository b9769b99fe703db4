//! Who may reach a cache instance's PFS directory: the protection of the directories
//! above it (docs/cache.md section 1, docs/security.md section 8).
//!
//! A mount of a cache shows the cached directory as its root, so the client kernel
//! checks a caller against that directory and what lies beneath it, never against the
//! PFS directories above it. On the PFS a 0700 home directory protects every file
//! beneath it whatever their own modes (files made with umask 022 are 0644); through
//! the mount they would be open to every user of the node and every job attaching the
//! instance. So the client asks the namespace server, per caller, whether that caller
//! can reach the directory on the PFS itself, and refuses the mount root to callers
//! who cannot (fs/gate.rs in the client).
//!
//! The question is answered by the PFS, not by a model of it: the server takes on the
//! caller's identity on one thread (uid, gid and supplementary groups, as the client's
//! kernel saw them) and opens the directory's path with `O_PATH`, which needs search
//! permission on every directory above it and nothing on the directory itself, exactly
//! what the PFS asks of the caller before its own checks beneath. ACLs, root squash and
//! security modules are the PFS's to apply. The opened directory must be the instance's
//! (device and inode): a path renamed away or replaced answers "no".
//!
//! When every directory above lets anybody through (search for owner, group and
//! others, and no access ACL), every caller gets the same answer, and the reply says
//! so: the client then asks no more per caller until its answer's lifetime ends.

use crate::error::{fs, StoreResult};
use spillway_types::identity::{as_identity, Identity};
use spillway_types::Errno;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The cached directory's path and identity, fixed at configuration.
pub(crate) struct Reach {
    path: CString,
    dev: u64,
    ino: u64,
}

fn errno() -> Errno {
    Errno(
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    )
}

fn fstat(fd: &impl AsRawFd) -> Result<libc::stat, Errno> {
    // SAFETY: a zeroed stat is a valid buffer for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; st is a valid, writable stat.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(errno());
    }
    Ok(st)
}

/// `path` opened `O_PATH` (following links, as the caller's own `open` would).
fn open_path(path: &CStr, extra: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: path is a valid C string; the result is checked.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC | extra) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A directory lets anybody search it: x for owner, group and others, and no access
/// ACL (which could refuse a named user or group). Looked at through its `O_PATH`
/// descriptor's procfs link, so the very inode reached is the one judged.
fn open_to_anybody(fd: &OwnedFd, st: &libc::stat) -> bool {
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR || st.st_mode & 0o111 != 0o111 {
        return false;
    }
    let Ok(link) = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
        return false;
    };
    // SAFETY: valid C strings; a null buffer of size 0 asks only for the length.
    let n = unsafe {
        libc::getxattr(
            link.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    // No ACL (ENODATA), or a file system without ACLs (EOPNOTSUPP).
    n < 0 && matches!(errno(), Errno::ENODATA | Errno::EOPNOTSUPP)
}

impl Reach {
    /// `pfs_dir`: the configured absolute path; `dir`: the directory it was opened to.
    pub(crate) fn new(pfs_dir: &str, dir: &impl AsRawFd) -> StoreResult<Reach> {
        let path = CString::new(pfs_dir).map_err(|_| fs(Errno::EINVAL))?;
        let st = fstat(dir)?;
        Ok(Reach {
            path,
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }

    /// Whether `caller` can reach the directory on the PFS: Ok(()) or EACCES (or the
    /// errno the PFS gave, ENOENT for a path that no longer leads to it).
    pub(crate) fn check(&self, caller: &Identity) -> StoreResult<()> {
        let opened = as_identity(caller, || open_path(&self.path, libc::O_DIRECTORY))?;
        let fd = match opened {
            Ok(fd) => fd,
            Err(Errno::EPERM) => return Err(fs(Errno::EACCES)),
            Err(e) => return Err(fs(e)),
        };
        let st = fstat(&fd)?;
        if (st.st_dev, st.st_ino) != (self.dev, self.ino) {
            // The path leads elsewhere now: the caller reaches another directory there.
            return Err(fs(Errno::EACCES));
        }
        Ok(())
    }

    /// Every directory above the cached one (from `/`) lets anybody through, and the
    /// path still leads to it without a symbolic link: every caller gets the same
    /// answer. Any doubt answers false (each caller is then asked about alone).
    pub(crate) fn open_to_all(&self) -> bool {
        let bytes = self.path.as_bytes();
        if bytes.first() != Some(&b'/') {
            return false;
        }
        let Ok(mut cur) = open_path(c"/", libc::O_DIRECTORY) else {
            return false;
        };
        for comp in bytes.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
            let Ok(st) = fstat(&cur) else { return false };
            if !open_to_anybody(&cur, &st) {
                return false;
            }
            let Ok(name) = CString::new(comp) else {
                return false;
            };
            // SAFETY: cur is an open directory; name is one component; checked below.
            let fd = unsafe {
                libc::openat(
                    cur.as_raw_fd(),
                    name.as_ptr(),
                    libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                )
            };
            if fd < 0 {
                return false;
            }
            // SAFETY: fd was just opened and is owned by nobody else.
            cur = unsafe { OwnedFd::from_raw_fd(fd) };
        }
        matches!(fstat(&cur), Ok(st) if (st.st_dev, st.st_ino) == (self.dev, self.ino))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &std::path::Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn nobody() -> Identity {
        Identity {
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
        }
    }

    #[test]
    fn a_closed_ancestor_refuses_others_and_lets_its_owner_through() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return; // Taking on another identity needs root.
        }
        let t = tempfile::tempdir().unwrap();
        chmod(t.path(), 0o755);
        let priv_dir = t.path().join("priv");
        let data = priv_dir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        chmod(&data, 0o777);
        let dir = std::fs::File::open(&data).unwrap();
        let reach = Reach::new(data.to_str().unwrap(), &dir).unwrap();

        chmod(&priv_dir, 0o755);
        reach.check(&nobody()).unwrap();
        // Above tempdir's own parents: /tmp is 1777, so open to all when they are.
        let all = reach.open_to_all();

        chmod(&priv_dir, 0o700);
        assert!(!reach.open_to_all());
        assert_eq!(reach.check(&nobody()).unwrap_err().errno(), Errno::EACCES);
        // Root (the owner here) still passes.
        let root = Identity {
            uid: 0,
            gid: 0,
            groups: vec![0],
        };
        reach.check(&root).unwrap();

        // Through the group: 0710 with nobody's group.
        std::os::unix::fs::chown(&priv_dir, None, Some(65534)).unwrap();
        chmod(&priv_dir, 0o710);
        reach.check(&nobody()).unwrap();
        assert!(!reach.open_to_all());

        // The path renamed away and another directory put in its place: refused.
        chmod(&priv_dir, 0o755);
        std::fs::rename(&data, priv_dir.join("moved")).unwrap();
        std::fs::create_dir(&data).unwrap();
        assert_eq!(reach.check(&root).unwrap_err().errno(), Errno::EACCES);
        assert!(!reach.open_to_all());
        let _ = all;
    }
}
