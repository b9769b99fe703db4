//! The arena end to end over real sockets: a server with a door, a client endpoint
//! with an arena, requests whose bulk goes through shared memory; and the door's
//! refusals of what a stranger or a hostile client sends.

use crate::arena::door::send_token_and_fd;
use crate::arena::*;
use crate::codec::Wire;
use crate::conn::{Conn, Endpoint, OwnedCall};
use crate::messages::*;
use crate::serve::Server;
use crate::testkit::{write_req, Sink};
use spillway_types::{Errno, InodeNo};
use std::io::Read;
use std::net::SocketAddr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn server(delay_ms: u64) -> (Server, SocketAddr, Arc<Sink>) {
    Sink::serve(Duration::from_millis(delay_ms), false, 4)
}

fn hello() -> HelloReq {
    crate::testkit::hello()
}

fn endpoint(addr: SocketAddr, arena: &Arc<Arena>, deadline: Duration) -> Arc<Endpoint> {
    Arc::new(
        Endpoint::new(addr.to_string(), hello(), deadline, Duration::from_secs(5))
            .with_arena(arena.clone()),
    )
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn writes_and_reads_go_through_the_arena_whole_and_give_their_slots_back() {
    let (mut srv, addr, sink) = server(0);
    let arena = Arena::create(8 << 20, 1 << 20).unwrap();
    let ep = endpoint(addr, &arena, Duration::from_secs(10));
    assert!(ep.conn().unwrap().arena().is_some(), "attached");
    let calls: Vec<_> = (0..16u32)
        .map(|i| {
            let mut p = match ep.arena_buf() {
                Some(b) => Payload::Arena(b),
                None => Payload::Heap(Vec::new()), // all 8 slots in flight
            };
            p.extend_from_slice(&vec![(i + 1) as u8; 1 << 20]);
            OwnedCall::queue(&ep, &write_req(i), p)
        })
        .collect();
    for (i, c) in calls.into_iter().enumerate() {
        let (r, _) = c.wait();
        assert_eq!(r.unwrap().written, 1 << 20, "write {i}");
    }
    let seen = sink.seen.lock().unwrap().clone();
    for i in 0..16u32 {
        let want = u64::from(i + 1) << 20;
        assert!(
            seen.iter().any(|&(o, sum, _)| o == i && sum == want),
            "write {i} arrived whole"
        );
    }
    let via = seen.iter().filter(|s| s.2).count();
    assert!(via >= 8, "{via} of 16 writes through the arena");
    assert_eq!(arena.free_slots(), 8, "every slot back");

    let reads: Vec<_> = (1..=3u32)
        .map(|i| {
            ep.start_read(&ReadReq {
                ino: InodeNo(1),
                stripe: 0,
                offset: i,
                len: 4096,
            })
        })
        .collect();
    for (i, r) in (1..=3u32).zip(reads) {
        let data = r.wait().unwrap();
        assert!(data.is_arena(), "read {i} came through the arena");
        assert_eq!(&*data, &vec![i as u8; 2048][..], "read {i}");
    }
    wait_for("read slots back", || arena.free_slots() == 8);
    srv.stop();
}

/// A server that answers each request after 1.5 s, and an endpoint connected to it
/// with `deadline` and an arena of two 1 MiB slots.
fn slow_server_two_slots(deadline: Duration) -> (Server, Arc<Sink>, Arc<Arena>, Arc<Endpoint>) {
    let (srv, addr, sink) = server(1500);
    let arena = Arena::create(2 << 20, 1 << 20).unwrap();
    let ep = endpoint(addr, &arena, deadline);
    ep.conn().unwrap();
    (srv, sink, arena, ep)
}

/// A slot of `ep`'s arena holding 4 KiB of `byte`.
fn slot_with(ep: &Endpoint, byte: u8) -> Payload {
    let mut p = Payload::Arena(ep.arena_buf().unwrap());
    p.extend_from_slice(&[byte; 4096]);
    p
}

/// A call that ends without a reply (here: its deadline passes while the server is
/// still at it) keeps its slot out of use until the server cannot touch it any more:
/// the connection gone and the request finished.
#[test]
fn a_slot_without_a_reply_is_reused_only_after_the_server_lets_go() {
    let (mut srv, sink, arena, ep) = slow_server_two_slots(Duration::from_millis(300));
    let p = slot_with(&ep, 7);
    let (r, back) = OwnedCall::queue(&ep, &write_req(0), p).wait();
    assert_eq!(r.unwrap_err(), Errno::ETIMEDOUT);
    assert!(back.is_empty(), "the slot stays with the link");
    drop(back);
    assert_eq!(
        arena.free_slots(),
        1,
        "held while the server may still read it"
    );
    ep.disconnect();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(arena.free_slots(), 1, "the request is still running");
    wait_for("the slot comes back", || arena.free_slots() == 2);
    assert_eq!(sink.seen.lock().unwrap().len(), 1);
    srv.stop();
}

/// A read dropped before it was waited for (a read of several pieces whose first
/// piece failed) must not hand its slot back while the server may still write the
/// read's bytes into it: the slot would go to the next write or read.
#[test]
fn a_read_dropped_unwaited_keeps_its_slot_until_the_server_lets_go() {
    let (mut srv, _sink, arena, ep) = slow_server_two_slots(Duration::from_secs(10));
    let read = ep.start_read(&ReadReq {
        ino: InodeNo(1),
        stripe: 0,
        offset: 1,
        len: 4096,
    });
    assert!(matches!(read, crate::conn::PendingRead::Arena(_)));
    drop(read);
    assert_eq!(
        arena.free_slots(),
        1,
        "held while the server may still write it"
    );
    ep.disconnect();
    wait_for("the slot comes back", || arena.free_slots() == 2);
    srv.stop();
}

/// A write dropped before it was waited for (a file's write-behind given up with
/// writes in flight) must not hand its slot back while the server may still be writing
/// from it: the next write's bytes would go to disk in its place.
#[test]
fn a_write_dropped_unwaited_keeps_its_slot_until_the_server_lets_go() {
    let (mut srv, sink, arena, ep) = slow_server_two_slots(Duration::from_secs(10));
    let p = slot_with(&ep, 9);
    let call = OwnedCall::queue(&ep, &write_req(0), p);
    assert_eq!(arena.free_slots(), 1);
    // Queued: the server has it once the sending thread wrote it (and it is slow to
    // answer).
    wait_for("the server has the write", || {
        sink.calls.load(std::sync::atomic::Ordering::SeqCst) == 1
    });
    drop(call);
    assert_eq!(
        arena.free_slots(),
        1,
        "held while the server may still read it"
    );
    ep.disconnect();
    wait_for("the slot comes back", || arena.free_slots() == 2);
    assert_eq!(sink.seen.lock().unwrap().len(), 1);
    srv.stop();
}

/// A raw connection's `ArenaOffer`.
fn offer(conn: &Conn) -> Result<ArenaOfferReply, crate::conn::CallError> {
    let t = conn.send_raw(
        ArenaOfferReq::OP,
        &ArenaOfferReq {}.to_bytes(),
        &[],
        Duration::from_secs(5),
    )?;
    let body = conn.wait_reply(&t, Instant::now() + Duration::from_secs(5))?;
    Ok(ArenaOfferReply::from_bytes(&body).unwrap())
}

/// Knock at the door with `token` and `fd`: the one-byte answer (0: attached).
fn knock(o: &ArenaOfferReply, token: &[u8], fd: &std::os::fd::OwnedFd) -> u8 {
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&o.door).unwrap();
    let s = UnixStream::connect_addr(&addr).unwrap();
    send_token_and_fd(&s, token, fd).unwrap();
    let mut b = [0u8; 1];
    (&s).read_exact(&mut b).unwrap();
    b[0]
}

