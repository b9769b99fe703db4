//! The instance's namespace as a stage's owner may use it. The coordinator talks to
//! the servers as a peer, which no server checks permissions for, so the POSIX checks
//! a mount's kernel would make are made here: search on every directory walked, write
//! and search on a directory a name is made in, write on a file truncated, read on a
//! file copied out. Symlinks inside instance paths are not followed.

use super::Failure;
use spillway_stubs::Instance;
use spillway_types::identity::Identity;
use spillway_types::{Attr, Errno, FileKind, ROOT_INODE};

pub(super) const MAY_READ: u32 = 4;
pub(super) const MAY_WRITE: u32 = 2;
pub(super) const MAY_EXEC: u32 = 1;

/// May `id` access `a` for `want` (a mask of MAY_*)?
pub(super) fn may(a: &Attr, id: &Identity, want: u32) -> bool {
    if id.uid == 0 {
        // Root reads and writes anything; executes what someone may execute.
        return want & MAY_EXEC == 0 || a.kind == FileKind::Directory || a.mode & 0o111 != 0;
    }
    let bits = if a.uid == id.uid {
        (a.mode >> 6) & 7
    } else if a.gid == id.gid || id.groups.contains(&a.gid) {
        (a.mode >> 3) & 7
    } else {
        a.mode & 7
    };
    bits & want == want
}

pub(super) fn errno_failure(e: Errno, path: &str, doing: &str) -> Failure {
    Failure::new(
        e.0,
        format!(
            "{path}: {doing}: {}",
            std::io::Error::from_raw_os_error(e.0)
        ),
    )
}

fn denied(path: &str, what: &str) -> Failure {
    Failure::new(libc::EACCES, format!("{path}: permission denied ({what})"))
}

/// Check `id` may access `a` for `want` (a mask of MAY_*); EACCES naming `path` and
/// `what` was asked (`"read on the file"`) if not.
pub(super) fn check_may(
    a: &Attr,
    id: &Identity,
    want: u32,
    path: &str,
    what: &str,
) -> Result<(), Failure> {
    if !may(a, id, want) {
        return Err(denied(path, what));
    }
    Ok(())
}

/// Fail unless `a` is a regular file, as `open` would for a copy: EISDIR for a
/// directory, EINVAL for anything else, saying `message()`.
pub(super) fn regular_file(a: &Attr, message: impl FnOnce() -> String) -> Result<(), Failure> {
    match a.kind {
        FileKind::Regular => Ok(()),
        FileKind::Directory => Err(Failure::new(libc::EISDIR, message())),
        _ => Err(Failure::new(libc::EINVAL, message())),
    }
}

/// The components of an instance path ("/a/b" → ["a", "b"]); `..` is refused.
pub(super) fn components(path: &str) -> Result<Vec<&str>, Failure> {
    if !path.starts_with('/') {
        return Err(Failure::new(
            libc::EINVAL,
            format!("{path}: an instance path must start with /"),
        ));
    }
    let mut out = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                return Err(Failure::new(
                    libc::EINVAL,
                    format!("{path}: .. is not allowed in an instance path"),
                ))
            }
            c if c.len() > 255 => {
                return Err(Failure::new(
                    libc::ENAMETOOLONG,
                    format!("{path}: a name is longer than 255 bytes"),
                ))
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// Walk `names` from the root as `id`, checking search permission on each directory.
fn walk(inst: &Instance, id: &Identity, path: &str, names: &[&str]) -> Result<Attr, Failure> {
    let mut cur = inst
        .getattr(ROOT_INODE)
        .map_err(|e| errno_failure(e, "/", "instance root"))?;
    for name in names {
        if cur.kind != FileKind::Directory {
            return Err(Failure::new(
                libc::ENOTDIR,
                format!("{path}: a component is not a directory"),
            ));
        }
        if !may(&cur, id, MAY_EXEC) {
            return Err(denied(path, "search on a directory"));
        }
        let (_, a) = inst
            .lookup(cur.ino, name.as_bytes())
            .map_err(|e| errno_failure(e, path, "lookup"))?;
        cur = a;
    }
    Ok(cur)
}

/// The attributes of what `path` names.
pub(super) fn resolve(inst: &Instance, id: &Identity, path: &str) -> Result<Attr, Failure> {
    let names = components(path)?;
    walk(inst, id, path, &names)
}

/// The directory `path` would be made in, and its last name.
pub(super) fn resolve_parent<'a>(
    inst: &Instance,
    id: &Identity,
    path: &'a str,
) -> Result<(Attr, &'a str), Failure> {
    let names = components(path)?;
    let Some((last, dirs)) = names.split_last() else {
        return Err(Failure::new(
            libc::EISDIR,
            format!("{path}: names the instance root"),
        ));
    };
    let parent = walk(inst, id, path, dirs)?;
    if parent.kind != FileKind::Directory {
        return Err(Failure::new(
            libc::ENOTDIR,
            format!("{path}: the parent is not a directory"),
        ));
    }
    Ok((parent, last))
}

