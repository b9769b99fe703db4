//! The serving side: accept connections, require `Hello` first, then read frames and
//! hand each request to a shared worker pool; replies go back on the same connection
//! in whatever order they finish. A malformed frame closes the connection; a request
//! the server cannot decode is answered with EPROTO.

use crate::arena::door::{ConnArena, Door};
use crate::codec::{BulkBody, Wire};
use crate::frame::{read_frame, write_parts, Frame, FrameHeader, FrameKind};
use crate::messages::{
    ArenaOfferReply, ArenaOfferReq, Call, HelloReply, HelloReq, ReadArenaReq, Request,
    WriteArenaReq,
};
use crossbeam_channel::{bounded, Receiver, Sender};
use spillway_types::peer::{Admitted, Peer, PeerLimits, PeerLookup, Refusal, Throttle};
use spillway_types::tunables::MAX_FRAME_LEN;
use spillway_types::Errno;
use std::io::BufReader;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Largest frame accepted before the handshake: a stranger gets no big buffers.
const HELLO_FRAME_LIMIT: u32 = 64 << 10;

/// The whole handshake (the Hello frame, however it is paced) must arrive within this
/// long of the accept: a stranger trickling bytes cannot hold a connection and its
/// thread for longer.
const HELLO_DEADLINE: Duration = Duration::from_secs(10);

/// Connections still in their handshake, per peer (`spillway_types::peer`: a remote
/// address, or on this host the uid owning the connecting socket) and in total. Beyond
/// either the connection is closed at once: strangers cannot use up the server's
/// threads and descriptors, and one local user cannot use up the share of the others
/// (clients, peers and the manager's heartbeats on the same host; root on this host
/// counts only against the total).
const HANDSHAKING_PER_PEER: usize = 64;
const HANDSHAKING_TOTAL: usize = 512;

/// A reply: encoded fields, then optional bulk data.
pub struct Reply {
    pub body: Vec<u8>,
    pub bulk: Vec<u8>,
}

impl Reply {
    pub fn of<W: Wire>(w: &W) -> Reply {
        Reply {
            body: w.to_bytes(),
            bulk: Vec::new(),
        }
    }
    pub fn bulk(data: Vec<u8>) -> Reply {
        Reply {
            body: Vec::new(),
            bulk: data,
        }
    }
}

/// What a server plugs into the wire layer.
pub trait Service: Send + Sync + 'static {
    /// Per-connection state, made by a successful hello.
    type Session: Send + Sync + 'static;
    fn hello(&self, req: &HelloReq, peer: SocketAddr)
        -> Result<(HelloReply, Self::Session), Errno>;
    fn handle(&self, session: &Self::Session, req: Request) -> Result<Reply, Errno>;
    /// Requests (by opcode and body size) that are short and never wait on other
    /// servers: run them on the connection's own thread, saving the hand-off to a
    /// worker (a thread wake-up costs as much as a loopback round trip). Everything
    /// else goes to the pool, so a slow request never holds up the connection.
    fn runs_inline(&self, _opcode: u16, _body: &[u8]) -> bool {
        false
    }
    /// The largest client arena this server maps (docs/wire-protocol.md,
    /// "Shared-memory bulk"); 0: it offers none.
    fn arena_max(&self) -> usize {
        0
    }
    /// The connection is gone and no request of it is still running.
    fn closed(&self, session: &Self::Session);

    /// After a successful handshake: how to send notices on the session's connection,
    /// kept by sessions that watch (`WatchReq`).
    fn attached(&self, _session: &Self::Session, _pusher: Pusher) {}
}

/// Sends unasked frames (kind `Notice`) on one connection, between its replies.
#[derive(Clone)]
pub struct Pusher {
    w: Arc<Mutex<TcpStream>>,
}

