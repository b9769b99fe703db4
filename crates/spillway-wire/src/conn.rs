//! The calling side of a connection. Many calls may be in flight on one connection:
//! each carries an id, a reader thread hands each reply to its waiter, and every wait
//! ends at the call's deadline. An `Endpoint` owns the connection to one server and
//! reconnects when it breaks (a restarted server), resending what is safe to resend.

use crate::codec::Wire;
use crate::frame::{read_frame, FrameHeader, FrameKind};
use crate::messages::{Call, HelloReply, HelloReq};
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use spillway_types::tunables::MAX_FRAME_LEN;
use spillway_types::Errno;
use std::collections::HashMap;
use std::io::Write;
use std::marker::PhantomData;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bulk data received in a request frame: the frame body and where the data starts.
#[derive(Debug)]
pub struct BulkBody {
    pub body: Vec<u8>,
    pub start: usize,
}

impl BulkBody {
    pub fn data(&self) -> &[u8] {
        &self.body[self.start..]
    }
}

/// Why a call failed, as far as retrying goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// The request never left: safe to send again.
    NotSent,
    /// The connection broke after the request left: resend only idempotent calls.
    Lost,
    /// No reply by the deadline.
    Timeout,
    /// The server answered with this errno.
    Remote(Errno),
}

impl CallError {
    pub fn errno(self) -> Errno {
        match self {
            CallError::NotSent | CallError::Lost => Errno::EIO,
            CallError::Timeout => Errno::ETIMEDOUT,
            CallError::Remote(e) => e,
        }
    }
}

type Waiter = Sender<Result<Vec<u8>, CallError>>;
/// Where a call's reply (the frame body) or its failure arrives.
pub type ReplySlot = Receiver<Result<Vec<u8>, CallError>>;

/// One live connection, after a successful handshake.
pub struct Conn {
    writer: Mutex<TcpStream>,
    pending: Mutex<HashMap<u64, Waiter>>,
    next_id: AtomicU64,
    alive: AtomicBool,
    pub hello: HelloReply,
}

impl Conn {
    /// Connect, say hello, and start the reader thread.
    pub fn connect(
        addr: &str,
        hello: &HelloReq,
        timeout: Duration,
    ) -> Result<Arc<Conn>, CallError> {
        let sockaddr = addr
            .to_socket_addrs()
            .map_err(|_| CallError::NotSent)?
            .next()
            .ok_or(CallError::NotSent)?;
        let mut stream =
            TcpStream::connect_timeout(&sockaddr, timeout).map_err(|_| CallError::NotSent)?;
        stream.set_nodelay(true).ok();
        // Handshake synchronously, before the reader thread exists.
        let body = hello.to_bytes();
        let h = FrameHeader {
            kind: FrameKind::Request,
            opcode: HelloReq::OP,
            id: 0,
            aux: timeout.as_millis() as u32,
        };
        let mut frame = h.encode(body.len()).to_vec();
        frame.extend_from_slice(&body);
        stream.write_all(&frame).map_err(|_| CallError::NotSent)?;
        stream.set_read_timeout(Some(timeout)).ok();
        let reply = read_frame(&mut stream, 1 << 16)
            .map_err(|_| CallError::Lost)?
            .ok_or(CallError::Lost)?;
        if reply.header.aux != 0 {
            return Err(CallError::Remote(Errno(reply.header.aux as i32)));
        }
        let hello =
            HelloReply::from_bytes(&reply.body).map_err(|_| CallError::Remote(Errno::EPROTO))?;
        stream.set_read_timeout(None).ok();
        let reader = stream.try_clone().map_err(|_| CallError::NotSent)?;
        let conn = Arc::new(Conn {
            writer: Mutex::new(stream),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            alive: AtomicBool::new(true),
            hello,
        });
        let c2 = conn.clone();
        std::thread::Builder::new()
            .name(format!("rpc-rx {addr}"))
            .spawn(move || c2.read_loop(reader))
            .map_err(|_| CallError::NotSent)?;
        Ok(conn)
    }

