//! Field encodings. Every integer is little-endian; byte strings and lists carry a u32
//! length/count first; options a u8 tag (0 none, 1 some). Decoding never trusts a
//! length: it checks it against the bytes actually left in the frame, so a hostile
//! length cannot make us allocate more than the frame we already hold.

use spillway_types::{Attr, FileKind, InodeNo, Timespec};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The frame ended before the field did.
    Truncated,
    /// A field holds a value outside its domain (bad tag, bad kind, over a limit).
    Invalid(&'static str),
    /// Bytes were left over after the last field.
    Trailing,
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Truncated => write!(f, "truncated frame"),
            WireError::Invalid(w) => write!(f, "invalid field: {w}"),
            WireError::Trailing => write!(f, "trailing bytes after message"),
        }
    }
}

impl std::error::Error for WireError {}

#[derive(Default)]
pub struct Enc {
    pub buf: Vec<u8>,
}

impl Enc {
    pub fn new() -> Enc {
        Enc {
            buf: Vec::with_capacity(64),
        }
    }
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.buf.extend_from_slice(v);
    }
}

pub struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    pub fn new(buf: &'a [u8]) -> Dec<'a> {
        Dec { buf, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).ok_or(WireError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(WireError::Truncated)?;
        self.pos = end;
        Ok(s)
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    pub fn position(&self) -> usize {
        self.pos
    }
    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, WireError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> Result<u64, WireError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    pub fn i32(&mut self) -> Result<i32, WireError> {
        Ok(self.u32()? as i32)
    }
    pub fn i64(&mut self) -> Result<i64, WireError> {
        Ok(self.u64()? as i64)
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.u32()? as usize;
        if n > self.remaining() {
            return Err(WireError::Truncated);
        }
        self.take(n)
    }
    /// Everything left in the frame (the bulk data trailer).
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
    pub fn finish(&self) -> Result<(), WireError> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(WireError::Trailing)
        }
    }
}

/// A type with a wire encoding.
pub trait Wire: Sized {
    fn enc(&self, e: &mut Enc);
    fn dec(d: &mut Dec<'_>) -> Result<Self, WireError>;

    fn to_bytes(&self) -> Vec<u8> {
        let mut e = Enc::new();
        self.enc(&mut e);
        e.buf
    }
    /// Decode a whole message: trailing bytes are an error.
    fn from_bytes(b: &[u8]) -> Result<Self, WireError> {
        let mut d = Dec::new(b);
        let v = Self::dec(&mut d)?;
        d.finish()?;
        Ok(v)
    }
}

macro_rules! wire_int {
    ($t:ty, $m:ident) => {
        impl Wire for $t {
            fn enc(&self, e: &mut Enc) {
                e.$m(*self)
            }
            fn dec(d: &mut Dec<'_>) -> Result<Self, WireError> {
                d.$m()
            }
        }
    };
}
wire_int!(u8, u8);
wire_int!(u16, u16);
wire_int!(u32, u32);
wire_int!(u64, u64);
wire_int!(i32, i32);
wire_int!(i64, i64);

impl Wire for bool {
    fn enc(&self, e: &mut Enc) {
        e.u8(u8::from(*self))
    }
    fn dec(d: &mut Dec<'_>) -> Result<Self, WireError> {
        match d.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(WireError::Invalid("bool")),
        }
    }
}

impl Wire for Vec<u8> {
    fn enc(&self, e: &mut Enc) {
        e.bytes(self)
    }
    fn dec(d: &mut Dec<'_>) -> Result<Self, WireError> {
        Ok(d.bytes()?.to_vec())
    }
}

impl Wire for String {
    fn enc(&self, e: &mut Enc) {
        e.bytes(self.as_bytes())
    }
    fn dec(d: &mut Dec<'_>) -> Result<Self, WireError> {
        String::from_utf8(d.bytes()?.to_vec()).map_err(|_| WireError::Invalid("utf-8 string"))
    }
}

impl<T: Wire> Wire for Option<T> {
    fn enc(&self, e: &mut Enc) {
        match self {
            None => e.u8(0),
            Some(v) => {
                e.u8(1);
                v.enc(e)
            }
        }
    }
    fn dec(d: &mut Dec<'_>) -> Result<Self, WireError> {
        match d.u8()? {
            0 => Ok(None),
            1 => Ok(Some(T::dec(d)?)),
            _ => Err(WireError::Invalid("option tag")),
        }
    }
}

/// Lists of structured items. Each item takes at least one byte on the wire, so a count
/// larger than the bytes left is rejected before anything is allocated.
pub trait ListItem: Wire {}

impl<T: ListItem> Wire for Vec<T> {
    fn enc(&self, e: &mut Enc) {
        e.u32(self.len() as u32);
        for v in self {
            v.enc(e)
        }
    }
    fn dec(d: &mut Dec<'_>) -> Result<Self, WireError> {
        let n = d.u32()? as usize;
        if n > d.remaining() {
            return Err(WireError::Truncated);
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(T::dec(d)?);
        }
        Ok(out)
    }
}
impl ListItem for Vec<u8> {}
impl ListItem for String {}

/// Bulk data: the rest of the frame, after every other field. Sent straight from the
/// caller's buffer and received without another copy (it borrows the frame).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bulk(pub Vec<u8>);

