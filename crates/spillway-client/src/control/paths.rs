//! The path rules of control messages: which instance and PFS paths a request may
//! carry, and the errno a caller gets for one it may not (`-ENAMETOOLONG` past
//! `MAX_PATH`, `-EINVAL` for anything else malformed). libdatawarp relies on these
//! errnos (docs/libdatawarp.md). Instance paths follow the one stage path rule
//! (`spillway_api::stage_path`, as a person writes them: `StagePath::exact`).

use spillway_api::stage_path::StagePath;
use spillway_types::Errno;

/// Longest path (instance or PFS) a message may carry (the stage path limit).
pub use spillway_api::stage_path::MAX_PATH;

fn text(f: &[u8]) -> Result<&str, Errno> {
    if f.len() > MAX_PATH {
        return Err(Errno(libc::ENAMETOOLONG));
    }
    std::str::from_utf8(f).map_err(|_| Errno::EINVAL)
}

/// An instance path: absolute, no `.` or `..` component; returned normalized.
pub fn instance_path(f: &[u8]) -> Result<String, Errno> {
    // `exact` refuses only what is not absolute or holds `.`/`..` (EINVAL); the
    // length was bounded above.
    StagePath::exact(text(f)?)
        .map(StagePath::into_string)
        .map_err(|e| Errno(e.errno()))
}

/// A PFS path: any non-empty text, passed on as given (the servers resolve it beneath
/// the PFS roots and refuse what escapes them).
pub(super) fn pfs_path(f: &[u8]) -> Result<String, Errno> {
    let s = text(f)?;
    if s.is_empty() {
        return Err(Errno::EINVAL);
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_paths_are_normalized() {
        assert_eq!(instance_path(b"/").unwrap(), "/");
        assert_eq!(instance_path(b"///").unwrap(), "/");
        assert_eq!(instance_path(b"/a//b/").unwrap(), "/a/b");
        assert!(instance_path(b"/a/./b").is_err());
        assert!(instance_path(b"a").is_err());
        assert!(instance_path(b"").is_err());
    }
}
