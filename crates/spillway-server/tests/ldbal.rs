//! Load-balanced fragments (docs/cache.md section 6) over real TCP: made so only while
//! they hold nothing (EEXIST after files were placed the striped way), only by a peer
//! (a client gets EPERM), and read-only to clients afterwards: every change a client
//! connection holding the instance's capability asks for answers EROFS, as a hostile
//! user holding the descriptor would try, while a peer (the stage coordinator) writes
//! every stripe of a file to every server, each of which then answers a whole read.
//! The mode survives a restart (the `ldbal` marker, FORMAT.md).

mod common;

use common::{write_req, Cluster, INSTANCE};
use spillway_types::{Errno, FileKind, ROOT_INODE};
use spillway_wire::{
    setattr, want, CreateReq, DeleteDataReq, ExtendSizeReq, LdbalConfigReq, OpenReq, ReadReq,
    RemoveEntryReq, SetAttrReq, SetXattrReq, TruncateDataReq,
};
use std::os::unix::fs::PermissionsExt;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ seed.wrapping_mul(37))
        .collect()
}

#[test]
fn a_fragment_holding_files_cannot_become_load_balanced() {
    let c = Cluster::start(2, 1 << 30, 64 << 10);
    // A client may not ask at all, even of an empty instance.
    for i in 0..c.n() {
        assert_eq!(c.at(i).call(&LdbalConfigReq {}).unwrap_err(), Errno::EPERM);
    }
    c.create(ROOT_INODE, "placed-striped", FileKind::Regular)
        .expect("create");
    let refused: Vec<Errno> = (0..c.n())
        .filter_map(|i| c.peer(i).call(&LdbalConfigReq {}).err())
        .collect();
    // The server holding the file refuses: its stripes would read as holes elsewhere.
    assert!(refused.contains(&Errno::EEXIST), "{refused:?}");
}

#[test]
fn a_load_balanced_fragment_is_read_only_to_clients_and_holds_whole_replicas() {
    let mut c = Cluster::start(2, 1 << 30, 64 << 10);
    for i in 0..c.n() {
        c.peer(i).call(&LdbalConfigReq {}).expect("ldbal");
        // Again: a no-op.
        c.peer(i).call(&LdbalConfigReq {}).expect("ldbal again");
    }

    // A stage-in, as the coordinator makes it: the entry through a peer, then every
    // stripe written to every server, the size set at the inode's home.
    let data = pattern(300 << 10, 3);
    let create = CreateReq::new(ROOT_INODE, "ref", FileKind::Regular, 0o644, 1000, 100);
    let entry = dentry_peer(&c, "ref");
    let attr = entry.call(&create).expect("a peer creates").attr;
    let ss = u64::from(c.stripe_size);
    for i in 0..c.n() {
        let peer = c.peer(i);
        for (k, chunk) in data.chunks(ss as usize).enumerate() {
            let w = peer
                .call_bulk(&write_req(attr.ino, k as u64, 0), chunk)
                .expect("a peer writes every stripe on every server");
            assert_eq!(w.written as usize, chunk.len());
        }
    }
    c.peer(attr.ino.home().0)
        .call(&ExtendSizeReq {
            ino: attr.ino,
            size: data.len() as u64,
            touch: true,
            sync: true,
        })
        .expect("size");

    let attack = |c: &Cluster| {
        // Every server answers every stripe, whole: each is a replica.
        for i in 0..c.n() {
            let mut got = Vec::new();
            for k in 0..data.len().div_ceil(ss as usize) as u64 {
                let r = c.at(i).call(&ReadReq {
                    ino: attr.ino,
                    stripe: k,
                    offset: 0,
                    len: c.stripe_size,
                });
                got.extend(r.expect("a client reads any stripe from any replica"));
            }
            assert_eq!(got, data, "replica {i}");
        }
        // Every change a client can ask for answers EROFS, on every server.
        for i in 0..c.n() {
            let ep = c.at(i);
            let erofs = |what: &str, r: Result<(), Errno>| {
                assert_eq!(r.unwrap_err(), Errno::EROFS, "{what} on server {i}");
            };
            erofs(
                "write",
                ep.call_bulk(&write_req(attr.ino, 0, 0), b"evil")
                    .map(|_| ()),
            );
            erofs(
                "create",
                ep.call(&CreateReq::new(
                    ROOT_INODE,
                    "evil",
                    FileKind::Regular,
                    0o644,
                    1000,
                    100,
                ))
                .map(|_| ()),
            );
            let mut chmod = SetAttrReq::of(attr.ino);
            chmod.valid = setattr::MODE;
            chmod.mode = 0o777;
            erofs("setattr", ep.call(&chmod).map(|_| ()));
            erofs(
                "unlink",
                ep.call(&RemoveEntryReq {
                    parent: ROOT_INODE,
                    name: b"ref".to_vec(),
                    want: want::NOT_DIR,
                })
                .map(|_| ()),
            );
            for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
                erofs(
                    "open for writing",
                    ep.call(&OpenReq {
                        ino: attr.ino,
                        flags: flags as u32,
                    })
                    .map(|_| ()),
                );
            }
            erofs(
                "setxattr",
                ep.call(&SetXattrReq {
                    ino: attr.ino,
                    name: b"user.k".to_vec(),
                    value: b"v".to_vec(),
                    flags: 0,
                })
                .map(|_| ()),
            );
            erofs(
                "truncate data",
                ep.call(&TruncateDataReq {
                    ino: attr.ino,
                    size: 0,
                    stripe_size: c.stripe_size,
                })
                .map(|_| ()),
            );
            erofs(
                "delete data",
                ep.call(&DeleteDataReq { ino: attr.ino }).map(|_| ()),
            );
        }
        // A read-only open (at the inode's home) is no change.
        c.home(attr.ino)
            .call(&OpenReq {
                ino: attr.ino,
                flags: libc::O_RDONLY as u32,
            })
            .expect("a read-only open");
        assert_eq!(c.getattr(attr.ino).unwrap().size, data.len() as u64);
    };
    attack(&c);

    // The marker is root's alone: 0600 in the fragment's 0700 directory (FORMAT.md).
    for node in &c.nodes {
        let dir = node.root.join("fragments").join(INSTANCE.to_string());
        let mode = |p: &std::path::Path| {
            std::fs::symlink_metadata(p)
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode(&dir.join("ldbal")), 0o600);
        assert_eq!(mode(&dir), 0o700);
    }

    // The mode survives a restart of every server (the marker on disk).
    for node in &mut c.nodes {
        node.restart();
    }
    c.reconnect();
    attack(&c);
}

/// A peer connection to the server holding `name`'s entry in the root.
fn dentry_peer(c: &Cluster, name: &str) -> spillway_wire::Endpoint {
    let s = spillway_placement::dentry_server(ROOT_INODE, name.as_bytes(), c.n());
    c.peer(s.0)
}
