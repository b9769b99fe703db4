//! Sparse-file calls: fallocate and SEEK_DATA/SEEK_HOLE spread over the servers a file's
//! range touches, and the range splitting both sides share. A range is sent to each
//! server whole (offset, length, geometry), not as a list of stripes: a 1 TiB range of
//! 64 KiB stripes is 16 million pieces, and each server walks only its own
//! (`server_pieces`), so a request stays a few dozen bytes whatever the range.

use crate::Instance;
use spillway_placement::Layout;
use spillway_types::{Errno, InodeNo, ServerIndex};
use spillway_wire::messages::{FallocateDataReq, SeekDataReq};

/// One stripe's share of a byte range: (stripe, offset within it, length).
pub type Piece = (u64, u32, u32);

/// The servers holding at least one stripe of `[offset, offset+len)`, in stripe order.
pub fn servers_in_range(layout: &Layout, offset: u64, len: u64) -> Vec<ServerIndex> {
    let ss = u64::from(layout.stripe_size);
    if len == 0 {
        return Vec::new();
    }
    let first = offset / ss;
    let last = offset.saturating_add(len - 1) / ss;
    let n = (last - first + 1).min(u64::from(layout.width));
    (first..first + n)
        .map(|k| layout.server_of(spillway_types::StripeIndex(k)))
        .collect()
}

/// The pieces of `[offset, offset+len)` that lie in stripes of `server`, in order. Only
/// that server's stripes are visited: every `width`-th one from the first.
pub fn server_pieces(
    layout: &Layout,
    server: ServerIndex,
    offset: u64,
    len: u64,
) -> impl Iterator<Item = Piece> + '_ {
    let ss = u64::from(layout.stripe_size);
    let width = u64::from(layout.width);
    let end = offset.saturating_add(len);
    let first = offset / ss;
    let last = if len == 0 { first } else { (end - 1) / ss + 1 };
    // The residue (stripe mod width) this server holds, if it holds any.
    let residue =
        (0..width).find(|&r| layout.server_of(spillway_types::StripeIndex(first + r)) == server);
    let start = residue.map_or(last, |r| first + r);
    (start..last)
        .step_by(width.max(1) as usize)
        .filter(move |_| len > 0)
        .map(move |k| {
            let s0 = k * ss;
            let from = offset.max(s0);
            let to = end.min(s0 + ss);
            (k, (from - s0) as u32, (to - from) as u32)
        })
}

impl Instance {
    /// Apply a fallocate request to every server holding stripes of the range, all in
    /// flight at once; the first error wins (every call is waited for).
    #[allow(clippy::too_many_arguments)]
    pub fn fallocate_data(
        &self,
        layout: &Layout,
        ino: InodeNo,
        offset: u64,
        len: u64,
        mode: u8,
        check: bool,
    ) -> Result<(), Errno> {
        let req = FallocateDataReq {
            ino,
            stripe_size: layout.stripe_size,
            stripe_width: layout.width,
            offset,
            len,
            mode,
            check,
        };
        let servers = servers_in_range(layout, offset, len);
        let mut calls = Vec::with_capacity(servers.len());
        for s in servers {
            calls.push(self.server(s)?.start(&req, &[]));
        }
        let mut first = None;
        for c in calls {
            if let Err(e) = c.wait() {
                // ENOSPC is the answer that matters most to the caller.
                if first.is_none() || e == Errno::ENOSPC {
                    first = Some(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// SEEK_DATA (`hole` false) or SEEK_HOLE from `offset` in a file of `size` bytes:
    /// each server holding stripes of `[offset, size)` answers for its own stripes,
    /// and the smallest answer wins. `None`: no data (SEEK_DATA) before `size`; for
    /// SEEK_HOLE the caller answers `size` (the implicit hole at the end).
    pub fn seek_data(
        &self,
        layout: &Layout,
        ino: InodeNo,
        offset: u64,
        size: u64,
        hole: bool,
    ) -> Result<Option<u64>, Errno> {
        if offset >= size {
            return Ok(None);
        }
        let req = SeekDataReq {
            ino,
            stripe_size: layout.stripe_size,
            stripe_width: layout.width,
            offset,
            end: size,
            hole,
        };
        let servers = servers_in_range(layout, offset, size - offset);
        let mut calls = Vec::with_capacity(servers.len());
        for s in servers {
            calls.push(self.server(s)?.start(&req, &[]));
        }
        let mut best: Option<u64> = None;
        for c in calls {
            if let Some(at) = c.wait()?.found {
                best = Some(best.map_or(at, |b| b.min(at)));
            }
        }
        Ok(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_types::StripeIndex;

    fn layout(ss: u32, width: u16, n: u16) -> Layout {
        // Pick an inode whose layout starts at server 1, to exercise the wrap-around.
        (1..)
            .map(|i| Layout::of(InodeNo(i), ss, width, n))
            .find(|l| l.start == 1 % n)
            .unwrap()
    }

    /// Every piece of every server, merged, is exactly `Layout::pieces` of the range.
    #[test]
    fn server_pieces_partition_the_range() {
        for (ss, width, n) in [(4096, 1, 1), (4096, 2, 2), (65536, 3, 4), (8192, 4, 4)] {
            let l = layout(ss, width, n);
            for (off, len) in [
                (0u64, 1u64),
                (0, 4096),
                (100, 3 * 65536 + 7),
                (4095, 2),
                (65536 * 5, 65536 * 9),
                (12345, 0),
                (7, 40000),
            ] {
                let mut all: Vec<Piece> = Vec::new();
                for s in 0..n {
                    let own: Vec<Piece> = server_pieces(&l, ServerIndex(s), off, len).collect();
                    for p in &own {
                        assert_eq!(l.server_of(StripeIndex(p.0)), ServerIndex(s));
                    }
                    all.extend(own);
                }
                all.sort();
                let want: Vec<Piece> = l
                    .pieces(off, len)
                    .into_iter()
                    .map(|(k, w, n)| (k.0, w, n))
                    .collect();
                assert_eq!(all, want, "ss {ss} width {width} n {n} range {off}+{len}");
                let mut servers = servers_in_range(&l, off, len);
                let mut expected: Vec<ServerIndex> =
                    want.iter().map(|p| l.server_of(StripeIndex(p.0))).collect();
                servers.sort();
                servers.dedup();
                expected.sort();
                expected.dedup();
                assert_eq!(servers, expected);
            }
        }
    }

    #[test]
    fn a_huge_range_is_walked_lazily() {
        let l = layout(65536, 2, 2);
        // 1 TiB: only the first few pieces are ever produced.
        let first: Vec<Piece> = server_pieces(&l, ServerIndex(1), 100, 1 << 40)
            .take(2)
            .collect();
        assert_eq!(first, vec![(0, 100, 65436), (2, 0, 65536)]);
        assert_eq!(servers_in_range(&l, 0, 1 << 40).len(), 2);
        assert_eq!(servers_in_range(&l, 65536, 10), vec![ServerIndex(0)]);
        assert!(servers_in_range(&l, 5, 0).is_empty());
    }

    #[test]
    fn a_server_outside_the_width_gets_nothing() {
        let l = layout(4096, 2, 4);
        let outside: Vec<ServerIndex> = (0..4)
            .map(ServerIndex)
            .filter(|s| !l.servers().any(|x| x == *s))
            .collect();
        assert_eq!(outside.len(), 2);
        for s in outside {
            assert_eq!(server_pieces(&l, s, 0, 1 << 20).count(), 0);
        }
    }
}
