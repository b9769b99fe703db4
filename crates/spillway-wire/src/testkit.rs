//! What the wire layer's tests share: a test server's handshake and a client's.

use crate::messages::{HelloReply, HelloReq};
use crate::PROTOCOL_VERSION;
use spillway_types::Errno;

/// A test service's answer to every Hello: server 0 of 1, no session state.
pub(crate) fn accept_hello() -> Result<(HelloReply, ()), Errno> {
    let reply = HelloReply {
        version: PROTOCOL_VERSION,
        server_index: 0,
        server_count: 1,
    };
    Ok((reply, ()))
}

/// A client's Hello to a test service (which accepts anything).
pub(crate) fn hello() -> HelloReq {
    HelloReq {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        role: 0,
        instance: 0,
        credential: Vec::new(),
        peer_name: "test".into(),
    }
}
