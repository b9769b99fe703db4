//! MUNGE authentication for Spillway (see `docs/auth.md`).
//!
//! [`Munge::encode`] asks munged for a credential, as `munge -n` does; [`Munge::decode`]
//! asks munged to verify one and says who made it. Both go through the real libmunge
//! and the real munged: nothing here checks a credential by itself, so what is accepted
//! is exactly what munged accepts (same key, not expired, not rewound, not replayed).
//!
//! Every call creates and destroys its own `munge_ctx`: libmunge's contexts must not be
//! shared between threads, and one per call keeps [`Munge`] a plain value that is `Send`,
//! `Sync` and `Clone`, at the cost of a malloc per call next to a round trip to munged.

// `pub` marks what other crates may name; everything else is `pub(crate)` or narrower.
#![warn(unreachable_pub)]

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::{self, NonNull};

use libc::{c_char, c_int, c_void, gid_t, uid_t};

mod ffi;
#[cfg(feature = "testing")]
pub mod testing;

/// Longest credential string [`Munge::decode`] passes to munged. A credential from
/// `munge -n` is about 130 characters, plus 4/3 of its payload; anything much longer
/// arrived from outside and is refused before it costs munged any work.
pub const MAX_CRED_LEN: usize = 64 * 1024;

/// Largest payload [`Munge::encode`] accepts: its credential (base64, plus MUNGE's
/// header and MAC) stays well below [`MAX_CRED_LEN`], so that whatever this crate
/// encodes, it can also decode.
pub const MAX_PAYLOAD_LEN: usize = 32 * 1024;

/// Where libmunge talks to munged: the socket of the daemon to use, or libmunge's
/// compiled-in default (`/run/munge/munge.socket.2` on Debian) when `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Munge {
    socket: Option<PathBuf>,
}

/// What munged vouches for in a valid credential: the uid and gid of the process that
/// encoded it (taken by munged from its socket peer, not from anything the client said),
/// and the payload encoded with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub uid: u32,
    pub gid: u32,
    pub payload: Vec<u8>,
}

/// Why encoding or decoding failed: libmunge's `munge_err_t`, with the codes a caller
/// acts on as their own variants. [`MungeError::code`] gives the number; `Display` gives
/// `munge_strerror`'s text for it (with libmunge's detail where there is one).
///
/// [`MungeError::is_refusal`] tells a verdict on the credential (it is not to be
/// trusted: the caller is not authenticated) from a failure to get one (munged not
/// reachable, out of memory, munged's internal error: try again later).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MungeError {
    /// EMUNGE_CRED_REPLAYED (17): valid, but munged has decoded it before. Each
    /// credential is accepted once.
    #[error("{}", strerror(ffi::EMUNGE_CRED_REPLAYED))]
    Replayed,
    /// EMUNGE_CRED_EXPIRED (15): valid, but older than its time-to-live (300 s by
    /// default).
    #[error("{}", strerror(ffi::EMUNGE_CRED_EXPIRED))]
    Expired,
    /// EMUNGE_CRED_REWOUND (16): valid, but encoded in the future by this host's clock
    /// (clocks out of step).
    #[error("{}", strerror(ffi::EMUNGE_CRED_REWOUND))]
    Rewound,
    /// EMUNGE_CRED_INVALID (14): well-formed, but its MAC does not verify: tampered with,
    /// or made by a munged with another key.
    #[error("{}", strerror(ffi::EMUNGE_CRED_INVALID))]
    Invalid,
    /// EMUNGE_BAD_CRED (8): not a MUNGE credential at all (garbage, truncated, empty).
    /// Also what this crate answers, without asking munged, for input that cannot be one:
    /// empty, a NUL byte, invalid UTF-8 ([`Munge::decode_bytes`]), or longer than
    /// [`MAX_CRED_LEN`].
    #[error("{}", strerror(ffi::EMUNGE_BAD_CRED))]
    BadCred,
    /// EMUNGE_CRED_UNAUTHORIZED (18): the credential is restricted to another uid/gid.
    #[error("{}", strerror(ffi::EMUNGE_CRED_UNAUTHORIZED))]
    Unauthorized,
    /// EMUNGE_SOCKET (6): munged could not be reached (not running, wrong socket path,
    /// no permission on the socket). Says nothing about the credential.
    #[error("{}: {detail}", strerror(ffi::EMUNGE_SOCKET))]
    Socket { detail: String },
    /// Any other `munge_err_t`, with libmunge's message: refusals of malformed
    /// credentials (9 bad version, 10 cipher, 11 MAC, 12 compression type, 13 unknown
    /// realm: garbage that happens to carry MUNGE's armor ends up here), and failures
    /// (1 munged's internal error, 2 bad argument, 3 payload too long, 5 out of memory).
    #[error("{msg}")]
    Other { code: u32, msg: String },
}

