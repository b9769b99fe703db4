//! The cached stripes against real directories: a `DataStore` in one temp directory,
//! a "PFS" in another (inode n is the file `<pfs>/<n>`), reached through a `PfsFiles`
//! that counts its opens and fails or pauses on demand.

use super::*;
use crate::cache::PfsFiles;
use crate::data::DataStore;
use crate::error::{StoreError, StoreResult};
use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Barrier};
use std::time::{Duration, Instant};

/// The tests' PFS: inode n is `<dir>/<n>`.
struct TestPfs {
    dir: PathBuf,
    stripe_size: u32,
    /// `open_read` and `open_write` calls.
    reads: AtomicU64,
    writes: AtomicU64,
    /// Every open fails with EIO while set.
    fail: AtomicBool,
    /// When set, the next `open_write` says so on the sender and waits on the receiver
    /// (a flush paused after its snapshot).
    gate: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
}

impl TestPfs {
    fn path(&self, ino: InodeNo) -> PathBuf {
        self.dir.join(ino.0.to_string())
    }

    fn failing(&self) -> StoreResult<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(StoreError::Io(std::io::Error::from_raw_os_error(libc::EIO)));
        }
        Ok(())
    }
}

impl PfsFiles for TestPfs {
    fn open_read(&self, ino: InodeNo) -> StoreResult<File> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.failing()?;
        Ok(File::open(self.path(ino))?)
    }

    fn open_write(&self, ino: InodeNo) -> StoreResult<Option<File>> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.failing()?;
        let gate = self.gate.lock().unwrap().take();
        if let Some((entered, go)) = gate {
            entered.send(()).unwrap();
            go.recv().unwrap();
        }
        // As the fragment's: the PFS file exists (the namespace made it), unless a test
        // removed it, as a user on the PFS may.
        match OpenOptions::new().write(true).open(self.path(ino)) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn stripe_size(&self, _ino: InodeNo) -> StoreResult<u32> {
        Ok(self.stripe_size)
    }
}

struct Rig {
    tmp: tempfile::TempDir,
    capacity: u64,
    read_ahead: u64,
    data: DataStore,
    pfs: TestPfs,
    c: CacheStripes,
}

fn rig(stripe_size: u32, capacity: u64, read_ahead: u64) -> Rig {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("frag/stripes")).unwrap();
    std::fs::create_dir(tmp.path().join("pfs")).unwrap();
    let pfs = TestPfs {
        dir: tmp.path().join("pfs"),
        stripe_size,
        reads: AtomicU64::new(0),
        writes: AtomicU64::new(0),
        fail: AtomicBool::new(false),
        gate: Mutex::new(None),
    };
    let data = DataStore::open(&tmp.path().join("frag/stripes"), capacity, 16).unwrap();
    let c = CacheStripes::open(&tmp.path().join("frag"), read_ahead).unwrap();
    Rig {
        tmp,
        capacity,
        read_ahead,
        data,
        pfs,
        c,
    }
}

impl Rig {
    fn ss(&self) -> u64 {
        u64::from(self.pfs.stripe_size)
    }

    fn set_pfs(&self, ino: InodeNo, bytes: &[u8]) {
        std::fs::write(self.pfs.path(ino), bytes).unwrap();
    }

    fn pfs_bytes(&self, ino: InodeNo) -> Vec<u8> {
        std::fs::read(self.pfs.path(ino)).unwrap()
    }

    /// A client's write, cut at stripe boundaries, each piece bracketed as the request
    /// path brackets it.
    fn write(&self, ino: InodeNo, off: u64, bytes: &[u8]) {
        let ss = self.ss();
        let mut done = 0;
        while done < bytes.len() {
            let at = off + done as u64;
            let (k, o) = (at / ss, at % ss);
            let n = ((ss - o) as usize).min(bytes.len() - done);
            let g = self.c.begin_write(ino, k, o as u32, n as u32);
            let r = self.data.write(ino, k, o as u32, &bytes[done..done + n]);
            g.finish(&r).unwrap();
            assert_eq!(r.unwrap() as usize, n);
            done += n;
        }
    }

    /// A client's read of `len` bytes inside the file: holes and bytes past a stripe
    /// file's end read as zeros.
    fn read(&self, ino: InodeNo, off: u64, len: usize) -> Vec<u8> {
        let ss = self.ss();
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let at = off + out.len() as u64;
            let (k, o) = (at / ss, at % ss);
            let n = ((ss - o) as usize).min(len - out.len());
            let g = self
                .c
                .prepare_read(&self.data, &self.pfs, ino, k, o as u32, n as u32)
                .unwrap();
            let mut got = self.data.read(ino, k, o as u32, n as u32).unwrap();
            g.through_vec(&mut got).unwrap();
            drop(g);
            got.resize(n, 0);
            out.extend_from_slice(&got);
        }
        out
    }

    fn flush(&self, ino: InodeNo) -> FlushStats {
        self.c.flush_inode(&self.data, &self.pfs, ino).unwrap()
    }

    /// The stripes stored of `ino`, with their lengths.
    fn stored(&self, ino: InodeNo) -> Vec<(u64, u64)> {
        let info = self.data.stripe_info(ino);
        info.into_iter().map(|s| (s.stripe, s.len)).collect()
    }

    /// A server restart (or kill -9: nothing is flushed or synced first): the store
    /// and the cached stripes opened again from their directories.
    fn restart(self) -> Rig {
        let Rig {
            tmp,
            capacity,
            read_ahead,
            data,
            pfs,
            c,
        } = self;
        drop(c);
        drop(data);
        let data = DataStore::open(&tmp.path().join("frag/stripes"), capacity, 16).unwrap();
        let c = CacheStripes::open(&tmp.path().join("frag"), read_ahead).unwrap();
        Rig {
            tmp,
            capacity,
            read_ahead,
            data,
            pfs,
            c,
        }
    }
}

/// xorshift64*: repeatable bytes and offsets.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Apply a write to the model of a file.
fn put(model: &mut Vec<u8>, off: u64, bytes: &[u8]) {
    let end = off as usize + bytes.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[off as usize..end].copy_from_slice(bytes);
}

