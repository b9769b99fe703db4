//! Validation of everything name-like that arrives from the wire. Kept in one place so
//! every request checks names the same way, with the errno the protocol fixes.

use crate::error::{fs, StoreResult};
use spillway_types::tunables::{
    MAX_NAME_LEN, MAX_SYMLINK_LEN, MAX_XATTR_NAME_LEN, MAX_XATTR_VALUE_LEN,
};
use spillway_types::Errno;

/// A directory entry name: 1..=MAX_NAME_LEN bytes, no '/' and no NUL.
pub(crate) fn check_name(name: &[u8]) -> StoreResult<()> {
    if name.is_empty() || name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(fs(Errno::EINVAL));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(fs(Errno::ENAMETOOLONG));
    }
    Ok(())
}

/// A symlink target: at most MAX_SYMLINK_LEN bytes.
pub(crate) fn check_symlink_target(target: &[u8]) -> StoreResult<()> {
    if target.len() > MAX_SYMLINK_LEN {
        return Err(fs(Errno::ENAMETOOLONG));
    }
    Ok(())
}

/// An extended attribute name: non-empty, at most MAX_XATTR_NAME_LEN bytes (ERANGE, as
/// Linux answers for an over-long name).
pub(crate) fn check_xattr_name(name: &[u8]) -> StoreResult<()> {
    if name.is_empty() {
        return Err(fs(Errno::EINVAL));
    }
    if name.len() > MAX_XATTR_NAME_LEN {
        return Err(fs(Errno::ERANGE));
    }
    Ok(())
}

/// An extended attribute value: at most MAX_XATTR_VALUE_LEN bytes.
pub(crate) fn check_xattr_value(value: &[u8]) -> StoreResult<()> {
    if value.len() > MAX_XATTR_VALUE_LEN {
        return Err(fs(Errno::E2BIG));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno(r: StoreResult<()>) -> Option<Errno> {
        r.err().map(|e| e.errno())
    }

    #[test]
    fn names() {
        assert_eq!(errno(check_name(b"ok")), None);
        assert_eq!(errno(check_name(b"")), Some(Errno::EINVAL));
        assert_eq!(errno(check_name(b"a/b")), Some(Errno::EINVAL));
        assert_eq!(errno(check_name(b"a\0b")), Some(Errno::EINVAL));
        assert_eq!(errno(check_name(&[b'x'; 255])), None);
        assert_eq!(errno(check_name(&[b'x'; 256])), Some(Errno::ENAMETOOLONG));
        assert_eq!(
            errno(check_symlink_target(&[b'x'; 4097])),
            Some(Errno::ENAMETOOLONG)
        );
    }

    #[test]
    fn xattrs() {
        assert_eq!(errno(check_xattr_name(b"user.a")), None);
        assert_eq!(errno(check_xattr_name(b"")), Some(Errno::EINVAL));
        assert_eq!(errno(check_xattr_name(&[b'x'; 256])), Some(Errno::ERANGE));
        assert_eq!(errno(check_xattr_value(&[0; 65537])), Some(Errno::E2BIG));
        assert_eq!(errno(check_xattr_value(&[0; 65536])), None);
    }
}
