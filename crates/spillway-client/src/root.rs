//! The mount's root: which directory of the instance a mount shows as `/`.
//!
//! A striped mount shows the whole instance. A private mount (DataWarp's
//! `DW_JOB_PRIVATE`, `spillway mount --root-dir /.spillway-private/<node>`) shows one
//! directory of it as its root, so each compute node has a namespace of its own while
//! files are still striped over every server of the instance.
//!
//! The kernel knows a mount's root as FUSE node 1, and the instance knows its root
//! directory as inode 1 too; in a private mount they differ. [`MountRoot`] is the one
//! place where numbers are translated between the two sides of the FUSE boundary:
//!
//! * kernel → instance ([`MountRoot::inst`]): node 1 is the root directory's inode; the
//!   root directory's own number (which is never handed to the kernel) names nothing
//!   (inode 0: every server answers ENOENT); every other number is the same inode;
//! * instance → kernel ([`MountRoot::fuse`]): the root directory's inode is node 1; the
//!   instance's root (which no entry points at, so no answer can name it) becomes the
//!   root directory's own number, which names nothing on the way back; every other
//!   number is unchanged.
//!
//! Nothing the kernel sends can therefore reach above the mount root: the kernel never
//! asks for `..` (it resolves `..` of a mount root itself, and the client does not offer
//! `FUSE_EXPORT_SUPPORT`), and the one number that would name the instance's root maps
//! to nothing. The control channel's paths (libdatawarp) are mount paths; they are
//! translated to instance paths with [`MountRoot::inst_path`] and back with
//! [`MountRoot::mount_path`].
//!
//! [`MountRoot::resolve`] finds the root directory, creating what is missing with the
//! owner, group and mode of the instance's root (so the job owner owns their private
//! namespace, with the configuration's `root_permissions` and `group`), and tolerating
//! another node creating the same directory at the same time.

use fuser::INodeNo;
use spillway_stubs::Instance;
use spillway_types::tunables::MAX_NAME_LEN;
use spillway_types::{Errno, FileKind, InodeNo, ROOT_INODE};
use spillway_wire::messages::CreateReq;

/// The kernel's number of a mount's root.
const FUSE_ROOT: u64 = INodeNo::ROOT.0;
/// An inode number no server holds (negative entries use it too).
const NOWHERE: InodeNo = InodeNo(0);
/// Longest `--root-dir` accepted.
pub const MAX_ROOT_DIR: usize = 1024;

/// Which directory of the instance a mount shows as its root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountRoot {
    /// The root directory's inode (`ROOT_INODE` for a mount of the whole instance).
    ino: InodeNo,
    /// Its instance path, normalized (`/a/b`); empty for the instance's root.
    path: String,
}

impl Default for MountRoot {
    fn default() -> Self {
        MountRoot::instance()
    }
}

/// The components of a `--root-dir`: an absolute path of plain names (no `.`, `..`,
/// empty names beyond repeated slashes, NULs, or names longer than a file name may be).
/// `/` gives no component: the instance's root.
pub fn parse_root_dir(dir: &str) -> Result<Vec<String>, String> {
    if !dir.starts_with('/') {
        return Err(format!("root directory {dir:?} is not an absolute path"));
    }
    if dir.len() > MAX_ROOT_DIR {
        return Err(format!(
            "root directory is longer than {MAX_ROOT_DIR} bytes"
        ));
    }
    let mut out = Vec::new();
    for c in dir.split('/').filter(|c| !c.is_empty()) {
        if c == "." || c == ".." || c.contains('\0') || c.len() > MAX_NAME_LEN {
            return Err(format!(
                "root directory {dir:?}: {c:?} is not a plain file name"
            ));
        }
        out.push(c.to_string());
    }
    Ok(out)
}

impl MountRoot {
    /// The whole instance: every number and path is the same on both sides.
    pub fn instance() -> MountRoot {
        MountRoot {
            ino: ROOT_INODE,
            path: String::new(),
        }
    }

