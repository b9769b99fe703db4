//! The write-behind log of the fragment as this module keeps it: appends (under the
//! state lock, so records follow the state's changes), group-committed syncs,
//! compaction, and repair after a failed append.
//!
//! A failed append (the disk full, an I/O error) may leave a torn record at the log's
//! end. Recovery stops at the first torn record, so any record appended after it would
//! be lost at a restart: the log is *broken* from then on, and appends fail (the writes
//! are answered with an error; their ranges stay dirty in memory and are written
//! behind) until `repair_log` rewrites it whole from the state's dirty ranges.

use super::state::{minus, State};
use super::CacheStripes;
use crate::cache::ranges::RangeSet;
use crate::cache::wblog::{times_extent, Extent, FileLog, Kind, LogTimes, WbLog};
use crate::error::StoreResult;
use spillway_types::InodeNo;
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard};

/// The PFS version a range was cached against: reserved (all zeros) until coherence
/// at open (docs/cache.md, section 7) fills it in.
const VERSION: [u8; 32] = [0; 32];

/// Compaction waits until the log is larger than this, and than 4 times its live
/// records.
pub(super) const COMPACT_MIN: u64 = 1 << 20;

/// Bytes of one log record (docs/cache.md, section 4).
const RECORD_BYTES: u64 = 84;

/// The write-behind log and a second descriptor of its file, for `fdatasync` without
/// the log's lock (appends go on meanwhile: group commit) and for its size.
pub(super) struct LogState {
    pub path: PathBuf,
    /// None only after a failed compaction whose reopen failed too.
    pub log: Option<WbLog<FileLog>>,
    pub file: Arc<File>,
    /// The sequence of the last record appended.
    pub last_seq: u64,
    /// An append failed: the file may end in a torn record (see above).
    pub broken: bool,
}

/// Group commit: the log is durable up to `upto`; `running` while one fdatasync is
/// under way (the others wait for it and are covered when it covers them).
#[derive(Default)]
pub(super) struct Synced {
    pub upto: u64,
    pub running: bool,
}

impl LogState {
    pub(super) fn new(path: PathBuf, log: WbLog<FileLog>, file: File) -> LogState {
        LogState {
            path,
            log: Some(log),
            file: Arc::new(file),
            last_seq: 0,
            broken: false,
        }
    }

    /// Append one record, or refuse while the log is broken (and break it on failure).
    fn record(
        &mut self,
        kind: Kind,
        ino: u64,
        stripe: u64,
        (s, e): (u64, u64),
    ) -> std::io::Result<u64> {
        let ext = Extent {
            ino,
            stripe,
            offset: s,
            len: e - s,
            version: VERSION,
        };
        self.record_extent(kind, &ext)
    }

    /// Times set explicitly on `ino` (a `Times` record).
    fn record_times(&mut self, ino: u64, t: &LogTimes) -> std::io::Result<u64> {
        self.record_extent(Kind::Times, &times_extent(ino, t))
    }

    fn record_extent(&mut self, kind: Kind, ext: &Extent) -> std::io::Result<u64> {
        if self.broken {
            return Err(std::io::Error::other(
                "the write-behind log failed earlier and is not repaired yet",
            ));
        }
        let log = self
            .log
            .as_mut()
            .ok_or_else(|| std::io::Error::other("the write-behind log could not be reopened"))?;
        match log.record(kind, ext) {
            Ok(seq) => {
                self.last_seq = seq;
                Ok(seq)
            }
            Err(err) => {
                self.broken = true;
                Err(err)
            }
        }
    }

    /// A new descriptor for syncs, after the log's file was replaced.
    fn reopen_for_sync(&mut self) {
        match open_for_sync(&self.path) {
            Ok(f) => self.file = Arc::new(f),
            Err(e) => tracing::warn!("write-behind log: {e}"),
        }
    }
}

