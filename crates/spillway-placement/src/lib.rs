//! Placement: the one small interface that says which server holds what.
//!
//! Both functions are *specified* (docs/placement.md) and pinned by test vectors below:
//! a client and a server built years apart, on any platform, must agree, or files
//! become unreachable. Never change them; add a new layout version instead.
//!
//! * `dentry_server(parent, name, n)`: the server holding the directory entry `name` in
//!   directory `parent`. Entries of one directory spread over all servers, so creates in
//!   one shared directory load every server.
//! * `Layout::server_of(stripe)`: the server holding stripe `k` of a file.

// `pub` marks what other crates may name; everything else is `pub(crate)` or narrower.
#![warn(unreachable_pub)]

use spillway_types::{InodeNo, ServerIndex, StripeIndex};

/// SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a, 64-bit (offset basis 0xcbf29ce484222325, prime 0x100000001b3).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Hash of a directory entry key: FNV-1a over the parent inode number as 8 bytes
/// little-endian followed by the raw name bytes, then mixed.
pub fn dentry_hash(parent: InodeNo, name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in parent.0.to_le_bytes().iter().chain(name.iter()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h)
}

/// Reduce a 64-bit hash onto `n` buckets without modulo bias worth speaking of
/// (Lemire's multiply-shift: `(h * n) >> 64`).
pub fn reduce(h: u64, n: u16) -> u16 {
    ((u128::from(h) * u128::from(n)) >> 64) as u16
}

/// The server holding directory entry `name` of directory `parent` in an instance of
/// `n` servers.
pub fn dentry_server(parent: InodeNo, name: &[u8], n: u16) -> ServerIndex {
    assert!(n > 0, "an instance has at least one server");
    ServerIndex(reduce(dentry_hash(parent, name), n))
}

/// The first inode counter at or after `from` whose inode, homed on server `home`
/// of `n`, has its first stripe on `home` too (`Layout::server_of(0) == home`).
///
/// An allocation policy, not part of the placement function: every inode number is
/// valid and placed by the formulas whatever counter it has. Servers allocate this
/// way so that a file's attributes and its first stripe live together: a file of one
/// stripe is one server's business (created, written, sized and staged there), and
/// files still start evenly over the servers because their homes do. About `n`
/// counters are skipped per inode; 48 counter bits leave room for that.
pub fn counter_starting_at_home(home: ServerIndex, n: u16, from: u64) -> u64 {
    if home.0 >= n {
        // Not a server of the instance: no counter qualifies; take the next one.
        return from;
    }
    let mut c = from;
    while reduce(mix64(InodeNo::compose(home, c).0), n) != home.0 {
        c += 1;
    }
    c
}

/// The replica a client node reads a load-balanced (`ldbal`) instance from, of `n`,
/// when the manager assigned none (a mount made by hand): FNV-1a of the node's name,
/// mixed, reduced onto the servers. One node always reads from the same one; many
/// nodes spread evenly, a few may collide.
pub fn replica_of(node: &[u8], n: u16) -> ServerIndex {
    assert!(n > 0, "an instance has at least one server");
    ServerIndex(reduce(mix64(fnv1a64(node)), n))
}

/// The replica the manager assigns to the node of rank `rank` among the nodes an
/// activation mounts on (their names sorted): `(rank + activation) mod n`. Exactly
/// even: consecutive nodes read from consecutive servers, and the activation id turns
/// the ring so that the first nodes of different jobs sharing a persistent instance
/// do not all start at server 0.
pub fn replica_of_rank(rank: u64, activation: u64, n: u16) -> ServerIndex {
    assert!(n > 0, "an instance has at least one server");
    ServerIndex((rank.wrapping_add(activation) % u64::from(n)) as u16)
}

/// The order in which a client node tries the replicas of a load-balanced instance:
/// its own (`first`, from `replica_of_rank` or `replica_of`) first, then the following
/// servers round the ring, so that the nodes of a failed server spread over the others
/// by their own first choices' neighbours rather than all landing on server 0.
pub fn replica_order(first: ServerIndex, n: u16) -> Vec<ServerIndex> {
    assert!(n > 0 && first.0 < n, "replica {first:?} of {n}");
    (0..n).map(|k| ServerIndex((first.0 + k) % n)).collect()
}

