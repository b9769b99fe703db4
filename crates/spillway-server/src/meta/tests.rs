//! Unit tests of the metadata store against a real SQLite file in a temp directory.

use super::test_fixtures::{errno, store_with};
use super::*;
use crate::error::StoreError;
use spillway_types::{Attr, Errno, FileKind, InodeNo, ServerIndex, Timespec, ROOT_INODE};

const HOME: Home = Home {
    index: ServerIndex(0),
    count: 2,
    default_stripe_size: 1 << 20,
};

/// setxattr with XATTR_CREATE, XATTR_REPLACE.
const MUST_CREATE: XattrMode = XattrMode {
    must_create: true,
    must_replace: false,
    acl_kill_sgid: false,
};
const MUST_REPLACE: XattrMode = XattrMode {
    must_create: false,
    must_replace: true,
    acl_kill_sgid: false,
};

fn store() -> (tempfile::TempDir, MetaStore) {
    store_with(RootSpec {
        uid: 10,
        gid: 20,
        mode: 0o40755,
        stripe_size: 1 << 20,
        stripe_width: 2,
    })
}

fn create(m: &MetaStore, parent: InodeNo, name: &str, kind: FileKind) -> Result<Attr, StoreError> {
    m.create(
        &NewNode {
            target: if kind == FileKind::Symlink {
                b"/some/where".to_vec()
            } else {
                Vec::new()
            },
            ..NewNode::new(parent, name.as_bytes(), kind, 0o100644, 1, 2)
        },
        HOME,
    )
}

#[test]
fn root_inode_is_created() {
    let (_d, m) = store();
    let a = m.get_attr(ROOT_INODE).unwrap();
    assert_eq!(a.kind, FileKind::Directory);
    assert_eq!((a.mode, a.uid, a.gid, a.nlink), (0o755, 10, 20, 2));
}

#[test]
fn create_lookup_and_errnos() {
    let (_d, m) = store();
    let a = create(&m, ROOT_INODE, "f", FileKind::Regular).unwrap();
    // The first counter from 2 whose file starts on this server (placement.md).
    let c = spillway_placement::counter_starting_at_home(ServerIndex(0), 2, 2);
    assert_eq!(a.ino, InodeNo::compose(ServerIndex(0), c));
    let layout = spillway_placement::Layout::of(a.ino, a.stripe_size, a.stripe_width, 2);
    assert_eq!(
        layout.server_of(spillway_types::StripeIndex(0)),
        ServerIndex(0)
    );
    assert_eq!(
        (a.mode, a.nlink, a.size, a.stripe_size, a.stripe_width),
        (0o644, 1, 0, 1 << 20, 2)
    );
    let d = create(&m, ROOT_INODE, "d", FileKind::Directory).unwrap();
    assert_eq!(d.nlink, 2);
    let s = create(&m, ROOT_INODE, "s", FileKind::Symlink).unwrap();
    assert_eq!(s.size, 11);
    assert_eq!(m.read_link(s.ino).unwrap(), b"/some/where");
    assert_eq!(errno(m.read_link(a.ino)), Errno::EINVAL);
    assert_eq!(
        errno(create(&m, ROOT_INODE, "f", FileKind::Regular)),
        Errno::EEXIST
    );
    assert_eq!(
        errno(create(&m, ROOT_INODE, "a/b", FileKind::Regular)),
        Errno::EINVAL
    );
    assert_eq!(
        errno(create(&m, ROOT_INODE, &"x".repeat(256), FileKind::Regular)),
        Errno::ENAMETOOLONG
    );

    let l = m.lookup(ROOT_INODE, b"f", ServerIndex(0)).unwrap();
    assert_eq!(
        l.entry,
        Entry {
            ino: a.ino,
            kind: FileKind::Regular
        }
    );
    assert_eq!(l.attr, Some(a.clone()));
    // Looked up from another server's point of view, the attributes are not ours.
    assert_eq!(
        m.lookup(ROOT_INODE, b"f", ServerIndex(1)).unwrap().attr,
        None
    );
    assert_eq!(
        errno(m.lookup(ROOT_INODE, b"nope", ServerIndex(0))),
        Errno::ENOENT
    );
    assert_eq!(errno(m.get_attr(InodeNo(999))), Errno::ENOENT);
    assert_eq!(m.inode_count().unwrap(), 4);
}