impl CacheStripes {
    pub(super) fn log(&self) -> MutexGuard<'_, LogState> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn synced(&self) -> MutexGuard<'_, Synced> {
        self.synced.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Append a record of `[s, e)` of a stripe to the log (called under the state
    /// lock, so records follow the order of the state's changes). `last_seq` is the
    /// inode's, which `sync` waits for. Durable at the next `sync`.
    pub(super) fn append(
        &self,
        last_seq: &mut u64,
        kind: Kind,
        ino: InodeNo,
        stripe: u64,
        range: (u64, u64),
    ) -> std::io::Result<()> {
        *last_seq = self.log().record(kind, ino.0, stripe, range)?;
        Ok(())
    }

    /// Append a `Times` record for `ino`.
    pub(super) fn append_times(
        &self,
        last_seq: &mut u64,
        ino: InodeNo,
        t: &LogTimes,
    ) -> std::io::Result<()> {
        *last_seq = self.log().record_times(ino.0, t)?;
        Ok(())
    }

    /// Make the log durable up to the last record of `ino` (the caller has synced the
    /// inode's stripe files first: a `Dirty` record reaches the device with, or after,
    /// the bytes it names). Concurrent syncs share one fdatasync.
    /// Bytes a stream wrote straight to the PFS file are synced there first.
    pub(crate) fn sync(&self, pfs: &dyn crate::cache::PfsFiles, ino: InodeNo) -> StoreResult<()> {
        self.sync_stream(pfs, ino)?;
        let target = {
            let mut st = self.state();
            match st.inodes.get_mut(&ino) {
                Some(i) => {
                    if !i.synced_after_write && i.last_write.is_some() {
                        // A random writer's burst ends here: its backlog is due now.
                        i.synced_after_write = true;
                        if i.many_ranges() {
                            self.kick.ring();
                        }
                    }
                    i.last_seq
                }
                None => 0,
            }
        };
        self.sync_upto(target)
    }

    /// Make every record appended so far durable.
    pub(super) fn sync_log(&self) -> StoreResult<()> {
        let upto = self.log().last_seq;
        self.sync_upto(upto)
    }

    /// Make the log durable up to sequence `target` (group commit).
    fn sync_upto(&self, target: u64) -> StoreResult<()> {
        let mut s = self.synced();
        loop {
            if s.upto >= target {
                return Ok(());
            }
            if !s.running {
                break;
            }
            s = self.sync_done.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.running = true;
        drop(s);
        // Every record up to `upto` is in the file; the fdatasync covers them all,
        // including those appended by writers that now wait for this one. A log
        // compacted meanwhile was synced whole by the compaction.
        let (file, upto) = {
            let l = self.log();
            (Arc::clone(&l.file), l.last_seq)
        };
        let r = file.sync_data();
        let mut s = self.synced();
        s.running = false;
        if r.is_ok() {
            s.upto = s.upto.max(upto);
        }
        self.sync_done.notify_all();
        Ok(r?)
    }

    /// Compact the log when it is larger than `min` bytes and 4 times its live
    /// records (each flush leaves records that only cancel earlier ones). True when it
    /// was compacted.
    pub(super) fn compact_if_due(&self, min: u64) -> bool {
        let mut l = self.log();
        if l.broken {
            return false;
        }
        let size = match l.file.metadata() {
            Ok(m) => m.len(),
            Err(e) => {
                tracing::warn!("write-behind log: {e}");
                return false;
            }
        };
        let live: u64 = l.log.as_ref().map_or(0, |log| {
            let stripes = log.dirty().inodes.values().flat_map(|i| i.stripes.values());
            stripes.map(|r| r.iter().count() as u64).sum()
        });
        if size <= min || size <= live.saturating_mul(RECORD_BYTES * 4) {
            return false;
        }
        let compacted = compact(&mut l).is_ok();
        if compacted {
            // The compacted log was synced and renamed, and its directory synced:
            // every record appended so far is as durable as a sync makes it.
            let upto = l.last_seq;
            let mut s = self.synced();
            s.upto = s.upto.max(upto);
        }
        compacted
    }

    /// Rewrite a broken log whole: compacted (which drops its torn end), then brought
    /// to the state's dirty ranges (the records whose appends failed), and synced. True
    /// when the log works again.
    pub(super) fn repair_log(&self) -> bool {
        // The state first (lock order), and held: the dirty ranges must not change
        // until the log says the same.
        let st = self.state();
        let mut l = self.log();
        if !l.broken && l.log.is_some() {
            return true;
        }
        if compact(&mut l).is_err() {
            return false;
        }
        l.broken = false;
        let synced = match resync(&mut l, &st).and_then(|()| {
            let log = l
                .log
                .as_mut()
                .ok_or_else(|| std::io::Error::other("no log"))?;
            log.sync()
        }) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("repairing the write-behind log: {e}");
                l.broken = true;
                false
            }
        };
        if synced {
            tracing::info!("the write-behind log is repaired");
            let upto = l.last_seq;
            let mut s = self.synced();
            s.upto = s.upto.max(upto);
        }
        synced
    }
}

/// Compact the log (reopened first if it is gone): on failure the log is whichever
/// whole file is at its path (compaction renames a synced copy), reopened.
fn compact(l: &mut LogState) -> std::io::Result<()> {
    let path = l.path.clone();
    let old = match l.log.take() {
        Some(log) => Ok(log),
        None => FileLog::open(&path),
    };
    let r = old.and_then(|log| FileLog::compact(&path, log));
    let r = match r {
        Ok(log) => {
            l.log = Some(log);
            Ok(())
        }
        Err(e) => {
            tracing::warn!("compacting the write-behind log: {e}");
            l.log = FileLog::open(&path)
                .map_err(|e| tracing::error!("reopening the write-behind log: {e}"))
                .ok();
            Err(e)
        }
    };
    l.reopen_for_sync();
    r
}

/// Append what makes the log's dirty set the state's: `Dirty` for ranges only the
/// state has (their appends failed), `Dropped` for ranges only the log has (their
/// `Flushed` or `Dropped` failed).
fn resync(l: &mut LogState, st: &State) -> std::io::Result<()> {
    let mut todo: Vec<(Kind, u64, u64, (u64, u64))> = Vec::new();
    let empty = RangeSet::default();
    {
        let Some(log) = l.log.as_ref() else {
            return Err(std::io::Error::other("no log"));
        };
        let logged = |ino: u64, k: u64| {
            log.dirty()
                .inodes
                .get(&ino)
                .and_then(|i| i.stripes.get(&k))
                .unwrap_or(&empty)
        };
        for (ino, i) in &st.inodes {
            for (&k, s) in &i.stripes {
                let known = logged(ino.0, k);
                for (a, b) in s.dirty.iter() {
                    for r in minus(a, b, &[known]).iter() {
                        todo.push((Kind::Dirty, ino.0, k, r));
                    }
                }
            }
        }
        for (&ino, i) in &log.dirty().inodes {
            for (&k, ranges) in &i.stripes {
                let ours = st
                    .inodes
                    .get(&InodeNo(ino))
                    .and_then(|i| i.stripes.get(&k))
                    .map_or(&empty, |s| &s.dirty);
                for (a, b) in ranges.iter() {
                    for r in minus(a, b, &[ours]).iter() {
                        todo.push((Kind::Dropped, ino, k, r));
                    }
                }
            }
        }
    }
    for (kind, ino, k, r) in todo {
        l.record(kind, ino, k, r)?;
    }
    Ok(())
}

/// A second descriptor of the log file: its fdatasync syncs the file's data whichever
/// descriptor wrote it.
pub(super) fn open_for_sync(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}
