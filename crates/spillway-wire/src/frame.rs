//! Frames. Layout (all little-endian), documented in docs/wire-protocol.md:
//!
//! ```text
//! offset size field
//!      0    4 len        bytes that follow this field (16 + body), 16 ..= MAX_FRAME_LEN
//!      4    1 kind       1 = request, 2 = reply, 3 = notice (server to a watching client)
//!      5    1 flags      0 (reserved, must be 0)
//!      6    2 opcode     what the request asks (a reply echoes it)
//!      8    8 id         chosen by the caller, echoed by the reply
//!     16    4 aux        request: deadline in ms from receipt; reply: errno (0 = success)
//!     20    - body       the message's fields (codec.rs), bulk data last
//! ```

use spillway_types::tunables::MAX_FRAME_LEN;
use std::io::{self, IoSlice, Read, Write};

pub const HEADER_LEN: usize = 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Request = 1,
    Reply = 2,
    /// Unasked, from a server to a client connection that watches
    /// (`messages::WatchReq`); answered by a request of the client's.
    Notice = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub opcode: u16,
    pub id: u64,
    pub aux: u32,
}

impl FrameHeader {
    /// The 20 header bytes of a frame whose body is `body_len` bytes.
    pub fn encode(&self, body_len: usize) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        let len = (HEADER_LEN - 4 + body_len) as u32;
        h[0..4].copy_from_slice(&len.to_le_bytes());
        h[4] = self.kind as u8;
        h[5] = 0;
        h[6..8].copy_from_slice(&self.opcode.to_le_bytes());
        h[8..16].copy_from_slice(&self.id.to_le_bytes());
        h[16..20].copy_from_slice(&self.aux.to_le_bytes());
        h
    }

    /// Parse the 16 bytes after the length field.
    pub fn decode(rest: &[u8]) -> io::Result<FrameHeader> {
        if rest.len() < HEADER_LEN - 4 {
            return Err(bad("frame shorter than its header"));
        }
        let kind = match rest[0] {
            1 => FrameKind::Request,
            2 => FrameKind::Reply,
            3 => FrameKind::Notice,
            _ => return Err(bad("unknown frame kind")),
        };
        if rest[1] != 0 {
            return Err(bad("reserved frame flags set"));
        }
        let opcode = u16::from_le_bytes([rest[2], rest[3]]);
        let mut id = [0u8; 8];
        id.copy_from_slice(&rest[4..12]);
        let aux = u32::from_le_bytes([rest[12], rest[13], rest[14], rest[15]]);
        Ok(FrameHeader {
            kind,
            opcode,
            id: u64::from_le_bytes(id),
            aux,
        })
    }
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// Write one frame's parts with as few system calls as the socket allows (one
/// `writev` for a frame that fits the send buffer), so that the header of a frame
/// never leaves as a packet of its own. On failure, says how many bytes did leave
/// (none: the frame may be sent again on another connection whatever it asks).
pub fn write_parts(w: &mut impl Write, parts: &[&[u8]]) -> Result<(), (io::Error, usize)> {
    let mut slices: Vec<IoSlice<'_>> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| IoSlice::new(p))
        .collect();
    let mut rest = &mut slices[..];
    let mut sent = 0;
    while !rest.is_empty() {
        match w.write_vectored(rest) {
            Ok(0) => return Err((io::ErrorKind::WriteZero.into(), sent)),
            Ok(n) => {
                sent += n;
                IoSlice::advance_slices(&mut rest, n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((e, sent)),
        }
    }
    Ok(())
}

/// One received frame: its header and the body bytes (owned; bulk data borrows them).
/// The body is `buf[start..]`: a large body is placed so that it ends on a
/// `BULK_ALIGN` boundary in memory, and bulk data, which is the body's tail, then
/// starts on one when its length is whole blocks. A server writes such bulk to the
/// disk with `O_DIRECT` straight from the buffer it was received into.
pub struct Frame {
    pub header: FrameHeader,
    buf: Vec<u8>,
    start: usize,
}

impl Frame {
    /// The body's bytes.
    pub fn body(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// The buffer holding the body and where in it the body starts (the bytes before
    /// are padding), for decoding without a copy.
    pub fn into_parts(self) -> (Vec<u8>, usize) {
        (self.buf, self.start)
    }
}

/// Bodies from this long on are placed to end on a `BULK_ALIGN` boundary (smaller ones
/// are not worth the padding: no server writes them direct).
const ALIGN_BODIES_FROM: usize = 64 << 10;
/// The memory alignment of a large body's end: the block size `O_DIRECT` needs.
pub const BULK_ALIGN: usize = 4096;

/// Read one frame, refusing any longer than `limit` (at most MAX_FRAME_LEN) before
/// allocating for it. `Ok(None)` is a clean end of stream between frames.
pub fn read_frame(r: &mut impl Read, limit: u32) -> io::Result<Option<Frame>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len);
    if len < (HEADER_LEN - 4) as u32 {
        return Err(bad("frame length below header size"));
    }
    if len > limit.min(MAX_FRAME_LEN) {
        return Err(bad("frame longer than allowed"));
    }
    let mut head = [0u8; HEADER_LEN - 4];
    r.read_exact(&mut head)?;
    let header = FrameHeader::decode(&head)?;
    // The body is read into spare capacity: no zero-filling of megabytes of bulk data
    // that the next instruction overwrites, and no shifting it past the header. A
    // large one is preceded by padding so that it ends block-aligned.
    let want = len as usize - (HEADER_LEN - 4);
    let (mut buf, start) = if want >= ALIGN_BODIES_FROM {
        let mut buf = Vec::with_capacity(want + BULK_ALIGN);
        let end = (buf.as_ptr() as usize).wrapping_add(want);
        let pad = (BULK_ALIGN - end % BULK_ALIGN) % BULK_ALIGN;
        buf.resize(pad, 0);
        (buf, pad)
    } else {
        (Vec::with_capacity(want), 0)
    };
    r.take(want as u64).read_to_end(&mut buf)?;
    if buf.len() != start + want {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "frame cut short",
        ));
    }
    Ok(Some(Frame { header, buf, start }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = FrameHeader {
            kind: FrameKind::Reply,
            opcode: 77,
            id: 1 << 40,
            aux: 28,
        };
        let bytes = h.encode(5);
        assert_eq!(
            u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            21
        );
        assert_eq!(FrameHeader::decode(&bytes[4..]).unwrap(), h);
    }

    #[test]
    fn large_bodies_end_block_aligned_in_memory() {
        for body_len in [10usize, 64 << 10, (1 << 20) + 33, 3 << 20] {
            let body: Vec<u8> = (0..body_len).map(|i| (i % 253) as u8).collect();
            let h = FrameHeader {
                kind: FrameKind::Request,
                opcode: 60,
                id: 9,
                aux: 0,
            };
            let mut wire = h.encode(body.len()).to_vec();
            wire.extend_from_slice(&body);
            let f = read_frame(&mut &wire[..], MAX_FRAME_LEN).unwrap().unwrap();
            assert_eq!(f.header, h);
            assert_eq!(f.body(), &body[..]);
            let end = f.body().as_ptr() as usize + body_len;
            if body_len >= ALIGN_BODIES_FROM {
                assert_eq!(end % BULK_ALIGN, 0, "body of {body_len} bytes");
            }
            let (buf, start) = f.into_parts();
            assert_eq!(&buf[start..], &body[..]);
        }
    }

    #[test]
    fn oversized_and_garbage_frames_are_refused() {
        let mut huge: &[u8] = &[0xff, 0xff, 0xff, 0x7f, 1, 0];
        assert!(read_frame(&mut huge, MAX_FRAME_LEN).is_err());
        let mut tiny: &[u8] = &[3, 0, 0, 0, 1, 0, 0];
        assert!(read_frame(&mut tiny, MAX_FRAME_LEN).is_err());
        let mut truncated: &[u8] = &[100, 0, 0, 0, 1, 0, 0];
        assert!(read_frame(&mut truncated, MAX_FRAME_LEN).is_err());
        let mut empty: &[u8] = &[];
        assert!(read_frame(&mut empty, MAX_FRAME_LEN).unwrap().is_none());
        let mut bad_kind = FrameHeader {
            kind: FrameKind::Request,
            opcode: 1,
            id: 1,
            aux: 0,
        }
        .encode(0);
        bad_kind[4] = 9;
        assert!(read_frame(&mut &bad_kind[..], MAX_FRAME_LEN).is_err());
    }
}