#[test]
fn remove_and_insert_entries() {
    let (_d, m) = store();
    let f = create(&m, ROOT_INODE, "f", FileKind::Regular).unwrap();
    let d = create(&m, ROOT_INODE, "d", FileKind::Directory).unwrap();
    assert_eq!(
        errno(m.remove_entry(ROOT_INODE, b"d", Expect::NotDir)),
        Errno::EISDIR
    );
    assert_eq!(
        errno(m.remove_entry(ROOT_INODE, b"f", Expect::Dir)),
        Errno::ENOTDIR
    );
    assert_eq!(
        errno(m.remove_entry(ROOT_INODE, b"zz", Expect::Any)),
        Errno::ENOENT
    );
    assert_eq!(
        m.remove_entry(ROOT_INODE, b"d", Expect::Dir).unwrap().ino,
        d.ino
    );
    let fe = Entry {
        ino: f.ino,
        kind: FileKind::Regular,
    };
    assert_eq!(
        errno(m.insert_entry(ROOT_INODE, b"f", &fe, false)),
        Errno::EEXIST
    );
    assert_eq!(m.insert_entry(ROOT_INODE, b"g", &fe, false).unwrap(), None);
    let other = Entry {
        ino: InodeNo(77),
        kind: FileKind::Fifo,
    };
    assert_eq!(
        m.insert_entry(ROOT_INODE, b"g", &other, true).unwrap(),
        Some(fe)
    );
    assert_eq!(
        m.lookup(ROOT_INODE, b"g", ServerIndex(0)).unwrap().entry,
        other
    );
}

#[test]
fn rename_variants() {
    let (_d, m) = store();
    let a = create(&m, ROOT_INODE, "a", FileKind::Regular).unwrap();
    let b = create(&m, ROOT_INODE, "b", FileKind::Regular).unwrap();
    let d = create(&m, ROOT_INODE, "d", FileKind::Directory).unwrap();
    let e = create(&m, ROOT_INODE, "e", FileKind::Directory).unwrap();
    let r = |o: &str, n: &str, f: RenameMode| {
        m.rename(ROOT_INODE, o.as_bytes(), ROOT_INODE, n.as_bytes(), f)
    };
    assert_eq!(errno(r("zz", "y", RenameMode::Replace)), Errno::ENOENT);
    assert_eq!(errno(r("a", "b", RenameMode::NoReplace)), Errno::EEXIST);
    assert_eq!(errno(r("a", "zz", RenameMode::Exchange)), Errno::ENOENT);
    assert_eq!(errno(r("d", "a", RenameMode::Replace)), Errno::ENOTDIR);
    assert_eq!(errno(r("a", "d", RenameMode::Replace)), Errno::EISDIR);
    // Exchange swaps.
    let x = r("a", "b", RenameMode::Exchange).unwrap();
    assert_eq!(
        (x.moved.ino, x.replaced.map(|e| e.ino)),
        (a.ino, Some(b.ino))
    );
    assert_eq!(
        m.lookup(ROOT_INODE, b"a", ServerIndex(0))
            .unwrap()
            .entry
            .ino,
        b.ino
    );
    assert_eq!(
        m.lookup(ROOT_INODE, b"b", ServerIndex(0))
            .unwrap()
            .entry
            .ino,
        a.ino
    );
    // Replace: "b" (now a) over "a" (now b).
    let x = r("b", "a", RenameMode::Replace).unwrap();
    assert_eq!(
        (x.moved.ino, x.replaced.map(|e| e.ino)),
        (a.ino, Some(b.ino))
    );
    assert_eq!(
        errno(m.lookup(ROOT_INODE, b"b", ServerIndex(0))),
        Errno::ENOENT
    );
    // Directory over empty directory.
    let x = r("d", "e", RenameMode::Replace).unwrap();
    assert_eq!(x.replaced.map(|e| e.ino), Some(e.ino));
    assert_eq!(
        m.lookup(ROOT_INODE, b"e", ServerIndex(0))
            .unwrap()
            .entry
            .ino,
        d.ino
    );
    // Two names of one inode: nothing happens.
    m.insert_entry(
        ROOT_INODE,
        b"hard",
        &Entry {
            ino: a.ino,
            kind: FileKind::Regular,
        },
        false,
    )
    .unwrap();
    let x = r("a", "hard", RenameMode::Replace).unwrap();
    assert_eq!(x.replaced, None);
    assert!(m.lookup(ROOT_INODE, b"a", ServerIndex(0)).is_ok());
    // Into a sealed directory.
    m.seal_dir(InodeNo(500)).unwrap();
    assert_eq!(
        errno(m.rename(ROOT_INODE, b"a", InodeNo(500), b"a", RenameMode::Replace)),
        Errno::ENOENT
    );
    m.unseal_dir(InodeNo(500)).unwrap();
    m.rename(ROOT_INODE, b"a", InodeNo(500), b"a", RenameMode::Replace)
        .unwrap();
    assert_eq!(
        m.lookup(InodeNo(500), b"a", ServerIndex(0))
            .unwrap()
            .entry
            .ino,
        a.ino
    );
}

