//! What FUSE does not tell a file system about the calling thread, read from
//! `/proc/<tid>/` (the request's pid is the calling thread's id in the client's pid
//! namespace): its supplementary groups and capabilities (the permission check of an
//! open the kernel left to us, fs/existing.rs), the system call it is in (fuser does
//! not pass FUSE_LK_FLOCK, and flock(2) and fcntl(2) locks live apart), and whether a
//! signal waits for it (to end a lock wait as the kernel would end a local one).

use std::collections::HashMap;

/// CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER (linux/capability.h).
pub(crate) const CAP_DAC_OVERRIDE: u32 = 1;
pub(crate) const CAP_DAC_READ_SEARCH: u32 = 2;
pub(crate) const CAP_FOWNER: u32 = 3;

/// SIGKILL's bit in the pending masks.
const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);

/// `/proc/<tid>/status` as key → value.
fn status(tid: u32) -> Option<HashMap<String, String>> {
    if tid == 0 {
        return None;
    }
    let text = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect(),
    )
}

fn hex(s: Option<&String>) -> u64 {
    s.and_then(|v| u64::from_str_radix(v, 16).ok()).unwrap_or(0)
}

/// The credentials a permission check needs.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    caps: u64,
}

impl Caller {
    /// The caller of a request (its filesystem uid and gid, from the request): groups
    /// and effective capabilities of thread `tid`; when its /proc entry cannot be read
    /// (another pid namespace), the user's groups from the name service and root's
    /// capabilities for uid 0 only.
    pub(crate) fn of(uid: u32, gid: u32, tid: u32) -> Caller {
        if let Some(st) = status(tid) {
            let groups = st
                .get("Groups")
                .map(|g| {
                    g.split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
            return Caller {
                uid,
                gid,
                groups,
                caps: hex(st.get("CapEff")),
            };
        }
        let groups = spillway_types::identity::Identity::of_uid(uid)
            .map(|id| id.groups)
            .unwrap_or_default();
        Caller {
            uid,
            gid,
            groups,
            caps: if uid == 0 { u64::MAX } else { 0 },
        }
    }

    /// As the wire carries it to a cache's namespace server (cache instances make
    /// removals and renames on the PFS as the caller; fs/gate.rs).
    pub(crate) fn wire(&self) -> spillway_wire::messages::Caller {
        spillway_wire::messages::Caller {
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
        }
    }

    pub(crate) fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    pub(crate) fn has_cap(&self, cap: u32) -> bool {
        self.caps & (1 << cap) != 0
    }

    /// The kernel's `generic_permission` for a regular file, `want` being a mask of
    /// 4 (read) and 2 (write), without ACLs (the caller sends files with an ACL back
    /// to the kernel).
    pub(crate) fn may(&self, mode: u32, file_uid: u32, file_gid: u32, want: u32) -> bool {
        let bits = if self.uid == file_uid {
            (mode >> 6) & 7
        } else if self.in_group(file_gid) {
            (mode >> 3) & 7
        } else {
            mode & 7
        };
        if bits & want == want {
            return true;
        }
        if self.has_cap(CAP_DAC_OVERRIDE) {
            return true;
        }
        want == 4 && self.has_cap(CAP_DAC_READ_SEARCH)
    }
}

/// Whether thread `tid` is in flock(2) now (it is blocked in the system call while
/// its FUSE request is served). Anything unreadable counts as fcntl.
pub(crate) fn in_flock(tid: u32) -> bool {
    if tid == 0 {
        return false;
    }
    std::fs::read_to_string(format!("/proc/{tid}/syscall"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<i64>().ok())
        .is_some_and(|nr| nr == libc::SYS_flock)
}

/// Watches a waiting thread for signals, as the kernel's own lock wait would wake.
#[derive(Default)]
pub(crate) struct SignalWatch {
    shared_seen: u64,
}

/// What a look at a waiting thread found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Waiter {
    Waiting,
    /// A signal it does not block is pending for it (or it is being killed).
    Signalled,
    /// Its /proc entry is gone (it exited) or was never readable.
    Gone,
}

impl SignalWatch {
    /// A signal sent to the thread itself that it does not block counts at once; one
    /// sent to its process only when still pending at the next look (another thread
    /// may take it first); SIGKILL always.
    pub(crate) fn look(&mut self, tid: u32) -> Waiter {
        let Some(st) = status(tid) else {
            return Waiter::Gone;
        };
        let blocked = hex(st.get("SigBlk"));
        let own = hex(st.get("SigPnd"));
        let shared = hex(st.get("ShdPnd"));
        if (own | shared) & SIGKILL_BIT != 0 || own & !blocked != 0 {
            return Waiter::Signalled;
        }
        let shared = shared & !blocked;
        let stale = shared & self.shared_seen;
        self.shared_seen = shared;
        if stale != 0 {
            Waiter::Signalled
        } else {
            Waiter::Waiting
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gettid() -> u32 {
        // SAFETY: gettid has no arguments and cannot fail.
        unsafe { libc::syscall(libc::SYS_gettid) as u32 }
    }

    #[test]
    fn reads_this_threads_credentials() {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let c = Caller::of(uid, gid, gettid());
        assert!(c.in_group(gid));
        assert!(c.may(0o600, uid, gid, 6));
        assert!(!in_flock(gettid()), "reading our own syscall: running");
    }

    #[test]
    fn permission_bits() {
        let c = Caller {
            uid: 1000,
            gid: 100,
            groups: vec![100, 20],
            caps: 0,
        };
        assert!(c.may(0o640, 1000, 0, 6));
        assert!(!c.may(0o440, 1000, 0, 2), "owner bits only for the owner");
        assert!(c.may(0o060, 0, 20, 6), "supplementary group");
        assert!(!c.may(0o604, 0, 30, 2));
        assert!(c.may(0o604, 0, 30, 4));
        let root = Caller {
            caps: 1 << CAP_DAC_OVERRIDE,
            ..c.clone()
        };
        assert!(root.may(0o000, 0, 0, 6));
        let reader = Caller {
            caps: 1 << CAP_DAC_READ_SEARCH,
            ..c
        };
        assert!(reader.may(0o000, 0, 0, 4));
        assert!(!reader.may(0o000, 0, 0, 2));
    }

    #[test]
    fn a_missing_thread_is_gone() {
        assert_eq!(SignalWatch::default().look(0), Waiter::Gone);
        assert_eq!(SignalWatch::default().look(u32::MAX), Waiter::Gone);
        assert_eq!(SignalWatch::default().look(gettid()), Waiter::Waiting);
    }
}