fn dirty_ranges(c: &CacheStripes, ino: InodeNo) -> usize {
    let st = c.state();
    st.inodes.get(&ino).map_or(0, |i| {
        i.stripes.values().map(|s| s.dirty.iter().count()).sum()
    })
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

#[test]
fn a_read_miss_fetches_the_pfs_bytes_with_read_ahead() {
    let r = rig(64 << 10, 64 * MIB, 32 * KIB);
    let a = InodeNo(7);
    let file = Rng(1).bytes(200_000);
    r.set_pfs(a, &file);

    assert_eq!(r.read(a, 0, 100), file[..100]);
    assert_eq!(r.pfs.reads.load(Ordering::SeqCst), 1);
    // The read and 32 KiB of read-ahead, not the whole stripe.
    assert_eq!(r.stored(a), vec![(0, 100 + 32 * KIB)]);
    assert_eq!(r.read(a, 1000, 20_000), file[1000..21_000]);
    assert_eq!(
        r.pfs.reads.load(Ordering::SeqCst),
        1,
        "inside the read-ahead window: no PFS read"
    );
    assert_eq!(r.read(a, 40_000, 1000), file[40_000..41_000]);
    assert_eq!(r.pfs.reads.load(Ordering::SeqCst), 2);

    // Stripe 3 holds the PFS file's end: only the bytes before it are fetched.
    let s3 = 3 * 65536;
    let mut want = file[s3..].to_vec();
    want.resize(65536, 0);
    assert_eq!(r.read(a, s3 as u64, 65536), want);
    assert!(r.stored(a).contains(&(3, (200_000 - s3) as u64)));
    assert_eq!(r.pfs.reads.load(Ordering::SeqCst), 3);
    // Stripe 4 is past it: nothing fetched, no file made.
    assert_eq!(r.read(a, 4 * 65536, 100), vec![0; 100]);
    assert_eq!(r.read(a, 4 * 65536 + 50, 100), vec![0; 100]);
    assert!(r.stored(a).iter().all(|&(k, _)| k != 4));
    // What was read stays the PFS's.
    assert_eq!(r.read(a, 0, 200_000), file);
    assert!(!r.c.is_dirty(a));
    // The PFS file grows under a reader that holds it open (issue 30, item 9): the
    // bytes past the old end are fetched when read, never zeros kept from before.
    let mut grown = file.clone();
    grown.extend(Rng(2).bytes(100_000));
    r.set_pfs(a, &grown);
    assert_eq!(r.read(a, 200_000, 100_000), grown[200_000..]);
    assert_eq!(r.read(a, 0, 300_000), grown);
}

#[test]
fn written_bytes_reach_the_pfs_byte_identical() {
    for ss in [64 << 10, 1 << 20] {
        let r = rig(ss, 256 * MIB, 16 * MIB);
        let ss = u64::from(ss);
        let a = InodeNo(3);
        let mut rng = Rng(ss);
        let len = 5 * ss + 1234;
        let mut model = rng.bytes(len as usize);
        r.set_pfs(a, &model);
        for _ in 0..400 {
            // Some past the end: the file grows, with a hole between.
            let off = rng.below(len + ss / 2);
            let n = 1 + rng.below(3000) as usize;
            let bytes = rng.bytes(n);
            r.write(a, off, &bytes);
            put(&mut model, off, &bytes);
        }
        let ranges = dirty_ranges(&r.c, a);
        assert!(r.c.is_dirty(a));
        assert_eq!(r.c.dirty_inodes(), vec![a]);
        let stats = r.flush(a);
        assert_eq!(r.pfs_bytes(a), model, "stripe size {ss}");
        // Nothing was read, so no gap is present to join over: a write per range,
        // but for ranges past the PFS file's end (a hole there) joined with zeros.
        assert!(stats.writes as usize <= ranges);
        assert!(!r.c.is_dirty(a));
        assert_eq!(r.c.dirty_bytes(), 0);
        assert!(r.c.dirty_inodes().is_empty());
        // Clean now, and still what the file holds.
        assert_eq!(r.read(a, 0, model.len()), model);
    }
}

#[test]
fn small_writes_merge_into_few_pfs_writes() {
    let r = rig(64 << 10, 256 * MIB, MIB);
    let a = InodeNo(5);
    let mut rng = Rng(5);
    let mut model = rng.bytes(MIB as usize);
    r.set_pfs(a, &model);
    // Read first: the gaps between the writes are present, and filled.
    assert_eq!(r.read(a, 0, MIB as usize), model);
    for i in 0..2048 {
        let bytes = rng.bytes(16);
        r.write(a, i * 512 + 7, &bytes);
        put(&mut model, i * 512 + 7, &bytes);
    }
    assert_eq!(dirty_ranges(&r.c, a), 2048);
    let stats = r.flush(a);
    assert_eq!(stats.writes, 16, "one write per stripe");
    assert_eq!(r.pfs_bytes(a), model);

    // Adjacent writes of a file never read are one range per stripe.
    let b = InodeNo(6);
    r.set_pfs(b, b"");
    let mut model = Vec::new();
    for i in 0..1000 {
        let bytes = rng.bytes(100);
        r.write(b, i * 100, &bytes);
        put(&mut model, i * 100, &bytes);
    }
    let stats = r.flush(b);
    assert_eq!(stats.writes, 2);
    assert_eq!(stats.bytes, 100_000);
    assert_eq!(r.pfs_bytes(b), model);
}

#[test]
fn random_writes_into_pfs_holes_reach_it_in_few_writes() {
    // A sparse PFS file: 4 KiB writes 16 KiB apart are joined over the holes between
    // them (zeros), one PFS write per stripe, and read back byte-identical. Where the
    // PFS file holds data between them, the ranges stay apart (its bytes are not here).
    let ss = MIB;
    let r = rig(ss as u32, 64 * MIB, 0);
    let (a, b) = (InodeNo(5), InodeNo(6));
    let len = 4 * ss;
    std::fs::File::create(r.pfs.path(a))
        .unwrap()
        .set_len(len)
        .unwrap();
    r.set_pfs(b, &Rng(6).bytes(len as usize));
    let mut model_a = vec![0u8; len as usize];
    let mut model_b = r.pfs_bytes(b);
    let mut rng = Rng(5);
    let mut off = 8 * KIB;
    let mut n = 0;
    while off + 4 * KIB <= len {
        let bytes = rng.bytes(4 * KIB as usize);
        r.write(a, off, &bytes);
        r.write(b, off, &bytes);
        put(&mut model_a, off, &bytes);
        put(&mut model_b, off, &bytes);
        off += 20 * KIB;
        n += 1;
    }
    let sa = r.flush(a);
    assert_eq!(r.pfs_bytes(a), model_a);
    assert_eq!(sa.writes, 4, "one per stripe, of {n} ranges");
    assert!(sa.filled > 0);
    let sb = r.flush(b);
    assert_eq!(r.pfs_bytes(b), model_b);
    assert_eq!(
        (sb.writes, sb.filled),
        (n, 0),
        "data between: nothing joined"
    );
}

#[test]
fn a_fetch_never_overwrites_a_concurrent_write() {
    let r = rig(1 << 20, 1 << 30, MIB);
    let mut rng = Rng(9);
    for it in 0..60 {
        let a = InodeNo(100 + it);
        r.set_pfs(a, &vec![0xaa; MIB as usize]);
        let mut model = vec![0xaa; MIB as usize];
        let writes: Vec<(u64, Vec<u8>)> = (0..3)
            .map(|_| {
                let off = rng.below(MIB - 64 * KIB);
                let n = 1 + rng.below(64 * KIB) as usize;
                (off, vec![0xbb; n])
            })
            .collect();
        for (off, b) in &writes {
            put(&mut model, *off, b);
        }
        let start = Barrier::new(3);
        std::thread::scope(|s| {
            // Reads in small pieces (the first one claims the stripe) or in one.
            let piece = if it % 2 == 0 { 64 << 10 } else { 1 << 20 };
            let (r, start) = (&r, &start);
            s.spawn(move || {
                start.wait();
                let mut at = 0;
                while at < MIB as usize {
                    let got = r.read(a, at as u64, piece);
                    // A byte read is the PFS's or the write's, never a hole.
                    assert!(got.iter().all(|&b| b == 0xaa || b == 0xbb), "it {it}");
                    at += piece;
                }
            });
            s.spawn(|| {
                start.wait();
                for (off, b) in &writes {
                    r.write(a, *off, b);
                }
            });
            start.wait();
        });
        assert_eq!(r.read(a, 0, MIB as usize), model, "iteration {it}");
        // And the stripe file itself, not only what is present.
        let stored = r.data.read(a, 0, 0, MIB as u32).unwrap();
        assert_eq!(stored, model, "iteration {it}");
    }
}

#[test]
fn a_write_during_a_flush_stays_dirty() {
    let r = rig(64 << 10, 64 * MIB, MIB);
    let a = InodeNo(11);
    r.set_pfs(a, b"");
    let mut model = Vec::new();
    let w = |off: u64, bytes: &[u8], model: &mut Vec<u8>| {
        r.write(a, off, bytes);
        put(model, off, bytes);
    };
    w(0, &[b'a'; 4096], &mut model);

    // A write that lands while the flush is under way.
    let (entered_tx, entered) = mpsc::channel();
    let (go, go_rx) = mpsc::channel();
    *r.pfs.gate.lock().unwrap() = Some((entered_tx, go_rx));
    std::thread::scope(|s| {
        let h = s.spawn(|| r.c.flush_inode(&r.data, &r.pfs, a));
        entered.recv().unwrap();
        w(1000, &[b'b'; 1000], &mut model);
        go.send(()).unwrap();
        h.join().unwrap().unwrap();
    });
    assert!(r.c.is_dirty(a), "the write during the flush stays dirty");
    assert_eq!(r.c.dirty_bytes(), 1000);
    r.flush(a);
    assert_eq!(r.pfs_bytes(a), model);
    assert!(!r.c.is_dirty(a));

    // A write begun before the flush's snapshot and finished after it.
    w(3000, &[b'd'; 10], &mut model);
    let g = r.c.begin_write(a, 0, 2000, 100);
    let (entered_tx, entered) = mpsc::channel();
    let (go, go_rx) = mpsc::channel();
    *r.pfs.gate.lock().unwrap() = Some((entered_tx, go_rx));
    std::thread::scope(|s| {
        let h = s.spawn(|| r.c.flush_inode(&r.data, &r.pfs, a));
        entered.recv().unwrap();
        let res = r.data.write(a, 0, 2000, &[b'c'; 100]);
        g.finish(&res).unwrap();
        put(&mut model, 2000, &[b'c'; 100]);
        go.send(()).unwrap();
        h.join().unwrap().unwrap();
    });
    assert_eq!(
        r.c.dirty_bytes(),
        100,
        "only the write under way stays dirty"
    );
    r.flush(a);
    assert_eq!(r.pfs_bytes(a), model);
    assert!(!r.c.is_dirty(a));
}

#[test]
fn a_restart_resumes_write_behind() {
    let r = rig(64 << 10, 64 * MIB, MIB);
    let (a, b) = (InodeNo(21), InodeNo(22));
    let mut rng = Rng(21);
    let mut models = [rng.bytes(300_000), Vec::new()];
    r.set_pfs(a, &models[0]);
    r.set_pfs(b, b"");
    for _ in 0..100 {
        for (i, ino) in [a, b].into_iter().enumerate() {
            let off = rng.below(400_000);
            let n = 1 + rng.below(5000) as usize;
            let bytes = rng.bytes(n);
            r.write(ino, off, &bytes);
            put(&mut models[i], off, &bytes);
        }
    }
    let dirty = r.c.dirty_bytes();
    // No flush and no sync: the log is in the page cache, as after a kill -9.
    let r = r.restart();
    assert_eq!(r.c.dirty_bytes(), dirty);
    assert_eq!(r.c.dirty_inodes(), vec![a, b]);
    let rep = r.c.flush_pass(&r.data, &r.pfs, &FlushPolicy::default());
    assert_eq!(
        (rep.flushed, rep.failed),
        (2, 0),
        "recovered ranges are due at once"
    );
    assert_eq!(r.pfs_bytes(a), models[0]);
    assert_eq!(r.pfs_bytes(b), models[1]);
    assert_eq!(r.c.dirty_bytes(), 0);
    let r = r.restart();
    assert_eq!(
        r.c.dirty_bytes(),
        0,
        "the flushed records were replayed too"
    );
    // Clean stripes of before the restart are fetched again where unknown.
    assert_eq!(r.read(a, 0, models[0].len()), models[0]);
}

#[test]
fn a_pfs_failure_keeps_ranges_dirty() {
    let r = rig(64 << 10, 64 * MIB, MIB);
    let a = InodeNo(31);
    r.set_pfs(a, b"");
    let bytes = Rng(31).bytes(150_000);
    r.write(a, 0, &bytes);
    r.pfs.fail.store(true, Ordering::SeqCst);
    assert!(r.c.flush_inode(&r.data, &r.pfs, a).is_err());
    assert_eq!(r.c.dirty_bytes(), 150_000);

    let now = FlushPolicy {
        max_age: Duration::ZERO,
        retry_min: Duration::from_secs(3600),
        ..FlushPolicy::default()
    };
    let rep = r.c.flush_pass(&r.data, &r.pfs, &now);
    assert_eq!((rep.flushed, rep.failed), (0, 0), "waits out its backoff");
    let retry = FlushPolicy {
        retry_min: Duration::ZERO,
        ..now
    };
    let rep = r.c.flush_pass(&r.data, &r.pfs, &retry);
    assert_eq!((rep.flushed, rep.failed), (0, 1));
    assert_eq!(r.c.dirty_bytes(), 150_000);

    r.pfs.fail.store(false, Ordering::SeqCst);
    let rep = r.c.flush_pass(&r.data, &r.pfs, &retry);
    assert_eq!((rep.flushed, rep.failed, rep.bytes), (1, 0, 150_000));
    assert_eq!(r.pfs_bytes(a), bytes);
    assert!(!r.c.is_dirty(a));
}

#[test]
fn flush_all_fails_while_the_pfs_fails() {
    let r = rig(64 << 10, 64 * MIB, MIB);
    let (a, b) = (InodeNo(41), InodeNo(42));
    let mut rng = Rng(41);
    let (ba, bb) = (rng.bytes(70_000), rng.bytes(500));
    r.set_pfs(a, b"");
    r.set_pfs(b, b"");
    r.write(a, 0, &ba);
    r.write(b, 0, &bb);
    r.pfs.fail.store(true, Ordering::SeqCst);
    assert!(r.c.flush_all(&r.data, &r.pfs).is_err());
    assert_eq!(r.c.dirty_inodes(), vec![a, b]);
    r.pfs.fail.store(false, Ordering::SeqCst);
    r.c.flush_all(&r.data, &r.pfs).unwrap();
    assert_eq!((r.pfs_bytes(a), r.pfs_bytes(b)), (ba, bb));
    assert_eq!(r.c.dirty_bytes(), 0);
}

#[test]
fn a_file_gone_from_the_pfs_is_dropped_not_retried_forever() {
    // A file removed on the PFS (or whose delete this server missed) has nowhere for
    // its dirty ranges to go: the flush drops them, so a teardown is not refused for
    // ever. A PFS that fails instead keeps them (flush_all_fails_while_the_pfs_fails).
    let r = rig(64 << 10, 64 * MIB, MIB);
    let (a, b) = (InodeNo(51), InodeNo(52));
    r.set_pfs(a, b"");
    r.set_pfs(b, b"");
    let mut rng = Rng(51);
    let bb = rng.bytes(90_000);
    r.write(a, 0, &rng.bytes(90_000));
    r.write(b, 0, &bb);
    std::fs::remove_file(r.pfs.path(a)).unwrap();
    r.c.flush_all(&r.data, &r.pfs).unwrap();
    assert_eq!(r.c.dirty_bytes(), 0);
    assert!(
        !r.pfs.path(a).exists(),
        "the flush must not recreate a removed file"
    );
    assert_eq!(r.pfs_bytes(b), bb);
    assert!(r.data.stripe_info(a).is_empty(), "its stripes went with it");
}

#[test]
fn truncate_and_delete_drop_dirty_ranges() {
    let r = rig(64 << 10, 64 * MIB, MIB);
    let ss = r.pfs.stripe_size;
    let a = InodeNo(51);
    r.set_pfs(a, b"");
    let mut model = Rng(51).bytes(200_000);
    r.write(a, 0, &model);
    r.c.truncate(&r.data, a, 100_000, ss).unwrap();
    model.truncate(100_000);
    assert_eq!(r.c.dirty_bytes(), 100_000);
    assert_eq!(r.stored(a), vec![(0, 65536), (1, 100_000 - 65536)]);
    r.flush(a);
    assert_eq!(r.pfs_bytes(a), model, "nothing written past the truncation");

    let b = InodeNo(52);
    let before = Rng(52).bytes(1000);
    r.set_pfs(b, &before);
    r.write(b, 500, &[7; 4500]);
    r.c.delete(&r.data, b).unwrap();
    assert!(!r.c.is_dirty(b));
    assert!(r.stored(b).is_empty());
    r.c.flush_all(&r.data, &r.pfs).unwrap();
    assert_eq!(
        r.pfs_bytes(b),
        before,
        "a deleted file's dirty ranges never reach the PFS"
    );

    // Truncated while dirty again, then restarted: the drops were logged.
    r.write(a, 50_000, &[1; 100_000]);
    r.c.truncate(&r.data, a, 60_000, ss).unwrap();
    assert_eq!(r.c.dirty_bytes(), 10_000);
    let r = r.restart();
    assert_eq!(r.c.dirty_bytes(), 10_000);
    assert_eq!(r.c.dirty_inodes(), vec![a]);
}

#[test]
fn eviction_takes_clean_stripes_lru_first() {
    let ss = 64 * KIB;
    let r = rig(ss as u32, 8 * ss, 0);
    let a = InodeNo(61);
    let file = Rng(61).bytes(10 * ss as usize);
    r.set_pfs(a, &file);
    let read = |k: u64| {
        let got = r.read(a, k * ss, ss as usize);
        assert_eq!(got, file[(k * ss) as usize..((k + 1) * ss) as usize]);
    };
    for k in 0..6 {
        read(k);
    }
    r.write(a, 6 * ss, &file[6 * ss as usize..7 * ss as usize]);
    read(0);
    assert_eq!(r.data.used(), 7 * ss);
    // Least recently used first: 1, 2, 3 (0 was read again).
    assert_eq!(r.c.evict(&r.data, 8 * ss - 4 * ss), 3 * ss);
    let kept: Vec<u64> = r.stored(a).iter().map(|s| s.0).collect();
    assert_eq!(kept, vec![0, 4, 5, 6]);
    // Everything clean goes; the dirty stripe never does.
    assert_eq!(r.c.evict(&r.data, 8 * ss), 3 * ss);
    assert_eq!(r.stored(a), vec![(6, ss)]);
    assert!(r.c.is_dirty(a));
    // An evicted stripe is fetched again when read.
    let opens = r.pfs.reads.load(Ordering::SeqCst);
    read(1);
    assert_eq!(r.pfs.reads.load(Ordering::SeqCst), opens + 1);

    // A full fragment makes room for a fetch by evicting.
    for k in [2, 3, 4, 5, 7, 8] {
        read(k);
    }
    assert_eq!(r.data.used(), 8 * ss);
    read(9);
    let kept: Vec<u64> = r.stored(a).iter().map(|s| s.0).collect();
    assert_eq!(
        kept,
        vec![2, 3, 4, 5, 6, 7, 8, 9],
        "stripe 1, the oldest, went"
    );
    r.flush(a);
    assert_eq!(r.pfs_bytes(a), file);
}

#[test]
fn stripes_on_disk_before_a_restart_are_evictable() {
    let ss = 64 * KIB;
    let r = rig(ss as u32, 4 * ss, 0);
    let a = InodeNo(65);
    let file = Rng(65).bytes(4 * ss as usize);
    r.set_pfs(a, &file);
    assert_eq!(r.read(a, 0, 3 * ss as usize), file[..3 * ss as usize]);
    r.write(a, 3 * ss, &[9; 10]);
    let r = r.restart();
    assert_eq!(r.c.evict(&r.data, 4 * ss), 3 * ss);
    assert_eq!(r.stored(a), vec![(3, 10)]);
}

#[test]
fn eviction_counts_promised_space_as_taken() {
    use crate::data::{GrantAccount, GrantLimits};
    let ss = 64 * KIB;
    let mut r = rig(ss as u32, 4 * ss, 0);
    let limits = GrantLimits {
        per_connection: 2 * ss,
        disk_reserve: 0,
    };
    let stripes = r.tmp.path().join("frag/stripes");
    r.data = DataStore::open(&stripes, 4 * ss, 16)
        .unwrap()
        .with_grant_limits(limits);
    let a = InodeNo(67);
    let file = Rng(67).bytes(2 * ss as usize);
    r.set_pfs(a, &file);
    assert_eq!(r.read(a, 0, 2 * ss as usize), file);
    // A connection is promised half of what is left: 64 KiB used by no stripe yet.
    let acct = GrantAccount::new();
    assert_eq!(r.data.refill(&acct), ss);
    assert_eq!(r.data.room(), ss);
    // A write of 128 KiB needs a clean stripe to go, though 128 KiB are unused.
    assert_eq!(r.c.evict(&r.data, 2 * ss), ss);
    assert_eq!(r.data.room(), 2 * ss);
    r.data.close_account(&acct);
}

#[test]
fn a_full_cache_makes_room_by_writing_behind_and_evicting() {
    // A fragment of four stripes, all dirty: a write needing a stripe's room finds
    // none clean to evict; the writer writes the oldest file behind and evicts it.
    let ss = 64 * KIB;
    let r = rig(ss as u32, 4 * ss, 0);
    let (a, b) = (InodeNo(68), InodeNo(69));
    let (fa, fb) = (
        Rng(68).bytes(2 * ss as usize),
        Rng(69).bytes(2 * ss as usize),
    );
    r.set_pfs(a, b"");
    r.set_pfs(b, b"");
    r.write(a, 0, &fa);
    r.write(b, 0, &fb);
    assert_eq!(r.data.room(), 0);
    assert_eq!(r.c.evict(&r.data, ss), 0, "nothing clean");
    let deadline = Instant::now() + Duration::from_secs(10);
    assert!(r.c.make_room(&r.data, &r.pfs, ss, deadline));
    assert!(r.data.room() >= ss);
    // The oldest file went to the PFS and its stripes were evicted; the other stays.
    assert_eq!(r.pfs_bytes(a), fa);
    assert!(!r.c.is_dirty(a));
    assert!(r.c.is_dirty(b));
    // What was evicted reads back from the PFS.
    assert_eq!(r.read(a, 0, 2 * ss as usize), fa);
}

#[test]
fn a_read_miss_into_a_cache_full_of_dirty_data_makes_room() {
    // Two stripes of room, both dirty (inode A): a read of inode B's PFS bytes writes
    // A behind and evicts it rather than failing ENOSPC.
    let ss = 64 * KIB;
    let r = rig(ss as u32, 2 * ss, 0);
    let (a, b) = (InodeNo(74), InodeNo(75));
    let fa = Rng(74).bytes(2 * ss as usize);
    let fb = Rng(75).bytes(ss as usize);
    r.set_pfs(a, b"");
    r.set_pfs(b, &fb);
    r.write(a, 0, &fa);
    assert_eq!(r.data.room(), 0);
    assert_eq!(r.read(b, 0, ss as usize), fb);
    assert_eq!(r.pfs_bytes(a), fa);
    assert!(!r.c.is_dirty(a));
}

#[test]
fn a_read_that_finds_no_room_reads_through_to_the_pfs() {
    // Two stripes of room, both dirty (inode A), A's write-behind held up on the PFS:
    // a read of inode B gets B's bytes from the PFS itself, after the room wait,
    // instead of ENOSPC; nothing of B is kept and A's data stays dirty.
    let ss = 64 * KIB;
    let r = rig(ss as u32, 2 * ss, 0);
    r.c.set_room_wait(Duration::from_millis(200));
    let (a, b) = (InodeNo(76), InodeNo(77));
    let fa = Rng(76).bytes(2 * ss as usize);
    let fb = Rng(77).bytes(2 * ss as usize + 100);
    r.set_pfs(a, b"");
    r.set_pfs(b, &fb);
    r.write(a, 0, &fa);
    assert_eq!(r.data.room(), 0);
    let (entered_tx, entered) = mpsc::channel();
    let (go, go_rx) = mpsc::channel();
    *r.pfs.gate.lock().unwrap() = Some((entered_tx, go_rx));
    /// Lets the held flush go however the reads end (a failed assertion too).
    struct Go(mpsc::Sender<()>);
    impl Drop for Go {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    std::thread::scope(|s| {
        let h = s.spawn(|| r.c.flush_inode(&r.data, &r.pfs, a));
        let go = Go(go);
        entered.recv().unwrap();
        // Whole stripes, a piece inside one, and the short last stripe.
        assert_eq!(r.read(b, 0, fb.len()), fb);
        assert_eq!(r.read(b, 1000, 5000), fb[1000..6000]);
        let k = 2 * ss;
        let g = r.c.prepare_read(&r.data, &r.pfs, b, 2, 0, 4096).unwrap();
        let mut got = r.data.read(b, 2, 0, 4096).unwrap();
        g.through_vec(&mut got).unwrap();
        assert_eq!(
            got,
            fb[k as usize..],
            "a read past the PFS file's end is short"
        );
        let mut into = vec![7u8; 4096];
        let g = r.c.prepare_read(&r.data, &r.pfs, b, 2, 0, 4096).unwrap();
        let n = r.data.read_into(b, 2, 0, &mut into).unwrap();
        assert_eq!(g.through(&mut into, n as usize).unwrap(), 100);
        assert_eq!(into[..100], fb[k as usize..]);
        drop(g);
        assert!(r.stored(b).is_empty(), "nothing of B was kept");
        assert_eq!(r.c.dirty_bytes(), 2 * ss, "A's data stays");
        drop(go);
        h.join().unwrap().unwrap();
    });
    assert_eq!(r.pfs_bytes(a), fa);
    // With room again, B is cached as usual.
    assert_eq!(r.read(b, 0, ss as usize), fb[..ss as usize]);
    assert_eq!(r.stored(b), vec![(0, ss)]);
}

#[test]
fn a_cache_kept_full_of_undrainable_data_slows_reads_by_a_second_at_most() {
    // The attack: one user keeps a shared cache full of dirty data whose write-behind
    // does not get through (here held on the PFS). Another user's read miss reads
    // through to the PFS after at most a second of waiting for room, not after the
    // writers' room wait (20 s by default).
    let ss = 64 * KIB;
    let r = rig(ss as u32, 2 * ss, 0);
    let (a, b) = (InodeNo(80), InodeNo(81));
    let fb = Rng(81).bytes(ss as usize);
    r.set_pfs(a, b"");
    r.set_pfs(b, &fb);
    r.write(a, 0, &Rng(80).bytes(2 * ss as usize));
    assert_eq!(r.c.room_wait(), Duration::from_secs(20));
    let (entered_tx, entered) = mpsc::channel();
    let (go, go_rx) = mpsc::channel();
    *r.pfs.gate.lock().unwrap() = Some((entered_tx, go_rx));
    /// Lets the held flush go however the read ends.
    struct Go(mpsc::Sender<()>);
    impl Drop for Go {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    std::thread::scope(|s| {
        let h = s.spawn(|| r.c.flush_inode(&r.data, &r.pfs, a));
        let go = Go(go);
        entered.recv().unwrap();
        let t0 = Instant::now();
        assert!(r.read(b, 0, ss as usize) == fb, "B's bytes");
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(3), "the read waited {took:?}");
        drop(go);
        h.join().unwrap().unwrap();
    });
}

#[test]
fn concurrent_read_misses_into_a_full_cache_all_get_their_bytes() {
    // One stripe of room, dirty; eight readers of eight stripes of B at once each
    // need the room the others make: every read returns B's bytes (cached or read
    // through), none ENOSPC.
    let ss = 64 * KIB;
    let r = rig(ss as u32, ss, 0);
    let (a, b) = (InodeNo(78), InodeNo(79));
    let fb = Rng(79).bytes(8 * ss as usize);
    r.set_pfs(a, b"");
    r.set_pfs(b, &fb);
    for round in 0..20u8 {
        r.c.evict(&r.data, ss);
        r.write(a, 0, &[round; 64 * KIB as usize]);
        assert_eq!(r.data.room(), 0);
        let barrier = Barrier::new(8);
        std::thread::scope(|s| {
            for k in 0..8u64 {
                let (r, fb, barrier) = (&r, &fb, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let at = (k * ss) as usize;
                    let got = r.read(b, k * ss, ss as usize);
                    assert!(
                        got == fb[at..at + ss as usize],
                        "stripe {k} read wrong bytes"
                    );
                });
            }
        });
        r.flush(a);
        assert_eq!(r.pfs_bytes(a), vec![round; 64 * KIB as usize]);
    }
}

#[test]
fn a_full_cache_whose_pfs_fails_gives_up_at_the_deadline_and_keeps_its_data() {
    let ss = 64 * KIB;
    let r = rig(ss as u32, 2 * ss, 0);
    let a = InodeNo(70);
    let fa = Rng(70).bytes(2 * ss as usize);
    r.set_pfs(a, b"");
    r.write(a, 0, &fa);
    r.pfs.fail.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    assert!(!r
        .c
        .make_room(&r.data, &r.pfs, ss, t0 + Duration::from_millis(300)));
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "gave up early: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "bounded: {took:?}");
    assert_eq!(
        r.c.dirty_bytes(),
        2 * ss,
        "dirty data is never dropped for room"
    );
    r.pfs.fail.store(false, Ordering::SeqCst);
    r.flush(a);
    assert_eq!(r.pfs_bytes(a), fa);
}

#[test]
fn flush_pass_follows_its_policy() {
    let r = rig(64 << 10, MIB, MIB);
    let (a, b, c) = (InodeNo(71), InodeNo(72), InodeNo(73));
    for ino in [a, b, c] {
        r.set_pfs(ino, b"");
    }
    let policy = FlushPolicy {
        modified_threshold: 100_000,
        max_age: Duration::from_secs(3600),
        ..FlushPolicy::default()
    };
    r.write(a, 0, &[1; 10_000]);
    let rep = r.c.flush_pass(&r.data, &r.pfs, &policy);
    assert_eq!(rep.flushed, 0, "small and young");
    r.write(b, 0, &[2; 150_000]);
    let rep = r.c.flush_pass(&r.data, &r.pfs, &policy);
    assert_eq!((rep.flushed, rep.bytes), (1, 150_000), "over the threshold");
    assert_eq!(r.c.dirty_inodes(), vec![a]);
    // Dirty bytes over 75% of the capacity: everything goes.
    r.write(c, 0, &[3; 800_000]);
    let big = FlushPolicy {
        modified_threshold: 10 * MIB,
        ..policy.clone()
    };
    let rep = r.c.flush_pass(&r.data, &r.pfs, &big);
    assert_eq!((rep.flushed, rep.bytes), (2, 810_000));
    // And by age.
    r.write(a, 0, &[4; 10]);
    let old = FlushPolicy {
        max_age: Duration::ZERO,
        ..big
    };
    assert_eq!(r.c.flush_pass(&r.data, &r.pfs, &old).flushed, 1);
    assert_eq!(r.c.dirty_bytes(), 0);
}

#[test]
fn syncs_share_fdatasyncs() {
    let r = rig(64 << 10, 64 * MIB, MIB);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let r = &r;
            s.spawn(move || {
                let ino = InodeNo(80 + t);
                for i in 0..50 {
                    r.write(ino, i * 10, &[t as u8; 10]);
                    r.data.sync(ino).unwrap();
                    r.c.sync(&r.pfs, ino).unwrap();
                }
            });
        }
    });
    let last = r.c.log().last_seq;
    assert_eq!(last, 200);
    assert_eq!(
        r.c.synced().upto,
        last,
        "the last sync covered every record"
    );
    r.c.sync(&r.pfs, InodeNo(999)).unwrap();
    r.c.sync(&r.pfs, InodeNo(80)).unwrap();
}

