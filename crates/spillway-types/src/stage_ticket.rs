//! Stage tickets: the manager's word for what one stage may do (docs/wire-protocol.md,
//! "Stage tickets", is the specification of the bytes).
//!
//! A stage runs on the storage servers as its owner: they open PFS files with the
//! owner's uid. That uid must never come from a field a sender can set, so the manager
//! signs a ticket when it starts a stage, binding the instance, the stage, the owner's
//! uid, the direction, the PFS paths and the instance paths the stage names, and an
//! expiry. The coordinator forwards it unchanged with every copy request it sends to
//! the other servers, and every server checks it (tag, instance, expiry, direction)
//! before it takes the uid from it and before it opens a PFS path, which must lie
//! under one of the ticket's PFS paths (and under one of the server's own PFS roots).
//!
//! The tag is HMAC-SHA256 keyed by `HMAC-SHA256(instance secret, "spillway stage
//! ticket v1")`, not by the secret itself: a capability (keyed by the secret) can never
//! pass for a ticket or a ticket for a capability, whatever their bytes.

use crate::signed::{hmac, Cursor, HmacSha256};
use hmac::Mac;
use std::path::{Component, Path};

/// First bytes of every ticket.
pub const MAGIC: [u8; 4] = *b"SPWT";
/// The only format version.
pub const VERSION: u8 = 1;
/// Bytes of the tag (HMAC-SHA256).
pub const TAG_LEN: usize = 32;
/// Label of the ticket key: `key = HMAC-SHA256(secret, KEY_LABEL)`.
pub const KEY_LABEL: &[u8] = b"spillway stage ticket v1";
/// The longest ticket: it travels with every copy request of the stage.
pub const MAX_LEN: usize = 64 << 10;
/// Bytes the paths of one side (PFS or instance) may take before `cover` widens them
/// to their common ancestor.
pub const MAX_SIDE_BYTES: usize = 16 << 10;
/// Longest path (as Linux's PATH_MAX).
pub const MAX_PATH_LEN: usize = 4096;
/// `direction` values (the same bytes as the wire's `StageDir`).
pub const DIRECTION_IN: u8 = 0;
pub const DIRECTION_OUT: u8 = 1;

/// magic, version, instance, stage, uid, direction, expires.
const HEADER_LEN: usize = 4 + 1 + 8 + 8 + 4 + 1 + 8;
/// The shortest ticket: header, two empty path lists, tag.
pub const MIN_LEN: usize = HEADER_LEN + 4 + 4 + TAG_LEN;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageTicket {
    pub instance: u64,
    pub stage: u64,
    /// The identity the stage runs as on the PFS (groups come from each server's user
    /// database).
    pub uid: u32,
    /// `DIRECTION_IN` (PFS → instance) or `DIRECTION_OUT`.
    pub direction: u8,
    /// Unix seconds; the ticket is valid while the server's clock reads less.
    pub expires: u64,
    /// Every PFS path the stage may open lies at or under one of these.
    pub pfs_paths: Vec<String>,
    /// Every instance path the stage names lies at or under one of these.
    pub instance_paths: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TicketError {
    /// No ticket at all (an empty field).
    Missing,
    /// Not a ticket of this format (for minting: a field over its limits).
    Malformed,
    /// The tag does not match: tampered with, forged, or for another instance's secret.
    BadTag,
    /// Genuine, but for another instance.
    WrongInstance,
    /// Genuine, but for another stage.
    WrongStage,
    /// Genuine, but for the other direction.
    WrongDirection,
    /// Genuine, but past its expiry.
    Expired,
}

impl std::fmt::Display for TicketError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TicketError::Missing => "no stage ticket",
            TicketError::Malformed => "malformed stage ticket",
            TicketError::BadTag => "stage ticket tag does not match",
            TicketError::WrongInstance => "stage ticket is for another instance",
            TicketError::WrongStage => "stage ticket is for another stage",
            TicketError::WrongDirection => "stage ticket is for the other direction",
            TicketError::Expired => "stage ticket has expired",
        })
    }
}

impl std::error::Error for TicketError {}

/// The ticket key of an instance: the secret never keys a ticket directly.
fn ticket_mac(secret: &[u8]) -> HmacSha256 {
    let mut k = hmac(secret);
    k.update(KEY_LABEL);
    hmac(&k.finalize().into_bytes())
}