/// How one file's bytes are spread: stripes of `stripe_size` bytes rotating over
/// `width` consecutive servers (modulo `n`) starting at `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub stripe_size: u32,
    pub width: u16,
    pub start: u16,
    pub servers: u16,
}

impl Layout {
    /// The layout of inode `ino` with the given geometry in an instance of `n` servers.
    /// `width` is clamped to `1..=n`; the start server is `reduce(mix64(ino), n)`.
    pub fn of(ino: InodeNo, stripe_size: u32, width: u16, n: u16) -> Layout {
        assert!(n > 0, "an instance has at least one server");
        Layout {
            stripe_size: stripe_size.max(4096),
            width: width.clamp(1, n),
            start: reduce(mix64(ino.0), n),
            servers: n,
        }
    }

    /// Every stripe on server `server` of `n`: a load-balanced instance, where each
    /// server holds a whole replica of each file, seen from the replica read (a
    /// client) or written (a server staging in).
    pub fn replica(stripe_size: u32, server: ServerIndex, n: u16) -> Layout {
        assert!(n > 0 && server.0 < n, "server {server:?} of {n}");
        Layout {
            stripe_size: stripe_size.max(4096),
            width: 1,
            start: server.0,
            servers: n,
        }
    }

    /// Stripe `k` lives on server `(start + k mod width) mod n`.
    pub fn server_of(&self, stripe: StripeIndex) -> ServerIndex {
        let off = (stripe.0 % u64::from(self.width)) as u32;
        ServerIndex(((u32::from(self.start) + off) % u32::from(self.servers)) as u16)
    }

