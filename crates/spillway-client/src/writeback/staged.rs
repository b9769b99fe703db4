//! A staged run of the write-behind: small contiguous writes gathered into one write
//! RPC (within one stripe, at most `writeback_chunk` bytes), newer bytes winning where
//! they overlap. Kept apart: it is byte arithmetic alone (what a merge takes and must
//! charge to the grant), tested against a flat model without any server.

use spillway_stubs::Payload;

/// Bytes gathered for one write RPC: contiguous, within one stripe, and all charged to
/// the grant of session `epoch` of the stripe's server.
pub(super) struct Staged {
    pub offset: u64,
    pub data: Payload,
    pub epoch: u64,
}

impl Staged {
    pub(super) fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }

    /// Whether `len` bytes at `offset` overlap or extend this run and it stays within
    /// `chunk` bytes.
    pub(super) fn fits(&self, offset: u64, len: usize, chunk: usize) -> bool {
        offset >= self.offset
            && offset <= self.end()
            && offset + len as u64 - self.offset <= chunk as u64
    }

    /// Bytes the run would grow by (what taking them must charge).
    pub(super) fn growth(&self, offset: u64, len: usize) -> u64 {
        (offset + len as u64).saturating_sub(self.end())
    }

    /// Take `bytes` at `offset` into this run if they overlap or extend it and the run
    /// stays within `chunk` bytes; newer bytes win.
    pub(super) fn merge(&mut self, offset: u64, bytes: &[u8], chunk: usize) -> bool {
        if !self.fits(offset, bytes.len(), chunk) {
            return false;
        }
        let at = (offset - self.offset) as usize;
        let overlap = bytes.len().min(self.data.len() - at);
        self.data[at..at + overlap].copy_from_slice(&bytes[..overlap]);
        self.data.extend_from_slice(&bytes[overlap..]);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(offset: u64, data: &[u8]) -> Staged {
        Staged {
            offset,
            data: Payload::Heap(data.to_vec()),
            epoch: 1,
        }
    }

    #[test]
    fn growth_is_what_a_merge_must_charge() {
        let s = staged(10, b"abcdef");
        assert_eq!(s.growth(12, 2), 0, "inside the run: already charged");
        assert_eq!(s.growth(14, 4), 2);
        assert_eq!(s.growth(16, 3), 3);
        assert!(s.fits(16, 3, 100));
        assert!(!s.fits(17, 1, 100), "a gap");
        assert!(!s.fits(9, 1, 100), "before the run");
    }

    #[test]
    fn appends_extend_the_run() {
        let mut s = staged(10, b"abc");
        assert!(s.merge(13, b"def", 100));
        assert!(s.merge(16, b"g", 100));
        assert_eq!(&*s.data, b"abcdefg");
        assert_eq!(s.offset, 10);
    }

    #[test]
    fn overlaps_take_the_newest_bytes() {
        let mut s = staged(0, b"aaaaaa");
        assert!(s.merge(2, b"BB", 100));
        assert_eq!(&*s.data, b"aaBBaa");
        assert!(s.merge(4, b"CCCC", 100));
        assert_eq!(&*s.data, b"aaBBCCCC");
        assert!(s.merge(0, b"D", 100));
        assert_eq!(&*s.data, b"DaBBCCCC");
    }

    #[test]
    fn gaps_earlier_bytes_and_overflow_are_refused() {
        let mut s = staged(10, b"abc");
        assert!(
            !s.merge(14, b"x", 100),
            "a gap would need zeroes we do not know"
        );
        assert!(!s.merge(9, b"xy", 100), "bytes before the run");
        assert!(!s.merge(13, &[0; 98], 100), "past the chunk");
        assert!(s.merge(13, &[0; 97], 100), "exactly the chunk");
        assert_eq!(s.data.len(), 100);
        assert_eq!(s.data[..3], *b"abc");
    }

    #[test]
    fn matches_a_flat_model() {
        // Random mergeable writes against a flat byte array.
        let mut model: Vec<u8> = b"seed".to_vec();
        let mut s = staged(1000, b"seed");
        let mut seed = 12345u64;
        for _ in 0..2000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = (seed >> 33) as usize % (model.len() + 1);
            let len = 1 + (seed >> 13) as usize % 20;
            let byte = (seed >> 5) as u8;
            let merged = s.merge(1000 + at as u64, &vec![byte; len], 300);
            assert_eq!(merged, at + len <= 300);
            if merged {
                if model.len() < at + len {
                    model.resize(at + len, 0);
                }
                model[at..at + len].fill(byte);
            }
        }
        assert_eq!(&*s.data, model);
        assert_eq!(s.offset, 1000);
    }
}
