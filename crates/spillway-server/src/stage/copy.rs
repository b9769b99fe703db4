//! One server's share of one file: the parts of its stripes inside a byte range,
//! copied between its fragment and the PFS file, as the owner (`StageStripesReq`).
//!
//! The PFS file is opened here again, as the owner and beneath the roots, and must be
//! the very file the coordinator opened (same inode number): a file swapped in between
//! is refused with ESTALE. A source that ends before the size it had when the
//! coordinator opened it fails with EIO (a short copy is never success). Durability
//! comes after, for many files at once (`sync`): the coordinator counts no file
//! complete before every server has synced what it wrote.

use super::pfs::fstat;
use crate::error::{fs, StoreError, StoreResult};
use crate::fragment::Fragment;
use spillway_placement::Layout;
use spillway_types::Errno;
use spillway_wire::{StageDir, StageStripesReply, StageStripesReq, StageSyncReq};
use std::path::Path;
use std::sync::atomic::Ordering;

/// `DataStore::fill_from`'s `direct` for the stripes of a file copied range by range:
/// written with O_DIRECT, as nothing reads them soon.
const DIRECT: bool = true;

/// The pieces of the file in `[from, to)` that lie in stripes of server `me`:
/// (stripe, offset within the stripe, length, offset in the file).
pub(crate) fn my_pieces(
    layout: &Layout,
    me: u16,
    size: u64,
    from: u64,
    to: u64,
) -> Vec<(u64, u32, u32, u64)> {
    let ss = u64::from(layout.stripe_size);
    let to = to.min(size);
    if from >= to {
        return Vec::new();
    }
    // Which position in the rotation is ours (at most one: width <= servers).
    let Some(pos) = (0..layout.width).find(|&k| {
        layout
            .server_of(spillway_types::StripeIndex(u64::from(k)))
            .0
            == me
    }) else {
        return Vec::new();
    };
    let w = u64::from(layout.width);
    let first = from / ss;
    // First stripe >= `first` with k % w == pos.
    let mut k = first + (u64::from(pos) + w - first % w) % w;
    let mut out = Vec::new();
    while k * ss < to {
        let start = (k * ss).max(from);
        let end = ((k + 1) * ss).min(to);
        out.push((k, (start - k * ss) as u32, (end - start) as u32, start));
        k += w;
    }
    out
}

pub(crate) fn stripes(f: &Fragment, r: &StageStripesReq) -> StoreResult<StageStripesReply> {
    // The ticket first: a request without a valid one learns nothing else.
    let grant = super::ticket::check(f, &r.ticket, None, r.direction, "StageStripes")
        .map_err(|e| fs(Errno(e.errno)))?;
    if r.stripe_size == 0 || !r.stripe_size.is_multiple_of(4096) || r.from > r.to {
        return Err(fs(Errno::EINVAL));
    }
    // Every stripe is ours in a load-balanced instance (fragment/replicas.rs).
    let layout = f.layout(r.ino, r.stripe_size, r.stripe_width);
    let pieces = my_pieces(&layout, f.index().0, r.size, r.from, r.to);
    if pieces.is_empty() {
        return Ok(StageStripesReply { bytes: 0 });
    }
    let pfs = grant.pfs;
    let flags = if r.direction == StageDir::In {
        libc::O_RDONLY
    } else {
        libc::O_WRONLY
    };
    let file = pfs.open(&r.pfs_path, flags, 0).map_err(|e| {
        tracing::info!(ino = %r.ino, "stage: {}", e.message);
        fs(Errno(e.errno))
    })?;
    let st = fstat(&file).map_err(|e| fs(Errno(e)))?;
    if st.ino != r.pfs_ino || !st.is_file() {
        tracing::info!(ino = %r.ino, "stage: {} was replaced during the stage", r.pfs_path);
        return Err(fs(Errno::ESTALE));
    }
    // Stage-out: the same file again with O_DIRECT for the block-aligned bulk of each
    // piece (DataStore::drain_to says why); None where the PFS does not do direct I/O.
    let mut direct = None;
    if r.direction == StageDir::Out {
        for &(k, _, len, _) in &pieces {
            f.data.will_read(r.ino, k, u64::from(len));
        }
        direct = pfs
            .open(&r.pfs_path, libc::O_WRONLY | libc::O_DIRECT, 0)
            .ok()
            .filter(|d| fstat(d).is_ok_and(|s| s.ino == r.pfs_ino));
    } else {
        // Ask for all of this range's pieces now: the reads queue at the disk together
        // instead of readahead starting small again at every stripe boundary (this
        // server's stripes are strided through the file).
        for &(_, _, len, at) in &pieces {
            // SAFETY: the descriptor is open; the call only starts readahead.
            unsafe {
                libc::posix_fadvise(
                    std::os::fd::AsRawFd::as_raw_fd(&file),
                    at as libc::off_t,
                    libc::off_t::from(len),
                    libc::POSIX_FADV_WILLNEED,
                )
            };
        }
    }
    let mut covered = 0u64;
    let mut moved = 0u64;
    for &(k, within, len, at) in &pieces {
        if r.direction == StageDir::In {
            let n = f.data.fill_from(r.ino, k, within, len, &file, at, DIRECT)?;
            if n != u64::from(len) {
                tracing::info!(
                    ino = %r.ino,
                    "stage: {} ended at byte {} but held {} when the stage opened it",
                    r.pfs_path,
                    at + n,
                    r.size
                );
                return Err(fs(Errno::EIO));
            }
            moved += n;
        } else {
            // Only whole-stripe-from-the-start pieces exist when `from` is stripe
            // aligned, which the coordinator guarantees; a hole past the stored end
            // is already zeros in the PFS file (the coordinator set its size).
            if within != 0 {
                return Err(fs(Errno::EINVAL));
            }
            moved += f
                .data
                .drain_to(r.ino, k, u64::from(len), &file, direct.as_ref(), at)?;
        }
        covered += u64::from(len);
    }
    if r.direction == StageDir::In {
        f.stats.stage_bytes_read.fetch_add(moved, Ordering::Relaxed);
    } else {
        f.stats
            .stage_bytes_written
            .fetch_add(moved, Ordering::Relaxed);
    }
    Ok(StageStripesReply { bytes: covered })
}

