//! Unit tests of the stripe store on real files in a temp directory.

use super::*;

fn store(capacity: u64, fds: usize) -> (tempfile::TempDir, DataStore) {
    store_in(tempfile::tempdir().unwrap(), capacity, fds)
}

fn store_in(dir: tempfile::TempDir, capacity: u64, fds: usize) -> (tempfile::TempDir, DataStore) {
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

/// How many of the first `len` bytes' pages of `path` are in the page cache.
fn resident_pages(path: &Path, len: usize) -> usize {
    use std::os::fd::AsRawFd;
    let f = File::open(path).unwrap();
    // SAFETY: a read-only shared mapping of an open file of at least `len` bytes,
    // unmapped below; mincore only reports on it.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let mut vec = vec![0u8; len.div_ceil(4096)];
        assert_eq!(libc::mincore(p, len, vec.as_mut_ptr()), 0);
        libc::munmap(p, len);
        vec.iter().filter(|b| **b & 1 == 1).count()
    }
}

/// A large aligned write goes to the disk with O_DIRECT (none of its pages are left in
/// the page cache), a small or unaligned one through the page cache, and reads see
/// every byte of both whichever way it went, including a buffered write into a range
/// written direct before and a direct write over a range with dirty cached pages.
#[test]
fn large_aligned_writes_go_direct_and_mix_coherently_with_buffered_ones() {
    // On a disk file system (tmpfs, a possible TMPDIR, refuses O_DIRECT).
    let (d, s) = store_in(tempfile::tempdir_in("/var/tmp").unwrap(), 64 << 20, 8);
    let s = s.with_direct_writes(256 << 10);
    let path = naming::stripe_path(&d.path().join("stripes"), A, 0);
    let big: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    // Dirty cached pages first, in the range the direct write then covers.
    assert_eq!(s.write(A, 0, 8192, &[7u8; 100]).unwrap(), 100);
    assert_eq!(s.write(A, 0, 0, &big).unwrap(), big.len() as u32);
    assert_eq!(
        resident_pages(&path, big.len()),
        0,
        "a direct write leaves nothing in the page cache"
    );
    assert_eq!(s.read(A, 0, 0, 1 << 20).unwrap(), big);
    // Buffered (small) over direct, then read back through the cache.
    assert_eq!(s.write(A, 0, 4096 + 3, b"abc").unwrap(), 3);
    let mut want = big.clone();
    want[4099..4102].copy_from_slice(b"abc");
    assert_eq!(s.read(A, 0, 0, 1 << 20).unwrap(), want);
    // Unaligned large write: buffered, and its pages are cached.
    let other = InodeNo(A.0 + 1);
    let opath = naming::stripe_path(&d.path().join("stripes"), other, 0);
    assert_eq!(s.write(other, 0, 1, &big).unwrap(), big.len() as u32);
    assert!(resident_pages(&opath, big.len()) > 0);
    assert_eq!(s.read(other, 0, 1, 1 << 20).unwrap(), big);
    // An aligned write whose length is not whole blocks: the blocks direct, the tail
    // buffered; every byte reads back.
    let third = InodeNo(A.0 + 2);
    let odd = &big[..(512 << 10) + 1000];
    assert_eq!(s.write(third, 0, 0, odd).unwrap(), odd.len() as u32);
    assert_eq!(s.read(third, 0, 0, 1 << 20).unwrap(), odd);
    assert_eq!(s.used(), (1 << 20) + 1 + (1 << 20) + odd.len() as u64);
}

/// Data already block-aligned in memory (as bulk received over the wire is) is written
/// direct from where it lies; unaligned data through the aligned buffer; both land.
#[test]
fn aligned_and_unaligned_buffers_both_write_direct() {
    let (d, s) = store_in(tempfile::tempdir_in("/var/tmp").unwrap(), 64 << 20, 8);
    let s = s.with_direct_writes(4096);
    let backing: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 241) as u8).collect();
    let skip = backing.as_ptr().align_offset(4096);
    for (ino, at) in [(A, skip), (InodeNo(A.0 + 1), skip + 1)] {
        let data = &backing[at..at + (1 << 20)];
        assert_eq!(s.write(ino, 0, 4096, data).unwrap(), 1 << 20);
        let path = naming::stripe_path(&d.path().join("stripes"), ino, 0);
        assert_eq!(resident_pages(&path, 4096 + (1 << 20)), 0);
        assert_eq!(s.read(ino, 0, 4096, 1 << 20).unwrap(), data);
    }
}