    /// The distinct servers that may hold any stripe of the file.
    pub fn servers(&self) -> impl Iterator<Item = ServerIndex> + '_ {
        (0..self.width).map(move |k| self.server_of(StripeIndex(u64::from(k))))
    }

    /// The stripe holding byte `offset`, and the offset within it.
    pub fn locate(&self, offset: u64) -> (StripeIndex, u32) {
        let ss = u64::from(self.stripe_size);
        (StripeIndex(offset / ss), (offset % ss) as u32)
    }

    /// Split the byte range `[offset, offset+len)` into per-stripe pieces:
    /// (stripe, offset within the stripe, length).
    pub fn pieces(&self, offset: u64, len: u64) -> Vec<(StripeIndex, u32, u32)> {
        let ss = u64::from(self.stripe_size);
        let mut out = Vec::new();
        let mut pos = offset;
        let end = offset.saturating_add(len);
        while pos < end {
            let k = pos / ss;
            let within = pos % ss;
            let take = (ss - within).min(end - pos);
            out.push((StripeIndex(k), within as u32, take as u32));
            pos += take;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Test vectors: these values are the specification. If one of these assertions
    // fails, placement changed and existing instances would lose their files.
    #[test]
    fn allocated_counters_start_their_files_at_home() {
        for n in 1..=5u16 {
            for home in 0..n {
                let home = ServerIndex(home);
                let mut from = 1;
                let mut seen = 0;
                for _ in 0..200 {
                    let c = counter_starting_at_home(home, n, from);
                    assert!(c >= from);
                    let ino = InodeNo::compose(home, c);
                    assert_eq!(Layout::of(ino, 4096, n, n).server_of(StripeIndex(0)), home);
                    // Nothing in between qualified.
                    for skipped in from..c {
                        let l = Layout::of(InodeNo::compose(home, skipped), 4096, n, n);
                        assert_ne!(l.server_of(StripeIndex(0)), home);
                    }
                    seen += c - from + 1;
                    from = c + 1;
                }
                // About n counters per inode, not wildly more.
                assert!(seen < 200 * u64::from(n) * 2, "n {n} home {home:?}: {seen}");
            }
        }
    }

    #[test]
    fn mix64_vectors() {
        assert_eq!(mix64(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix64(1), 0x910a_2dec_8902_5cc1);
        assert_eq!(mix64(0xffff_ffff_ffff_ffff), 0xe4d9_7177_1b65_2c20);
    }

    #[test]
    fn fnv_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn dentry_vectors() {
        let v: Vec<u16> = ["a", "b", "file0", "file1", "data.h5", "x"]
            .iter()
            .map(|n| dentry_server(InodeNo(1), n.as_bytes(), 4).0)
            .collect();
        assert_eq!(v, DENTRY_VECTOR_ROOT_4);
        assert_eq!(dentry_server(InodeNo(1), b"anything", 1), ServerIndex(0));
        assert_eq!(dentry_hash(InodeNo(1), b"a"), DENTRY_HASH_1_A);
    }

    #[test]
    fn stripe_vectors() {
        let l = Layout::of(InodeNo(1), 8 << 20, 4, 4);
        assert_eq!(l.start, STRIPE_START_INO1_N4);
        let v: Vec<u16> = (0..6).map(|k| l.server_of(StripeIndex(k)).0).collect();
        let s = STRIPE_START_INO1_N4;
        assert_eq!(
            v,
            vec![s, (s + 1) % 4, (s + 2) % 4, (s + 3) % 4, s, (s + 1) % 4]
        );
        let l2 = Layout::of(InodeNo::compose(ServerIndex(1), 5), 8 << 20, 2, 3);
        assert_eq!(l2.start, STRIPE_START_1_5_N3);
        assert_eq!(
            l2.server_of(StripeIndex(1)).0,
            (STRIPE_START_1_5_N3 + 1) % 3
        );
        assert_eq!(l2.server_of(StripeIndex(2)).0, STRIPE_START_1_5_N3);
    }

    #[test]
    fn replica_vectors() {
        let v: Vec<u16> = ["c0", "c3", "nid00003", "nid00006", "x"]
            .iter()
            .map(|n| replica_of(n.as_bytes(), 4).0)
            .collect();
        assert_eq!(v, REPLICA_VECTOR_4);
        assert_eq!(replica_of(b"anything", 1), ServerIndex(0));
        let o = replica_order(replica_of(b"nid00006", 4), 4);
        let first = REPLICA_VECTOR_4[3];
        assert_eq!(
            o.iter().map(|s| s.0).collect::<Vec<_>>(),
            (0..4).map(|k| (first + k) % 4).collect::<Vec<_>>()
        );
        // The manager's assignment: exactly even, turned by the activation.
        let ranks: Vec<u16> = (0..6).map(|r| replica_of_rank(r, 7, 3).0).collect();
        assert_eq!(ranks, [1, 2, 0, 1, 2, 0]);
        assert_eq!(replica_of_rank(u64::MAX, 1, 4), ServerIndex(0));
        assert_eq!(replica_of_rank(5, 0, 1), ServerIndex(0));
        let l = Layout::replica(1 << 20, ServerIndex(2), 3);
        assert!((0..10).all(|k| l.server_of(StripeIndex(k)) == ServerIndex(2)));
        assert_eq!(l.servers().collect::<Vec<_>>(), vec![ServerIndex(2)]);
    }

    #[test]
    fn nodes_spread_over_the_replicas() {
        let n = 4u16;
        let mut counts = vec![0u32; n as usize];
        for i in 0..10_000 {
            counts[replica_of(format!("nid{i:05}").as_bytes(), n).0 as usize] += 1;
        }
        for c in counts {
            assert!((2200..2800).contains(&c), "uneven spread: {c}");
        }
    }

    const REPLICA_VECTOR_4: [u16; 5] = [0, 1, 2, 3, 0];
    const DENTRY_VECTOR_ROOT_4: [u16; 6] = [2, 3, 2, 0, 3, 0];
    const DENTRY_HASH_1_A: u64 = 0x9c0b_4f54_7ca2_1095;
    const STRIPE_START_INO1_N4: u16 = 2;
    const STRIPE_START_1_5_N3: u16 = 2;

    #[test]
    fn entries_of_one_directory_spread_over_all_servers() {
        let n = 4u16;
        let mut counts = vec![0u32; n as usize];
        for i in 0..10_000 {
            let name = format!("file{i}");
            counts[dentry_server(InodeNo(1), name.as_bytes(), n).0 as usize] += 1;
        }
        for c in counts {
            assert!((2200..2800).contains(&c), "uneven spread: {c}");
        }
    }

    #[test]
    fn pieces_cover_the_range() {
        let l = Layout::of(InodeNo(9), 4096, 2, 2);
        let p = l.pieces(4000, 10000);
        assert_eq!(p[0], (StripeIndex(0), 4000, 96));
        assert_eq!(p[1], (StripeIndex(1), 0, 4096));
        let total: u32 = p.iter().map(|x| x.2).sum();
        assert_eq!(total, 10000);
        assert!(l.pieces(5, 0).is_empty());
    }
}
