//! The metadata store's own vocabulary: what its methods take and return. The store
//! does not speak the wire (as fuser's `Filesystem` never sees `fuse_setattr_in`):
//! flag words and valid-bit masks arrive here already turned into enums and `Option`s,
//! by the service boundary (`service/convert.rs`), which also turns these back into
//! replies. A request the protocol cannot express as one of these is refused there.

use spillway_types::{Attr, FileKind, InodeNo, Timespec};

/// What a directory entry names: the inode and its kind (the kind lets a rename or a
/// readdir answer without asking the inode's home).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub ino: InodeNo,
    pub kind: FileKind,
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedEntry {
    pub name: Vec<u8>,
    pub entry: Entry,
}

/// A lookup's answer: the entry, and the attributes when this server is also the
/// inode's home.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub entry: Entry,
    pub attr: Option<Attr>,
}

/// One page of a directory listing; `more` when another page follows. `attrs` is
/// parallel to `entries` when the page was asked with attributes (READDIRPLUS): each
/// entry's inode attributes if this server homes it; empty otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirPage {
    pub entries: Vec<NamedEntry>,
    pub attrs: Vec<Option<Attr>>,
    pub more: bool,
}

/// What a rename moved, and the entry it replaced (or swapped with) if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renamed {
    pub moved: Entry,
    pub replaced: Option<Entry>,
}

/// The kind of entry a removal expects (unlink wants no directory, rmdir one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expect {
    Any,
    NotDir,
    Dir,
}

/// How a rename treats an existing destination (renameat2 semantics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RenameMode {
    /// Replace it (plain rename).
    Replace,
    /// Fail with EEXIST (RENAME_NOREPLACE).
    NoReplace,
    /// Swap the two entries; the destination must exist (RENAME_EXCHANGE).
    Exchange,
}

/// The conditions of a setxattr (the Linux flags as booleans; both set means the
/// attribute can never be set, as on Linux).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct XattrMode {
    /// Fail with EEXIST if the attribute exists (XATTR_CREATE).
    pub must_create: bool,
    /// Fail with ENODATA if it does not (XATTR_REPLACE).
    pub must_replace: bool,
    /// Setting the access ACL clears the set-group-ID bit (the caller is neither in
    /// the file's group nor has CAP_FSETID).
    pub acl_kill_sgid: bool,
}

/// An inode to create, homed here, and its entry `(parent, name)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NewNode {
    pub parent: InodeNo,
    pub name: Vec<u8>,
    pub kind: FileKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    /// Symlink target (ignored for other kinds).
    pub target: Vec<u8>,
    /// 0: the instance's default.
    pub stripe_size: u32,
    /// 0: all servers.
    pub stripe_width: u16,
    /// Extended attributes created with it (the inherited POSIX ACLs): (name, value).
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl NewNode {
    /// A node of `name` in `parent` owned by `uid`:`gid` with `mode`, and nothing else:
    /// no device, no target, the default stripe geometry, no extended attributes.
    pub(crate) fn new(
        parent: InodeNo,
        name: impl Into<Vec<u8>>,
        kind: FileKind,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> NewNode {
        NewNode {
            parent,
            name: name.into(),
            kind,
            mode,
            uid,
            gid,
            rdev: 0,
            target: Vec::new(),
            stripe_size: 0,
            stripe_width: 0,
            xattrs: Vec::new(),
        }
    }
}

/// A change of size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SizeChange {
    /// Truncate or extend to exactly this size (regular files only).
    Set(u64),
    /// Data up to this size was written: grow to it, never cut (a stage-in).
    AtLeast(u64),
}

/// A new value of a time stamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimeChange {
    /// The server's clock at the change.
    Now,
    At(Timespec),
}

/// A setattr: each field that is `Some` is changed. Any change also sets ctime to
/// now unless `ctime` gives it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AttrChange {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<SizeChange>,
    pub atime: Option<TimeChange>,
    pub mtime: Option<TimeChange>,
    pub ctime: Option<Timespec>,
    /// Clear set-user-ID, and set-group-ID with group execute, from the mode as it is
    /// then (`setattr::KILL_SUIDGID`).
    pub kill_suidgid: bool,
}

impl AttrChange {
    /// Whether this changes nothing (then not even ctime moves).
    pub(crate) fn is_empty(&self) -> bool {
        *self == AttrChange::default()
    }
}