impl Pusher {
    /// A notice frame: opcode, the id its answer names, and the message. A send the
    /// connection does not take within its send timeout (`limit_sends`) closes the
    /// connection: part of a frame may have left, and nothing could follow it.
    pub fn notice<W: Wire>(&self, opcode: u16, id: u64, msg: &W) -> std::io::Result<()> {
        let body = msg.to_bytes();
        let head = FrameHeader {
            kind: FrameKind::Notice,
            opcode,
            id,
            aux: 0,
        }
        .encode(body.len());
        let mut s = self.w.lock().unwrap_or_else(|e| e.into_inner());
        write_parts(&mut *s, &[&head, &body]).map_err(|(e, _)| {
            let _ = s.shutdown(Shutdown::Both);
            e
        })
    }

    /// Every write on the connection (notices and replies) gives up after `d`: a
    /// client that stops reading its notices cannot hold the sender.
    pub fn limit_sends(&self, d: Duration) -> std::io::Result<()> {
        let s = self.w.lock().unwrap_or_else(|e| e.into_inner());
        s.set_write_timeout(Some(d))
    }

    /// Close the connection (a watch replaced by a newer one of the same mount).
    pub fn close(&self) {
        let s = self.w.lock().unwrap_or_else(|e| e.into_inner());
        let _ = s.shutdown(Shutdown::Both);
    }
}

struct SessionGuard<S: Service> {
    service: Arc<S>,
    session: S::Session,
}

impl<S: Service> Drop for SessionGuard<S> {
    fn drop(&mut self) {
        self.service.closed(&self.session);
    }
}

struct Job<S: Service> {
    guard: Arc<SessionGuard<S>>,
    writer: Arc<Mutex<TcpStream>>,
    frame: Frame,
    received: Instant,
    /// The connection's arena (if its client attached one) and the server's door.
    arena: Arc<ConnArena>,
    door: Option<Arc<Door>>,
}

type JobBox = Box<dyn FnOnce() + Send>;

/// A running server: stop it with `stop()`, wait for it with `join()`.
pub struct Server {
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<std::thread::JoinHandle<()>>,
    workers: Vec<std::thread::JoinHandle<()>>,
    pool_tx: Option<Sender<JobBox>>,
}

