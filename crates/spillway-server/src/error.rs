//! The server's own error type. Handlers speak errno (the protocol's language); the
//! stores below them also meet SQLite and I/O failures that no client should see in
//! detail. `StoreError` keeps the two apart until the handler boundary, where
//! `StoreError::errno` turns it into the errno sent on the wire and logs the internal
//! failures that the errno alone would hide.

use spillway_types::Errno;
use std::fmt;

#[derive(Debug)]
pub enum StoreError {
    /// An outcome the protocol defines (ENOENT, EEXIST, ENOSPC, ...): sent as is.
    Fs(Errno),
    /// The metadata database failed.
    Db(rusqlite::Error),
    /// A stripe file or fragment file failed.
    Io(std::io::Error),
    /// Something on disk is not what this server wrote (bad kind byte, bad JSON).
    Corrupt(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

impl StoreError {
    /// The errno to send to the caller. Internal failures are logged here, once, with
    /// the detail that the caller will not see.
    pub fn errno(&self) -> Errno {
        match self {
            StoreError::Fs(e) => *e,
            StoreError::Db(e) => {
                tracing::error!("metadata database error: {e}");
                Errno::EIO
            }
            StoreError::Io(e) => {
                let errno = Errno::from_io(e);
                // ENOSPC/EDQUOT from the local file system are the caller's business;
                // anything else is ours to report.
                if errno != Errno::ENOSPC {
                    tracing::error!("storage I/O error: {e}");
                }
                errno
            }
            StoreError::Corrupt(what) => {
                tracing::error!("corrupt on-disk state: {what}");
                Errno::EIO
            }
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Fs(e) => write!(f, "{e}"),
            StoreError::Db(e) => write!(f, "metadata database: {e}"),
            StoreError::Io(e) => write!(f, "I/O: {e}"),
            StoreError::Corrupt(what) => write!(f, "corrupt: {what}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<Errno> for StoreError {
    fn from(e: Errno) -> StoreError {
        StoreError::Fs(e)
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        StoreError::Db(e)
    }
}

impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> StoreError {
        StoreError::Io(e)
    }
}

/// Shorthand for the protocol outcomes, so stores read `Err(fs(Errno::ENOENT))`.
pub fn fs(e: Errno) -> StoreError {
    StoreError::Fs(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_to_errno() {
        assert_eq!(fs(Errno::EEXIST).errno(), Errno::EEXIST);
        let io = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(StoreError::from(io).errno(), Errno::ENOSPC);
        assert_eq!(StoreError::Corrupt("x".into()).errno(), Errno::EIO);
        assert_eq!(
            StoreError::from(rusqlite::Error::InvalidQuery).errno(),
            Errno::EIO
        );
    }
}
