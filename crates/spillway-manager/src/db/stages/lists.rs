//! How a list stage's pairs are stored: once, in `stage_lists`, written at the post and
//! never rewritten, front-coded.
//!
//! A list names up to `MAX_PAIRS` pairs, mostly files of a few directories. As JSON in
//! the `stages` row they took ~50 bytes a pair (0.9 MB for 18,000), and since SQLite
//! rewrites a whole row, overflow pages included, on every update, each change of the
//! stage's state or counters wrote that again. Here each path is stored as the bytes it
//! shares with the previous path of its side (sources with sources, destinations with
//! destinations) and the rest: `/pfs/u/run/f10017` after `/pfs/u/run/f10016` is three
//! bytes.
//!
//! Format: `count` (LEB128), then per pair the source and the destination, each as
//! `shared` (LEB128: bytes in common with the previous path of that side), `len`
//! (LEB128) and `len` bytes. The paths were checked (UTF-8, no NUL) before they are
//! encoded; a blob that does not decode to exactly that is refused as a whole.

use spillway_api::StagePair;

fn put_varint(out: &mut Vec<u8>, mut v: usize) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn shared_prefix(a: &str, b: &str) -> usize {
    let n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    // Cut on a character boundary, so that each stored rest is UTF-8 on its own.
    (0..=n).rev().find(|&i| b.is_char_boundary(i)).unwrap_or(0)
}

fn put_path(out: &mut Vec<u8>, prev: &str, p: &str) {
    let shared = shared_prefix(prev, p);
    put_varint(out, shared);
    put_varint(out, p.len() - shared);
    out.extend_from_slice(&p.as_bytes()[shared..]);
}

/// The stored form of `pairs`.
pub(super) fn encode(pairs: &[StagePair]) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, pairs.len());
    let (mut src, mut dst) = ("", "");
    for p in pairs {
        put_path(&mut out, src, &p.source);
        put_path(&mut out, dst, &p.destination);
        src = &p.source;
        dst = &p.destination;
    }
    out
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn varint(&mut self) -> Option<usize> {
        let mut v: usize = 0;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.0.split_first()?;
            self.0 = rest;
            v |= usize::from(b & 0x7f).checked_shl(shift)?;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn path(&mut self, prev: &str) -> Option<String> {
        let shared = self.varint()?;
        let len = self.varint()?;
        if len > self.0.len() {
            return None;
        }
        let (rest, tail) = self.0.split_at(len);
        self.0 = tail;
        let mut p = prev.get(..shared)?.to_string();
        p.push_str(std::str::from_utf8(rest).ok()?);
        Some(p)
    }
}

/// The pairs `encode` stored, or None for bytes it did not write.
pub(super) fn decode(bytes: &[u8]) -> Option<Vec<StagePair>> {
    let mut r = Reader(bytes);
    let n = r.varint()?;
    // Each pair takes at least four bytes: a count the blob cannot hold is refused
    // before anything is allocated for it.
    if n > r.0.len() / 4 {
        return None;
    }
    let mut out: Vec<StagePair> = Vec::with_capacity(n);
    for _ in 0..n {
        let (src, dst) = out
            .last()
            .map_or(("", ""), |p| (p.source.as_str(), p.destination.as_str()));
        let source = r.path(src)?;
        let destination = r.path(dst)?;
        out.push(StagePair {
            source,
            destination,
        });
    }
    r.0.is_empty().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pair(s: &str, d: &str) -> StagePair {
        StagePair {
            source: s.into(),
            destination: d.into(),
        }
    }

    #[test]
    fn a_list_of_one_directory_takes_a_few_bytes_a_pair() {
        let pairs: Vec<StagePair> = (0..18_000)
            .map(|i| pair(&format!("/pfs/u/run/in/f{i:05}"), &format!("/in/f{i:05}")))
            .collect();
        let b = encode(&pairs);
        // As JSON it was 18,000 × 50 bytes; here at most 4 bytes of header and rest
        // per side and pair.
        assert!(b.len() < 18_000 * 12, "{}", b.len());
        assert_eq!(decode(&b), Some(pairs));
        assert_eq!(decode(&encode(&[])), Some(vec![]));
    }

    #[test]
    fn bytes_it_did_not_write_are_refused() {
        let b = encode(&[pair("/p/é", "/i/é"), pair("/p/éa", "/i/x")]);
        for n in 0..b.len() {
            assert_eq!(decode(&b[..n]), None, "prefix {n}");
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(decode(&long), None);
        assert_eq!(decode(&[0xff; 12]), None);
        // A count far beyond the bytes.
        let mut huge = Vec::new();
        put_varint(&mut huge, usize::MAX >> 1);
        assert_eq!(decode(&huge), None);
    }

    proptest! {
        #[test]
        fn round_trip(
            pairs in proptest::collection::vec(("/[a-zé/]{0,12}", "/[a-zé/]{0,12}"), 0..30),
            junk in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let pairs: Vec<StagePair> = pairs.iter().map(|(s, d)| pair(s, d)).collect();
            prop_assert_eq!(decode(&encode(&pairs)), Some(pairs));
            // Whatever the bytes, no panic.
            let _ = decode(&junk);
        }
    }
}
