//! The PFS paths a stage may reach, and how it reaches them: roots, scope, symlinks,
//! temporaries, walks and the owner's permissions.

use super::*;
use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;

fn root_pfs(roots: &[&Path]) -> Pfs {
    let roots: Vec<String> = roots.iter().map(|p| p.display().to_string()).collect();
    Pfs::new(&roots, &roots, Identity::of_uid(0).unwrap()).unwrap()
}

#[test]
fn paths_must_be_under_the_tickets_scope_and_a_root() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("pfs");
    std::fs::create_dir_all(root.join("alice")).unwrap();
    std::fs::create_dir_all(root.join("bob")).unwrap();
    std::fs::write(root.join("alice/a"), b"a").unwrap();
    std::fs::write(root.join("bob/b"), b"b").unwrap();
    let roots = vec![root.display().to_string()];
    let scope = vec![format!("{}/alice", root.display())];
    let pfs = Pfs::new(&roots, &scope, Identity::of_uid(0).unwrap()).unwrap();
    assert!(pfs
        .open(&format!("{}/alice/a", root.display()), libc::O_RDONLY, 0)
        .is_ok());
    for bad in [
        format!("{}/bob/b", root.display()),
        format!("{}/alice/../bob/b", root.display()),
        format!("{}/alicex", root.display()),
        "/etc/shadow".to_string(),
    ] {
        let e = pfs.open(&bad, libc::O_RDONLY, 0).unwrap_err();
        assert_eq!(e.errno, libc::EACCES, "{bad}: {}", e.message);
    }
    // A scope beyond the server's roots opens nothing outside them.
    let wide = Pfs::new(&roots, &["/".to_string()], Identity::of_uid(0).unwrap()).unwrap();
    let e = wide.open("/etc/shadow", libc::O_RDONLY, 0).unwrap_err();
    assert_eq!(e.errno, libc::EACCES, "{}", e.message);
    // No roots configured: no stage at all.
    assert_eq!(
        Pfs::new(&[], &scope, Identity::of_uid(0).unwrap())
            .err()
            .map(|f| f.errno),
        Some(libc::EACCES)
    );
}

#[test]
fn paths_must_be_under_a_root() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("pfs");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("a"), b"hello").unwrap();
    std::fs::write(d.path().join("outside"), b"no").unwrap();
    let pfs = root_pfs(&[&root]);
    let a = format!("{}/a", root.display());
    assert_eq!(pfs.lstat(&a).unwrap().size, 5);
    let e = pfs
        .open(
            &format!("{}/outside", d.path().display()),
            libc::O_RDONLY,
            0,
        )
        .unwrap_err();
    assert_eq!(e.errno, libc::EACCES, "{}", e.message);
    let e = pfs
        .open(&format!("{}/../outside", root.display()), libc::O_RDONLY, 0)
        .unwrap_err();
    assert_eq!(e.errno, libc::EACCES, "{}", e.message);
    let e = pfs.open("relative/a", libc::O_RDONLY, 0).unwrap_err();
    assert_eq!(e.errno, libc::EINVAL);
    // A root "/pfs" does not admit "/pfs2/x".
    let sibling = d.path().join("pfs2");
    std::fs::create_dir(&sibling).unwrap();
    std::fs::write(sibling.join("x"), b"x").unwrap();
    let e = pfs
        .open(&format!("{}/x", sibling.display()), libc::O_RDONLY, 0)
        .unwrap_err();
    assert_eq!(e.errno, libc::EACCES);
}

#[test]
fn symlinks_are_followed_only_beneath_the_root() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("pfs");
    std::fs::create_dir_all(root.join("dir")).unwrap();
    std::fs::write(root.join("dir/real"), b"inside").unwrap();
    std::fs::write(d.path().join("secret"), b"outside").unwrap();
    std::os::unix::fs::symlink("real", root.join("dir/rel")).unwrap();
    std::os::unix::fs::symlink("../../secret", root.join("dir/climb")).unwrap();
    std::os::unix::fs::symlink(d.path().join("secret"), root.join("dir/abs")).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
    let pfs = root_pfs(&[&root]);
    let p = |n: &str| format!("{}/{n}", root.display());
    assert!(pfs.open(&p("dir/rel"), libc::O_RDONLY, 0).is_ok());
    for bad in ["dir/climb", "dir/abs", "etc/passwd"] {
        let e = pfs.open(&p(bad), libc::O_RDONLY, 0).unwrap_err();
        assert_eq!(e.errno, libc::EACCES, "{bad}: {}", e.message);
        assert!(e.message.contains("leaves the PFS root"), "{}", e.message);
    }
}

