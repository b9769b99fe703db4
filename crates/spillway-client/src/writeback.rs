//! The write-behind of one open file in this client (the DVS-style client cache).
//!
//! A write is sent to its stripe's server as it comes, and the caller goes on without
//! waiting for the reply: up to `writeback_per_file` bytes (and `writeback_inflight`
//! requests) per file are in flight before a writer waits for the oldest reply. Small
//! contiguous writes are first gathered into one staged run (`writeback/staged.rs`) of
//! up to `writeback_chunk` bytes (never crossing a stripe), so a stream of 4 KiB writes
//! costs one RPC per chunk, and an fsync right after a small write sends it with the
//! sync flag: write + fsync is one round trip. Every write goes out through the write
//! stubs (`spillway_stubs::write`).
//!
//! Two writes to overlapping bytes are never in flight at once: a server may run the
//! requests of one connection in parallel, so the later one could land first.
//!
//! Close (flush) and fsync send what is staged, collect every reply, and tell the home
//! the new size, so that close-to-open holds: what a client wrote and closed is on the
//! servers before close returns. A failed write is remembered and reported by the next
//! write, flush or fsync (as the kernel reports writeback errors), never dropped
//! silently. A write in flight when its server's connection breaks is sent again after
//! the reconnect (writes are idempotent), so each request keeps its own copy of the
//! bytes until it is answered.
//!
//! Space: a write is acknowledged before its server answered (staged or sent behind)
//! only when it is charged to this client's space grant on that server (grants.rs),
//! which the server keeps free for it. Otherwise the write is sent and waited for, so
//! that the server's ENOSPC (or a shorter count, where a part fits) is what write(2)
//! returns. The size told to the home never passes what the servers acknowledged
//! (`State::acked_end`); a write behind that fails after all (a resend after a
//! reconnect, an I/O error) is reported by the next call and the kernel's cached
//! pages and attributes of the file are dropped, so that the writer too reads what the
//! servers hold.

mod staged;

use crate::grants::Grants;
use spillway_placement::Layout;
use spillway_stubs::Payload;
use spillway_stubs::{Charge, Instance, PendingWrite};
use spillway_types::{Attr, Errno, InodeNo, ServerIndex, StripeIndex, Tunables};
use spillway_wire::messages::{setattr, ExtendSizeReply, SetAttrReq};
use staged::Staged;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

/// Reusable request buffers kept per file (a sequential writer cycles through them).
const SPARE_BUFFERS: usize = 8;
/// First capacity of a staged run (it grows by doubling up to the chunk size).
const STAGE_START: usize = 64 << 10;

/// Told the inode whose written-behind bytes were lost: the mount drops the kernel's
/// cached pages and attributes of it (never waits: called under the file's lock).
pub type Invalidate = Arc<dyn Fn(InodeNo) + Send + Sync>;

pub struct WriteBack {
    inst: Arc<Instance>,
    grants: Arc<Grants>,
    lost: Invalidate,
    ino: InodeNo,
    /// Where the file's stripes go (may change while the file is still empty).
    layout: Mutex<Layout>,
    /// Bytes and requests in flight before a writer waits.
    budget: usize,
    max_inflight: usize,
    chunk: usize,
    /// Everything below. Held across the sends and the waits of one operation:
    /// writes to one file from this client are ordered anyway.
    st: Mutex<State>,
    /// `State::end`, readable without the lock.
    end: AtomicU64,
}

/// How a write RPC goes out: `sync` (the server fdatasyncs before it answers), and
/// `wait` (its caller waits for it next, so it is sent at once rather than queued for
/// the connection's sending thread, which would add a wake-up to the wait).
#[derive(Clone, Copy)]
struct Pace {
    sync: bool,
    wait: bool,
}

impl Pace {
    /// A write behind: queued, the caller goes on.
    const BEHIND: Pace = Pace {
        sync: false,
        wait: false,
    };
}

/// A write sent and not yet answered.
struct InFlight {
    offset: u64,
    end: u64,
    /// Its bytes (counted here: the buffer that comes back with the reply may be
    /// empty, still held by the sending thread or by an arena link).
    len: usize,
    server: ServerIndex,
    sync: bool,
    call: PendingWrite,
}

