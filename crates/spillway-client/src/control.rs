//! The control channel: libdatawarp's requests (stage, query, wait, terminate, failed
//! stages, accounting) arrive as `ioctl(SPILLWAY_IOC_CALL)` on a directory of the
//! mount and are carried to the manager's REST API (docs/staging.md, "Control channel").
//!
//! The message is `struct spillway_ioc { uint32_t len; char buf[16376]; }`; `buf[0..len)`
//! holds NUL-terminated fields, the operation first. The answer overwrites it: the
//! result (`0` or a negative errno, as decimal text), then the results (on error, one
//! field: a message). The caller's uid is the kernel's (the FUSE request header), never
//! the message's. The mount runs as root, but every REST call acts as the caller
//! (`ACT_AS_HEADER` with that uid): the manager authorises it exactly as that user's own
//! call, so a user reaches through a mount only what the API lets them do (another
//! user's instance answers 403 or 404, as to them), and root stays an admin.
//!
//! Nothing a caller sends can make this panic or hang: the codec checks every length
//! and field (malformed: `-EINVAL`), requests run on threads of their own (at most
//! `MAX_IN_FLIGHT` at once, beyond that `-EAGAIN`), each bounded by the HTTP client's
//! timeout, and a reply dropped by a failing thread is answered EIO by fuser.

use crate::root::MountRoot;
use fuser::{Notifier, ReplyIoctl};
use serde_json::{json, Value};
use spillway_api::{ApiClient, ApiError};
use spillway_stubs::Instance;
use spillway_types::{Errno, InodeNo};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Size of `buf` in `struct spillway_ioc`.
pub const IOC_BUF_LEN: usize = 16376;
/// Size of the whole `struct spillway_ioc` (the ioctl's size field).
pub const IOC_LEN: usize = IOC_BUF_LEN + 4;

/// `_IOWR(type, nr, size)` as Linux computes it (asm-generic/ioctl.h).
const fn iowr(ty: u8, nr: u8, size: usize) -> u32 {
    const READ_WRITE: u32 = 3; // _IOC_READ | _IOC_WRITE
    (READ_WRITE << 30) | ((size as u32 & 0x3fff) << 16) | ((ty as u32) << 8) | nr as u32
}

/// `SPILLWAY_IOC_CALL = _IOWR('S', 0x57, struct spillway_ioc)` (0xfffc5357).
pub const SPILLWAY_IOC_CALL: u32 = iowr(b'S', 0x57, IOC_LEN);

/// The longest a `wait` may ask the client to wait, in milliseconds.
pub const MAX_WAIT_MS: u32 = 10_000;
/// Control requests being served at once; more are answered `-EAGAIN`.
pub const MAX_IN_FLIGHT: usize = 64;
/// Longest path (instance or PFS) a message may carry.
pub const MAX_PATH: usize = 4096;
/// Kernel entries dropped after a list stage-in (the rest expire by themselves).
const FORGET_MAX: usize = 256;
/// Failures asked of the manager per `failures` request.
const FAILURES_PAGE: usize = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    In,
    Out,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageKind {
    File,
    Directory,
    List,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    Immediate,
    JobEnd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    File,
    Tree,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Terminate,
    Revoke,
    Activate,
}

/// One decoded request. Instance paths are normalized (`/a/b`, root `/`); PFS paths
/// are passed on as given (the servers resolve them beneath the PFS roots).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `pairs`: (source, destination) — one for file and directory stages.
    Stage {
        direction: Direction,
        kind: StageKind,
        when: When,
        pairs: Vec<(String, String)>,
    },
    Counts {
        scope: Scope,
        path: String,
    },
    Wait {
        scope: Scope,
        path: String,
        timeout_ms: u32,
    },
    Action {
        action: Action,
        scope: Scope,
        path: String,
    },
    Concurrency {
        value: u32,
    },
    Failures {
        after: String,
    },
    Accounting,
}

fn einval() -> Errno {
    Errno(libc::EINVAL)
}

// ---------------------------------------------------------------------- the codec

/// The fields of a message (`struct spillway_ioc` as bytes): `len` must fit in `buf`
/// and in what was given, and every field must end with a NUL.
pub fn split_fields(msg: &[u8]) -> Result<Vec<&[u8]>, Errno> {
    let head: [u8; 4] = msg
        .get(..4)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(einval)?;
    let len = u32::from_ne_bytes(head) as usize;
    if len == 0 || len > IOC_BUF_LEN {
        return Err(einval());
    }
    let buf = msg.get(4..4 + len).ok_or_else(einval)?;
    let body = buf.strip_suffix(&[0]).ok_or_else(einval)?;
    Ok(body.split(|&b| b == 0).collect())
}

