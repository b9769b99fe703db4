//! Directory entries over two servers: creates spread by placement, paginated readdir,
//! renames, seals, links, symlinks, xattrs.

mod common;

use common::*;
use spillway_placement::dentry_server;
use spillway_types::{Errno, FileKind, InodeNo};
use spillway_wire::{
    rename_flags, setattr, want, CreateReq, EntryRef, GetXattrReq, InsertEntryReq, ListXattrReq,
    ReadDirReq, ReadLinkReq, RemoveEntryReq, RemoveXattrReq, RenameReq, SealDirReq, SetAttrReq,
    SetXattrReq, StatFsReq, TouchDirReq, UnsealDirReq,
};

/// Two names in `dir` whose entries live on the same server (renames are per server).
fn names_on_same_server(n: u16, dir: InodeNo, prefix: &str, count: usize) -> Vec<String> {
    let mut by_server: Vec<Vec<String>> = vec![Vec::new(); usize::from(n)];
    for i in 0.. {
        let name = format!("{prefix}{i}");
        let s = dentry_server(dir, name.as_bytes(), n).0 as usize;
        by_server[s].push(name);
        if by_server[s].len() == count {
            return by_server.swap_remove(s);
        }
    }
    unreachable!()
}

#[test]
fn creates_spread_and_readdir_paginates() {
    let c = Cluster::start(2, 1 << 30, 1 << 20);
    let d = c.create(root(), "big", FileKind::Directory).unwrap();
    assert_eq!(d.nlink, 2);
    let mut want: Vec<Vec<u8>> = Vec::new();
    for i in 0..3000 {
        let name = format!("entry-{i:05}");
        c.create(d.ino, &name, FileKind::Regular).unwrap();
        want.push(name.into_bytes());
    }
    want.sort();
    let stats: Vec<u64> = (0..2)
        .map(|i| c.at(i).call(&StatFsReq {}).unwrap().inodes)
        .collect();
    assert!(
        stats.iter().all(|&n| n > 1000),
        "inodes spread over both servers: {stats:?}"
    );
    assert_eq!(c.read_dir_all(d.ino, 128), want);
    assert_eq!(c.read_dir_all(d.ino, 1), want);
    assert_eq!(
        c.read_dir_all(d.ino, 100_000),
        want,
        "huge pages are capped, not refused"
    );

    // A lookup on the entry's server returns the attributes when it is also the home.
    let l = c.lookup(d.ino, "entry-00007").unwrap();
    assert_eq!(l.attr.as_ref().map(|a| a.ino), Some(l.entry.ino));
    assert_eq!(c.lookup(d.ino, "nope").unwrap_err(), Errno::ENOENT);
    assert_eq!(
        c.create(d.ino, "entry-00007", FileKind::Regular)
            .unwrap_err(),
        Errno::EEXIST
    );
    let empty_page = c
        .at(0)
        .call(&ReadDirReq {
            dir: InodeNo(987654),
            after: vec![],
            max: 10,
            plus: false,
        })
        .unwrap();
    assert!(empty_page.entries.is_empty() && !empty_page.more);
}

#[test]
fn name_checks() {
    let c = Cluster::start(2, 1 << 30, 1 << 20);
    assert_eq!(
        c.create(root(), "", FileKind::Regular).unwrap_err(),
        Errno::EINVAL
    );
    assert_eq!(
        c.create(root(), "a/b", FileKind::Regular).unwrap_err(),
        Errno::EINVAL
    );
    assert_eq!(
        c.create(root(), "a\0b", FileKind::Regular).unwrap_err(),
        Errno::EINVAL
    );
    assert_eq!(
        c.create(root(), &"n".repeat(256), FileKind::Regular)
            .unwrap_err(),
        Errno::ENAMETOOLONG
    );
    c.create(root(), &"n".repeat(255), FileKind::Regular)
        .unwrap();
    assert_eq!(c.lookup(root(), "").unwrap_err(), Errno::EINVAL);
}