#[test]
fn seal_blocks_creates_and_needs_emptiness() {
    let (_d, m) = store();
    let d = create(&m, ROOT_INODE, "d", FileKind::Directory).unwrap();
    create(&m, d.ino, "inner", FileKind::Regular).unwrap();
    assert_eq!(errno(m.seal_dir(d.ino)), Errno::ENOTEMPTY);
    m.remove_entry(d.ino, b"inner", Expect::Any).unwrap();
    m.seal_dir(d.ino).unwrap();
    m.seal_dir(d.ino).unwrap();
    assert_eq!(
        errno(create(&m, d.ino, "x", FileKind::Regular)),
        Errno::ENOENT
    );
    let e = Entry {
        ino: InodeNo(9),
        kind: FileKind::Regular,
    };
    assert_eq!(errno(m.insert_entry(d.ino, b"x", &e, false)), Errno::ENOENT);
    m.unseal_dir(d.ino).unwrap();
    create(&m, d.ino, "x", FileKind::Regular).unwrap();
}

#[test]
fn readdir_pages_in_byte_order() {
    let (_d, m) = store();
    for i in 0..25 {
        create(&m, ROOT_INODE, &format!("n{i:03}"), FileKind::Regular).unwrap();
    }
    let mut after = Vec::new();
    let mut seen = Vec::new();
    loop {
        let page = m.read_dir(ROOT_INODE, &after, 10, None).unwrap();
        assert!(page.entries.len() <= 10);
        assert!(page.attrs.is_empty(), "no attributes unless asked");
        seen.extend(page.entries.iter().map(|e| e.name.clone()));
        match page.entries.last() {
            Some(last) if page.more => after = last.name.clone(),
            _ => break,
        }
    }
    let want: Vec<Vec<u8>> = (0..25).map(|i| format!("n{i:03}").into_bytes()).collect();
    assert_eq!(seen, want);
    let empty = m.read_dir(ROOT_INODE, b"", 0, None).unwrap();
    assert!(empty.entries.is_empty() && empty.more);
}

