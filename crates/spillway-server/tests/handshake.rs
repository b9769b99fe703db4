//! Who may talk to a server, and what a stranger's bytes do to it (nothing).

mod common;

use common::*;
use spillway_types::tunables::MAX_FRAME_LEN;
use spillway_types::{Errno, ServerIndex};
use spillway_wire::conn::CallError;
use spillway_wire::{
    role, Call, Conn, FragmentCreateReq, FragmentDestroyReq, FragmentListReq, FrameHeader,
    FrameKind, GetAttrReq, HelloReq, StatFsReq, Wire,
};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn refused(addr: std::net::SocketAddr, h: HelloReq) -> Errno {
    match Conn::connect(&addr.to_string(), &h, Duration::from_secs(5)) {
        Err(CallError::Remote(e)) => e,
        Err(e) => panic!("expected a refusal, got {e:?}"),
        Ok(_) => panic!("expected a refusal, got a session"),
    }
}

/// Wait until the server closes the connection; panics if it stays open.
fn assert_closed(mut s: TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("connection not closed: {e}"),
        }
    }
}

fn frame(opcode: u16, body: &[u8]) -> Vec<u8> {
    let h = FrameHeader {
        kind: FrameKind::Request,
        opcode,
        id: 1,
        aux: 5000,
    };
    let mut f = h.encode(body.len()).to_vec();
    f.extend_from_slice(body);
    f
}

#[test]
fn refusals() {
    let c = Cluster::start(2, 1 << 30, 1 << 20);
    let addr = c.nodes[0].addr;
    assert_eq!(
        refused(addr, hello(role::CLIENT, INSTANCE, b"wrong")),
        Errno::EACCES
    );
    assert_eq!(
        refused(addr, hello(role::CLIENT, INSTANCE, b"")),
        Errno::EACCES
    );
    assert_eq!(
        refused(addr, hello(role::PEER, INSTANCE, b"wrong")),
        Errno::EACCES
    );
    assert_eq!(
        refused(addr, hello(role::CLIENT, 999, CREDENTIAL)),
        Errno::ENOENT
    );
    assert_eq!(
        refused(addr, hello(role::ADMIN, 0, CREDENTIAL)),
        Errno::EACCES
    );
    assert_eq!(
        refused(addr, hello(77, INSTANCE, CREDENTIAL)),
        Errno::EINVAL
    );
    let future = HelloReq {
        version_min: 2,
        version_max: 5,
        ..hello(role::CLIENT, INSTANCE, CREDENTIAL)
    };
    assert_eq!(refused(addr, future), Errno::EPROTO);

    // Accepted handshakes say where they landed.
    let conn = Conn::connect(
        &c.nodes[1].addr.to_string(),
        &hello(role::PEER, INSTANCE, CREDENTIAL),
        Duration::from_secs(5),
    )
    .expect("peer session");
    assert_eq!((conn.hello.server_index, conn.hello.server_count), (1, 2));
    let admin_key = admin_key(&c.nodes[0].root);
    let conn = Conn::connect(
        &addr.to_string(),
        &hello(role::ADMIN, 0, &admin_key),
        Duration::from_secs(5),
    )
    .expect("admin session");
    assert_eq!((conn.hello.server_index, conn.hello.server_count), (0, 0));
}