/// An absolute path without `..` components, NUL bytes or more than `MAX_PATH_LEN`
/// bytes: the only paths a ticket may name or a request may be checked against.
pub fn is_clean_path(p: &str) -> bool {
    p.starts_with('/')
        && p.len() <= MAX_PATH_LEN
        && !p.contains('\0')
        && !Path::new(p)
            .components()
            .any(|c| matches!(c, Component::ParentDir))
}

/// `path` lies at or under `root`, component by component (`/a/bc` is not under
/// `/a/b`). Both must be clean (`is_clean_path`): a `..` would make the prefix lie.
pub fn lies_under(path: &str, root: &str) -> bool {
    is_clean_path(path) && is_clean_path(root) && Path::new(path).starts_with(root)
}

/// The fewest paths that cover `paths` (those under another dropped, duplicates too),
/// or, when they would take more than `MAX_SIDE_BYTES`, their deepest common ancestor
/// (at worst `/`). The servers' own limits (their PFS roots) still bound a widened
/// ticket; the owner's permissions bound it anyway.
///
/// O(n log n) in the paths (a list stage names up to 100,000): sorted by components,
/// a path's ancestors come right before the block of paths under them, so a path is
/// covered exactly when the last path kept is an ancestor of it (or the same path by
/// components). Among paths equal by components (`/a//b`, `/a/b/`) the bytewise first
/// is kept; paths that are not clean (`is_clean_path`) cover nothing and are covered by
/// nothing, so each is kept as it is. The result is in bytewise order.
pub fn cover<'a>(paths: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut clean: Vec<(Vec<u8>, &'a str)> = Vec::new();
    let mut out: Vec<&str> = Vec::new();
    for p in paths {
        if is_clean_path(p) {
            clean.push((component_key(p), p));
        } else {
            out.push(p);
        }
    }
    // By components, then bytewise: the first of each set of equal paths is kept.
    clean.sort_unstable();
    let mut last: Option<&[u8]> = None;
    for (key, p) in &clean {
        if last.is_some_and(|k| key_under(key, k)) {
            continue;
        }
        last = Some(key);
        out.push(p);
    }
    out.sort_unstable();
    out.dedup();
    widen(out.into_iter().map(str::to_string).collect())
}

/// A clean path's components, each after a NUL byte (`/` is empty): NUL sorts before
/// every byte a name can hold, so these keys sort bytewise as the paths do component
/// by component (`/a/b/x` before `/a/b-c`).
fn component_key(p: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(p.len());
    for c in Path::new(p).components() {
        if let Component::Normal(name) = c {
            key.push(0);
            key.extend_from_slice(name.as_encoded_bytes());
        }
    }
    key
}

/// The path of `key` lies at or under the path of `root` (both `component_key`s).
fn key_under(key: &[u8], root: &[u8]) -> bool {
    key.starts_with(root) && key.get(root.len()).is_none_or(|&b| b == 0)
}

/// `out` itself if it fits `MAX_SIDE_BYTES`, else its deepest common ancestor.
fn widen(out: Vec<String>) -> Vec<String> {
    let bytes: usize = out.iter().map(|p| 4 + p.len()).sum();
    if bytes <= MAX_SIDE_BYTES {
        return out;
    }
    let mut common: Vec<Component> = Path::new(&out[0]).components().collect();
    for p in &out[1..] {
        let n = common
            .iter()
            .zip(Path::new(p).components())
            .take_while(|(a, b)| *a == b)
            .count();
        common.truncate(n);
    }
    let joined: std::path::PathBuf = common.iter().collect();
    vec![joined
        .to_str()
        .filter(|s| !s.is_empty())
        .unwrap_or("/")
        .to_string()]
}

impl StageTicket {
    /// `path` may be opened on the PFS under this ticket (lexically; the server then
    /// resolves it beneath its own PFS root).
    pub fn covers_pfs(&self, path: &str) -> bool {
        self.pfs_paths.iter().any(|r| lies_under(path, r))
    }

    /// `path` (inside the instance) lies under a path this ticket names.
    pub fn covers_instance(&self, path: &str) -> bool {
        self.instance_paths.iter().any(|r| lies_under(path, r))
    }
}

fn put_paths(out: &mut Vec<u8>, paths: &[String]) {
    out.extend_from_slice(&(paths.len() as u32).to_le_bytes());
    for p in paths {
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        out.extend_from_slice(p.as_bytes());
    }
}