/// The frame reader and the request decoder take bytes from anyone who connects:
/// whatever arrives, they answer a frame or an error, never a panic, and a frame's
/// body is exactly the bytes sent (wherever in its buffer the padding put it).
#[cfg(test)]
mod fuzz {
    use super::*;
    use crate::messages::Request;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_bytes_never_panic_the_reader(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = read_frame(&mut &bytes[..], MAX_FRAME_LEN);
        }

        #[test]
        fn well_framed_garbage_bodies_decode_or_fail_cleanly(
            opcode in any::<u16>(),
            body in proptest::collection::vec(any::<u8>(), 0..300),
            big in any::<bool>(),
        ) {
            // A large body too, so that the padded (aligned) placement is exercised.
            let body = if big { body.repeat(1 + (80 << 10) / (body.len() + 1)) } else { body };
            let h = FrameHeader { kind: FrameKind::Request, opcode, id: 1, aux: 0 };
            let mut wire = h.encode(body.len()).to_vec();
            wire.extend_from_slice(&body);
            let f = read_frame(&mut &wire[..], MAX_FRAME_LEN).unwrap().unwrap();
            prop_assert_eq!(f.body(), &body[..]);
            let (buf, start) = f.into_parts();
            let _ = Request::decode_at(opcode, buf, start);
        }

        #[test]
        fn a_body_offset_past_the_buffer_is_an_error(at in 0usize..64, len in 0usize..32) {
            let r = Request::decode_at(crate::messages::OP_WRITE, vec![0; len], at);
            if at > len {
                prop_assert!(r.is_err());
            }
        }
    }
}
