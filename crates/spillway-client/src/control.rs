//! The control channel: libdatawarp's requests (stage, query, wait, terminate, failed
//! stages, accounting) arrive as `ioctl(SPILLWAY_IOC_CALL)` on a directory of the
//! mount and are carried to the manager's REST API (docs/staging.md, "Control channel").
//!
//! One job per file:
//! * `codec`      — the ioctl's bytes (`struct spillway_ioc`, a contract mirrored in
//!   `libdatawarp/datawarp.c`): requests decoded, answers encoded;
//! * `paths`      — the path rules of a request's instance and PFS paths;
//! * `rest`       — the bridge to the manager's REST API (`Rest`, the requests it
//!   makes, HTTP errors as errnos);
//! * `handlers`   — what each request to the manager does with its answer;
//! * `accounting` — the one request the servers answer, not the manager;
//! * this file    — the ioctl received, bounded, run on a thread and dispatched, with
//!   mount paths turned into instance paths on the way.
//!
//! The caller's uid is the kernel's (the FUSE request header), never the message's.
//! The mount runs as root, but every REST call acts as the caller (`ACT_AS_HEADER`
//! with that uid): the manager authorises it exactly as that user's own call, so a
//! user reaches through a mount only what the API lets them do (another user's
//! instance answers 403 or 404, as to them), and root stays an admin.
//!
//! Nothing a caller sends can make this panic or hang: the codec checks every length
//! and field (malformed: `-EINVAL`), requests run on threads of their own (at most
//! `MAX_IN_FLIGHT` at once, beyond that `-EAGAIN`), each bounded by the HTTP client's
//! timeout, and a reply dropped by a failing thread is answered EIO by fuser.

mod accounting;
pub mod codec;
mod handlers;
pub mod paths;
pub mod rest;

pub use codec::{
    decode_request, encode_request, join_fields, split_fields, Action, Answer, Direction, Request,
    Scope, StageKind, When, IOC_BUF_LEN, IOC_LEN, MAX_WAIT_MS, SPILLWAY_IOC_CALL,
};
pub use paths::{instance_path, MAX_PATH};
pub use rest::{api_errno, query_escape, Rest};

use crate::root::MountRoot;
use fuser::{Notifier, ReplyIoctl};
use rest::Manager;
use spillway_stubs::Instance;
use spillway_types::{Errno, InodeNo};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Control requests being served at once; more are answered `-EAGAIN`.
pub const MAX_IN_FLIGHT: usize = 64;
/// Kernel entries dropped after a list stage-in (the rest expire by themselves).
const FORGET_MAX: usize = 256;

/// The control channel of one mount.
pub struct Control {
    /// None: a mount made without a manager (`spillway cluster`): ENOTSUP.
    manager: Option<Box<dyn Rest>>,
    instance: u64,
    inst: Arc<Instance>,
    in_flight: AtomicUsize,
    /// The kernel's caches, to drop what they remember of files the servers create.
    notifier: Option<Arc<OnceLock<Notifier>>>,
    /// The directory the mount shows as its root: the paths of requests are mount
    /// paths (what follows the mount point), the manager's are instance paths.
    root: MountRoot,
}

/// Counts one request in flight for as long as it lives (a panicking thread too).
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn send_reply(reply: ReplyIoctl, a: &Answer) {
    reply.ioctl(0, &a.encode());
}

impl Control {
    pub fn new(inst: Arc<Instance>, manager: Option<Box<dyn Rest>>) -> Control {
        Control {
            manager,
            instance: inst.desc.instance,
            inst,
            in_flight: AtomicUsize::new(0),
            notifier: None,
            root: MountRoot::instance(),
        }
    }

    /// A mount of one directory of the instance (a private mount; root.rs).
    pub fn with_root(mut self, root: MountRoot) -> Control {
        self.root = root;
        self
    }

    /// Tell the kernel to forget entries of files stages create (see `forget_entry`).
    pub fn with_notifier(mut self, n: Arc<OnceLock<Notifier>>) -> Control {
        self.notifier = Some(n);
        self
    }

