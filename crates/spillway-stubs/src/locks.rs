//! Lock stubs: each goes to the inode's home, whose lock table (the server's `locks`
//! module) holds the locks for this connection's session. `lock` ↔ `LockReq`,
//! `get_lk` ↔ `GetLkReq`, `unlock_owner` ↔ `UnlockOwnerReq`, `lock_renew` ↔
//! `LockRenewReq`; `lock_session` tells which connection (and so which set of locks)
//! a request went out on.

use crate::Instance;
use spillway_types::{Errno, InodeNo, ServerIndex};
use spillway_wire::messages::{
    GetLkReq, LockInfo, LockRenewReply, LockRenewReq, LockReq, UnlockOwnerReq,
};
use spillway_wire::Conn;
use std::sync::Weak;

/// Which connection to a server a lock request went out on: a client's locks there
/// live exactly as long as it. Only compared (by identity), never used to send: it
/// holds the connection weakly, so it neither keeps it open nor hands it out.
#[derive(Clone, Debug)]
pub struct LockSession(Weak<Conn>);

impl PartialEq for LockSession {
    fn eq(&self, other: &LockSession) -> bool {
        // A weak reference keeps its allocation: no other connection can reuse the
        // address while either side is held.
        Weak::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for LockSession {}

/// Bytes `[start, end]` (inclusive) of `ino` as one lock owner names them: what
/// `lock` and `get_lk` act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockRange {
    pub ino: InodeNo,
    pub owner: u64,
    pub start: u64,
    pub end: u64,
}

impl Instance {
    /// Set, change or remove (`kind` UNLOCK) a lock of `class` on `r` for process
    /// `pid`; how many locks the owner holds on the inode in that class afterwards
    /// (EAGAIN: a conflict).
    pub fn lock(&self, r: LockRange, class: u8, kind: u8, pid: u32) -> Result<u32, Errno> {
        let req = LockReq {
            ino: r.ino,
            owner: r.owner,
            class,
            kind,
            start: r.start,
            end: r.end,
            pid,
        };
        Ok(self.server(r.ino.home())?.call(&req)?.held)
    }

    /// F_GETLK: another owner's lock conflicting with a `kind` lock on `r`, if any.
    pub fn get_lk(&self, r: LockRange, kind: u8) -> Result<Option<LockInfo>, Errno> {
        let req = GetLkReq {
            ino: r.ino,
            owner: r.owner,
            kind,
            start: r.start,
            end: r.end,
        };
        Ok(self.server(r.ino.home())?.call(&req)?.conflict)
    }

    /// Drop an owner's POSIX locks, flocks or both on `ino`.
    pub fn unlock_owner(
        &self,
        ino: InodeNo,
        owner: u64,
        posix: bool,
        flock: bool,
    ) -> Result<(), Errno> {
        let req = UnlockOwnerReq {
            ino,
            owner,
            posix,
            flock,
        };
        self.server(ino.home())?.call(&req).map(|_| ())
    }

    /// Keep this client's locks at server `s`.
    pub fn lock_renew(&self, s: ServerIndex) -> Result<LockRenewReply, Errno> {
        self.server(s)?.call(&LockRenewReq {})
    }

    /// The session of server `s`: its current connection (made if there is none).
    pub fn lock_session(&self, s: ServerIndex) -> Result<LockSession, Errno> {
        let conn = self.server(s)?.conn().map_err(|e| e.errno())?;
        Ok(LockSession(std::sync::Arc::downgrade(&conn)))
    }
}
