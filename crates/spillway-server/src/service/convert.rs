//! The wire's metadata messages to and from the metadata store's own types
//! (`meta/types.rs`), at one boundary, as `error.rs` turns store errors into errnos at
//! one boundary: valid-bit masks become `Option`s, flag words become enums, and the
//! store's answers become replies. A flag or bit the protocol does not define has no
//! store type: the `*_mode`/`expect` parsers answer `None` and the handler refuses the
//! request (`dispatch.rs`).

use crate::meta::{
    AttrChange, DirPage, Entry, Expect, Found, NamedEntry, NewNode, RenameMode, Renamed,
    SizeChange, TimeChange, XattrMode,
};
use spillway_wire::{
    rename_flags, setattr, want, xattr_flags, CreateReq, DirEntry, EntryRef, LookupReply,
    ReadDirReply, RenameReply, SetAttrReq,
};

/// Every `SetAttrReq::valid` bit this server applies.
const SETATTR_KNOWN: u32 = setattr::MODE
    | setattr::UID
    | setattr::GID
    | setattr::SIZE
    | setattr::ATIME
    | setattr::MTIME
    | setattr::ATIME_NOW
    | setattr::MTIME_NOW
    | setattr::CTIME
    | setattr::SIZE_WRITTEN
    | setattr::KILL_SUIDGID;

/// Whether a SetAttr carries bits this server does not know: such a request is refused
/// whole rather than half applied.
pub(super) fn setattr_has_unknown_bits(valid: u32) -> bool {
    valid & !SETATTR_KNOWN != 0
}

impl From<&SetAttrReq> for AttrChange {
    /// The fields `valid` names (bits outside `SETATTR_KNOWN` are ignored: the handler
    /// refuses them first, `setattr_has_unknown_bits`). SIZE wins over SIZE_WRITTEN
    /// (with both, the size is set exactly); ATIME_NOW over ATIME, as the kernel sends
    /// them together; likewise for mtime.
    fn from(r: &SetAttrReq) -> AttrChange {
        let v = r.valid;
        let has = |bit: u32| v & bit != 0;
        let time = |now: u32, at: u32, t| {
            if has(now) {
                Some(TimeChange::Now)
            } else if has(at) {
                Some(TimeChange::At(t))
            } else {
                None
            }
        };
        AttrChange {
            mode: has(setattr::MODE).then_some(r.mode),
            uid: has(setattr::UID).then_some(r.uid),
            gid: has(setattr::GID).then_some(r.gid),
            size: if has(setattr::SIZE) {
                Some(SizeChange::Set(r.size))
            } else if has(setattr::SIZE_WRITTEN) {
                Some(SizeChange::AtLeast(r.size))
            } else {
                None
            },
            atime: time(setattr::ATIME_NOW, setattr::ATIME, r.atime),
            mtime: time(setattr::MTIME_NOW, setattr::MTIME, r.mtime),
            ctime: has(setattr::CTIME).then_some(r.ctime),
            kill_suidgid: has(setattr::KILL_SUIDGID),
        }
    }
}

impl From<CreateReq> for NewNode {
    /// Everything but `open`, which is the session's business, not the store's.
    fn from(r: CreateReq) -> NewNode {
        NewNode {
            parent: r.parent,
            name: r.name,
            kind: r.kind,
            mode: r.mode,
            uid: r.uid,
            gid: r.gid,
            rdev: r.rdev,
            target: r.target,
            stripe_size: r.stripe_size,
            stripe_width: r.stripe_width,
            xattrs: r.xattrs.into_iter().map(|x| (x.name, x.value)).collect(),
        }
    }
}

/// `RemoveEntryReq::want`; `None` for a value the protocol does not define.
pub(super) fn expect(w: u8) -> Option<Expect> {
    match w {
        want::ANY => Some(Expect::Any),
        want::NOT_DIR => Some(Expect::NotDir),
        want::DIR => Some(Expect::Dir),
        _ => None,
    }
}

/// `RenameReq::flags`; `None` for unknown bits or NOREPLACE with EXCHANGE (EINVAL, as
/// renameat2 answers).
pub(super) fn rename_mode(flags: u32) -> Option<RenameMode> {
    match flags {
        0 => Some(RenameMode::Replace),
        rename_flags::NOREPLACE => Some(RenameMode::NoReplace),
        rename_flags::EXCHANGE => Some(RenameMode::Exchange),
        _ => None,
    }
}

