//! Capabilities: what a client presents in its handshake instead of the instance secret
//! (docs/wire-protocol.md, "Capabilities", is the specification of the bytes).
//!
//! A capability names an instance, a client node, the source addresses the client may
//! connect from and an expiry, and carries an HMAC-SHA256 tag keyed by the instance
//! secret. Whoever holds the secret (the manager, `spillway cluster up`) mints them;
//! servers verify them. A client never sees the secret.

use crate::signed::{hmac, Cursor, HmacSha256};
use hmac::Mac;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// First bytes of every capability.
pub const MAGIC: [u8; 4] = *b"SPWC";
/// The only format version.
pub const VERSION: u8 = 1;
/// Bytes of the tag (HMAC-SHA256).
pub const TAG_LEN: usize = 32;
/// The shortest capability: header, empty node, no address, tag.
pub const MIN_LEN: usize = HEADER_LEN + 1 + TAG_LEN;
/// Longest node name and most addresses one capability may carry (each has a u8 count).
pub const MAX_NODE_LEN: usize = 255;
pub const MAX_ADDRS: usize = 255;

/// magic, version, instance, expires, node_len.
const HEADER_LEN: usize = 4 + 1 + 8 + 8 + 1;
const FAMILY_V4: u8 = 4;
const FAMILY_V6: u8 = 6;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    pub instance: u64,
    /// The client node's name (at most 255 bytes). Not checked by servers: they have
    /// no trustworthy name of the peer; `addrs` is what binds a capability to a node.
    pub node: String,
    /// Source addresses the client may connect from; empty: any.
    pub addrs: Vec<IpAddr>,
    /// Unix seconds; the capability is valid while the server's clock reads less.
    pub expires: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapabilityError {
    /// Not a capability of this format (for minting: a field over its limit).
    Malformed,
    /// The tag does not match: tampered with, or keyed by another secret.
    BadTag,
    /// Genuine, but for another instance.
    WrongInstance,
    /// Genuine, but past its expiry.
    Expired,
    /// Genuine, but the connection comes from an address it does not name.
    WrongAddress,
}

impl std::fmt::Display for CapabilityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CapabilityError::Malformed => "malformed capability",
            CapabilityError::BadTag => "capability tag does not match",
            CapabilityError::WrongInstance => "capability is for another instance",
            CapabilityError::Expired => "capability has expired",
            CapabilityError::WrongAddress => "capability does not allow this source address",
        })
    }
}

impl std::error::Error for CapabilityError {}

fn keyed(secret: &[u8]) -> HmacSha256 {
    hmac(secret)
}

/// Encode and tag `cap` with the instance secret; `None` when the node name is longer
/// than 255 bytes or there are more than 255 addresses (the format cannot say so).
pub fn try_mint(secret: &[u8], cap: &Capability) -> Option<Vec<u8>> {
    if cap.node.len() > MAX_NODE_LEN || cap.addrs.len() > MAX_ADDRS {
        return None;
    }
    let mut out = Vec::with_capacity(MIN_LEN + cap.node.len() + 17 * cap.addrs.len());
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&cap.instance.to_le_bytes());
    out.extend_from_slice(&cap.expires.to_le_bytes());
    out.push(cap.node.len() as u8);
    out.extend_from_slice(cap.node.as_bytes());
    out.push(cap.addrs.len() as u8);
    for a in &cap.addrs {
        match a {
            IpAddr::V4(v4) => {
                out.push(FAMILY_V4);
                out.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                out.push(FAMILY_V6);
                out.extend_from_slice(&v6.octets());
            }
        }
    }
    let mut mac = keyed(secret);
    mac.update(&out);
    out.extend_from_slice(&mac.finalize().into_bytes());
    Some(out)
}