fn raw_conn(addr: SocketAddr) -> std::sync::Arc<Conn> {
    Conn::connect(&addr.to_string(), &hello(), Duration::from_secs(5)).unwrap()
}

/// A connection holds one token at a time: a new offer spends the earlier one, so no
/// connection can fill the door's table of tokens. A token sent in parts (a stranger
/// playing for time) is refused.
#[test]
fn a_new_offer_spends_the_connections_earlier_token_and_a_token_in_parts_is_refused() {
    let (mut srv, addr, _sink) = server(0);
    let arena = Arena::create(1 << 20, 1 << 20).unwrap();
    let conn = raw_conn(addr);
    let first = offer(&conn).unwrap();
    let second = offer(&conn).unwrap();
    let eacces = Errno::EACCES.0 as u8;
    assert_eq!(knock(&first, &first.token, arena.fd()), eacces, "replaced");

    let door = std::os::unix::net::SocketAddr::from_abstract_name(&second.door).unwrap();
    let s = UnixStream::connect_addr(&door).unwrap();
    send_token_and_fd(&s, &second.token[..16], arena.fd()).unwrap();
    std::io::Write::write_all(&mut &s, &second.token[16..]).unwrap();
    let mut b = [0u8; 1];
    (&s).read_exact(&mut b).unwrap();
    assert_eq!(b[0], Errno::EPROTO.0 as u8, "a token in parts");
    srv.stop();
}