#[test]
fn a_temporary_is_created_new_renamed_into_place_or_removed() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("pfs");
    std::fs::create_dir_all(root.join("a")).unwrap();
    let r = root.display().to_string();
    let dst = format!("{r}/a/out");
    std::fs::write(&dst, b"old").unwrap();
    let pfs = Pfs::new(
        std::slice::from_ref(&r),
        std::slice::from_ref(&dst),
        Identity::of_uid(0).unwrap(),
    )
    .unwrap()
    .for_stage(9);
    let tmp = crate::stage::temp::path(&dst, 9, 0);
    // Not this stage's, not a temporary name: refused.
    let other = crate::stage::temp::path(&dst, 8, 0);
    assert_eq!(
        pfs.create_temporary(&other, 0o644).unwrap_err().errno,
        libc::EACCES
    );
    assert_eq!(
        pfs.create_temporary(&dst, 0o644).unwrap_err().errno,
        libc::EINVAL
    );
    {
        use std::io::Write;
        let mut f = pfs.create_temporary(&tmp, 0o644).unwrap();
        f.write_all(b"new").unwrap();
    }
    // O_EXCL: never an existing file (nor through a symlink).
    assert_eq!(
        pfs.create_temporary(&tmp, 0o644).unwrap_err().errno,
        libc::EEXIST
    );
    assert_eq!(
        std::fs::read(&dst).unwrap(),
        b"old",
        "the destination is untouched"
    );
    pfs.rename_into_place(&tmp, &dst).unwrap();
    pfs.sync_parent(&dst).unwrap();
    assert_eq!(std::fs::read(&dst).unwrap(), b"new");
    assert!(!Path::new(&tmp).exists());
    // A temporary elsewhere is not this destination's.
    let tmp2 = crate::stage::temp::path(&dst, 9, 1);
    pfs.create_temporary(&tmp2, 0o644).unwrap();
    let e = pfs
        .rename_into_place(&tmp2, &format!("{r}/b/out"))
        .unwrap_err();
    assert_eq!(e.errno, libc::EINVAL);
    pfs.remove_temporary(&tmp2).unwrap();
    pfs.remove_temporary(&tmp2).unwrap(); // gone already: fine
    assert!(!Path::new(&tmp2).exists());
    assert_eq!(pfs.remove_temporary(&dst).unwrap_err().errno, libc::EINVAL);
    // A directory at the destination fails the file; a FIFO is never replaced.
    std::fs::create_dir(root.join("a/dir")).unwrap();
    let dir = format!("{r}/a/dir");
    let pfs = Pfs::new(
        std::slice::from_ref(&r),
        &[format!("{r}/a")],
        Identity::of_uid(0).unwrap(),
    )
    .unwrap()
    .for_stage(9);
    assert_eq!(pfs.check_destination(&dir).unwrap_err().errno, libc::EISDIR);
    let fifo = CString::new(format!("{r}/a/fifo")).unwrap();
    // SAFETY: a valid path string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let t = crate::stage::temp::path(&format!("{r}/a/fifo"), 9, 2);
    pfs.create_temporary(&t, 0o644).unwrap();
    let e = pfs
        .rename_into_place(&t, &format!("{r}/a/fifo"))
        .unwrap_err();
    assert_eq!(e.errno, libc::EINVAL, "{}", e.message);
}

#[test]
fn walk_lists_a_tree_depth_first_in_name_order() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().to_path_buf();
    std::fs::create_dir_all(root.join("t/b/c")).unwrap();
    std::fs::write(root.join("t/a"), b"1").unwrap();
    std::fs::write(root.join("t/b/c/d"), b"22").unwrap();
    std::fs::write(root.join("t/z"), b"333").unwrap();
    std::os::unix::fs::symlink("a", root.join("t/l")).unwrap();
    let pfs = root_pfs(&[&root]);
    let w = pfs.walk(&format!("{}/t", root.display())).unwrap();
    let names: Vec<String> = w.iter().map(|(p, _)| p.display().to_string()).collect();
    assert_eq!(names, ["a", "b", "l", "z", "b/c", "b/c/d"]);
    assert!(w[2].1.is_symlink());
    assert_eq!(w[3].1.size, 3);
}

#[test]
fn the_owner_needs_permission() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let f = d.path().join("private");
    std::fs::write(&f, b"x").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    let nobody = Identity {
        uid: 65534,
        gid: 65534,
        groups: vec![65534],
    };
    let roots = [d.path().display().to_string()];
    let pfs = Pfs::new(&roots, &roots, nobody).unwrap();
    let e = pfs
        .open(&f.display().to_string(), libc::O_RDONLY, 0)
        .unwrap_err();
    assert_eq!(e.errno, libc::EACCES);
    let e = pfs
        .open(
            &format!("{}/new", d.path().display()),
            libc::O_WRONLY | libc::O_CREAT,
            0o644,
        )
        .unwrap_err();
    assert_eq!(
        e.errno,
        libc::EACCES,
        "cannot create in root's 0755 directory"
    );
}