/// Encode and tag `t` with the instance secret; `None` when a path is not clean
/// (`is_clean_path`) or the ticket would exceed `MAX_LEN`.
pub fn try_mint(secret: &[u8], t: &StageTicket) -> Option<Vec<u8>> {
    if !t
        .pfs_paths
        .iter()
        .chain(&t.instance_paths)
        .all(|p| is_clean_path(p))
        || (t.direction != DIRECTION_IN && t.direction != DIRECTION_OUT)
    {
        return None;
    }
    let len = MIN_LEN
        + t.pfs_paths
            .iter()
            .chain(&t.instance_paths)
            .map(|p| 4 + p.len())
            .sum::<usize>();
    if len > MAX_LEN {
        return None;
    }
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&t.instance.to_le_bytes());
    out.extend_from_slice(&t.stage.to_le_bytes());
    out.extend_from_slice(&t.uid.to_le_bytes());
    out.push(t.direction);
    out.extend_from_slice(&t.expires.to_le_bytes());
    put_paths(&mut out, &t.pfs_paths);
    put_paths(&mut out, &t.instance_paths);
    let mut mac = ticket_mac(secret);
    mac.update(&out);
    out.extend_from_slice(&mac.finalize().into_bytes());
    Some(out)
}

/// Check `bytes` as a ticket for `instance` at unix time `now` under the instance
/// `secret`; the ticket if it is genuine, for this instance and not expired. The stage
/// and direction are the caller's to compare (`expect`). The checks run in the order
/// of docs/wire-protocol.md; nothing past the version is read before the tag is
/// checked. Never panics, whatever the bytes.
pub fn verify(
    secret: &[u8],
    bytes: &[u8],
    instance: u64,
    now: u64,
) -> Result<StageTicket, TicketError> {
    if bytes.is_empty() {
        return Err(TicketError::Missing);
    }
    if bytes.len() < MIN_LEN || bytes.len() > MAX_LEN || bytes[..4] != MAGIC || bytes[4] != VERSION
    {
        return Err(TicketError::Malformed);
    }
    let (body, tag) = bytes.split_at(bytes.len() - TAG_LEN);
    let mut mac = ticket_mac(secret);
    mac.update(body);
    // verify_slice compares in constant time.
    mac.verify_slice(tag).map_err(|_| TicketError::BadTag)?;
    let t = parse_body(body).ok_or(TicketError::Malformed)?;
    if t.instance != instance {
        return Err(TicketError::WrongInstance);
    }
    if now >= t.expires {
        return Err(TicketError::Expired);
    }
    Ok(t)
}

impl StageTicket {
    /// The ticket is for this stage (when the request names one) and this direction.
    pub fn expect(&self, stage: Option<u64>, direction: u8) -> Result<(), TicketError> {
        if stage.is_some_and(|s| s != self.stage) {
            return Err(TicketError::WrongStage);
        }
        if direction != self.direction {
            return Err(TicketError::WrongDirection);
        }
        Ok(())
    }
}

impl Cursor<'_> {
    fn paths(&mut self) -> Option<Vec<String>> {
        let n = self.u32()? as usize;
        // Each path takes at least its 4-byte length: a count the bytes cannot hold
        // is refused before anything is allocated for it.
        if n > self.left() / 4 {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let len = self.u32()? as usize;
            let p = std::str::from_utf8(self.take(len)?).ok()?;
            if !is_clean_path(p) {
                return None;
            }
            out.push(p.to_string());
        }
        Some(out)
    }
}