/// READDIRPLUS: each entry comes with its inode's attributes when this server homes
/// it, and without when another server does (an entry renamed or linked here).
#[test]
fn read_dir_plus_attaches_attributes_of_inodes_homed_here() {
    let (_d, m) = store();
    let f = create(&m, ROOT_INODE, "f", FileKind::Regular).unwrap();
    let d = create(&m, ROOT_INODE, "d", FileKind::Directory).unwrap();
    let away = Entry {
        ino: InodeNo::compose(ServerIndex(1), 5),
        kind: FileKind::Regular,
    };
    m.insert_entry(ROOT_INODE, b"g", &away, false).unwrap();
    let page = m
        .read_dir(ROOT_INODE, b"", 10, Some(ServerIndex(0)))
        .unwrap();
    let names: Vec<&[u8]> = page.entries.iter().map(|e| e.name.as_slice()).collect();
    assert_eq!(names, [b"d".as_slice(), b"f", b"g"]);
    assert_eq!(page.attrs, vec![Some(d), Some(f), None]);
    // Asked as another server, none of them is homed there.
    let page = m
        .read_dir(ROOT_INODE, b"", 10, Some(ServerIndex(1)))
        .unwrap();
    assert_eq!(page.attrs, vec![None, None, None]);
}

#[test]
fn setattr_applies_valid_bits_only() {
    let (_d, m) = store();
    let a = create(&m, ROOT_INODE, "f", FileKind::Regular).unwrap();
    let t = Timespec { sec: 1000, nsec: 5 };
    let req = AttrChange {
        mode: Some(0o104600),
        size: Some(SizeChange::Set(4096)),
        mtime: Some(TimeChange::At(t)),
        ..AttrChange::default()
    };
    let b = m.set_attr(a.ino, &req).unwrap();
    assert_eq!(
        (b.mode, b.uid, b.gid, b.size, b.mtime),
        (0o4600, 1, 2, 4096, t)
    );
    assert_eq!(b.atime, a.atime);
    assert!(b.ctime >= a.ctime && b.ctime != t);
    let times = AttrChange {
        ctime: Some(t),
        atime: Some(TimeChange::Now),
        ..AttrChange::default()
    };
    let c = m.set_attr(a.ino, &times).unwrap();
    assert_eq!(c.ctime, t);
    assert!(c.atime > t);
    let d = create(&m, ROOT_INODE, "d", FileKind::Directory).unwrap();
    let size = AttrChange {
        size: Some(SizeChange::Set(4096)),
        ..AttrChange::default()
    };
    assert_eq!(errno(m.set_attr(d.ino, &size)), Errno::EISDIR);
    assert_eq!(errno(m.set_attr(InodeNo(12345), &size)), Errno::ENOENT);
}

/// `KILL_SUIDGID` takes setuid, and setgid only with group execute, from the mode the
/// file has at the home (after a mode in the same change); directories keep theirs.
#[test]
fn kill_suidgid_clears_privilege_bits_of_files_only() {
    let (_d, m) = store();
    let a = create(&m, ROOT_INODE, "f", FileKind::Regular).unwrap();
    let kill = AttrChange {
        kill_suidgid: true,
        ..AttrChange::default()
    };
    let mode = |mode| AttrChange {
        mode: Some(mode),
        ..AttrChange::default()
    };
    for (before, after) in [
        (0o6755, 0o0755),
        (0o6745, 0o2745), // setgid without group execute: mandatory locking, kept
        (0o4700, 0o0700),
        (0o0755, 0o0755),
    ] {
        m.set_attr(a.ino, &mode(before)).unwrap();
        assert_eq!(m.set_attr(a.ino, &kill).unwrap().mode, after, "{before:o}");
    }
    let both = AttrChange {
        mode: Some(0o6777),
        kill_suidgid: true,
        ..AttrChange::default()
    };
    assert_eq!(m.set_attr(a.ino, &both).unwrap().mode, 0o777);
    let d = create(&m, ROOT_INODE, "d", FileKind::Directory).unwrap();
    m.set_attr(d.ino, &mode(0o2775)).unwrap();
    assert_eq!(m.set_attr(d.ino, &kill).unwrap().mode, 0o2775);
}

