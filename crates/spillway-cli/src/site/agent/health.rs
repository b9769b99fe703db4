//! Whether a mount the agent made is still served. A FUSE mount outlives its client:
//! when the `spillway mount` process dies (killed, or crashed), the kernel keeps the
//! mount in the table and every access to it fails with ENOTCONN — while the mount
//! table, which is all the agent looked at, still lists it. Two signs tell a dead mount:
//!
//! * its client process (the pid in the mount's pidfile, verified to be that mount's
//!   `spillway mount`) is gone;
//! * a stat of the mount point, forced to ask the client (`AT_STATX_FORCE_SYNC`), fails
//!   with ENOTCONN (the connection was aborted though a process holds the pid).
//!
//! The stat runs in a thread of its own and is waited for only `PROBE_WAIT`: a client
//! that is alive but slow (its servers are, say, restarting) blocks the stat, and the
//! agent must not block with it; a slow mount is not a dead one. At most one probe per
//! mount point is outstanding, so a hung client costs one parked thread, not one per
//! check.

use crate::sys::mounts::is_client_of;
use crate::sys::proc::alive;
use std::collections::HashSet;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// How long a check waits for the stat of a mount point.
const PROBE_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Served (or at least not known to be dead: a stat still waiting counts here).
    Alive,
    /// Dead, and why.
    Dead(String),
}

/// Checks mounts; remembers which probes are still waiting on a hung client.
#[derive(Default)]
pub struct Prober {
    waiting: Arc<Mutex<HashSet<PathBuf>>>,
}

/// The pid `pidfile` names, if it names one (a missing file: none).
fn pid_in(pidfile: &Path) -> Option<i32> {
    std::fs::read_to_string(pidfile)
        .ok()?
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|p| *p > 0)
}

/// statx of `path` itself, asking the file system (not its caches).
fn stat_synced(path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: statx is plain data; all zeroes is a valid value.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated and sx a valid out pointer.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_FORCE_SYNC,
            libc::STATX_TYPE,
            &mut sx,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What a stat's outcome says about the mount.
pub fn judge_stat(mnt: &Path, r: &io::Result<()>) -> Health {
    match r {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Health::Dead(format!(
            "{}: {e} (its client no longer serves it)",
            mnt.display()
        )),
        _ => Health::Alive,
    }
}

impl Prober {
    /// The health of the mount at `mnt` whose client wrote `pidfile`.
    pub fn check(&self, mnt: &Path, pidfile: &Path) -> Health {
        if let Some(pid) = pid_in(pidfile) {
            if !alive(pid) || !is_client_of(pid, pidfile) {
                return Health::Dead(format!("its client process {pid} has exited"));
            }
        }
        match self.probe(mnt) {
            Some(r) => judge_stat(mnt, &r),
            None => Health::Alive,
        }
    }

    /// Stat `mnt` in a thread, waiting up to PROBE_WAIT. None: no answer yet (or an
    /// earlier probe of it is still waiting).
    fn probe(&self, mnt: &Path) -> Option<io::Result<()>> {
        {
            let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            if !w.insert(mnt.to_path_buf()) {
                return None;
            }
        }
        let (tx, rx) = mpsc::channel();
        let (path, waiting) = (mnt.to_path_buf(), self.waiting.clone());
        let spawned = std::thread::Builder::new()
            .name("mount-probe".into())
            .spawn(move || {
                let r = stat_synced(&path);
                waiting
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&path);
                let _ = tx.send(r);
            });
        if spawned.is_err() {
            self.waiting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(mnt);
            return None;
        }
        rx.recv_timeout(PROBE_WAIT).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enotconn_is_dead_other_outcomes_are_not() {
        let m = Path::new("/m/x");
        let dead = judge_stat(m, &Err(io::Error::from_raw_os_error(libc::ENOTCONN)));
        assert!(
            matches!(dead, Health::Dead(ref w) if w.contains("/m/x")),
            "{dead:?}"
        );
        assert_eq!(judge_stat(m, &Ok(())), Health::Alive);
        // A slow or failing server behind a live client is not a dead mount.
        for e in [libc::EIO, libc::ETIMEDOUT, libc::EACCES] {
            assert_eq!(
                judge_stat(m, &Err(io::Error::from_raw_os_error(e))),
                Health::Alive
            );
        }
    }

    #[test]
    fn a_pidfile_naming_a_gone_or_foreign_process_is_dead() {
        let d = std::env::temp_dir().join(format!("spillway-health-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let pf = d.join("client.pid");
        let p = Prober::default();
        // A process that exited (reaped: its pid is free, or someone else's).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        std::fs::write(&pf, format!("{pid}\n")).unwrap();
        assert!(matches!(p.check(&d, &pf), Health::Dead(ref w) if w.contains("exited")));
        // A live process that is not this mount's client (this test).
        std::fs::write(&pf, format!("{}\n", std::process::id())).unwrap();
        assert!(matches!(p.check(&d, &pf), Health::Dead(_)));
        // No pidfile: only the stat decides (a plain directory answers).
        std::fs::remove_file(&pf).unwrap();
        assert_eq!(p.check(&d, &pf), Health::Alive);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