#[test]
fn renames_and_their_errnos() {
    let c = Cluster::start(2, 1 << 30, 1 << 20);
    let names = names_on_same_server(c.n(), root(), "r", 6);
    let [a, b, d, e, f, g] = [0, 1, 2, 3, 4, 5].map(|i| names[i].as_str());
    let fa = c.create(root(), a, FileKind::Regular).unwrap();
    let fb = c.create(root(), b, FileKind::Regular).unwrap();
    let dd = c.create(root(), d, FileKind::Directory).unwrap();
    let de = c.create(root(), e, FileKind::Directory).unwrap();
    let rename = |from: &str, to: &str, flags: u32| {
        c.call_entry(
            root(),
            from.as_bytes(),
            &RenameReq {
                old_parent: root(),
                old_name: from.as_bytes().to_vec(),
                new_parent: root(),
                new_name: to.as_bytes().to_vec(),
                flags,
            },
        )
    };
    assert_eq!(rename(f, g, 0).unwrap_err(), Errno::ENOENT);
    assert_eq!(
        rename(a, b, rename_flags::NOREPLACE).unwrap_err(),
        Errno::EEXIST
    );
    assert_eq!(
        rename(a, g, rename_flags::EXCHANGE).unwrap_err(),
        Errno::ENOENT
    );
    assert_eq!(rename(d, a, 0).unwrap_err(), Errno::ENOTDIR);
    assert_eq!(rename(a, d, 0).unwrap_err(), Errno::EISDIR);
    assert_eq!(
        rename(a, b, rename_flags::NOREPLACE | rename_flags::EXCHANGE).unwrap_err(),
        Errno::EINVAL
    );

    let x = rename(a, b, rename_flags::EXCHANGE).unwrap();
    assert_eq!(
        (x.moved.ino, x.replaced.map(|r| r.ino)),
        (fa.ino, Some(fb.ino))
    );
    assert_eq!(c.lookup(root(), a).unwrap().entry.ino, fb.ino);
    assert_eq!(c.lookup(root(), b).unwrap().entry.ino, fa.ino);

    let x = rename(b, a, 0).unwrap();
    assert_eq!(
        x.replaced.map(|r| r.ino),
        Some(fb.ino),
        "the replaced entry is reported for unlinking"
    );
    assert_eq!(c.lookup(root(), b).unwrap_err(), Errno::ENOENT);

    let x = rename(a, f, rename_flags::NOREPLACE).unwrap();
    assert_eq!((x.moved.ino, x.replaced), (fa.ino, None));
    assert_eq!(
        rename(d, e, 0).unwrap().replaced.map(|r| r.ino),
        Some(de.ino)
    );
    assert_eq!(
        c.lookup(root(), e).unwrap().entry,
        EntryRef {
            ino: dd.ino,
            kind: FileKind::Directory
        }
    );

    // Same inode under both names: a no-op.
    c.call_entry(
        root(),
        g.as_bytes(),
        &InsertEntryReq {
            parent: root(),
            name: g.as_bytes().to_vec(),
            entry: EntryRef {
                ino: fa.ino,
                kind: FileKind::Regular,
            },
            replace: false,
        },
    )
    .unwrap();
    assert_eq!(rename(f, g, 0).unwrap().replaced, None);
    assert!(c.lookup(root(), f).is_ok() && c.lookup(root(), g).is_ok());
}

