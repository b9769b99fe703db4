//! Shared-memory bulk: a client and a server on the same host move a request's bulk
//! bytes through memory both map, instead of through the TCP connection
//! (docs/wire-protocol.md, "Shared-memory bulk").
//!
//! Over loopback TCP every byte of a write is copied four times on its way to the
//! server's disk: into the client's write-behind buffer, into the socket, out of it
//! into the server's frame, and (with O_DIRECT) not again. The same bytes placed in an
//! *arena* (a sealed memfd the client creates and hands to the server) are copied once,
//! into the arena, and the server's O_DIRECT write takes them from there. Requests and
//! replies still travel on the TCP connection, which keeps its multiplexing, deadlines
//! and reconnects; only their bulk moves.
//!
//! * `mod.rs`   — the client's arena: a memfd cut into slots, and `Payload`, the bytes
//!   of a request that live either on the heap or in a slot.
//! * `shared`   — creating, sealing, checking and mapping the memfd.
//! * `door`     — how a connection gets its arena: the server's door (an abstract Unix
//!   socket), the client's attach, and the client's `ArenaLink`, which knows when the
//!   server can no longer touch a slot.
//! * `host`     — what "the same host" means: one kernel boot and one network namespace.

pub(crate) mod door;
pub(crate) mod host;
pub(crate) mod shared;

pub use door::{ArenaLink, ArenaSlice};

use shared::Mapping;
use std::ops::{Deref, DerefMut};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

/// The client's arena: one sealed memfd, mapped, cut into equal slots. Each slot is
/// aligned to the page (so the server can write from it with O_DIRECT) and holds one
/// request's bulk.
pub struct Arena {
    fd: OwnedFd,
    map: Mapping,
    slot: usize,
    /// Free slots, most recently freed last: reuse keeps few slots' pages touched.
    free: Mutex<Vec<u32>>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("size", &self.map.len())
            .field("slot", &self.slot)
            .finish()
    }
}

impl Arena {
    /// An arena of `size` bytes (rounded down to whole slots) in slots of `slot` bytes
    /// (rounded up to the page). Err where memfds cannot be made or sealed.
    pub fn create(size: usize, slot: usize) -> std::io::Result<Arc<Arena>> {
        let page = shared::page_size();
        let slot = slot.max(page).div_ceil(page) * page;
        let slots = (size / slot).min(u32::MAX as usize);
        if slots == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "arena smaller than one slot",
            ));
        }
        let (fd, map) = shared::create_sealed(slots * slot)?;
        Ok(Arc::new(Arena {
            fd,
            map,
            slot,
            free: Mutex::new((0..slots as u32).rev().collect()),
        }))
    }

    /// The most bytes one slot holds.
    pub fn slot_size(&self) -> usize {
        self.slot
    }

    pub fn size(&self) -> usize {
        self.map.len()
    }

    /// A free slot, empty; None when every slot is in use (the caller uses the heap).
    pub fn take(self: &Arc<Self>) -> Option<ArenaBuf> {
        let index = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
        Some(ArenaBuf {
            arena: self.clone(),
            index,
            len: 0,
        })
    }

    /// Slots free now (tests).
    pub fn free_slots(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

/// One slot of an arena, owned: returned to the arena when dropped. Only its owner
/// writes it; once sent, the owner keeps it (inside the call) until the server can no
/// longer read or write it (`ArenaLink`).
pub struct ArenaBuf {
    arena: Arc<Arena>,
    index: u32,
    len: usize,
}

impl ArenaBuf {
    /// Where the slot starts in the arena (what a request names).
    pub fn offset(&self) -> u64 {
        u64::from(self.index) * self.arena.slot as u64
    }

    pub fn capacity(&self) -> usize {
        self.arena.slot
    }

    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    fn base(&self) -> *mut u8 {
        // In bounds: index < slots, and the mapping holds slots * slot bytes.
        self.arena
            .map
            .ptr()
            .wrapping_add(self.index as usize * self.arena.slot)
    }

    /// Set the length to `n` (at most the capacity); bytes not written before read as
    /// whatever the slot last held (a read reply fills them first).
    pub fn set_len(&mut self, n: usize) {
        self.len = n.min(self.arena.slot);
    }

    /// The whole slot, for a reply to be written into (`set_len` afterwards).
    pub fn spare_mut(&mut self) -> &mut [u8] {
        // SAFETY: the slot is this buffer's alone in this process (taken from the free
        // list, returned on drop) and lies within the mapping, which lives as long as
        // the arena this buffer holds.
        unsafe { std::slice::from_raw_parts_mut(self.base(), self.arena.slot) }
    }
}

impl Deref for ArenaBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: as `spare_mut`; len <= slot.
        unsafe { std::slice::from_raw_parts(self.base(), self.len) }
    }
}

impl DerefMut for ArenaBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `spare_mut`; len <= slot.
        unsafe { std::slice::from_raw_parts_mut(self.base(), self.len) }
    }
}