/// Bulk data received in a request frame: the frame body and where the data starts.
/// The receiving twin of `Bulk`: it keeps the whole body so that the data is handed
/// on without a copy. Lives here, with the encodings, rather than with the connection
/// (`conn.rs`), because it is what `messages::Request::decode` yields and the calling
/// side never needs it; that keeps `conn.rs → messages.rs` one-way.
/// Or the bytes lie in the client's arena (a `WriteArena`), which the wire layer
/// hands on the same way.
#[derive(Debug)]
pub struct BulkBody {
    pub body: Vec<u8>,
    pub start: usize,
    pub arena: Option<crate::arena::ArenaSlice>,
}

impl BulkBody {
    /// The bulk at `buf[start..]` of a received frame.
    pub fn framed(body: Vec<u8>, start: usize) -> BulkBody {
        BulkBody {
            body,
            start,
            arena: None,
        }
    }

    /// The bulk in the client's arena.
    pub fn in_arena(slice: crate::arena::ArenaSlice) -> BulkBody {
        BulkBody {
            body: Vec::new(),
            start: 0,
            arena: Some(slice),
        }
    }

    pub fn data(&self) -> &[u8] {
        match &self.arena {
            Some(a) => a.as_slice(),
            None => &self.body[self.start..],
        }
    }
}

impl Wire for InodeNo {
    fn enc(&self, e: &mut Enc) {
        e.u64(self.0)
    }
    fn dec(d: &mut Dec<'_>) -> Result<Self, WireError> {
        Ok(InodeNo(d.u64()?))
    }
}

impl Wire for FileKind {
    fn enc(&self, e: &mut Enc) {
        e.u8(*self as u8)
    }
    fn dec(d: &mut Dec<'_>) -> Result<Self, WireError> {
        FileKind::from_u8(d.u8()?).ok_or(WireError::Invalid("file kind"))
    }
}

impl Wire for Timespec {
    fn enc(&self, e: &mut Enc) {
        e.i64(self.sec);
        e.u32(self.nsec);
    }
    fn dec(d: &mut Dec<'_>) -> Result<Self, WireError> {
        let sec = d.i64()?;
        let nsec = d.u32()?;
        if nsec >= 1_000_000_000 {
            return Err(WireError::Invalid("nanoseconds"));
        }
        Ok(Timespec { sec, nsec })
    }
}

impl Wire for Attr {
    fn enc(&self, e: &mut Enc) {
        self.ino.enc(e);
        self.kind.enc(e);
        e.u32(self.mode);
        e.u32(self.nlink);
        e.u32(self.uid);
        e.u32(self.gid);
        e.u32(self.rdev);
        e.u64(self.size);
        self.atime.enc(e);
        self.mtime.enc(e);
        self.ctime.enc(e);
        e.u32(self.stripe_size);
        e.u16(self.stripe_width);
        e.u64(self.blocks);
    }
    fn dec(d: &mut Dec<'_>) -> Result<Self, WireError> {
        Ok(Attr {
            ino: InodeNo::dec(d)?,
            kind: FileKind::dec(d)?,
            mode: d.u32()?,
            nlink: d.u32()?,
            uid: d.u32()?,
            gid: d.u32()?,
            rdev: d.u32()?,
            size: d.u64()?,
            atime: Timespec::dec(d)?,
            mtime: Timespec::dec(d)?,
            ctime: Timespec::dec(d)?,
            stripe_size: d.u32()?,
            stripe_width: d.u16()?,
            blocks: d.u64()?,
        })
    }
}

/// Declare a message struct and its wire encoding: fields in declaration order.
#[macro_export]
macro_rules! wire_struct {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }
        impl $crate::codec::Wire for $name {
            #[allow(unused_variables)]
            fn enc(&self, e: &mut $crate::codec::Enc) { $( $crate::codec::Wire::enc(&self.$f, e); )* }
            #[allow(unused_variables)]
            fn dec(d: &mut $crate::codec::Dec<'_>) -> Result<Self, $crate::codec::WireError> {
                Ok($name { $( $f: <$t as $crate::codec::Wire>::dec(d)? ),* })
            }
        }
        impl $crate::codec::ListItem for $name {}
    };
}

impl Wire for Bulk {
    fn enc(&self, e: &mut Enc) {
        e.buf.extend_from_slice(&self.0)
    }
    fn dec(d: &mut Dec<'_>) -> Result<Self, WireError> {
        Ok(Bulk(d.rest().to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_lengths_are_rejected_without_allocation() {
        // A byte string claiming 4 GiB in a 6-byte frame.
        let mut d = Dec::new(&[0xff, 0xff, 0xff, 0xff, 1, 2]);
        assert_eq!(d.bytes(), Err(WireError::Truncated));
        // A list claiming 2^32-1 items.
        let r = <Vec<String> as Wire>::from_bytes(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(r, Err(WireError::Truncated));
    }

    #[test]
    fn attr_round_trips() {
        let a = Attr {
            ino: InodeNo(5),
            kind: FileKind::Symlink,
            mode: 0o4755,
            nlink: 2,
            uid: 1000,
            gid: 100,
            rdev: 0,
            size: 1 << 40,
            atime: Timespec { sec: -5, nsec: 7 },
            mtime: Timespec {
                sec: 1,
                nsec: 999_999_999,
            },
            ctime: Timespec::default(),
            stripe_size: 8 << 20,
            stripe_width: 3,
            blocks: 1 << 31,
        };
        assert_eq!(Attr::from_bytes(&a.to_bytes()).unwrap(), a);
    }
}