#[test]
fn a_failed_log_append_is_repaired() {
    use std::io::Write;
    let r = rig(64 << 10, 64 * MIB, MIB);
    let a = InodeNo(95);
    r.set_pfs(a, b"");
    let mut model = Vec::new();
    r.write(a, 0, &[1; 3000]);
    put(&mut model, 0, &[1; 3000]);
    r.write(a, 70_000, &[2; 100]);
    put(&mut model, 70_000, &[2; 100]);
    r.flush(a);
    r.write(a, 100, &[3; 100]);
    put(&mut model, 100, &[3; 100]);
    // An append that failed half-way (the disk full): a torn record ends the file.
    let log = r.tmp.path().join("frag").join(LOG_NAME);
    let mut f = OpenOptions::new().append(true).open(&log).unwrap();
    f.write_all(&[0x53; 40]).unwrap();
    r.c.log().broken = true;
    // Appends now fail: a write is answered with an error, its range dirty here only.
    let unlogged = |off: u32, bytes: &[u8], model: &mut Vec<u8>| {
        let g = r.c.begin_write(a, 0, off, bytes.len() as u32);
        let res = r.data.write(a, 0, off, bytes);
        assert!(g.finish(&res).is_err());
        put(model, u64::from(off), bytes);
    };
    unlogged(5000, &[4; 1000], &mut model);
    // A flush's Flushed records fail too: clean here, dirty in the log.
    r.flush(a);
    assert_eq!(r.pfs_bytes(a), model);
    unlogged(200, &[5; 10], &mut model);
    assert_eq!(r.c.dirty_bytes(), 10);
    let idle = FlushPolicy {
        max_age: Duration::from_secs(3600),
        ..FlushPolicy::default()
    };
    r.c.flush_pass(&r.data, &r.pfs, &idle);
    assert!(!r.c.log().broken);
    r.write(a, 9000, &[6; 10]);
    put(&mut model, 9000, &[6; 10]);
    r.c.sync(&r.pfs, a).unwrap();
    let dirty = r.c.dirty_bytes();
    let r = r.restart();
    assert_eq!(r.c.dirty_bytes(), dirty, "the log says what the state said");
    r.flush(a);
    assert_eq!(r.pfs_bytes(a), model);
}

