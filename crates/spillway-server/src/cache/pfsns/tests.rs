//! Against a real temporary directory (tests run as root: open_by_handle_at needs it).

use super::*;
use crate::error::StoreError;
use spillway_types::ROOT_INODE;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

const NOBODY: u32 = 65534;
const SS: u32 = 1 << 20;
const SW: u16 = 4;

struct Fx {
    tmp: tempfile::TempDir,
    pfs: PathBuf,
    db: PathBuf,
    ns: PfsNamespace,
}

fn open_ns(pfs: &Path, db: &Path) -> StoreResult<PfsNamespace> {
    let dir = File::open(pfs).unwrap();
    PfsNamespace::open(OwnedFd::from(dir), db, ServerIndex(0), SS, SW)
}

fn fx() -> Fx {
    let tmp = tempfile::tempdir().unwrap();
    let pfs = tmp.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    let db = tmp.path().join("ns.db");
    let ns = open_ns(&pfs, &db).unwrap();
    Fx { tmp, pfs, db, ns }
}

fn errno<T: std::fmt::Debug>(r: StoreResult<T>) -> Errno {
    r.unwrap_err().errno()
}

fn lmeta(p: &Path) -> std::fs::Metadata {
    std::fs::symlink_metadata(p).unwrap()
}

fn node(parent: InodeNo, name: &str, kind: FileKind, mode: u32) -> NewNode {
    NewNode::new(parent, name.as_bytes(), kind, mode, NOBODY, NOBODY)
}

fn names(page: &DirPage) -> Vec<Vec<u8>> {
    page.entries.iter().map(|e| e.name.clone()).collect()
}

#[test]
fn lookup_and_getattr_show_the_pfs() {
    let f = fx();
    std::fs::write(f.pfs.join("file"), b"hello").unwrap();
    std::fs::set_permissions(f.pfs.join("file"), PermissionsExt::from_mode(0o640)).unwrap();
    std::fs::create_dir(f.pfs.join("dir")).unwrap();
    std::os::unix::fs::symlink("file", f.pfs.join("link")).unwrap();

    let root = f.ns.get_attr(ROOT_INODE).unwrap();
    assert_eq!((root.ino, root.kind), (ROOT_INODE, FileKind::Directory));
    assert_eq!(root.nlink, 3);
    assert_eq!((root.stripe_size, root.stripe_width), (SS, SW));

    let file = f.ns.lookup(ROOT_INODE, b"file").unwrap();
    let a = file.attr.clone().unwrap();
    assert_eq!(
        file.entry,
        Entry {
            ino: a.ino,
            kind: FileKind::Regular
        }
    );
    assert_eq!(a.ino.home(), ServerIndex(0));
    assert_ne!(a.ino, ROOT_INODE);
    assert_eq!((a.size, a.mode, a.nlink, a.uid, a.gid), (5, 0o640, 1, 0, 0));
    let m = lmeta(&f.pfs.join("file"));
    assert_eq!(
        (a.mtime.sec, a.mtime.nsec as i64),
        (m.mtime(), m.mtime_nsec())
    );
    assert_eq!(a.blocks, m.blocks());
    assert_eq!(f.ns.get_attr(a.ino).unwrap(), a);

    let dir = f.ns.lookup(ROOT_INODE, b"dir").unwrap();
    assert_eq!(dir.entry.kind, FileKind::Directory);
    assert_eq!(dir.attr.unwrap().nlink, 2);
    let link = f.ns.lookup(ROOT_INODE, b"link").unwrap();
    assert_eq!(link.entry.kind, FileKind::Symlink);
    assert_eq!(f.ns.read_link(link.entry.ino).unwrap(), b"file");
    assert_eq!(errno(f.ns.read_link(file.entry.ino)), Errno::EINVAL);

    assert_eq!(errno(f.ns.lookup(ROOT_INODE, b"missing")), Errno::ENOENT);
    assert_eq!(errno(f.ns.lookup(file.entry.ino, b"x")), Errno::ENOTDIR);
    // Numbers never given, or of another home, are stale.
    assert_eq!(
        errno(f.ns.get_attr(InodeNo::compose(ServerIndex(0), 999))),
        Errno::ESTALE
    );
    assert_eq!(
        errno(f.ns.get_attr(InodeNo::compose(ServerIndex(1), 1))),
        Errno::ESTALE
    );
}

#[test]
fn numbers_are_stable_across_lookups_renames_and_restarts() {
    let f = fx();
    std::fs::create_dir(f.pfs.join("d")).unwrap();
    std::fs::write(f.pfs.join("d/a"), b"x").unwrap();
    let d = f.ns.lookup(ROOT_INODE, b"d").unwrap().entry.ino;
    let a = f.ns.lookup(d, b"a").unwrap().entry.ino;
    assert_eq!(f.ns.lookup(d, b"a").unwrap().entry.ino, a);
    // Moved on the PFS directly: the same inode, the same number.
    std::fs::rename(f.pfs.join("d/a"), f.pfs.join("b")).unwrap();
    assert_eq!(f.ns.lookup(ROOT_INODE, b"b").unwrap().entry.ino, a);
    assert_eq!(f.ns.inode_count().unwrap(), 3);

    f.ns.close().unwrap();
    assert_eq!(errno(f.ns.get_attr(a)), Errno::ESTALE);
    assert_eq!(errno(f.ns.lookup(ROOT_INODE, b"b")), Errno::ESTALE);

    let ns = open_ns(&f.pfs, &f.db).unwrap();
    assert_eq!(ns.lookup(ROOT_INODE, b"b").unwrap().entry.ino, a);
    assert_eq!(ns.lookup(ROOT_INODE, b"d").unwrap().entry.ino, d);
    assert_eq!(ns.get_attr(a).unwrap().size, 1);
    assert_eq!(ns.inode_count().unwrap(), 3);
    // A new inode gets a new number.
    std::fs::write(f.pfs.join("c"), b"").unwrap();
    let c = ns.lookup(ROOT_INODE, b"c").unwrap().entry.ino;
    assert!(c != a && c != d && c != ROOT_INODE);
    drop(ns);

    // The table belongs to its directory.
    let other = f.tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let e = open_ns(&other, &f.db).err().unwrap();
    assert!(matches!(e, StoreError::Corrupt(_)), "{e}");
    let meta = std::fs::metadata(&f.db).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
}

#[test]
fn another_home_composes_its_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = File::open(tmp.path()).unwrap();
    let ns = PfsNamespace::open(
        OwnedFd::from(dir),
        &tmp.path().join("t.db"),
        ServerIndex(3),
        SS,
        SW,
    )
    .unwrap();
    let root = InodeNo::compose(ServerIndex(3), 1);
    assert_eq!(ns.get_attr(root).unwrap().kind, FileKind::Directory);
    std::fs::write(tmp.path().join("f"), b"").unwrap();
    assert_eq!(
        ns.lookup(root, b"f").unwrap().entry.ino.home(),
        ServerIndex(3)
    );
    assert_eq!(errno(ns.get_attr(ROOT_INODE)), Errno::ESTALE);
}