/// With `direct_write_min = 0` nothing goes direct.
#[test]
fn direct_writes_can_be_turned_off() {
    let (d, s) = store_in(tempfile::tempdir_in("/var/tmp").unwrap(), 64 << 20, 8);
    let s = s.with_direct_writes(0);
    let big = vec![5u8; 1 << 20];
    s.write(A, 0, 0, &big).unwrap();
    let path = naming::stripe_path(&d.path().join("stripes"), A, 0);
    assert!(resident_pages(&path, big.len()) > 0);
}

/// A file system that refuses O_DIRECT (tmpfs) gets buffered writes, and every byte.
#[test]
fn a_file_system_refusing_direct_io_gets_buffered_writes() {
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        eprintln!("no /dev/shm here: skipped");
        return;
    };
    let (_d, s) = store_in(dir, 64 << 20, 8);
    let s = s.with_direct_writes(4096);
    let big: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 13) as u8).collect();
    for _ in 0..2 {
        assert_eq!(s.write(A, 0, 0, &big).unwrap(), big.len() as u32);
        assert_eq!(s.read(A, 0, 0, 2 << 20).unwrap(), big);
    }
}

/// A large read into a client's arena (`read_into`) leaves none of its pages in the
/// server's page cache when `drop_behind` is on, a small one keeps them, and with it
/// off every read keeps them; the bytes read are the same either way.
#[test]
fn large_arena_reads_drop_the_pages_behind_them() {
    use std::os::fd::AsRawFd;
    let (d, s) = store_in(tempfile::tempdir_in("/var/tmp").unwrap(), 64 << 20, 8);
    // Buffered writes, so that the bytes start in the page cache.
    let s = s.with_direct_writes(0).with_drop_behind(true);
    let big: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 239) as u8).collect();
    let stripes = d.path().join("stripes");
    let (a, b) = (A, InodeNo(A.0 + 1));
    let (pa, pb) = (
        naming::stripe_path(&stripes, a, 0),
        naming::stripe_path(&stripes, b, 0),
    );
    for (ino, path) in [(a, &pa), (b, &pb)] {
        assert_eq!(s.write(ino, 0, 0, &big).unwrap(), big.len() as u32);
        // As a server's pages come: read in by readahead (a buffered write of 2 MiB
        // may sit in one large folio, which a drop of half of it leaves alone).
        let f = File::open(path).unwrap();
        f.sync_all().unwrap();
        // SAFETY: advice on an open descriptor.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(resident_pages(path, big.len()), 0);
        assert_eq!(std::fs::read(path).unwrap(), big);
    }
    assert_eq!(resident_pages(&pa, big.len()), 512);

    let mut into = vec![0u8; 1 << 20];
    assert_eq!(s.read_into(a, 0, 0, &mut into).unwrap(), 1 << 20);
    assert_eq!(into, big[..1 << 20]);
    assert_eq!(
        resident_pages(&pa, 1 << 20),
        0,
        "a large arena read drops what it read"
    );
    assert_eq!(resident_pages(&pa, big.len()), 256, "the rest stays");

    // A small read (a reader's repeated header, say) keeps its pages.
    let mut small = vec![0u8; 4096];
    assert_eq!(s.read_into(b, 0, 8192, &mut small).unwrap(), 4096);
    assert_eq!(small, big[8192..8192 + 4096]);
    assert_eq!(resident_pages(&pb, big.len()), 512);

    // Off: a large read keeps its pages too.
    let s = s.with_drop_behind(false);
    assert_eq!(s.read_into(b, 0, 0, &mut into).unwrap(), 1 << 20);
    assert_eq!(into, big[..1 << 20]);
    assert_eq!(resident_pages(&pb, big.len()), 512);
}