#[test]
fn the_door_refuses_wrong_tokens_used_tokens_and_memory_that_could_fault_the_server() {
    let (mut srv, addr, _sink) = server(0);
    let arena = Arena::create(1 << 20, 1 << 20).unwrap();
    let conn = raw_conn(addr);
    let o = offer(&conn).unwrap();
    assert_eq!(o.pid, std::process::id());
    assert_eq!(o.token.len(), 32);

    // A stranger without the token.
    let eacces = Errno::EACCES.0 as u8;
    assert_eq!(knock(&o, &[0u8; 32], arena.fd()), eacces, "a guessed token");

    // An unsealed memfd (it could shrink under the server's mapping).
    let raw = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
    let unsealed = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    assert_eq!(unsafe { libc::ftruncate(raw, 1 << 20) }, 0);
    assert_eq!(knock(&o, &o.token, &unsealed), Errno::EINVAL.0 as u8);
    // The token was spent on that attempt.
    assert_eq!(knock(&o, &o.token, arena.fd()), eacces, "a used token");

    // A fresh token with a proper arena attaches; a second offer on the same
    // connection is refused.
    let o2 = offer(&conn).unwrap();
    assert_eq!(knock(&o2, &o2.token, arena.fd()), 0);
    assert!(matches!(
        offer(&conn),
        Err(crate::conn::CallError::Remote(Errno::EEXIST))
    ));
    // Another connection cannot use this connection's token.
    let other = raw_conn(addr);
    assert_eq!(knock(&o2, &o2.token, arena.fd()), eacces);
    drop(other);
    srv.stop();
}

#[test]
fn arena_requests_without_an_arena_or_outside_it_are_refused() {
    let (mut srv, addr, sink) = server(0);
    let arena = Arena::create(1 << 20, 1 << 20).unwrap();
    let call = |conn: &Conn, off: u64, len: u32| {
        let body = WriteArenaReq {
            write: write_req(0),
            arena_off: off,
            len,
        }
        .to_bytes();
        let t = conn
            .send_raw(WriteArenaReq::OP, &body, &[], Duration::from_secs(5))
            .unwrap();
        conn.wait_reply(&t, Instant::now() + Duration::from_secs(5))
    };
    let bare = raw_conn(addr);
    assert!(matches!(
        call(&bare, 0, 10),
        Err(crate::conn::CallError::Remote(Errno::EPROTO))
    ));
    let conn = raw_conn(addr);
    let o = offer(&conn).unwrap();
    assert_eq!(knock(&o, &o.token, arena.fd()), 0);
    for (off, len) in [
        (0, (1 << 20) + 1),
        (1 << 20, 1),
        (u64::MAX, 2),
        (u64::MAX - 1, 0),
    ] {
        assert!(
            matches!(
                call(&conn, off, len),
                Err(crate::conn::CallError::Remote(Errno::EINVAL))
            ),
            "{off}+{len}"
        );
    }
    assert!(
        call(&conn, (1 << 20) - 10, 10).is_ok(),
        "the arena's last bytes"
    );
    assert_eq!(sink.seen.lock().unwrap().len(), 1);
    // A read asking the server to write past the arena's end (into whatever its
    // address space holds next) is refused before it runs; and with no arena at all.
    let calls = sink.calls.load(std::sync::atomic::Ordering::SeqCst);
    for (off, len) in [(0, (1 << 20) + 1), (1 << 20, 1), (u64::MAX - 10, 4096)] {
        assert!(
            matches!(
                read_arena(&conn, off, len),
                Err(crate::conn::CallError::Remote(Errno::EINVAL))
            ),
            "read {off}+{len}"
        );
    }
    assert!(matches!(
        read_arena(&bare, 0, 10),
        Err(crate::conn::CallError::Remote(Errno::EPROTO))
    ));
    assert_eq!(
        sink.calls.load(std::sync::atomic::Ordering::SeqCst),
        calls,
        "no refused read reached the service"
    );
    assert!(read_arena(&conn, (1 << 20) - 4096, 4096).is_ok());
    srv.stop();
}

/// A raw `ReadArena` of `len` bytes into `off` of `conn`'s arena.
fn read_arena(conn: &Conn, off: u64, len: u32) -> Result<Vec<u8>, crate::conn::CallError> {
    let body = ReadArenaReq {
        read: ReadReq {
            ino: InodeNo(1),
            stripe: 0,
            offset: 0,
            len,
        },
        arena_off: off,
    }
    .to_bytes();
    let t = conn.send_raw(ReadArenaReq::OP, &body, &[], Duration::from_secs(5))?;
    conn.wait_reply(&t, Instant::now() + Duration::from_secs(5))
}
