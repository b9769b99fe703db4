//! Per-connection state made by the handshake: who the peer is and, for an instance
//! session, the handles it holds open, released when the connection goes.

use crate::data::GrantAccount;
use crate::error::StoreResult;
use crate::fragment::{Fragment, OpenCounts};
use spillway_types::{Attr, InodeNo};
use spillway_wire::serve::Reply;
use spillway_wire::{WriteReply, WriteReq};
use std::sync::{Arc, Mutex, MutexGuard};

pub(crate) enum Session {
    Admin,
    Instance(InstanceSession),
}

/// A `Role::Client` or `Role::Peer` session: both may send every metadata and data
/// request; only peers (other servers of the instance, proven by the instance secret)
/// may ask for stage copies, which act on the PFS as a uid they name.
pub(crate) struct InstanceSession {
    pub fragment: Arc<Fragment>,
    pub peer: bool,
    opens: Mutex<OpenCounts>,
    /// Space promised to this connection (data/grants.rs), returned when it goes.
    pub grant: GrantAccount,
    /// Whose locks this session's are in the fragment's lock table (crate::locks).
    pub lock_id: u64,
}

impl InstanceSession {
    pub(crate) fn new(fragment: Arc<Fragment>, peer: bool) -> InstanceSession {
        InstanceSession {
            fragment,
            peer,
            opens: Mutex::new(OpenCounts::default()),
            grant: GrantAccount::new(),
            lock_id: crate::locks::new_session_id(),
        }
    }

    fn opens(&self) -> MutexGuard<'_, OpenCounts> {
        self.opens.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn open(&self, ino: InodeNo) -> StoreResult<Attr> {
        let a = self.fragment.open_inode(ino)?;
        self.opens().add(ino, 1);
        Ok(a)
    }

    /// Release one open of this session. Releasing what the session does not hold is a
    /// no-op: after a reconnect the old session's opens were already released.
    pub(crate) fn release(&self, ino: InodeNo) {
        let (taken, _) = self.opens().sub(ino, 1);
        if taken > 0 {
            self.fragment.release(ino, taken);
        }
    }

    /// A Write's bytes into their stripe file, charged to this session's space grant.
    pub(crate) fn write_stripe(&self, r: &WriteReq, data: &[u8]) -> StoreResult<u32> {
        let g = &self.grant;
        self.fragment.data.write_charged(
            g,
            r.grant_epoch,
            r.charged,
            r.ino,
            r.stripe,
            r.offset,
            data,
        )
    }

    /// The answer to a Write that stored `written` bytes, with this session's grant
    /// topped up: only on success, as an error reply cannot tell the client.
    pub(crate) fn write_reply(&self, written: u32) -> Reply {
        let g = &self.grant;
        let granted = self.fragment.data.refill(g);
        Reply::of(&WriteReply {
            written,
            grant_epoch: g.epoch(),
            granted,
        })
    }

    /// The connection is gone: release everything it held open.
    pub(crate) fn close(&self) {
        self.fragment.locks.drop_session(self.lock_id);
        self.fragment.data.close_account(&self.grant);
        let held = self.opens().drain();
        for (ino, n) in held {
            self.fragment.release(ino, n);
        }
    }
}