/// Encode and tag `cap` with the instance secret.
///
/// # Panics
/// When `cap.node` is longer than 255 bytes or `cap.addrs` has more than 255 entries:
/// truncating either would change what the capability allows. Callers building a
/// capability from outside input use [`try_mint`].
pub fn mint(secret: &[u8], cap: &Capability) -> Vec<u8> {
    match try_mint(secret, cap) {
        Some(bytes) => bytes,
        None => panic!(
            "capability over the format's limits: node {} bytes, {} addresses (255 each at most)",
            cap.node.len(),
            cap.addrs.len()
        ),
    }
}

/// Check `bytes` as a capability for `instance` presented from `peer_ip` at unix time
/// `now`, under the instance `secret`; the capability it holds if it is valid.
/// The checks run in the order of docs/wire-protocol.md, so the error is the first
/// that fails. Never panics, whatever the bytes.
pub fn verify(
    secret: &[u8],
    bytes: &[u8],
    instance: u64,
    peer_ip: IpAddr,
    now: u64,
) -> Result<Capability, CapabilityError> {
    if bytes.len() < MIN_LEN || bytes[..4] != MAGIC || bytes[4] != VERSION {
        return Err(CapabilityError::Malformed);
    }
    let (body, tag) = bytes.split_at(bytes.len() - TAG_LEN);
    let mut mac = keyed(secret);
    mac.update(body);
    // verify_slice compares in constant time.
    mac.verify_slice(tag).map_err(|_| CapabilityError::BadTag)?;
    let cap = parse_body(body).ok_or(CapabilityError::Malformed)?;
    if cap.instance != instance {
        return Err(CapabilityError::WrongInstance);
    }
    if now >= cap.expires {
        return Err(CapabilityError::Expired);
    }
    let peer = peer_ip.to_canonical();
    if !cap.addrs.is_empty() && !cap.addrs.iter().any(|a| a.to_canonical() == peer) {
        return Err(CapabilityError::WrongAddress);
    }
    Ok(cap)
}

