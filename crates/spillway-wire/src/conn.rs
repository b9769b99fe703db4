//! The calling side of a connection. Many calls may be in flight on one connection:
//! each carries an id and every wait ends at the call's deadline. Replies are read by
//! the callers themselves (see `Conn`). An `Endpoint` owns the connection to one server
//! and reconnects when it breaks (a restarted server), resending what is safe to resend.

mod attach;
mod sendq;
mod watch;

pub use watch::{Notice, Watch, WatchCloser};

use crate::arena::{Arena, ArenaBuf, ArenaLink, Payload};
use crate::codec::Wire;
use crate::frame::{read_frame, FrameHeader, FrameKind, HEADER_LEN};
use crate::messages::{Call, HelloReply, HelloReq, ReadArenaReply, ReadArenaReq, ReadReq};
use spillway_types::tunables::MAX_FRAME_LEN;
use spillway_types::Errno;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::marker::PhantomData;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

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

/// Where one call's outcome lands, and how its caller is woken.
struct Slot {
    state: Mutex<SlotState>,
    cv: Condvar,
}

#[derive(Default)]
struct SlotState {
    result: Option<Result<Vec<u8>, CallError>>,
    /// Nobody is reading the connection any more: the caller should take over.
    nudged: bool,
    /// The caller sleeps on this slot (only such callers are nudged).
    waiting: bool,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn fill(&self, r: Result<Vec<u8>, CallError>) {
        self.lock().result = Some(r);
        self.cv.notify_one();
    }
    fn nudge(&self) {
        self.lock().nudged = true;
        self.cv.notify_one();
    }
}

/// The read side of a connection and the frame being read, kept across reads that time
/// out part-way so that a partial frame is never lost.
struct Reader {
    stream: TcpStream,
    head: [u8; HEADER_LEN],
    head_filled: usize,
    body: Vec<u8>,
    body_len: usize,
}

enum ReadOutcome {
    Frame(FrameHeader, Vec<u8>),
    TimedOut,
    Broken,
}

impl Reader {
    /// Read until one whole frame is in, the timeout passes, or the stream breaks.
    fn next(&mut self, timeout: Duration) -> ReadOutcome {
        if self
            .stream
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
            .is_err()
        {
            return ReadOutcome::Broken;
        }
        loop {
            let r = if self.head_filled < HEADER_LEN {
                self.stream.read(&mut self.head[self.head_filled..])
            } else {
                // Into spare capacity: megabytes of read data are not zero-filled
                // first. Bytes read before a timeout stay in `body`.
                let want = (self.body_len - self.body.len()) as u64;
                (&self.stream)
                    .take(want)
                    .read_to_end(&mut self.body)
                    .map(|_| 0)
            };
            match r {
                Ok(0) if self.head_filled < HEADER_LEN => return ReadOutcome::Broken,
                Ok(0) => {
                    if self.body.len() < self.body_len {
                        return ReadOutcome::Broken;
                    }
                }
                Ok(n) => {
                    self.head_filled += n;
                    if self.head_filled == HEADER_LEN {
                        let len = u32::from_le_bytes([
                            self.head[0],
                            self.head[1],
                            self.head[2],
                            self.head[3],
                        ]);
                        if len < (HEADER_LEN - 4) as u32 || len > MAX_FRAME_LEN {
                            return ReadOutcome::Broken;
                        }
                        self.body_len = len as usize - (HEADER_LEN - 4);
                        self.body = Vec::with_capacity(self.body_len);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {
                    return ReadOutcome::TimedOut;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return ReadOutcome::Broken,
            }
            if self.head_filled == HEADER_LEN && self.body.len() == self.body_len {
                self.head_filled = 0;
                let body = std::mem::take(&mut self.body);
                return match FrameHeader::decode(&self.head[4..]) {
                    Ok(h) => ReadOutcome::Frame(h, body),
                    Err(_) => ReadOutcome::Broken,
                };
            }
        }
    }
}

/// A sent call: its id and where its outcome will land.
pub struct Ticket {
    id: u64,
    slot: Arc<Slot>,
}

/// One live connection, after a successful handshake.
///
/// No thread is dedicated to reading replies: a caller waiting for its reply reads the
/// socket itself (the *leader*), handing other callers' replies to them as they pass
/// by. A lone call therefore costs one network round trip and no thread hand-off
/// (a wake-up costs as much as a loopback round trip on small machines). When the
/// leader has its reply it leaves and nudges one waiting caller to take over.
pub struct Conn {
    writer: Mutex<TcpStream>,
    reader: Mutex<Reader>,
    pending: Mutex<HashMap<u64, Arc<Slot>>>,
    next_id: AtomicU64,
    alive: AtomicBool,
    /// The queue of frames its sending thread writes (sendq.rs), once one was queued.
    queue: Mutex<Option<crossbeam_channel::Sender<sendq::Queued>>>,
    /// The arena its bulk may travel through (a server on this host), once attached.
    arena: OnceLock<Arc<ArenaLink>>,
    pub hello: HelloReply,
}

impl Conn {
    /// Connect and say hello.
    pub fn connect(
        addr: &str,
        hello: &HelloReq,
        timeout: Duration,
    ) -> Result<Arc<Conn>, CallError> {
        let (stream, hello) = handshake(addr, hello, timeout)?;
        let read_half = stream.try_clone().map_err(|_| CallError::NotSent)?;
        Ok(Arc::new(Conn {
            writer: Mutex::new(stream),
            reader: Mutex::new(Reader {
                stream: read_half,
                head: [0; HEADER_LEN],
                head_filled: 0,
                body: Vec::new(),
                body_len: 0,
            }),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            alive: AtomicBool::new(true),
            queue: Mutex::new(None),
            arena: OnceLock::new(),
            hello,
        }))
    }

    /// The arena attached to this connection, while its server maps it.
    pub fn arena(&self) -> Option<&Arc<ArenaLink>> {
        self.arena.get().filter(|l| l.is_open())
    }

    fn lock_pending(&self) -> MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// A new call's id and slot, registered as pending (its reply may be read by
    /// another caller before its own caller starts waiting), and its frame header.
    fn register(&self, opcode: u16, len: usize, deadline: Duration) -> (Ticket, [u8; HEADER_LEN]) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            state: Mutex::new(SlotState::default()),
            cv: Condvar::new(),
        });
        self.lock_pending().insert(id, slot.clone());
        let h = FrameHeader {
            kind: FrameKind::Request,
            opcode,
            id,
            aux: deadline.as_millis().min(u128::from(u32::MAX)) as u32,
        };
        (Ticket { id, slot }, h.encode(len))
    }

