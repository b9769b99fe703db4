//! `spillway cluster down` and busy mounts: which processes hold a mount (open files,
//! working or root directories, mapped files: from /proc), and what `--force` does.
//!
//! Without `--force` a busy mount stops the command before anything is unmounted or
//! stopped, naming every holder: a process's writes still in the client's write-behind
//! would otherwise be lost when the servers go. With `--force` each file a holder has
//! open or mapped is reopened through /proc and fsync'ed (the kernel writes its dirty
//! pages to the client, the client its write-behind to the servers: what can be
//! flushed is), then the mount is detached and its client killed, so the holders get
//! errors from then on; a file whose flush failed is reported and the command fails.

use crate::sys::mounts::{is_client_of, mount_state, Mounted};
use crate::sys::proc::stop_pid;
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// One process holding a mount, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: i32,
    pub comm: String,
    /// What it holds: `/mnt/f (fd 3)`, `its working directory`, `/mnt/lib.so (mapped)`.
    pub how: Vec<String>,
    /// Files to flush (paths to open: `/proc/<pid>/fd/<n>` or mapped paths).
    pub files: Vec<PathBuf>,
}

/// Whether `p` is `base` or below it, component by component.
fn within(p: &str, base: &str) -> bool {
    p == base
        || p.strip_prefix(base)
            .is_some_and(|r| r.starts_with('/') || base.ends_with('/'))
}

/// The mount id an open descriptor is on (`mnt_id:` of /proc/PID/fdinfo/N).
fn fd_mount_id(pid: i32, fd: &str) -> Option<u64> {
    let info = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Every process but this one that holds mount `mnt_id` at `mount_point`.
pub fn holders(mount_point: &Path, mnt_id: u64) -> Vec<Holder> {
    let me = std::process::id() as i32;
    let mp = mount_point.to_string_lossy().into_owned();
    let mut out = Vec::new();
    let Ok(procs) = fs::read_dir("/proc") else {
        return out;
    };
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let mut h = Holder {
            pid,
            comm: fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim().to_string())
                .unwrap_or_default(),
            how: Vec::new(),
            files: Vec::new(),
        };
        if let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) {
            for fd in fds.flatten() {
                let n = fd.file_name().to_string_lossy().into_owned();
                if fd_mount_id(pid, &n) != Some(mnt_id) {
                    continue;
                }
                let target = fs::read_link(fd.path())
                    .map(|t| t.display().to_string())
                    .unwrap_or_else(|_| "?".into());
                h.how.push(format!("{target} (fd {n})"));
                h.files.push(fd.path());
            }
        }
        for (link, what) in [
            ("cwd", "its working directory"),
            ("root", "its root directory"),
        ] {
            if let Ok(t) = fs::read_link(format!("/proc/{pid}/{link}")) {
                if within(&t.to_string_lossy(), &mp) {
                    h.how.push(format!("{what} {}", t.display()));
                }
            }
        }
        if let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) {
            let mapped: BTreeSet<&str> = maps
                .lines()
                .filter_map(|l| l.split_whitespace().nth(5))
                .filter(|p| within(p, &mp))
                .collect();
            for p in mapped {
                h.how.push(format!("{p} (mapped)"));
                h.files.push(PathBuf::from(p));
            }
        }
        if !h.how.is_empty() {
            out.push(h);
        }
    }
    out
}

/// `pid 12 (python3): /mnt/f (fd 3), its working directory /mnt`
pub fn describe(h: &Holder) -> String {
    format!("pid {} ({}): {}", h.pid, h.comm, h.how.join(", "))
}

/// Flush what the holders wrote: every regular file they hold is reopened and
/// fsync'ed. Returns one line per file that could not be flushed.
pub fn flush(holders: &[Holder]) -> Vec<String> {
    let mut failed = Vec::new();
    for h in holders {
        for f in &h.files {
            let file = match fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(f)
            {
                Ok(file) => file,
                // Sockets, pipes, directories gone: nothing of theirs to flush.
                Err(_) => continue,
            };
            if !file.metadata().map(|m| m.is_file()).unwrap_or(false) {
                continue;
            }
            if let Err(e) = file.sync_all() {
                let name = fs::read_link(f).unwrap_or_else(|_| f.clone());
                failed.push(format!(
                    "{} (pid {}, {}): {e}",
                    name.display(),
                    h.pid,
                    h.comm
                ));
            }
        }
    }
    failed
}

/// Busy mounts and who holds each.
pub type Held = Vec<(PathBuf, Vec<Holder>)>;

/// The mounts some process holds (files open or mapped, a working directory in them).
pub fn held_mounts(mounts: &[(PathBuf, Option<PathBuf>)]) -> Held {
    let mut held = Vec::new();
    for (m, _) in mounts {
        if let Ok(Some(Mounted::Spillway(e))) = mount_state(m) {
            let h = holders(m, e.id);
            if !h.is_empty() {
                held.push((m.clone(), h));
            }
        }
    }
    held
}

/// Why `cluster down` stops without `--force`: every busy mount and its holders.
pub fn busy_message(held: &Held) -> String {
    let mut s = String::new();
    for (m, hs) in held {
        s.push_str(&format!("{} is busy:\n", m.display()));
        for h in hs {
            s.push_str(&format!("  {}\n", describe(h)));
        }
    }
    s.push_str(
        "nothing was stopped: end these processes (what they wrote may still be in the client), \
         or use --force (flushes what they wrote, then detaches the mount; they get errors after)",
    );
    s
}

/// `--force` on a held mount: flush the holders' files, detach the mount, kill its
/// client (the holders' later calls fail with ENOTCONN). Returns what went wrong.
pub fn force_off(m: &Path, holders: &[Holder], pidfile: Option<&Path>) -> Vec<String> {
    let mut errors: Vec<String> = flush(holders)
        .into_iter()
        .map(|f| format!("DATA NOT FLUSHED: {f}"))
        .collect();
    for h in holders {
        eprintln!("spillway: --force: {} held by {}", m.display(), describe(h));
    }
    let c = match std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) {
        Ok(c) => c,
        Err(_) => return vec![format!("{}: bad path", m.display())],
    };
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) } != 0 {
        errors.push(format!(
            "cannot detach {}: {}",
            m.display(),
            std::io::Error::last_os_error()
        ));
    }
    // The detached mount lives on for its holders until the client goes.
    let pid = pidfile
        .and_then(|pf| std::fs::read_to_string(pf).ok())
        .and_then(|t| t.trim().parse::<i32>().ok())
        .filter(|p| *p > 0);
    if let (Some(pid), Some(pf)) = (pid, pidfile) {
        if is_client_of(pid, pf) {
            stop_pid(pid, libc::SIGKILL);
        }
    }
    if errors.is_empty() {
        eprintln!(
            "spillway: --force: {}: the holders' files were flushed; the mount is detached",
            m.display()
        );
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_is_by_component() {
        assert!(within("/a/mnt", "/a/mnt"));
        assert!(within("/a/mnt/x", "/a/mnt"));
        assert!(!within("/a/mnt2", "/a/mnt"));
        assert!(within("/x", "/"));
    }

    #[test]
    fn a_mount_nobody_holds_has_no_holders() {
        // Our own descriptors are skipped (the scan runs in `cluster down` itself); the
        // integration test (tests/test_edges.py) checks a real holder is named.
        let d = std::env::temp_dir().join(format!("spw-busy-{}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        assert!(holders(&d, u64::MAX).is_empty());
        fs::remove_dir_all(&d).unwrap();
    }
}
