//! The protection of the PFS directories above a cache instance's directory
//! (docs/cache.md section 1, docs/security.md section 8).
//!
//! A cache mount's root is the cached PFS directory itself, so the kernel's own checks
//! (`default_permissions`) see that directory and what lies beneath it, never the
//! directories above it on the PFS: a 0700 home directory would protect nothing of
//! what is cached below it. The gate keeps that protection at the mount root:
//!
//! * the root's attributes always go to the kernel with a lifetime of zero, so every
//!   permission check the kernel makes on the root (each path walk through it, each
//!   open, listing, create or removal in it) asks for them first (GETATTR), with the
//!   caller's credentials in the request;
//! * that GETATTR, and the calls on the root that need no permission check (statfs,
//!   extended attributes), answer EACCES to a caller who cannot reach the directory on
//!   the PFS itself; the kernel's check then fails with it (fuse_permission), as the
//!   PFS's own path walk would.
//!
//! Whether a caller can reach it is the PFS's answer, asked of the namespace server
//! (`CacheAccessReq`, crates/spillway-server/src/cache/reach.rs, which opens the path
//! as the caller) and kept for `attr_ttl`, per (uid, gid, groups); when the server says
//! nothing above the directory is closed to anybody, nobody is asked about for that
//! long. Root (uid 0) on the node is not asked about: it could read the node's memory.

use crate::caller::Caller;
use spillway_stubs::Instance;
use spillway_types::Errno;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Callers whose answers are kept at once; past it the oldest half goes.
const KEPT: usize = 4096;

type Key = (u32, u32, Vec<u32>);

#[derive(Default)]
struct Answers {
    /// Until then every caller passes.
    open_until: Option<Instant>,
    by_caller: HashMap<Key, (Instant, bool)>,
}

pub(crate) struct Gate {
    inst: Arc<Instance>,
    ttl: Duration,
    answers: Mutex<Answers>,
}

impl Gate {
    pub(crate) fn new(inst: Arc<Instance>, ttl: Duration) -> Gate {
        Gate {
            inst,
            ttl,
            answers: Mutex::new(Answers::default()),
        }
    }

    fn answers(&self) -> std::sync::MutexGuard<'_, Answers> {
        self.answers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ok when the caller of a request (`uid`, `gid`, thread `tid`) may reach the
    /// cached directory on the PFS; EACCES when not; another errno when the namespace
    /// server could not answer (nothing is kept then).
    pub(crate) fn check(&self, uid: u32, gid: u32, tid: u32) -> Result<(), Errno> {
        if uid == 0 {
            return Ok(());
        }
        let now = Instant::now();
        if self.answers().open_until.is_some_and(|t| now < t) {
            return Ok(());
        }
        let caller = Caller::of(uid, gid, tid);
        let key: Key = (uid, gid, caller.groups.clone());
        if let Some((at, ok)) = self.answers().by_caller.get(&key) {
            if now.duration_since(*at) < self.ttl {
                return if *ok { Ok(()) } else { Err(Errno::EACCES) };
            }
        }
        let verdict = match self.inst.cache_access(caller.wire()) {
            Ok(open_to_all) => {
                if open_to_all {
                    self.answers().open_until = Some(now + self.ttl);
                }
                true
            }
            // The PFS refused the walk (ENOENT: the path leads nowhere now): refused,
            // and kept. Anything else (a server not reached) is not an answer.
            Err(e)
                if [
                    Errno::EACCES,
                    Errno::EPERM,
                    Errno::ENOENT,
                    Errno::ENOTDIR,
                    Errno(libc::ELOOP),
                ]
                .contains(&e) =>
            {
                false
            }
            Err(e) => return Err(e),
        };
        let mut a = self.answers();
        if a.by_caller.len() >= KEPT {
            let mut ages: Vec<Instant> = a.by_caller.values().map(|(t, _)| *t).collect();
            ages.sort_unstable();
            let cut = ages[ages.len() / 2];
            a.by_caller.retain(|_, (t, _)| *t > cut);
        }
        a.by_caller.insert(key, (now, verdict));
        if verdict {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }
}
