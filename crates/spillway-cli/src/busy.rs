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
