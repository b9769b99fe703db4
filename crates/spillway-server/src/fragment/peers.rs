//! Connections to the other servers of an instance, made on first use and kept.

use crate::fragment::config::FragmentConfig;
use spillway_types::ServerIndex;
use spillway_wire::{Endpoint, HelloReq, Role};
use std::sync::OnceLock;
use std::time::Duration;

pub(super) struct Peers {
    addrs: Vec<String>,
    hello: HelloReq,
    deadline: Duration,
    reconnect_window: Duration,
    endpoints: Vec<OnceLock<Endpoint>>,
}

impl Peers {
    pub(super) fn new(
        config: &FragmentConfig,
        deadline: Duration,
        reconnect_window: Duration,
    ) -> Peers {
        let hello = HelloReq::new(
            Role::Peer,
            config.instance,
            config.credential_bytes(),
            format!(
                "spillway-server pid {} fragment {}/{}",
                std::process::id(),
                config.instance,
                config.index
            ),
        );
        Peers {
            addrs: config.peers.clone(),
            hello,
            deadline,
            reconnect_window,
            endpoints: config.peers.iter().map(|_| OnceLock::new()).collect(),
        }
    }

    /// The endpoint of server `index`, if the instance has one.
    pub(super) fn get(&self, index: ServerIndex) -> Option<&Endpoint> {
        let addr = self.addrs.get(usize::from(index.0))?;
        let slot = self.endpoints.get(usize::from(index.0))?;
        Some(slot.get_or_init(|| {
            Endpoint::new(
                addr.clone(),
                self.hello.clone(),
                self.deadline,
                self.reconnect_window,
            )
        }))
    }

    pub(super) fn disconnect_all(&self) {
        for ep in self.endpoints.iter().filter_map(OnceLock::get) {
            ep.disconnect();
        }
    }
}