    /// Write one frame under the writer lock; Err(bytes that left) when it failed.
    /// Write the parts of several frames at once (the send queue's batches): how many
    /// bytes left before a failure.
    pub(crate) fn write_parts(&self, parts: &[&[u8]]) -> Result<(), usize> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        crate::frame::write_parts(&mut *w, parts).map_err(|(_, sent)| sent)
    }

    pub(crate) fn write_frame(&self, head: &[u8], body: &[u8], bulk: &[u8]) -> Result<(), usize> {
        self.write_parts(&[head, body, bulk])
    }

    /// Whether call `id` still waits for its reply (not answered, not failed).
    pub(crate) fn is_pending(&self, id: u64) -> bool {
        self.lock_pending().contains_key(&id)
    }

    /// Sending call `id` failed: it gets `e`, and the connection, unusable once part
    /// of a frame left (or broken), fails every other call.
    pub(crate) fn fail_call(&self, id: u64, e: CallError) {
        if let Some(slot) = self.lock_pending().remove(&id) {
            slot.fill(Err(e));
        }
        self.fail();
    }

    /// Send one request frame. Wait for its reply with `wait_reply`, passing the ticket:
    /// the reply may be read (by another caller) before we start waiting.
    pub fn send_raw(
        &self,
        opcode: u16,
        body: &[u8],
        bulk: &[u8],
        deadline: Duration,
    ) -> Result<Ticket, CallError> {
        if !self.is_alive() {
            return Err(CallError::NotSent);
        }
        let (ticket, head) = self.register(opcode, body.len() + bulk.len(), deadline);
        // Once part of a frame left, the connection is unusable and the caller
        // decides by the call's idempotency whether to send it again.
        if let Err(sent) = self.write_frame(&head, body, bulk) {
            self.lock_pending().remove(&ticket.id);
            self.fail();
            return Err(if sent == 0 {
                CallError::NotSent
            } else {
                CallError::Lost
            });
        }
        Ok(ticket)
    }

    /// Queue one request frame for the connection's sending thread (sendq.rs) and
    /// return at once; a failure to send lands in the ticket's slot (NotSent when no
    /// byte of it left, else Lost).
    pub fn send_queued(
        self: &Arc<Self>,
        opcode: u16,
        body: Vec<u8>,
        bulk: Arc<Payload>,
        deadline: Duration,
    ) -> Result<Ticket, CallError> {
        if !self.is_alive() {
            return Err(CallError::NotSent);
        }
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.is_none() {
            *q = Some(sendq::start(self).map_err(|_| CallError::NotSent)?);
        }
        let (ticket, head) = self.register(opcode, body.len() + bulk.len(), deadline);
        let job = sendq::Queued {
            id: ticket.id,
            head,
            body,
            bulk,
        };
        let queued = q.as_ref().is_some_and(|tx| tx.send(job).is_ok());
        drop(q);
        if !queued {
            self.lock_pending().remove(&ticket.id);
            return Err(CallError::NotSent);
        }
        Ok(ticket)
    }

    /// Wait for the reply to call `id` until `deadline`, reading the connection
    /// ourselves whenever nobody else is.
    pub fn wait_reply(&self, ticket: &Ticket, deadline: Instant) -> Result<Vec<u8>, CallError> {
        let (id, slot) = (ticket.id, &ticket.slot);
        loop {
            {
                let mut st = slot.lock();
                if let Some(r) = st.result.take() {
                    return r;
                }
                st.nudged = false;
            }
            let now = Instant::now();
            if now >= deadline {
                self.lock_pending().remove(&id);
                return Err(CallError::Timeout);
            }
            match self.reader.try_lock() {
                Ok(mut reader) => {
                    let mine = self.lead(&mut reader, id, slot, deadline);
                    drop(reader);
                    self.pass_lead();
                    if let Some(r) = mine {
                        return r;
                    }
                }
                Err(TryLockError::Poisoned(p)) => {
                    drop(p);
                    self.fail();
                }
                Err(TryLockError::WouldBlock) => {
                    // Someone else reads: say we wait, look once more whether the reader
                    // became free (a leader leaving looks for waiting callers only after
                    // it let go), then sleep until our reply arrives or we are nudged.
                    slot.lock().waiting = true;
                    if let Ok(mut reader) = self.reader.try_lock() {
                        slot.lock().waiting = false;
                        let mine = self.lead(&mut reader, id, slot, deadline);
                        drop(reader);
                        self.pass_lead();
                        if let Some(r) = mine {
                            return r;
                        }
                        continue;
                    }
                    let mut st = slot.lock();
                    if st.result.is_none() && !st.nudged {
                        let wait = deadline.saturating_duration_since(now);
                        st = slot
                            .cv
                            .wait_timeout(st, wait.min(Duration::from_millis(100)))
                            .map_or_else(|e| e.into_inner().0, |r| r.0);
                    }
                    st.waiting = false;
                }
            }
        }
    }

    /// Read frames, delivering other callers' replies, until ours comes (returned), the
    /// deadline passes, or the connection breaks.
    fn lead(
        &self,
        reader: &mut Reader,
        id: u64,
        slot: &Slot,
        deadline: Instant,
    ) -> Option<Result<Vec<u8>, CallError>> {
        loop {
            if let Some(r) = slot.lock().result.take() {
                return Some(r);
            }
            if !self.is_alive() {
                return Some(Err(CallError::Lost));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            match reader.next(left) {
                ReadOutcome::Frame(h, body) if h.kind == FrameKind::Reply => {
                    let r = if h.aux == 0 {
                        Ok(body)
                    } else {
                        Err(CallError::Remote(Errno(h.aux as i32)))
                    };
                    let waiter = self.lock_pending().remove(&h.id);
                    if h.id == id {
                        return Some(r);
                    }
                    if let Some(w) = waiter {
                        w.fill(r);
                    }
                }
                ReadOutcome::TimedOut => {}
                ReadOutcome::Frame(..) | ReadOutcome::Broken => {
                    self.fail();
                    return Some(Err(CallError::Lost));
                }
            }
        }
    }

    /// The reader is free again: if a caller sleeps waiting, wake one to read.
    fn pass_lead(&self) {
        let sleeper = self
            .lock_pending()
            .values()
            .find(|s| s.lock().waiting)
            .cloned();
        if let Some(s) = sleeper {
            s.nudge();
        }
    }

    /// The connection is broken: fail every waiting call.
    fn fail(&self) {
        self.alive.store(false, Ordering::SeqCst);
        // The sending thread ends once it has drained what is queued (every call of
        // which is failed below, so it writes none of them).
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Ok(w) = self.writer.lock() {
            let _ = w.shutdown(Shutdown::Both);
        }
        for (_, s) in self.lock_pending().drain() {
            s.fill(Err(CallError::Lost));
        }
    }

    pub fn close(&self) {
        self.fail();
    }
}

