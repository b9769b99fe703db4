//! The write-back buffer of one file in this client (the DVS-style client cache).
//!
//! Writes land here and return at memory speed; the buffer is written to the servers
//! in batches in the background once half the per-file budget is dirty, and entirely
//! at close (flush) and fsync, so that close-to-open holds: what a client wrote and
//! closed is on the servers before close returns. Only one batch is in flight per
//! file, so overlapping writes never reach a server out of order. A failed background
//! write is remembered and reported by the next write, flush or fsync (as the kernel
//! reports writeback errors), never dropped silently.

use crate::instance::Instance;
use spillway_placement::Layout;
use spillway_types::{Attr, Errno, InodeNo, ServerIndex};
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

pub struct WriteBack {
    inst: Arc<Instance>,
    ino: InodeNo,
    /// Where the file's stripes go (may change while the file is still empty).
    layout: Mutex<Layout>,
    budget: usize,
    st: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    /// Dirty runs keyed by offset; never overlapping or touching (merged on insert).
    dirty: BTreeMap<u64, Vec<u8>>,
    dirty_bytes: usize,
    /// A background batch is being written.
    flushing: bool,
    /// First error of a background batch, not yet reported.
    error: Option<Errno>,
    /// One past the highest byte this client wrote (the size the kernel believes).
    end: u64,
    /// Servers holding data not yet fsync'ed.
    unsynced: Vec<ServerIndex>,
    /// Data reached the servers but the home does not know the new size/mtime yet.
    size_stale: bool,
    /// The size the home is known to hold durably (None: unknown, e.g. after a
    /// truncate or at open). fsync syncs the home's log only when the size moved past
    /// it: data and size are durable after fsync; an mtime-only change may be older
    /// after a server crash (docs/data-plane.md).
    durable_size: Option<u64>,
}

