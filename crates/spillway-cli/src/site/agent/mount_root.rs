//! Where the agent mounts: only below its own `mount_root`, through directories no
//! user can change.
//!
//! The root and each of its ancestors must be root-owned directories not writable by
//! group or other (an ancestor may be if it is sticky, like `/tmp`: its child must then
//! still be root's). Below the root every component is opened relative to its parent
//! with `O_NOFOLLOW` (never through a symbolic link), created `0755` by root if missing,
//! and must be a root-owned directory not writable by group or other on the same mount
//! as the root. A path that passes is made only of directories no user can change, so
//! the path given to mount(2) later still names the same directory. What is mounted at
//! it is the kernel's word (`sys::mounts`).

use crate::sys::mounts::client::stop_client;
use crate::sys::mounts::fd::{cstr, open_checked, open_path, stat_fd, Stat};
use crate::sys::mounts::table::{describe, mount_entry, Mounted};
use crate::sys::mounts::umount::{umount_once, MAX_STACKED};
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The agent's `mount_root` unless `agent.conf` names another.
pub const DEFAULT_MOUNT_ROOT: &str = "/var/opt/spillway/mounts";

/// The check every directory of the path passes: a directory, root's, and not writable
/// by group or other (unless `sticky_ok` and the sticky bit is set: then only the owner
/// of an entry may replace it, and the next component is checked to be root's).
fn check_dir(st: &Stat, path: &Path, sticky_ok: bool) -> Result<(), String> {
    if !st.is_dir() {
        return Err(format!(
            "{} is {}, not a directory: refusing to mount through it",
            path.display(),
            st.what()
        ));
    }
    if st.uid != 0 {
        return Err(format!(
            "{} is owned by uid {}, not root: refusing to mount through it",
            path.display(),
            st.uid
        ));
    }
    let writable = st.mode & 0o022 != 0;
    let sticky = st.mode & libc::S_ISVTX != 0;
    if writable && !(sticky_ok && sticky) {
        return Err(format!(
            "{} is writable by group or other (mode {:o}): refusing to mount through it",
            path.display(),
            st.mode & 0o7777
        ));
    }
    Ok(())
}

/// The components of `p` after `root`, by component: `p` must be absolute, without `.`,
/// `..` or empty components, and strictly below `root`. None: not below it.
pub fn below<'a>(root: &Path, p: &'a Path) -> Result<Option<Vec<&'a [u8]>>, String> {
    let bytes = p.as_os_str().as_bytes();
    let Some(rest) = bytes.strip_prefix(b"/") else {
        return Err(format!("mount point {} is not absolute", p.display()));
    };
    let parts: Vec<&[u8]> = rest.split(|b| *b == b'/').collect();
    if parts
        .iter()
        .any(|c| c.is_empty() || *c == b"." || *c == b"..")
    {
        return Err(format!(
            "mount point {} has an empty, . or .. component",
            p.display()
        ));
    }
    let root: Vec<&[u8]> = root
        .as_os_str()
        .as_bytes()
        .split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    if parts.len() <= root.len() || parts[..root.len()] != root[..] {
        return Ok(None);
    }
    Ok(Some(parts[root.len()..].to_vec()))
}

/// The agent's mount root, opened and checked (see the module's comment).
pub struct MountRoot {
    /// As configured (what the manager's paths start with).
    configured: PathBuf,
    /// With symbolic links of its ancestors resolved: where mounts really go.
    pub path: PathBuf,
    fd: OwnedFd,
    mnt_id: u64,
}

/// A mount point below the root, walked and checked.
pub struct MountPoint {
    /// Its full path (below the resolved root).
    pub path: PathBuf,
    parent: OwnedFd,
    name: CString,
    /// What is mounted there now.
    pub mounted: Mounted,
}

