//! `O_DIRECT` writes into stripe files: the block-aligned bulk of a write goes from an
//! aligned buffer to the disk by DMA, skipping the page cache. A buffered write copies
//! every byte into a page-cache folio (perf of a streaming client: the servers' largest
//! cost, ahead of the FUSE and socket copies together) and leaves it dirty for the
//! kernel to write back later, at the fsync or `sync` that makes it durable; a direct
//! write is on the device when it returns, so the stream is durable as it goes and
//! the page cache keeps room for what is read. Unaligned heads and tails, and small
//! writes, stay buffered (the kernel flushes and drops cached pages a direct write
//! overlaps, so the two kinds mix coherently). A file system that refuses `O_DIRECT`
//! (tmpfs: EINVAL) is remembered, and every write then goes the buffered way.

use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

/// Offsets, lengths and buffers of `O_DIRECT` writes are multiples of this (the
/// largest logical block size of common devices; stripe sizes are multiples of it).
pub(super) const DIRECT_ALIGN: u64 = 4096;

/// Bytes moved per read/write of a direct copy (the aligned buffer's size).
const CHUNK: usize = 8 << 20;

/// When writes go direct: those of at least `min` bytes (0: never), while the file
/// system has not refused direct I/O.
pub(super) struct DirectWrites {
    min: u64,
    refused: AtomicBool,
    /// Turned off for the fragment (a cache: what is written is read again soon by
    /// write-behind, from the page cache rather than the device).
    off: AtomicBool,
}

impl DirectWrites {
    pub(super) fn new(min: u64) -> DirectWrites {
        DirectWrites {
            min,
            refused: AtomicBool::new(false),
            off: AtomicBool::new(false),
        }
    }

    /// Every write goes through the page cache from now on.
    pub(super) fn turn_off(&self) {
        self.off.store(true, Ordering::Relaxed);
    }

    /// How many leading bytes of a write of `len` at `offset` go direct: whole blocks,
    /// for an aligned write of at least `min` bytes; else 0.
    pub(super) fn part(&self, offset: u64, len: usize) -> usize {
        let len64 = len as u64;
        if self.min == 0
            || len64 < self.min.max(DIRECT_ALIGN)
            || !offset.is_multiple_of(DIRECT_ALIGN)
            || self.refused.load(Ordering::Relaxed)
            || self.off.load(Ordering::Relaxed)
        {
            return 0;
        }
        len - (len64 % DIRECT_ALIGN) as usize
    }

    /// The file system refused direct I/O (EINVAL at open or write): from now on every
    /// write is buffered. Logged once.
    pub(super) fn refuse(&self, why: &std::io::Error) {
        if !self.refused.swap(true, Ordering::Relaxed) {
            tracing::info!("direct writes refused by the file system ({why}): writes go through the page cache");
        }
    }
}

/// Write `data` (whole blocks) at `off` (aligned) of `direct` (opened with
/// `O_DIRECT`), through this thread's aligned buffer. Returns the bytes written: all of
/// them, or fewer (a multiple of the block) when the file system refused a direct
/// write (EINVAL, also returned as `Refused`) so the caller writes the rest buffered.
pub(super) fn write_direct(direct: &File, off: u64, data: &[u8]) -> Result<usize, DirectError> {
    // Bulk data received over the wire is block-aligned in memory already
    // (spillway_wire::frame::read_frame): written from where it lies, no copy.
    if (data.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN as usize) {
        return write_all_direct(direct, off, data);
    }
    with_buffer(|buf| {
        let mut done = 0usize;
        while done < data.len() {
            let n = (data.len() - done).min(buf.len());
            buf[..n].copy_from_slice(&data[done..done + n]);
            match write_all_direct(direct, off + done as u64, &buf[..n]) {
                Ok(_) => done += n,
                Err(DirectError::Refused(k, e)) => return Err(DirectError::Refused(done + k, e)),
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    })
    .map_err(DirectError::Io)?
}

/// Write all of `data` (aligned in memory, whole blocks) at `off` of `direct`.
fn write_all_direct(direct: &File, off: u64, data: &[u8]) -> Result<usize, DirectError> {
    let mut put = 0;
    while put < data.len() {
        match direct.write_at(&data[put..], off + put as u64) {
            Ok(0) => return Err(DirectError::Io(ErrorKind::WriteZero.into())),
            Ok(k) => put += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return Err(DirectError::Refused(put - put % DIRECT_ALIGN as usize, e))
            }
            Err(e) => return Err(DirectError::Io(e)),
        }
    }
    Ok(put)
}

/// Why a direct write stopped.
pub(super) enum DirectError {
    /// The file system refused direct I/O after this many bytes were written.
    Refused(usize, std::io::Error),
    Io(std::io::Error),
}

/// Run `f` with this thread's aligned buffer of CHUNK bytes, kept across calls: a fresh
/// 8 MiB allocation per piece cost a page fault and a zeroed page for every 4 KiB
/// copied (perf of a 4 GiB stage-out).
fn with_buffer<T>(f: impl FnOnce(&mut [u8]) -> T) -> std::io::Result<T> {
    thread_local! {
        static BUF: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
    }
    BUF.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(AlignedBuf::new(CHUNK)?);
        }
        match slot.as_mut() {
            Some(b) => Ok(f(b.as_mut())),
            None => Err(std::io::Error::new(
                ErrorKind::OutOfMemory,
                "aligned buffer",
            )),
        }
    })
}

/// A heap buffer aligned for `O_DIRECT`.
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> std::io::Result<AlignedBuf> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), DIRECT_ALIGN as usize)
            .map_err(|e| std::io::Error::new(ErrorKind::InvalidInput, e))?;
        // Zeroed, so the slice handed out is initialised memory; for a buffer this
        // size the allocator maps fresh zero pages, touched only as they are used.
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw)
            .ok_or_else(|| std::io::Error::new(ErrorKind::OutOfMemory, "aligned buffer"))?;
        Ok(AlignedBuf { ptr, layout })
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr points at layout.size() initialised (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in new with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Copy `len` bytes (a multiple of DIRECT_ALIGN) from `src` at `src_off` to `direct`
/// (opened with O_DIRECT) at `dst_off` (aligned), in CHUNK pieces. Returns the
/// bytes written: fewer than `len` when `src` ends early (the caller copies the rest
/// the buffered way and checks the total) or when the file system refuses direct
/// writes here (EINVAL: then everything from there on goes the buffered way).
pub(super) fn copy_direct(
    src: &File,
    src_off: u64,
    direct: &File,
    dst_off: u64,
    len: u64,
) -> std::io::Result<u64> {
    if len == 0 {
        return Ok(0);
    }
    with_buffer(|buf| copy_direct_with(src, src_off, direct, dst_off, len, buf))?
}

fn copy_direct_with(
    src: &File,
    src_off: u64,
    direct: &File,
    dst_off: u64,
    len: u64,
    buf: &mut [u8],
) -> std::io::Result<u64> {
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(buf.len() as u64) as usize;
        let mut got = 0;
        while got < want {
            match src.read_at(&mut buf[got..want], src_off + done + got as u64) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        // Only whole blocks go direct; a short read leaves the rest to the caller.
        let whole = got - got % DIRECT_ALIGN as usize;
        let mut put = 0;
        while put < whole {
            match direct.write_at(&buf[put..whole], dst_off + done + put as u64) {
                Ok(0) => return Ok(done + put as u64),
                Ok(k) => put += k,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(done + put as u64),
                Err(e) => return Err(e),
            }
        }
        done += whole as u64;
        if whole < want {
            return Ok(done);
        }
    }
    Ok(done)
}
