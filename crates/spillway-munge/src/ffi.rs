//! The part of libmunge's C API (`/usr/include/munge.h`, MUNGE 0.5.x) that this crate uses.
//!
//! Hand-written rather than generated: eight functions and a few constants, all stable
//! since MUNGE 0.5, and no bindgen (libclang) in the build.

use libc::{c_char, c_int, c_void, gid_t, uid_t};

/// `struct munge_ctx`, opaque: only ever handled through a pointer.
#[repr(C)]
pub(crate) struct MungeCtx {
    _opaque: [u8; 0],
}

pub(crate) type MungeCtxT = *mut MungeCtx;

/// `munge_err_t`, a C enum: passed as an `int` by the C ABI on every target Debian builds
/// libmunge for; kept as a plain integer so that a value this crate does not know (a
/// newer libmunge) is just a number, never an invalid Rust enum.
pub(crate) type MungeErrT = c_int;

// munge_opt_t
pub(crate) const MUNGE_OPT_SOCKET: c_int = 8;

// munge_err_t
pub(crate) const EMUNGE_SUCCESS: MungeErrT = 0;
pub(crate) const EMUNGE_SNAFU: MungeErrT = 1;
pub(crate) const EMUNGE_BAD_ARG: MungeErrT = 2;
pub(crate) const EMUNGE_BAD_LENGTH: MungeErrT = 3;
pub(crate) const EMUNGE_NO_MEMORY: MungeErrT = 5;
pub(crate) const EMUNGE_SOCKET: MungeErrT = 6;
pub(crate) const EMUNGE_BAD_CRED: MungeErrT = 8;
pub(crate) const EMUNGE_CRED_INVALID: MungeErrT = 14;
pub(crate) const EMUNGE_CRED_EXPIRED: MungeErrT = 15;
pub(crate) const EMUNGE_CRED_REWOUND: MungeErrT = 16;
pub(crate) const EMUNGE_CRED_REPLAYED: MungeErrT = 17;
pub(crate) const EMUNGE_CRED_UNAUTHORIZED: MungeErrT = 18;

#[link(name = "munge")]
extern "C" {
    /// On success `*cred` is a malloc'ed NUL-terminated string the caller frees.
    pub(crate) fn munge_encode(
        cred: *mut *mut c_char,
        ctx: MungeCtxT,
        buf: *const c_void,
        len: c_int,
    ) -> MungeErrT;

    /// `*buf` is malloc'ed (or NULL when there is no payload) on success and also on
    /// EMUNGE_CRED_EXPIRED/REWOUND/REPLAYED; the caller frees it in every case.
    pub(crate) fn munge_decode(
        cred: *const c_char,
        ctx: MungeCtxT,
        buf: *mut *mut c_void,
        len: *mut c_int,
        uid: *mut uid_t,
        gid: *mut gid_t,
    ) -> MungeErrT;

    /// A static string; never freed.
    pub(crate) fn munge_strerror(e: MungeErrT) -> *const c_char;

    pub(crate) fn munge_ctx_create() -> MungeCtxT;
    pub(crate) fn munge_ctx_destroy(ctx: MungeCtxT);

    /// Owned by the context: valid until the context's next call or its destruction.
    pub(crate) fn munge_ctx_strerror(ctx: MungeCtxT) -> *const c_char;

    /// Variadic in C; for MUNGE_OPT_SOCKET the argument is a `const char *`, which
    /// libmunge copies (strdup), so the caller's string may go away afterwards.
    pub(crate) fn munge_ctx_set(ctx: MungeCtxT, opt: c_int, ...) -> MungeErrT;
}