#[test]
fn compaction_keeps_the_dirty_set() {
    let r = rig(64 << 10, 64 * MIB, MIB);
    let a = InodeNo(91);
    r.set_pfs(a, b"");
    let mut rng = Rng(91);
    let mut model = Vec::new();
    for round in 0..100 {
        for _ in 0..10 {
            let off = rng.below(300_000);
            let n = 1 + rng.below(100) as usize;
            let bytes = rng.bytes(n);
            r.write(a, off, &bytes);
            put(&mut model, off, &bytes);
        }
        if round < 99 {
            r.flush(a);
        }
    }
    let dirty = r.c.dirty_bytes();
    let ranges = dirty_ranges(&r.c, a) as u64;
    assert!(dirty > 0);
    let before = std::fs::metadata(r.tmp.path().join("frag").join(LOG_NAME))
        .unwrap()
        .len();
    assert!(!r.c.compact_if_due(before), "not larger than the minimum");
    assert!(r.c.compact_if_due(0));
    let after = std::fs::metadata(r.tmp.path().join("frag").join(LOG_NAME))
        .unwrap()
        .len();
    assert!(after < before);
    assert_eq!(after, ranges * 84, "one record per live range");
    // Appends go on after the compaction, and a restart sees it all.
    r.write(a, 400_000, &[5; 10]);
    put(&mut model, 400_000, &[5; 10]);
    r.c.sync(&r.pfs, a).unwrap();
    let r = r.restart();
    assert_eq!(r.c.dirty_bytes(), dirty + 10);
    r.flush(a);
    assert_eq!(r.pfs_bytes(a), model);
}

