use super::*;
use proptest::prelude::*;

fn ext(ino: u64, stripe: u64, offset: u64, len: u64) -> Extent {
    Extent {
        ino,
        stripe,
        offset,
        len,
        version: [ino as u8; 32],
    }
}

/// A memory file that forgets, at a crash, whatever was appended after the last sync
/// beyond the prefix the crash keeps.
#[derive(Default)]
struct MemLog {
    bytes: Vec<u8>,
    synced: usize,
}

impl LogFile for &mut MemLog {
    fn append(&mut self, b: &[u8]) -> io::Result<()> {
        self.bytes.extend_from_slice(b);
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        self.synced = self.bytes.len();
        Ok(())
    }
}

/// The dirty set the first `n` records describe.
fn model(records: &[(Kind, Extent)], n: usize) -> Dirty {
    let mut d = Dirty::default();
    for (k, e) in &records[..n] {
        d.apply(*k, e);
    }
    d
}

#[test]
fn crc32c_is_castagnolis() {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c(b""), 0);
}

#[test]
fn records_round_trip_and_flushed_ranges_leave_the_dirty_set() {
    let mut mem = MemLog::default();
    let mut log = WbLog::resume(&mut mem, recover(&[]));
    log.record(Kind::Dirty, &ext(7, 0, 0, 4096)).unwrap();
    log.record(Kind::Dirty, &ext(7, 0, 4096, 4096)).unwrap();
    log.record(Kind::Dirty, &ext(9, 2, 100, 50)).unwrap();
    log.record(Kind::Flushed, &ext(7, 0, 0, 1000)).unwrap();
    log.record(Kind::Dropped, &ext(9, 2, 0, 1 << 20)).unwrap();
    let want = log.dirty().clone();
    assert_eq!(want.bytes(), 8192 - 1000);
    assert!(!want.inodes.contains_key(&9));
    log.sync().unwrap();
    let r = recover(&mem.bytes);
    assert_eq!(r.dirty, want);
    assert_eq!(r.next_seq, 6);
    assert_eq!(r.valid_len, mem.bytes.len());
}

/// A crash can cut the log at any byte: recovery keeps exactly the whole records
/// before the cut, and a corrupted record ends the log where it lies.
#[test]
fn a_torn_or_corrupt_tail_ends_the_log_at_the_last_whole_record() {
    let records: Vec<(Kind, Extent)> = (0..6u64)
        .map(|i| {
            let k = if i % 3 == 2 {
                Kind::Flushed
            } else {
                Kind::Dirty
            };
            (k, ext(1 + i % 2, 0, i * 100, 300))
        })
        .collect();
    let mut bytes = Vec::new();
    for (i, (k, e)) in records.iter().enumerate() {
        bytes.extend_from_slice(&encode(i as u64 + 1, *k, e));
    }
    for cut in 0..=bytes.len() {
        let r = recover(&bytes[..cut]);
        let whole = cut / RECORD;
        assert_eq!(r.valid_len, whole * RECORD, "cut at {cut}");
        assert_eq!(r.dirty, model(&records, whole), "cut at {cut}");
        assert_eq!(r.next_seq, whole as u64 + 1);
    }
    for at in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        let r = recover(&bad);
        assert_eq!(r.valid_len, at / RECORD * RECORD, "flip at {at}");
        assert_eq!(r.dirty, model(&records, at / RECORD));
    }
    // A record whose sequence goes back is another log's: the log ends there.
    let mut stale = bytes.clone();
    stale.extend_from_slice(&encode(2, Kind::Dirty, &ext(5, 0, 0, 1)));
    assert_eq!(recover(&stale).valid_len, bytes.len());
}

proptest! {
    /// Crash consistency: any sequence of records and syncs, then a crash that keeps
    /// any prefix at least as long as what was synced. Recovery keeps every synced
    /// record (so every answered write's range is still dirty unless a flush or drop
    /// of it was logged) and describes exactly the whole records it kept.
    #[test]
    fn a_crash_loses_nothing_that_was_synced(
        ops in proptest::collection::vec((0u8..4, 0u64..3, 0u64..2, 0u64..64, 1u64..32), 1..40),
        keep in 0.0f64..=1.0,
    ) {
        let mut mem = MemLog::default();
        let mut records = Vec::new();
        {
            let mut log = WbLog::resume(&mut mem, recover(&[]));
            for (op, ino, stripe, off, len) in ops {
                let e = ext(ino, stripe, off * 16, len * 16);
                let kind = match op {
                    0 | 1 => Kind::Dirty,
                    2 => Kind::Flushed,
                    _ => Kind::Dropped,
                };
                log.record(kind, &e).unwrap();
                records.push((kind, e));
                if off % 3 == 0 {
                    log.sync().unwrap();
                }
            }
        }
        let kept = mem.synced + ((mem.bytes.len() - mem.synced) as f64 * keep) as usize;
        let r = recover(&mem.bytes[..kept]);
        prop_assert!(r.valid_len >= mem.synced);
        prop_assert_eq!(r.dirty, model(&records, r.valid_len / RECORD));
    }
}

