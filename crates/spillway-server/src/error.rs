//! The server's own error type. Handlers speak errno (the protocol's language); the
//! stores below them also meet SQLite and I/O failures that no client should see in
//! detail. `StoreError` keeps the two apart until the handler boundary, where
//! `StoreError::errno` turns it into the errno sent on the wire and logs the internal
//! failures that the errno alone would hide.
//!
//! Space running out is the caller's outcome, not an internal failure: SQLite's "disk
//! full" (`SQLITE_FULL`, or an I/O error whose OS errno was ENOSPC/EDQUOT) and a stripe
//! file's ENOSPC/EDQUOT all answer ENOSPC, as a local file system would, and are logged
//! at most once a minute (a full disk must not also flood the log it shares).

use spillway_types::peer::Throttle;
use spillway_types::Errno;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
    /// The storage under the store ran out of space (or quota): what failed, for the
    /// log. Answered ENOSPC.
    Full(String),
}

pub(crate) type StoreResult<T> = Result<T, StoreError>;

impl StoreError {
    /// The errno to send to the caller. Internal failures are logged here, once, with
    /// the detail that the caller will not see.
    pub fn errno(&self) -> Errno {
        match self {
            StoreError::Fs(e) => *e,
            StoreError::Db(e) if sqlite_full(e) => {
                space_ran_out(&format!("metadata database: {e}"));
                Errno::ENOSPC
            }
            StoreError::Db(e) => {
                tracing::error!("metadata database error: {e}");
                Errno::EIO
            }
            StoreError::Io(e) if is_out_of_space(e.raw_os_error()) => {
                space_ran_out(&format!("storage I/O: {e}"));
                Errno::ENOSPC
            }
            StoreError::Io(e) => {
                tracing::error!("storage I/O error: {e}");
                Errno::from_io(e)
            }
            StoreError::Corrupt(what) => {
                tracing::error!("corrupt on-disk state: {what}");
                Errno::EIO
            }
            StoreError::Full(what) => {
                space_ran_out(what);
                Errno::ENOSPC
            }
        }
    }

    /// A SQLite failure, given the OS errno SQLite last saw on that connection
    /// (`sqlite3_system_errno`): SQLite reports a failed write of its log or database
    /// as `SQLITE_FULL` only for ENOSPC, and EDQUOT (and ENOSPC met while growing a
    /// file in other ways) as a plain `SQLITE_IOERR_*`; the OS errno tells them apart.
    pub fn from_sqlite(e: rusqlite::Error, os_errno: i32) -> StoreError {
        let io_failure = matches!(
            &e,
            rusqlite::Error::SqliteFailure(f, _)
                if matches!(
                    f.code,
                    rusqlite::ErrorCode::SystemIoFailure
                        | rusqlite::ErrorCode::DiskFull
                        | rusqlite::ErrorCode::CannotOpen
                )
        );
        if io_failure && is_out_of_space(Some(os_errno)) {
            let os = std::io::Error::from_raw_os_error(os_errno);
            return StoreError::Full(format!("metadata database: {e} ({os})"));
        }
        if sqlite_full(&e) {
            return StoreError::Full(format!("metadata database: {e}"));
        }
        StoreError::Db(e)
    }
}

/// ENOSPC or EDQUOT: the server's disk (or its quota) is full. For the user of the
/// instance both are "no space left": the quota is the server's, not theirs.
fn is_out_of_space(errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// SQLite's own "database or disk is full".
fn sqlite_full(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull)
}

/// Log that space ran out, at most once a minute per process.
fn space_ran_out(what: &str) {
    static THROTTLE: Mutex<Option<Throttle>> = Mutex::new(None);
    let mut t = THROTTLE.lock().unwrap_or_else(|e| e.into_inner());
    let t = t.get_or_insert_with(|| Throttle::new(Duration::from_secs(60)));
    if let Some(quiet) = t.allow(Instant::now()) {
        tracing::warn!(
            "out of space, answering ENOSPC: {what} ({quiet} more since the last report)"
        );
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Fs(e) => write!(f, "{e}"),
            StoreError::Db(e) => write!(f, "metadata database: {e}"),
            StoreError::Io(e) => write!(f, "I/O: {e}"),
            StoreError::Corrupt(what) => write!(f, "corrupt: {what}"),
            StoreError::Full(what) => write!(f, "out of space: {what}"),
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
pub(crate) fn fs(e: Errno) -> StoreError {
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

    fn sqlite(code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None)
    }

    #[test]
    fn running_out_of_space_is_enospc_everywhere() {
        // SQLite's "database or disk is full", however it reaches the handler.
        assert_eq!(
            StoreError::from(sqlite(rusqlite::ffi::SQLITE_FULL)).errno(),
            Errno::ENOSPC
        );
        assert_eq!(
            StoreError::from_sqlite(sqlite(rusqlite::ffi::SQLITE_FULL), 0).errno(),
            Errno::ENOSPC
        );
        // An I/O error of SQLite's whose OS errno was EDQUOT or ENOSPC (a WAL write
        // over quota, a file that could not grow).
        for os in [libc::EDQUOT, libc::ENOSPC] {
            for code in [
                rusqlite::ffi::SQLITE_IOERR_WRITE,
                rusqlite::ffi::SQLITE_IOERR_TRUNCATE,
                rusqlite::ffi::SQLITE_IOERR_FSYNC,
                rusqlite::ffi::SQLITE_CANTOPEN,
            ] {
                let e = StoreError::from_sqlite(sqlite(code), os);
                assert!(matches!(e, StoreError::Full(_)), "{code} {os}: {e}");
                assert_eq!(e.errno(), Errno::ENOSPC);
            }
        }
        // Any other I/O failure stays EIO; a constraint never becomes ENOSPC.
        let e = StoreError::from_sqlite(sqlite(rusqlite::ffi::SQLITE_IOERR_READ), libc::EIO);
        assert_eq!(e.errno(), Errno::EIO);
        let e = StoreError::from_sqlite(sqlite(rusqlite::ffi::SQLITE_CONSTRAINT), libc::ENOSPC);
        assert_eq!(e.errno(), Errno::EIO);
        // Stripe files: EDQUOT is ENOSPC too; other errnos pass through.
        let io = std::io::Error::from_raw_os_error(libc::EDQUOT);
        assert_eq!(StoreError::from(io).errno(), Errno::ENOSPC);
        let io = std::io::Error::from_raw_os_error(libc::EROFS);
        assert_eq!(StoreError::from(io).errno(), Errno(libc::EROFS));
    }
}