impl MungeError {
    /// The `munge_err_t` number (as `munge`/`unmunge` report it in their exit status).
    pub fn code(&self) -> u32 {
        let c = match self {
            MungeError::Replayed => ffi::EMUNGE_CRED_REPLAYED,
            MungeError::Expired => ffi::EMUNGE_CRED_EXPIRED,
            MungeError::Rewound => ffi::EMUNGE_CRED_REWOUND,
            MungeError::Invalid => ffi::EMUNGE_CRED_INVALID,
            MungeError::BadCred => ffi::EMUNGE_BAD_CRED,
            MungeError::Unauthorized => ffi::EMUNGE_CRED_UNAUTHORIZED,
            MungeError::Socket { .. } => ffi::EMUNGE_SOCKET,
            MungeError::Other { code, .. } => return *code,
        };
        c as u32
    }

    /// True when the credential itself was judged bad (every variant but `Socket`, and
    /// `Other` with codes 8 to 18: bad format, version, cipher, MAC, compression type or
    /// realm); false when no verdict could be had (`Socket`; `Other` with munged's
    /// internal error, a bad argument, a payload too long, out of memory).
    pub fn is_refusal(&self) -> bool {
        match self {
            MungeError::Socket { .. } => false,
            MungeError::Other { code, .. } => {
                (ffi::EMUNGE_BAD_CRED as u32..=ffi::EMUNGE_CRED_UNAUTHORIZED as u32).contains(code)
            }
            _ => true,
        }
    }

    /// The variant for `code`; `detail` is libmunge's message for this failure.
    fn from_code(code: c_int, detail: String) -> MungeError {
        match code {
            ffi::EMUNGE_CRED_REPLAYED => MungeError::Replayed,
            ffi::EMUNGE_CRED_EXPIRED => MungeError::Expired,
            ffi::EMUNGE_CRED_REWOUND => MungeError::Rewound,
            ffi::EMUNGE_CRED_INVALID => MungeError::Invalid,
            ffi::EMUNGE_BAD_CRED => MungeError::BadCred,
            ffi::EMUNGE_CRED_UNAUTHORIZED => MungeError::Unauthorized,
            ffi::EMUNGE_SOCKET => MungeError::Socket { detail },
            _ => MungeError::Other {
                code: code as u32,
                msg: detail,
            },
        }
    }

    /// A failure found on this side, before or without libmunge's context.
    fn local(code: c_int, msg: &str) -> MungeError {
        MungeError::from_code(code, format!("{}: {msg}", strerror(code)))
    }
}

