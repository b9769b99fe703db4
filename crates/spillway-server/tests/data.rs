//! Stripes over two servers: reads and writes across stripes, capacity, truncation on
//! peers, and purge of an unlinked file on its last close.

mod common;

use common::*;
use spillway_types::{Errno, FileKind};
use spillway_wire::{
    setattr, GetAttrReq, OpenReq, ReadReq, ReleaseReq, RemoveEntryReq, SetAttrReq, StatFsReq,
    StripeLen, SyncDataReq, SyncMetaReq, TruncateDataReq, WriteReq,
};
use std::time::Duration;

const SS: u32 = 64 << 10;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn write_and_read_across_stripes() {
    let c = Cluster::start(2, 1 << 30, SS);
    let f = c.create_with(root(), "f", FileKind::Regular, 0, 0).unwrap();
    assert_eq!((f.stripe_size, f.stripe_width), (SS, 2));
    let data = pattern(5 * SS as usize + 123, 7);
    c.write(&f, 1000, &data).unwrap();
    assert_eq!(c.read(&f, 1000, data.len() as u64).unwrap(), data);
    assert_eq!(
        c.read(&f, 0, 1000).unwrap(),
        vec![0u8; 1000],
        "the hole reads as zeros"
    );
    assert_eq!(c.getattr(f.ino).unwrap().size, 1000 + data.len() as u64);
    // Both servers hold stripes, in rotation.
    for s in 0..2u16 {
        let mine: Vec<u64> = c.stripes_on(s, f.ino).iter().map(|x| x.stripe).collect();
        let want: Vec<u64> = (0..6).filter(|&k| c.server_of(&f, k) == s).collect();
        assert_eq!(mine, want);
    }
    // Reads past a stripe's end are short; reads of absent stripes are empty.
    let last = c.server_of(&f, 5);
    let tail = c
        .at(last)
        .call(&ReadReq {
            ino: f.ino,
            stripe: 5,
            offset: 0,
            len: SS,
        })
        .unwrap();
    assert_eq!(tail.len(), 1000 + data.len() - 5 * SS as usize);
    let none = c
        .at(0)
        .call(&ReadReq {
            ino: f.ino,
            stripe: 99,
            offset: 0,
            len: SS,
        })
        .unwrap();
    assert!(none.is_empty());
    for s in 0..2 {
        c.at(s).call(&SyncDataReq { ino: f.ino }).unwrap();
        c.at(s).call(&SyncMetaReq {}).unwrap();
    }
    // Out-of-range requests are refused, not attempted.
    let huge = c.at(0).call_bulk(&write_req(f.ino, 0, 64 << 20), b"x");
    assert_eq!(huge.unwrap_err(), Errno::EINVAL);
    let big_read = c.at(0).call(&ReadReq {
        ino: f.ino,
        stripe: 0,
        offset: 0,
        len: (64 << 20) + 1,
    });
    assert_eq!(big_read.unwrap_err(), Errno::EINVAL);
    let zero = c.at(0).call(&TruncateDataReq {
        ino: f.ino,
        size: 0,
        stripe_size: 0,
    });
    assert_eq!(zero.unwrap_err(), Errno::EINVAL);
}