/// The PFS file's version now, as the namespace server would stat it.
fn pfs_version(r: &Rig, ino: InodeNo) -> crate::cache::coherence::PfsVersion {
    let f = File::open(r.pfs.path(ino)).unwrap();
    crate::cache::coherence::PfsVersion::of_file(&f).unwrap()
}

#[test]
fn a_flush_keeps_the_version_it_left() {
    let r = rig(64 << 10, 64 * MIB, MIB);
    let a = InodeNo(101);
    r.set_pfs(a, &[1; 1000]);
    let st = r.c.inode_status(&r.data, a);
    assert!(!st.cached && !st.dirty && !st.busy && st.flushed.is_none());
    assert_eq!(r.read(a, 0, 1000), vec![1; 1000]);
    let st = r.c.inode_status(&r.data, a);
    assert!(st.cached && !st.dirty && st.flushed.is_none());

    r.write(a, 500, &[2; 1000]);
    assert!(r.c.inode_status(&r.data, a).dirty);
    r.flush(a);
    let st = r.c.inode_status(&r.data, a);
    assert!(st.cached && !st.dirty);
    assert_eq!(st.flushed, Some(pfs_version(&r, a)));
    assert_eq!(st.flushed.unwrap().size, 1500);

    // A change from outside: no longer the version the flush left.
    std::fs::write(r.pfs.path(a), [3; 1500]).unwrap();
    assert_ne!(st.flushed, Some(pfs_version(&r, a)));

    // A flush under way is busy.
    r.write(a, 0, &[4; 10]);
    let (entered_tx, entered) = mpsc::channel();
    let (go, go_rx) = mpsc::channel();
    *r.pfs.gate.lock().unwrap() = Some((entered_tx, go_rx));
    std::thread::scope(|s| {
        let h = s.spawn(|| r.c.flush_inode(&r.data, &r.pfs, a));
        entered.recv().unwrap();
        let st = r.c.inode_status(&r.data, a);
        assert!(st.busy && st.dirty);
        go.send(()).unwrap();
        h.join().unwrap().unwrap();
    });
    let st = r.c.inode_status(&r.data, a);
    assert!(!st.busy && !st.dirty);
    assert_eq!(st.flushed, Some(pfs_version(&r, a)));
}

