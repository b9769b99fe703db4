//! The manager's calls to storage servers over the data-plane wire: heartbeats,
//! fragment builds and destroys, and the instance root's attributes. One connection per
//! call, opened with a fresh admin credential (a MUNGE credential is single-use), and a
//! short deadline so one dead server never holds the loop.

use crate::db::{CallError, ConfigWork, FragmentWork};
use spillway_types::{Errno, Timespec, ROOT_INODE};
use spillway_wire::{
    role, setattr, Endpoint, FragmentCreateReq, FragmentDestroyReq, HelloReq, ServerStatusReq,
    SetAttrReq,
};
use std::sync::Arc;
use std::time::Duration;

/// Makes the credential of one admin connection.
pub type AdminCredential = Arc<dyn Fn() -> Result<Vec<u8>, String> + Send + Sync>;

pub struct Servers {
    pub admin: AdminCredential,
    pub deadline: Duration,
}

pub(crate) fn hello(role: u8, instance: u64, credential: Vec<u8>) -> HelloReq {
    HelloReq {
        version_min: 1,
        version_max: 1,
        role,
        instance,
        credential,
        peer_name: "spillway-manager".into(),
    }
}

fn describe(e: Errno) -> CallError {
    match e {
        Errno::EACCES => CallError::Refused("server refused the credential (EACCES)".into()),
        Errno::ETIMEDOUT => CallError::Transient("server did not answer in time".into()),
        Errno::EIO | Errno::ECONNREFUSED => CallError::Transient("server unreachable".into()),
        e => CallError::Refused(format!("server error {e:?}")),
    }
}

impl Servers {
    pub(crate) fn admin_endpoint(&self, address: &str) -> Result<Endpoint, CallError> {
        let cred = (self.admin)().map_err(CallError::Transient)?;
        // No reconnect window: a refused connection is an answer (the server is down).
        Ok(Endpoint::new(
            address.to_string(),
            hello(role::ADMIN, 0, cred),
            self.deadline,
            Duration::ZERO,
        ))
    }

    /// Bytes the server offers.
    pub fn probe(&self, address: &str) -> Result<u64, String> {
        let ep = self.admin_endpoint(address).map_err(|e| e.to_string())?;
        let st = ep
            .call(&ServerStatusReq {})
            .map_err(|e| describe(e).to_string())?;
        Ok(st.capacity)
    }

    pub fn create_fragment(&self, w: &FragmentWork) -> Result<(), CallError> {
        let ep = self.admin_endpoint(&w.address)?;
        let req = FragmentCreateReq {
            instance: w.instance,
            index: w.index,
            peers: w.peers.clone(),
            capacity: w.capacity,
            credential: w.secret.clone(),
            stripe_size: w.stripe_size,
            root_uid: w.root_uid,
            root_gid: w.root_gid,
            root_mode: 0o755,
        };
        match ep.call(&req) {
            Ok(_) => Ok(()),
            Err(Errno::EEXIST) => Err(CallError::Refused(format!(
                "{} already holds instance {} with other parameters",
                w.address, w.instance
            ))),
            Err(e) => Err(describe(e)),
        }
    }

    pub fn destroy_fragment(&self, address: &str, instance: u64) -> Result<(), CallError> {
        let ep = self.admin_endpoint(address)?;
        match ep.call(&FragmentDestroyReq { instance }) {
            // Already gone (an earlier attempt whose answer was lost): done.
            Ok(_) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(describe(e)),
        }
    }

    /// Set the instance root's mode and group, through the root's home server, as a
    /// peer of the instance.
    pub fn apply_config(&self, w: &ConfigWork) -> Result<(), CallError> {
        let home = w
            .peers
            .get(ROOT_INODE.home().0 as usize)
            .ok_or_else(|| CallError::Refused("instance has no fragments".into()))?;
        let ep = Endpoint::new(
            home.clone(),
            hello(role::PEER, w.instance, w.secret.clone()),
            self.deadline,
            Duration::ZERO,
        );
        let zero = Timespec::default();
        ep.call(&SetAttrReq {
            ino: ROOT_INODE,
            valid: setattr::MODE | setattr::GID,
            mode: w.mode & 0o7777,
            uid: 0,
            gid: w.gid,
            size: 0,
            atime: zero,
            mtime: zero,
            ctime: zero,
        })
        .map(|_| ())
        .map_err(describe)
    }
}