/// The fields of a capability without its tag, if they are exactly one well-formed set.
fn parse_body(body: &[u8]) -> Option<Capability> {
    let mut c = Cursor(body);
    if c.take(4)? != MAGIC || c.u8()? != VERSION {
        return None;
    }
    let instance = c.u64()?;
    let expires = c.u64()?;
    let node_len = usize::from(c.u8()?);
    let node = std::str::from_utf8(c.take(node_len)?).ok()?.to_string();
    let count = c.u8()?;
    let mut addrs = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let addr = match c.u8()? {
            FAMILY_V4 => {
                let o: [u8; 4] = c.take(4)?.try_into().ok()?;
                IpAddr::V4(Ipv4Addr::from(o))
            }
            FAMILY_V6 => {
                let o: [u8; 16] = c.take(16)?.try_into().ok()?;
                IpAddr::V6(Ipv6Addr::from(o))
            }
            _ => return None,
        };
        addrs.push(addr);
    }
    if !c.0.is_empty() {
        return None;
    }
    Some(Capability {
        instance,
        node,
        addrs,
        expires,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::{decode_hex, encode_hex};
    use proptest::prelude::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NOW: u64 = 1_800_000_000;

    fn sample() -> Capability {
        Capability {
            instance: 0x0102_0304_0506_0708,
            node: "nid00042".into(),
            addrs: vec![
                IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)),
                "fd00::1".parse().unwrap(),
            ],
            expires: 1_900_000_000,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    // The exact bytes, so that a change of the format cannot go unnoticed: the manager
    // and servers of other versions must agree on them. The tags were computed with an
    // independent HMAC-SHA256 (Python's hmac module) over the bytes spelled out here.
    // If this fails, the format changed: bump VERSION and document it, do not edit the
    // vectors.
    #[test]
    fn fixed_vectors() {
        let bytes = mint(SECRET, &sample());
        let fields = concat!(
            "53505743",                           // magic
            "01",                                 // version
            "0807060504030201",                   // instance
            "00b33f7100000000",                   // expires 1,900,000,000
            "08",                                 // node_len
            "6e69643030303432",                   // "nid00042"
            "02",                                 // addr_count
            "040a010203",                         // 10.1.2.3
            "06fd000000000000000000000000000001", // fd00::1
        );
        assert_eq!(encode_hex(&bytes[..bytes.len() - TAG_LEN]), fields);
        assert_eq!(
            encode_hex(&bytes[bytes.len() - TAG_LEN..]),
            "73e6a28cce236f180b2356bd1b9ffe2fe48f0de632d8f7e17baa4dccfc38b927"
        );

        let any = Capability {
            instance: 42,
            node: String::new(),
            addrs: vec![],
            expires: u64::MAX,
        };
        let bytes = mint(b"test-credential", &any);
        assert_eq!(bytes.len(), MIN_LEN);
        assert_eq!(
            encode_hex(&bytes),
            concat!(
                "5350574301",
                "2a00000000000000",
                "ffffffffffffffff",
                "00",
                "00",
                "4c5feab5ce05820bb6376b61336cc3a4ab3c83b2f1817be2b0a5cf4e72bece90"
            )
        );
    }

    #[test]
    fn hmac_is_rfc_4231() {
        // RFC 4231 test case 2, through the same keyed() path the tags use.
        let mut mac = keyed(b"Jefe");
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            encode_hex(&mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn valid_capability_verifies() {
        let cap = sample();
        let bytes = mint(SECRET, &cap);
        assert_eq!(
            verify(SECRET, &bytes, cap.instance, ip("10.1.2.3"), NOW),
            Ok(cap.clone())
        );
        assert_eq!(
            verify(SECRET, &bytes, cap.instance, ip("fd00::1"), NOW),
            Ok(cap.clone())
        );
        // An IPv4 client seen through a dual-stack socket.
        assert_eq!(
            verify(SECRET, &bytes, cap.instance, ip("::ffff:10.1.2.3"), NOW),
            Ok(cap.clone())
        );
        // An address minted as IPv4-mapped matches the plain IPv4 peer too.
        let mapped = Capability {
            addrs: vec![ip("::ffff:127.0.0.1")],
            ..cap.clone()
        };
        let b = mint(SECRET, &mapped);
        assert!(verify(SECRET, &b, cap.instance, ip("127.0.0.1"), NOW).is_ok());
        // No address: any source.
        let any = Capability {
            addrs: vec![],
            ..cap.clone()
        };
        let b = mint(SECRET, &any);
        assert!(verify(SECRET, &b, cap.instance, ip("192.0.2.7"), NOW).is_ok());
        assert!(verify(SECRET, &b, cap.instance, ip("2001:db8::7"), NOW).is_ok());
    }

    #[test]
    fn each_refusal_has_its_reason() {
        let cap = sample();
        let bytes = mint(SECRET, &cap);
        let peer = ip("10.1.2.3");
        let check = |b: &[u8], secret: &[u8], inst: u64, peer: IpAddr, now: u64| {
            verify(secret, b, inst, peer, now).unwrap_err()
        };
        use CapabilityError::*;
        assert_eq!(check(&[], SECRET, cap.instance, peer, NOW), Malformed);
        assert_eq!(check(SECRET, SECRET, cap.instance, peer, NOW), Malformed);
        assert_eq!(
            check(&bytes, b"another secret", cap.instance, peer, NOW),
            BadTag
        );
        assert_eq!(check(&bytes, SECRET, 7, peer, NOW), WrongInstance);
        assert_eq!(
            check(&bytes, SECRET, cap.instance, peer, cap.expires),
            Expired
        );
        assert!(verify(SECRET, &bytes, cap.instance, peer, cap.expires - 1).is_ok());
        assert_eq!(
            check(&bytes, SECRET, cap.instance, ip("10.1.2.4"), NOW),
            WrongAddress
        );
        assert_eq!(
            check(&bytes, SECRET, cap.instance, ip("::ffff:10.1.2.4"), NOW),
            WrongAddress
        );
        // Any flipped bit anywhere: malformed if in the magic or version, else a bad tag.
        for i in 0..bytes.len() {
            let mut t = bytes.clone();
            t[i] ^= 0x01;
            let want = if i < 5 { Malformed } else { BadTag };
            assert_eq!(check(&t, SECRET, cap.instance, peer, NOW), want, "byte {i}");
        }
        // A tag over a body that does not parse (only a secret holder can make one).
        let mut body = bytes[..bytes.len() - TAG_LEN].to_vec();
        body.push(0);
        let mut mac = keyed(SECRET);
        mac.update(&body);
        body.extend_from_slice(&mac.finalize().into_bytes());
        assert_eq!(check(&body, SECRET, cap.instance, peer, NOW), Malformed);
    }

    #[test]
    fn limits() {
        let at_limit = Capability {
            node: "n".repeat(MAX_NODE_LEN),
            addrs: vec![ip("2001:db8::1"); MAX_ADDRS],
            ..sample()
        };
        let b = mint(SECRET, &at_limit);
        assert_eq!(b.len(), 4645);
        assert_eq!(
            verify(SECRET, &b, at_limit.instance, ip("2001:db8::1"), NOW),
            Ok(at_limit.clone())
        );
        let long_node = Capability {
            node: "n".repeat(MAX_NODE_LEN + 1),
            ..sample()
        };
        assert_eq!(try_mint(SECRET, &long_node), None);
        let many = Capability {
            addrs: vec![ip("10.0.0.1"); MAX_ADDRS + 1],
            ..sample()
        };
        assert_eq!(try_mint(SECRET, &many), None);
        assert!(std::panic::catch_unwind(|| mint(SECRET, &many)).is_err());
        assert!(decode_hex(&encode_hex(&b)).is_some_and(|x| x == b));
    }

    #[test]
    fn every_truncation_is_refused() {
        let bytes = mint(SECRET, &sample());
        for n in 0..bytes.len() {
            assert!(
                verify(SECRET, &bytes[..n], sample().instance, ip("10.1.2.3"), NOW).is_err(),
                "prefix of {n} bytes"
            );
            assert!(
                verify(
                    SECRET,
                    &bytes[n + 1..],
                    sample().instance,
                    ip("10.1.2.3"),
                    NOW
                )
                .is_err(),
                "suffix from {}",
                n + 1
            );
        }
    }

    fn any_ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<[u8; 4]>().prop_map(|o| IpAddr::V4(Ipv4Addr::from(o))),
            any::<[u8; 16]>().prop_map(|o| IpAddr::V6(Ipv6Addr::from(o))),
        ]
    }

    fn any_cap() -> impl Strategy<Value = Capability> {
        (
            any::<u64>(),
            "[a-z0-9.-]{0,64}",
            proptest::collection::vec(any_ip(), 0..8),
            any::<u64>(),
        )
            .prop_map(|(instance, node, addrs, expires)| Capability {
                instance,
                node,
                addrs,
                expires,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn random_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
            prefix in any::<bool>(),
            peer in any_ip(),
            now in any::<u64>(),
        ) {
            // With the right prefix the bytes get past the first check into the tag's.
            let mut b = bytes;
            if prefix {
                b.splice(0..0, MAGIC.iter().copied().chain([VERSION]));
            }
            prop_assert!(verify(SECRET, &b, 1, peer, now).is_err());
        }

        #[test]
        fn round_trip_and_mutations(
            cap in any_cap(),
            secret in proptest::collection::vec(any::<u8>(), 0..100),
            cut in any::<usize>(),
            flip in any::<usize>(),
            mask in 1u8..,
        ) {
            let bytes = mint(&secret, &cap);
            let peer = cap.addrs.first().copied().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
            if cap.expires > 0 {
                prop_assert_eq!(
                    verify(&secret, &bytes, cap.instance, peer, cap.expires - 1),
                    Ok(cap.clone())
                );
            }
            // A truncation or a changed byte is never accepted.
            let cut = cut % bytes.len();
            prop_assert!(verify(&secret, &bytes[..cut], cap.instance, peer, 0).is_err());
            let mut t = bytes.clone();
            t[flip % bytes.len()] ^= mask;
            prop_assert!(verify(&secret, &t, cap.instance, peer, 0).is_err());
        }
    }
}