/// Check `id` may make or replace names in `dir`.
pub(super) fn check_dir_writable(dir: &Attr, id: &Identity, path: &str) -> Result<(), Failure> {
    if !may(dir, id, MAY_WRITE | MAY_EXEC) {
        return Err(denied(path, "write on the directory"));
    }
    Ok(())
}

/// The gid and mode a new entry of `kind` in `parent` gets (setgid directories pass
/// their group on, and the bit to subdirectories), as the FUSE client does.
pub(super) fn new_owner(parent: &Attr, id: &Identity, kind: FileKind, mode: u32) -> (u32, u32) {
    let mut mode = mode & 0o7777;
    let mut gid = id.gid;
    if parent.mode & libc::S_ISGID != 0 {
        gid = parent.gid;
        if kind == FileKind::Directory {
            mode |= libc::S_ISGID;
        }
    }
    (gid, mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_types::{InodeNo, Timespec};

    fn attr(kind: FileKind, mode: u32, uid: u32, gid: u32) -> Attr {
        Attr {
            ino: InodeNo(5),
            kind,
            mode,
            nlink: 1,
            uid,
            gid,
            rdev: 0,
            size: 0,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            stripe_size: 4096,
            stripe_width: 1,
            blocks: 0,
        }
    }

    #[test]
    fn owner_group_other_bits() {
        let alice = Identity {
            uid: 1000,
            gid: 1000,
            groups: vec![1000, 50],
        };
        let f = attr(FileKind::Regular, 0o640, 1000, 7);
        assert!(may(&f, &alice, MAY_READ | MAY_WRITE));
        assert!(!may(&f, &alice, MAY_EXEC));
        let g = attr(FileKind::Regular, 0o640, 1, 50);
        assert!(may(&g, &alice, MAY_READ));
        assert!(!may(&g, &alice, MAY_WRITE));
        let o = attr(FileKind::Regular, 0o604, 1, 2);
        assert!(may(&o, &alice, MAY_READ));
        // Owner bits rule even when the group or others would allow more.
        let odd = attr(FileKind::Regular, 0o066, 1000, 1000);
        assert!(!may(&odd, &alice, MAY_READ));
        let root = Identity {
            uid: 0,
            gid: 0,
            groups: vec![0],
        };
        assert!(may(
            &attr(FileKind::Regular, 0, 5, 5),
            &root,
            MAY_READ | MAY_WRITE
        ));
        assert!(!may(&attr(FileKind::Regular, 0o600, 5, 5), &root, MAY_EXEC));
    }

    #[test]
    fn paths_split_and_refuse_dotdot() {
        assert_eq!(components("/a//b/./c").unwrap(), ["a", "b", "c"]);
        assert!(components("/").unwrap().is_empty());
        assert_eq!(components("a").unwrap_err().errno, libc::EINVAL);
        assert_eq!(components("/a/../b").unwrap_err().errno, libc::EINVAL);
    }
}
