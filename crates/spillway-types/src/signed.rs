//! What the two signed formats of this crate share (`capability`, `stage_ticket`): the
//! HMAC-SHA256 they are tagged with, and the reader that takes their fields apart.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// HMAC-SHA256 keyed by `key`.
pub(crate) fn hmac(key: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length (longer ones are hashed first): this cannot fail,
    // whatever the key.
    <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC accepts keys of any length")
}

/// Reads a byte string front to back; every read checks what is left.
pub(crate) struct Cursor<'a>(pub(crate) &'a [u8]);

impl<'a> Cursor<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.take(4)?.try_into().ok().map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_le_bytes)
    }

    /// Bytes not read yet.
    pub(crate) fn left(&self) -> usize {
        self.0.len()
    }
}
