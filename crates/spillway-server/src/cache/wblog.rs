//! The write-behind log of a cache instance's fragment (docs/cache.md, "The
//! write-behind log"): which byte ranges of which stripes are dirty, that is written to
//! this server's stripe files and not yet to the PFS. The bytes themselves are in the
//! stripe files; a write is answered only after its stripe bytes and then its `Dirty`
//! record are on the device, so after a crash the log names every range whose bytes
//! the PFS may still lack. A lost `Flushed` record only means a range is written to
//! the PFS once more.
//!
//! Format: a sequence of records, each
//! `magic "SWBL" | kind u8 | payload length u24 | sequence u64 | payload | crc32c u32`
//! (little-endian; the crc covers everything before it). Kinds: 1 dirty, 2 flushed,
//! 3 dropped (unlink, truncate, a stale cache dropped at open), 4 times (times set
//! explicitly on a file with dirty ranges here, left on the PFS file after its
//! write-behinds: `LogTimes`). Payload: inode u64, stripe u64, offset u64, length u64,
//! PFS version [u8; 32]; for `times`, the same 64 bytes carry the times instead
//! (`times_extent`). The first record that is
//! short or fails its magic, kind, length or crc ends the log: it is a torn tail, whose
//! write was never answered.
//!
//! Storage goes through `LogFile`, implemented by a real file here and by a
//! fault-injecting memory file in the tests (a crash keeps any prefix of what was
//! written after the last sync).

use super::ranges::RangeSet;
use spillway_types::Timespec;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"SWBL";
const HEADER: usize = 4 + 1 + 3 + 8;
const PAYLOAD: usize = 8 * 4 + 32;
const RECORD: usize = HEADER + PAYLOAD + 4;

/// The PFS version a range was cached against: (size, mtime, ctime, st_ino) as the
/// inode's home saw them, packed by the caller.
pub(crate) type Version = [u8; 32];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Dirty = 1,
    Flushed = 2,
    Dropped = 3,
    Times = 4,
}

/// Times set explicitly (utime, futimens) on a file while it had dirty ranges here:
/// its write-behinds leave them on the PFS file (stripes/mtime.rs). `set_at` is the
/// namespace server's clock when they were set; `void` says a write came here after
/// them (in the log: a `dirty` record after the `times` record), so that the mtime is
/// that write's again, as POSIX has it. An inode's times go with its last dirty range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogTimes {
    pub atime: Option<Timespec>,
    pub mtime: Option<Timespec>,
    pub set_at: Timespec,
    pub void: bool,
}

impl From<&spillway_wire::CacheTimesReq> for LogTimes {
    fn from(r: &spillway_wire::CacheTimesReq) -> LogTimes {
        use spillway_wire::times_set;
        LogTimes {
            atime: (r.set & times_set::ATIME != 0).then_some(r.atime),
            mtime: (r.set & (times_set::MTIME | times_set::VOID) != 0).then_some(r.mtime),
            set_at: r.set_at,
            void: r.set & times_set::VOID != 0,
        }
    }
}

impl LogTimes {
    /// The request that gives these times to a server of the file (`void`: a write
    /// came after the times set, and `mtime` is its time).
    pub(crate) fn request(&self, ino: spillway_types::InodeNo) -> spillway_wire::CacheTimesReq {
        use spillway_wire::times_set;
        spillway_wire::CacheTimesReq {
            ino,
            set: [
                (self.atime.is_some(), times_set::ATIME),
                (self.mtime.is_some(), times_set::MTIME),
                (self.void, times_set::VOID),
            ]
            .into_iter()
            .filter(|&(on, _)| on)
            .fold(0, |set, (_, bit)| set | bit),
            atime: self.atime.unwrap_or_default(),
            mtime: self.mtime.unwrap_or_default(),
            set_at: self.set_at,
        }
    }
}

/// `LogTimes` in a record's fields: stripe = which are set (1 atime, 2 mtime), offset
/// and length = `set_at` (seconds as u64 bits, nanoseconds), version = atime seconds
/// (i64), atime nanoseconds (u32), mtime seconds, mtime nanoseconds, 8 zero bytes.
pub(crate) fn times_extent(ino: u64, t: &LogTimes) -> Extent {
    let mut version = [0u8; 32];
    let a = t.atime.unwrap_or_default();
    let m = t.mtime.unwrap_or_default();
    version[..8].copy_from_slice(&a.sec.to_le_bytes());
    version[8..12].copy_from_slice(&a.nsec.to_le_bytes());
    version[12..20].copy_from_slice(&m.sec.to_le_bytes());
    version[20..24].copy_from_slice(&m.nsec.to_le_bytes());
    Extent {
        ino,
        stripe: u64::from(t.atime.is_some()) | (u64::from(t.mtime.is_some()) << 1),
        offset: t.set_at.sec as u64,
        len: u64::from(t.set_at.nsec),
        version,
    }
}

