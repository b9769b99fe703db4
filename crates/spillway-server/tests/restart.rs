//! Stopping and starting servers on the same roots: what was stored stays, orphans of
//! a crash are purged, purges owed to a down server complete once it is back.

mod common;

use common::*;
use spillway_placement::dentry_server;
use spillway_types::{FileKind, InodeNo};
use spillway_wire::{GetXattrReq, RemoveEntryReq, SetXattrReq, StatFsReq};
use std::time::Duration;

const SS: u32 = 64 << 10;

fn meta_db(c: &Cluster, server: u16) -> std::path::PathBuf {
    c.nodes[usize::from(server)]
        .root
        .join(format!("fragments/{INSTANCE}/meta.sqlite"))
}

#[test]
fn files_and_attributes_survive_a_restart_and_crash_orphans_are_purged() {
    let mut c = Cluster::start(2, 1 << 30, SS);
    let d = c.create(root(), "dir", FileKind::Directory).unwrap();
    let mut files = Vec::new();
    for i in 0..20 {
        let f = c
            .create(d.ino, &format!("f{i}"), FileKind::Regular)
            .unwrap();
        c.write(&f, 0, &vec![i as u8; 3 * SS as usize / 2]).unwrap();
        files.push(c.getattr(f.ino).unwrap());
    }
    let x = files[3].ino;
    c.home(x)
        .call(&SetXattrReq {
            ino: x,
            name: b"user.a".to_vec(),
            value: b"b".to_vec(),
            flags: 0,
        })
        .unwrap();
    files[3] = c.getattr(x).unwrap(); // the xattr changed its ctime
    let orphan = c.create(root(), "orphan", FileKind::Regular).unwrap();
    c.write(&orphan, 0, &vec![9u8; 2 * SS as usize]).unwrap();

    for n in &mut c.nodes {
        n.stop();
    }
    for s in 0..2 {
        let wal = std::fs::metadata(format!("{}-wal", meta_db(&c, s).display()));
        assert!(
            wal.map(|m| m.len() == 0).unwrap_or(true),
            "WAL checkpointed on clean stop"
        );
    }
    // A crash after the last unlink of an open file leaves an inode without links.
    let db = rusqlite::Connection::open(meta_db(&c, orphan.ino.home().0)).unwrap();
    db.execute(
        "UPDATE inodes SET nlink = 0 WHERE ino = ?1",
        [orphan.ino.0 as i64],
    )
    .unwrap();
    drop(db);

    for n in &mut c.nodes {
        n.restart();
    }
    c.reconnect();
    assert_eq!(c.lookup(root(), "dir").unwrap().entry.ino, d.ino);
    assert_eq!(c.read_dir_all(d.ino, 7).len(), 20);
    for (i, f) in files.iter().enumerate() {
        // st_blocks reaches the home some milliseconds after the writes (it may have
        // been behind when `files` was taken; at start every server reports again).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut got = c.getattr(f.ino).unwrap();
        while got.blocks * 512 < f.size && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
            got = c.getattr(f.ino).unwrap();
        }
        assert!(got.blocks * 512 >= f.size, "allocation reported: {got:?}");
        let got = spillway_types::Attr {
            blocks: f.blocks,
            ..got
        };
        assert_eq!(&got, f, "attributes intact");
        assert_eq!(
            c.read(f, 0, f.size).unwrap(),
            vec![i as u8; f.size as usize],
            "data intact"
        );
    }
    assert_eq!(
        c.home(x)
            .call(&GetXattrReq {
                ino: x,
                name: b"user.a".to_vec()
            })
            .unwrap()
            .value,
        b"b"
    );
    assert!(c.getattr(orphan.ino).is_err(), "orphan purged at start");
    assert!(eventually(Duration::from_secs(10), || (0..2)
        .all(|s| c.stripes_on(s, orphan.ino).is_empty())));
    // New inodes do not reuse numbers.
    let g = c.create(d.ino, "new", FileKind::Regular).unwrap();
    assert!(files.iter().all(|f| f.ino != g.ino));
}

#[test]
fn purges_owed_to_a_down_server_complete_when_it_returns() {
    let mut c = Cluster::start(2, 1 << 30, SS);
    // A file homed on server 0 (entry and inode land where the name hashes).
    let name = (0..)
        .map(|i| format!("p{i}"))
        .find(|n| dentry_server(root(), n.as_bytes(), 2).0 == 0)
        .unwrap();
    let f = c.create(root(), &name, FileKind::Regular).unwrap();
    assert_eq!(f.ino.home().0, 0);
    c.write(&f, 0, &vec![5u8; 2 * SS as usize]).unwrap();
    assert!(!c.stripes_on(1, f.ino).is_empty());

    c.nodes[1].stop();
    c.at(0)
        .call(&RemoveEntryReq {
            parent: root(),
            name: name.clone().into_bytes(),
            want: 0,
        })
        .unwrap();
    link_count(c.at(0), f.ino, -1).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || c
            .stripes_on(0, f.ino)
            .is_empty()),
        "local stripes go at once"
    );
    // The purge is owed to server 1, also across a restart of server 0.
    c.nodes[0].restart();
    // Server 0's first pass at start finds server 1 still down; only the periodic
    // retry can complete the purge.
    std::thread::sleep(Duration::from_millis(500));
    c.nodes[1].restart();
    c.reconnect();
    assert!(
        eventually(Duration::from_secs(15), || c
            .stripes_on(1, f.ino)
            .is_empty()),
        "the retried purge reached server 1"
    );
    assert_eq!(c.at(1).call(&StatFsReq {}).unwrap().used, 0);
    let pending = || c.nodes[0].pending_purges();
    assert!(
        eventually(Duration::from_secs(10), || pending() == 0),
        "purge log emptied"
    );
    assert!(c.getattr(InodeNo(f.ino.0)).is_err());
}

#[test]
fn startup_failures_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let err = spillway_server::start_in_process(file.join("root"), listener, tunables())
        .err()
        .unwrap();
    assert!(err.contains("cannot create storage root"), "{err}");
}
