//! POSIX ACLs in the metadata store: validation, the mode kept consistent with the
//! access ACL both ways, and ACLs given at create.

use super::test_fixtures::{errno, store_with};
use super::*;
use spillway_types::acl::{tag, Acl, ACCESS_XATTR, DEFAULT_XATTR, UNDEFINED_ID};
use spillway_types::{Attr, Errno, FileKind, ServerIndex, ROOT_INODE};

const HOME: Home = Home {
    index: ServerIndex(0),
    count: 1,
    default_stripe_size: 1 << 20,
};

fn store() -> (tempfile::TempDir, MetaStore) {
    store_with(RootSpec {
        uid: 0,
        gid: 0,
        mode: 0o40755,
        stripe_size: 1 << 20,
        stripe_width: 1,
    })
}

fn req(name: &str, kind: FileKind, mode: u32, xattrs: Vec<(Vec<u8>, Vec<u8>)>) -> NewNode {
    NewNode {
        target: if kind == FileKind::Symlink {
            b"t".to_vec()
        } else {
            Vec::new()
        },
        xattrs,
        ..NewNode::new(ROOT_INODE, name.as_bytes(), kind, mode, 1, 2)
    }
}

fn create(m: &MetaStore, name: &str, kind: FileKind, mode: u32) -> Attr {
    m.create(&req(name, kind, mode, Vec::new()), HOME).unwrap()
}

/// u::rw-, u:1000:rw-, g::r--, m::<mask>, o::---
fn named(mask: u16) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (t, p, id) in [
        (tag::USER_OBJ, 6, UNDEFINED_ID),
        (tag::USER, 6, 1000),
        (tag::GROUP_OBJ, 4, UNDEFINED_ID),
        (tag::MASK, mask, UNDEFINED_ID),
        (tag::OTHER, 0, UNDEFINED_ID),
    ] {
        v.extend_from_slice(&t.to_le_bytes());
        v.extend_from_slice(&p.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

#[test]
fn access_acl_sets_mode_and_chmod_sets_acl() {
    let (_d, m) = store();
    let f = create(&m, "f", FileKind::Regular, 0o600);
    m.set_xattr(f.ino, ACCESS_XATTR, &named(6), XattrMode::default())
        .unwrap();
    assert_eq!(
        m.get_attr(f.ino).unwrap().mode,
        0o660,
        "the mask is the group bits"
    );
    assert_eq!(m.get_xattr(f.ino, ACCESS_XATTR).unwrap(), named(6));
    let chmod = AttrChange {
        mode: Some(0o640),
        ..AttrChange::default()
    };
    m.set_attr(f.ino, &chmod).unwrap();
    assert_eq!(m.get_xattr(f.ino, ACCESS_XATTR).unwrap(), named(4));
    // Removing the ACL keeps the mode.
    m.remove_xattr(f.ino, ACCESS_XATTR).unwrap();
    assert_eq!(m.get_attr(f.ino).unwrap().mode, 0o640);
    assert_eq!(errno(m.get_xattr(f.ino, ACCESS_XATTR)), Errno::ENODATA);
}

#[test]
fn equivalent_acl_is_the_mode_alone() {
    let (_d, m) = store();
    let f = create(&m, "f", FileKind::Regular, 0o2644);
    m.set_xattr(
        f.ino,
        ACCESS_XATTR,
        &Acl::from_mode(0o751).to_bytes(),
        XattrMode {
            acl_kill_sgid: true,
            ..XattrMode::default()
        },
    )
    .unwrap();
    assert_eq!(
        m.get_attr(f.ino).unwrap().mode,
        0o751,
        "bits set, setgid killed"
    );
    assert_eq!(errno(m.get_xattr(f.ino, ACCESS_XATTR)), Errno::ENODATA);
    assert!(m.list_xattrs(f.ino).unwrap().is_empty());
}

#[test]
fn refusals() {
    let (_d, m) = store();
    let f = create(&m, "f", FileKind::Regular, 0o644);
    let l = create(&m, "l", FileKind::Symlink, 0o777);
    let mut bad = named(6);
    bad[0] = 3;
    assert_eq!(
        errno(m.set_xattr(f.ino, ACCESS_XATTR, &bad, XattrMode::default())),
        Errno::EINVAL
    );
    assert_eq!(
        errno(m.set_xattr(f.ino, ACCESS_XATTR, b"", XattrMode::default())),
        Errno::EINVAL
    );
    assert_eq!(
        errno(m.set_xattr(f.ino, DEFAULT_XATTR, &named(6), XattrMode::default())),
        Errno::EACCES
    );
    assert_eq!(
        errno(m.set_xattr(l.ino, ACCESS_XATTR, &named(6), XattrMode::default())),
        Errno::EOPNOTSUPP
    );
    // Nothing changed.
    assert_eq!(m.get_attr(f.ino).unwrap().mode, 0o644);
    assert!(m.list_xattrs(f.ino).unwrap().is_empty());
}

#[test]
fn create_with_inherited_acls() {
    let (_d, m) = store();
    let x = |n: &[u8], v: Vec<u8>| (n.to_vec(), v);
    let d = m
        .create(
            &req(
                "d",
                FileKind::Directory,
                0o777,
                vec![x(ACCESS_XATTR, named(7)), x(DEFAULT_XATTR, named(7))],
            ),
            HOME,
        )
        .unwrap();
    assert_eq!(d.mode, 0o670, "the mode follows the access ACL");
    assert_eq!(m.get_xattr(d.ino, DEFAULT_XATTR).unwrap(), named(7));
    assert_eq!(m.list_xattrs(d.ino).unwrap().len(), 2);
    // A default ACL on a file, an ACL on a symlink, a malformed one, duplicates:
    // refused whole, nothing created.
    for (name, kind, xs) in [
        ("a", FileKind::Regular, vec![x(DEFAULT_XATTR, named(6))]),
        ("b", FileKind::Symlink, vec![x(ACCESS_XATTR, named(6))]),
        (
            "c",
            FileKind::Regular,
            vec![x(ACCESS_XATTR, vec![2, 0, 0, 0])],
        ),
        (
            "e",
            FileKind::Regular,
            vec![x(b"user.a", vec![1]), x(b"user.a", vec![2])],
        ),
    ] {
        assert_eq!(
            errno(m.create(&req(name, kind, 0o644, xs), HOME)),
            Errno::EINVAL
        );
        assert_eq!(
            errno(m.lookup(ROOT_INODE, name.as_bytes(), HOME.index)),
            Errno::ENOENT
        );
    }
    // An access ACL equivalent to the mode is not stored.
    let f = m
        .create(
            &req(
                "f",
                FileKind::Regular,
                0o666,
                vec![x(ACCESS_XATTR, Acl::from_mode(0o640).to_bytes())],
            ),
            HOME,
        )
        .unwrap();
    assert_eq!(f.mode, 0o640);
    assert!(m.list_xattrs(f.ino).unwrap().is_empty());
}