    /// The directory `ino` at instance path `path` (`/a/b`, or `/` for the root).
    pub fn at(ino: InodeNo, path: &str) -> MountRoot {
        let path = if path == "/" { "" } else { path };
        MountRoot {
            ino,
            path: path.trim_end_matches('/').to_string(),
        }
    }

    /// The root directory's inode.
    pub fn ino(&self) -> InodeNo {
        self.ino
    }

    /// Its instance path (`/` for the instance's root).
    pub fn path(&self) -> &str {
        if self.path.is_empty() {
            "/"
        } else {
            &self.path
        }
    }

    /// Whether the mount shows the whole instance.
    pub fn is_instance_root(&self) -> bool {
        self.ino == ROOT_INODE
    }

    /// The instance's inode for a node number the kernel sent.
    pub fn inst(&self, i: INodeNo) -> InodeNo {
        if self.is_instance_root() {
            InodeNo(i.0)
        } else if i.0 == FUSE_ROOT {
            self.ino
        } else if i.0 == self.ino.0 {
            NOWHERE
        } else {
            InodeNo(i.0)
        }
    }

    /// The kernel's node number for an instance inode.
    pub fn fuse(&self, i: InodeNo) -> INodeNo {
        if self.is_instance_root() {
            INodeNo(i.0)
        } else if i == self.ino {
            INodeNo::ROOT
        } else if i == ROOT_INODE {
            INodeNo(self.ino.0)
        } else {
            INodeNo(i.0)
        }
    }

    /// The instance path of a mount path (normalized, `/` or `/a/b`).
    pub fn inst_path(&self, mount_path: &str) -> String {
        if self.path.is_empty() {
            mount_path.to_string()
        } else if mount_path == "/" {
            self.path.clone()
        } else {
            format!("{}{mount_path}", self.path)
        }
    }

    /// The mount path of an instance path, if it lies in the mount.
    pub fn mount_path(&self, inst_path: &str) -> Option<String> {
        if self.path.is_empty() {
            return Some(inst_path.to_string());
        }
        if inst_path == self.path {
            return Some("/".into());
        }
        inst_path
            .strip_prefix(self.path.as_str())
            .filter(|rest| rest.starts_with('/'))
            .map(str::to_string)
    }

