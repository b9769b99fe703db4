//! What the wire layer's tests share: a test server's handshake and a client's, and a
//! service that takes writes and answers reads.

use crate::messages::{HelloReply, HelloReq, ReadArenaReply, Request, WriteReply, WriteReq};
use crate::serve::{Reply, Server, Service};
use crate::PROTOCOL_VERSION;
use spillway_types::{Errno, InodeNo};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A test service's answer to every Hello: server 0 of 1, no session state.
pub(crate) fn accept_hello() -> Result<(HelloReply, ()), Errno> {
    let reply = HelloReply {
        version: PROTOCOL_VERSION,
        server_index: 0,
        server_count: 1,
    };
    Ok((reply, ()))
}

/// A client's Hello to a test service (which accepts anything).
pub(crate) fn hello() -> HelloReq {
    HelloReq {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        role: 0,
        instance: 0,
        credential: Vec::new(),
        peer_name: "test".into(),
        mount: 0,
    }
}

/// Answers a write with its length after `delay`, recording (offset, checksum, whether
/// its bulk came through the arena) in arrival order; fills a read of `len` with
/// `len / 2` bytes of `offset as u8`. Offers arenas of up to 64 MiB.
pub(crate) struct Sink {
    pub(crate) seen: Mutex<Vec<(u32, u64, bool)>>,
    /// Requests handled.
    pub(crate) calls: AtomicU64,
    delay: Duration,
    inline: bool,
}

impl Sink {
    /// A sink serving on a fresh loopback port with `workers` threads; requests run on
    /// the connection's thread when `inline`.
    pub(crate) fn serve(
        delay: Duration,
        inline: bool,
        workers: usize,
    ) -> (Server, SocketAddr, Arc<Sink>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sink = Arc::new(Sink {
            seen: Mutex::new(Vec::new()),
            calls: AtomicU64::new(0),
            delay,
            inline,
        });
        (
            Server::start(listener, sink.clone(), workers).unwrap(),
            addr,
            sink,
        )
    }

    /// (offset, checksum) of the writes seen, in arrival order.
    pub(crate) fn writes(&self) -> Vec<(u32, u64)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|&(o, s, _)| (o, s))
            .collect()
    }
}

impl Service for Sink {
    type Session = ();
    fn hello(&self, _r: &HelloReq, _p: SocketAddr) -> Result<(HelloReply, ()), Errno> {
        accept_hello()
    }
    fn handle(&self, _s: &(), req: Request) -> Result<Reply, Errno> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        match req {
            Request::Write(w, bulk) => {
                let sum = bulk.data().iter().map(|b| u64::from(*b)).sum();
                let via = bulk.arena.is_some();
                self.seen.lock().unwrap().push((w.offset, sum, via));
                Ok(Reply::of(&WriteReply {
                    written: bulk.data().len() as u32,
                    grant_epoch: 0,
                    granted: 0,
                }))
            }
            Request::ReadInto(r, mut into) => {
                let n = (r.len / 2) as usize;
                into.as_mut_slice()[..n].fill(r.offset as u8);
                Ok(Reply::of(&ReadArenaReply { len: n as u32 }))
            }
            Request::Read(r) => Ok(Reply::bulk(vec![r.offset as u8; (r.len / 2) as usize])),
            _ => Err(Errno::EINVAL),
        }
    }
    fn runs_inline(&self, _op: u16, _body: &[u8]) -> bool {
        self.inline
    }
    fn arena_max(&self) -> usize {
        64 << 20
    }
    fn closed(&self, _s: &()) {}
}

/// A write of inode 1, stripe 0, at `offset`, not charged to a grant.
pub(crate) fn write_req(offset: u32) -> WriteReq {
    WriteReq {
        ino: InodeNo(1),
        stripe: 0,
        offset,
        sync: false,
        grant_epoch: 0,
        charged: 0,
    }
}