#[test]
fn roles_are_kept_apart() {
    let c = Cluster::start(2, 1 << 30, 1 << 20);
    let client = c.at(0);
    assert_eq!(client.call(&FragmentListReq {}).unwrap_err(), Errno::EPERM);
    assert_eq!(
        client
            .call(&FragmentDestroyReq { instance: INSTANCE })
            .unwrap_err(),
        Errno::EPERM
    );
    let admin = c.nodes[0].admin();
    assert_eq!(
        admin.call(&GetAttrReq { ino: root() }).unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(admin.call(&StatFsReq {}).unwrap_err(), Errno::EPERM);
    let list = admin.call(&FragmentListReq {}).unwrap().fragments;
    assert_eq!(list.len(), 1);
    assert_eq!(
        (
            list[0].instance,
            list[0].index,
            list[0].count,
            list[0].inodes
        ),
        (INSTANCE, 0, 2, 1)
    );
}

#[test]
fn fragment_admin() {
    let c = Cluster::start(1, 1 << 30, 1 << 20);
    let admin = c.nodes[0].admin();
    let req = FragmentCreateReq {
        instance: 5,
        index: 0,
        peers: vec![c.nodes[0].addr.to_string()],
        capacity: 1 << 20,
        credential: b"five".to_vec(),
        stripe_size: 1 << 20,
        root_uid: 0,
        root_gid: 0,
        root_mode: 0o755,
    };
    admin.call(&req).unwrap();
    admin.call(&req).expect("the same create again is fine");
    let other = FragmentCreateReq {
        capacity: 2 << 20,
        ..req.clone()
    };
    assert_eq!(admin.call(&other).unwrap_err(), Errno::EEXIST);
    let bad = FragmentCreateReq {
        instance: 6,
        index: 3,
        ..req.clone()
    };
    assert_eq!(admin.call(&bad).unwrap_err(), Errno::EINVAL);
    assert_eq!(admin.call(&FragmentListReq {}).unwrap().fragments.len(), 2);

    let five = endpoint(c.nodes[0].addr, hello(role::CLIENT, 5, b"five"));
    assert_eq!(
        five.call(&GetAttrReq { ino: root() }).unwrap().attr.mode,
        0o755
    );
    admin.call(&FragmentDestroyReq { instance: 5 }).unwrap();
    admin
        .call(&FragmentDestroyReq { instance: 5 })
        .expect("destroying twice is fine");
    // The open session now finds its fragment gone; new sessions are refused.
    assert_eq!(
        five.call(&GetAttrReq { ino: root() }).unwrap_err(),
        Errno::ESTALE
    );
    assert_eq!(
        refused(c.nodes[0].addr, hello(role::CLIENT, 5, b"five")),
        Errno::ENOENT
    );
    assert!(!c.nodes[0].root.join("fragments/5").exists());
    assert_eq!(admin.call(&FragmentListReq {}).unwrap().fragments.len(), 1);
    // Instance 42 is untouched.
    assert!(c.getattr(root()).is_ok());
    assert_eq!(root().home(), ServerIndex(0));
}

#[test]
fn garbage_closes_the_connection_and_nothing_else() {
    let c = Cluster::start(1, 1 << 30, 1 << 20);
    let addr = c.nodes[0].addr;

    // Garbage before any hello.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_closed(s);

    // A length beyond what is allowed before the handshake.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&[0xff, 0xff, 0xff, 0x7f, 1, 0, 0, 0]).unwrap();
    assert_closed(s);

    // A well-formed frame that is not a hello: refused, closed.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&frame(
        GetAttrReq::OP,
        &GetAttrReq { ino: root() }.to_bytes(),
    ))
    .unwrap();
    assert_closed(s);

    // After a good hello: a frame longer than the largest allowed closes the connection.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&frame(
        HelloReq::OP,
        &hello(role::CLIENT, INSTANCE, CREDENTIAL).to_bytes(),
    ))
    .unwrap();
    let mut head = [0u8; 20];
    s.read_exact(&mut head).unwrap();
    assert_eq!(
        u32::from_le_bytes([head[16], head[17], head[18], head[19]]),
        0,
        "hello accepted"
    );
    let mut skip =
        vec![0u8; u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize - 16];
    s.read_exact(&mut skip).unwrap();
    s.write_all(&(MAX_FRAME_LEN + 1).to_le_bytes()).unwrap();
    assert_closed(s);

    // A stranger sending an empty connection.
    drop(TcpStream::connect(addr).unwrap());

    // The server still serves.
    let fresh = endpoint(addr, hello(role::CLIENT, INSTANCE, CREDENTIAL));
    assert!(fresh.call(&GetAttrReq { ino: root() }).is_ok());
}