#[derive(Default)]
struct State {
    staged: Option<Staged>,
    inflight: VecDeque<InFlight>,
    inflight_bytes: usize,
    spare: Vec<Vec<u8>>,
    /// First error of a write whose caller had already gone on, not yet reported.
    error: Option<Errno>,
    /// One past the highest byte this client wrote (the size the kernel believes).
    end: u64,
    /// The size the servers back: the file's size when opened (or truncated), raised
    /// by every write they acknowledged. The home is never told more.
    acked_end: u64,
    /// Servers holding data of the file not yet fsync'ed.
    unsynced: Vec<ServerIndex>,
    /// Data was sent but the home does not know the new size/mtime yet.
    size_stale: bool,
    /// The size the home is known to hold durably (None: unknown, e.g. after a
    /// truncate or at open). fsync syncs the home's log only when the size moved past
    /// it: data and size are durable after fsync; an mtime-only change may be older
    /// after a server crash (docs/data-plane.md).
    durable_size: Option<u64>,
}

impl State {
    fn dirty(&self) -> bool {
        self.staged.is_some() || !self.inflight.is_empty() || self.size_stale
    }
}

impl WriteBack {
    pub fn new(
        inst: Arc<Instance>,
        attr: &Attr,
        tun: &Tunables,
        grants: Arc<Grants>,
        lost: Invalidate,
    ) -> WriteBack {
        let layout = inst.layout(attr);
        let st = State {
            end: attr.size,
            acked_end: attr.size,
            ..State::default()
        };
        WriteBack {
            inst,
            grants,
            lost,
            ino: attr.ino,
            layout: Mutex::new(layout),
            budget: tun.writeback_per_file.max(1 << 20),
            max_inflight: tun.writeback_inflight.max(1),
            chunk: tun.writeback_chunk.max(4096),
            end: AtomicU64::new(attr.size),
            st: Mutex::new(st),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn layout(&self) -> Layout {
        *self.layout.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The size this client has written up to (0 if it wrote nothing past `attr.size`).
    /// Never waits: read from a copy kept outside the state lock, which a writer may
    /// hold across a network wait.
    pub fn end(&self) -> u64 {
        self.end.load(Ordering::Acquire)
    }

    /// Whether anything written here may not be on the servers, or its size not at
    /// the home, yet. Never waits (callers hold the client's node table): an
    /// operation in progress on the file counts as dirty.
    pub fn is_dirty(&self) -> bool {
        match self.st.try_lock() {
            Ok(st) => st.dirty(),
            Err(TryLockError::Poisoned(p)) => p.into_inner().dirty(),
            Err(TryLockError::WouldBlock) => true,
        }
    }

    fn set_end(&self, st: &mut State, end: u64) {
        st.end = end;
        self.end.store(end, Ordering::Release);
    }

    /// Take one write: staged or sent behind when the grant covers it, otherwise sent
    /// and waited for. Returns the bytes taken: fewer than `data` when a part did not
    /// fit on a full server (the caller's next write gets the error).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<usize, Errno> {
        let mut st = self.lock();
        if let Some(e) = st.error.take() {
            return Err(e);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let layout = self.layout();
        let mut pos = 0usize;
        let mut taken = 0usize;
        'pieces: for (stripe, _, n) in layout.pieces(offset, data.len() as u64) {
            // A piece lies within one stripe; cut it further into chunks.
            let piece = &data[pos..pos + n as usize];
            for (i, part) in piece.chunks(self.chunk).enumerate() {
                let at = offset + (pos + i * self.chunk) as u64;
                match self.add(&mut st, &layout, stripe, at, part) {
                    Ok(k) => {
                        taken += k;
                        if k < part.len() {
                            break 'pieces;
                        }
                    }
                    // What was taken before stands: a short count, as a local file
                    // system answers a write that fills the disk.
                    Err(_) if taken > 0 => break 'pieces,
                    Err(e) => return Err(e),
                }
            }
            pos += n as usize;
        }
        let end = st.end.max(offset + taken as u64);
        self.set_end(&mut st, end);
        Ok(taken)
    }

    /// Stage or send `bytes` at `offset`, all within `stripe` and at most a chunk; the
    /// bytes taken.
    fn add(
        &self,
        st: &mut State,
        layout: &Layout,
        stripe: StripeIndex,
        offset: u64,
        bytes: &[u8],
    ) -> Result<usize, Errno> {
        let server = layout.server_of(stripe);
        if let Some(s) = st.staged.as_mut() {
            if layout.locate(s.offset).0 == stripe
                && s.fits(offset, bytes.len(), self.chunk)
                && self.charge_to(server, s.growth(offset, bytes.len()), s.epoch)
            {
                s.merge(offset, bytes, self.chunk);
                if s.data.len() >= self.chunk {
                    self.send_staged(st, layout, false, false)?;
                }
                return Ok(bytes.len());
            }
            self.send_staged(st, layout, false, false)?;
        }
        let Some(epoch) = self.charge(st, server, bytes.len() as u64) else {
            return self.write_waited(st, layout, offset, bytes);
        };
        if bytes.len() >= self.chunk {
            let mut buf = self.buffer(st, server, bytes.len());
            buf.extend_from_slice(bytes);
            self.send(st, layout, offset, buf, Pace::BEHIND, epoch)?;
            return Ok(bytes.len());
        }
        let mut buf = self.buffer(st, server, STAGE_START.max(bytes.len()));
        buf.extend_from_slice(bytes);
        st.staged = Some(Staged {
            offset,
            data: buf,
            epoch,
        });
        Ok(bytes.len())
    }

    /// Charge `n` bytes to the grant of `server`, first collecting the replies of
    /// writes in flight to it (each may top the grant up): the epoch charged, or None
    /// when the grant cannot cover them.
    fn charge(&self, st: &mut State, server: ServerIndex, n: u64) -> Option<u64> {
        loop {
            if let Some(epoch) = self.grants.charge(server, n) {
                return Some(epoch);
            }
            if !st.inflight.iter().any(|f| f.server == server) {
                return None;
            }
            self.reap_one(st);
        }
    }

    /// Charge `n` bytes to the grant of `server` only if it is still session `epoch`'s
    /// (a staged run is charged to one session).
    fn charge_to(&self, server: ServerIndex, n: u64, epoch: u64) -> bool {
        if n == 0 {
            return true;
        }
        match self.grants.charge(server, n) {
            Some(e) if e == epoch => true,
            Some(e) => {
                // Another session's grant: put it back, the run goes out first.
                self.grants.credit(server, e, n);
                false
            }
            None => false,
        }
    }

    /// Send a write the grant does not cover and wait for it: the server stores it,
    /// or the part of it that fits (the count returned), or refuses it (ENOSPC). Its
    /// reply tops the grant up, so the writes after it go behind again.
    fn write_waited(
        &self,
        st: &mut State,
        layout: &Layout,
        offset: u64,
        bytes: &[u8],
    ) -> Result<usize, Errno> {
        let end = offset + bytes.len() as u64;
        while st.inflight.iter().any(|f| f.offset < end && offset < f.end) {
            self.reap_one(st);
        }
        let server = layout.server_of(layout.locate(offset).0);
        // What is left of the grant pays for a part; the server fits the rest.
        let (epoch, charged) = self
            .grants
            .charge_upto(server, bytes.len() as u64)
            .unwrap_or((0, 0));
        let charge = Charge {
            epoch,
            bytes: charged as u32,
        };
        tracing::debug!(ino = %self.ino, offset, len = bytes.len(), charged, "write not covered by the grant: waited for");
        let reply = self
            .inst
            .write_piece(layout, self.ino, offset, bytes, charge)?;
        self.grants.credit(server, reply.grant_epoch, reply.granted);
        let n = (reply.written as usize).min(bytes.len());
        if n == 0 {
            return Err(Errno::ENOSPC);
        }
        st.acked_end = st.acked_end.max(offset + n as u64);
        st.size_stale = true;
        merge_servers(&mut st.unsynced, &[server]);
        Ok(n)
    }

    /// An empty buffer for a write of up to a chunk to `server`: a slot of the
    /// client's arena when that server is on this host (the bytes are then copied
    /// once, here, on their way to its disk), else a heap buffer with room for `want`
    /// bytes, reused when one is spare.
    fn buffer(&self, st: &mut State, server: ServerIndex, want: usize) -> Payload {
        if let Some(p) = self.inst.arena_payload(server, self.chunk.max(want)) {
            return p;
        }
        let mut b = st.spare.pop().unwrap_or_default();
        b.clear();
        b.reserve(want);
        Payload::Heap(b)
    }

    /// Send the staged run: behind (queued, the caller goes on) or, with `wait`,
    /// sent at once because the caller waits for it next (`push`).
    fn send_staged(
        &self,
        st: &mut State,
        layout: &Layout,
        sync: bool,
        wait: bool,
    ) -> Result<(), Errno> {
        match st.staged.take() {
            Some(s) => self.send(st, layout, s.offset, s.data, Pace { sync, wait }, s.epoch),
            None => Ok(()),
        }
    }

    /// Send one write RPC (within one stripe), all of it charged to the grant of
    /// session `epoch`, first waiting for whatever overlaps it and, past the budget,
    /// for the oldest writes.
    fn send(
        &self,
        st: &mut State,
        layout: &Layout,
        offset: u64,
        data: Payload,
        pace: Pace,
        epoch: u64,
    ) -> Result<(), Errno> {
        let Pace { sync, wait } = pace;
        let end = offset + data.len() as u64;
        while st.inflight.iter().any(|f| f.offset < end && offset < f.end) {
            self.reap_one(st);
        }
        while !st.inflight.is_empty()
            && (st.inflight_bytes + data.len() > self.budget
                || st.inflight.len() >= self.max_inflight)
        {
            self.reap_one(st);
        }
        let server = layout.server_of(layout.locate(offset).0);
        let len = data.len();
        let charge = Charge {
            epoch,
            bytes: len as u32,
        };
        let call = if sync || wait {
            self.inst
                .start_write_piece(layout, self.ino, offset, data, sync, charge)?
        } else {
            self.inst
                .queue_write_piece(layout, self.ino, offset, data, charge)?
        };
        st.inflight_bytes += len;
        st.size_stale = true;
        st.inflight.push_back(InFlight {
            offset,
            end,
            len,
            server,
            sync,
            call,
        });
        Ok(())
    }

    /// Wait for the oldest write in flight; remember its server (to be synced) or its
    /// error (to be reported).
    fn reap_one(&self, st: &mut State) {
        let Some(f) = st.inflight.pop_front() else {
            return;
        };
        let (result, buf) = f.call.wait();
        let len = f.len;
        st.inflight_bytes -= len;
        // Heap buffers are kept for the next writes; an arena slot goes back to the
        // arena (dropped), for any file's use.
        if let Payload::Heap(buf) = buf {
            if st.spare.len() < SPARE_BUFFERS && buf.capacity() >= self.chunk {
                st.spare.push(buf);
            }
        }
        match result {
            Ok(r) => {
                self.grants.credit(f.server, r.grant_epoch, r.granted);
                let n = (r.written as usize).min(len);
                if n > 0 {
                    st.acked_end = st.acked_end.max(f.offset + n as u64);
                    if !f.sync || n < len {
                        merge_servers(&mut st.unsynced, &[f.server]);
                    }
                }
                if n < len {
                    // Only a resend charged to a grant that died with its connection
                    // can find the fragment full.
                    self.lost(st, f.offset + n as u64, Errno::ENOSPC);
                }
            }
            Err(e) => self.lost(st, f.offset, e),
        }
    }

    /// A write behind failed from byte `at`: remember the error for the caller's next
    /// write, flush or fsync, take the file's end back to what the servers hold (or
    /// what is still on its way to them), and have the kernel drop what it cached of
    /// the file, so that the writer reads the same bytes as everyone else.
    fn lost(&self, st: &mut State, at: u64, e: Errno) {
        tracing::warn!(ino = %self.ino, at, "write-behind failed: {e}");
        st.error.get_or_insert(e);
        let pending = st
            .inflight
            .iter()
            .map(|f| f.end)
            .chain(st.staged.as_ref().map(Staged::end))
            .max()
            .unwrap_or(0);
        let end = st.acked_end.max(pending);
        self.set_end(st, end);
        (self.lost)(self.ino);
    }

    fn reap_all(&self, st: &mut State) {
        while !st.inflight.is_empty() {
            self.reap_one(st);
        }
    }

    /// Write everything to the servers and tell the home the new size, so that
    /// another client opening the file afterwards sees it (close-to-open). Returns the
    /// home's attributes when it was told something.
    pub fn flush(&self) -> Result<Option<ExtendSizeReply>, Errno> {
        self.push(false)
    }

    /// `flush`, and make the file's data and metadata durable on every server.
    pub fn fsync(&self) -> Result<Option<ExtendSizeReply>, Errno> {
        self.push(true)
    }

    /// Collect the writes in flight, then one round of requests, all in flight at
    /// once: the staged run to its server (fdatasync'ed there when `durable`), an
    /// fdatasync on the other servers holding unsynced data of the file, and the new
    /// size and mtime to the home (its log synced when `durable`). A small write +
    /// fsync costs one round trip.
    fn push(&self, durable: bool) -> Result<Option<ExtendSizeReply>, Errno> {
        let mut st = self.lock();
        let st = &mut *st;
        // Every write sent before must be answered first: a sync must not overtake
        // the writes it is meant to cover.
        self.reap_all(st);
        if let Some(e) = st.error.take() {
            return Err(e);
        }
        let layout = self.layout();
        let staged_server = st
            .staged
            .as_ref()
            .map(|s| layout.server_of(layout.locate(s.offset).0));
        // What the servers acknowledged, and the last run, which goes out beside the
        // size: it is charged to a grant, so only a broken connection or an I/O error
        // can still lose it (then the size is cut back below).
        let end = st.acked_end.max(st.staged.as_ref().map_or(0, Staged::end));
        let wrote = staged_server.is_some() || st.size_stale;
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

        let size_call = tell_home.then(|| {
            self.inst
                .start_extend_size(self.ino, end, wrote, meta_durable)
        });
        let older: Vec<ServerIndex> = unsynced
            .iter()
            .copied()
            .filter(|s| Some(*s) != staged_server)
            .collect();
        let sync_calls = self.inst.start_sync_data(self.ino, &older);
        let sent = self.send_staged(st, &layout, durable, true);
        // The size call above covers this last run too.
        st.size_stale = false;
        self.reap_all(st);
        let synced =
            sync_calls.and_then(|calls| calls.into_iter().try_for_each(|c| c.wait().map(|_| ())));
        let size_reply = size_call.map(|c| c.and_then(|c| c.wait()));

        // Whatever failed is remembered for the next push, never forgotten.
        let written = sent.and_then(|()| st.error.take().map_or(Ok(()), Err));
        if synced.is_err() || written.is_err() {
            merge_servers(&mut st.unsynced, &unsynced);
        }
        if written.is_err() {
            if let Some(Ok(a)) = &size_reply {
                self.cut_back(st, end, a.attr.size);
            }
        }
        let attr = match size_reply {
            None => None,
            Some(Ok(a)) => {
                if meta_durable {
                    st.durable_size = Some(end);
                }
                // The other mounts holding the file open drop what they cached of it
                // before this close or fsync returns (docs/data-plane.md,
                // "Consistency").
                self.inst.await_notices(self.ino, &a);
                Some(a)
            }
            Some(Err(e)) => {
                st.size_stale |= wrote;
                st.durable_size = None;
                written?;
                return Err(e);
            }
        };
        written?;
        synced?;
        Ok(attr)
    }

    /// The home was told size `told` (and now holds `now`) beside a last run that was
    /// lost: if that set the size past what the servers hold, cut it back. Not when
    /// the home's size is another's (it already held more than we told).
    fn cut_back(&self, st: &mut State, told: u64, now: u64) {
        if now != told || told <= st.acked_end {
            return;
        }
        let mut req = SetAttrReq::of(self.ino);
        req.valid = setattr::SIZE;
        req.size = st.acked_end;
        match self.inst.setattr(req) {
            Ok(_) => st.durable_size = None,
            Err(e) => {
                tracing::error!(ino = %self.ino, "cannot cut the size back to {}: {e}", st.acked_end);
            }
        }
        (self.lost)(self.ino);
    }

    /// The file's stripe geometry changed (it had no data yet).
    pub fn relayout(&self, attr: &Attr) {
        *self.layout.lock().unwrap_or_else(|e| e.into_inner()) = self.inst.layout(attr);
    }

    /// The file was truncated to `size` (after a flush): forget what lay beyond.
    pub fn truncated(&self, size: u64) {
        let mut st = self.lock();
        st.acked_end = size;
        self.set_end(&mut st, size);
        st.durable_size = None;
    }

    /// Someone else's size is now authoritative (after open found the file changed).
    /// Never waits: if an operation holds the file, its own end stands.
    pub fn reset_end(&self, size: u64) {
        if let Ok(mut st) = self.st.try_lock() {
            if st.staged.is_none() && st.inflight.is_empty() {
                st.acked_end = size;
                self.set_end(&mut st, size);
            }
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