/// `munge_strerror(code)` as a Rust string.
fn strerror(code: c_int) -> String {
    // SAFETY: munge_strerror accepts any value and returns a pointer to a static string
    // (its "unknown" text for values it does not know), never to be freed.
    let p = unsafe { ffi::munge_strerror(code) };
    if p.is_null() {
        return format!("MUNGE error {code}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// One libmunge context, destroyed on drop (also on every early return).
struct Ctx(NonNull<ffi::MungeCtx>);

impl Ctx {
    fn new(socket: Option<&Path>) -> Result<Ctx, MungeError> {
        // Converted before the context exists, so that a bad path leaks nothing.
        let socket = match socket {
            None => None,
            Some(p) => Some(CString::new(p.as_os_str().as_bytes()).map_err(|_| {
                MungeError::local(ffi::EMUNGE_BAD_ARG, "socket path contains a NUL byte")
            })?),
        };
        // SAFETY: no arguments; returns NULL on allocation failure.
        let raw = unsafe { ffi::munge_ctx_create() };
        let ctx = Ctx(NonNull::new(raw)
            .ok_or_else(|| MungeError::local(ffi::EMUNGE_NO_MEMORY, "munge_ctx_create failed"))?);
        if let Some(path) = socket {
            // SAFETY: a live context; MUNGE_OPT_SOCKET takes a `const char *`, which
            // libmunge copies, so `path` may be dropped after the call.
            let rc =
                unsafe { ffi::munge_ctx_set(ctx.as_ptr(), ffi::MUNGE_OPT_SOCKET, path.as_ptr()) };
            if rc != ffi::EMUNGE_SUCCESS {
                return Err(ctx.error(rc));
            }
        }
        Ok(ctx)
    }

    fn as_ptr(&self) -> ffi::MungeCtxT {
        self.0.as_ptr()
    }

    /// The error `code` with the context's message (more precise than munge_strerror:
    /// e.g. which socket could not be reached and why).
    fn error(&self, code: c_int) -> MungeError {
        // SAFETY: a live context; the string it returns belongs to the context and is
        // copied out at once, before the context is used again or destroyed.
        let p = unsafe { ffi::munge_ctx_strerror(self.as_ptr()) };
        let detail = if p.is_null() {
            strerror(code)
        } else {
            // SAFETY: non-null, NUL-terminated, alive until the context changes.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        MungeError::from_code(code, detail)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: created by munge_ctx_create, destroyed exactly once, here.
        unsafe { ffi::munge_ctx_destroy(self.as_ptr()) }
    }
}

/// A buffer libmunge malloc'ed for us, freed on drop.
struct Malloced<T>(*mut T);

impl<T> Drop for Malloced<T> {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: allocated by libmunge with malloc and handed to us to free; freed
            // exactly once, here.
            unsafe { libc::free(self.0.cast::<c_void>()) }
        }
    }
}

impl Munge {
    /// A handle on munged at `socket`, or at libmunge's default socket when `None`.
    /// Nothing is checked here: an unreachable munged shows up as
    /// [`MungeError::Socket`] on the first call.
    pub fn new(socket: Option<PathBuf>) -> Munge {
        Munge { socket }
    }

    /// The socket given to [`Munge::new`].
    pub fn socket(&self) -> Option<&Path> {
        self.socket.as_deref()
    }

    /// A credential for the calling process's uid and gid carrying `payload`: the string
    /// `munge -n` prints (`MUNGE:...:`), without a newline. Payloads longer than
    /// [`MAX_PAYLOAD_LEN`] are refused (`Other`, EMUNGE_BAD_LENGTH).
    pub fn encode(&self, payload: &[u8]) -> Result<String, MungeError> {
        if payload.len() > MAX_PAYLOAD_LEN {
            return Err(MungeError::local(
                ffi::EMUNGE_BAD_LENGTH,
                &format!(
                    "payload of {} bytes, at most {MAX_PAYLOAD_LEN}",
                    payload.len()
                ),
            ));
        }
        let ctx = Ctx::new(self.socket())?;
        // Bounded by MAX_PAYLOAD_LEN just above, so this always fits an int.
        let len = payload.len() as c_int;
        // NULL for an empty payload: libmunge's documented "no payload".
        let buf = if payload.is_empty() {
            ptr::null()
        } else {
            payload.as_ptr().cast::<c_void>()
        };
        let mut cred: *mut c_char = ptr::null_mut();
        // SAFETY: a live context; `buf` is NULL or points to `len` readable bytes that
        // outlive the call; `cred` receives a malloc'ed string (NULL on error).
        let rc = unsafe { ffi::munge_encode(&mut cred, ctx.as_ptr(), buf, len) };
        let cred = Malloced(cred);
        if rc != ffi::EMUNGE_SUCCESS {
            return Err(ctx.error(rc));
        }
        if cred.0.is_null() {
            return Err(MungeError::local(
                ffi::EMUNGE_SNAFU,
                "munge_encode succeeded without a credential",
            ));
        }
        // SAFETY: non-null, NUL-terminated, owned by `cred` until it drops at return.
        let text = unsafe { CStr::from_ptr(cred.0) };
        // A credential is base64 between "MUNGE:" and ":"; anything else is libmunge's
        // bug, reported rather than trusted.
        text.to_str().map(str::to_owned).map_err(|_| {
            MungeError::local(ffi::EMUNGE_SNAFU, "munge_encode returned non-UTF-8 text")
        })
    }

    /// Verifies `cred` with munged. `Ok` only for a credential munged accepts now: made
    /// with munged's key, unaltered, within its time-to-live, and never decoded before
    /// (munged remembers it, so a second decode of the same credential is
    /// [`MungeError::Replayed`]).
    ///
    /// `cred` comes from outside and may be anything: empty strings, NUL bytes and strings
    /// longer than [`MAX_CRED_LEN`] are refused as [`MungeError::BadCred`] without asking
    /// munged.
    pub fn decode(&self, cred: &str) -> Result<Credential, MungeError> {
        self.decode_bytes(cred.as_bytes())
    }

    /// [`Munge::decode`] for raw bytes (e.g. an HTTP header value, which need not be
    /// UTF-8): bytes that are not UTF-8 cannot be a credential and are refused as
    /// [`MungeError::BadCred`].
    pub fn decode_bytes(&self, cred: &[u8]) -> Result<Credential, MungeError> {
        if cred.is_empty() || cred.len() > MAX_CRED_LEN {
            return Err(MungeError::BadCred);
        }
        if std::str::from_utf8(cred).is_err() {
            return Err(MungeError::BadCred);
        }
        // CString::new refuses interior NULs, which would otherwise cut the credential
        // short on the C side: what munged checked would not be what we were given.
        let Ok(cred) = CString::new(cred) else {
            return Err(MungeError::BadCred);
        };
        let ctx = Ctx::new(self.socket())?;
        let mut buf: *mut c_void = ptr::null_mut();
        let mut len: c_int = 0;
        let mut uid: uid_t = uid_t::MAX;
        let mut gid: gid_t = gid_t::MAX;
        // SAFETY: `cred` is NUL-terminated and outlives the call; the out-pointers point
        // to live locals; the payload libmunge may allocate is freed by `owned`'s drop
        // whatever the result (it allocates one for some errors too).
        let rc = unsafe {
            ffi::munge_decode(
                cred.as_ptr(),
                ctx.as_ptr(),
                &mut buf,
                &mut len,
                &mut uid,
                &mut gid,
            )
        };
        let owned = Malloced(buf);
        if rc != ffi::EMUNGE_SUCCESS {
            return Err(ctx.error(rc));
        }
        let payload = match (owned.0.is_null(), usize::try_from(len)) {
            (true, _) | (_, Ok(0)) => Vec::new(),
            (false, Ok(n)) => {
                // SAFETY: libmunge allocated `len` bytes at `buf` (plus a NUL it does
                // not count); copied out before `owned` frees them.
                unsafe { std::slice::from_raw_parts(owned.0.cast::<u8>(), n) }.to_vec()
            }
            (false, Err(_)) => {
                return Err(MungeError::local(
                    ffi::EMUNGE_SNAFU,
                    "munge_decode returned a negative length",
                ))
            }
        };
        Ok(Credential { uid, gid, payload })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_texts_match_libmunge() {
        for (e, code) in [
            (MungeError::Replayed, 17),
            (MungeError::Expired, 15),
            (MungeError::Rewound, 16),
            (MungeError::Invalid, 14),
            (MungeError::BadCred, 8),
            (MungeError::Unauthorized, 18),
        ] {
            assert_eq!(e.code(), code);
            assert_eq!(e.to_string(), strerror(code as c_int));
        }
        assert_eq!(MungeError::Replayed.to_string(), "Replayed credential");
        let s = MungeError::Socket { detail: "x".into() };
        assert_eq!(s.code(), 6);
        assert_eq!(s.to_string(), "Socket communication error: x");
        assert_eq!(MungeError::from_code(9, "v".into()).code(), 9);
        assert!(MungeError::from_code(9, "v".into()).is_refusal());
        assert!(MungeError::Replayed.is_refusal());
        assert!(!s.is_refusal());
        for code in [1, 2, 3, 5] {
            assert!(!MungeError::from_code(code, "x".into()).is_refusal());
        }
    }

    #[test]
    fn input_that_cannot_be_a_credential_never_reaches_munged() {
        // A socket that does not exist: had these reached libmunge, they would be
        // Socket errors, not BadCred.
        let m = Munge::new(Some("/nonexistent/munge.socket".into()));
        assert_eq!(m.decode(""), Err(MungeError::BadCred));
        assert_eq!(m.decode("MUNGE:abc\0def:"), Err(MungeError::BadCred));
        assert_eq!(
            m.decode(&"A".repeat(MAX_CRED_LEN + 1)),
            Err(MungeError::BadCred)
        );
        assert_eq!(m.decode_bytes(b"MUNGE:\xff\xfe:"), Err(MungeError::BadCred));
        assert!(matches!(
            m.decode("MUNGE:x:"),
            Err(MungeError::Socket { .. })
        ));
    }

    #[test]
    fn oversized_payload_is_refused_before_munged() {
        let m = Munge::new(Some("/nonexistent/munge.socket".into()));
        let e = m.encode(&vec![0u8; MAX_PAYLOAD_LEN + 1]).unwrap_err();
        assert_eq!(e.code(), 3);
        let e = Munge::new(Some("/a\0b".into())).encode(b"").unwrap_err();
        assert_eq!(e.code(), 2);
    }
}