#[test]
fn a_drop_takes_the_clean_copy_and_the_next_read_fetches_anew() {
    let r = rig(64 << 10, 64 * MIB, MIB);
    let a = InodeNo(102);
    let old = Rng(102).bytes(200_000);
    r.set_pfs(a, &old);
    assert_eq!(r.read(a, 0, old.len()), old);
    assert!(!r.stored(a).is_empty());
    // Changed on the PFS: the cache still shows the old bytes.
    let new = Rng(103).bytes(150_000);
    r.set_pfs(a, &new);
    assert_eq!(r.read(a, 0, 1000), old[..1000]);

    let reads = r.pfs.reads.load(Ordering::SeqCst);
    assert!(r.c.drop_clean(&r.data, a).unwrap());
    assert!(r.stored(a).is_empty(), "its stripe files are gone");
    assert_eq!(r.c.inode_status(&r.data, a), Default::default());
    let mut want = new.clone();
    want.resize(old.len(), 0);
    assert_eq!(r.read(a, 0, old.len()), want);
    assert!(r.pfs.reads.load(Ordering::SeqCst) > reads, "fetched again");
    // Nothing of it: a no-op.
    assert!(r.c.drop_clean(&r.data, InodeNo(999)).unwrap());

    // Stripe files from before a restart, unknown to the state, count and go too.
    let r = r.restart();
    let st = r.c.inode_status(&r.data, a);
    assert!(st.cached && !st.dirty);
    assert!(r.c.drop_clean(&r.data, a).unwrap());
    assert!(r.stored(a).is_empty());
}

