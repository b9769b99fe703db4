//! Stripe file names (FORMAT.md, "Stripe files"): `<xx>/<ino %016x>.<stripe>`, where
//! `xx` is `ino & 0xff` in hex so that no one directory grows huge.

use spillway_types::InodeNo;
use std::path::{Path, PathBuf};

pub(super) fn bucket_name(ino: InodeNo) -> String {
    format!("{:02x}", ino.0 & 0xff)
}

pub(super) fn file_name(ino: InodeNo, stripe: u64) -> String {
    format!("{:016x}.{stripe}", ino.0)
}

pub(super) fn stripe_path(stripes: &Path, ino: InodeNo, stripe: u64) -> PathBuf {
    stripes.join(bucket_name(ino)).join(file_name(ino, stripe))
}

/// Parse a stripe file's name found in bucket directory `bucket`; `None` unless it is
/// exactly a name this server writes, in its right bucket.
pub(super) fn parse(bucket: &str, name: &str) -> Option<(InodeNo, u64)> {
    let (hex, dec) = name.split_once('.')?;
    let lower_hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if hex.len() != 16
        || !lower_hex(hex)
        || dec.is_empty()
        || !dec.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let ino = InodeNo(u64::from_str_radix(hex, 16).ok()?);
    let stripe: u64 = dec.parse().ok()?;
    // Exactly the canonical spelling (no leading zeros) and the right bucket.
    (file_name(ino, stripe) == name && bucket_name(ino) == bucket).then_some((ino, stripe))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let ino = InodeNo(0x0001_0000_0000_002a);
        let p = stripe_path(Path::new("/s"), ino, 3);
        assert_eq!(p, Path::new("/s/2a/000100000000002a.3"));
        assert_eq!(parse("2a", "000100000000002a.3"), Some((ino, 3)));
        assert_eq!(
            parse("2a", &file_name(ino, u64::MAX)),
            Some((ino, u64::MAX))
        );
    }

    #[test]
    fn foreign_names_are_refused() {
        for (b, n) in [
            ("2b", "000100000000002a.3"),
            ("2a", "000100000000002A.3"),
            ("2a", "100000000002a.3"),
            ("2a", "000100000000002a."),
            ("2a", "000100000000002a.03"),
            ("2a", "000100000000002a.+3"),
            ("2a", "000100000000002a.3.tmp"),
            ("2a", "000100000000002a.99999999999999999999999"),
            ("2a", "garbage"),
        ] {
            assert_eq!(parse(b, n), None, "{b}/{n}");
        }
    }
}
