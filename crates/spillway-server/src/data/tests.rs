//! Unit tests of the stripe store on real files in a temp directory.

use super::*;

fn store(capacity: u64, fds: usize) -> (tempfile::TempDir, DataStore) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("stripes")).unwrap();
    let s = DataStore::open(&dir.path().join("stripes"), capacity, fds).unwrap();
    (dir, s)
}

fn errno<T: std::fmt::Debug>(r: StoreResult<T>) -> Errno {
    r.expect_err("expected an error").errno()
}

const A: InodeNo = InodeNo(0x0001_0000_0000_0007);

#[test]
fn write_read_and_holes() {
    let (_d, s) = store(1 << 20, 8);
    assert_eq!(s.write(A, 0, 10, b"hello").unwrap(), 5);
    assert_eq!(
        s.read(A, 0, 0, 100).unwrap(),
        [&[0u8; 10][..], b"hello"].concat()
    );
    assert_eq!(s.read(A, 0, 12, 2).unwrap(), b"ll");
    assert_eq!(s.read(A, 0, 15, 10).unwrap(), b"");
    assert_eq!(
        s.read(A, 1, 0, 10).unwrap(),
        b"",
        "a missing stripe reads empty"
    );
    assert_eq!(s.used(), 15);
    assert_eq!(s.write(A, 0, 0, b"").unwrap(), 0);
    assert_eq!(
        errno(s.write(A, 0, MAX_STRIPE_SIZE - 1, b"xy")),
        Errno::EINVAL
    );
    assert_eq!(errno(s.read(A, 0, 0, MAX_STRIPE_SIZE + 1)), Errno::EINVAL);
    assert_eq!(s.stripe_info(A), vec![StripeLen { stripe: 0, len: 15 }]);
}

#[test]
fn capacity_is_enforced_before_writing() {
    let (_d, s) = store(100, 8);
    s.write(A, 0, 0, &[1; 60]).unwrap();
    assert_eq!(errno(s.write(A, 1, 0, &[2; 41])), Errno::ENOSPC);
    assert_eq!(s.read(A, 1, 0, 100).unwrap(), b"", "nothing written");
    assert!(s.stripe_info(A).iter().all(|x| x.stripe == 0));
    s.write(A, 0, 0, &[3; 60]).unwrap();
    s.write(A, 1, 0, &[2; 40]).unwrap();
    assert_eq!(s.used(), 100);
}

#[test]
fn truncate_delete_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let sdir = dir.path().join("stripes");
    std::fs::create_dir(&sdir).unwrap();
    let s = DataStore::open(&sdir, 1 << 20, 8).unwrap();
    let ss = 4096u32;
    for k in 0..4 {
        s.write(A, k, 0, &vec![k as u8 + 1; ss as usize]).unwrap();
    }
    s.write(InodeNo(9), 0, 0, b"other").unwrap();
    assert_eq!(errno(s.truncate(A, 0, 0)), Errno::EINVAL);
    s.truncate(A, 4096 + 100, ss).unwrap();
    assert_eq!(
        s.stripe_info(A),
        vec![
            StripeLen {
                stripe: 0,
                len: 4096
            },
            StripeLen {
                stripe: 1,
                len: 100
            }
        ]
    );
    assert_eq!(s.read(A, 1, 0, 4096).unwrap(), vec![2u8; 100]);
    assert_eq!(s.used(), 4096 + 100 + 5);
    s.sync(A).unwrap();
    // A stray file is ignored at start, never deleted.
    std::fs::write(sdir.join("07").join("junk"), b"x").unwrap();
    drop(s);
    let s = DataStore::open(&sdir, 1 << 20, 8).unwrap();
    assert_eq!(s.used(), 4096 + 100 + 5);
    assert!(sdir.join("07").join("junk").exists());
    s.delete(A).unwrap();
    s.delete(A).unwrap();
    assert!(s.stripe_info(A).is_empty());
    assert_eq!(s.used(), 5);
    assert_eq!(s.read(InodeNo(9), 0, 0, 10).unwrap(), b"other");
}