#[test]
fn a_drop_leaves_a_copy_with_dirty_bytes_whole() {
    let r = rig(64 << 10, 64 * MIB, MIB);
    let a = InodeNo(103);
    let old = Rng(104).bytes(200_000);
    r.set_pfs(a, &old);
    assert_eq!(r.read(a, 0, old.len()), old);
    r.write(a, 70_000, &[9; 100]);
    let mut model = old.clone();
    put(&mut model, 70_000, &[9; 100]);
    std::fs::write(r.pfs.path(a), vec![7; 200_000]).unwrap();

    assert!(!r.c.drop_clean(&r.data, a).unwrap(), "kept");
    let reads = r.pfs.reads.load(Ordering::SeqCst);
    assert_eq!(
        r.read(a, 0, model.len()),
        model,
        "nothing dropped, clean or dirty"
    );
    assert_eq!(r.pfs.reads.load(Ordering::SeqCst), reads);
    assert!(r.c.is_dirty(a));

    // A write that ends while the drop waits for it makes the copy dirty: kept.
    let b = InodeNo(104);
    r.set_pfs(b, &[1; 1000]);
    assert_eq!(r.read(b, 0, 1000), vec![1; 1000]);
    let g = r.c.begin_write(b, 0, 10, 5);
    std::thread::scope(|s| {
        let h = s.spawn(|| r.c.drop_clean(&r.data, b));
        // The drop waits for the write under way.
        std::thread::sleep(Duration::from_millis(100));
        assert!(!h.is_finished());
        let res = r.data.write(b, 0, 10, &[2; 5]);
        g.finish(&res).unwrap();
        assert!(!h.join().unwrap().unwrap(), "kept");
    });
    let mut want = vec![1; 1000];
    want[10..15].copy_from_slice(&[2; 5]);
    assert_eq!(r.read(b, 0, 1000), want);
}

#[test]
fn a_drop_waits_for_a_reader_that_was_promised_its_bytes() {
    let r = rig(64 << 10, 64 * MIB, MIB);
    let a = InodeNo(105);
    r.set_pfs(a, &[5; 1000]);
    let g = r.c.prepare_read(&r.data, &r.pfs, a, 0, 0, 1000).unwrap();
    std::thread::scope(|s| {
        let h = s.spawn(|| r.c.drop_clean(&r.data, a));
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !h.is_finished(),
            "the pinned stripe is not dropped under its reader"
        );
        assert_eq!(r.data.read(a, 0, 0, 1000).unwrap(), vec![5; 1000]);
        drop(g);
        assert!(h.join().unwrap().unwrap());
    });
    assert!(r.stored(a).is_empty());
}

#[test]
fn write_behind_leaves_the_write_s_time_as_the_mtime() {
    use std::os::unix::fs::MetadataExt;
    let r = rig(64 << 10, 64 * MIB, MIB);
    let a = InodeNo(102);
    r.set_pfs(a, &[1; 1000]);
    let before = spillway_types::Timespec::now();
    r.write(a, 100, &[2; 200000]);
    let after = spillway_types::Timespec::now();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    r.flush(a);
    let m = std::fs::metadata(r.pfs.path(a)).unwrap();
    let mtime = spillway_types::Timespec {
        sec: m.mtime(),
        nsec: m.mtime_nsec() as u32,
    };
    // Not the flush's time, a second later: the write's.
    assert!(
        before <= mtime && mtime <= after,
        "{mtime:?} not in {before:?}..{after:?}"
    );
    // And the version the flush recorded is the file's with that mtime.
    assert_eq!(
        r.c.inode_status(&r.data, a).flushed,
        Some(pfs_version(&r, a))
    );
}

fn pfs_times(r: &Rig, ino: InodeNo) -> (spillway_types::Timespec, spillway_types::Timespec) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(r.pfs.path(ino)).unwrap();
    let t = |sec, nsec: i64| spillway_types::Timespec {
        sec,
        nsec: nsec as u32,
    };
    (t(m.atime(), m.atime_nsec()), t(m.mtime(), m.mtime_nsec()))
}

/// Times set on a dirty file (`tar -x`'s futimens) are what its write-behind leaves on
/// the PFS file, also after a restart (kill -9) before it; a clean file takes none (the
/// namespace server set them on the PFS itself); a write after them voids the mtime,
/// and its write-behind leaves the write's time (the atime set stays).
#[test]
fn times_set_on_a_dirty_file_are_left_by_its_write_behind() {
    use crate::cache::wblog::LogTimes;
    use spillway_types::Timespec;
    let r = rig(64 << 10, 64 * MIB, MIB);
    let (a, b, clean) = (InodeNo(103), InodeNo(104), InodeNo(105));
    for ino in [a, b, clean] {
        r.set_pfs(ino, &[1; 10]);
    }
    r.write(a, 0, &[2; 150_000]);
    r.write(b, 0, &[3; 1000]);
    let set = LogTimes {
        atime: Some(Timespec {
            sec: 1_000,
            nsec: 5,
        }),
        mtime: Some(Timespec {
            sec: 1_234_567_890,
            nsec: 123_456_789,
        }),
        set_at: Timespec::now(),
        void: false,
    };
    for ino in [a, b, clean] {
        r.c.set_times(ino, set).unwrap();
    }
    let kept = |ino| {
        r.c.state()
            .inodes
            .get(&ino)
            .is_some_and(|i| i.times.is_some())
    };
    assert!(!kept(clean));
    let r = r.restart();
    r.flush(a);
    // Before reading it: a read moves an atime older than the mtime (relatime).
    assert_eq!(pfs_times(&r, a), (set.atime.unwrap(), set.mtime.unwrap()));
    assert_eq!(r.pfs_bytes(a), vec![2; 150_000]);
    assert!(r.c.state().inodes.get(&a).is_none_or(|i| i.times.is_none()));
    // b: written again after its times were set.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let before = Timespec::now();
    r.write(b, 500, &[4; 100]);
    let after = Timespec::now();
    r.flush(b);
    let (atime, mtime) = pfs_times(&r, b);
    assert_eq!(atime, set.atime.unwrap());
    assert!(
        before <= mtime && mtime <= after,
        "{mtime:?} not in {before:?}..{after:?}"
    );
}

// ---- streams (stream.rs) and random writers' write-behind

impl Rig {
    /// Writes as the request path makes them: `chunk` bytes a request, cut at stripe
    /// boundaries, each offered to the stream bypass first. The bytes bypassed.
    fn write_req(&self, ino: InodeNo, off: u64, bytes: &[u8], chunk: usize) -> u64 {
        let ss = self.ss();
        let (mut done, mut bypassed) = (0, 0);
        while done < bytes.len() {
            let at = off + done as u64;
            let (k, o) = (at / ss, at % ss);
            let n = ((ss - o) as usize).min(bytes.len() - done).min(chunk);
            let piece = &bytes[done..done + n];
            let mut g = self.c.begin_write(ino, k, o as u32, n as u32);
            if let Some(w) = self.c.try_bypass(&self.pfs, &mut g, piece) {
                assert_eq!(w as usize, n);
                bypassed += n as u64;
            } else {
                let r = self.data.write(ino, k, o as u32, piece);
                g.finish(&r).unwrap();
                assert_eq!(r.unwrap() as usize, n);
            }
            done += n;
        }
        bypassed
    }
}

fn unsynced_stream(c: &CacheStripes, ino: InodeNo) -> bool {
    c.state().streams.get(&ino).is_some_and(|s| s.unsynced)
}

#[test]
fn a_stream_goes_to_the_pfs_without_the_stripe_files() {
    let r = rig(8 << 20, 64 << 20, 0);
    let ino = InodeNo(40);
    r.set_pfs(ino, b"");
    let mut rng = Rng(40);
    let bytes = rng.bytes(6 << 20);
    let bypassed = r.write_req(ino, 0, &bytes, 1 << 20);
    // The first MiB makes the run; the rest goes to the PFS file.
    assert_eq!(bypassed, 5 * MIB);
    assert_eq!(r.stored(ino), vec![(0, MIB)]);
    assert_eq!(r.c.dirty_bytes(), MIB);
    assert_eq!(&r.pfs_bytes(ino)[MIB as usize..], &bytes[MIB as usize..]);
    // Read through the cache: the bypassed bytes come from the PFS file.
    assert_eq!(r.read(ino, 0, bytes.len()), bytes);
    r.flush(ino);
    assert_eq!(r.pfs_bytes(ino), bytes);
    assert_eq!(r.c.dirty_bytes(), 0);
}