impl Server {
    pub fn start<S: Service>(
        listener: TcpListener,
        service: Arc<S>,
        workers: usize,
    ) -> std::io::Result<Server> {
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (pool_tx, pool_rx) = bounded::<JobBox>(workers * 8);
        let mut handles = Vec::new();
        for i in 0..workers.max(1) {
            let rx: Receiver<JobBox> = pool_rx.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("worker-{i}"))
                    .spawn(move || {
                        while let Ok(job) = rx.recv() {
                            // A job catches its handler's panic (`handle_caught`); this
                            // keeps the pool whole should anything else in it panic.
                            if let Err(p) =
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
                            {
                                tracing::error!("worker job panicked: {}", panic_message(&*p));
                            }
                        }
                    })?,
            );
        }
        let door = match service.arena_max() {
            0 => None,
            max => match Door::open(max, stop.clone()) {
                Ok(d) => Some(d),
                Err(e) => {
                    tracing::warn!("no shared-memory bulk (the arena door cannot open: {e})");
                    None
                }
            },
        };
        let (s2, c2, tx2) = (stop.clone(), conns.clone(), pool_tx.clone());
        let limits =
            PeerLimits::local_root_counts_only_in_total(HANDSHAKING_TOTAL, HANDSHAKING_PER_PEER);
        let mut peers = PeerLookup::new();
        let mut refused = Throttle::new(Duration::from_secs(60));
        let accept = std::thread::Builder::new()
            .name("accept".into())
            .spawn(move || {
                while !s2.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, peer)) => {
                            let Ok(local) = stream.local_addr() else {
                                continue; // already reset by the peer
                            };
                            // Connections accepted in a burst share one read of the
                            // socket table (PeerLookup keeps it for a moment).
                            let who = peers.peer_of(peer, local);
                            let admitted = match limits.admit(who) {
                                Ok(a) => a,
                                Err(why) => {
                                    let _ = stream.shutdown(Shutdown::Both);
                                    if let Some(n) = refused.allow(Instant::now()) {
                                        log_refusal(&limits, who, peer, why, n);
                                    }
                                    continue;
                                }
                            };
                            let _ = stream.set_nonblocking(false);
                            let _ = stream.set_nodelay(true);
                            if let Ok(c) = stream.try_clone() {
                                let mut g = c2.lock().unwrap_or_else(|e| e.into_inner());
                                g.retain(|s: &TcpStream| s.peer_addr().is_ok());
                                g.push(c);
                            }
                            let (svc, tx, door) = (service.clone(), tx2.clone(), door.clone());
                            let _ = std::thread::Builder::new()
                                .name(format!("conn {peer}"))
                                .spawn(move || connection(stream, peer, admitted, svc, tx, door));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(e) => {
                            tracing::warn!("accept failed: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })?;
        Ok(Server {
            stop,
            conns,
            accept: Some(accept),
            workers: handles,
            pool_tx: Some(pool_tx),
        })
    }

    /// Stop accepting, close every connection, let running requests finish.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        for c in self
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = c.shutdown(Shutdown::Both);
        }
        self.pool_tx.take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn write_reply(w: &Mutex<TcpStream>, h: FrameHeader, reply: Result<Reply, Errno>) {
    let (h, body, bulk) = match reply {
        Ok(r) => (
            FrameHeader {
                kind: FrameKind::Reply,
                aux: 0,
                ..h
            },
            r.body,
            r.bulk,
        ),
        Err(e) => (
            FrameHeader {
                kind: FrameKind::Reply,
                aux: e.0 as u32,
                ..h
            },
            Vec::new(),
            Vec::new(),
        ),
    };
    let head = h.encode(body.len() + bulk.len());
    let mut s = w.lock().unwrap_or_else(|e| e.into_inner());
    if write_parts(&mut *s, &[&head, &body, &bulk]).is_err() {
        let _ = s.shutdown(Shutdown::Both);
    }
}

/// A refused connection, logged at most once a minute (`quiet`: how many were refused
/// since the last report).
fn log_refusal(limits: &PeerLimits, who: Peer, address: SocketAddr, why: Refusal, quiet: u64) {
    let what = match why {
        Refusal::Peer => format!(
            "{who} already has {} connections in their handshake",
            limits.max_per_peer()
        ),
        Refusal::Total => format!("{} connections are in their handshake", limits.max_total()),
    };
    tracing::warn!(
        %address,
        "refusing connections: {what} ({quiet} more refused since the last report)"
    );
}

/// Reads with a deadline for the whole, not per read: the read timeout is set to what
/// is left before each read.
struct Deadline<'a> {
    stream: &'a TcpStream,
    until: Instant,
}

impl std::io::Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        std::io::Read::read(&mut self.stream, buf)
    }
}

/// Shuts a connection's socket down when dropped (see `connection`).
struct ShutdownOnExit<'a>(&'a TcpStream);

impl Drop for ShutdownOnExit<'_> {
    fn drop(&mut self) {
        let _ = self.0.shutdown(Shutdown::Both);
    }
}