/// Connect to `addr` and make the handshake: the stream (its read timeout still
/// `timeout`) and the server's answer.
pub(crate) fn handshake(
    addr: &str,
    hello: &HelloReq,
    timeout: Duration,
) -> Result<(TcpStream, HelloReply), CallError> {
    let sockaddr = addr
        .to_socket_addrs()
        .map_err(|_| CallError::NotSent)?
        .next()
        .ok_or(CallError::NotSent)?;
    let mut stream =
        TcpStream::connect_timeout(&sockaddr, timeout).map_err(|_| CallError::NotSent)?;
    stream.set_nodelay(true).ok();
    let body = hello.to_bytes();
    let h = FrameHeader {
        kind: FrameKind::Request,
        opcode: HelloReq::OP,
        id: 0,
        aux: timeout.as_millis().min(u128::from(u32::MAX)) as u32,
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
        HelloReply::from_bytes(reply.body()).map_err(|_| CallError::Remote(Errno::EPROTO))?;
    Ok((stream, hello))
}

/// Where an endpoint gets a fresh credential before it connects: `None` keeps the one
/// it has. Lets a client follow a capability that is renewed while it runs.
pub type CredentialSource = Box<dyn Fn() -> Option<Vec<u8>> + Send + Sync>;

/// A server as seen by a caller: its address, the handshake to make, and the current
/// connection (made on first use, remade after a failure).
pub struct Endpoint {
    pub addr: String,
    link: Mutex<Link>,
    credential_source: Option<CredentialSource>,
    pub deadline: Duration,
    pub reconnect_window: Duration,
    /// How long after a reconnect window spent in vain every call fails at once
    /// (`down_since` records when it was): for ever for one task's endpoint
    /// (`giving_up_once_unreachable`), a rest for one with somewhere else to go
    /// (`failing_over`); None: each call gets its own window.
    give_up: Option<Duration>,
    down_since: Mutex<Option<Instant>>,
    /// Offered to every connection made (used where the server is on this host).
    arena: Option<Arc<Arena>>,
    /// Connections made so far: a server session (its opens, its locks) lives as long
    /// as one connection, so a caller compares this to know its session is the same.
    made: AtomicU64,
}

/// The connection and the handshake that makes it, under one lock: a connection is
/// made by one caller at a time, with the credential current at that moment.
struct Link {
    conn: Option<Arc<Conn>>,
    hello: HelloReq,
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
            link: Mutex::new(Link { conn: None, hello }),
            credential_source: None,
            deadline,
            reconnect_window,
            give_up: None,
            down_since: Mutex::new(None),
            arena: None,
            made: AtomicU64::new(0),
        }
    }

    /// Offer `arena` on every connection this endpoint makes: where the server is on
    /// this host, bulk data in the arena's slots travels through it.
    pub fn with_arena(mut self, arena: Arc<Arena>) -> Endpoint {
        self.arena = Some(arena);
        self
    }

    /// A free slot of the arena, if the current connection has it attached (so bulk
    /// placed in it goes through shared memory); None otherwise. Never connects.
    pub fn arena_buf(&self) -> Option<ArenaBuf> {
        self.attached()?.1.arena().take()
    }

    /// The current connection, if alive and its server maps the arena, and its link.
    /// Never connects.
    fn attached(&self) -> Option<(Arc<Conn>, Arc<ArenaLink>)> {
        let conn = self.lock_link().conn.clone().filter(|c| c.is_alive())?;
        let link = conn.arena()?.clone();
        Some((conn, link))
    }

    /// An endpoint for one task that fails as a whole when a server is gone (a
    /// stage): once a connection could not be made within the reconnect window, later
    /// calls fail at once instead of each waiting a window of its own. Without this,
    /// a task making N calls to a dead server takes N windows to fail.
    pub fn giving_up_once_unreachable(mut self) -> Endpoint {
        self.give_up = Some(Duration::MAX);
        self
    }

    /// An endpoint for a caller with somewhere else to go (a read of a load-balanced
    /// instance, which another replica can answer): once a connection could not be
    /// made within the reconnect window, every call fails at once for `rest`, so
    /// that the reads queued behind a dead server fail over together instead of each
    /// waiting a window of its own; after `rest` the server is tried again.
    pub fn failing_over(mut self, rest: Duration) -> Endpoint {
        self.give_up = Some(rest);
        self
    }

    fn gave_up(&self) -> bool {
        match (self.give_up, *self.lock_down()) {
            (Some(rest), Some(at)) => at.elapsed() < rest,
            _ => false,
        }
    }

    fn lock_down(&self) -> MutexGuard<'_, Option<Instant>> {
        self.down_since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ask `source` for the credential before every connection attempt (the first
    /// included: an endpoint may first connect long after it was made).
    pub fn with_credential_source(mut self, source: CredentialSource) -> Endpoint {
        self.credential_source = Some(source);
        self
    }

    fn lock_link(&self) -> MutexGuard<'_, Link> {
        self.link.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current connection, connecting (with retries within the reconnect window)
    /// when there is none or it broke.
    pub fn conn(&self) -> Result<Arc<Conn>, CallError> {
        let mut guard = self.lock_link();
        if let Some(c) = guard.conn.as_ref() {
            if c.is_alive() {
                return Ok(c.clone());
            }
        }
        guard.conn = None;
        if self.gave_up() {
            return Err(CallError::NotSent);
        }
        let start = Instant::now();
        let mut backoff = Duration::from_millis(20);
        loop {
            if let Some(fresh) = self.credential_source.as_ref().and_then(|f| f()) {
                guard.hello.credential = fresh;
            }
            match Conn::connect(
                &self.addr,
                &guard.hello,
                self.deadline.min(Duration::from_secs(10)),
            ) {
                Ok(c) => {
                    if let Some(arena) = &self.arena {
                        let wait = self.deadline.min(Duration::from_secs(10));
                        match attach::attach(&c, arena, wait) {
                            Ok(link) => {
                                let _ = c.arena.set(link);
                                tracing::debug!(addr = %self.addr, "bulk through shared memory");
                            }
                            Err(why) => {
                                tracing::debug!(addr = %self.addr, "bulk over the socket: {why}");
                            }
                        }
                    }
                    guard.conn = Some(c.clone());
                    self.made.fetch_add(1, Ordering::SeqCst);
                    return Ok(c);
                }
                Err(CallError::Remote(e)) => return Err(CallError::Remote(e)),
                Err(e) => {
                    if start.elapsed() >= self.reconnect_window {
                        tracing::warn!(addr = %self.addr, "server unreachable");
                        if self.give_up.is_some() {
                            *self.lock_down() = Some(Instant::now());
                        }
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
        // The reconnect window counts from the first attempt: a send that already
        // spent the window connecting must not get a second one.
        let started = Instant::now();
        let sent = self.send(C::OP, &body, bulk);
        PendingCall {
            ep: self,
            body,
            bulk,
            sent,
            started,
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
        let ticket = conn.send_raw(op, body, bulk, self.deadline)?;
        Ok(Sent { conn, ticket })
    }

    /// Which of this endpoint's connections (so which server session) a call made now
    /// lands on: connects first if there is none or it broke.
    pub fn session(&self) -> Result<u64, CallError> {
        self.conn()?;
        Ok(self.made.load(Ordering::SeqCst))
    }

    /// The handshake this endpoint makes now (with a fresh credential, if it has a
    /// source), for a connection of another kind to the same server (`Watch`).
    pub(crate) fn current_hello(&self) -> HelloReq {
        let mut guard = self.lock_link();
        if let Some(fresh) = self.credential_source.as_ref().and_then(|f| f()) {
            guard.hello.credential = fresh;
        }
        guard.hello.clone()
    }

    /// Drop the connection (tests; shutdown).
    pub fn disconnect(&self) {
        if let Some(c) = self.lock_link().conn.take() {
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
    ticket: Ticket,
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
    /// Whether the request went out. It did not when the server stayed unreachable
    /// for the whole reconnect window (or refused the connection outright): `wait`
    /// then fails at once, and a caller keeping several calls in flight should not
    /// start more.
    pub fn is_sent(&self) -> bool {
        self.sent.is_ok()
    }

    /// Wait for the reply, resending after a broken connection when that is safe.
    pub fn wait(mut self) -> Result<C::Reply, Errno> {
        let (ep, body, bulk) = (self.ep, &self.body, self.bulk);
        finish::<C>(ep, &mut self.sent, self.started, &mut false, &mut |_| {
            ep.send(C::OP, body, bulk)
        })
    }
}

/// A read in flight: its data comes back through the connection's arena when the
/// server is on this host and a slot is free (`ReadArena`), else as bulk on the socket.
pub enum PendingRead<'a> {
    Plain(PendingCall<'a, ReadReq>),
    Arena(ArenaRead<'a>),
}

/// A `ReadArena` in flight, into `buf`.
pub struct ArenaRead<'a> {
    ep: &'a Endpoint,
    req: ReadReq,
    sent: Result<Sent, CallError>,
    link: Arc<ArenaLink>,
    buf: Option<ArenaBuf>,
}

impl Endpoint {
    /// Start reading `req`: through the arena where the connection has one (and a
    /// slot holds `req.len` bytes), else as a plain `Read`.
    pub fn start_read(&self, req: &ReadReq) -> PendingRead<'_> {
        if let Some((conn, link)) = self.attached() {
            if req.len as usize <= link.arena().slot_size() {
                if let Some(buf) = link.arena().take() {
                    let body = ReadArenaReq {
                        read: req.clone(),
                        arena_off: buf.offset(),
                    }
                    .to_bytes();
                    let sent = conn
                        .send_raw(ReadArenaReq::OP, &body, &[], self.deadline)
                        .map(|ticket| Sent { conn, ticket });
                    return PendingRead::Arena(ArenaRead {
                        ep: self,
                        req: req.clone(),
                        sent,
                        link,
                        buf: Some(buf),
                    });
                }
            }
        }
        PendingRead::Plain(self.start(req, &[]))
    }
}

impl PendingRead<'_> {
    /// The data read: fewer bytes than asked past the stripe's stored end.
    pub fn wait(self) -> Result<Payload, Errno> {
        match self {
            PendingRead::Plain(c) => c.wait().map(Payload::Heap),
            PendingRead::Arena(r) => r.wait(),
        }
    }
}

impl ArenaRead<'_> {
    fn wait(mut self) -> Result<Payload, Errno> {
        let outcome = match &self.sent {
            Err(e) => Err(*e),
            Ok(s) => s.conn.wait_reply(
                &s.ticket,
                Instant::now() + self.ep.deadline + Duration::from_millis(200),
            ),
        };
        // An answered read takes its slot out of `self.buf` (the server is done with
        // it); an unanswered one leaves it there for `drop` to hold.
        match outcome {
            Ok(body) => {
                let mut buf = self.buf.take().ok_or(Errno::EIO)?;
                let r = ReadArenaReply::from_bytes(&body).map_err(|_| Errno::EPROTO)?;
                if r.len > self.req.len {
                    return Err(Errno::EPROTO);
                }
                buf.set_len(r.len as usize);
                Ok(Payload::Arena(buf))
            }
            Err(CallError::Remote(e)) => {
                self.buf = None;
                Err(e)
            }
            Err(e) => {
                // Sent and unanswered: the server may still write into the slot.
                self.hold_unanswered();
                if e == CallError::Timeout {
                    tracing::warn!(addr = %self.ep.addr, "read timed out");
                    return Err(Errno::ETIMEDOUT);
                }
                // Reads are idempotent: once more, plainly (with its own resends).
                self.ep.call(&self.req).map(Payload::Heap)
            }
        }
    }

    /// The read was sent and got no answer: its slot goes to the link, which frees it
    /// once the server cannot write into it any more.
    fn hold_unanswered(&mut self) {
        if self.sent.is_ok() {
            if let Some(buf) = self.buf.take() {
                self.link.hold(Arc::new(Payload::Arena(buf)));
            }
        }
    }
}

impl Drop for ArenaRead<'_> {
    /// Dropped without its answer (a read of several pieces ended at another piece's
    /// error): the server may still be writing into the slot.
    fn drop(&mut self) {
        self.hold_unanswered();
    }
}

/// A call in flight that owns its endpoint and its bulk data, so that it may outlive
/// the request that started it (write-behind): it can still be sent again after a
/// reconnect, and `wait` hands the bulk buffer back for reuse. Bulk in a slot of the
/// connection's arena goes through shared memory (the request's `ARENA_OP` twin);
/// such a call that ends without a reply leaves its slot with the arena's link until
/// the server can no longer touch it (`ArenaLink::hold`).
pub struct OwnedCall<C: Call> {
    ep: Arc<Endpoint>,
    body: Vec<u8>,
    /// Shared with the connection's send queue until the frame is written.
    bulk: Arc<Payload>,
    sent: Result<Sent, CallError>,
    /// The arena link the current send lent the bulk's slot through.
    lent: Option<Arc<ArenaLink>>,
    started: Instant,
    _c: PhantomData<C>,
}

impl<C: Call> OwnedCall<C> {
    /// Start `req` with `bulk` on `ep`, sent by this thread before it returns: for a
    /// call its caller waits for soon (a flush, an fsync), where handing the frame to
    /// another thread would only add a wake-up to the wait.
    pub fn start(ep: &Arc<Endpoint>, req: &C, bulk: impl Into<Payload>) -> OwnedCall<C> {
        Self::begin(ep, req, bulk.into(), false)
    }

    /// Start `req` with `bulk` on `ep`, queued for the connection's sending thread
    /// (sendq.rs): this returns before the bytes are on the socket (write-behind).
    /// Bulk that goes through the arena is queued the same way (its frame is a few
    /// bytes, but sending it costs the server's side of loopback TCP too).
    pub fn queue(ep: &Arc<Endpoint>, req: &C, bulk: impl Into<Payload>) -> OwnedCall<C> {
        Self::begin(ep, req, bulk.into(), true)
    }

    fn begin(ep: &Arc<Endpoint>, req: &C, bulk: Payload, queued: bool) -> OwnedCall<C> {
        let mut call = OwnedCall {
            ep: ep.clone(),
            body: req.to_bytes(),
            bulk: Arc::new(bulk),
            sent: Err(CallError::NotSent),
            lent: None,
            started: Instant::now(),
            _c: PhantomData,
        };
        let (sent, lent) = send_owned::<C>(&call.ep, &call.body, &call.bulk, queued);
        call.sent = sent;
        call.lent = lent;
        call
    }

    /// Whether the reply is already in (waiting for it would not block).
    pub fn is_done(&self) -> bool {
        match &self.sent {
            Err(_) => true,
            Ok(s) => s.ticket.slot.lock().result.is_some(),
        }
    }

    /// Wait for the reply (see `PendingCall::wait`); the bulk buffer comes back too
    /// (empty when the sending thread or an arena link still holds it).
    pub fn wait(mut self) -> (Result<C::Reply, Errno>, Payload) {
        // Taken out, as `drop` runs after this: what is left there is nothing to hold.
        let bulk = std::mem::take(&mut self.bulk);
        let (ep, body) = (self.ep.clone(), &self.body);
        let lent = &mut self.lent;
        let mut unanswered = false;
        let r = finish::<C>(
            &ep,
            &mut self.sent,
            self.started,
            &mut unanswered,
            &mut |lost| {
                // Sent through the arena and no reply: the server may still be at it.
                if let (Some(link), true) = (lent.take(), lost) {
                    link.hold(bulk.clone());
                }
                let (sent, l) = send_owned::<C>(&ep, body, &bulk, false);
                *lent = l;
                sent
            },
        );
        // Answered: the server is done with the slot. Unanswered: it may still read it.
        if let (Some(link), true) = (self.lent.take(), unanswered) {
            link.hold(bulk.clone());
        }
        (r, Arc::try_unwrap(bulk).unwrap_or_default())
    }
}

impl<C: Call> Drop for OwnedCall<C> {
    /// Dropped without `wait` (a file's write-behind given up with writes in flight):
    /// a send through the arena lent the slot to the server, which may still be
    /// writing from it unless its reply is in; the slot must not go to the next write.
    fn drop(&mut self) {
        if let Some(link) = self.lent.take() {
            if !self.is_done() {
                link.hold(std::mem::take(&mut self.bulk));
            }
        }
    }
}

/// Send an owned call's frame: through the arena when its bulk lies in a slot of the
/// connection's arena and the request has an arena twin, else with the bulk on the
/// socket (queued for the sending thread when `queued`). Also returns the link the
/// slot was lent through.
fn send_owned<C: Call>(
    ep: &Endpoint,
    body: &[u8],
    bulk: &Arc<Payload>,
    queued: bool,
) -> (Result<Sent, CallError>, Option<Arc<ArenaLink>>) {
    let conn = match ep.conn() {
        Ok(c) => c,
        Err(e) => return (Err(e), None),
    };
    if let (Some(op), Some(b)) = (C::ARENA_OP, bulk.arena_buf()) {
        if let Some(link) = conn.arena().filter(|l| l.owns(bulk)).cloned() {
            let mut twin = Vec::with_capacity(body.len() + 12);
            twin.extend_from_slice(body);
            twin.extend_from_slice(&b.offset().to_le_bytes());
            twin.extend_from_slice(&(b.len() as u32).to_le_bytes());
            let sent = if queued {
                conn.send_queued(op, twin, Arc::new(Payload::default()), ep.deadline)
            } else {
                conn.send_raw(op, &twin, &[], ep.deadline)
            };
            return (sent.map(|ticket| Sent { conn, ticket }), Some(link));
        }
    }
    let sent = if queued {
        conn.send_queued(C::OP, body.to_vec(), bulk.clone(), ep.deadline)
    } else {
        conn.send_raw(C::OP, body, bulk, ep.deadline)
    };
    (sent.map(|ticket| Sent { conn, ticket }), None)
}

/// Wait for a call's reply, resending it after a broken connection when that is safe:
/// it never left, or it is idempotent (within the endpoint's reconnect window).
/// `send_again(lost)` sends it again; `lost`: the previous send may have reached the
/// server (it is not known whether the server is done with it). `unanswered` is set
/// when the call fails that way: sent, and no reply.
fn finish<C: Call>(
    ep: &Endpoint,
    sent: &mut Result<Sent, CallError>,
    started: Instant,
    unanswered: &mut bool,
    send_again: &mut dyn FnMut(bool) -> Result<Sent, CallError>,
) -> Result<C::Reply, Errno> {
    loop {
        let outcome = match &*sent {
            Err(e) => Err(*e),
            Ok(s) => s.conn.wait_reply(
                &s.ticket,
                Instant::now() + ep.deadline + Duration::from_millis(200),
            ),
        };
        match outcome {
            Ok(body) => return C::decode_reply(body).map_err(|_| Errno::EPROTO),
            Err(CallError::Remote(e)) => return Err(e),
            Err(CallError::Timeout) => {
                tracing::warn!(addr = %ep.addr, call = C::NAME, "call timed out");
                *unanswered = true;
                return Err(Errno::ETIMEDOUT);
            }
            Err(e @ (CallError::NotSent | CallError::Lost)) => {
                let may_resend = e == CallError::NotSent || C::IDEMPOTENT;
                if !may_resend || started.elapsed() > ep.reconnect_window || ep.gave_up() {
                    tracing::warn!(addr = %ep.addr, call = C::NAME, "connection lost");
                    *unanswered = e == CallError::Lost;
                    return Err(Errno::EIO);
                }
                std::thread::sleep(Duration::from_millis(20));
                *sent = send_again(e == CallError::Lost);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{HelloReq, ServerStatusReq};

    /// An endpoint for a local port nothing listens on.
    fn dead_server(window: Duration) -> Endpoint {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let hello = HelloReq {
            version_min: 1,
            version_max: 1,
            role: 0,
            instance: 0,
            credential: Vec::new(),
            peer_name: "test".into(),
            mount: 0,
        };
        Endpoint::new(
            format!("127.0.0.1:{port}"),
            hello,
            Duration::from_secs(5),
            window,
        )
    }

    /// A call to a server that is gone fails once the reconnect window has passed,
    /// counted from the first attempt: the connecting done by the first send is part
    /// of the window, not extra to it.
    #[test]
    fn a_dead_server_fails_a_call_after_one_reconnect_window() {
        let window = Duration::from_millis(600);
        let ep = dead_server(window);
        let t = Instant::now();
        let r = ep.call(&ServerStatusReq {});
        let took = t.elapsed();
        assert_eq!(r.err(), Some(Errno::EIO));
        assert!(took >= window, "{took:?}");
        assert!(took < window * 2, "two windows: {took:?}");
    }

    /// An endpoint for one task (a stage) spends one reconnect window on a dead
    /// server: the calls after the first fail at once.
    #[test]
    fn an_endpoint_that_gives_up_fails_later_calls_at_once() {
        let window = Duration::from_millis(600);
        let ep = dead_server(window).giving_up_once_unreachable();
        let t = Instant::now();
        assert_eq!(ep.call(&ServerStatusReq {}).err(), Some(Errno::EIO));
        assert!(t.elapsed() >= window);
        for _ in 0..3 {
            let t = Instant::now();
            assert_eq!(ep.call(&ServerStatusReq {}).err(), Some(Errno::EIO));
            assert!(t.elapsed() < window / 2, "waited again: {:?}", t.elapsed());
        }
    }

    /// An endpoint failing over (a load-balanced read) spends one window on a dead
    /// server, fails every call at once while the server rests, and tries it again
    /// afterwards (a restarted replica is used again).
    #[test]
    fn an_endpoint_failing_over_rests_a_dead_server_then_tries_again() {
        let window = Duration::from_millis(300);
        let rest = Duration::from_millis(900);
        let ep = dead_server(window).failing_over(rest);
        let t = Instant::now();
        assert_eq!(ep.call(&ServerStatusReq {}).err(), Some(Errno::EIO));
        assert!(t.elapsed() >= window);
        let t = Instant::now();
        assert_eq!(ep.call(&ServerStatusReq {}).err(), Some(Errno::EIO));
        assert!(
            t.elapsed() < window / 2,
            "waited while resting: {:?}",
            t.elapsed()
        );
        std::thread::sleep(rest);
        let t = Instant::now();
        assert_eq!(ep.call(&ServerStatusReq {}).err(), Some(Errno::EIO));
        assert!(t.elapsed() >= window, "not tried again after the rest");
    }
}
