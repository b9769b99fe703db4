//! Hostile bytes: random bodies and mutations of valid requests fed to the decoder and
//! to a live server. Nothing may panic (a panic hook counts panics on any thread,
//! server threads included), and the server must keep serving fresh connections.

mod common;

use common::*;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use spillway_types::{FileKind, InodeNo, Timespec};
use spillway_wire::*;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        default(info);
    }));
}

fn req<C: Call>(c: C) -> (u16, Vec<u8>) {
    (C::OP, c.to_bytes())
}

/// One valid request of every kind, about inode `ino` (a real file in the live test).
fn samples(ino: InodeNo) -> Vec<(u16, Vec<u8>)> {
    let t = Timespec { sec: 1, nsec: 2 };
    let name = b"name".to_vec();
    let entry = EntryRef {
        ino,
        kind: FileKind::Regular,
    };
    let mut write = WriteReq {
        ino,
        stripe: 1,
        offset: 10,
        sync: false,
        grant_epoch: 0,
        charged: 0,
    }
    .to_bytes();
    write.extend_from_slice(b"some bulk data");
    vec![
        req(HelloReq {
            version_min: 1,
            version_max: 1,
            role: 1,
            instance: 42,
            credential: vec![1],
            peer_name: "x".into(),
            mount: 0,
        }),
        req(FragmentCreateReq {
            instance: 9,
            index: 0,
            peers: vec!["127.0.0.1:1".into()],
            capacity: 1,
            credential: vec![1],
            stripe_size: 4096,
            root_uid: 0,
            root_gid: 0,
            root_mode: 0,
        }),
        req(FragmentDestroyReq { instance: 42 }),
        req(FragmentListReq {}),
        req(LookupReq {
            parent: ROOT,
            name: name.clone(),
        }),
        req(GetAttrReq { ino }),
        req(SetAttrReq {
            ino,
            valid: 0x1ff,
            mode: 0o644,
            uid: 1,
            gid: 1,
            size: 5000,
            atime: t,
            mtime: t,
            ctime: t,
        }),
        req(CreateReq {
            parent: ROOT,
            name: name.clone(),
            kind: FileKind::Symlink,
            mode: 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
            target: b"t".to_vec(),
            stripe_size: 4096,
            stripe_width: 2,
            open: false,
            xattrs: Vec::new(),
        }),
        req(RemoveEntryReq {
            parent: ROOT,
            name: name.clone(),
            want: 1,
        }),
        req(InsertEntryReq {
            parent: ROOT,
            name: name.clone(),
            entry: entry.clone(),
            replace: true,
        }),
        req(RenameReq {
            old_parent: ROOT,
            old_name: name.clone(),
            new_parent: ROOT,
            new_name: b"n2".to_vec(),
            flags: 2,
        }),
        req(LinkCountReq { ino, delta: 1 }),
        req(TouchDirReq {
            ino: ROOT,
            nlink_delta: 0,
        }),
        req(SealDirReq { ino }),
        req(UnsealDirReq { ino }),
        req(ReadDirReq {
            dir: ROOT,
            after: vec![],
            max: 100,
            plus: true,
        }),
        req(OpenReq { ino, flags: 0 }),
        req(ReleaseReq { ino }),
        req(ExtendSizeReq {
            ino,
            size: 100,
            touch: true,
            sync: false,
        }),
        req(SetXattrReq {
            ino,
            name: b"user.x".to_vec(),
            value: b"v".to_vec(),
            flags: 1,
        }),
        req(GetXattrReq {
            ino,
            name: b"user.x".to_vec(),
        }),
        req(ListXattrReq { ino }),
        req(RemoveXattrReq {
            ino,
            name: b"user.x".to_vec(),
        }),
        req(StatFsReq {}),
        req(SyncMetaReq {}),
        req(ReadLinkReq { ino }),
        (OP_WRITE, write),
        req(ReadReq {
            ino,
            stripe: 1,
            offset: 0,
            len: 4096,
        }),
        req(TruncateDataReq {
            ino,
            size: 10,
            stripe_size: 4096,
        }),
        req(SyncDataReq { ino }),
        req(DeleteDataReq { ino }),
        req(StripeInfoReq { ino }),
    ]
}

const ROOT: InodeNo = spillway_types::ROOT_INODE;

/// A valid request body, damaged: bytes overwritten, cut short, garbage appended.
#[derive(Debug, Clone)]
struct Mutation {
    sample: usize,
    flips: Vec<(usize, u8)>,
    cut: Option<usize>,
    tail: Vec<u8>,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    // Cuts and tails are rare so that many frames still decode and reach the handlers
    // with damaged field values.
    (
        any::<usize>(),
        vec((any::<usize>(), any::<u8>()), 0..4),
        proptest::option::weighted(0.2, any::<usize>()),
        proptest::option::weighted(0.2, vec(any::<u8>(), 1..8)),
    )
        .prop_map(|(sample, flips, cut, tail)| Mutation {
            sample,
            flips,
            cut,
            tail: tail.unwrap_or_default(),
        })
}

