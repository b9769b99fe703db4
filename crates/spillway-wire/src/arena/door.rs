//! How a connection gets its arena, and how long the server may touch it.
//!
//! 1. On an authenticated connection the client asks `ArenaOffer`. A server that
//!    offers arenas answers with its host's identity (host.rs), the name of its *door*
//!    (an abstract Unix socket, bound with a random name at start), its pid, and a
//!    fresh 32-byte token bound to this connection (valid 10 s, once).
//! 2. A client on the same host connects to the door, checks that the socket's peer
//!    is the server it asked (SO_PEERCRED: that pid, and root or the client's own uid:
//!    nobody else can have bound the name the server announced and wait for a
//!    client's memory), and sends the token with its memfd (SCM_RIGHTS).
//! 3. The server takes the token back (unknown or used: refused), checks and maps the
//!    memfd (shared.rs), attaches the mapping to the token's connection, and answers
//!    one byte: 0, or the errno of the refusal.
//!
//! The token is what binds the door's stranger to an authenticated connection: a user
//! who connects to the door without one gets nothing. The Unix socket stays open on
//! both sides for as long as the server keeps the mapping, which is until the
//! connection is gone and the last request using the arena has finished. Its closing
//! is how the client learns that no server thread can still read or write a slot: a
//! call that ended without a reply (a timeout, a lost connection) keeps its slot out
//! of use until then (`ArenaLink::hold`), since the server may still be executing it.

use super::host::HostId;
use super::shared::{self, Mapping};
use super::{Arena, Payload};
use spillway_types::descriptor::encode_hex;
use spillway_types::Errno;
use std::collections::HashMap;
use std::io::{self, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

const TOKEN_LEN: usize = 32;
type Token = [u8; TOKEN_LEN];
/// How long a token waits for its client at the door.
const TOKEN_LIFETIME: Duration = Duration::from_secs(10);
/// Tokens outstanding at once (each is a connection's; more are refused, EBUSY).
const MAX_TOKENS: usize = 4096;
/// Strangers served at the door at once, and how long each may take, counted from
/// its accept: a user who connects and sends nothing holds a thread for this long at
/// most, and at most this
/// many of them (then the door closes new connections at once; clients fall back to
/// the socket). Of those, at most `DOOR_THREADS_UNPRIVILEGED` for peers other than
/// root: mounts run as root, so a user holding the door open never keeps a mount out.
const DOOR_THREADS: usize = 16;
const DOOR_THREADS_UNPRIVILEGED: usize = 8;
const DOOR_DEADLINE: Duration = Duration::from_secs(2);

// ---- the server's side ----------------------------------------------------------

/// What a server tells a client about its door (`ArenaOfferReply`).
pub(crate) struct Offer {
    pub(crate) host: HostId,
    pub(crate) door: Vec<u8>,
    pub(crate) pid: u32,
    pub(crate) token: Token,
}

/// The server's door: where clients on its host hand over their arenas.
pub(crate) struct Door {
    name: Vec<u8>,
    host: HostId,
    max: usize,
    pending: Mutex<HashMap<Token, (Weak<ConnArena>, Instant)>>,
    /// Strangers being served, all and those not root.
    active: AtomicUsize,
    active_unprivileged: AtomicUsize,
}

/// A connection's arena on the server: none until its client attached one, and then
/// that one for the connection's life (read without a lock by every request).
#[derive(Default)]
pub(crate) struct ConnArena(OnceLock<Arc<ServerArena>>);

/// A client's arena as the server maps it, and the server's end of the door socket,
/// closed (telling the client) when the mapping goes.
pub(crate) struct ServerArena {
    map: Mapping,
    link: UnixStream,
}

/// The bytes of one request in a client's arena: a write's data, or where a read's
/// reply goes. The client may change them at any time (they are its own memory), so
/// the server only hands them to system calls (pwrite, pread), never decides anything
/// by them.
pub struct ArenaSlice {
    arena: Arc<ServerArena>,
    off: usize,
    len: usize,
}

impl std::fmt::Debug for ArenaSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ArenaSlice({}+{})", self.off, self.len)
    }
}

