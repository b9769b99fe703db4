//! Who may talk to a server, and what a stranger's bytes do to it (nothing).

mod common;

use common::*;
use spillway_types::descriptor::encode_hex;
use spillway_types::tunables::MAX_FRAME_LEN;
use spillway_types::{Errno, ServerIndex};
use spillway_wire::conn::CallError;
use spillway_wire::{
    Call, Conn, FragmentCreateReq, FragmentDestroyReq, FragmentListReq, FrameHeader, FrameKind,
    GetAttrReq, HelloReq, Role, StatFsReq, Wire,
};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
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

/// Send `h` as the first frame on `s`; the errno of the reply (0: accepted).
fn raw_hello(s: &mut TcpStream, h: &HelloReq) -> u32 {
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(&frame(HelloReq::OP, &h.to_bytes())).unwrap();
    let mut head = [0u8; 20];
    s.read_exact(&mut head).unwrap();
    let mut rest =
        vec![0u8; u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize - 16];
    s.read_exact(&mut rest).unwrap();
    u32::from_le_bytes([head[16], head[17], head[18], head[19]])
}

/// A TCP connection to `to` from the local address `from` (all of 127/8 is this host),
/// so that a capability's address binding meets a real source address.
fn connect_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(to) = to else {
        panic!("{to} is not IPv4")
    };
    let sockaddr = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let (src, dst) = (sockaddr(from, 0), sockaddr(*to.ip(), to.port()));
    // SAFETY: a fresh socket, bound and connected with valid sockaddr_in of their true
    // length; the fd is owned by the TcpStream from here on.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let stream = TcpStream::from_raw_fd(fd);
        let r = libc::bind(fd, (&src as *const libc::sockaddr_in).cast(), len);
        assert_eq!(r, 0, "bind {from}: {}", std::io::Error::last_os_error());
        let r = libc::connect(fd, (&dst as *const libc::sockaddr_in).cast(), len);
        assert_eq!(r, 0, "connect {to}: {}", std::io::Error::last_os_error());
        stream
    }
}

/// A 1 MiB fragment of a one-server instance, its root 0755 owned by root.
fn one_server_fragment(instance: u64, addr: SocketAddr, credential: &[u8]) -> FragmentCreateReq {
    FragmentCreateReq {
        instance,
        index: 0,
        peers: vec![addr.to_string()],
        capacity: 1 << 20,
        credential: credential.to_vec(),
        stripe_size: 1 << 20,
        root_uid: 0,
        root_gid: 0,
        root_mode: 0o755,
    }
}

#[test]
fn refusals() {
    let c = Cluster::start(2, 1 << 30, 1 << 20);
    let addr = c.nodes[0].addr;
    assert_eq!(
        refused(addr, hello(Role::Client, INSTANCE, b"wrong")),
        Errno::EACCES
    );
    assert_eq!(
        refused(addr, hello(Role::Client, INSTANCE, b"")),
        Errno::EACCES
    );
    assert_eq!(
        refused(addr, hello(Role::Peer, INSTANCE, b"wrong")),
        Errno::EACCES
    );
    assert_eq!(
        refused(addr, hello(Role::Client, 999, &capability())),
        Errno::ENOENT
    );
    assert_eq!(refused(addr, hello(Role::Admin, 0, SECRET)), Errno::EACCES);
    assert_eq!(refused(addr, hello(77, INSTANCE, SECRET)), Errno::EINVAL);
    let future = HelloReq {
        version_min: 2,
        version_max: 5,
        ..client_hello()
    };
    assert_eq!(refused(addr, future), Errno::EPROTO);

    // Accepted handshakes say where they landed.
    let conn = Conn::connect(
        &c.nodes[1].addr.to_string(),
        &hello(Role::Peer, INSTANCE, SECRET),
        Duration::from_secs(5),
    )
    .expect("peer session");
    assert_eq!((conn.hello.server_index, conn.hello.server_count), (1, 2));
    let conn = Conn::connect(
        &c.nodes[1].addr.to_string(),
        &client_hello(),
        Duration::from_secs(5),
    )
    .expect("client session");
    assert_eq!((conn.hello.server_index, conn.hello.server_count), (1, 2));
    let admin_key = admin_key(&c.nodes[0].root);
    let conn = Conn::connect(
        &addr.to_string(),
        &hello(Role::Admin, 0, &admin_key),
        Duration::from_secs(5),
    )
    .expect("admin session");
    assert_eq!((conn.hello.server_index, conn.hello.server_count), (0, 0));
}