    fn read_loop(self: Arc<Self>, mut stream: TcpStream) {
        loop {
            match read_frame(&mut stream, MAX_FRAME_LEN) {
                Ok(Some(f)) if f.header.kind == FrameKind::Reply => {
                    let waiter = self.lock_pending().remove(&f.header.id);
                    if let Some(w) = waiter {
                        let r = if f.header.aux == 0 {
                            Ok(f.body)
                        } else {
                            Err(CallError::Remote(Errno(f.header.aux as i32)))
                        };
                        let _ = w.send(r);
                    }
                }
                Ok(Some(_)) | Ok(None) | Err(_) => break,
            }
        }
        self.alive.store(false, Ordering::SeqCst);
        let _ = stream.shutdown(Shutdown::Both);
        for (_, w) in self.lock_pending().drain() {
            let _ = w.send(Err(CallError::Lost));
        }
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiter>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Send one request frame; the reply arrives on the returned channel.
    pub fn send_raw(
        &self,
        opcode: u16,
        body: &[u8],
        bulk: &[u8],
        deadline: Duration,
    ) -> Result<(u64, ReplySlot), CallError> {
        if !self.is_alive() {
            return Err(CallError::NotSent);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = bounded(1);
        self.lock_pending().insert(id, tx);
        let h = FrameHeader {
            kind: FrameKind::Request,
            opcode,
            id,
            aux: deadline.as_millis().min(u32::MAX as u128) as u32,
        };
        let mut head = h.encode(body.len() + bulk.len()).to_vec();
        head.extend_from_slice(body);
        let res = {
            let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            let r = w.write_all(&head);
            if r.is_ok() && !bulk.is_empty() {
                // A partial frame may have left: the connection is unusable either way.
                w.write_all(bulk).map_err(|_| CallError::Lost)
            } else {
                r.map_err(|_| CallError::NotSent)
            }
        };
        if let Err(e) = res {
            self.lock_pending().remove(&id);
            self.alive.store(false, Ordering::SeqCst);
            if let Ok(w) = self.writer.lock() {
                let _ = w.shutdown(Shutdown::Both);
            }
            return Err(e);
        }
        Ok((id, rx))
    }

    fn forget(&self, id: u64) {
        self.lock_pending().remove(&id);
    }

    pub fn close(&self) {
        self.alive.store(false, Ordering::SeqCst);
        if let Ok(w) = self.writer.lock() {
            let _ = w.shutdown(Shutdown::Both);
        }
    }
}

/// A server as seen by a caller: its address, the handshake to make, and the current
/// connection (made on first use, remade after a failure).
pub struct Endpoint {
    pub addr: String,
    hello: HelloReq,
    conn: Mutex<Option<Arc<Conn>>>,
    pub deadline: Duration,
    pub reconnect_window: Duration,
}

impl Endpoint {
    pub fn new(
        addr: String,
        hello: HelloReq,
        deadline: Duration,
        reconnect_window: Duration,
    ) -> Endpoint {
        Endpoint {
            addr,
            hello,
            conn: Mutex::new(None),
            deadline,
            reconnect_window,
        }
    }

    /// The current connection, connecting (with retries within the reconnect window)
    /// when there is none or it broke.
    pub fn conn(&self) -> Result<Arc<Conn>, CallError> {
        let mut guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = guard.as_ref() {
            if c.is_alive() {
                return Ok(c.clone());
            }
        }
        *guard = None;
        let start = Instant::now();
        let mut backoff = Duration::from_millis(20);
        loop {
            match Conn::connect(
                &self.addr,
                &self.hello,
                self.deadline.min(Duration::from_secs(10)),
            ) {
                Ok(c) => {
                    *guard = Some(c.clone());
                    return Ok(c);
                }
                Err(CallError::Remote(e)) => return Err(CallError::Remote(e)),
                Err(e) => {
                    if start.elapsed() >= self.reconnect_window {
                        tracing::warn!(addr = %self.addr, "server unreachable");
                        return Err(e);
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    /// Start a call; `wait()` on the result. Lets a caller put calls to several
    /// servers in flight at once.
    pub fn start<'a, C: Call>(&'a self, req: &C, bulk: &'a [u8]) -> PendingCall<'a, C> {
        let body = req.to_bytes();
        let sent = self.send(C::OP, &body, bulk);
        PendingCall {
            ep: self,
            body,
            bulk,
            sent,
            started: Instant::now(),
            _c: PhantomData,
        }
    }

    pub fn call<C: Call>(&self, req: &C) -> Result<C::Reply, Errno> {
        self.start(req, &[]).wait()
    }

    pub fn call_bulk<C: Call>(&self, req: &C, bulk: &[u8]) -> Result<C::Reply, Errno> {
        self.start(req, bulk).wait()
    }

    fn send(&self, op: u16, body: &[u8], bulk: &[u8]) -> Result<Sent, CallError> {
        let conn = self.conn()?;
        let (id, rx) = conn.send_raw(op, body, bulk, self.deadline)?;
        Ok(Sent { conn, id, rx })
    }

    /// Drop the connection (tests; shutdown).
    pub fn disconnect(&self) {
        if let Some(c) = self.conn.lock().unwrap_or_else(|e| e.into_inner()).take() {
            c.close();
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.disconnect();
    }
}

struct Sent {
    conn: Arc<Conn>,
    id: u64,
    rx: ReplySlot,
}

/// A call in flight.
pub struct PendingCall<'a, C: Call> {
    ep: &'a Endpoint,
    body: Vec<u8>,
    bulk: &'a [u8],
    sent: Result<Sent, CallError>,
    started: Instant,
    _c: PhantomData<C>,
}

impl<C: Call> PendingCall<'_, C> {
    /// Wait for the reply, resending after a broken connection when that is safe.
    pub fn wait(mut self) -> Result<C::Reply, Errno> {
        loop {
            let outcome = match &self.sent {
                Err(e) => Err(*e),
                Ok(s) => match s
                    .rx
                    .recv_timeout(self.ep.deadline + Duration::from_millis(200))
                {
                    Ok(r) => r,
                    Err(RecvTimeoutError::Timeout) => {
                        s.conn.forget(s.id);
                        Err(CallError::Timeout)
                    }
                    Err(RecvTimeoutError::Disconnected) => Err(CallError::Lost),
                },
            };
            match outcome {
                Ok(body) => return C::decode_reply(body).map_err(|_| Errno::EPROTO),
                Err(CallError::Remote(e)) => return Err(e),
                Err(CallError::Timeout) => {
                    tracing::warn!(addr = %self.ep.addr, call = C::NAME, "call timed out");
                    return Err(Errno::ETIMEDOUT);
                }
                Err(e @ (CallError::NotSent | CallError::Lost)) => {
                    let may_resend = e == CallError::NotSent || C::IDEMPOTENT;
                    if !may_resend || self.started.elapsed() > self.ep.reconnect_window {
                        tracing::warn!(addr = %self.ep.addr, call = C::NAME, "connection lost");
                        return Err(Errno::EIO);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    self.sent = self.ep.send(C::OP, &self.body, self.bulk);
                }
            }
        }
    }
}