fn times_of_extent(e: &Extent) -> LogTimes {
    let v = &e.version;
    let i64_at = |at: usize| i64::from_le_bytes(v[at..at + 8].try_into().unwrap_or([0; 8]));
    let u32_at = |at: usize| u32::from_le_bytes(v[at..at + 4].try_into().unwrap_or([0; 4]));
    let ts = |sec, nsec: u32| Timespec {
        sec,
        nsec: nsec.min(999_999_999),
    };
    LogTimes {
        atime: (e.stripe & 1 != 0).then(|| ts(i64_at(0), u32_at(8))),
        mtime: (e.stripe & 2 != 0).then(|| ts(i64_at(12), u32_at(20))),
        set_at: ts(e.offset as i64, u32::try_from(e.len).unwrap_or(0)),
        void: false,
    }
}

/// A byte range of one stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extent {
    pub ino: u64,
    pub stripe: u64,
    pub offset: u64,
    pub len: u64,
    pub version: Version,
}

/// What the log says is dirty: per inode, its version and its stripes' dirty ranges.
/// An inode is here only while some range of it is dirty.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Dirty {
    pub inodes: HashMap<u64, DirtyInode>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DirtyInode {
    pub version: Version,
    pub stripes: HashMap<u64, RangeSet>,
    /// Times set explicitly since its last clean state.
    pub times: Option<LogTimes>,
}

impl Dirty {
    fn apply(&mut self, kind: Kind, e: &Extent) {
        let end = e.offset.saturating_add(e.len);
        match kind {
            Kind::Dirty => {
                let i = self.inodes.entry(e.ino).or_insert_with(|| DirtyInode {
                    version: e.version,
                    stripes: HashMap::new(),
                    times: None,
                });
                i.version = e.version;
                i.stripes.entry(e.stripe).or_default().add(e.offset, end);
                // A write after the times were set: its time is the mtime again.
                if let Some(t) = &mut i.times {
                    t.void = true;
                }
            }
            Kind::Times => {
                // Only a file with dirty ranges keeps them (none: they are on the PFS).
                if let Some(i) = self.inodes.get_mut(&e.ino) {
                    i.times = Some(times_of_extent(e));
                }
            }
            Kind::Flushed | Kind::Dropped => {
                let Some(i) = self.inodes.get_mut(&e.ino) else {
                    return;
                };
                if let Some(r) = i.stripes.get_mut(&e.stripe) {
                    r.remove(e.offset, end);
                    if r.is_empty() {
                        i.stripes.remove(&e.stripe);
                    }
                }
                if i.stripes.is_empty() {
                    self.inodes.remove(&e.ino);
                }
            }
        }
    }

    /// Bytes dirty in all.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        let stripes = self.inodes.values().flat_map(|i| i.stripes.values());
        stripes.map(RangeSet::bytes).sum()
    }
}