#[test]
fn enospc_at_capacity_writes_nothing() {
    let cap = 256 << 10;
    let c = Cluster::start(2, cap, SS);
    let f = c
        .create_with(root(), "f", FileKind::Regular, SS, 1)
        .unwrap();
    let s = c.server_of(&f, 0);
    let ep = c.at(s);
    // As a client does: each reply tops this connection's space grant up, and the
    // writes after the first spend it (space promised to us is not free for us
    // otherwise).
    let (mut epoch, mut avail) = (0u64, 0u64);
    for k in 0..4 {
        let charged = avail.min(u64::from(SS));
        let r = ep
            .call_bulk(
                &WriteReq {
                    ino: f.ino,
                    stripe: k * 2,
                    offset: 0,
                    sync: false,
                    grant_epoch: epoch,
                    charged: charged as u32,
                },
                &vec![1u8; SS as usize],
            )
            .unwrap();
        assert_eq!(r.written, SS);
        assert!(epoch == 0 || r.grant_epoch == epoch, "one session");
        epoch = r.grant_epoch;
        avail = avail - charged + r.granted;
    }
    assert_eq!(ep.call(&StatFsReq {}).unwrap().used, cap);
    let over = ep.call_bulk(&write_req(f.ino, 100, 0), b"x");
    assert_eq!(over.unwrap_err(), Errno::ENOSPC);
    let grow = ep.call_bulk(&write_req(f.ino, 0, SS - 1), b"xy");
    // Not charged to a grant: the byte that overwrites lands, the one past is refused.
    assert_eq!(grow.unwrap().written, 1);
    assert!(
        c.stripes_on(s, f.ino).iter().all(|x| x.stripe != 100),
        "nothing written"
    );
    assert_eq!(
        ep.call(&ReadReq {
            ino: f.ino,
            stripe: 0,
            offset: SS - 1,
            len: 10
        })
        .unwrap(),
        b"x".to_vec()
    );
    assert_eq!(ep.call(&StatFsReq {}).unwrap().used, cap);
    // Overwriting in place needs no room.
    ep.call_bulk(&write_req(f.ino, 0, 0), &[2u8; 100]).unwrap();
}

#[test]
fn shrinking_setattr_truncates_peer_stripes() {
    let c = Cluster::start(2, 1 << 30, SS);
    let f = c.create(root(), "f", FileKind::Regular).unwrap();
    c.write(&f, 0, &pattern(4 * SS as usize, 1)).unwrap();
    let total = |c: &Cluster| -> Vec<StripeLen> {
        let mut all: Vec<StripeLen> = (0..2).flat_map(|s| c.stripes_on(s, f.ino)).collect();
        all.sort_by_key(|x| x.stripe);
        all
    };
    assert_eq!(total(&c).len(), 4);
    let set = |size: u64| SetAttrReq {
        ino: f.ino,
        valid: setattr::SIZE,
        mode: 0,
        uid: 0,
        gid: 0,
        size,
        atime: Default::default(),
        mtime: Default::default(),
        ctime: Default::default(),
    };
    let a = c.home(f.ino).call(&set(SS as u64 + 10)).unwrap().attr;
    assert_eq!(a.size, SS as u64 + 10);
    assert_eq!(
        total(&c),
        vec![
            StripeLen {
                stripe: 0,
                len: SS as u64
            },
            StripeLen { stripe: 1, len: 10 }
        ]
    );
    // Growing again shows zeros, not the old bytes.
    c.home(f.ino).call(&set(3 * SS as u64)).unwrap();
    let back = c.read(&f, SS as u64, 2 * SS as u64).unwrap();
    assert_eq!(
        &back[..10],
        &pattern(4 * SS as usize, 1)[SS as usize..SS as usize + 10]
    );
    assert!(back[10..].iter().all(|&b| b == 0));
    let d = c.create(root(), "d", FileKind::Directory).unwrap();
    assert_eq!(
        c.home(d.ino)
            .call(&SetAttrReq {
                ino: d.ino,
                ..set(0)
            })
            .unwrap_err(),
        Errno::EISDIR
    );
}

#[test]
fn unlinked_file_is_purged_on_last_close_on_every_server() {
    let c = Cluster::start(2, 1 << 30, SS);
    let f = c.create(root(), "victim", FileKind::Regular).unwrap();
    c.write(&f, 0, &pattern(2 * SS as usize, 3)).unwrap();
    assert!(
        (0..2).all(|s| !c.stripes_on(s, f.ino).is_empty()),
        "a stripe on each server"
    );
    let used_before: Vec<u64> = (0..2)
        .map(|s| c.at(s).call(&StatFsReq {}).unwrap().used)
        .collect();
    assert!(used_before.iter().all(|&u| u == SS as u64));

    let home = c.home(f.ino);
    home.call(&OpenReq {
        ino: f.ino,
        flags: 0,
    })
    .unwrap();
    c.call_entry(
        root(),
        b"victim",
        &RemoveEntryReq {
            parent: root(),
            name: b"victim".to_vec(),
            want: 0,
        },
    )
    .unwrap();
    assert_eq!(link_count(home, f.ino, -1).unwrap().attr.nlink, 0);
    // Still open: attributes and data stay.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(home.call(&GetAttrReq { ino: f.ino }).unwrap().attr.nlink, 0);
    assert_eq!(c.read(&f, 0, 10).unwrap(), pattern(10, 3));

    home.call(&ReleaseReq { ino: f.ino }).unwrap();
    assert_eq!(
        home.call(&GetAttrReq { ino: f.ino }).unwrap_err(),
        Errno::ENOENT
    );
    assert!(
        eventually(Duration::from_secs(10), || (0..2)
            .all(|s| c.stripes_on(s, f.ino).is_empty())),
        "stripes deleted on both servers"
    );
    for s in 0..2 {
        assert_eq!(c.at(s).call(&StatFsReq {}).unwrap().used, 0);
    }
}