    /// Find the directory `dir` of the instance (see [`parse_root_dir`]), creating the
    /// missing components with the owner, group and mode of the instance's root.
    pub fn resolve(inst: &Instance, dir: &str) -> Result<MountRoot, String> {
        let names = parse_root_dir(dir)?;
        if names.is_empty() {
            return Ok(MountRoot::instance());
        }
        let root = inst
            .getattr(ROOT_INODE)
            .map_err(|e| format!("cannot read the instance's root: {e}"))?;
        let mut cur = ROOT_INODE;
        let mut path = String::new();
        for name in &names {
            path.push('/');
            path.push_str(name);
            let found = |e: Option<spillway_wire::messages::EntryRef>| match e {
                Some(e) if e.kind == FileKind::Directory => Ok(Some(e.ino)),
                Some(_) => Err(format!("{path} is not a directory in the instance")),
                None => Ok(None),
            };
            let lookup = |dir: InodeNo| {
                inst.lookup_entry(dir, name.as_bytes())
                    .map_err(|e| format!("cannot look up {path}: {e}"))
            };
            if let Some(ino) = found(lookup(cur)?)? {
                cur = ino;
                continue;
            }
            let made = inst.create(CreateReq::new(
                cur,
                name.as_bytes(),
                FileKind::Directory,
                root.mode & 0o7777,
                root.uid,
                root.gid,
            ));
            cur = match made {
                Ok(a) => {
                    // The parent's times and subdirectory count; the directory exists
                    // whether or not this succeeds.
                    if let Err(e) = inst.touch_dir(cur, 1) {
                        tracing::warn!("{path} created, but its parent was not updated: {e}");
                    }
                    tracing::info!("created {path} (uid {}, gid {})", a.uid, a.gid);
                    a.ino
                }
                // Another node made it at the same moment.
                Err(e) if e == Errno::EEXIST => found(lookup(cur)?)?
                    .ok_or_else(|| format!("{path} appeared and went again; try again"))?,
                Err(e) => return Err(format!("cannot create {path}: {e}")),
            };
        }
        Ok(MountRoot { ino: cur, path })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIR: InodeNo = InodeNo((1 << 48) | 7);

    fn private() -> MountRoot {
        MountRoot::at(DIR, "/.spillway-private/c0")
    }

    #[test]
    fn the_whole_instance_translates_nothing() {
        let r = MountRoot::instance();
        for n in [0, 1, 2, DIR.0, u64::MAX] {
            assert_eq!(r.inst(INodeNo(n)), InodeNo(n));
            assert_eq!(r.fuse(InodeNo(n)), INodeNo(n));
        }
        assert_eq!(r.inst_path("/"), "/");
        assert_eq!(r.inst_path("/a/b"), "/a/b");
        assert_eq!(r.mount_path("/a"), Some("/a".into()));
        assert_eq!(r.path(), "/");
        assert_eq!(MountRoot::at(ROOT_INODE, "/"), r);
    }

    #[test]
    fn the_kernels_root_is_the_directory_and_back() {
        let r = private();
        assert_eq!(r.inst(INodeNo::ROOT), DIR);
        assert_eq!(r.fuse(DIR), INodeNo::ROOT);
        assert_eq!(r.inst(r.fuse(DIR)), DIR);
        assert_eq!(r.fuse(r.inst(INodeNo::ROOT)), INodeNo::ROOT);
    }

    #[test]
    fn every_other_inode_is_itself() {
        let r = private();
        for n in [2, 3, (1 << 48) | 1, (1 << 48) | 8, (2 << 48) | 7, u64::MAX] {
            assert_eq!(r.inst(INodeNo(n)), InodeNo(n), "{n:#x}");
            assert_eq!(r.fuse(InodeNo(n)), INodeNo(n), "{n:#x}");
        }
        // Negative entries keep node 0.
        assert_eq!(r.fuse(InodeNo(0)), INodeNo(0));
    }

    #[test]
    fn the_instance_root_is_out_of_reach() {
        let r = private();
        // The directory's own number names nothing from the kernel's side...
        assert_eq!(r.inst(INodeNo(DIR.0)), NOWHERE);
        // ...and the instance's root, were it ever named, comes back as nothing.
        assert_eq!(r.inst(r.fuse(ROOT_INODE)), NOWHERE);
        assert_ne!(r.fuse(ROOT_INODE), INodeNo::ROOT);
    }

    #[test]
    fn paths_gain_and_lose_the_prefix() {
        let r = private();
        assert_eq!(r.path(), "/.spillway-private/c0");
        assert_eq!(r.inst_path("/"), "/.spillway-private/c0");
        assert_eq!(r.inst_path("/out/x"), "/.spillway-private/c0/out/x");
        assert_eq!(r.mount_path("/.spillway-private/c0"), Some("/".into()));
        assert_eq!(
            r.mount_path("/.spillway-private/c0/out/x"),
            Some("/out/x".into())
        );
        // Another node's namespace, a sibling with a longer name, the instance root.
        assert_eq!(r.mount_path("/.spillway-private/c1/x"), None);
        assert_eq!(r.mount_path("/.spillway-private/c0x/y"), None);
        assert_eq!(r.mount_path("/x"), None);
        assert_eq!(r.mount_path("/"), None);
        assert_eq!(MountRoot::at(DIR, "/p/"), MountRoot::at(DIR, "/p"));
    }

    #[test]
    fn root_dirs_are_plain_absolute_paths() {
        assert_eq!(parse_root_dir("/").unwrap(), Vec::<String>::new());
        assert_eq!(
            parse_root_dir("/.spillway-private//c0/").unwrap(),
            vec![".spillway-private".to_string(), "c0".to_string()]
        );
        for bad in ["", "rel", "/a/../b", "/a/./b", "/..", "/a\0b"] {
            assert!(parse_root_dir(bad).is_err(), "{bad:?}");
        }
        assert!(parse_root_dir(&format!("/{}", "n".repeat(MAX_NAME_LEN + 1))).is_err());
        assert!(parse_root_dir(&"/a".repeat(MAX_ROOT_DIR)).is_err());
    }
}