fn encode(seq: u64, kind: Kind, e: &Extent) -> [u8; RECORD] {
    let mut b = [0u8; RECORD];
    b[..4].copy_from_slice(MAGIC);
    b[4] = kind as u8;
    b[5..8].copy_from_slice(&(PAYLOAD as u32).to_le_bytes()[..3]);
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    let p = &mut b[HEADER..HEADER + PAYLOAD];
    for (i, v) in [e.ino, e.stripe, e.offset, e.len].into_iter().enumerate() {
        p[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    p[32..].copy_from_slice(&e.version);
    let crc = crc32c(&b[..HEADER + PAYLOAD]);
    b[HEADER + PAYLOAD..].copy_from_slice(&crc.to_le_bytes());
    b
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// The record at the start of `b`, or None where the log ends (short, or any field
/// wrong: a torn tail).
fn decode(b: &[u8]) -> Option<(u64, Kind, Extent)> {
    let r = b.get(..RECORD)?;
    if &r[..4] != MAGIC {
        return None;
    }
    let kind = match r[4] {
        1 => Kind::Dirty,
        2 => Kind::Flushed,
        3 => Kind::Dropped,
        4 => Kind::Times,
        _ => return None,
    };
    let len = u32::from_le_bytes([r[5], r[6], r[7], 0]) as usize;
    let crc = u32::from_le_bytes([r[RECORD - 4], r[RECORD - 3], r[RECORD - 2], r[RECORD - 1]]);
    if len != PAYLOAD || crc32c(&r[..RECORD - 4]) != crc {
        return None;
    }
    let p = &r[HEADER..HEADER + PAYLOAD];
    let mut version = [0u8; 32];
    version.copy_from_slice(&p[32..]);
    let e = Extent {
        ino: u64_at(p, 0),
        stripe: u64_at(p, 8),
        offset: u64_at(p, 16),
        len: u64_at(p, 24),
        version,
    };
    Some((u64_at(r, 8), kind, e))
}

/// What a log's bytes say: the dirty set, the next sequence number, and how many bytes
/// are whole records (the rest is a torn tail, cut off before appending).
#[derive(Debug)]
pub(crate) struct Recovered {
    pub dirty: Dirty,
    pub next_seq: u64,
    pub valid_len: usize,
}

pub(crate) fn recover(bytes: &[u8]) -> Recovered {
    let mut dirty = Dirty::default();
    let (mut at, mut next_seq) = (0usize, 1u64);
    while let Some((seq, kind, e)) = bytes.get(at..).and_then(decode) {
        // Sequences only grow; a record that goes back is not this log's.
        if seq < next_seq {
            break;
        }
        dirty.apply(kind, &e);
        next_seq = seq + 1;
        at += RECORD;
    }
    Recovered {
        dirty,
        next_seq,
        valid_len: at,
    }
}

/// Where the log's bytes go.
pub(crate) trait LogFile {
    fn append(&mut self, b: &[u8]) -> io::Result<()>;
    /// Everything appended so far survives a crash once this returns.
    fn sync(&mut self) -> io::Result<()>;
}

/// The log: its file, the next sequence number and the dirty set it describes.
pub(crate) struct WbLog<F: LogFile> {
    file: F,
    next_seq: u64,
    dirty: Dirty,
}

impl<F: LogFile> WbLog<F> {
    /// A log over `file` whose existing bytes were `recovered`.
    pub(crate) fn resume(file: F, recovered: Recovered) -> WbLog<F> {
        WbLog {
            file,
            next_seq: recovered.next_seq,
            dirty: recovered.dirty,
        }
    }

    /// Append a record (durable at the next `sync`); the dirty set changes at once.
    pub(crate) fn record(&mut self, kind: Kind, e: &Extent) -> io::Result<u64> {
        let seq = self.next_seq;
        self.file.append(&encode(seq, kind, e))?;
        self.next_seq += 1;
        self.dirty.apply(kind, e);
        Ok(seq)
    }

    pub(crate) fn sync(&mut self) -> io::Result<()> {
        self.file.sync()
    }

    pub(crate) fn dirty(&self) -> &Dirty {
        &self.dirty
    }
}

/// The log in a file of the fragment.
pub(crate) struct FileLog {
    f: std::fs::File,
}

impl FileLog {
    /// Open (or create) the log at `path`: recover what it says, cut a torn tail off,
    /// and append after the last whole record. A compaction interrupted before its
    /// rename left `path` whole and a stray `.new`, which is removed.
    pub(crate) fn open(path: &Path) -> io::Result<WbLog<FileLog>> {
        let _ = std::fs::remove_file(new_path(path));
        // Never through a link: the server runs as root and the log is its own.
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        let recovered = recover(&bytes);
        if recovered.valid_len < bytes.len() {
            f.set_len(recovered.valid_len as u64)?;
            f.sync_data()?;
        }
        Ok(WbLog::resume(FileLog { f }, recovered))
    }

    /// Rewrite the log at `path` as one `Dirty` record per live range (the flushed and
    /// dropped history gone), and an inode's `Times` after them (followed by its first
    /// `Dirty` record again when a write voided their mtime, so that the order says the
    /// same): written to `<path>.new`, synced, renamed over `path`, and the directory
    /// synced. A crash at any point leaves either log, whole.
    pub(crate) fn compact(path: &Path, log: WbLog<FileLog>) -> io::Result<WbLog<FileLog>> {
        let tmp = new_path(path);
        let mut out = Vec::new();
        let mut seq = log.next_seq;
        let mut put = |kind: Kind, e: &Extent| {
            out.extend_from_slice(&encode(seq, kind, e));
            seq += 1;
        };
        let mut inodes: Vec<_> = log.dirty.inodes.iter().collect();
        inodes.sort_unstable_by_key(|(ino, _)| **ino);
        for (&ino, i) in inodes {
            let mut stripes: Vec<_> = i.stripes.iter().collect();
            stripes.sort_unstable_by_key(|(k, _)| **k);
            let mut first = None;
            for (&stripe, ranges) in stripes {
                for (s, e) in ranges.iter() {
                    let ext = Extent {
                        ino,
                        stripe,
                        offset: s,
                        len: e - s,
                        version: i.version,
                    };
                    put(Kind::Dirty, &ext);
                    first.get_or_insert(ext);
                }
            }
            if let Some(t) = &i.times {
                put(Kind::Times, &times_extent(ino, t));
                if let (true, Some(ext)) = (t.void, &first) {
                    put(Kind::Dirty, ext);
                }
            }
        }
        {
            // `open` removed any earlier `.new`; one found now is not ours.
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            f.write_all(&out)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        drop(log);
        Self::open(path)
    }
}

fn new_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".new");
    PathBuf::from(p)
}

impl LogFile for FileLog {
    fn append(&mut self, b: &[u8]) -> io::Result<()> {
        self.f.write_all(b)
    }

    fn sync(&mut self) -> io::Result<()> {
        // SAFETY: fdatasync on an open descriptor.
        if unsafe { libc::fdatasync(self.f.as_raw_fd()) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// CRC-32C (Castagnoli, reflected, as iSCSI and ext4 use it).
fn crc32c(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    let mut c = !0u32;
    for &b in data {
        c = TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

#[cfg(test)]
mod tests;