#[test]
fn a_file_log_survives_reopening_a_torn_tail_and_compaction() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("wblog");
    let mut log = FileLog::open(&path).unwrap();
    for i in 0..100u64 {
        log.record(Kind::Dirty, &ext(3, i % 4, i * 4096, 4096))
            .unwrap();
    }
    for i in 0..90u64 {
        log.record(Kind::Flushed, &ext(3, i % 4, i * 4096, 4096))
            .unwrap();
    }
    log.sync().unwrap();
    let want = log.dirty().clone();
    assert_eq!(want.bytes(), 10 * 4096);
    drop(log);

    // A torn record at the end (a write never answered) is cut off at reopening, and
    // what follows is appended after the last whole record.
    let whole = std::fs::metadata(&path).unwrap().len();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(&encode(999, Kind::Dirty, &ext(4, 0, 0, 1))[..40])
        .unwrap();
    drop(f);
    let mut log = FileLog::open(&path).unwrap();
    assert_eq!(log.dirty(), &want);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
    let seq = log.record(Kind::Dirty, &ext(4, 1, 0, 10)).unwrap();
    assert_eq!(seq, 191);
    log.sync().unwrap();
    let mut want = want;
    want.apply(Kind::Dirty, &ext(4, 1, 0, 10));

    // Compaction keeps the live ranges only; a stray `.new` from a compaction cut
    // short is removed at the next open.
    let log = FileLog::compact(&path, log).unwrap();
    assert_eq!(log.dirty(), &want);
    drop(log);
    assert!(std::fs::metadata(&path).unwrap().len() < whole);
    std::fs::write(new_path(&path), b"half a compaction").unwrap();
    let log = FileLog::open(&path).unwrap();
    assert_eq!(log.dirty(), &want);
    assert!(!new_path(&path).exists());
}

/// The log is the server's (root's) own: created 0600, and neither it nor a
/// compaction's `.new` is ever opened through a symbolic link, so a link planted at
/// either name cannot make the server write (or cut) another file.
#[test]
fn the_log_is_private_and_never_opened_through_a_link() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("wblog");
    let mut log = FileLog::open(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    let target = d.path().join("precious");
    std::fs::write(&target, b"not a log").unwrap();
    let linked = d.path().join("linked");
    std::os::unix::fs::symlink(&target, &linked).unwrap();
    let e = FileLog::open(&linked).err().expect("opened through a link");
    assert_eq!(e.raw_os_error(), Some(libc::ELOOP));

    // A link planted at the compaction's `.new` after the log was opened.
    log.record(Kind::Dirty, &ext(1, 0, 0, 10)).unwrap();
    std::os::unix::fs::symlink(&target, new_path(&path)).unwrap();
    let e = FileLog::compact(&path, log)
        .err()
        .expect("wrote through a link");
    assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
    assert_eq!(std::fs::read(&target).unwrap(), b"not a log");
}

proptest! {
    /// Recovery reads what is on the device, which a failing disk may have garbled:
    /// any bytes at all give a dirty set and a whole-record prefix, never a panic.
    #[test]
    fn recovery_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600),
                                splice in any::<bool>()) {
        let mut b = bytes;
        if splice {
            // Whole records first, so that the parser gets past the first record.
            let mut v = encode(1, Kind::Dirty, &ext(1, 0, 0, 10)).to_vec();
            v.extend_from_slice(&b);
            b = v;
        }
        let r = recover(&b);
        prop_assert!(r.valid_len <= b.len());
        prop_assert_eq!(r.valid_len % RECORD, 0);
        prop_assert!(!splice || r.valid_len >= RECORD);
    }
}

fn ts(sec: i64, nsec: u32) -> Timespec {
    Timespec { sec, nsec }
}

/// Times set on a dirty file are recovered with it (both, one, negative seconds); a
/// write after them voids the mtime; they go with the file's last dirty range; and a
/// compaction keeps all of that, the order of `Times` and `Dirty` records included.
#[test]
fn times_set_on_a_dirty_file_survive_recovery_and_compaction() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("writeback.log");
    let set = LogTimes {
        atime: Some(ts(-5, 7)),
        mtime: Some(ts(1_234_567_890, 123_456_789)),
        set_at: ts(1_700_000_000, 999_999_999),
        void: false,
    };
    let mtime_only = LogTimes { atime: None, ..set };
    let mut log = FileLog::open(&path).unwrap();
    // Not dirty: nothing to keep (the times are on the PFS file already).
    log.record(Kind::Times, &times_extent(1, &set)).unwrap();
    for ino in [2, 3, 4] {
        log.record(Kind::Dirty, &ext(ino, 0, 0, 100)).unwrap();
    }
    log.record(Kind::Times, &times_extent(2, &set)).unwrap();
    log.record(Kind::Times, &times_extent(3, &mtime_only))
        .unwrap();
    log.record(Kind::Times, &times_extent(4, &set)).unwrap();
    // 3: written after its times; 4: clean, then dirty again.
    log.record(Kind::Dirty, &ext(3, 1, 0, 10)).unwrap();
    log.record(Kind::Flushed, &ext(4, 0, 0, 100)).unwrap();
    log.record(Kind::Dirty, &ext(4, 0, 0, 10)).unwrap();
    let want = |d: &Dirty| {
        assert!(!d.inodes.contains_key(&1));
        assert_eq!(d.inodes[&2].times, Some(set));
        let void = LogTimes {
            void: true,
            ..mtime_only
        };
        assert_eq!(d.inodes[&3].times, Some(void));
        assert_eq!(d.inodes[&4].times, None);
    };
    want(log.dirty());
    drop(log);
    let log = FileLog::open(&path).unwrap();
    want(log.dirty());
    let log = FileLog::compact(&path, log).unwrap();
    want(log.dirty());
    drop(log);
    want(FileLog::open(&path).unwrap().dirty());
}