/// `SetXattrReq::flags`; `None` for unknown bits.
pub(super) fn xattr_mode(flags: u32) -> Option<XattrMode> {
    let known = xattr_flags::CREATE | xattr_flags::REPLACE | xattr_flags::ACL_KILL_SGID;
    (flags & !known == 0).then_some(XattrMode {
        must_create: flags & xattr_flags::CREATE != 0,
        must_replace: flags & xattr_flags::REPLACE != 0,
        acl_kill_sgid: flags & xattr_flags::ACL_KILL_SGID != 0,
    })
}

impl From<&EntryRef> for Entry {
    fn from(e: &EntryRef) -> Entry {
        Entry {
            ino: e.ino,
            kind: e.kind,
        }
    }
}

impl From<Entry> for EntryRef {
    fn from(e: Entry) -> EntryRef {
        EntryRef {
            ino: e.ino,
            kind: e.kind,
        }
    }
}

impl From<Found> for LookupReply {
    fn from(f: Found) -> LookupReply {
        LookupReply {
            entry: f.entry.into(),
            attr: f.attr,
        }
    }
}

impl From<Renamed> for RenameReply {
    fn from(r: Renamed) -> RenameReply {
        RenameReply {
            moved: r.moved.into(),
            replaced: r.replaced.map(EntryRef::from),
        }
    }
}

impl From<DirPage> for ReadDirReply {
    fn from(p: DirPage) -> ReadDirReply {
        let mut attrs = p.attrs.into_iter();
        ReadDirReply {
            entries: p
                .entries
                .into_iter()
                .map(|NamedEntry { name, entry }| DirEntry {
                    name,
                    entry: entry.into(),
                    attr: attrs.next().flatten(),
                })
                .collect(),
            more: p.more,
        }
    }
}

/// The identity a cache's namespace call is made as (`Caller`): the groups as sent,
/// at most Linux's NGROUPS_MAX of them (EINVAL beyond, as setgroups answers).
pub(super) fn caller(
    c: &spillway_wire::Caller,
) -> crate::error::StoreResult<spillway_types::identity::Identity> {
    if c.groups.len() > spillway_wire::MAX_CALLER_GROUPS {
        return Err(crate::error::fs(spillway_types::Errno::EINVAL));
    }
    Ok(spillway_types::identity::Identity {
        uid: c.uid,
        gid: c.gid,
        groups: c.groups.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_types::{InodeNo, Timespec};

    #[test]
    fn setattr_bits_become_options() {
        let t = Timespec { sec: 5, nsec: 6 };
        let r = SetAttrReq {
            valid: setattr::MODE | setattr::SIZE | setattr::SIZE_WRITTEN | setattr::MTIME,
            mode: 0o600,
            size: 7,
            mtime: t,
            ..SetAttrReq::of(InodeNo(3))
        };
        assert_eq!(
            AttrChange::from(&r),
            AttrChange {
                mode: Some(0o600),
                size: Some(SizeChange::Set(7)),
                mtime: Some(TimeChange::At(t)),
                ..AttrChange::default()
            }
        );
        let r = SetAttrReq {
            valid: setattr::ATIME | setattr::ATIME_NOW | setattr::CTIME | setattr::SIZE_WRITTEN,
            ..r
        };
        let c = AttrChange::from(&r);
        assert_eq!(
            (c.atime, c.ctime, c.size, c.mode),
            (
                Some(TimeChange::Now),
                Some(Timespec::default()),
                Some(SizeChange::AtLeast(7)),
                None
            )
        );
        assert!(AttrChange::from(&SetAttrReq::of(InodeNo(3))).is_empty());
        let kill = SetAttrReq {
            valid: setattr::KILL_SUIDGID,
            ..SetAttrReq::of(InodeNo(3))
        };
        assert!(AttrChange::from(&kill).kill_suidgid);
        assert!(!setattr_has_unknown_bits(SETATTR_KNOWN));
        assert!(setattr_has_unknown_bits(1 << 20));
    }

    #[test]
    fn flag_words_outside_the_protocol_have_no_store_type() {
        assert_eq!(rename_mode(3), None);
        assert_eq!(rename_mode(4), None);
        assert_eq!(
            rename_mode(rename_flags::EXCHANGE),
            Some(RenameMode::Exchange)
        );
        assert_eq!(xattr_mode(8), None);
        assert_eq!(
            xattr_mode(xattr_flags::CREATE | xattr_flags::REPLACE),
            Some(XattrMode {
                must_create: true,
                must_replace: true,
                acl_kill_sgid: false
            })
        );
        assert_eq!(expect(3), None);
        assert_eq!(expect(want::DIR), Some(Expect::Dir));
    }
}