impl Drop for ArenaBuf {
    fn drop(&mut self) {
        self.arena
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.index);
    }
}

/// The bulk bytes of a request: on the heap, or in a slot of an arena (sent through
/// shared memory when the connection has that arena, through the socket otherwise).
pub enum Payload {
    Heap(Vec<u8>),
    Arena(ArenaBuf),
}

impl Default for Payload {
    fn default() -> Payload {
        Payload::Heap(Vec::new())
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Payload {
        Payload::Heap(v)
    }
}

impl Payload {
    pub fn clear(&mut self) {
        match self {
            Payload::Heap(v) => v.clear(),
            Payload::Arena(b) => b.len = 0,
        }
    }

    /// Append `bytes`. A slot that cannot hold them moves to the heap first (callers
    /// size their writes to the slot, so this is the exception).
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        let moved = match &*self {
            Payload::Arena(b) if bytes.len() > b.capacity() - b.len => {
                let mut v = Vec::with_capacity(b.len + bytes.len());
                v.extend_from_slice(b);
                Some(v)
            }
            _ => None,
        };
        if let Some(v) = moved {
            *self = Payload::Heap(v);
        }
        match self {
            Payload::Heap(v) => v.extend_from_slice(bytes),
            Payload::Arena(b) => {
                let at = b.len;
                b.spare_mut()[at..at + bytes.len()].copy_from_slice(bytes);
                b.len = at + bytes.len();
            }
        }
    }

    /// Grow to `n` bytes with zeros (a read's hole); never shrinks.
    pub fn zero_fill_to(&mut self, n: usize) {
        if let Payload::Arena(b) = self {
            if n <= b.capacity() {
                let at = b.len.min(n);
                b.spare_mut()[at..n].fill(0);
                b.len = b.len.max(n);
                return;
            }
        }
        if self.len() < n {
            if let Payload::Arena(b) = self {
                // Past the slot: the bytes move to the heap.
                let v = b.to_vec();
                *self = Payload::Heap(v);
            }
            if let Payload::Heap(v) = self {
                v.resize(n, 0);
            }
        }
    }

    /// The slot, when the bytes live in one.
    pub fn arena_buf(&self) -> Option<&ArenaBuf> {
        match self {
            Payload::Arena(b) => Some(b),
            Payload::Heap(_) => None,
        }
    }

    pub fn is_arena(&self) -> bool {
        matches!(self, Payload::Arena(_))
    }
}

impl Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Payload::Heap(v) => v,
            Payload::Arena(b) => b,
        }
    }
}

impl DerefMut for Payload {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Payload::Heap(v) => v,
            Payload::Arena(b) => b,
        }
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn slots_are_page_aligned_reused_and_returned_on_drop() {
        let a = Arena::create(4 << 20, 1 << 20).unwrap();
        assert_eq!(a.free_slots(), 4);
        let mut bufs: Vec<ArenaBuf> = (0..4).map(|_| a.take().unwrap()).collect();
        assert!(a.take().is_none(), "all four in use");
        for b in &bufs {
            assert_eq!(b.offset() % shared::page_size() as u64, 0);
            assert_eq!(b.as_ptr() as usize % shared::page_size(), 0);
        }
        let mut offsets: Vec<u64> = bufs.iter().map(ArenaBuf::offset).collect();
        offsets.sort();
        offsets.dedup();
        assert_eq!(offsets.len(), 4, "distinct slots");
        bufs.pop();
        assert_eq!(a.free_slots(), 1);
        drop(bufs);
        assert_eq!(a.free_slots(), 4);
    }

    #[test]
    fn a_payload_keeps_its_bytes_and_moves_to_the_heap_only_when_the_slot_is_full() {
        let a = Arena::create(2 << 20, 1 << 20).unwrap();
        let mut p = Payload::Arena(a.take().unwrap());
        p.extend_from_slice(b"hello ");
        p.extend_from_slice(b"world");
        assert_eq!(&*p, b"hello world");
        assert!(p.is_arena());
        p[0] = b'H';
        assert_eq!(&p[..5], b"Hello");
        p.clear();
        p.extend_from_slice(&vec![7u8; 1 << 20]);
        assert!(p.is_arena(), "exactly a slot");
        p.extend_from_slice(b"!");
        assert!(!p.is_arena(), "past the slot: on the heap");
        assert_eq!(p.len(), (1 << 20) + 1);
        assert_eq!(p[1 << 20], b'!');
        assert_eq!(a.free_slots(), 2, "the slot went back when the bytes moved");
        let mut q = Payload::Arena(a.take().unwrap());
        q.extend_from_slice(&[9u8; 10]);
        q.zero_fill_to(4096);
        assert_eq!(q.len(), 4096);
        assert!(q[..10].iter().all(|&x| x == 9) && q[10..].iter().all(|&x| x == 0));
        q.zero_fill_to(5);
        assert_eq!(q.len(), 4096, "never shrinks");
    }
}