#[test]
fn create_makes_every_kind_owned_by_the_caller_with_the_exact_mode() {
    let f = fx();
    // Modes the server's umask (022) would cut, and set-ID bits a chown would clear.
    let cases: [(&str, FileKind, u32); 7] = [
        ("reg", FileKind::Regular, 0o6777),
        ("dir", FileKind::Directory, 0o3777),
        ("sym", FileKind::Symlink, 0o777),
        ("fifo", FileKind::Fifo, 0o666),
        ("sock", FileKind::Socket, 0o777),
        ("chr", FileKind::CharDevice, 0o620),
        ("blk", FileKind::BlockDevice, 0o660),
    ];
    for (name, kind, mode) in cases {
        let mut n = node(ROOT_INODE, name, kind, mode);
        n.target = b"somewhere/else".to_vec();
        n.rdev = match kind {
            FileKind::CharDevice => libc::makedev(1, 3) as u32,
            FileKind::BlockDevice => libc::makedev(7, 300) as u32,
            _ => 0,
        };
        let a = f.ns.create(&n).unwrap();
        assert_eq!(a.kind, kind, "{name}");
        let m = lmeta(&f.pfs.join(name));
        assert_eq!((m.uid(), m.gid()), (NOBODY, NOBODY), "{name}");
        assert_eq!((a.uid, a.gid), (NOBODY, NOBODY), "{name}");
        assert_eq!(FileKind::from_mode(m.mode()), Some(kind), "{name}");
        if kind != FileKind::Symlink {
            assert_eq!(m.mode() & 0o7777, mode, "{name}");
            assert_eq!(a.mode, mode, "{name}");
        }
        assert_eq!(m.rdev() as u32, n.rdev, "{name}");
        assert_eq!(a.rdev, n.rdev, "{name}");
        let found = f.ns.lookup(ROOT_INODE, name.as_bytes()).unwrap();
        assert_eq!(found.entry, Entry { ino: a.ino, kind }, "{name}");
        assert_eq!(errno(f.ns.create(&n)), Errno::EEXIST, "{name}");
    }
    let sym = f.ns.lookup(ROOT_INODE, b"sym").unwrap().entry.ino;
    assert_eq!(f.ns.read_link(sym).unwrap(), b"somewhere/else");

    // Geometry: the node's, or the instance's default for 0.
    let dir = f.ns.lookup(ROOT_INODE, b"dir").unwrap().entry.ino;
    let mut n = node(dir, "striped", FileKind::Regular, 0o644);
    n.stripe_size = 8192;
    n.stripe_width = 2;
    let a = f.ns.create(&n).unwrap();
    assert_eq!((a.stripe_size, a.stripe_width), (8192, 2));
    assert_eq!(f.ns.get_attr(a.ino).unwrap().stripe_size, 8192);
    let a =
        f.ns.create(&node(dir, "plain", FileKind::Regular, 0o644))
            .unwrap();
    assert_eq!((a.stripe_size, a.stripe_width), (SS, SW));

    // Extended attributes made with it; those the PFS refuses outright fail the create
    // and leave nothing behind.
    let mut n = node(ROOT_INODE, "withx", FileKind::Regular, 0o600);
    n.xattrs = vec![(b"user.inherited".to_vec(), b"v".to_vec())];
    let a = f.ns.create(&n).unwrap();
    assert_eq!(f.ns.get_xattr(a.ino, b"user.inherited").unwrap(), b"v");
    let big = vec![0u8; 65537];
    let mut n = node(ROOT_INODE, "badx", FileKind::Regular, 0o600);
    n.xattrs = vec![(b"user.big".to_vec(), big.clone())];
    assert_eq!(errno(f.ns.create(&n)), Errno::E2BIG);
    assert!(!f.pfs.join("badx").exists());
    let mut n = node(ROOT_INODE, "badxdir", FileKind::Directory, 0o700);
    n.xattrs = vec![(b"user.big".to_vec(), big)];
    assert_eq!(errno(f.ns.create(&n)), Errno::E2BIG);
    assert!(!f.pfs.join("badxdir").exists());
    // One the PFS does not know (no namespace: EOPNOTSUPP) is passed over.
    let mut n = node(ROOT_INODE, "oddx", FileKind::Regular, 0o600);
    n.xattrs = vec![(b"nonamespace".to_vec(), b"v".to_vec())];
    f.ns.create(&n).unwrap();

    let reg = f.ns.lookup(ROOT_INODE, b"reg").unwrap().entry.ino;
    assert_eq!(
        errno(f.ns.create(&node(reg, "x", FileKind::Regular, 0o644))),
        Errno::ENOTDIR
    );
    let mut n = node(ROOT_INODE, "empty", FileKind::Symlink, 0o777);
    n.target = Vec::new();
    assert_eq!(errno(f.ns.create(&n)), Errno::ENOENT);
}

#[test]
fn removals_answer_the_pfs_errnos() {
    let f = fx();
    let d =
        f.ns.create(&node(ROOT_INODE, "d", FileKind::Directory, 0o755))
            .unwrap();
    let file =
        f.ns.create(&node(d.ino, "f", FileKind::Regular, 0o644))
            .unwrap();
    assert_eq!(
        errno(f.ns.remove_entry(ROOT_INODE, b"d", Expect::Dir, &By::ROOT)),
        Errno::ENOTEMPTY
    );
    assert_eq!(
        errno(f.ns.remove_entry(ROOT_INODE, b"d", Expect::NotDir, &By::ROOT)),
        Errno::EISDIR
    );
    assert_eq!(
        errno(f.ns.remove_entry(d.ino, b"f", Expect::Dir, &By::ROOT)),
        Errno::ENOTDIR
    );
    assert_eq!(
        errno(f.ns.remove_entry(d.ino, b"nope", Expect::Any, &By::ROOT)),
        Errno::ENOENT
    );
    assert_eq!(
        errno(f.ns.remove_entry(file.ino, b"x", Expect::Any, &By::ROOT)),
        Errno::ENOTDIR
    );
    assert_eq!(
        errno(f.ns.create(&node(ROOT_INODE, "d", FileKind::Directory, 0o755))),
        Errno::EEXIST
    );

    let gone =
        f.ns.remove_entry(d.ino, b"f", Expect::NotDir, &By::ROOT)
            .unwrap();
    assert_eq!(
        gone,
        Entry {
            ino: file.ino,
            kind: FileKind::Regular
        }
    );
    assert!(!f.pfs.join("d/f").exists());
    // The directory's own update after it: the PFS's fresh attributes.
    let m = lmeta(&f.pfs.join("d"));
    let a = f.ns.touch_dir(d.ino, 0).unwrap();
    assert_eq!(
        (a.nlink, a.mtime.sec, a.mtime.nsec as i64),
        (2, m.mtime(), m.mtime_nsec())
    );
    let gone =
        f.ns.remove_entry(ROOT_INODE, b"d", Expect::Dir, &By::ROOT)
            .unwrap();
    assert_eq!(
        gone,
        Entry {
            ino: d.ino,
            kind: FileKind::Directory
        }
    );
    assert!(!f.pfs.join("d").exists());
    // The client's link count update after each: nlink 0, the last attributes.
    let a = f.ns.link_count(d.ino, -2).unwrap();
    assert_eq!((a.ino, a.kind, a.nlink), (d.ino, FileKind::Directory, 0));
    let dir2 =
        f.ns.create(&node(ROOT_INODE, "d2", FileKind::Directory, 0o755))
            .unwrap();
    f.ns.create(&node(dir2.ino, "x", FileKind::Regular, 0o644))
        .unwrap();
    assert_eq!(
        f.ns.remove_entry(dir2.ino, b"x", Expect::Any, &By::ROOT)
            .unwrap()
            .kind,
        FileKind::Regular
    );
    assert_eq!(
        f.ns.remove_entry(ROOT_INODE, b"d2", Expect::Any, &By::ROOT)
            .unwrap()
            .kind,
        FileKind::Directory
    );
}