impl ArenaSlice {
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: in bounds (checked in `ConnArena::slice`); the mapping lives as long
        // as the Arc this slice holds.
        unsafe { std::slice::from_raw_parts(self.arena.map.ptr().add(self.off), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`; the client lent this range to this request alone.
        unsafe { std::slice::from_raw_parts_mut(self.arena.map.ptr().add(self.off), self.len) }
    }
}

impl ConnArena {
    fn is_set(&self) -> bool {
        self.0.get().is_some()
    }

    /// `len` bytes at `off` of this connection's arena: EPROTO when it has none (the
    /// client sent an arena request without attaching one), EINVAL when the range does
    /// not lie within it.
    pub(crate) fn slice(&self, off: u64, len: u32) -> Result<ArenaSlice, Errno> {
        let arena = self.0.get().ok_or(Errno::EPROTO)?.clone();
        let size = arena.map.len() as u64;
        match off.checked_add(u64::from(len)) {
            Some(end) if end <= size => Ok(ArenaSlice {
                arena,
                off: off as usize,
                len: len as usize,
            }),
            _ => Err(Errno::EINVAL),
        }
    }
}

impl Door {
    /// Bind the door under a fresh random name and serve it until `stop`.
    pub(crate) fn open(max: usize, stop: Arc<AtomicBool>) -> io::Result<Arc<Door>> {
        let host = HostId::current()
            .ok_or_else(|| io::Error::other("this host's identity is unknown (/proc)"))?;
        let mut rand = [0u8; 8];
        fill_random(&mut rand)?;
        let name = format!(
            "spillway-arena-{}-{}",
            std::process::id(),
            encode_hex(&rand)
        );
        let name = name.into_bytes();
        let listener = UnixListener::bind_addr(&SocketAddr::from_abstract_name(&name)?)?;
        listener.set_nonblocking(true)?;
        let door = Arc::new(Door {
            name,
            host,
            max,
            pending: Mutex::new(HashMap::new()),
            active: AtomicUsize::new(0),
            active_unprivileged: AtomicUsize::new(0),
        });
        let d = door.clone();
        std::thread::Builder::new()
            .name("arena-door".into())
            .spawn(move || d.serve(listener, stop))?;
        Ok(door)
    }

    fn serve(self: Arc<Self>, listener: UnixListener, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((stream, _)) => {
                    // The stranger's time starts now, not when its thread runs.
                    let deadline = Instant::now() + DOOR_DEADLINE;
                    // Unknown credentials count as not root.
                    let root = peer_cred(&stream).is_ok_and(|(_, uid)| uid == 0);
                    let Some(seat) = Seat::take(&self, root) else {
                        continue; // dropped: closed at once
                    };
                    let d = self.clone();
                    // A failed spawn drops the closure, and with it the seat.
                    let _ = std::thread::Builder::new()
                        .name("arena-admit".into())
                        .spawn(move || {
                            let _seat = seat;
                            d.admit(stream, deadline);
                        });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    tracing::warn!("arena door: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Answer an `ArenaOffer` of the connection whose arena is `cell` (serve.rs puts
    /// it into an `ArenaOfferReply`). A connection has one token at a time: a new
    /// offer replaces its earlier token, so no connection can fill the table.
    pub(crate) fn offer(&self, cell: &Arc<ConnArena>) -> Result<Offer, Errno> {
        if cell.is_set() {
            return Err(Errno::EEXIST);
        }
        let mut token = [0u8; TOKEN_LEN];
        fill_random(&mut token).map_err(|_| Errno::EIO)?;
        {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let own = Arc::downgrade(cell);
            p.retain(|_, (c, made)| {
                c.strong_count() > 0 && now - *made < TOKEN_LIFETIME && !Weak::ptr_eq(c, &own)
            });
            if p.len() >= MAX_TOKENS {
                return Err(Errno::EBUSY);
            }
            p.insert(token, (own, now));
        }
        Ok(Offer {
            host: self.host.clone(),
            door: self.name.clone(),
            pid: std::process::id(),
            token,
        })
    }

    /// One stranger at the door: a token and a memfd by `deadline`, or nothing. The
    /// answer is one byte sent without waiting (a stranger who never reads cannot hold
    /// the thread with it either); a refused stranger's socket is shut at once.
    fn admit(&self, stream: UnixStream, deadline: Instant) {
        let answer = match self.take_arena(&stream, deadline) {
            Ok((cell, map)) => {
                // Attached before the answer: the client's next request may use it.
                // The socket goes with the mapping (its closing tells the client).
                match cell.0.set(Arc::new(ServerArena { map, link: stream })) {
                    Ok(()) => {
                        if let Some(a) = cell.0.get() {
                            let _ = (&a.link).write_all(&[0]);
                        }
                        return;
                    }
                    // Another stranger attached one first (two offers raced).
                    Err(lost) => {
                        send_now(&lost.link, Errno::EEXIST.0 as u8);
                        let _ = lost.link.shutdown(Shutdown::Both);
                        return;
                    }
                }
            }
            Err(e) => e,
        };
        send_now(&stream, answer.0.clamp(1, 255) as u8);
        let _ = stream.shutdown(Shutdown::Both);
    }

    fn take_arena(
        &self,
        stream: &UnixStream,
        deadline: Instant,
    ) -> Result<(Arc<ConnArena>, Mapping), Errno> {
        readable_by(stream, deadline).map_err(|e| {
            tracing::debug!("arena door: nothing received in time: {e}");
            Errno::EPROTO
        })?;
        let (token, fd) = recv_token_and_fd(stream).map_err(|e| {
            tracing::debug!("arena door: nothing usable received: {e}");
            Errno::EPROTO
        })?;
        let entry = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&token);
        let Some((cell, made)) = entry else {
            tracing::info!("arena door: unknown or used token refused");
            return Err(Errno::EACCES);
        };
        if made.elapsed() >= TOKEN_LIFETIME {
            return Err(Errno::EACCES);
        }
        let cell = cell.upgrade().ok_or(Errno(libc::ENOTCONN))?;
        if cell.is_set() {
            return Err(Errno::EEXIST);
        }
        let map = shared::map_checked(&fd, self.max).map_err(|why| {
            tracing::info!("arena door: memfd refused: {why}");
            Errno::EINVAL
        })?;
        Ok((cell, map))
    }
}

/// A stranger's place at the door, given back when dropped.
struct Seat {
    door: Arc<Door>,
    root: bool,
}

impl Seat {
    fn take(door: &Arc<Door>, root: bool) -> Option<Seat> {
        if !root
            && door.active_unprivileged.fetch_add(1, Ordering::SeqCst) >= DOOR_THREADS_UNPRIVILEGED
        {
            door.active_unprivileged.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        let seat = Seat {
            door: door.clone(),
            root,
        };
        if door.active.fetch_add(1, Ordering::SeqCst) >= DOOR_THREADS {
            drop(seat);
            return None;
        }
        Some(seat)
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.door.active.fetch_sub(1, Ordering::SeqCst);
        if !self.root {
            self.door.active_unprivileged.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

// ---- the client's side ----------------------------------------------------------

/// A connection's arena, attached, as the client sees it.
pub struct ArenaLink {
    arena: Arc<Arena>,
    /// Whether the server's side of the door socket closed (it maps the arena no
    /// more): read by every request, so not behind the lock.
    closed: AtomicBool,
    /// Payloads whose calls ended without a reply, kept out of use until then.
    /// `closed` is set under this lock, so nothing is held after it was set.
    held: Mutex<Vec<Arc<Payload>>>,
}

impl ArenaLink {
    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    /// Whether the server still maps the arena.
    pub fn is_open(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
    }

    /// A call carrying `p` through this link ended without a reply: the server may
    /// still be reading or writing its slot, so the slot is not reused until the
    /// server's side closes.
    pub(crate) fn hold(&self, p: Arc<Payload>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if !self.closed.load(Ordering::Acquire) {
            held.push(p);
        }
    }

    /// The server's side of the door socket closed: it maps the arena no more, and
    /// the slots held for it are free.
    pub(crate) fn closed(&self) {
        let held = {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            self.closed.store(true, Ordering::Release);
            std::mem::take(&mut *held)
        };
        if !held.is_empty() {
            tracing::debug!(slots = held.len(), "arena link closed: held slots freed");
        }
    }

    /// A link for `arena`, attached (conn/attach.rs), until `closed`.
    pub(crate) fn new(arena: Arc<Arena>) -> ArenaLink {
        ArenaLink {
            arena,
            closed: AtomicBool::new(false),
            held: Mutex::new(Vec::new()),
        }
    }

    /// Whether `p` lies in a slot of this link's arena.
    pub(crate) fn owns(&self, p: &Payload) -> bool {
        p.arena_buf()
            .is_some_and(|b| Arc::ptr_eq(b.arena(), &self.arena))
    }
}

// ---- descriptors over the door ----------------------------------------------------

/// Wait until `s` has something to read (or its peer closed) by `deadline`: one clock
/// for the stranger's whole stay, checked to the millisecond (rounded up, so that a
/// wait never ends early and spins).
fn readable_by(s: &UnixStream, deadline: Instant) -> io::Result<()> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let mut p = libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd that lives across the call.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r > 0 {
            return Ok(());
        }
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Send one byte if the socket takes it at once; never waits.
fn send_now(s: &UnixStream, byte: u8) {
    // SAFETY: sends from a one-byte buffer that lives across the call.
    let _ = unsafe {
        libc::send(
            s.as_raw_fd(),
            (&byte as *const u8).cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
}

fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: writes at most the remaining bytes of `buf`.
        let n = unsafe { libc::getrandom(buf[got..].as_mut_ptr().cast(), buf.len() - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        } else {
            got += n as usize;
        }
    }
    Ok(())
}

pub(crate) fn peer_cred(s: &UnixStream) -> io::Result<(i32, u32)> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `c`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((c.pid, c.uid))
}

/// Room for the control message of a few descriptors (a stranger may send more than
/// one; all are received and closed).
const CMSG_SPACE: usize = 128;

pub(crate) fn send_token_and_fd(s: &UnixStream, token: &[u8], fd: &OwnedFd) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: token.as_ptr() as *mut libc::c_void,
        iov_len: token.len(),
    };
    let mut cbuf = [0u64; CMSG_SPACE / 8];
    // SAFETY: a msghdr pointing at live buffers; CMSG_* stay within `cbuf`, which is
    // large enough for one descriptor.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), fd.as_raw_fd());
        let n = libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != token.len() {
            return Err(io::Error::other("token sent in part"));
        }
    }
    Ok(())
}

/// Receive exactly a token and exactly one descriptor with it. Every descriptor that
/// arrives is owned (so closed) whatever happens.
fn recv_token_and_fd(s: &UnixStream) -> io::Result<([u8; TOKEN_LEN], OwnedFd)> {
    let mut token = [0u8; TOKEN_LEN];
    let mut iov = libc::iovec {
        iov_base: token.as_mut_ptr().cast(),
        iov_len: TOKEN_LEN,
    };
    let mut cbuf = [0u64; CMSG_SPACE / 8];
    let mut fds: Vec<OwnedFd> = Vec::new();
    let (n, flags);
    // SAFETY: as in `send_token_and_fd`; each descriptor received is wrapped at once.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = CMSG_SPACE as _;
        // Never waits: the caller waited for the message (`readable_by`).
        let r = libc::recvmsg(
            s.as_raw_fd(),
            &mut msg,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
        );
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        n = r as usize;
        flags = msg.msg_flags;
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let bytes = (*c).cmsg_len as usize - (data as usize - c as usize);
                for i in 0..bytes / std::mem::size_of::<libc::c_int>() {
                    let fd = std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if flags & libc::MSG_CTRUNC != 0 || fds.len() != 1 {
        return Err(io::Error::other(format!(
            "{} descriptors (one expected)",
            fds.len()
        )));
    }
    // A client sends the token and its descriptor in one message, which a Unix
    // stream socket delivers whole: a token in parts is a stranger playing for time.
    if n != TOKEN_LEN {
        return Err(io::Error::other(format!("{n} bytes of token")));
    }
    let fd = fds.pop().ok_or_else(|| io::Error::other("no descriptor"))?;
    Ok((token, fd))
}

#[cfg(test)]
// Tests: raw syscalls on descriptors and mappings they made themselves.
#[allow(clippy::undocumented_unsafe_blocks)]
mod tests {
    use super::*;

    #[test]
    fn a_token_and_a_descriptor_cross_the_door_and_extras_are_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        let arena = Arena::create(1 << 20, 1 << 20).unwrap();
        send_token_and_fd(&a, &[9u8; TOKEN_LEN], arena.fd()).unwrap();
        let (token, fd) = recv_token_and_fd(&b).unwrap();
        assert_eq!(token, [9u8; TOKEN_LEN]);
        let map = shared::map_checked(&fd, 1 << 20).unwrap();
        let mut buf = arena.take().unwrap();
        buf.spare_mut()[..3].copy_from_slice(b"abc");
        let seen = unsafe { std::slice::from_raw_parts(map.ptr().add(buf.offset() as usize), 3) };
        assert_eq!(seen, b"abc");

        // Bytes without a descriptor.
        (&a).write_all(&[1u8; TOKEN_LEN]).unwrap();
        assert!(recv_token_and_fd(&b).is_err());
    }

    #[test]
    fn a_silent_stranger_is_waited_for_until_the_deadline_and_no_longer() {
        let (a, b) = UnixStream::pair().unwrap();
        let started = Instant::now();
        let e = readable_by(&b, started + Duration::from_millis(150)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(150), "{took:?}");
        assert!(took < Duration::from_millis(1150), "{took:?}");
        // A deadline already past: no wait at all, even with data there.
        (&a).write_all(&[1]).unwrap();
        assert!(readable_by(&b, started).is_err());
        assert!(readable_by(&b, Instant::now() + Duration::from_secs(5)).is_ok());
        // A peer that hung up counts as readable (the read then sees the end).
        let (c, d) = UnixStream::pair().unwrap();
        drop(c);
        assert!(readable_by(&d, Instant::now() + Duration::from_secs(5)).is_ok());
        assert!(recv_token_and_fd(&d).is_err());
    }

    #[test]
    fn a_slice_must_lie_within_the_arena() {
        let (fd, map) = shared::create_sealed(1 << 20).unwrap();
        drop(fd);
        let (x, _y) = UnixStream::pair().unwrap();
        let cell = ConnArena::default();
        assert_eq!(cell.slice(0, 1).unwrap_err(), Errno::EPROTO, "no arena yet");
        assert!(cell.0.set(Arc::new(ServerArena { map, link: x })).is_ok());
        assert!(cell.slice(0, 1 << 20).is_ok());
        assert_eq!(cell.slice(1, 1 << 20).unwrap_err(), Errno::EINVAL);
        assert_eq!(cell.slice(u64::MAX, 2).unwrap_err(), Errno::EINVAL);
        assert_eq!(cell.slice((1 << 20) + 1, 0).unwrap_err(), Errno::EINVAL);
    }
}
