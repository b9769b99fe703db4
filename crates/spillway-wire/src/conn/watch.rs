//! A watching connection (a part of `conn`; docs/wire-protocol.md, "Notices"): a
//! client mount keeps one to each server it holds files open on, read by a thread of
//! its own. The server sends on it, unasked, notices of other mounts' changes to
//! those files (frames of kind `Notice`); the mount answers each, once it acted on
//! it, with a `NoticeDoneReq`, whose own reply nobody waits for.
//!
//! Not a `Conn`: nobody calls through it, and its reads block for as long as nothing
//! happens, where a `Conn` reads only while a caller waits.

use super::{handshake, CallError, Endpoint};
use crate::codec::Wire;
use crate::frame::{read_frame, write_parts, FrameHeader, FrameKind};
use crate::messages::{Call, NoticeDoneReq, WatchReq};
use std::io::{self, BufReader};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Largest frame a watch takes: notices are small.
const WATCH_FRAME_LIMIT: u32 = 64 << 10;

/// How long the server has to answer a `NoticeDoneReq` (nobody waits for it).
const DONE_DEADLINE_MS: u32 = 10_000;

/// One notice: what it says (`opcode`, its message in `body`) and the id to answer.
#[derive(Debug)]
pub struct Notice {
    pub opcode: u16,
    pub id: u64,
    pub body: Vec<u8>,
}

pub struct Watch {
    reader: BufReader<TcpStream>,
    writer: Mutex<TcpStream>,
    next_id: AtomicU64,
}

impl Watch {
    /// Connect to `ep`'s server with `ep`'s handshake (its mount, a fresh credential)
    /// and watch: from the server's answer on, the notices for that mount come here.
    pub fn open(ep: &Endpoint) -> Result<Watch, CallError> {
        let timeout = ep.deadline.min(Duration::from_secs(10));
        let (stream, _) = handshake(&ep.addr, &ep.current_hello(), timeout)?;
        let body = WatchReq {}.to_bytes();
        let head = FrameHeader {
            kind: FrameKind::Request,
            opcode: WatchReq::OP,
            id: 1,
            aux: timeout.as_millis().min(u128::from(u32::MAX)) as u32,
        }
        .encode(body.len());
        write_parts(&mut &stream, &[&head, &body]).map_err(|_| CallError::NotSent)?;
        // The handshake left the read timeout at `timeout`: the answer comes first.
        let reply = read_frame(&mut &stream, WATCH_FRAME_LIMIT)
            .map_err(|_| CallError::Lost)?
            .ok_or(CallError::Lost)?;
        if reply.header.kind != FrameKind::Reply || reply.header.id != 1 {
            return Err(CallError::Lost);
        }
        if reply.header.aux != 0 {
            return Err(CallError::Remote(spillway_types::Errno(
                reply.header.aux as i32,
            )));
        }
        stream.set_read_timeout(None).map_err(|_| CallError::Lost)?;
        let read_half = stream.try_clone().map_err(|_| CallError::Lost)?;
        Ok(Watch {
            reader: BufReader::new(read_half),
            writer: Mutex::new(stream),
            next_id: AtomicU64::new(2),
        })
    }

    /// The next notice, waiting as long as it takes; an error when the connection is
    /// gone (the caller makes a new one, and must assume it missed notices).
    pub fn next_notice(&mut self) -> io::Result<Notice> {
        loop {
            let Some(f) = read_frame(&mut self.reader, WATCH_FRAME_LIMIT)? else {
                return Err(io::ErrorKind::UnexpectedEof.into());
            };
            match f.header.kind {
                FrameKind::Notice => {
                    let (opcode, id) = (f.header.opcode, f.header.id);
                    let (mut buf, start) = f.into_parts();
                    buf.drain(..start);
                    return Ok(Notice {
                        opcode,
                        id,
                        body: buf,
                    });
                }
                // The answer to one of our NoticeDone requests: nothing to do.
                FrameKind::Reply => {
                    if f.header.aux != 0 {
                        tracing::debug!(errno = f.header.aux, "notice answer refused");
                    }
                }
                FrameKind::Request => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a request from the server on a watch",
                    ))
                }
            }
        }
    }

    /// Tell the server notice `id` was acted on.
    pub fn done(&self, id: u64) -> io::Result<()> {
        let body = NoticeDoneReq { id }.to_bytes();
        let head = FrameHeader {
            kind: FrameKind::Request,
            opcode: NoticeDoneReq::OP,
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            aux: DONE_DEADLINE_MS,
        }
        .encode(body.len());
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        write_parts(&mut *w, &[&head, &body]).map_err(|(e, _)| e)
    }

    /// Close the connection: a thread blocked in `next_notice` returns an error.
    pub fn close(&self) {
        let w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let _ = w.shutdown(Shutdown::Both);
    }

    /// What closes this watch from elsewhere (the thread reading it blocks in `next_notice`).
    pub fn closer(&self) -> std::io::Result<WatchCloser> {
        let w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        Ok(WatchCloser(w.try_clone()?))
    }
}

/// Closes a `Watch` another thread reads.
pub struct WatchCloser(TcpStream);

impl WatchCloser {
    pub fn close(&self) {
        let _ = self.0.shutdown(Shutdown::Both);
    }
}