#[test]
fn renames_plain_noreplace_and_exchange() {
    let f = fx();
    std::fs::write(f.pfs.join("a"), b"A").unwrap();
    std::fs::write(f.pfs.join("b"), b"B").unwrap();
    std::fs::create_dir(f.pfs.join("sub")).unwrap();
    let a = f.ns.lookup(ROOT_INODE, b"a").unwrap().entry;
    let b = f.ns.lookup(ROOT_INODE, b"b").unwrap().entry;
    let sub = f.ns.lookup(ROOT_INODE, b"sub").unwrap().entry;

    let r = f.ns.rename(
        ROOT_INODE,
        b"a",
        ROOT_INODE,
        b"b",
        RenameMode::NoReplace,
        &By::ROOT,
    );
    assert_eq!(errno(r), Errno::EEXIST);
    let r =
        f.ns.rename(
            ROOT_INODE,
            b"a",
            ROOT_INODE,
            b"b",
            RenameMode::Replace,
            &By::ROOT,
        )
        .unwrap();
    assert_eq!(
        r,
        Renamed {
            moved: a,
            replaced: Some(b)
        }
    );
    assert_eq!(std::fs::read(f.pfs.join("b")).unwrap(), b"A");
    assert!(!f.pfs.join("a").exists());
    assert_eq!(f.ns.link_count(b.ino, -1).unwrap().nlink, 0);

    let r =
        f.ns.rename(
            ROOT_INODE,
            b"b",
            sub.ino,
            b"c",
            RenameMode::NoReplace,
            &By::ROOT,
        )
        .unwrap();
    assert_eq!(
        r,
        Renamed {
            moved: a,
            replaced: None
        }
    );
    assert_eq!(f.ns.lookup(sub.ino, b"c").unwrap().entry, a);

    std::fs::write(f.pfs.join("x"), b"X").unwrap();
    let x = f.ns.lookup(ROOT_INODE, b"x").unwrap().entry;
    let r =
        f.ns.rename(
            sub.ino,
            b"c",
            ROOT_INODE,
            b"x",
            RenameMode::Exchange,
            &By::ROOT,
        )
        .unwrap();
    assert_eq!(
        r,
        Renamed {
            moved: a,
            replaced: Some(x)
        }
    );
    assert_eq!(std::fs::read(f.pfs.join("x")).unwrap(), b"A");
    assert_eq!(std::fs::read(f.pfs.join("sub/c")).unwrap(), b"X");
    assert_eq!(f.ns.lookup(ROOT_INODE, b"x").unwrap().entry, a);
    let r = f.ns.rename(
        ROOT_INODE,
        b"x",
        ROOT_INODE,
        b"missing",
        RenameMode::Exchange,
        &By::ROOT,
    );
    assert_eq!(errno(r), Errno::ENOENT);
    let r = f.ns.rename(
        ROOT_INODE,
        b"missing",
        ROOT_INODE,
        b"y",
        RenameMode::Replace,
        &By::ROOT,
    );
    assert_eq!(errno(r), Errno::ENOENT);
    // A directory onto a non-empty one, and onto a file.
    std::fs::create_dir(f.pfs.join("e")).unwrap();
    let r = f.ns.rename(
        ROOT_INODE,
        b"e",
        ROOT_INODE,
        b"sub",
        RenameMode::Replace,
        &By::ROOT,
    );
    assert_eq!(errno(r), Errno::ENOTEMPTY);
    let r = f.ns.rename(
        ROOT_INODE,
        b"e",
        ROOT_INODE,
        b"x",
        RenameMode::Replace,
        &By::ROOT,
    );
    assert_eq!(errno(r), Errno::ENOTDIR);
}

#[test]
fn hard_links_and_link_counts() {
    let f = fx();
    let a =
        f.ns.create(&node(ROOT_INODE, "f", FileKind::Regular, 0o644))
            .unwrap();
    let e = Entry {
        ino: a.ino,
        kind: FileKind::Regular,
    };
    assert_eq!(
        f.ns.insert_entry(ROOT_INODE, b"g", &e, false).unwrap(),
        None
    );
    assert_eq!(lmeta(&f.pfs.join("g")).ino(), lmeta(&f.pfs.join("f")).ino());
    assert_eq!(f.ns.link_count(a.ino, 1).unwrap().nlink, 2);
    assert_eq!(f.ns.lookup(ROOT_INODE, b"g").unwrap().entry, e);
    assert_eq!(
        errno(f.ns.insert_entry(ROOT_INODE, b"g", &e, false)),
        Errno::EEXIST
    );
    assert_eq!(
        errno(f.ns.insert_entry(ROOT_INODE, b"g", &e, true)),
        Errno::EXDEV
    );
    let d =
        f.ns.create(&node(ROOT_INODE, "d", FileKind::Directory, 0o755))
            .unwrap();
    let de = Entry {
        ino: d.ino,
        kind: FileKind::Directory,
    };
    assert_eq!(
        errno(f.ns.insert_entry(ROOT_INODE, b"dl", &de, false)),
        Errno::EPERM
    );
    // A directory named as something else is still refused.
    let lie = Entry {
        ino: d.ino,
        kind: FileKind::Regular,
    };
    assert_eq!(
        errno(f.ns.insert_entry(ROOT_INODE, b"dl", &lie, false)),
        Errno::EPERM
    );

    std::fs::write(f.pfs.join("f"), b"12345").unwrap();
    f.ns.remove_entry(ROOT_INODE, b"f", Expect::NotDir, &By::ROOT)
        .unwrap();
    assert_eq!(f.ns.link_count(a.ino, -1).unwrap().nlink, 1);
    f.ns.remove_entry(ROOT_INODE, b"g", Expect::NotDir, &By::ROOT)
        .unwrap();
    let last = f.ns.link_count(a.ino, -1).unwrap();
    assert_eq!((last.ino, last.nlink, last.size), (a.ino, 0, 5));
    assert_eq!(errno(f.ns.get_attr(a.ino)), Errno::ESTALE);
    // Gone before we could see it removed: nothing remembered.
    let b =
        f.ns.create(&node(ROOT_INODE, "b", FileKind::Regular, 0o644))
            .unwrap();
    std::fs::remove_file(f.pfs.join("b")).unwrap();
    assert_eq!(errno(f.ns.link_count(b.ino, -1)), Errno::ESTALE);
}

#[test]
fn read_dir_pages_in_byte_order() {
    let f = fx();
    let mut all: Vec<Vec<u8>> = vec![
        b"b".to_vec(),
        b"a".to_vec(),
        b"aa".to_vec(),
        b"Z".to_vec(),
        b"c".to_vec(),
        vec![0xff, b'x'],
        b"a.b".to_vec(),
    ];
    for (i, n) in all.iter().enumerate() {
        let p = f
            .pfs
            .join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(n));
        std::fs::write(p, vec![0u8; i]).unwrap();
    }
    std::fs::create_dir(f.pfs.join("sub")).unwrap();
    all.push(b"sub".to_vec());
    all.sort();

    let mut seen = Vec::new();
    let mut after = Vec::new();
    loop {
        let page = f.ns.read_dir(ROOT_INODE, &after, 3, true).unwrap();
        assert!(page.entries.len() <= 3);
        assert_eq!(page.attrs.len(), page.entries.len());
        for (e, a) in page.entries.iter().zip(&page.attrs) {
            let a = a.as_ref().unwrap();
            assert_eq!((a.ino, a.kind), (e.entry.ino, e.entry.kind));
            assert_eq!(f.ns.lookup(ROOT_INODE, &e.name).unwrap().entry, e.entry);
        }
        seen.extend(names(&page));
        match seen.last() {
            Some(l) if page.more => after = l.clone(),
            _ => break,
        }
    }
    assert_eq!(seen, all);

    let page = f.ns.read_dir(ROOT_INODE, b"aa", 2, false).unwrap();
    assert_eq!(names(&page), vec![b"b".to_vec(), b"c".to_vec()]);
    assert!(page.attrs.is_empty());
    assert!(page.more);
    let page = f.ns.read_dir(ROOT_INODE, b"sub", 10, false).unwrap();
    assert_eq!(names(&page), vec![vec![0xff, b'x']]);
    assert!(!page.more);
    let page = f.ns.read_dir(ROOT_INODE, &[0xff, 0xff], 10, false).unwrap();
    assert!(page.entries.is_empty() && !page.more);
    let page = f.ns.read_dir(ROOT_INODE, b"", 0, false).unwrap();
    assert!(page.entries.is_empty() && page.more);
    let page = f.ns.read_dir(ROOT_INODE, b"", u32::MAX, true).unwrap();
    assert_eq!(names(&page), all);
    assert!(!page.more);
    let sub = f.ns.lookup(ROOT_INODE, b"sub").unwrap().entry.ino;
    assert!(f
        .ns
        .read_dir(sub, b"", 10, true)
        .unwrap()
        .entries
        .is_empty());

    // A name removed behind the listing's back is left out of the later pages.
    let first = f.ns.read_dir(ROOT_INODE, b"", 1, false).unwrap();
    assert_eq!(names(&first), vec![b"Z".to_vec()]);
    std::fs::remove_file(f.pfs.join("a")).unwrap();
    let next = f.ns.read_dir(ROOT_INODE, b"Z", 1, false).unwrap();
    assert_eq!(names(&next), vec![b"a.b".to_vec()]);
    // And a name removed through the namespace too.
    f.ns.remove_entry(ROOT_INODE, b"aa", Expect::Any, &By::ROOT)
        .unwrap();
    let next = f.ns.read_dir(ROOT_INODE, b"a.b", 1, false).unwrap();
    assert_eq!(names(&next), vec![b"b".to_vec()]);

    let file = f.ns.lookup(ROOT_INODE, b"b").unwrap().entry.ino;
    assert_eq!(errno(f.ns.read_dir(file, b"", 10, false)), Errno::ENOTDIR);
}

