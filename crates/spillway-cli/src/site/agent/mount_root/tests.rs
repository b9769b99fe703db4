//! The mount root's checks, on real directories (most need root: the ancestors of the
//! temp dir are root's).

use super::*;
use std::os::unix::fs::{chown, PermissionsExt};

fn p(s: &str) -> &Path {
    Path::new(s)
}

#[test]
fn below_is_by_component() {
    let r = p("/m/root");
    assert_eq!(
        below(r, p("/m/root/a/b")).unwrap(),
        Some(vec![&b"a"[..], &b"b"[..]])
    );
    assert_eq!(below(r, p("/m/root")).unwrap(), None);
    assert_eq!(below(r, p("/m/rootx/a")).unwrap(), None);
    assert_eq!(below(r, p("/m")).unwrap(), None);
    assert_eq!(
        below(p("/m/root/"), p("/m/root/a")).unwrap(),
        Some(vec![&b"a"[..]])
    );
    for bad in [
        "/m/root/./a",
        "/m/root/../x",
        "/m/root//a",
        "/m/root/a/",
        "m/root/a",
    ] {
        assert!(below(r, p(bad)).is_err(), "{bad}");
    }
}

/// A directory of one test's own (0755).
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("spillway-mountpoint-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn as_root() -> bool {
    // SAFETY: geteuid has no arguments.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn the_walk_creates_checks_and_refuses() {
    if !as_root() {
        eprintln!("skipped: needs root (ancestors of the temp dir are root's)");
        return;
    }
    let d = scratch("walk");
    let root = d.join("mounts");
    let r = MountRoot::open(&root).unwrap();
    let md = std::fs::metadata(&root).unwrap();
    assert!(md.is_dir());
    assert_eq!(md.permissions().mode() & 0o7777, 0o755);

    // Created component by component, 0755, not mounted.
    let mp = r
        .walk(&root.join("batch/1_striped_scratch"), true)
        .unwrap()
        .unwrap();
    assert_eq!(mp.mounted, Mounted::No);
    assert_eq!(mp.path, root.join("batch/1_striped_scratch"));
    let m = std::fs::metadata(root.join("batch")).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o755);
    // Without create, a missing one is None.
    assert!(r.walk(&root.join("nope/x"), false).unwrap().is_none());

    // Not below the root: refused.
    let e = r.walk(&d.join("elsewhere"), true).err().unwrap();
    assert!(e.contains("not below"), "{e}");
    let e = r.walk(&root, true).err().unwrap();
    assert!(e.contains("not below"), "{e}");

    // A symlink anywhere in the path: refused, nothing created at its target.
    let target = d.join("target");
    std::fs::create_dir(&target).unwrap();
    std::os::unix::fs::symlink(&target, root.join("link")).unwrap();
    for p in [root.join("link"), root.join("link/x")] {
        let e = r.walk(&p, true).err().unwrap();
        assert!(e.contains("symbolic link"), "{e}");
    }
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);

    // A component owned by someone else, or writable by others: refused.
    std::fs::create_dir(root.join("theirs")).unwrap();
    chown(root.join("theirs"), Some(1234), None).unwrap();
    let e = r.walk(&root.join("theirs/x"), true).err().unwrap();
    assert!(e.contains("owned by uid 1234"), "{e}");
    assert!(!root.join("theirs/x").exists());
    let e = r.walk(&root.join("theirs"), true).err().unwrap();
    assert!(e.contains("owned by uid 1234"), "{e}");
    std::fs::create_dir(root.join("open")).unwrap();
    std::fs::set_permissions(root.join("open"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let e = r.walk(&root.join("open/x"), true).err().unwrap();
    assert!(e.contains("writable"), "{e}");
    // A file in the way.
    std::fs::write(root.join("file"), b"x").unwrap();
    let e = r.walk(&root.join("file/x"), true).err().unwrap();
    assert!(e.contains("regular file"), "{e}");

    // Unmount of a plain directory removes it; of a missing one is a no-op.
    r.unmount(&root.join("batch/1_striped_scratch"), None)
        .unwrap();
    assert!(!root.join("batch/1_striped_scratch").exists());
    r.unmount(&root.join("batch/1_striped_scratch"), None)
        .unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_root_and_its_ancestors_are_checked() {
    if !as_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let d = scratch("root");
    // A user-owned ancestor.
    let user = d.join("user");
    std::fs::create_dir(&user).unwrap();
    chown(&user, Some(1234), Some(1234)).unwrap();
    let e = MountRoot::open(&user.join("mounts")).err().unwrap();
    assert!(e.contains("owned by uid 1234"), "{e}");
    assert!(!user.join("mounts").exists());
    // A world-writable root, sticky or not.
    let ww = d.join("ww");
    std::fs::create_dir(&ww).unwrap();
    std::fs::set_permissions(&ww, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let e = MountRoot::open(&ww).err().unwrap();
    assert!(e.contains("writable"), "{e}");
    // A sticky world-writable ancestor with a root-owned child is fine (/tmp).
    MountRoot::open(&ww.join("mounts")).unwrap();
    // A non-sticky group-writable ancestor is not.
    let gw = d.join("gw");
    std::fs::create_dir(&gw).unwrap();
    std::fs::set_permissions(&gw, std::fs::Permissions::from_mode(0o775)).unwrap();
    let e = MountRoot::open(&gw.join("mounts")).err().unwrap();
    assert!(e.contains("writable"), "{e}");
    // A root symlink to a good directory resolves; mount points below it are
    // accepted by either name.
    std::os::unix::fs::symlink(ww.join("mounts"), d.join("alias")).unwrap();
    let r = MountRoot::open(&d.join("alias")).unwrap();
    assert_eq!(r.path, ww.join("mounts"));
    let mp = r.walk(&d.join("alias/a"), true).unwrap().unwrap();
    assert_eq!(mp.path, ww.join("mounts/a"));
    assert!(r.walk(&ww.join("mounts/a"), false).unwrap().is_some());
    std::fs::remove_dir_all(&d).unwrap();
}
