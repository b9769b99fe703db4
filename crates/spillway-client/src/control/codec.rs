//! The ioctl codec of the control channel: `struct spillway_ioc` as bytes, the requests
//! libdatawarp sends in it and the answers it reads back.
//!
//! This is a byte contract with C: `libdatawarp/datawarp.c` builds the same messages
//! (`struct spillway_ioc`, `SPILLWAY_IOC_CALL`, the operation words and field order)
//! and parses the same answers; docs/staging.md ("Control channel") specifies it.
//! Change nothing here without changing the C side in the same commit.
//!
//! The message is `struct spillway_ioc { uint32_t len; char buf[16376]; }`; `buf[0..len)`
//! holds NUL-terminated fields, the operation first. The answer overwrites it: the
//! result (`0` or a negative errno, as decimal text), then the results (on error, one
//! field: a message). Every length and field is checked: anything malformed is
//! `-EINVAL`, never a panic.

use super::paths::{instance_path, pfs_path};
use spillway_types::Errno;

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

/// The words of a closed set of values, both ways. The manager's REST API names these
/// values with the same words (docs/staging.md), so the bridge to it uses `word` too.
macro_rules! words {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $word:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $name {
            $($variant),+
        }

        impl $name {
            /// The word naming this value in a message (and in the REST API).
            pub fn word(self) -> &'static str {
                match self {
                    $($name::$variant => $word),+
                }
            }

            /// The value a message field names; `-EINVAL` for any other bytes.
            fn parse(f: &[u8]) -> Result<$name, Errno> {
                match f {
                    $(f if f == $word.as_bytes() => Ok($name::$variant),)+
                    _ => Err(einval()),
                }
            }
        }
    };
}

words!(
    /// Which way a stage copies: PFS → instance (`in`) or back (`out`).
    Direction { In = "in", Out = "out" }
);
words!(
    /// What a stage names: one file, a directory tree, or a list of file pairs.
    StageKind { File = "file", Directory = "directory", List = "list" }
);
words!(
    /// When a stage runs: now, or (stage-outs only) at the end of the job.
    When { Immediate = "immediate", JobEnd = "job_end" }
);
words!(
    /// What a query, wait or action covers: the path itself or the tree below it.
    Scope { File = "file", Tree = "tree" }
);
words!(
    /// What an `action` request does to the stages at a path.
    Action { Terminate = "terminate", Revoke = "revoke", Activate = "activate" }
);

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

/// A decimal number: ASCII digits only (no sign, no spaces), at most 10 of them.
fn number(f: &[u8]) -> Result<u32, Errno> {
    if f.is_empty() || f.len() > 10 || !f.iter().all(u8::is_ascii_digit) {
        return Err(einval());
    }
    let v = f.iter().fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
    u32::try_from(v).map_err(|_| einval())
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
            let direction = Direction::parse(args[0])?;
            let kind = StageKind::parse(args[1])?;
            let when = match When::parse(args[2])? {
                When::JobEnd if direction != Direction::Out => return Err(einval()),
                w => w,
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
                scope: Scope::parse(args[0])?,
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
                scope: Scope::parse(args[0])?,
                path: instance_path(args[1])?,
                timeout_ms,
            })
        }
        b"action" => {
            exact(3)?;
            Ok(Request::Action {
                action: Action::parse(args[0])?,
                scope: Scope::parse(args[1])?,
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

/// Encode a request (libdatawarp's side; tests).
pub fn encode_request(r: &Request) -> Result<Vec<u8>, Errno> {
    let number: String;
    let mut f: Vec<&str> = Vec::new();
    match r {
        Request::Stage {
            direction: d,
            kind: k,
            when: w,
            pairs,
        } => {
            f.extend(["stage", d.word(), k.word(), w.word()]);
            for (s, d) in pairs {
                f.extend([s.as_str(), d.as_str()]);
            }
        }
        Request::Counts { scope, path } => f.extend(["counts", scope.word(), path]),
        Request::Wait {
            scope,
            path,
            timeout_ms,
        } => {
            number = timeout_ms.to_string();
            f.extend(["wait", scope.word(), path, &number]);
        }
        Request::Action {
            action,
            scope,
            path,
        } => f.extend(["action", action.word(), scope.word(), path]),
        Request::Concurrency { value } => {
            number = value.to_string();
            f.extend(["concurrency", &number]);
        }
        Request::Failures { after } => f.extend(["failures", after]),
        Request::Accounting => f.push("accounting"),
    }
    let refs: Vec<&[u8]> = f.iter().map(|s| s.as_bytes()).collect();
    join_fields(&refs)
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

#[cfg(test)]
pub(super) mod tests;