/// The fields of a ticket without its tag, if they are exactly one well-formed set.
fn parse_body(body: &[u8]) -> Option<StageTicket> {
    let mut c = Cursor(body);
    if c.take(4)? != MAGIC || c.u8()? != VERSION {
        return None;
    }
    let instance = c.u64()?;
    let stage = c.u64()?;
    let uid = c.u32()?;
    let direction = c.u8()?;
    if direction != DIRECTION_IN && direction != DIRECTION_OUT {
        return None;
    }
    let expires = c.u64()?;
    let pfs_paths = c.paths()?;
    let instance_paths = c.paths()?;
    if !c.0.is_empty() {
        return None;
    }
    Some(StageTicket {
        instance,
        stage,
        uid,
        direction,
        expires,
        pfs_paths,
        instance_paths,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capability;
    use crate::descriptor::encode_hex;
    use proptest::prelude::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NOW: u64 = 1_800_000_000;

    fn sample() -> StageTicket {
        StageTicket {
            instance: 0x0102_0304_0506_0708,
            stage: 77,
            uid: 1000,
            direction: DIRECTION_IN,
            expires: 1_900_000_000,
            pfs_paths: vec!["/pfs/alice/in".into()],
            instance_paths: vec!["/in".into()],
        }
    }

    // The exact bytes, so that a change of the format cannot go unnoticed (the manager
    // and servers of other versions must agree). The key and tag were computed with an
    // independent HMAC-SHA256 (Python's hmac module) over the bytes spelled out here.
    // If this fails, the format changed: bump VERSION and document it.
    #[test]
    fn fixed_vector() {
        let bytes = try_mint(SECRET, &sample()).unwrap();
        let fields = concat!(
            "53505754",                   // magic
            "01",                         // version
            "0807060504030201",           // instance
            "4d00000000000000",           // stage 77
            "e8030000",                   // uid 1000
            "00",                         // direction in
            "00b33f7100000000",           // expires 1,900,000,000
            "01000000",                   // one PFS path
            "0d000000",                   // 13 bytes
            "2f7066732f616c6963652f696e", // "/pfs/alice/in"
            "01000000",                   // one instance path
            "03000000",                   // 3 bytes
            "2f696e",                     // "/in"
        );
        assert_eq!(encode_hex(&bytes[..bytes.len() - TAG_LEN]), fields);
        assert_eq!(
            encode_hex(&bytes[bytes.len() - TAG_LEN..]),
            "f03c0d122c07d779c338feb9265dcbf7e46dd3b027bedb54b165aab0ddcb89d9"
        );
    }

    #[test]
    fn round_trip() {
        let t = sample();
        let b = try_mint(SECRET, &t).unwrap();
        assert_eq!(verify(SECRET, &b, t.instance, NOW), Ok(t.clone()));
        assert_eq!(t.expect(Some(77), DIRECTION_IN), Ok(()));
        assert_eq!(t.expect(None, DIRECTION_IN), Ok(()));
        let empty = StageTicket {
            pfs_paths: vec![],
            instance_paths: vec![],
            ..sample()
        };
        let b = try_mint(SECRET, &empty).unwrap();
        assert_eq!(b.len(), MIN_LEN);
        assert_eq!(verify(SECRET, &b, empty.instance, NOW), Ok(empty));
    }

    #[test]
    fn each_refusal_has_its_reason() {
        use TicketError::*;
        let t = sample();
        let b = try_mint(SECRET, &t).unwrap();
        assert_eq!(verify(SECRET, &[], t.instance, NOW), Err(Missing));
        assert_eq!(verify(SECRET, SECRET, t.instance, NOW), Err(Malformed));
        assert_eq!(verify(b"another", &b, t.instance, NOW), Err(BadTag));
        assert_eq!(verify(SECRET, &b, 9, NOW), Err(WrongInstance));
        assert_eq!(verify(SECRET, &b, t.instance, t.expires), Err(Expired));
        assert!(verify(SECRET, &b, t.instance, t.expires - 1).is_ok());
        assert_eq!(t.expect(Some(78), DIRECTION_IN), Err(WrongStage));
        assert_eq!(t.expect(Some(77), DIRECTION_OUT), Err(WrongDirection));
        // Every byte is covered by the tag: any flipped bit is refused, as malformed in
        // the magic or version, else as a bad tag.
        for i in 0..b.len() {
            let mut x = b.clone();
            x[i] ^= 0x01;
            let want = if i < 5 { Malformed } else { BadTag };
            assert_eq!(verify(SECRET, &x, t.instance, NOW), Err(want), "byte {i}");
        }
        // Every truncation and every extension.
        for n in 0..b.len() {
            assert!(
                verify(SECRET, &b[..n], t.instance, NOW).is_err(),
                "prefix {n}"
            );
        }
        let mut long = b.clone();
        long.push(0);
        assert!(verify(SECRET, &long, t.instance, NOW).is_err());
    }

    #[test]
    fn a_capability_is_never_a_ticket_nor_the_reverse() {
        let t = sample();
        let ticket = try_mint(SECRET, &t).unwrap();
        let cap = capability::mint(
            SECRET,
            &capability::Capability {
                instance: t.instance,
                node: String::new(),
                addrs: vec![],
                expires: u64::MAX,
            },
        );
        assert!(verify(SECRET, &cap, t.instance, NOW).is_err());
        let ip = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
        assert!(capability::verify(SECRET, &ticket, t.instance, ip, NOW).is_err());
        // A ticket body tagged with the secret itself (as a capability is) is refused.
        let body = &ticket[..ticket.len() - TAG_LEN];
        let mut m = hmac(SECRET);
        m.update(body);
        let mut forged = body.to_vec();
        forged.extend_from_slice(&m.finalize().into_bytes());
        assert_eq!(
            verify(SECRET, &forged, t.instance, NOW),
            Err(TicketError::BadTag)
        );
    }

    #[test]
    fn paths_must_be_clean_and_are_covered_by_components() {
        for bad in ["", "rel", "/a/../b", "/a/..", "/a\0b"] {
            let t = StageTicket {
                pfs_paths: vec![bad.into()],
                ..sample()
            };
            assert_eq!(try_mint(SECRET, &t), None, "{bad:?}");
        }
        let t = StageTicket {
            pfs_paths: vec!["/pfs/alice".into(), "/pfs/x/f".into()],
            instance_paths: vec!["/".into()],
            ..sample()
        };
        assert!(t.covers_pfs("/pfs/alice"));
        assert!(t.covers_pfs("/pfs/alice/a/b"));
        assert!(t.covers_pfs("/pfs/alice//a/./b/"));
        assert!(t.covers_pfs("/pfs/x/f"));
        assert!(!t.covers_pfs("/pfs/alicex"));
        assert!(!t.covers_pfs("/pfs/alice/../bob"));
        assert!(!t.covers_pfs("/pfs/x/g"));
        assert!(!t.covers_pfs("/pfs"));
        assert!(!t.covers_pfs("/etc/shadow"));
        assert!(!t.covers_pfs("pfs/alice/a"));
        assert!(t.covers_instance("/anything"));
        assert!(!t.covers_instance("/a/../b"));
    }

    #[test]
    fn cover_is_minimal_and_bounded() {
        assert_eq!(
            cover(["/p/a/b", "/p/a", "/p/a-c", "/p/a", "/q/x", "/p/a/b/c"]),
            vec!["/p/a".to_string(), "/p/a-c".into(), "/q/x".into()]
        );
        let many: Vec<String> = (0..5000).map(|i| format!("/pfs/u/run/f{i}")).collect();
        assert_eq!(cover(many.iter().map(String::as_str)), vec!["/pfs/u/run"]);
        let spread: Vec<String> = (0..5000).map(|i| format!("/d{i}/f")).collect();
        assert_eq!(cover(spread.iter().map(String::as_str)), vec!["/"]);
        assert!(cover(std::iter::empty()).is_empty());
        let t = StageTicket {
            pfs_paths: cover(many.iter().map(String::as_str)),
            ..sample()
        };
        assert!(try_mint(SECRET, &t).is_some());
    }

    #[test]
    fn oversized_tickets_are_refused() {
        let t = StageTicket {
            pfs_paths: (0..40)
                .map(|i| format!("/{i}/{}", "x".repeat(2000)))
                .collect(),
            ..sample()
        };
        assert_eq!(try_mint(SECRET, &t), None);
    }

    /// `cover` as it was (quadratic: every path against every kept one), the oracle
    /// the sorted version must agree with on every input.
    fn cover_quadratic<'a>(paths: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let mut all: Vec<&str> = paths.into_iter().collect();
        all.sort_unstable();
        all.dedup();
        let mut out: Vec<String> = Vec::new();
        for p in &all {
            if !out.iter().any(|k| lies_under(p, k)) {
                out.retain(|k| !lies_under(k, p));
                out.push(p.to_string());
            }
        }
        widen(out)
    }

    /// Paths that make the orders differ: names that are prefixes of one another and
    /// sort around `/` (`b`, `b-c`, `b.d`, `b0`), repeated and trailing slashes, `.`
    /// and `..` components, relative paths, `/` itself.
    fn tricky_path() -> impl Strategy<Value = String> {
        let name = prop_oneof![
            Just("b"),
            Just("b-c"),
            Just("b.d"),
            Just("b0"),
            Just("a"),
            Just("."),
            Just(".."),
            Just(""),
            Just("bb"),
            Just("B")
        ];
        (
            any::<bool>(),
            proptest::collection::vec(name, 0..5),
            any::<bool>(),
        )
            .prop_map(|(abs, names, trailing)| {
                let mut s = if abs { "/".to_string() } else { String::new() };
                s.push_str(&names.join("/"));
                if trailing {
                    s.push('/');
                }
                s
            })
    }

    #[test]
    fn cover_keeps_the_first_of_equal_paths_and_drops_those_under_another() {
        // `/a//b` is `/a/b` by components (the bytewise first stays), `/a/./b/c` under it.
        assert_eq!(cover(["/a/b", "/a/./b/c", "/a//b"]), vec!["/a//b"]);
        // `/a/b-c` sorts between `/a/b` and `/a/b/x` bytewise, not by components.
        assert_eq!(cover(["/a/b/x", "/a/b-c", "/a/b"]), vec!["/a/b", "/a/b-c"]);
        // Paths that are not clean are kept as they are; they cover nothing.
        assert_eq!(
            cover(["/a/../b/c", "/", "rel"]),
            vec!["/", "/a/../b/c", "rel"]
        );
    }

    #[test]
    fn cover_of_a_large_list_is_quick() {
        // 100,000 pairs (MAX_PAIRS of a list stage) in 1,000 directories: the quadratic
        // version takes hours here (13 s for 3,000 paths), this one a fraction of a
        // second. No time is asserted; the oracle checks the answer on a part of it.
        let paths: Vec<String> = (0..100_000)
            .map(|i| format!("/pfs/u/run/d{}/f{i}", i % 1000))
            .collect();
        assert_eq!(cover(paths.iter().map(String::as_str)), vec!["/pfs/u/run"]);
        let some = &paths[..500];
        assert_eq!(
            cover(some.iter().map(String::as_str)),
            cover_quadratic(some.iter().map(String::as_str))
        );
    }

    fn any_path() -> impl Strategy<Value = String> {
        "(/[a-z0-9_-][a-z0-9._-]{0,11}){0,5}"
            .prop_map(|s| if s.is_empty() { "/".into() } else { s })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn cover_agrees_with_the_quadratic_cover(
            paths in proptest::collection::vec(tricky_path(), 0..40),
            many in proptest::collection::vec(any_path(), 0..120),
            wide in any::<bool>(),
        ) {
            let got = cover(paths.iter().map(String::as_str));
            prop_assert_eq!(&got, &cover_quadratic(paths.iter().map(String::as_str)));
            // With long names, enough to pass MAX_SIDE_BYTES and widen.
            let long: Vec<String> = many
                .iter()
                .map(|p| if wide { format!("{p}/{}", "n".repeat(60)) } else { p.clone() })
                .collect();
            let all = long.iter().chain(&paths).map(String::as_str);
            prop_assert_eq!(cover(all.clone()), cover_quadratic(all));
        }

        #[test]
        fn random_bytes_never_pass(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
            prefix in any::<bool>(),
            now in any::<u64>(),
        ) {
            let mut b = bytes;
            if prefix {
                b.splice(0..0, MAGIC.iter().copied().chain([VERSION]));
            }
            prop_assert!(verify(SECRET, &b, 1, now).is_err());
        }

        #[test]
        fn round_trip_and_mutations(
            instance in any::<u64>(),
            stage in any::<u64>(),
            uid in any::<u32>(),
            out in any::<bool>(),
            expires in 1u64..,
            pfs in proptest::collection::vec(any_path(), 0..6),
            inst in proptest::collection::vec(any_path(), 0..6),
            flip in any::<usize>(),
            mask in 1u8..,
        ) {
            let t = StageTicket {
                instance, stage, uid,
                direction: if out { DIRECTION_OUT } else { DIRECTION_IN },
                expires, pfs_paths: pfs, instance_paths: inst,
            };
            let b = try_mint(SECRET, &t).unwrap();
            prop_assert_eq!(verify(SECRET, &b, instance, expires - 1), Ok(t.clone()));
            let mut x = b.clone();
            x[flip % b.len()] ^= mask;
            prop_assert!(verify(SECRET, &x, instance, 0).is_err());
        }
    }
}