#[test]
fn link_counts_sizes_and_dir_touch() {
    let (_d, m) = store();
    let a = create(&m, ROOT_INODE, "f", FileKind::Regular).unwrap();
    assert_eq!(m.link_count(a.ino, 2).unwrap().nlink, 3);
    assert_eq!(m.link_count(a.ino, -10).unwrap().nlink, 0);
    assert_eq!(m.extend_size(a.ino, 100, false).unwrap().size, 100);
    let b = m.extend_size(a.ino, 50, true).unwrap();
    assert_eq!(b.size, 100);
    assert!(b.mtime >= a.mtime);
    m.touch_dir(ROOT_INODE, 1).unwrap();
    assert_eq!(m.get_attr(ROOT_INODE).unwrap().nlink, 3);
    assert_eq!(errno(m.touch_dir(InodeNo(4444), 1)), Errno::ENOENT);
}

#[test]
fn xattrs() {
    let (_d, m) = store();
    let a = create(&m, ROOT_INODE, "f", FileKind::Regular).unwrap();
    m.set_xattr(a.ino, b"user.a", b"1", XattrMode::default())
        .unwrap();
    assert_eq!(
        errno(m.set_xattr(a.ino, b"user.a", b"2", MUST_CREATE)),
        Errno::EEXIST
    );
    assert_eq!(
        errno(m.set_xattr(a.ino, b"user.b", b"2", MUST_REPLACE)),
        Errno::ENODATA
    );
    m.set_xattr(a.ino, b"user.a", b"3", MUST_REPLACE).unwrap();
    m.set_xattr(a.ino, b"user.b", b"", MUST_CREATE).unwrap();
    assert_eq!(m.get_xattr(a.ino, b"user.a").unwrap(), b"3");
    assert_eq!(
        m.list_xattrs(a.ino).unwrap(),
        vec![b"user.a".to_vec(), b"user.b".to_vec()]
    );
    m.remove_xattr(a.ino, b"user.a").unwrap();
    assert_eq!(errno(m.remove_xattr(a.ino, b"user.a")), Errno::ENODATA);
    assert_eq!(errno(m.get_xattr(a.ino, b"user.a")), Errno::ENODATA);
    assert_eq!(errno(m.get_xattr(InodeNo(999), b"user.a")), Errno::ENOENT);
    assert_eq!(
        errno(m.set_xattr(InodeNo(999), b"user.a", b"", XattrMode::default())),
        Errno::ENOENT
    );
    assert_eq!(
        errno(m.set_xattr(a.ino, b"", b"", XattrMode::default())),
        Errno::EINVAL
    );
    assert_eq!(
        errno(m.set_xattr(a.ino, &[b'n'; 300], b"", XattrMode::default())),
        Errno::ERANGE
    );
    assert_eq!(
        errno(m.set_xattr(a.ino, b"user.big", &vec![0; 70000], XattrMode::default())),
        Errno::E2BIG
    );
}

#[test]
fn purge_log() {
    let (_d, m) = store();
    let a = create(&m, ROOT_INODE, "f", FileKind::Regular).unwrap();
    let d = create(&m, ROOT_INODE, "d", FileKind::Directory).unwrap();
    assert!(
        !m.begin_purge(a.ino).unwrap(),
        "linked inodes are not purged"
    );
    m.link_count(a.ino, -1).unwrap();
    m.link_count(d.ino, -2).unwrap();
    assert_eq!(m.orphans().unwrap(), vec![a.ino, d.ino]);
    m.set_xattr(a.ino, b"user.x", b"y", XattrMode::default())
        .unwrap();
    assert!(m.begin_purge(a.ino).unwrap());
    assert!(
        !m.begin_purge(a.ino).unwrap(),
        "a second purge finds nothing"
    );
    assert!(
        !m.begin_purge(d.ino).unwrap(),
        "directories have no data to delete"
    );
    assert_eq!(errno(m.get_attr(a.ino)), Errno::ENOENT);
    assert!(m.orphans().unwrap().is_empty());
    let p = m.pending_purges().unwrap();
    assert_eq!(
        p,
        vec![PurgeRecord {
            ino: a.ino,
            stripe_size: 1 << 20,
            stripe_width: 2
        }]
    );
    m.finish_purge(a.ino).unwrap();
    assert!(m.pending_purges().unwrap().is_empty());
}