/// StageSync: everything written so far reaches the disk. `syncfs` rather than one
/// fdatasync per file: a group of 64 small files costs one journal commit instead of
/// 64 (it also flushes whatever else is dirty on that file system, which is only
/// ever more durability than asked for). Stage-out syncs this server's own PFS roots.
pub(crate) fn sync(f: &Fragment, r: &StageSyncReq) -> StoreResult<()> {
    super::ticket::check(f, &r.ticket, None, r.direction, "StageSync")
        .map_err(|e| fs(Errno(e.errno)))?;
    if r.direction == StageDir::In {
        return syncfs(f.dir()).map_err(StoreError::Io);
    }
    for root in &f.pfs_roots {
        syncfs(Path::new(root)).map_err(|e| {
            tracing::warn!("stage: syncfs of PFS root {root}: {e}");
            StoreError::Io(e)
        })?;
    }
    Ok(())
}

fn syncfs(dir: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let d = std::fs::File::open(dir)?;
    // SAFETY: d is an open descriptor for the call.
    if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_types::{InodeNo, StripeIndex};

    #[test]
    fn pieces_cover_the_range_once_over_all_servers() {
        for n in 1..=4u16 {
            for width in 1..=n {
                let ino = InodeNo(0x0001_0000_0000_0042);
                let l = Layout::of(ino, 4096, width, n);
                for &(size, from, to) in &[
                    (0u64, 0u64, 0u64),
                    (1, 0, 1),
                    (4096 * 10 + 7, 0, u64::MAX),
                    (4096 * 10 + 7, 4096 * 3, 4096 * 7),
                    (4096 * 10 + 7, 4096 * 9, 4096 * 11),
                ] {
                    let mut seen = vec![0u8; size.min(to) as usize];
                    for me in 0..n {
                        for (k, within, len, at) in my_pieces(&l, me, size, from, to) {
                            assert_eq!(l.server_of(StripeIndex(k)).0, me);
                            assert_eq!(at, k * 4096 + u64::from(within));
                            for b in at..at + u64::from(len) {
                                seen[b as usize] += 1;
                            }
                        }
                    }
                    for (b, c) in seen.iter().enumerate() {
                        let inside = (b as u64) >= from && (b as u64) < to.min(size);
                        assert_eq!(*c, u8::from(inside), "n {n} width {width} byte {b}");
                    }
                }
            }
        }
    }
}