/// Build a message from fields (libdatawarp's side; tests and tools).
pub fn join_fields(fields: &[&[u8]]) -> Result<Vec<u8>, Errno> {
    let mut buf = Vec::new();
    for f in fields {
        if f.contains(&0) {
            return Err(einval());
        }
        buf.extend_from_slice(f);
        buf.push(0);
    }
    if buf.len() > IOC_BUF_LEN {
        return Err(Errno(libc::E2BIG));
    }
    let mut msg = Vec::with_capacity(IOC_LEN);
    msg.extend_from_slice(&(buf.len() as u32).to_ne_bytes());
    msg.extend_from_slice(&buf);
    Ok(msg)
}

fn text(f: &[u8]) -> Result<&str, Errno> {
    if f.len() > MAX_PATH {
        return Err(Errno(libc::ENAMETOOLONG));
    }
    std::str::from_utf8(f).map_err(|_| einval())
}

/// An instance path: absolute, no `.` or `..` component; returned normalized.
pub fn instance_path(f: &[u8]) -> Result<String, Errno> {
    let s = text(f)?;
    if !s.starts_with('/') {
        return Err(einval());
    }
    let mut out = String::with_capacity(s.len());
    for c in s.split('/').filter(|c| !c.is_empty()) {
        if c == "." || c == ".." {
            return Err(einval());
        }
        out.push('/');
        out.push_str(c);
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

fn pfs_path(f: &[u8]) -> Result<String, Errno> {
    let s = text(f)?;
    if s.is_empty() {
        return Err(einval());
    }
    Ok(s.to_string())
}

/// A decimal number: ASCII digits only (no sign, no spaces), at most 10 of them.
fn number(f: &[u8]) -> Result<u32, Errno> {
    if f.is_empty() || f.len() > 10 || !f.iter().all(u8::is_ascii_digit) {
        return Err(einval());
    }
    let v = f.iter().fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
    u32::try_from(v).map_err(|_| einval())
}

fn scope(f: &[u8]) -> Result<Scope, Errno> {
    match f {
        b"file" => Ok(Scope::File),
        b"tree" => Ok(Scope::Tree),
        _ => Err(einval()),
    }
}

/// Decode a request message (`struct spillway_ioc` as the kernel handed it over).
pub fn decode_request(msg: &[u8]) -> Result<Request, Errno> {
    let fields = split_fields(msg)?;
    let (op, args) = fields.split_first().ok_or_else(einval)?;
    let exact = |n: usize| {
        if args.len() == n {
            Ok(())
        } else {
            Err(einval())
        }
    };
    match *op {
        b"stage" => {
            if args.len() < 5 {
                return Err(einval());
            }
            let direction = match args[0] {
                b"in" => Direction::In,
                b"out" => Direction::Out,
                _ => return Err(einval()),
            };
            let kind = match args[1] {
                b"file" => StageKind::File,
                b"directory" => StageKind::Directory,
                b"list" => StageKind::List,
                _ => return Err(einval()),
            };
            let when = match args[2] {
                b"immediate" => When::Immediate,
                b"job_end" if direction == Direction::Out => When::JobEnd,
                _ => return Err(einval()),
            };
            let paths = &args[3..];
            if paths.len() % 2 != 0 || (kind != StageKind::List && paths.len() != 2) {
                return Err(einval());
            }
            let pairs = paths
                .chunks(2)
                .map(|p| match direction {
                    Direction::In => Ok((pfs_path(p[0])?, instance_path(p[1])?)),
                    Direction::Out => Ok((instance_path(p[0])?, pfs_path(p[1])?)),
                })
                .collect::<Result<Vec<_>, Errno>>()?;
            Ok(Request::Stage {
                direction,
                kind,
                when,
                pairs,
            })
        }
        b"counts" => {
            exact(2)?;
            Ok(Request::Counts {
                scope: scope(args[0])?,
                path: instance_path(args[1])?,
            })
        }
        b"wait" => {
            exact(3)?;
            let timeout_ms = number(args[2])?;
            if timeout_ms > MAX_WAIT_MS {
                return Err(einval());
            }
            Ok(Request::Wait {
                scope: scope(args[0])?,
                path: instance_path(args[1])?,
                timeout_ms,
            })
        }
        b"action" => {
            exact(3)?;
            let action = match args[0] {
                b"terminate" => Action::Terminate,
                b"revoke" => Action::Revoke,
                b"activate" => Action::Activate,
                _ => return Err(einval()),
            };
            Ok(Request::Action {
                action,
                scope: scope(args[1])?,
                path: instance_path(args[2])?,
            })
        }
        b"concurrency" => {
            exact(1)?;
            Ok(Request::Concurrency {
                value: number(args[0])?,
            })
        }
        b"failures" => {
            exact(1)?;
            let after = match args[0] {
                b"" => String::new(),
                a => instance_path(a)?,
            };
            Ok(Request::Failures { after })
        }
        b"accounting" => {
            exact(0)?;
            Ok(Request::Accounting)
        }
        _ => Err(einval()),
    }
}

/// An answer: the result (0 or a negative errno) and its fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub result: i32,
    pub fields: Vec<Vec<u8>>,
}

impl Answer {
    pub fn ok(fields: Vec<Vec<u8>>) -> Answer {
        Answer { result: 0, fields }
    }

    pub fn err(e: Errno, message: impl Into<String>) -> Answer {
        Answer {
            result: -e.0.abs().max(1),
            fields: vec![message.into().into_bytes()],
        }
    }

    /// The message as the caller receives it. An answer too long for the buffer
    /// becomes `-E2BIG`; a message field is cut to fit, and NULs in it become `?`.
    pub fn encode(&self) -> Vec<u8> {
        let mut fields: Vec<Vec<u8>> = Vec::with_capacity(self.fields.len() + 1);
        fields.push(self.result.to_string().into_bytes());
        let is_err = self.result != 0;
        for f in &self.fields {
            if f.contains(&0) {
                if !is_err {
                    return Answer::err(Errno(libc::EIO), "answer field holds a NUL").encode();
                }
                fields.push(f.iter().map(|&b| if b == 0 { b'?' } else { b }).collect());
            } else {
                fields.push(f.clone());
            }
        }
        let total: usize = fields.iter().map(|f| f.len() + 1).sum();
        if total > IOC_BUF_LEN {
            if !is_err {
                return Answer::err(
                    Errno(libc::E2BIG),
                    "the answer does not fit the control message",
                )
                .encode();
            }
            // Cut the message (the one field after the result) to fit.
            let room = IOC_BUF_LEN - (fields[0].len() + 1) - 1;
            fields.truncate(2);
            if let Some(m) = fields.get_mut(1) {
                m.truncate(room);
            }
        }
        let refs: Vec<&[u8]> = fields.iter().map(Vec::as_slice).collect();
        // Cannot fail: every field is NUL-free and the total fits.
        join_fields(&refs).unwrap_or_else(|_| {
            let mut m = 4u32.to_ne_bytes().to_vec();
            m.extend_from_slice(b"-5\0\0");
            m
        })
    }

    /// Decode an answer message (libdatawarp's side; tests).
    pub fn decode(msg: &[u8]) -> Result<Answer, Errno> {
        let fields = split_fields(msg)?;
        let (r, rest) = fields.split_first().ok_or_else(einval)?;
        let s = std::str::from_utf8(r).map_err(|_| einval())?;
        let result: i32 = s.parse().map_err(|_| einval())?;
        Ok(Answer {
            result,
            fields: rest.iter().map(|f| f.to_vec()).collect(),
        })
    }
}

/// Encode a request (libdatawarp's side; tests).
pub fn encode_request(r: &Request) -> Result<Vec<u8>, Errno> {
    let mut f: Vec<String> = Vec::new();
    let sc = |s: Scope| match s {
        Scope::File => "file",
        Scope::Tree => "tree",
    };
    match r {
        Request::Stage {
            direction,
            kind,
            when,
            pairs,
        } => {
            f.push("stage".into());
            f.push(
                match direction {
                    Direction::In => "in",
                    Direction::Out => "out",
                }
                .into(),
            );
            f.push(
                match kind {
                    StageKind::File => "file",
                    StageKind::Directory => "directory",
                    StageKind::List => "list",
                }
                .into(),
            );
            f.push(
                match when {
                    When::Immediate => "immediate",
                    When::JobEnd => "job_end",
                }
                .into(),
            );
            for (s, d) in pairs {
                f.push(s.clone());
                f.push(d.clone());
            }
        }
        Request::Counts { scope, path } => {
            f.extend(["counts".into(), sc(*scope).into(), path.clone()]);
        }
        Request::Wait {
            scope,
            path,
            timeout_ms,
        } => f.extend([
            "wait".into(),
            sc(*scope).into(),
            path.clone(),
            timeout_ms.to_string(),
        ]),
        Request::Action {
            action,
            scope,
            path,
        } => f.extend([
            "action".into(),
            match action {
                Action::Terminate => "terminate",
                Action::Revoke => "revoke",
                Action::Activate => "activate",
            }
            .into(),
            sc(*scope).into(),
            path.clone(),
        ]),
        Request::Concurrency { value } => f.extend(["concurrency".into(), value.to_string()]),
        Request::Failures { after } => f.extend(["failures".into(), after.clone()]),
        Request::Accounting => f.push("accounting".into()),
    }
    let refs: Vec<&[u8]> = f.iter().map(|s| s.as_bytes()).collect();
    join_fields(&refs)
}

// ---------------------------------------------------------------------- the manager

/// The manager as the channel uses it (the real one is `ApiClient`; tests fake it).
/// Every call is made as the user `uid` (the caller of the ioctl).
pub trait Rest: Send + Sync {
    fn get(&self, uid: u32, path: &str) -> Result<Value, ApiError>;
    /// POST, PATCH or PUT with a JSON body.
    fn send(&self, uid: u32, method: &str, path: &str, body: &Value) -> Result<Value, ApiError>;
}

impl Rest for ApiClient {
    fn get(&self, uid: u32, path: &str) -> Result<Value, ApiError> {
        self.get_as(Some(uid), path)
    }
    fn send(&self, uid: u32, method: &str, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.send_as(Some(uid), method, path, body)
    }
}

/// HTTP errors as errnos (docs/staging.md, docs/libdatawarp.md): 400 EINVAL, 401/403
/// EACCES (another user's instance the caller may see), 404 ENOENT (also one they may
/// not see), 409 EBUSY, anything else EIO; a manager that cannot be reached EHOSTUNREACH.
pub fn api_errno(e: &ApiError) -> Errno {
    match e {
        ApiError::Status { status, .. } => Errno(match status {
            400 => libc::EINVAL,
            401 | 403 => libc::EACCES,
            404 => libc::ENOENT,
            409 => libc::EBUSY,
            _ => libc::EIO,
        }),
        ApiError::Unreachable { .. } => Errno(libc::EHOSTUNREACH),
        ApiError::Protocol(_) | ApiError::Local(_) => Errno(libc::EIO),
    }
}

fn api_answer(e: ApiError) -> Answer {
    Answer::err(api_errno(&e), e.to_string())
}

/// Percent-encode a query value (everything but RFC 3986's unreserved characters).
pub fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn int(v: &Value, key: &str) -> Result<i64, Answer> {
    v.get(key).and_then(Value::as_i64).ok_or_else(|| {
        Answer::err(
            Errno(libc::EIO),
            format!("the manager's answer lacks an integer `{key}`: {v}"),
        )
    })
}

fn dec(n: i64) -> Vec<u8> {
    n.to_string().into_bytes()
}

// ---------------------------------------------------------------------- the channel

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
        let Some(m) = self.manager.as_deref() else {
            return Answer::err(
                Errno(libc::ENOTSUP),
                "this mount was made without a manager (no --manager-config)",
            );
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
                let a = self.stage(m, uid, *direction, *kind, *when, &inst_pairs);
                if a.is_ok() && *direction == Direction::In && *kind != StageKind::Directory {
                    for (_, dst) in pairs.iter().take(FORGET_MAX) {
                        self.forget_entry(dst);
                    }
                }
                a
            }
            Request::Counts { scope, path } => self.counts(m, uid, *scope, &at(path), None),
            Request::Wait {
                scope,
                path,
                timeout_ms,
            } => {
                let a = self.wait(m, uid, *scope, &at(path), *timeout_ms);
                if a.is_ok() && *scope == Scope::File {
                    self.forget_entry(path);
                }
                a
            }
            Request::Action {
                action,
                scope,
                path,
            } => self.action(m, uid, *action, *scope, &at(path)),
            Request::Concurrency { value } => self.concurrency(m, uid, *value),
            Request::Failures { after } => self.failures(m, uid, after),
            Request::Accounting => return self.accounting(ino),
        };
        r.unwrap_or_else(|a| a)
    }

    fn stage(
        &self,
        m: &dyn Rest,
        uid: u32,
        direction: Direction,
        kind: StageKind,
        when: When,
        pairs: &[(String, String)],
    ) -> Result<Answer, Answer> {
        let (source, destination, list) = match (kind, pairs) {
            (StageKind::List, _) => (String::new(), String::new(), pairs),
            (_, [(s, d)]) => (s.clone(), d.clone(), &[][..]),
            _ => return Err(Answer::err(einval(), "one source and one destination")),
        };
        let body = json!({
            "instance": self.instance,
            "direction": match direction { Direction::In => "in", Direction::Out => "out" },
            "type": match kind {
                StageKind::File => "file",
                StageKind::Directory => "directory",
                StageKind::List => "list",
            },
            "source": source,
            "destination": destination,
            "pairs": list.iter().map(|(s, d)| json!({"source": s, "destination": d}))
                .collect::<Vec<_>>(),
            "when": match when { When::Immediate => "immediate", When::JobEnd => "job_end" },
            "owner": uid,
        });
        let v = m
            .send(uid, "POST", "/dw/v1/stages", &body)
            .map_err(api_answer)?;
        Ok(Answer::ok(vec![dec(int(&v, "id")?)]))
    }

    fn counts_path(&self, scope: Scope, path: &str, wait_secs: Option<u32>) -> String {
        let mut p = format!(
            "/dw/v1/instances/{}/stage_counts?path={}&scope={}",
            self.instance,
            query_escape(path),
            match scope {
                Scope::File => "file",
                Scope::Tree => "tree",
            }
        );
        if let Some(w) = wait_secs {
            p.push_str(&format!("&wait={w}"));
        }
        p
    }

    fn counts(
        &self,
        m: &dyn Rest,
        uid: u32,
        scope: Scope,
        path: &str,
        wait_secs: Option<u32>,
    ) -> Result<Answer, Answer> {
        let v = m
            .get(uid, &self.counts_path(scope, path, wait_secs))
            .map_err(api_answer)?;
        let started = v.get("started").and_then(Value::as_bool).ok_or_else(|| {
            Answer::err(Errno(libc::EIO), format!("no `started` in the answer: {v}"))
        })?;
        Ok(Answer::ok(vec![
            dec(int(&v, "complete")?),
            dec(int(&v, "pending")?),
            dec(int(&v, "deferred")?),
            dec(int(&v, "failed")?),
            dec(i64::from(started)),
        ]))
    }

    fn wait(
        &self,
        m: &dyn Rest,
        uid: u32,
        scope: Scope,
        path: &str,
        timeout_ms: u32,
    ) -> Result<Answer, Answer> {
        let secs = timeout_ms.div_ceil(1000);
        let c = self.counts(m, uid, scope, path, (secs > 0).then_some(secs))?;
        // complete, pending, deferred, failed, started
        if c.fields.get(4).map(Vec::as_slice) != Some(b"1") {
            return Err(Answer::err(
                einval(),
                format!("no stage was ever started on {path}"),
            ));
        }
        if c.fields.get(1).map(Vec::as_slice) == Some(b"0") {
            Ok(Answer::ok(vec![b"0".to_vec()]))
        } else {
            Err(Answer::err(Errno(libc::EAGAIN), "stages still pending"))
        }
    }

    /// Terminate, revoke or activate the stages at `path` through the manager's
    /// `stage_actions`, as the caller: a user acts only on stages of instances they own
    /// (the manager's check), root on any.
    fn action(
        &self,
        m: &dyn Rest,
        uid: u32,
        action: Action,
        scope: Scope,
        path: &str,
    ) -> Result<Answer, Answer> {
        let body = json!({
            "action": match action {
                Action::Terminate => "terminate",
                Action::Revoke => "revoke",
                Action::Activate => "activate",
            },
            "path": path,
            "scope": match scope { Scope::File => "file", Scope::Tree => "tree" },
        });
        let v = m
            .send(
                uid,
                "POST",
                &format!("/dw/v1/instances/{}/stage_actions", self.instance),
                &body,
            )
            .map_err(api_answer)?;
        let n = v
            .get("stages")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        Ok(Answer::ok(vec![dec(n as i64)]))
    }

    fn concurrency(&self, m: &dyn Rest, uid: u32, value: u32) -> Result<Answer, Answer> {
        let v = m
            .send(
                uid,
                "PUT",
                &format!("/dw/v1/instances/{}/stage_concurrency", self.instance),
                &json!({ "value": value }),
            )
            .map_err(api_answer)?;
        Ok(Answer::ok(vec![dec(int(&v, "stage_concurrency")?)]))
    }

    /// Failed files of the instance after the mount path `after` ("": from the start),
    /// in path order. A mount of one directory answers only the failures below it:
    /// they are one run in path order (every path that starts with `dir/`), from the
    /// cursor `dir/` to the first path that does not start with it.
    fn failures(&self, m: &dyn Rest, uid: u32, after: &str) -> Result<Answer, Answer> {
        let cursor = match (after, self.root.is_instance_root()) {
            ("", true) => String::new(),
            ("", false) => format!("{}/", self.root.path()),
            (a, _) => self.root.inst_path(a),
        };
        let v = m
            .get(
                uid,
                &format!(
                    "/dw/v1/instances/{}/stage_failures?after={}&limit={FAILURES_PAGE}",
                    self.instance,
                    query_escape(&cursor)
                ),
            )
            .map_err(api_answer)?;
        let list = v.get("failures").and_then(Value::as_array).ok_or_else(|| {
            Answer::err(
                Errno(libc::EIO),
                format!("no `failures` in the answer: {v}"),
            )
        })?;
        let mut more = v.get("more").and_then(Value::as_bool).unwrap_or(false);
        // Room for the result and `more`; then as many entries as fit. The cursor of
        // the next request is the last path answered, so a cut page loses nothing.
        let mut room = IOC_BUF_LEN - 3 - 2;
        let mut fields = vec![Vec::new()];
        for f in list {
            let Some(path) = f.get("path").and_then(Value::as_str) else {
                continue;
            };
            let Some(path) = self.root.mount_path(path) else {
                // Past the mount's directory: nothing further is ours.
                more = false;
                break;
            };
            if path.contains('\0') {
                continue;
            }
            let errno = f.get("errno").and_then(Value::as_i64).unwrap_or(0).abs();
            let errno = if errno == 0 {
                i64::from(libc::EIO)
            } else {
                errno
            };
            let e = format!("-{errno}");
            let need = path.len() + 1 + e.len() + 1;
            if need > room {
                more = true;
                break;
            }
            room -= need;
            fields.push(path.as_bytes().to_vec());
            fields.push(e.into_bytes());
        }
        fields[0] = if more { b"1".to_vec() } else { b"0".to_vec() };
        Ok(Answer::ok(fields))
    }

    fn accounting(&self, ino: InodeNo) -> Answer {
        match self.accounting_json(ino) {
            Ok(j) => Answer::ok(vec![j.into_bytes()]),
            Err(e) => Answer::err(e, format!("accounting: {e}")),
        }
    }

    /// dw_get_accounting_data_json's document (spec §4): measured counters from every
    /// server's FragmentStatsReq; what Spillway does not track is 0 (docs/libdatawarp.md).
    fn accounting_json(&self, ino: InodeNo) -> Result<String, Errno> {
        let attr = self.inst.getattr(ino)?;
        let layout = self.inst.layout(&attr);
        let stats = self.inst.fragment_stats()?;
        let fragments: Vec<Value> = stats
            .iter()
            .zip(&self.inst.desc.servers)
            .map(|(s, name)| {
                json!({
                    "server name": name,
                    "bytes written": s.bytes_written,
                    "bytes read": s.bytes_read,
                    "write limit": 0,
                    "max window write": 0,
                    "cur capacity used": s.used,
                    "max capacity used": s.max_used,
                    "lower filesystem capacity": s.capacity,
                    "num files created": s.files_created,
                    "write highwater": 0,
                    "moving avg writes": 0,
                })
            })
            .collect();
        let sum = |f: fn(&spillway_wire::messages::FragmentStatsReply) -> u64| -> u64 {
            stats.iter().map(f).fold(0u64, u64::saturating_add)
        };
        let doc = json!({
            "realm": {
                "realm id": self.instance,
                "server count": stats.len(),
                "namespace count": 1,
                "fragments": fragments,
                "namespaces": [{
                    "namespace id": self.instance,
                    "stripe width": layout.width,
                    "stripe size": layout.stripe_size,
                    "substripe width": 1,
                    "substripe size": layout.stripe_size,
                    "fs bytes read": sum(|s| s.bytes_read),
                    "fs bytes written": sum(|s| s.bytes_written),
                    "stage bytes read": sum(|s| s.stage_bytes_read),
                    "stage bytes written": sum(|s| s.stage_bytes_written),
                    "max offset read": 0,
                    "max offset written": 0,
                    "file size limit": 0,
                    "num files created": sum(|s| s.files_created),
                    "num files create threshold": 0,
                }],
            }
        });
        Ok(doc.to_string())
    }
}

#[cfg(test)]
mod tests;