#[test]
fn clients_need_a_valid_capability() {
    let c = Cluster::start(2, 1 << 30, 1 << 20);
    let addr = c.nodes[0].addr;
    let later = unix_now() + 3600;
    let client = |cred: &[u8]| hello(Role::Client, INSTANCE, cred);

    // A second instance on the same server, with its own secret.
    c.nodes[0]
        .admin()
        .call(&one_server_fragment(5, addr, b"five"))
        .unwrap();
    let five = mint_cap(b"five", 5, &[LOOPBACK], later);
    Conn::connect(
        &addr.to_string(),
        &hello(Role::Client, 5, &five),
        Duration::from_secs(5),
    )
    .expect("instance 5's capability opens instance 5");

    let mut tampered = capability();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    let mut tampered_field = capability();
    tampered_field[5] ^= 1; // the instance id
    let refusals: Vec<(&str, Vec<u8>)> = vec![
        ("nothing", vec![]),
        ("the raw instance secret", SECRET.to_vec()),
        ("the secret in hex", encode_hex(SECRET).into_bytes()),
        (
            "an expired capability",
            mint_cap(SECRET, INSTANCE, &[LOOPBACK], unix_now() - 1),
        ),
        (
            "a capability expiring now",
            mint_cap(SECRET, INSTANCE, &[LOOPBACK], unix_now()),
        ),
        ("another instance's capability", five.clone()),
        (
            "a capability for another instance under this secret",
            mint_cap(SECRET, 5, &[LOOPBACK], later),
        ),
        (
            "a capability bound to another address",
            mint_cap(
                SECRET,
                INSTANCE,
                &[IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))],
                later,
            ),
        ),
        (
            "a capability bound to another IPv6 address",
            mint_cap(SECRET, INSTANCE, &["::1".parse().unwrap()], later),
        ),
        ("a tampered tag", tampered),
        ("a tampered field", tampered_field),
        (
            "a truncated capability",
            capability()[..capability().len() - 1].to_vec(),
        ),
    ];
    for (what, cred) in &refusals {
        assert_eq!(refused(addr, client(cred)), Errno::EACCES, "{what}");
    }
    // Refusals leave the server serving.
    assert!(c.getattr(root()).is_ok());

    // A capability is not the secret: peers cannot use one.
    assert_eq!(
        refused(addr, hello(Role::Peer, INSTANCE, &capability())),
        Errno::EACCES
    );
    // A capability without addresses is good from anywhere; the harness's own is bound
    // to 127.0.0.1.
    let anywhere = mint_cap(SECRET, INSTANCE, &[], later);
    assert!(Conn::connect(
        &addr.to_string(),
        &client(&anywhere),
        Duration::from_secs(5)
    )
    .is_ok());
    assert!(Conn::connect(
        &addr.to_string(),
        &client(&capability()),
        Duration::from_secs(5)
    )
    .is_ok());

    // Address binding against real source addresses: 127.0.0.2 is this host too.
    let other = Ipv4Addr::new(127, 0, 0, 2);
    let for_other = mint_cap(SECRET, INSTANCE, &[IpAddr::V4(other)], later);
    assert_eq!(
        raw_hello(&mut connect_from(other, addr), &client(&for_other)),
        0,
        "bound to 127.0.0.2, from 127.0.0.2"
    );
    assert_eq!(
        raw_hello(&mut connect_from(other, addr), &client(&capability())),
        Errno::EACCES.0 as u32,
        "bound to 127.0.0.1, from 127.0.0.2"
    );
    assert_eq!(
        raw_hello(&mut connect_from(other, addr), &client(&anywhere)),
        0,
        "unbound, from 127.0.0.2"
    );
}

#[test]
fn ipv4_clients_of_a_dual_stack_server_match_their_ipv4_address() {
    // An IPv6 wildcard listener sees IPv4 clients as ::ffff:a.b.c.d.
    let Ok(listener) = std::net::TcpListener::bind("[::]:0") else {
        eprintln!("no IPv6 here; skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_on(dir.path().join("s0"), listener);
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, node.addr.port()));
    node.admin_at(v4)
        .call(&one_server_fragment(INSTANCE, v4, SECRET))
        .unwrap();
    let conn = Conn::connect(&v4.to_string(), &client_hello(), Duration::from_secs(5))
        .expect("a capability for 127.0.0.1 is good from ::ffff:127.0.0.1");
    assert_eq!(conn.hello.server_count, 1);
    let other = Ipv4Addr::new(127, 0, 0, 2);
    assert_eq!(
        raw_hello(&mut connect_from(other, v4), &client_hello()),
        Errno::EACCES.0 as u32,
        "::ffff:127.0.0.2 is not 127.0.0.1"
    );
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
    let req = one_server_fragment(5, c.nodes[0].addr, b"five");
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

    let five_cap = mint_cap(b"five", 5, &[LOOPBACK], unix_now() + 3600);
    let five = endpoint(c.nodes[0].addr, hello(Role::Client, 5, &five_cap));
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
        refused(c.nodes[0].addr, hello(Role::Client, 5, &five_cap)),
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
    assert_eq!(raw_hello(&mut s, &client_hello()), 0, "hello accepted");
    s.write_all(&(MAX_FRAME_LEN + 1).to_le_bytes()).unwrap();
    assert_closed(s);

    // A stranger sending an empty connection.
    drop(TcpStream::connect(addr).unwrap());

    // The server still serves.
    let fresh = endpoint(addr, client_hello());
    assert!(fresh.call(&GetAttrReq { ino: root() }).is_ok());
}