#[test]
fn set_attr_changes_the_pfs() {
    let f = fx();
    let p = f.pfs.join("f");
    std::fs::write(&p, b"0123456789").unwrap();
    let ino = f.ns.lookup(ROOT_INODE, b"f").unwrap().entry.ino;

    let ch = AttrChange {
        mode: Some(0o4711),
        uid: Some(NOBODY),
        gid: Some(NOBODY),
        ..Default::default()
    };
    let a = f.ns.set_attr(ino, &ch).unwrap();
    assert_eq!((a.mode, a.uid, a.gid), (0o4711, NOBODY, NOBODY));
    let m = lmeta(&p);
    assert_eq!(
        (m.mode() & 0o7777, m.uid(), m.gid()),
        (0o4711, NOBODY, NOBODY)
    );
    // Group only.
    let a =
        f.ns.set_attr(
            ino,
            &AttrChange {
                gid: Some(0),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.uid, a.gid), (NOBODY, 0));

    let a =
        f.ns.set_attr(
            ino,
            &AttrChange {
                size: Some(SizeChange::Set(4)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.size, 4);
    assert_eq!(std::fs::read(&p).unwrap(), b"0123");
    let a =
        f.ns.set_attr(
            ino,
            &AttrChange {
                size: Some(SizeChange::AtLeast(2)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.size, 4);
    let a =
        f.ns.set_attr(
            ino,
            &AttrChange {
                size: Some(SizeChange::AtLeast(6)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.size, 6);
    assert_eq!(lmeta(&p).len(), 6);

    let t = |sec| TimeChange::At(Timespec { sec, nsec: 5 });
    let a =
        f.ns.set_attr(
            ino,
            &AttrChange {
                atime: Some(t(1000)),
                mtime: Some(t(2000)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.atime.sec, a.atime.nsec, a.mtime.sec), (1000, 5, 2000));
    let m = lmeta(&p);
    assert_eq!((m.atime(), m.mtime(), m.mtime_nsec()), (1000, 2000, 5));
    let a =
        f.ns.set_attr(
            ino,
            &AttrChange {
                mtime: Some(TimeChange::Now),
                ..Default::default()
            },
        )
        .unwrap();
    assert!(a.mtime.sec > 2000);
    assert_eq!(a.atime.sec, 1000);
    // Nothing asked, nothing changed.
    assert_eq!(
        f.ns.set_attr(ino, &AttrChange::default()).unwrap(),
        f.ns.get_attr(ino).unwrap()
    );

    let size = AttrChange {
        size: Some(SizeChange::Set(0)),
        ..Default::default()
    };
    assert_eq!(errno(f.ns.set_attr(ROOT_INODE, &size)), Errno::EISDIR);
    let d =
        f.ns.create(&node(ROOT_INODE, "d", FileKind::Directory, 0o700))
            .unwrap();
    let a =
        f.ns.set_attr(
            d.ino,
            &AttrChange {
                mode: Some(0o1777),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.mode, 0o1777);
    let fifo =
        f.ns.create(&node(ROOT_INODE, "p", FileKind::Fifo, 0o600))
            .unwrap();
    assert_eq!(errno(f.ns.set_attr(fifo.ino, &size)), Errno::EINVAL);
}

#[test]
fn xattrs_round_trip() {
    let f = fx();
    std::fs::write(f.pfs.join("f"), b"").unwrap();
    let ino = f.ns.lookup(ROOT_INODE, b"f").unwrap().entry.ino;
    let plain = XattrMode::default();
    let create = XattrMode {
        must_create: true,
        ..Default::default()
    };
    let replace = XattrMode {
        must_replace: true,
        ..Default::default()
    };
    assert_eq!(errno(f.ns.get_xattr(ino, b"user.a")), Errno::ENODATA);
    assert_eq!(
        errno(f.ns.set_xattr(ino, b"user.a", b"1", replace)),
        Errno::ENODATA
    );
    f.ns.set_xattr(ino, b"user.a", b"1", create).unwrap();
    assert_eq!(
        errno(f.ns.set_xattr(ino, b"user.a", b"2", create)),
        Errno::EEXIST
    );
    f.ns.set_xattr(ino, b"user.a", b"22", replace).unwrap();
    f.ns.set_xattr(ino, b"user.b", &[7u8; 3000], plain).unwrap();
    f.ns.set_xattr(ino, b"user.empty", b"", plain).unwrap();
    assert_eq!(f.ns.get_xattr(ino, b"user.a").unwrap(), b"22");
    assert_eq!(f.ns.get_xattr(ino, b"user.b").unwrap(), vec![7u8; 3000]);
    assert_eq!(f.ns.get_xattr(ino, b"user.empty").unwrap(), b"");
    let mut l = f.ns.list_xattrs(ino).unwrap();
    l.sort();
    assert_eq!(
        l,
        vec![
            b"user.a".to_vec(),
            b"user.b".to_vec(),
            b"user.empty".to_vec()
        ]
    );
    f.ns.remove_xattr(ino, b"user.a").unwrap();
    assert_eq!(errno(f.ns.get_xattr(ino, b"user.a")), Errno::ENODATA);
    assert_eq!(errno(f.ns.remove_xattr(ino, b"user.a")), Errno::ENODATA);
    assert_eq!(errno(f.ns.get_xattr(ino, b"")), Errno::EINVAL);
    // On the PFS itself.
    let mut buf = [0u8; 16];
    let p = CString::new(f.pfs.join("f").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: p is NUL-terminated; buf's length is passed.
    let n = unsafe {
        libc::lgetxattr(
            p.as_ptr(),
            c"user.empty".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert_eq!(n, 0);
    // Directories carry them too.
    f.ns.set_xattr(ROOT_INODE, b"user.d", b"x", plain).unwrap();
    assert_eq!(f.ns.get_xattr(ROOT_INODE, b"user.d").unwrap(), b"x");
}

#[test]
fn extended_size_shows_until_settled() {
    let f = fx();
    let p = f.pfs.join("f");
    std::fs::write(&p, b"abc").unwrap();
    let ino = f.ns.lookup(ROOT_INODE, b"f").unwrap().entry.ino;
    let before = f.ns.get_attr(ino).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let a = f.ns.extend_size(ino, 100, true).unwrap();
    assert_eq!(a.size, 100);
    assert!(a.mtime > before.mtime);
    assert_eq!(f.ns.get_attr(ino).unwrap().size, 100);
    assert_eq!(
        f.ns.lookup(ROOT_INODE, b"f").unwrap().attr.unwrap().size,
        100
    );
    let page = f.ns.read_dir(ROOT_INODE, b"", 10, true).unwrap();
    assert_eq!(page.attrs[0].as_ref().unwrap().size, 100);
    // A smaller extension changes nothing; the PFS growing past it shows.
    assert_eq!(f.ns.extend_size(ino, 50, false).unwrap().size, 100);
    std::fs::write(&p, vec![1u8; 150]).unwrap();
    assert_eq!(f.ns.get_attr(ino).unwrap().size, 150);
    std::fs::write(&p, b"abc").unwrap();
    assert_eq!(f.ns.get_attr(ino).unwrap().size, 100);
    // A truncation is the PFS's size, down from the extension.
    let a =
        f.ns.set_attr(
            ino,
            &AttrChange {
                size: Some(SizeChange::Set(40)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.size, 40);
    assert_eq!(f.ns.get_attr(ino).unwrap().size, 40);
    f.ns.extend_size(ino, 80, false).unwrap();
    f.ns.settled(ino);
    let a = f.ns.get_attr(ino).unwrap();
    assert_eq!(a.size, 40);
    assert_eq!(
        (a.mtime.sec, a.mtime.nsec as i64),
        (lmeta(&p).mtime(), lmeta(&p).mtime_nsec())
    );
    // Only regular files grow.
    assert_eq!(
        f.ns.extend_size(ROOT_INODE, 1 << 40, false).unwrap().size,
        f.ns.get_attr(ROOT_INODE).unwrap().size
    );
}

#[test]
fn resolve_and_open_resolved_read_and_write() {
    let f = fx();
    let mut n = node(ROOT_INODE, "mine", FileKind::Regular, 0o600);
    n.stripe_size = 65536;
    let a = f.ns.create(&n).unwrap();
    std::fs::write(f.pfs.join("mine"), b"hello world").unwrap();
    let r = f.ns.resolve(a.ino).unwrap();
    assert_eq!(
        (r.uid, r.gid, r.stripe_size, r.stripe_width),
        (NOBODY, NOBODY, 65536, SW)
    );

    let mut s = String::new();
    open_resolved(&f.ns.dir, &r, false)
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "hello world");
    let mut w = open_resolved(&f.ns.dir, &r, true).unwrap();
    w.seek(SeekFrom::Start(6)).unwrap();
    w.write_all(b"cache").unwrap();
    drop(w);
    assert_eq!(std::fs::read(f.pfs.join("mine")).unwrap(), b"hello cache");
    // Read-only for its owner: the fallback writes it as root.
    std::fs::set_permissions(f.pfs.join("mine"), PermissionsExt::from_mode(0o444)).unwrap();
    let mut w = open_resolved(&f.ns.dir, &r, true).unwrap();
    w.write_all(b"HELLO").unwrap();
    drop(w);
    assert_eq!(std::fs::read(f.pfs.join("mine")).unwrap(), b"HELLO cache");
    // Any descriptor on the PFS serves as the mount descriptor.
    let other = File::open(&f.pfs).unwrap();
    assert!(open_resolved(&other, &r, false).is_ok());

    // Only regular files.
    assert_eq!(errno(f.ns.resolve(ROOT_INODE)), Errno::EISDIR);
    let fifo =
        f.ns.create(&node(ROOT_INODE, "p", FileKind::Fifo, 0o666))
            .unwrap();
    assert_eq!(errno(f.ns.resolve(fifo.ino)), Errno::EINVAL);
    let root_row = f.ns.row_of(ROOT_INODE).unwrap();
    let mut fake = r.clone();
    fake.handle_type = root_row.handle.kind;
    fake.handle = root_row.handle.bytes.clone();
    assert_eq!(errno(open_resolved(&f.ns.dir, &fake, true)), Errno::EISDIR);
    let fifo_row = f.ns.row_of(fifo.ino).unwrap();
    fake.handle = fifo_row.handle.bytes;
    assert_eq!(errno(open_resolved(&f.ns.dir, &fake, false)), Errno::EINVAL);
    // Removed: stale.
    std::fs::remove_file(f.pfs.join("mine")).unwrap();
    assert_eq!(errno(open_resolved(&f.ns.dir, &r, false)), Errno::ESTALE);
}

#[test]
fn write_behind_opens_wear_the_owners_identity() {
    let f = fx();
    // A directory only root may enter: reopening through the procfs link needs no
    // search permission on it, only the owner's own write bit.
    std::fs::create_dir(f.pfs.join("d")).unwrap();
    std::fs::set_permissions(f.pfs.join("d"), PermissionsExt::from_mode(0o700)).unwrap();
    let d = f.ns.lookup(ROOT_INODE, b"d").unwrap().entry.ino;
    let w =
        f.ns.create(&node(d, "w", FileKind::Regular, 0o200))
            .unwrap();
    let ro =
        f.ns.create(&node(d, "ro", FileKind::Regular, 0o444))
            .unwrap();
    let mine =
        f.ns.create(&NewNode::new(
            d,
            &b"root"[..],
            FileKind::Regular,
            0o600,
            0,
            0,
        ))
        .unwrap();
    let opath = |ino| f.ns.inode(ino).unwrap().fd;

    let fd = reopen_as(&opath(w.ino), NOBODY, NOBODY, libc::O_WRONLY)
        .unwrap()
        .unwrap();
    File::from(fd).write_all(b"by nobody").unwrap();
    assert_eq!(std::fs::read(f.pfs.join("d/w")).unwrap(), b"by nobody");
    let r = reopen_as(&opath(ro.ino), NOBODY, NOBODY, libc::O_WRONLY).unwrap();
    assert_eq!(r.err(), Some(Errno::EACCES));
    let r = reopen_as(&opath(mine.ino), NOBODY, NOBODY, libc::O_WRONLY).unwrap();
    assert_eq!(r.err(), Some(Errno::EACCES));
    // open_resolved: the owner's file as the owner; root's as root.
    let mut out = open_resolved(&f.ns.dir, &f.ns.resolve(w.ino).unwrap(), true).unwrap();
    out.write_all(b"BY").unwrap();
    assert_eq!(std::fs::read(f.pfs.join("d/w")).unwrap(), b"BY nobody");
    assert!(open_resolved(&f.ns.dir, &f.ns.resolve(mine.ino).unwrap(), true).is_ok());
}

#[test]
fn a_symlink_out_of_the_tree_is_never_followed() {
    let f = fx();
    let outside = f.tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::set_permissions(&outside, PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::write(outside.join("secret"), b"secret").unwrap();
    std::fs::set_permissions(outside.join("secret"), PermissionsExt::from_mode(0o600)).unwrap();
    let before_dir = lmeta(&outside);
    let before_secret = lmeta(&outside.join("secret"));
    std::os::unix::fs::symlink(&outside, f.pfs.join("esc")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), f.pfs.join("fesc")).unwrap();

    let esc = f.ns.lookup(ROOT_INODE, b"esc").unwrap();
    assert_eq!(esc.entry.kind, FileKind::Symlink);
    let link = lmeta(&f.pfs.join("esc"));
    assert_eq!(esc.attr.unwrap().size, link.len());
    let esc = esc.entry;
    let fesc = f.ns.lookup(ROOT_INODE, b"fesc").unwrap().entry;
    assert_eq!(fesc.kind, FileKind::Symlink);
    assert_eq!(f.ns.get_attr(fesc.ino).unwrap().kind, FileKind::Symlink);

    // As a directory: nothing beneath it is reachable.
    assert_eq!(errno(f.ns.lookup(esc.ino, b"secret")), Errno::ENOTDIR);
    assert_eq!(errno(f.ns.read_dir(esc.ino, b"", 10, true)), Errno::ENOTDIR);
    for kind in [
        FileKind::Regular,
        FileKind::Directory,
        FileKind::Symlink,
        FileKind::Fifo,
    ] {
        let mut n = node(esc.ino, "new", kind, 0o777);
        n.target = b"t".to_vec();
        assert_eq!(errno(f.ns.create(&n)), Errno::ENOTDIR, "{kind:?}");
    }
    assert_eq!(
        errno(f.ns.remove_entry(esc.ino, b"secret", Expect::Any, &By::ROOT)),
        Errno::ENOTDIR
    );
    let r = f.ns.rename(
        esc.ino,
        b"secret",
        ROOT_INODE,
        b"stolen",
        RenameMode::Replace,
        &By::ROOT,
    );
    assert_eq!(errno(r), Errno::ENOTDIR);
    let e = Entry {
        ino: fesc.ino,
        kind: FileKind::Symlink,
    };
    assert_eq!(
        errno(f.ns.insert_entry(esc.ino, b"x", &e, false)),
        Errno::ENOTDIR
    );

    // Its attributes: the link's own, or refused.
    let mode = AttrChange {
        mode: Some(0o777),
        ..Default::default()
    };
    assert_eq!(errno(f.ns.set_attr(esc.ino, &mode)), Errno::EOPNOTSUPP);
    assert_eq!(errno(f.ns.set_attr(fesc.ino, &mode)), Errno::EOPNOTSUPP);
    let size = AttrChange {
        size: Some(SizeChange::Set(0)),
        ..Default::default()
    };
    assert_eq!(errno(f.ns.set_attr(fesc.ino, &size)), Errno::EINVAL);
    let t = TimeChange::At(Timespec { sec: 1234, nsec: 0 });
    let times = AttrChange {
        atime: Some(t),
        mtime: Some(t),
        ..Default::default()
    };
    assert_eq!(f.ns.set_attr(esc.ino, &times).unwrap().mtime.sec, 1234);
    assert_eq!(f.ns.set_attr(fesc.ino, &times).unwrap().mtime.sec, 1234);
    assert_eq!(lmeta(&f.pfs.join("esc")).mtime(), 1234);
    let owner = AttrChange {
        uid: Some(NOBODY),
        gid: Some(NOBODY),
        ..Default::default()
    };
    assert_eq!(f.ns.set_attr(esc.ino, &owner).unwrap().uid, NOBODY);
    assert_eq!(f.ns.set_attr(fesc.ino, &owner).unwrap().uid, NOBODY);
    assert_eq!(lmeta(&f.pfs.join("fesc")).uid(), NOBODY);
    // user.* xattrs are not allowed on symlinks: refused, not set on the target.
    assert_eq!(
        errno(f.ns.set_xattr(fesc.ino, b"user.x", b"1", XattrMode::default())),
        Errno::EPERM
    );
    assert_eq!(errno(f.ns.get_xattr(fesc.ino, b"user.x")), Errno::ENODATA);
    assert_eq!(
        f.ns.read_link(fesc.ino).unwrap(),
        outside.join("secret").as_os_str().as_encoded_bytes()
    );
    assert_eq!(errno(f.ns.resolve(fesc.ino)), Errno::EINVAL);
    let flink = lmeta(&f.pfs.join("fesc"));
    assert_eq!(
        f.ns.extend_size(fesc.ino, 1 << 30, true).unwrap().size,
        flink.len()
    );

    // A hard link of the link is a link.
    assert_eq!(
        f.ns.insert_entry(ROOT_INODE, b"fesc2", &e, false).unwrap(),
        None
    );
    assert!(lmeta(&f.pfs.join("fesc2")).file_type().is_symlink());
    // Renamed and removed: only the link moves and goes.
    f.ns.rename(
        ROOT_INODE,
        b"esc",
        ROOT_INODE,
        b"esc2",
        RenameMode::Replace,
        &By::ROOT,
    )
    .unwrap();
    assert!(lmeta(&f.pfs.join("esc2")).file_type().is_symlink());
    assert_eq!(
        f.ns.remove_entry(ROOT_INODE, b"esc2", Expect::Dir, &By::ROOT)
            .err()
            .map(|e| e.errno()),
        Some(Errno::ENOTDIR)
    );
    assert_eq!(
        f.ns.remove_entry(ROOT_INODE, b"esc2", Expect::NotDir, &By::ROOT)
            .unwrap(),
        esc
    );
    f.ns.remove_entry(ROOT_INODE, b"fesc", Expect::Any, &By::ROOT)
        .unwrap();
    f.ns.remove_entry(ROOT_INODE, b"fesc2", Expect::Any, &By::ROOT)
        .unwrap();

    // The outside is as it was.
    let after_dir = lmeta(&outside);
    let after_secret = lmeta(&outside.join("secret"));
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"secret");
    for (b, a) in [(&before_dir, &after_dir), (&before_secret, &after_secret)] {
        assert_eq!(
            (a.mode(), a.uid(), a.gid(), a.len()),
            (b.mode(), b.uid(), b.gid(), b.len())
        );
        assert_eq!(
            (a.mtime(), a.mtime_nsec(), a.atime()),
            (b.mtime(), b.mtime_nsec(), b.atime())
        );
    }
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
    assert!(xattr_names(&outside.join("secret")).is_empty());
}

fn xattr_names(p: &Path) -> Vec<u8> {
    let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let mut buf = [0u8; 256];
    // SAFETY: c is NUL-terminated; buf's length is passed.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0);
    buf[..n as usize].to_vec()
}

#[test]
fn a_file_removed_behind_our_back_is_stale() {
    let f = fx();
    std::fs::create_dir(f.pfs.join("d")).unwrap();
    std::fs::write(f.pfs.join("d/f"), b"x").unwrap();
    let d = f.ns.lookup(ROOT_INODE, b"d").unwrap().entry.ino;
    let file = f.ns.lookup(d, b"f").unwrap().entry.ino;
    std::fs::remove_file(f.pfs.join("d/f")).unwrap();
    assert!(matches!(
        errno(f.ns.get_attr(file)),
        Errno::ESTALE | Errno::ENOENT
    ));
    assert_eq!(errno(f.ns.lookup(d, b"f")), Errno::ENOENT);
    assert!(matches!(
        errno(f.ns.get_xattr(file, b"user.a")),
        Errno::ESTALE | Errno::ENOENT
    ));
    std::fs::remove_dir(f.pfs.join("d")).unwrap();
    assert!(matches!(
        errno(f.ns.read_dir(d, b"", 10, false)),
        Errno::ESTALE | Errno::ENOENT
    ));
    assert!(matches!(
        errno(f.ns.create(&node(d, "g", FileKind::Regular, 0o644))),
        Errno::ESTALE | Errno::ENOENT
    ));
    // A new file of the same name is a new inode.
    std::fs::create_dir(f.pfs.join("d")).unwrap();
    assert_ne!(f.ns.lookup(ROOT_INODE, b"d").unwrap().entry.ino, d);
}

#[test]
fn a_symlinked_database_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let pfs = tmp.path().join("pfs");
    std::fs::create_dir(&pfs).unwrap();
    let elsewhere = tmp.path().join("elsewhere.db");
    let db = tmp.path().join("ns.db");
    std::os::unix::fs::symlink(&elsewhere, &db).unwrap();
    let e = open_ns(&pfs, &db).err().unwrap();
    assert_eq!(e.errno(), Errno(libc::ELOOP), "{e}");
    assert!(!elsewhere.exists());
    std::fs::write(&elsewhere, b"").unwrap();
    assert!(open_ns(&pfs, &db).is_err());
    assert_eq!(std::fs::read(&elsewhere).unwrap(), b"");
    // A directory is no table either.
    let dir_db = tmp.path().join("dir.db");
    std::fs::create_dir(&dir_db).unwrap();
    assert!(open_ns(&pfs, &dir_db).is_err());
}

#[test]
fn bad_names_are_refused_with_check_names_errno() {
    let f = fx();
    std::fs::create_dir(f.pfs.join("d")).unwrap();
    let long = vec![b'x'; 256];
    let bad: [(&[u8], Errno); 6] = [
        (b"", Errno::EINVAL),
        (b"a/b", Errno::EINVAL),
        (b"../d", Errno::EINVAL),
        (b"a\0b", Errno::EINVAL),
        (b".", Errno::EINVAL),
        (b"..", Errno::EINVAL),
    ];
    for (name, e) in bad
        .iter()
        .copied()
        .chain([(long.as_slice(), Errno::ENAMETOOLONG)])
    {
        assert_eq!(errno(f.ns.lookup(ROOT_INODE, name)), e, "{name:?}");
        if let Err(ce) = crate::names::check_name(name) {
            assert_eq!(ce.errno(), e);
        }
        let n = NewNode::new(ROOT_INODE, name, FileKind::Regular, 0o644, 0, 0);
        assert_eq!(errno(f.ns.create(&n)), e, "{name:?}");
        assert_eq!(
            errno(f.ns.remove_entry(ROOT_INODE, name, Expect::Any, &By::ROOT)),
            e,
            "{name:?}"
        );
        let r = f.ns.rename(
            ROOT_INODE,
            b"d",
            ROOT_INODE,
            name,
            RenameMode::Replace,
            &By::ROOT,
        );
        assert_eq!(errno(r), e, "{name:?}");
        let r = f.ns.rename(
            ROOT_INODE,
            name,
            ROOT_INODE,
            b"z",
            RenameMode::Replace,
            &By::ROOT,
        );
        assert_eq!(errno(r), e, "{name:?}");
    }
    assert!(f.pfs.join("d").is_dir());
    let mut n = node(ROOT_INODE, "s", FileKind::Symlink, 0o777);
    n.target = vec![b'x'; 5000];
    assert_eq!(errno(f.ns.create(&n)), Errno::ENAMETOOLONG);
    assert_eq!(
        errno(f.ns.get_xattr(ROOT_INODE, &[b'u'; 300])),
        Errno::ERANGE
    );
}

#[test]
fn layouts_are_kept_in_the_table() {
    let f = fx();
    std::fs::write(f.pfs.join("f"), b"").unwrap();
    let ino = f.ns.lookup(ROOT_INODE, b"f").unwrap().entry.ino;
    let a = f.ns.set_layout(ino, 4 << 20, 2).unwrap();
    assert_eq!((a.stripe_size, a.stripe_width), (4 << 20, 2));
    let a = f.ns.set_layout(ino, 0, 3).unwrap();
    assert_eq!((a.stripe_size, a.stripe_width), (SS, 3));
    f.ns.close().unwrap();
    let ns = open_ns(&f.pfs, &f.db).unwrap();
    let a = ns.lookup(ROOT_INODE, b"f").unwrap().attr.unwrap();
    assert_eq!((a.stripe_size, a.stripe_width), (SS, 3));
    assert_eq!(ns.resolve(ino).unwrap().stripe_width, 3);
}

#[test]
fn an_o_path_directory_descriptor_is_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    let c = CString::new(tmp.path().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: c is NUL-terminated.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor, owned from here.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let ns = PfsNamespace::open(fd, &tmp.path().join("t.db"), ServerIndex(0), SS, SW).unwrap();
    std::fs::write(tmp.path().join("f"), b"abc").unwrap();
    assert_eq!(ns.lookup(ROOT_INODE, b"f").unwrap().attr.unwrap().size, 3);
}

#[test]
fn concurrent_creates_and_lookups_get_distinct_stable_numbers() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<PfsNamespace>();
    let f = fx();
    let ns = &f.ns;
    let per_thread: Vec<Vec<(String, InodeNo)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                s.spawn(move || {
                    (0..50)
                        .map(|i| {
                            let name = format!("t{t}-{i}");
                            let a = ns
                                .create(&node(ROOT_INODE, &name, FileKind::Regular, 0o644))
                                .unwrap();
                            // Another thread's listing may number it first: the same number.
                            assert_eq!(
                                ns.lookup(ROOT_INODE, name.as_bytes()).unwrap().entry.ino,
                                a.ino
                            );
                            ns.read_dir(ROOT_INODE, b"", 7, t % 2 == 0).unwrap();
                            (name, a.ino)
                        })
                        .collect()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let all: Vec<_> = per_thread.into_iter().flatten().collect();
    let mut inos: Vec<_> = all.iter().map(|(_, i)| *i).collect();
    inos.sort();
    inos.dedup();
    assert_eq!(inos.len(), 200);
    assert_eq!(ns.inode_count().unwrap(), 201);
    let page = ns.read_dir(ROOT_INODE, b"", 1000, false).unwrap();
    for (name, ino) in &all {
        let e = page
            .entries
            .iter()
            .find(|e| e.name == name.as_bytes())
            .unwrap();
        assert_eq!(e.entry.ino, *ino);
    }
}

#[test]
fn versions_follow_our_own_calls_and_not_the_pfs_users() {
    use crate::cache::coherence::PfsVersion;
    let f = fx();
    let version = |name: &str| {
        let m = lmeta(&f.pfs.join(name));
        PfsVersion {
            size: m.size(),
            mtime: Timespec {
                sec: m.mtime(),
                nsec: m.mtime_nsec() as u32,
            },
            ctime: Timespec {
                sec: m.ctime(),
                nsec: m.ctime_nsec() as u32,
            },
            ino: m.ino(),
        }
    };
    // A new file: its version is agreed at its create.
    let a =
        f.ns.create(&node(ROOT_INODE, "new", FileKind::Regular, 0o644))
            .unwrap();
    let ino = a.ino;
    let s = f.ns.seen(ino).unwrap().unwrap();
    assert!(s.unchanged());
    assert_eq!(s.now, version("new"));
    assert_eq!((s.stripe_size, s.stripe_width), (SS, SW));

    // Each of our own calls changes its ctime at least, and the version agreed with it.
    let unchanged = |what: &str| {
        let s = f.ns.seen(ino).unwrap().unwrap();
        assert!(s.unchanged(), "after {what}: {s:?}");
    };
    let mode = AttrChange {
        mode: Some(0o600),
        ..Default::default()
    };
    f.ns.set_attr(ino, &mode).unwrap();
    unchanged("chmod");
    let cut = AttrChange {
        size: Some(SizeChange::Set(3)),
        ..Default::default()
    };
    f.ns.set_attr(ino, &cut).unwrap();
    unchanged("truncate");
    f.ns.set_xattr(ino, b"user.k", b"v", XattrMode::default())
        .unwrap();
    unchanged("setxattr");
    f.ns.remove_xattr(ino, b"user.k").unwrap();
    unchanged("removexattr");
    let e = Entry {
        ino,
        kind: FileKind::Regular,
    };
    f.ns.insert_entry(ROOT_INODE, b"link", &e, false).unwrap();
    unchanged("link");
    f.ns.rename(
        ROOT_INODE,
        b"new",
        ROOT_INODE,
        b"moved",
        RenameMode::NoReplace,
        &By::ROOT,
    )
    .unwrap();
    unchanged("rename");
    f.ns.remove_entry(ROOT_INODE, b"link", Expect::NotDir, &By::ROOT)
        .unwrap();
    unchanged("unlink of another link");
    assert_eq!(f.ns.seen(ino).unwrap().unwrap().now, version("moved"));

    // A change made on the PFS directly is not agreed: the same size, other bytes.
    std::fs::write(f.pfs.join("moved"), b"xyz").unwrap();
    let s = f.ns.seen(ino).unwrap().unwrap();
    assert!(!s.unchanged());
    assert_eq!(s.now, version("moved"));
    assert_ne!(s.known, Some(s.now));
    assert_eq!(s.now.size, 3);
    f.ns.agree(ino, s.now);
    unchanged("agree");
    // A drop owed keeps it checked, until paid.
    assert!(f.ns.owe_drop(ino));
    assert!(!f.ns.owe_drop(ino));
    assert!(!f.ns.seen(ino).unwrap().unwrap().unchanged());
    f.ns.drop_paid(ino);
    unchanged("drop paid");

    // A file found on the PFS has no version agreed until an open agrees one; our own
    // calls on it do not make one.
    std::fs::write(f.pfs.join("found"), b"x").unwrap();
    let found = f.ns.lookup(ROOT_INODE, b"found").unwrap().entry.ino;
    f.ns.set_attr(found, &mode).unwrap();
    let s = f.ns.seen(found).unwrap().unwrap();
    assert_eq!((s.known, s.owed), (None, false));
    assert!(!s.unchanged());
    // Only regular files are checked.
    std::fs::create_dir(f.pfs.join("d")).unwrap();
    let d = f.ns.lookup(ROOT_INODE, b"d").unwrap().entry.ino;
    assert_eq!(f.ns.seen(d).unwrap(), None);
    assert_eq!(f.ns.seen(ROOT_INODE).unwrap(), None);
}

#[test]
fn the_size_overlay_goes_once_the_pfs_caught_up() {
    let f = fx();
    let p = f.pfs.join("f");
    std::fs::write(&p, b"abc").unwrap();
    let ino = f.ns.lookup(ROOT_INODE, b"f").unwrap().entry.ino;
    f.ns.extend_size(ino, 100, true).unwrap();
    // A write-behind still on its way: the overlay stays.
    f.ns.settled_at(ino, 3);
    assert_eq!(f.ns.get_attr(ino).unwrap().size, 100);
    std::fs::write(&p, vec![1u8; 100]).unwrap();
    f.ns.settled_at(ino, 100);
    // Gone: a later truncation on the PFS shows.
    std::fs::write(&p, b"ab").unwrap();
    assert_eq!(f.ns.get_attr(ino).unwrap().size, 2);
}

#[test]
fn the_last_name_of_an_open_file_is_hidden_until_reaped() {
    let f = fx();
    std::fs::write(f.pfs.join("f"), b"data").unwrap();
    std::fs::write(f.pfs.join("g"), b"other").unwrap();
    let ino = f.ns.lookup(ROOT_INODE, b"f").unwrap().entry.ino;
    let open = |i: InodeNo| i == ino;
    let by = By {
        caller: None,
        open: Some(&open),
    };
    f.ns.remove_entry(ROOT_INODE, b"f", Expect::NotDir, &by)
        .unwrap();
    // Gone from the mount's view, kept on the PFS under a hidden name, no link shown.
    assert_eq!(errno(f.ns.lookup(ROOT_INODE, b"f")), Errno::ENOENT);
    let hidden = format!(".spillway-unlinked-{:016x}", ino.0);
    assert_eq!(std::fs::read(f.pfs.join(&hidden)).unwrap(), b"data");
    assert_eq!(
        errno(f.ns.lookup(ROOT_INODE, hidden.as_bytes())),
        Errno::ENOENT
    );
    let page = f.ns.read_dir(ROOT_INODE, b"", 100, false).unwrap();
    assert_eq!(names(&page), vec![b"g".to_vec()]);
    assert_eq!(f.ns.link_count(ino, -1).unwrap().nlink, 0);
    assert_eq!(f.ns.get_attr(ino).unwrap().nlink, 0);
    // No client names a hidden name.
    let n = node(ROOT_INODE, &hidden, FileKind::Regular, 0o644);
    assert_eq!(errno(f.ns.create(&n)), Errno::EPERM);
    // A restart remembers it; the last close removes it.
    drop(f.ns);
    let ns = open_ns(&f.pfs, &f.db).unwrap();
    assert!(ns.is_hidden(ino));
    assert_eq!(ns.hidden_due(&|_| true), Vec::<InodeNo>::new());
    ns.reap(ino).unwrap();
    assert!(!f.pfs.join(&hidden).exists());
    assert!(!ns.is_hidden(ino));
    // A rename over an open file hides the file replaced.
    let g = ns.lookup(ROOT_INODE, b"g").unwrap().entry.ino;
    std::fs::write(f.pfs.join("h"), b"new").unwrap();
    let open_g = |i: InodeNo| i == g;
    let by = By {
        caller: None,
        open: Some(&open_g),
    };
    ns.rename(ROOT_INODE, b"h", ROOT_INODE, b"g", RenameMode::Replace, &by)
        .unwrap();
    assert_eq!(std::fs::read(f.pfs.join("g")).unwrap(), b"new");
    let hidden_g = f.pfs.join(format!(".spillway-unlinked-{:016x}", g.0));
    assert_eq!(std::fs::read(&hidden_g).unwrap(), b"other");
    ns.reap(g).unwrap();
    assert!(!hidden_g.exists());
    // A file that is not open goes at once.
    ns.remove_entry(ROOT_INODE, b"g", Expect::NotDir, &by)
        .unwrap();
    assert_eq!(std::fs::read_dir(&f.pfs).unwrap().count(), 0);
}

#[test]
fn a_planted_hidden_name_neither_blocks_an_unlink_nor_is_touched() {
    let f = fx();
    std::fs::write(f.pfs.join("f"), b"data").unwrap();
    let ino = f.ns.lookup(ROOT_INODE, b"f").unwrap().entry.ino;
    // Someone who can write the directory plants the name the file would be hidden as.
    let planted = f.pfs.join(format!(".spillway-unlinked-{:016x}", ino.0));
    std::fs::write(&planted, b"planted").unwrap();
    let open = |i: InodeNo| i == ino;
    let by = By {
        caller: None,
        open: Some(&open),
    };
    f.ns.remove_entry(ROOT_INODE, b"f", Expect::NotDir, &by)
        .unwrap();
    assert!(!f.pfs.join("f").exists());
    assert!(!f.ns.is_hidden(ino));
    assert_eq!(std::fs::read(&planted).unwrap(), b"planted");
    f.ns.reap(ino).unwrap();
    assert_eq!(std::fs::read(&planted).unwrap(), b"planted");
}

/// The differential run on a cache (issue 30, item 14): `fstat` of a directory a
/// process holds open after `rmdir` (or a rename over it) answered ESTALE; a local file
/// system answers its attributes with no link.
#[test]
fn a_directory_removed_through_us_keeps_answering_its_attributes() {
    let f = fx();
    for (name, replace) in [("d", false), ("e", true)] {
        let d =
            f.ns.create(&node(ROOT_INODE, name, FileKind::Directory, 0o750))
                .unwrap();
        if replace {
            f.ns.create(&node(ROOT_INODE, "src", FileKind::Directory, 0o755))
                .unwrap();
            f.ns.rename(
                ROOT_INODE,
                b"src",
                ROOT_INODE,
                name.as_bytes(),
                RenameMode::Replace,
                &By::ROOT,
            )
            .unwrap();
        } else {
            f.ns.remove_entry(ROOT_INODE, name.as_bytes(), Expect::Dir, &By::ROOT)
                .unwrap();
        }
        let a = f.ns.get_attr(d.ino).unwrap();
        assert_eq!(
            (a.ino, a.kind, a.nlink, a.mode & 0o7777),
            (d.ino, FileKind::Directory, 0, 0o750),
            "{name}"
        );
    }
    // Removed on the PFS behind our back, it stays stale.
    std::fs::create_dir(f.pfs.join("x")).unwrap();
    let x = f.ns.lookup(ROOT_INODE, b"x").unwrap().entry.ino;
    std::fs::remove_dir(f.pfs.join("x")).unwrap();
    assert!(matches!(
        errno(f.ns.get_attr(x)),
        Errno::ESTALE | Errno::ENOENT
    ));
}