    /// The servers create a stage-in's files behind this client's back: a lookup of
    /// such a name made before it existed left a negative entry in the kernel (for the
    /// entry lifetime), which would hide the staged file. Drop the kernel's entry of
    /// `path` (a mount path) if its directory can be found; failures are harmless.
    fn forget_entry(&self, path: &str) {
        let Some(n) = self.notifier.as_ref().and_then(|n| n.get()) else {
            return;
        };
        let names: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        let Some((leaf, dirs)) = names.split_last() else {
            return;
        };
        let mut dir = self.root.ino();
        for d in dirs {
            match self.inst.lookup_entry(dir, d.as_bytes()) {
                Ok(Some(e)) => dir = e.ino,
                _ => return,
            }
        }
        let _ = n.inval_entry(self.root.fuse(dir), OsStr::from_bytes(leaf.as_bytes()));
    }

    /// The FUSE `ioctl` of the mount. `ino`: the inode the ioctl was made on (its
    /// stripe geometry goes into `accounting`).
    pub fn ioctl(
        self: &Arc<Self>,
        uid: u32,
        ino: InodeNo,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        if cmd != SPILLWAY_IOC_CALL {
            return reply.error(fuser::Errno::from_i32(libc::ENOTTY));
        }
        if (out_size as usize) < IOC_LEN {
            return reply.error(fuser::Errno::EINVAL);
        }
        let req = match decode_request(in_data) {
            Ok(r) => r,
            Err(e) => return send_reply(reply, &Answer::err(e, "malformed control message")),
        };
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return send_reply(
                reply,
                &Answer::err(Errno(libc::EAGAIN), "too many control requests at once"),
            );
        }
        let me = self.clone();
        // The reply travels with the thread; if the thread cannot start, the closure
        // (and with it the reply) is dropped, and fuser answers EIO.
        let started = std::thread::Builder::new()
            .name("spillway-control".into())
            .spawn(move || {
                let _count = InFlight(&me.in_flight);
                let a = me.handle(uid, ino, &req);
                send_reply(reply, &a);
            });
        if let Err(e) = started {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!("cannot start a control thread: {e}");
        }
    }

    /// Serve one request (on a thread of its own). Its paths are mount paths.
    pub fn handle(&self, uid: u32, ino: InodeNo, req: &Request) -> Answer {
        if let Request::Accounting = req {
            return self.accounting(ino);
        }
        let at = |p: &String| self.root.inst_path(p);
        let Some(rest) = self.manager.as_deref() else {
            return Answer::err(
                Errno(libc::ENOTSUP),
                "this mount was made without a manager (no --manager-config)",
            );
        };
        let m = &Manager {
            rest,
            uid,
            instance: self.instance,
        };
        let r = match req {
            Request::Stage {
                direction,
                kind,
                when,
                pairs,
            } => {
                let inst_pairs: Vec<(String, String)> = pairs
                    .iter()
                    .map(|(s, d)| match direction {
                        Direction::In => (s.clone(), at(d)),
                        Direction::Out => (at(s), d.clone()),
                    })
                    .collect();
                let a = self.stage(m, *direction, *kind, *when, &inst_pairs);
                if a.is_ok() && *direction == Direction::In && *kind != StageKind::Directory {
                    for (_, dst) in pairs.iter().take(FORGET_MAX) {
                        self.forget_entry(dst);
                    }
                }
                a
            }
            Request::Counts { scope, path } => self.counts(m, *scope, &at(path), None),
            Request::Wait {
                scope,
                path,
                timeout_ms,
            } => {
                let a = self.wait(m, *scope, &at(path), *timeout_ms);
                if a.is_ok() && *scope == Scope::File {
                    self.forget_entry(path);
                }
                a
            }
            Request::Action {
                action,
                scope,
                path,
            } => self.action(m, *action, *scope, &at(path)),
            Request::Concurrency { value } => self.concurrency(m, *value),
            Request::Failures { after } => self.failures(m, after),
            Request::Accounting => return self.accounting(ino),
        };
        r.unwrap_or_else(|a| a)
    }
}

#[cfg(test)]
mod tests;