impl Mutation {
    fn apply(&self, samples: &[(u16, Vec<u8>)]) -> (u16, Vec<u8>) {
        let (op, body) = &samples[self.sample % samples.len()];
        let mut body = body.clone();
        for &(pos, b) in &self.flips {
            if !body.is_empty() {
                let n = body.len();
                body[pos % n] = b;
            }
        }
        if let Some(cut) = self.cut {
            body.truncate(cut % (body.len() + 1));
        }
        body.extend_from_slice(&self.tail);
        (*op, body)
    }
}

proptest! {
    #![proptest_config(Config { cases: 3000, failure_persistence: None, ..Config::default() })]

    #[test]
    fn decoding_random_bodies_never_panics(op in any::<u16>(), known in any::<prop::sample::Index>(), body in vec(any::<u8>(), 0..300)) {
        let _ = Request::decode(op, body.clone());
        let known_op = OPCODES[known.index(OPCODES.len())].0;
        let _ = Request::decode(known_op, body);
    }

    #[test]
    fn decoding_mutated_requests_never_panics(m in mutation()) {
        let (op, body) = m.apply(&samples(InodeNo(0x1_0000_0000_0002)));
        let _ = Request::decode(op, body);
    }
}

/// What one hostile connection sends.
#[derive(Debug, Clone)]
enum Attack {
    /// Raw bytes before any handshake.
    Stranger(Vec<u8>),
    /// A proper handshake, then frames: mutated requests (with random deadlines) and
    /// raw byte runs.
    Member(Vec<(Mutation, u32, Option<Vec<u8>>)>),
}

fn attack() -> impl Strategy<Value = Attack> {
    prop_oneof![
        vec(any::<u8>(), 0..200).prop_map(Attack::Stranger),
        vec(
            (
                mutation(),
                prop_oneof![Just(5000u32), any::<u32>()],
                proptest::option::weighted(0.15, vec(any::<u8>(), 0..40))
            ),
            1..8
        )
        .prop_map(Attack::Member),
    ]
}

fn frame(opcode: u16, aux: u32, id: u64, body: &[u8]) -> Vec<u8> {
    let mut f = FrameHeader {
        kind: FrameKind::Request,
        opcode,
        id,
        aux,
    }
    .encode(body.len())
    .to_vec();
    f.extend_from_slice(body);
    f
}

/// Send an attack and drain whatever comes back until the server closes or goes quiet.
fn run_attack(addr: SocketAddr, samples: &[(u16, Vec<u8>)], a: &Attack) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        panic!("server stopped accepting")
    };
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut out = Vec::new();
    match a {
        Attack::Stranger(bytes) => out.extend_from_slice(bytes),
        Attack::Member(frames) => {
            out.extend(frame(HelloReq::OP, 5000, 0, &client_hello().to_bytes()));
            for (i, (m, aux, raw)) in frames.iter().enumerate() {
                match raw {
                    Some(bytes) => out.extend_from_slice(bytes),
                    None => {
                        let (op, body) = m.apply(samples);
                        out.extend(frame(op, *aux, i as u64 + 1, &body));
                    }
                }
            }
        }
    }
    let _ = s.write_all(&out);
    let _ = s.shutdown(Shutdown::Write);
    let mut sink = [0u8; 4096];
    while let Ok(n) = s.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
}

#[test]
fn live_server_survives_hostile_connections() {
    count_panics();
    let c = Cluster::start(2, 16 << 20, 64 << 10);
    let f = c.create(root(), "target", FileKind::Regular).unwrap();
    c.write(&f, 0, &[7u8; 200_000]).unwrap();
    let samples = samples(f.ino);
    let home = c.nodes[usize::from(f.ino.home().0)].addr;
    let mut runner = TestRunner::new(Config {
        cases: 150,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&attack(), |a| {
            run_attack(home, &samples, &a);
            Ok(())
        })
        .unwrap();
    // Every server still answers a fresh connection, and nothing panicked anywhere.
    for n in &c.nodes {
        let fresh = endpoint(n.addr, client_hello());
        assert!(fresh.call(&StatFsReq {}).is_ok());
    }
    let fresh = endpoint(c.nodes[0].addr, client_hello());
    assert!(fresh.call(&GetAttrReq { ino: root() }).is_ok());
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a thread panicked");
}
