//! The credential an activation's mount presents to the instance's servers: a
//! capability for (instance, client node, expiry), bound to the node's addresses and
//! signed with the instance secret (format: docs/wire-protocol.md, "Capabilities").
//!
//! Expiries are rounded to half-lifetimes, so every work answer within one half-life
//! carries the same bytes (the agent rewrites the descriptor only when it changes) and
//! a capability handed out always has at least half its lifetime left.

use crate::db::MountWork;
use spillway_types::capability::{try_mint, Capability};
use std::net::IpAddr;
use std::time::Duration;

/// The expiry for a capability issued at `now` (unix seconds).
pub fn expiry(now: u64, lifetime: Duration) -> u64 {
    let half = (lifetime.as_secs() / 2).max(1);
    (now / half + 2) * half
}

/// Hex-encoded capability for `node`, or None when it cannot be minted (more addresses
/// than a capability holds; the API refuses such agents, so this does not happen).
pub fn credential(
    w: &MountWork,
    node: &str,
    addrs: &[String],
    lifetime: Duration,
) -> Option<String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let cap = Capability {
        instance: w.instance,
        node: node.to_string(),
        addrs: addrs
            .iter()
            .filter_map(|a| a.parse::<IpAddr>().ok())
            .collect(),
        expires: expiry(now, lifetime),
    };
    try_mint(&w.secret, &cap).map(|b| spillway_types::descriptor::encode_hex(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_types::capability::verify;

    #[test]
    fn expiry_is_stable_within_a_half_life_and_leaves_half() {
        let l = Duration::from_secs(100);
        assert_eq!(expiry(1000, l), 1100);
        assert_eq!(expiry(1049, l), 1100);
        assert_eq!(expiry(1050, l), 1150);
        for now in 0..500 {
            let e = expiry(now, l);
            assert!(e >= now + 50 && e <= now + 100, "{now} {e}");
        }
    }

    #[test]
    fn minted_capability_verifies_for_its_node_address_only() {
        let w = MountWork {
            activation: 1,
            goal: spillway_api::Goal::Create,
            mount: "/m".into(),
            instance: 9,
            servers: vec![],
            capacity: 1,
            stripe_size: 4096,
            secret: vec![5; 32],
            private: false,
            cache: false,
            ldbal: false,
            replica: None,
        };
        let hex = credential(&w, "c1", &["10.0.0.7".into()], Duration::from_secs(3600)).unwrap();
        let bytes = spillway_types::descriptor::decode_hex(&hex).unwrap();
        let now = 1_000;
        assert!(verify(&w.secret, &bytes, 9, "10.0.0.7".parse().unwrap(), now).is_ok());
        assert!(verify(&w.secret, &bytes, 9, "10.0.0.8".parse().unwrap(), now).is_err());
        assert!(verify(&w.secret, &bytes, 8, "10.0.0.7".parse().unwrap(), now).is_err());
        assert!(verify(&[6; 32], &bytes, 9, "10.0.0.7".parse().unwrap(), now).is_err());
    }
}