#[test]
fn a_dropped_connection_releases_its_opens() {
    let c = Cluster::start(2, 1 << 30, SS);
    let f = c.create(root(), "f", FileKind::Regular).unwrap();
    c.write(&f, 0, b"data").unwrap();
    let home_index = f.ino.home();
    let other = endpoint(c.nodes[usize::from(home_index.0)].addr, client_hello());
    other
        .call(&OpenReq {
            ino: f.ino,
            flags: 0,
        })
        .unwrap();
    assert_eq!(
        other
            .call(&OpenReq {
                ino: spillway_types::InodeNo(12345),
                flags: 0
            })
            .unwrap_err(),
        Errno::ENOENT
    );
    link_count(c.home(f.ino), f.ino, -1).unwrap();
    assert!(
        c.getattr(f.ino).is_ok(),
        "held open by the other connection"
    );
    other.disconnect();
    assert!(eventually(Duration::from_secs(10), || c.getattr(f.ino)
        == Err(Errno::ENOENT)));
    assert!(eventually(Duration::from_secs(10), || (0..2)
        .all(|s| c.stripes_on(s, f.ino).is_empty())));
}

#[test]
fn a_purge_completes_when_a_peer_fragment_is_gone() {
    let c = Cluster::start(2, 1 << 30, SS);
    let name = (0..)
        .map(|i| format!("g{i}"))
        .find(|n| spillway_placement::dentry_server(root(), n.as_bytes(), 2).0 == 0)
        .unwrap();
    let f = c.create(root(), &name, FileKind::Regular).unwrap();
    c.write(&f, 0, &pattern(2 * SS as usize, 9)).unwrap();
    c.nodes[1]
        .admin()
        .call(&spillway_wire::FragmentDestroyReq { instance: INSTANCE })
        .unwrap();
    link_count(c.at(0), f.ino, -1).unwrap();
    let pending = || c.nodes[0].pending_purges();
    assert!(
        eventually(Duration::from_secs(10), || pending() == 0),
        "nothing left to purge on a destroyed fragment"
    );
    assert!(c.stripes_on(0, f.ino).is_empty());
}

#[test]
fn a_create_that_opens_holds_the_inode_like_an_open() {
    let c = Cluster::start(2, 1 << 30, SS);
    let req = spillway_wire::CreateReq {
        open: true,
        ..spillway_wire::CreateReq::new(root(), b"opened", FileKind::Regular, 0o644, 1000, 100)
    };
    let f = c.call_entry(root(), b"opened", &req).unwrap().attr;
    c.write(&f, 0, &pattern(SS as usize + 10, 9)).unwrap();
    let home = c.home(f.ino);
    c.call_entry(
        root(),
        b"opened",
        &RemoveEntryReq {
            parent: root(),
            name: b"opened".to_vec(),
            want: 0,
        },
    )
    .unwrap();
    let left = link_count(home, f.ino, -1).unwrap().attr;
    assert_eq!(left.nlink, 0);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        c.read(&f, 0, 10).unwrap(),
        pattern(10, 9),
        "still open: data stays"
    );
    home.call(&ReleaseReq { ino: f.ino }).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || (0..2)
            .all(|s| c.stripes_on(s, f.ino).is_empty())),
        "purged after the create's open is released"
    );
}