#[test]
fn open_files_stay_within_the_cache() {
    let (_d, s) = store(1 << 30, 16);
    for i in 0..200u64 {
        s.write(InodeNo(i), 0, 0, b"x").unwrap();
        assert!(s.cached_files() <= 16);
    }
    // Syncing evicted files reopens them briefly.
    for i in 0..200u64 {
        s.sync(InodeNo(i)).unwrap();
    }
    assert!(s.cached_files() <= 16);
    s.close();
    assert_eq!(s.cached_files(), 0);
}

/// Stage-out's drain: the block-aligned bulk through an O_DIRECT descriptor, the tail
/// (and pieces at unaligned offsets) buffered; the PFS file holds exactly the bytes.
#[test]
fn drain_to_writes_the_aligned_bulk_directly_and_the_tail_buffered() {
    use std::os::unix::fs::OpenOptionsExt;
    let (_d, s) = store(64 << 20, 8);
    let data: Vec<u8> = (0..(3 << 20) + 100).map(|i| (i * 7 % 251) as u8).collect();
    s.write(A, 0, 0, &data).unwrap();
    s.write(A, 1, 0, &data[..5000]).unwrap();
    // On the disk (tmpfs, where /tmp may be, refuses O_DIRECT).
    let pfs = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = pfs.path().join("out");
    let dst = File::create(&path).unwrap();
    dst.set_len(32 << 20).unwrap();
    let direct = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .ok();
    for (stripe, at, want, d) in [
        (0, 8 << 20, data.len() as u64, direct.as_ref()),
        (1, 16 << 20, 5000, direct.as_ref()),
        (1, (20 << 20) + 1000, 5000, direct.as_ref()),
        (0, 24 << 20, data.len() as u64, None),
    ] {
        let n = s.drain_to(A, stripe, 8 << 20, &dst, d, at).unwrap();
        assert_eq!(n, want, "stripe {stripe} at {at}");
    }
    drop(dst);
    let back = std::fs::read(&path).unwrap();
    let at = |o: usize, n: usize| &back[o..o + n];
    assert!(at(8 << 20, data.len()) == &data[..]);
    assert!(at(16 << 20, 5000) == &data[..5000]);
    assert!(at((20 << 20) + 1000, 5000) == &data[..5000]);
    assert!(at(24 << 20, data.len()) == &data[..]);
    assert!(
        back[..8 << 20].iter().all(|&b| b == 0),
        "untouched bytes stay zero"
    );
}

/// Stage-in's fill: the aligned bulk through O_DIRECT on the stripe file where the file
/// system allows it, the rest buffered; the stripe holds exactly the source's bytes.
#[test]
fn fill_from_copies_the_bytes_whatever_the_alignment() {
    let (_d, s) = store(64 << 20, 8);
    let pfs = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = pfs.path().join("in");
    let data: Vec<u8> = (0..(9 << 20) + 777).map(|i| (i * 13 % 241) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let src = File::open(&path).unwrap();
    // (stripe, offset in the stripe, length, source offset)
    let cases = [
        (0u64, 0u32, 8u32 << 20, 0u64),
        (1, 0, (1 << 20) + 777, 8 << 20),
        (2, 100, 5000, 4096),
        (3, 0, 1000, 0),
    ];
    for &(k, off, len, at) in &cases {
        assert_eq!(
            s.fill_from(A, k, off, len, &src, at, k != 3).unwrap(),
            u64::from(len),
            "stripe {k}"
        );
    }
    for &(k, off, len, at) in &cases {
        let got = s.read(A, k, off, len).unwrap();
        assert!(
            got == data[at as usize..(at + u64::from(len)) as usize],
            "stripe {k}"
        );
    }
    // A source that ends early: what it held, and the index says so.
    let n = s
        .fill_from(A, 4, 0, 8 << 20, &src, (8 << 20) + 4096, true)
        .unwrap();
    assert_eq!(n, (1 << 20) + 777 - 4096);
    assert_eq!(s.read(A, 4, 0, 8 << 20).unwrap().len() as u64, n);
}
