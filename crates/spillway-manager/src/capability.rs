//! The credential an activation's mount presents to the instance's servers.
//!
//! Interim: the raw instance secret (what the servers accept today). Replaced by a
//! per-(instance, node, expiry) capability signed with the secret.

use crate::db::MountWork;
use std::time::Duration;

pub fn credential(w: &MountWork, _node: &str, _addrs: &[String], _lifetime: Duration) -> String {
    spillway_types::descriptor::encode_hex(&w.secret)
}