#[test]
fn seal_and_unseal() {
    let c = Cluster::start(2, 1 << 30, 1 << 20);
    let d = c.create(root(), "dir", FileKind::Directory).unwrap();
    let inner = c.create(d.ino, "inner", FileKind::Regular).unwrap();
    let holder = dentry_server(d.ino, b"inner", c.n()).0;
    let other = 1 - holder;
    assert_eq!(
        c.at(holder).call(&SealDirReq { ino: d.ino }).unwrap_err(),
        Errno::ENOTEMPTY
    );
    c.at(other).call(&SealDirReq { ino: d.ino }).unwrap();
    // Creating on the sealed server fails; the entry's own server is not sealed.
    let name_on = |s: u16| {
        (0..)
            .map(|i| format!("x{i}"))
            .find(|n| dentry_server(d.ino, n.as_bytes(), 2).0 == s)
            .unwrap()
    };
    assert_eq!(
        c.create(d.ino, &name_on(other), FileKind::Regular)
            .unwrap_err(),
        Errno::ENOENT
    );
    c.create(d.ino, &name_on(holder), FileKind::Regular)
        .unwrap();
    c.at(other).call(&UnsealDirReq { ino: d.ino }).unwrap();
    c.create(d.ino, &name_on(other), FileKind::Regular).unwrap();

    // Removing an entry: type checks, then the directory can be sealed there.
    let rm = |name: &str, w: u8| {
        c.call_entry(
            d.ino,
            name.as_bytes(),
            &RemoveEntryReq {
                parent: d.ino,
                name: name.as_bytes().to_vec(),
                want: w,
            },
        )
    };
    assert_eq!(rm("inner", want::DIR).unwrap_err(), Errno::ENOTDIR);
    assert_eq!(rm("inner", want::NOT_DIR).unwrap().removed.ino, inner.ino);
    assert_eq!(rm("inner", want::ANY).unwrap_err(), Errno::ENOENT);
    assert_eq!(
        c.call_entry(
            root(),
            b"dir",
            &RemoveEntryReq {
                parent: root(),
                name: b"dir".to_vec(),
                want: want::NOT_DIR
            }
        )
        .unwrap_err(),
        Errno::EISDIR
    );
    c.home(root())
        .call(&TouchDirReq {
            ino: root(),
            nlink_delta: 1,
        })
        .unwrap();
    assert_eq!(c.getattr(root()).unwrap().nlink, 3);
}

#[test]
fn attributes_links_symlinks_xattrs() {
    let c = Cluster::start(2, 1 << 30, 1 << 20);
    let root_attr = c.getattr(root()).unwrap();
    assert_eq!(
        (
            root_attr.mode,
            root_attr.uid,
            root_attr.gid,
            root_attr.nlink
        ),
        (0o755, 1000, 100, 2)
    );

    let target = b"/somewhere/else".to_vec();
    let req = CreateReq {
        target: target.clone(),
        ..CreateReq::new(root(), b"link", FileKind::Symlink, 0o777, 1, 1)
    };
    let s = c.call_entry(root(), b"link", &req).unwrap().attr;
    assert_eq!(s.size, target.len() as u64);
    assert_eq!(
        c.home(s.ino)
            .call(&ReadLinkReq { ino: s.ino })
            .unwrap()
            .value,
        target
    );
    let long = CreateReq {
        name: b"long".to_vec(),
        target: vec![b'x'; 4097],
        ..req
    };
    assert_eq!(
        c.call_entry(root(), b"long", &long).unwrap_err(),
        Errno::ENAMETOOLONG
    );

    let f = c.create(root(), "file", FileKind::Regular).unwrap();
    assert_eq!(
        (f.stripe_size, f.stripe_width),
        (1 << 20, 2),
        "fragment defaults"
    );
    let home = c.home(f.ino);
    let set = SetAttrReq {
        ino: f.ino,
        valid: setattr::MODE | setattr::UID,
        mode: 0o600,
        uid: 7,
        gid: 8,
        size: 0,
        atime: Default::default(),
        mtime: Default::default(),
        ctime: Default::default(),
    };
    let a = home.call(&set).unwrap().attr;
    assert_eq!((a.mode, a.uid, a.gid), (0o600, 7, 100));
    assert_eq!(link_count(home, f.ino, 1).unwrap().attr.nlink, 2);

    home.call(&SetXattrReq {
        ino: f.ino,
        name: b"user.k".to_vec(),
        value: b"v".to_vec(),
        flags: 0,
    })
    .unwrap();
    assert_eq!(
        home.call(&GetXattrReq {
            ino: f.ino,
            name: b"user.k".to_vec()
        })
        .unwrap()
        .value,
        b"v"
    );
    assert_eq!(
        home.call(&ListXattrReq { ino: f.ino }).unwrap().names,
        vec![b"user.k".to_vec()]
    );
    home.call(&RemoveXattrReq {
        ino: f.ino,
        name: b"user.k".to_vec(),
    })
    .unwrap();
    assert_eq!(
        home.call(&GetXattrReq {
            ino: f.ino,
            name: b"user.k".to_vec()
        })
        .unwrap_err(),
        Errno::ENODATA
    );
    assert_eq!(
        home.call(&SetXattrReq {
            ino: f.ino,
            name: vec![b'n'; 300],
            value: vec![],
            flags: 0
        })
        .unwrap_err(),
        Errno::ERANGE
    );
}