fn connection<S: Service>(
    stream: TcpStream,
    peer: SocketAddr,
    admitted: Admitted,
    service: Arc<S>,
    pool: Sender<JobBox>,
    door: Option<Arc<Door>>,
) {
    // However this thread ends (a return, or a panic unwinding), the socket is shut
    // down: the accept thread holds a clone of it, so merely dropping ours would leave
    // the peer waiting on a connection nobody serves.
    let _shutdown = ShutdownOnExit(&stream);
    // The handshake: one small frame, a Hello request, all of it within the deadline.
    // Every early return shuts the socket down: the accept thread holds a clone of it,
    // so merely dropping ours would leave a stranger's connection open.
    let first = match read_frame(
        &mut Deadline {
            stream: &stream,
            until: Instant::now() + HELLO_DEADLINE,
        },
        HELLO_FRAME_LIMIT,
    ) {
        Ok(Some(f)) => f,
        _ => {
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    };
    let Ok(writer) = stream.try_clone() else {
        let _ = stream.shutdown(Shutdown::Both);
        return;
    };
    let writer = Arc::new(Mutex::new(writer));
    if first.header.kind != FrameKind::Request || first.header.opcode != HelloReq::OP {
        write_reply(&writer, first.header, Err(Errno::EPROTO));
        let _ = stream.shutdown(Shutdown::Both);
        return;
    }
    let hello = match HelloReq::from_bytes(first.body()) {
        Ok(h) => h,
        Err(_) => {
            write_reply(&writer, first.header, Err(Errno::EPROTO));
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    };
    let session = match service.hello(&hello, peer) {
        Ok((reply, session)) => {
            write_reply(&writer, first.header, Ok(Reply::of(&reply)));
            session
        }
        Err(e) => {
            tracing::info!(%peer, "handshake refused: {e}");
            write_reply(&writer, first.header, Err(e));
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    };
    let _ = stream.set_read_timeout(None);
    // Authenticated: no longer counted against the peer's handshakes.
    drop(admitted);
    service.attached(&session, Pusher { w: writer.clone() });
    let guard = Arc::new(SessionGuard {
        service: service.clone(),
        session,
    });
    let arena = Arc::new(ConnArena::default());
    // Buffered: a small request arrives in one read; bulk data bypasses the buffer.
    let mut input = BufReader::with_capacity(64 << 10, &stream);
    loop {
        let frame = match read_frame(&mut input, MAX_FRAME_LEN) {
            Ok(Some(f)) if f.header.kind == FrameKind::Request => f,
            Ok(None) => break,
            Ok(Some(_)) | Err(_) => {
                tracing::debug!(%peer, "malformed frame; closing");
                break;
            }
        };
        let job = Job {
            guard: guard.clone(),
            writer: writer.clone(),
            frame,
            received: Instant::now(),
            arena: arena.clone(),
            door: door.clone(),
        };
        if service.runs_inline(job.frame.header.opcode, job.frame.body()) {
            run_job(service.clone(), job);
            continue;
        }
        let svc = service.clone();
        let run: JobBox = Box::new(move || run_job(svc, job));
        if pool.send(run).is_err() {
            break;
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

fn run_job<S: Service>(service: Arc<S>, job: Job<S>) {
    let h = job.frame.header;
    let deadline = Duration::from_millis(u64::from(h.aux));
    let reply = if job.received.elapsed() > deadline {
        Err(Errno::ETIMEDOUT)
    } else {
        let (buf, start) = job.frame.into_parts();
        match decode(h.opcode, buf, start, &job.arena, job.door.as_deref()) {
            Err(Decoded::Answer(r)) => r,
            Err(Decoded::Invalid(e)) => {
                tracing::debug!("undecodable request (opcode {}): {e}", h.opcode);
                Err(Errno::EPROTO)
            }
            Ok(Request::HelloReq(_)) => Err(Errno::EPROTO),
            Ok(req) => {
                let name = req.name();
                let r = handle_caught(&*service, &job.guard.session, req, name);
                if let Err(e) = &r {
                    tracing::trace!(op = name, "-> {e}");
                }
                r
            }
        }
    };
    write_reply(&job.writer, h, reply);
}

/// A request the wire layer answers itself, or one that does not decode.
enum Decoded {
    Answer(Result<Reply, Errno>),
    Invalid(crate::codec::WireError),
}

/// Decode a request frame's body. The arena requests become the requests a service
/// knows, their bulk in the connection's arena: `WriteArena` a `Write`, `ReadArena` a
/// `ReadInto`; `ArenaOffer` is answered here.
fn decode(
    opcode: u16,
    buf: Vec<u8>,
    start: usize,
    arena: &Arc<ConnArena>,
    door: Option<&Door>,
) -> Result<Request, Decoded> {
    let body = buf.get(start..).unwrap_or_default();
    match opcode {
        ArenaOfferReq::OP => {
            ArenaOfferReq::from_bytes(body).map_err(Decoded::Invalid)?;
            let r = match door {
                Some(door) => door.offer(arena).map(|o| {
                    Reply::of(&ArenaOfferReply {
                        boot_id: o.host.boot_id,
                        netns_dev: o.host.netns.0,
                        netns_ino: o.host.netns.1,
                        door: o.door,
                        pid: o.pid,
                        token: o.token.to_vec(),
                    })
                }),
                None => Err(Errno::EOPNOTSUPP),
            };
            Err(Decoded::Answer(r))
        }
        WriteArenaReq::OP => {
            let r = WriteArenaReq::from_bytes(body).map_err(Decoded::Invalid)?;
            let slice = arena
                .slice(r.arena_off, r.len)
                .map_err(|e| Decoded::Answer(Err(e)))?;
            Ok(Request::Write(r.write, BulkBody::in_arena(slice)))
        }
        ReadArenaReq::OP => {
            let r = ReadArenaReq::from_bytes(body).map_err(Decoded::Invalid)?;
            let slice = arena
                .slice(r.arena_off, r.read.len)
                .map_err(|e| Decoded::Answer(Err(e)))?;
            Ok(Request::ReadInto(r.read, slice))
        }
        _ => Request::decode_at(opcode, buf, start).map_err(Decoded::Invalid),
    }
}

/// One request's handler, a panic in it caught: the request is answered EIO and the
/// connection (and the thread it runs on, often the connection's own) goes on serving.
/// A panic that escaped here would end the connection's thread while the accept
/// thread's clone keeps its socket open: the client would wait out its deadline on
/// every call until the server restarted. (State a handler left half-changed is its
/// stores' business: every lock in the server tolerates poisoning, and SQLite rolls
/// back an unfinished transaction.)
fn handle_caught<S: Service>(
    service: &S,
    session: &S::Session,
    req: Request,
    name: &'static str,
) -> Result<Reply, Errno> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        service.handle(session, req)
    })) {
        Ok(r) => r,
        Err(payload) => {
            tracing::error!(
                op = name,
                "request handler panicked ({}): answered EIO",
                panic_message(&*payload)
            );
            Err(Errno::EIO)
        }
    }
}

/// The message of a caught panic (`panic!` with a literal or a formatted string).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a non-string payload"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::Endpoint;
    use crate::messages::{ServerStatusReply, ServerStatusReq};

    /// A service whose handler panics on every other request: inline (on the
    /// connection's thread) or in the pool, as `inline` says.
    struct Panicky {
        inline: bool,
        calls: std::sync::atomic::AtomicU64,
    }

    impl Service for Panicky {
        type Session = ();
        fn hello(&self, _r: &HelloReq, _p: SocketAddr) -> Result<(HelloReply, ()), Errno> {
            crate::testkit::accept_hello()
        }
        fn handle(&self, _s: &(), _req: Request) -> Result<Reply, Errno> {
            if self.calls.fetch_add(1, Ordering::SeqCst).is_multiple_of(2) {
                panic!("handler failure on an I/O error");
            }
            Ok(Reply::of(&ServerStatusReply {
                capacity: 1,
                free: 2,
                allocated: 3,
                fragments: 4,
            }))
        }
        fn runs_inline(&self, _opcode: u16, _body: &[u8]) -> bool {
            self.inline
        }
        fn closed(&self, _s: &()) {}
    }

    /// A handler that panics costs its request (EIO), never the connection or the
    /// worker: the next calls on the same connection are answered at once.
    #[test]
    fn a_panicking_handler_answers_eio_and_the_connection_lives_on() {
        for inline in [true, false] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let service = Arc::new(Panicky {
                inline,
                calls: Default::default(),
            });
            // One worker: a worker that died with its job would leave none.
            let mut server = Server::start(listener, service, 1).unwrap();
            let hello = crate::testkit::hello();
            let ep = Endpoint::new(
                addr.to_string(),
                hello,
                Duration::from_secs(5),
                Duration::ZERO,
            );
            let conn = ep.conn().unwrap();
            for i in 0..6 {
                let t = Instant::now();
                let r = ep.call(&ServerStatusReq {});
                assert!(
                    t.elapsed() < Duration::from_secs(2),
                    "inline {inline}: slow"
                );
                if i % 2 == 0 {
                    assert_eq!(r.err(), Some(Errno::EIO), "inline {inline}, call {i}");
                } else {
                    assert_eq!(r.unwrap().fragments, 4, "inline {inline}, call {i}");
                }
            }
            // Still the first connection: none was dropped and remade.
            assert!(Arc::ptr_eq(&conn, &ep.conn().unwrap()));
            server.stop();
        }
    }
}
