//! Per-connection state made by the handshake: who the peer is and, for an instance
//! session, the handles it holds open, released when the connection goes.

use crate::data::GrantAccount;
use crate::error::StoreResult;
use crate::fragment::{Fragment, OpenCounts};
use crate::notices::{MountId, Sent};
use spillway_types::{Attr, InodeNo};
use spillway_wire::serve::Pusher;
use spillway_wire::serve::Reply;
use spillway_wire::{WriteReply, WriteReq};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

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
    /// Whose locks this session's are in the fragment's lock table (crate::locks);
    /// names the session in the fragment's notices too.
    pub lock_id: u64,
    /// The client mount this session belongs to (`HelloReq::mount`; 0: none).
    pub mount: MountId,
    /// How to send notices on this session's connection (serve.rs), should it watch.
    pub pusher: OnceLock<Pusher>,
}

impl InstanceSession {
    pub(crate) fn new(fragment: Arc<Fragment>, peer: bool, mount: MountId) -> InstanceSession {
        InstanceSession {
            fragment,
            peer,
            opens: Mutex::new(OpenCounts::default()),
            grant: GrantAccount::new(),
            lock_id: crate::locks::new_session_id(),
            mount: if peer { 0 } else { mount },
            pusher: OnceLock::new(),
        }
    }

    fn opens(&self) -> MutexGuard<'_, OpenCounts> {
        self.opens.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn open(&self, ino: InodeNo) -> StoreResult<Attr> {
        let a = self.fragment.open_inode(ino)?;
        self.opens().add(ino, 1);
        self.fragment.notices.opened(self.mount, ino, 1);
        Ok(a)
    }

    /// Release one open of this session. Releasing what the session does not hold is a
    /// no-op: after a reconnect the old session's opens were already released.
    pub(crate) fn release(&self, ino: InodeNo) {
        let (taken, _) = self.opens().sub(ino, 1);
        if taken > 0 {
            self.fragment.notices.released(self.mount, ino, taken);
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
        self.fragment.notices.unwatch(self.mount, self.lock_id);
        let held = self.opens().drain();
        for (ino, n) in held {
            self.fragment.notices.released(self.mount, ino, n);
            self.fragment.release(ino, n);
        }
    }

    /// This session receives its mount's notices (`WatchReq`). Only a client's session
    /// that names a mount; its sends give up after `notice_wait`, so a mount that stops
    /// reading loses its watch rather than holding the writers that notify it.
    pub(crate) fn watch(&self) -> StoreResult<()> {
        let Some(pusher) = self.pusher.get().filter(|_| self.mount != 0) else {
            return Err(crate::error::fs(spillway_types::Errno::EINVAL));
        };
        pusher
            .limit_sends(self.fragment.notices.wait())
            .map_err(crate::error::StoreError::from)?;
        self.fragment
            .notices
            .watch(self.mount, self.lock_id, pusher.clone());
        Ok(())
    }

    /// A change this session made to `attr.ino` (now `attr`), told to the other mounts
    /// holding it open; what to wait for before the change counts as seen.
    pub(crate) fn changed(&self, attr: &Attr) -> Sent {
        self.fragment
            .notices
            .changed(self.mount, self.lock_id, attr)
    }

    /// Wait for the mounts told of this session's change (`changed`).
    pub(crate) fn wait_told(&self, s: Sent) {
        if s.count > 0 {
            self.fragment.notices.wait_for(self.lock_id, s);
        }
    }
}
