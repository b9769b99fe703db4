//! Taking Spillway mounts down: one mount (`umount_once`, detaching a busy one;
//! `umount_if_idle`, leaving a busy one), or every Spillway mount stacked at a path
//! root's own tools name, then its client (`unmount`). The agent's unmount below its
//! mount root (`site::agent::mount_root`) is built from the same calls.

use super::client::stop_client;
use super::fd::cstr;
use super::table::{describe, is_mounted, mount_state, Mounted};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A stack deeper than this at one mount point is not ours to unwind.
pub const MAX_STACKED: usize = 64;

/// Unmount the topmost mount at `path` without following a final symlink; a busy one
/// is detached (its open files keep working, new lookups do not reach it).
pub fn umount_once(path: &Path) -> Result<(), String> {
    let c = cstr(path.as_os_str().as_bytes(), path)?;
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::UMOUNT_NOFOLLOW) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EBUSY) {
        return Err(format!("cannot unmount {}: {e}", path.display()));
    }
    tracing::warn!("{} busy ({e}); detaching it lazily", path.display());
    // SAFETY: as above.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) } != 0 {
        let e = io::Error::last_os_error();
        return Err(format!("cannot detach {}: {e}", path.display()));
    }
    Ok(())
}

/// Unmount the topmost mount at `path` only if nothing uses it (no open file, working
/// directory or mount inside it): false when it is busy, and then it stays as it is.
/// For a dead mount (its client gone): detaching one that processes still hold would
/// leave them on a dead file system under a mount point that looks fine again.
/// `path` must have been walked (`MountRoot::walk`) like `umount_once`'s.
pub fn umount_if_idle(path: &Path) -> Result<bool, String> {
    let c = cstr(path.as_os_str().as_bytes(), path)?;
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::UMOUNT_NOFOLLOW) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EBUSY) {
        return Ok(false);
    }
    Err(format!("cannot unmount {}: {e}", path.display()))
}

/// Unmount every Spillway mount stacked at `path` and stop the client of `pidfile`
/// (root's tools; the agent uses `MountRoot::unmount`). Something else mounted there
/// is an error.
pub fn unmount(path: &Path, pidfile: Option<&Path>) -> Result<(), String> {
    for _ in 0..MAX_STACKED {
        match mount_state(path)? {
            Some(Mounted::Spillway(_)) => umount_once(path)?,
            Some(Mounted::Other(e)) => {
                return Err(format!(
                    "{}: {} is mounted there, not Spillway: left alone",
                    path.display(),
                    describe(Some(&e), e.id)
                ))
            }
            _ => break,
        }
    }
    if is_mounted(path) {
        return Err(format!(
            "{} is still mounted after {MAX_STACKED} unmounts",
            path.display()
        ));
    }
    if let Some(pf) = pidfile {
        stop_client(pf)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_spillway_is_left_alone() {
        // /proc is a mount point of its own, not Spillway's.
        let e = unmount(Path::new("/proc"), None).err().unwrap();
        assert!(e.contains("not Spillway"), "{e}");
    }
}