#[test]
fn survives_reopen_and_refuses_after_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.sqlite");
    let m = MetaStore::init(&path, 1, None).unwrap();
    let home = Home {
        index: ServerIndex(3),
        ..HOME
    };
    let req = NewNode {
        stripe_size: 8192,
        stripe_width: 9,
        ..NewNode::new(ROOT_INODE, b"x", FileKind::Regular, 0o644, 0, 0)
    };
    let a = m.create(&req, home).unwrap();
    assert_eq!(a.ino, InodeNo::compose(ServerIndex(3), 1));
    assert_eq!((a.stripe_size, a.stripe_width), (8192, 2));
    m.sync().unwrap();
    m.close().unwrap();
    assert_eq!(errno(m.get_attr(a.ino)), Errno::ESTALE);
    let m = MetaStore::open(&path).unwrap();
    assert_eq!(m.get_attr(a.ino).unwrap(), a);
    let b = m
        .create(
            &NewNode {
                name: b"y".to_vec(),
                ..req.clone()
            },
            home,
        )
        .unwrap();
    assert_eq!(b.ino.counter(), 2, "the counter survives a reopen");
    assert_eq!(
        errno(m.create(
            &NewNode {
                stripe_size: 1000,
                ..req
            },
            home
        )),
        Errno::EINVAL
    );
}

#[test]
fn truncate_that_changes_the_size_updates_mtime() {
    let (_d, m) = store();
    let a = create(&m, ROOT_INODE, "f", FileKind::Regular).unwrap();
    let old = Timespec { sec: 10, nsec: 0 };
    let mtime = AttrChange {
        mtime: Some(TimeChange::At(old)),
        ..AttrChange::default()
    };
    assert_eq!(m.set_attr(a.ino, &mtime).unwrap().mtime, old);
    let size = AttrChange {
        size: Some(SizeChange::Set(5)),
        ..AttrChange::default()
    };
    let b = m.set_attr(a.ino, &size).unwrap();
    assert!(b.mtime > old, "size change must set mtime");
    // Same size again: mtime stays (as ext4 does).
    let c = m.set_attr(a.ino, &size).unwrap();
    assert_eq!(c.mtime, b.mtime);
}

#[test]
fn layout_is_settable_until_data_exists() {
    let (_d, m) = store();
    let f = create(&m, ROOT_INODE, "f", FileKind::Regular).unwrap();
    let a = m.set_layout(f.ino, 1 << 20, 1, 2).unwrap();
    assert_eq!((a.stripe_size, a.stripe_width), (1 << 20, 1));
    let stored = m.get_attr(f.ino).unwrap();
    assert_eq!(
        (stored.stripe_size, stored.stripe_width),
        (1 << 20, 1),
        "persisted"
    );
    assert_eq!(m.set_layout(f.ino, 4096, 0, 2).unwrap().stripe_width, 2);
    assert_eq!(errno(m.set_layout(f.ino, 1000, 1, 2)), Errno::EINVAL);
    assert_eq!(errno(m.set_layout(f.ino, 0, 1, 2)), Errno::EINVAL);
    assert_eq!(errno(m.set_layout(f.ino, 4096, 3, 2)), Errno::EINVAL);
    m.extend_size(f.ino, 1, false).unwrap();
    assert_eq!(errno(m.set_layout(f.ino, 8192, 1, 2)), Errno::EBUSY);
    let d = create(&m, ROOT_INODE, "d", FileKind::Directory).unwrap();
    assert_eq!(m.set_layout(d.ino, 65536, 1, 2).unwrap().stripe_size, 65536);
    let l = create(&m, ROOT_INODE, "l", FileKind::Symlink).unwrap();
    assert_eq!(errno(m.set_layout(l.ino, 65536, 1, 2)), Errno::EINVAL);
}