impl WriteBack {
    pub fn new(inst: Arc<Instance>, attr: &Attr, budget: usize) -> WriteBack {
        let layout = inst.layout(attr);
        let st = State {
            end: attr.size,
            ..State::default()
        };
        WriteBack {
            inst,
            ino: attr.ino,
            layout: Mutex::new(layout),
            budget: budget.max(1 << 20),
            st: Mutex::new(st),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The size this client has written up to (0 if it wrote nothing past `attr.size`).
    pub fn end(&self) -> u64 {
        self.lock().end
    }

    pub fn is_dirty(&self) -> bool {
        let st = self.lock();
        st.dirty_bytes > 0 || st.flushing || st.size_stale
    }

    /// Buffer one write.
    pub fn write(self: &Arc<Self>, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let mut st = self.lock();
        if let Some(e) = st.error.take() {
            return Err(e);
        }
        while st.flushing && st.dirty_bytes >= self.budget {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        insert(&mut st, offset, data);
        st.end = st.end.max(offset + data.len() as u64);
        if !st.flushing && st.dirty_bytes >= self.budget / 2 {
            let batch = std::mem::take(&mut st.dirty);
            st.dirty_bytes = 0;
            st.flushing = true;
            let me = self.clone();
            std::thread::spawn(move || me.background(batch));
        }
        Ok(())
    }

    fn background(&self, batch: BTreeMap<u64, Vec<u8>>) {
        let result = self.write_out(&batch);
        let mut st = self.lock();
        st.flushing = false;
        match result {
            Ok(servers) => {
                merge_servers(&mut st.unsynced, &servers);
                st.size_stale = true;
            }
            Err(e) => {
                tracing::warn!(ino = %self.ino, "write-back failed: {e}");
                st.error.get_or_insert(e);
            }
        }
        self.cv.notify_all();
    }

    fn write_out(&self, batch: &BTreeMap<u64, Vec<u8>>) -> Result<Vec<ServerIndex>, Errno> {
        let layout = *self.layout.lock().unwrap_or_else(|e| e.into_inner());
        self.inst.write_runs(&layout, self.ino, batch, false)
    }

    /// Write everything dirty to the servers and tell the home the new size, so that
    /// another client opening the file afterwards sees it (close-to-open). Returns the
    /// home's attributes when it was told something.
    pub fn flush(&self) -> Result<Option<Attr>, Errno> {
        self.push(false)
    }

    /// `flush`, and make the file's data and metadata durable on every server.
    pub fn fsync(&self) -> Result<Option<Attr>, Errno> {
        self.push(true)
    }

    /// One round of requests, all in flight at once: the dirty runs to their stripes'
    /// servers (each fdatasync'ed there when `durable`), an fdatasync on servers still
    /// holding older unsynced data of the file, and the new size and mtime to the home
    /// (its log synced when `durable`). A 4 KiB write + fsync costs one round trip.
    fn push(&self, durable: bool) -> Result<Option<Attr>, Errno> {
        let mut st = self.lock();
        while st.flushing {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if let Some(e) = st.error.take() {
            return Err(e);
        }
        let batch = std::mem::take(&mut st.dirty);
        st.dirty_bytes = 0;
        let end = st.end;
        let wrote = !batch.is_empty() || st.size_stale;
        let meta_durable = durable && st.durable_size != Some(end);
        let tell_home = wrote || meta_durable;
        let unsynced = if durable {
            std::mem::take(&mut st.unsynced)
        } else {
            Vec::new()
        };
        if !tell_home && unsynced.is_empty() {
            return Ok(None);
        }
        st.size_stale = false;
        // Hold `flushing` so that concurrent writers queue behind this round.
        st.flushing = true;
        drop(st);

        let layout = *self.layout.lock().unwrap_or_else(|e| e.into_inner());
        let size_call = tell_home.then(|| {
            self.inst
                .start_extend_size(self.ino, end, wrote, meta_durable)
        });
        let batch_servers: Vec<ServerIndex> = batch
            .iter()
            .flat_map(|(&off, d)| layout.pieces(off, d.len() as u64))
            .map(|(k, _, _)| layout.server_of(k))
            .collect();
        let older: Vec<ServerIndex> = unsynced
            .iter()
            .copied()
            .filter(|s| !batch_servers.contains(s))
            .collect();
        let sync_calls = self.inst.start_sync_data(self.ino, &older);
        let written = self.inst.write_runs(&layout, self.ino, &batch, durable);
        let synced =
            sync_calls.and_then(|calls| calls.into_iter().try_for_each(|c| c.wait().map(|_| ())));
        let size_reply = size_call.map(|c| c.and_then(|c| c.wait()));

        let mut st = self.lock();
        st.flushing = false;
        self.cv.notify_all();
        // Whatever failed is remembered for the next push, never forgotten.
        if synced.is_err() {
            merge_servers(&mut st.unsynced, &unsynced);
        }
        match &written {
            Ok(servers) if !durable => merge_servers(&mut st.unsynced, servers),
            Ok(_) => {}
            Err(_) => merge_servers(&mut st.unsynced, &unsynced),
        }
        let attr = match size_reply {
            None => None,
            Some(Ok(a)) => {
                if meta_durable {
                    st.durable_size = Some(end);
                }
                Some(a.attr)
            }
            Some(Err(e)) => {
                st.size_stale |= wrote;
                st.durable_size = None;
                drop(st);
                written?;
                return Err(e);
            }
        };
        drop(st);
        written?;
        synced?;
        Ok(attr)
    }

    /// The file's stripe geometry changed (it had no data yet).
    pub fn relayout(&self, attr: &Attr) {
        *self.layout.lock().unwrap_or_else(|e| e.into_inner()) = self.inst.layout(attr);
    }

    /// The file was truncated to `size` (after a flush): forget what lay beyond.
    pub fn truncated(&self, size: u64) {
        let mut st = self.lock();
        st.end = size;
        st.durable_size = None;
    }

    /// Someone else's size is now authoritative (after open found the file changed).
    pub fn reset_end(&self, size: u64) {
        let mut st = self.lock();
        if st.dirty_bytes == 0 && !st.flushing {
            st.end = size;
        }
    }
}

fn merge_servers(into: &mut Vec<ServerIndex>, from: &[ServerIndex]) {
    for s in from {
        if !into.contains(s) {
            into.push(*s);
        }
    }
}

/// Insert `data` at `offset`, merging with every run it overlaps or touches. The
/// common case, appending right after a run, extends that run in place.
fn insert(st: &mut State, offset: u64, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let end = offset + data.len() as u64;
    let touching: Vec<u64> = st
        .dirty
        .range(..=end)
        .rev()
        .take_while(|(&s, v)| s + v.len() as u64 >= offset)
        .map(|(&s, _)| s)
        .collect();
    let mut runs: Vec<(u64, Vec<u8>)> = touching
        .iter()
        .filter_map(|s| st.dirty.remove(s).map(|v| (*s, v)))
        .collect();
    for (_, v) in &runs {
        st.dirty_bytes -= v.len();
    }
    runs.sort_by_key(|(s, _)| *s);
    let start = runs.first().map_or(offset, |(s, _)| (*s).min(offset));
    let run_end = runs
        .last()
        .map_or(end, |(s, v)| (s + v.len() as u64).max(end));
    let merged = if runs.len() == 1 && runs[0].0 <= offset {
        let (_, mut v) = runs.pop().unwrap_or_default();
        v.resize((run_end - start) as usize, 0);
        v[(offset - start) as usize..(end - start) as usize].copy_from_slice(data);
        v
    } else {
        let mut v = vec![0u8; (run_end - start) as usize];
        for (s, r) in &runs {
            v[(s - start) as usize..(s - start) as usize + r.len()].copy_from_slice(r);
        }
        v[(offset - start) as usize..(end - start) as usize].copy_from_slice(data);
        v
    };
    st.dirty_bytes += merged.len();
    st.dirty.insert(start, merged);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(ops: &[(u64, &[u8])]) -> State {
        let mut st = State::default();
        for (o, d) in ops {
            insert(&mut st, *o, d);
        }
        st
    }

    #[test]
    fn appends_coalesce_into_one_run() {
        let st = apply(&[(0, b"abc"), (3, b"def"), (6, b"g")]);
        assert_eq!(st.dirty.len(), 1);
        assert_eq!(st.dirty[&0], b"abcdefg");
        assert_eq!(st.dirty_bytes, 7);
    }

    #[test]
    fn overlaps_take_the_newest_bytes() {
        let st = apply(&[(10, b"xxxx"), (0, b"aa"), (12, b"YYYYY"), (1, b"B")]);
        assert_eq!(st.dirty.len(), 2);
        assert_eq!(st.dirty[&0], b"aB");
        assert_eq!(st.dirty[&10], b"xxYYYYY");
        let st = apply(&[(0, b"aa"), (4, b"bb"), (1, b"cccc")]);
        assert_eq!(st.dirty.len(), 1);
        assert_eq!(st.dirty[&0], b"accccb");
        assert_eq!(st.dirty_bytes, 6);
    }

    #[test]
    fn matches_a_flat_model() {
        // Random writes against a flat byte array.
        let mut model = vec![None::<u8>; 200];
        let mut st = State::default();
        let mut seed = 12345u64;
        for _ in 0..500 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (seed >> 33) % 180;
            let len = 1 + (seed >> 13) % 20;
            let byte = (seed >> 5) as u8;
            let data = vec![byte; len as usize];
            insert(&mut st, off, &data);
            for i in off..off + len {
                model[i as usize] = Some(byte);
            }
        }
        let mut flat = vec![None::<u8>; 200];
        let mut prev_end = None;
        for (s, v) in &st.dirty {
            if let Some(pe) = prev_end {
                assert!(*s > pe, "runs overlap or touch");
            }
            for (i, b) in v.iter().enumerate() {
                flat[*s as usize + i] = Some(*b);
            }
            prev_end = Some(s + v.len() as u64);
        }
        assert_eq!(flat, model);
        assert_eq!(st.dirty_bytes, model.iter().filter(|b| b.is_some()).count());
    }
}