#[test]
fn a_write_into_a_streamed_range_wins_in_order() {
    let r = rig(8 << 20, 64 << 20, 0);
    let ino = InodeNo(41);
    r.set_pfs(ino, b"");
    let mut rng = Rng(41);
    let mut model = rng.bytes(4 << 20);
    assert_eq!(r.write_req(ino, 0, &model, 1 << 20), 3 * MIB);
    // A random write into the bypassed range: absorbed, read back, written behind.
    let x = rng.bytes(4096);
    r.write(ino, 2 * MIB + 100, &x);
    put(&mut model, 2 * MIB + 100, &x);
    assert_eq!(r.read(ino, 0, model.len()), model);
    // The stream writes over it again: that range holds dirty bytes, so the write is
    // absorbed too (a bypass would be overwritten by the older write's write-behind).
    let b = rng.bytes(1 << 20);
    assert_eq!(r.write_req(ino, 2 * MIB, &b, 1 << 20), 0);
    put(&mut model, 2 * MIB, &b);
    assert_eq!(r.read(ino, 0, model.len()), model);
    let y = rng.bytes(4096);
    r.write(ino, MIB + 7, &y);
    put(&mut model, MIB + 7, &y);
    r.flush(ino);
    assert_eq!(r.pfs_bytes(ino), model);
    assert_eq!(r.read(ino, 0, model.len()), model);
}

#[test]
fn a_kill_9_mid_stream_loses_no_acknowledged_byte() {
    let r = rig(8 << 20, 64 << 20, 0);
    let ino = InodeNo(42);
    r.set_pfs(ino, b"");
    let mut rng = Rng(42);
    let bytes = rng.bytes(5 << 20);
    assert_eq!(r.write_req(ino, 0, &bytes, 1 << 20), 4 * MIB);
    assert!(unsynced_stream(&r.c, ino));
    // fsync: the bypassed bytes are fdatasynced on the PFS, the absorbed ones logged.
    r.c.sync(&r.pfs, ino).unwrap();
    assert!(!unsynced_stream(&r.c, ino));
    let r = r.restart();
    assert_eq!(r.read(ino, 0, bytes.len()), bytes);
    r.c.flush_all(&r.data, &r.pfs).unwrap();
    assert_eq!(r.pfs_bytes(ino), bytes);
}

#[test]
fn truncate_and_delete_end_a_stream() {
    let r = rig(8 << 20, 64 << 20, 0);
    let ino = InodeNo(43);
    r.set_pfs(ino, b"");
    let mut rng = Rng(43);
    let mut model = rng.bytes(4 << 20);
    assert_eq!(r.write_req(ino, 0, &model, 1 << 20), 3 * MIB);
    // A truncate: the stripes here, then the PFS file (the namespace server's part).
    r.c.truncate(&r.data, ino, MIB + 5, r.pfs.stripe_size)
        .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(r.pfs.path(ino))
        .unwrap()
        .set_len(MIB + 5)
        .unwrap();
    model.truncate((MIB + 5) as usize);
    // The run is over; the bypassed bytes before the cut are still owed to an fsync.
    assert!(unsynced_stream(&r.c, ino));
    // Written on from the cut: a new run, absorbed first, then bypassed.
    let more = rng.bytes(3 << 20);
    assert_eq!(r.write_req(ino, MIB + 5, &more, 1 << 20), 2 * MIB);
    put(&mut model, MIB + 5, &more);
    assert_eq!(r.read(ino, 0, model.len()), model);
    r.flush(ino);
    assert_eq!(r.pfs_bytes(ino), model);
    // A delete mid-stream drops it whole.
    assert!(r.write_req(ino, 4 * MIB + 5, &more, 1 << 20) > 0);
    r.c.delete(&r.data, ino).unwrap();
    assert!(!r.c.state().streams.contains_key(&ino));
    assert_eq!(r.c.dirty_bytes(), 0);
    assert!(r.stored(ino).is_empty());
}

#[test]
fn a_stream_the_pfs_refuses_is_absorbed_and_written_behind_later() {
    let r = rig(8 << 20, 64 << 20, 0);
    let ino = InodeNo(44);
    r.set_pfs(ino, b"");
    let mut rng = Rng(44);
    let bytes = rng.bytes(4 << 20);
    // The PFS fails (full, or down): no write is refused, all are absorbed.
    r.pfs.fail.store(true, Ordering::SeqCst);
    assert_eq!(r.write_req(ino, 0, &bytes, 1 << 20), 0);
    assert_eq!(r.c.dirty_bytes(), 4 * MIB);
    assert_eq!(r.read(ino, 0, bytes.len()), bytes);
    r.pfs.fail.store(false, Ordering::SeqCst);
    r.flush(ino);
    assert_eq!(r.pfs_bytes(ino), bytes);
}

#[test]
fn a_flush_asked_for_syncs_bypassed_bytes() {
    // sync_to_pfs and sync_on_close flush through `flush_inode`: bypassed bytes are
    // fdatasynced too, even when nothing is dirty.
    let r = rig(8 << 20, 64 << 20, 0);
    let ino = InodeNo(45);
    r.set_pfs(ino, b"");
    let bytes = Rng(45).bytes(3 << 20);
    r.write_req(ino, 0, &bytes, 1 << 20);
    r.flush(ino);
    assert!(!unsynced_stream(&r.c, ino));
    r.write_req(ino, 3 * MIB, &bytes, 1 << 20);
    assert!(unsynced_stream(&r.c, ino));
    assert_eq!(r.c.dirty_bytes(), 0);
    r.flush(ino);
    assert!(!unsynced_stream(&r.c, ino));
}

#[test]
fn a_random_writer_is_written_behind_once_it_pauses() {
    let r = rig(1 << 20, 256 << 20, 0);
    let ino = InodeNo(46);
    r.set_pfs(ino, b"");
    let mut rng = Rng(46);
    // 1,100 separate 4 KiB writes: more dirty ranges than MANY_RANGES.
    for i in 0..1100u64 {
        let b = rng.bytes(4096);
        r.write(ino, i * 64 * KIB, &b);
    }
    let policy = FlushPolicy::default();
    // Still writing (its last write just now, no fsync): left to the writer.
    assert_eq!(r.c.flush_pass(&r.data, &r.pfs, &policy).flushed, 0);
    // Its fsync ends the burst: written behind at the next pass.
    r.c.sync(&r.pfs, ino).unwrap();
    assert_eq!(r.c.flush_pass(&r.data, &r.pfs, &policy).flushed, 1);
    assert_eq!(r.c.dirty_bytes(), 0);
}

#[test]
fn the_write_behind_of_a_stream_s_start_does_not_hold_its_bypass_off() {
    // The run's first MiB is absorbed and written behind at once; writes that land
    // during that flush are bypassed: a flush that held them off would leave them
    // dirty for the next, and under a stream the next starts as soon as it ends.
    let r = rig(8 << 20, 64 << 20, 0);
    let ino = InodeNo(47);
    r.set_pfs(ino, b"");
    let bytes = Rng(47).bytes(3 << 20);
    assert_eq!(r.write_req(ino, 0, &bytes[..1 << 20], 1 << 20), 0);
    let (entered_tx, entered) = mpsc::channel();
    let (go, go_rx) = mpsc::channel();
    *r.pfs.gate.lock().unwrap() = Some((entered_tx, go_rx));
    std::thread::scope(|s| {
        let h = s.spawn(|| r.c.flush_inode(&r.data, &r.pfs, ino));
        entered.recv().unwrap();
        assert_eq!(r.write_req(ino, MIB, &bytes[1 << 20..], 1 << 20), 2 * MIB);
        go.send(()).unwrap();
        h.join().unwrap().unwrap();
    });
    assert_eq!(r.c.dirty_bytes(), 0);
    assert_eq!(r.pfs_bytes(ino), bytes);
    assert_eq!(r.read(ino, 0, bytes.len()), bytes);
}