impl MountRoot {
    /// Open `configured` (absolute), creating what is missing as root 0755, and check
    /// it and every ancestor.
    pub fn open(configured: &Path) -> Result<MountRoot, String> {
        if !configured.is_absolute() {
            return Err(format!(
                "mount_root {} is not absolute",
                configured.display()
            ));
        }
        if configured
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(format!(
                "mount_root {} has a .. component",
                configured.display()
            ));
        }
        // Resolve the existing part (an admin's symlink such as /var/run → /run is
        // fine: every directory of the result is checked below), keep the rest.
        let mut existing = configured.to_path_buf();
        let mut missing = Vec::new();
        while std::fs::symlink_metadata(&existing).is_err() {
            match (existing.file_name(), existing.parent()) {
                (Some(n), Some(p)) => {
                    missing.push(n.to_os_string());
                    existing = p.to_path_buf();
                }
                _ => break,
            }
        }
        let mut path = std::fs::canonicalize(&existing)
            .map_err(|e| format!("mount_root {}: {e}", existing.display()))?;
        for n in missing.iter().rev() {
            path.push(n);
        }
        let parts: Vec<&[u8]> = path
            .as_os_str()
            .as_bytes()
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty())
            .collect();
        let mut fd = open_path(c"/").map_err(|e| format!("/: {e}"))?;
        let st = stat_fd(fd.as_fd()).map_err(|e| format!("/: {e}"))?;
        let mut at = PathBuf::from("/");
        check_dir(&st, &at, true)?;
        let mut mnt_id = st.mnt_id;
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            at.push(OsStr::from_bytes(part));
            let name = cstr(part, &at)?;
            let (next, st) = open_checked(fd.as_fd(), &name, &at, true)?
                .ok_or_else(|| format!("{} vanished while being created", at.display()))?;
            // The root itself is never writable by others, even sticky: users could
            // otherwise make the directories the agent later refuses.
            check_dir(&st, &at, !last)?;
            mnt_id = st.mnt_id;
            fd = next;
        }
        Ok(MountRoot {
            configured: configured.to_path_buf(),
            path,
            fd,
            mnt_id,
        })
    }

    /// Whether `p` lies strictly below this root (as configured or resolved).
    pub fn contains(&self, p: &Path) -> bool {
        self.relative(p).is_ok()
    }

    /// The components of `p` below this root (as configured or resolved).
    fn relative<'a>(&self, p: &'a Path) -> Result<Vec<&'a [u8]>, String> {
        if let Some(r) = below(&self.configured, p)? {
            return Ok(r);
        }
        if let Some(r) = below(&self.path, p)? {
            return Ok(r);
        }
        Err(format!(
            "mount point {} is not below this node's mount root {}: refused",
            p.display(),
            self.configured.display()
        ))
    }

    /// Walk from the root to `p`, creating missing directories when `create` (None when
    /// one is missing and not `create`), checking each, and tell what is mounted at `p`.
    pub fn walk(&self, p: &Path, create: bool) -> Result<Option<MountPoint>, String> {
        let rel = self.relative(p)?;
        let mut path = self.path.clone();
        let mut parent = open_path(c"/").map_err(|e| format!("/: {e}"))?;
        // A second handle on the root: OwnedFd has no cheap clone without a syscall.
        let mut cur = self
            .fd
            .try_clone()
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        let mut name = CString::default();
        let mut mounted = Mounted::No;
        for (i, part) in rel.iter().enumerate() {
            let last = i + 1 == rel.len();
            path.push(OsStr::from_bytes(part));
            let n = cstr(part, &path)?;
            let Some((fd, st)) = open_checked(cur.as_fd(), &n, &path, create)? else {
                return Ok(None);
            };
            if st.mnt_id != self.mnt_id {
                let entry =
                    mount_entry(st.mnt_id).map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
                if !last {
                    return Err(format!(
                        "{} is a mount point ({}): refusing to mount inside another mount",
                        path.display(),
                        describe(entry.as_ref(), st.mnt_id)
                    ));
                }
                mounted = Mounted::of(entry, &path, st.mnt_id)?;
            } else {
                check_dir(&st, &path, false)?;
            }
            if last {
                name = n;
            }
            parent = cur;
            cur = fd;
        }
        Ok(Some(MountPoint {
            path,
            parent,
            name,
            mounted,
        }))
    }

    /// Make `p` ready for a mount: walked, created and checked. Fails if anything but a
    /// Spillway mount is mounted there.
    pub fn prepare(&self, p: &Path) -> Result<MountPoint, String> {
        let mp = self
            .walk(p, true)?
            .ok_or_else(|| format!("{} vanished while being created", p.display()))?;
        if let Mounted::Other(e) = &mp.mounted {
            return Err(format!(
                "{}: {} is mounted there, not Spillway: refusing to mount over it",
                mp.path.display(),
                describe(Some(e), e.id)
            ));
        }
        Ok(mp)
    }

    /// Remove everything at `p`: every Spillway mount stacked there, the client
    /// process of `pidfile`, and the directory. Something else mounted there is an error.
    pub fn unmount(&self, p: &Path, pidfile: Option<&Path>) -> Result<(), String> {
        // A path the walk refuses (a symlink, someone else's directory, another
        // mount on the way) is one this agent never mounted on: nothing to take down
        // there, and nothing to remove.
        let walk = |what: &str| match self.walk(p, false) {
            Ok(mp) => mp,
            Err(e) => {
                tracing::info!("{e}: nothing of ours {what}");
                None
            }
        };
        for _ in 0..MAX_STACKED {
            let Some(mp) = walk("to unmount") else {
                break;
            };
            match &mp.mounted {
                Mounted::No => break,
                Mounted::Other(e) => {
                    return Err(format!(
                        "{}: {} is mounted there, not Spillway: left alone",
                        mp.path.display(),
                        describe(Some(e), e.id)
                    ))
                }
                // The walk checked every directory of the path: the path names this
                // mount (no user can change any of its directories).
                Mounted::Spillway(_) => umount_once(&mp.path)?,
            }
        }
        let mp = walk("to remove");
        if let Some(mp) = &mp {
            if mp.mounted != Mounted::No {
                return Err(format!(
                    "{} is still mounted after {MAX_STACKED} unmounts",
                    mp.path.display()
                ));
            }
        }
        if let Some(pf) = pidfile {
            stop_client(pf)?;
        }
        if let Some(mp) = mp {
            // SAFETY: parent is an open directory fd, name NUL-terminated.
            let r = unsafe {
                libc::unlinkat(mp.parent.as_raw_fd(), mp.name.as_ptr(), libc::AT_REMOVEDIR)
            };
            if r != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::ENOENT) {
                    tracing::warn!("cannot remove mount point {}: {e}", mp.path.display());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