#[test]
fn a_trickled_hello_is_cut_at_the_handshake_deadline() {
    let c = Cluster::start(1, 1 << 30, 1 << 20);
    let addr = c.nodes[0].addr;
    // A hello frame sent one byte every 2 s: each read is well within any per-read
    // timeout, but the whole handshake must be done 10 s after the accept.
    let mut s = TcpStream::connect(addr).unwrap();
    let bytes = frame(HelloReq::OP, &client_hello().to_bytes());
    let start = std::time::Instant::now();
    let mut closed = false;
    for b in bytes.iter().take(bytes.len() - 1) {
        if s.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 16];
        let r = s.read(&mut buf);
        s.set_nonblocking(false).unwrap();
        match r {
            Ok(0) => {
                closed = true;
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            _ => {
                closed = true;
                break;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(20), "still open");
    }
    assert!(closed, "the trickled handshake was never cut");
    let took = start.elapsed();
    assert!(took >= Duration::from_secs(9), "cut too early: {took:?}");
    // The server still serves.
    let fresh = endpoint(addr, client_hello());
    assert!(fresh.call(&GetAttrReq { ino: root() }).is_ok());
}

#[test]
fn one_peer_cannot_hold_more_than_its_share_of_handshakes() {
    // The child run (below): as an unprivileged uid, against the parent's server.
    if let Ok(addr) = std::env::var("SPILLWAY_TEST_HANDSHAKE_ADDR") {
        return fill_one_peers_share(addr.parse().unwrap());
    }
    let c = Cluster::start(1, 1 << 30, 1 << 20);
    let addr = c.nodes[0].addr;
    // A peer on this host is the uid owning the connecting socket; root's connections
    // (the daemons') count only against the total. So the stranger is uid 65534 (nobody): this very
    // test, run again as a child process with that uid.
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } == 0 {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        // A copy nobody may run: the build tree may sit in a directory only root
        // enters (a CI clone in a 0700 mktemp directory).
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let exe = dir.path().join("handshake-test");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = std::process::Command::new(&exe)
            .current_dir("/")
            .args([
                "--exact",
                "one_peer_cannot_hold_more_than_its_share_of_handshakes",
                "--nocapture",
            ])
            .env("SPILLWAY_TEST_HANDSHAKE_ADDR", addr.to_string())
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // While nobody's share was full, root (the daemons) was still served; and it is
        // now as well.
    } else {
        fill_one_peers_share(addr);
    }
    let fresh = endpoint(addr, client_hello());
    assert!(fresh.call(&GetAttrReq { ino: root() }).is_ok());
}

fn fill_one_peers_share(addr: SocketAddr) {
    let held: Vec<TcpStream> = (0..64).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    // The next one is closed at once, long before the handshake deadline.
    let extra = TcpStream::connect(addr).unwrap();
    let start = std::time::Instant::now();
    assert_closed(extra);
    assert!(start.elapsed() < Duration::from_secs(5));
    // Another address of this host (all of 127/8 is loopback) is no fresh share: the
    // uid is the peer, whatever address it binds.
    if addr.is_ipv4() {
        let other = connect_from(Ipv4Addr::new(127, 0, 0, 3), addr);
        let start = std::time::Instant::now();
        assert_closed(other);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "127.0.0.3 got a share of its own"
        );
    }
    // Once they go, the peer may handshake again: a new connection stays open.
    drop(held);
    std::thread::sleep(Duration::from_millis(300));
    let mut again = TcpStream::connect(addr).unwrap();
    again
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut buf = [0u8; 8];
    match again.read(&mut buf) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        other => panic!("a fresh connection was closed: {other:?}"),
    }
}
