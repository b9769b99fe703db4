//! Lock stubs: each goes to the inode's home, whose lock table (the server's `locks`
//! module) holds the locks for this connection's session. `lock` ↔ `LockReq`,
//! `get_lk` ↔ `GetLkReq`, `unlock_owner` ↔ `UnlockOwnerReq`, `lock_renew` ↔
//! `LockRenewReq`.

use crate::Instance;
use spillway_types::{Errno, InodeNo, ServerIndex};
use spillway_wire::messages::{
    GetLkReq, LockInfo, LockRenewReply, LockRenewReq, LockReq, UnlockOwnerReq,
};
use spillway_wire::Conn;
use std::sync::Arc;

impl Instance {
    /// Set, change or remove a lock; how many locks the owner holds on the inode in
    /// that class afterwards (EAGAIN: a conflict).
    pub fn lock(&self, req: &LockReq) -> Result<u32, Errno> {
        Ok(self.server(req.ino.home())?.call(req)?.held)
    }

    /// F_GETLK: another owner's lock conflicting with the request, if any.
    pub fn get_lk(&self, req: &GetLkReq) -> Result<Option<LockInfo>, Errno> {
        Ok(self.server(req.ino.home())?.call(req)?.conflict)
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

    /// The connection to server `s` (made if there is none): a client's locks there
    /// live exactly as long as it.
    pub fn lock_conn(&self, s: ServerIndex) -> Result<Arc<Conn>, Errno> {
        self.server(s)?.conn().map_err(|e| e.errno())
    }
}
