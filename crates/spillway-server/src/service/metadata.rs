//! The metadata requests whose wire form says more than the store's types can hold
//! (flag words, valid bits, `open`): each turns its request into store arguments
//! (`convert.rs`), calls the store and builds the reply. A flag value the protocol
//! does not define is refused with EINVAL, after the checks that answered first when
//! the store still read the flags itself (a bad name, a missing inode or entry), so
//! that every request gets the errno it always got.

use crate::error::{fs, StoreResult};
use crate::meta::{AttrChange, NewNode};
use crate::names::{check_name, check_xattr_name, check_xattr_value};
use crate::service::convert;
use crate::service::session::InstanceSession;
use spillway_types::{Attr, Errno, FileKind};
use spillway_wire::{
    CreateReq, EntryRef, InsertEntryReply, InsertEntryReq, RemoveEntryReply, RemoveEntryReq,
    RenameReply, RenameReq, SetAttrReq, SetXattrReq,
};
use std::sync::atomic::Ordering;

pub(super) fn set_attr(s: &InstanceSession, r: &SetAttrReq) -> StoreResult<Attr> {
    let f = &*s.fragment;
    if convert::setattr_has_unknown_bits(r.valid) {
        // Refused whole rather than half applied; a missing inode answers first.
        f.meta.get_attr(r.ino)?;
        return Err(fs(Errno::EINVAL));
    }
    f.set_attr(r.ino, &AttrChange::from(r))
}

/// Create, and open for this session when asked.
pub(super) fn create(s: &InstanceSession, r: CreateReq) -> StoreResult<Attr> {
    let f = &*s.fragment;
    let open = r.open;
    let a = f.meta.create(&NewNode::from(r), f.home())?;
    if a.kind == FileKind::Regular {
        f.stats.files_created.fetch_add(1, Ordering::Relaxed);
    }
    if open {
        s.open(a.ino)
    } else {
        Ok(a)
    }
}

pub(super) fn remove_entry(
    s: &InstanceSession,
    r: &RemoveEntryReq,
) -> StoreResult<RemoveEntryReply> {
    let f = &*s.fragment;
    let Some(wanted) = convert::expect(r.want) else {
        // A bad name or a missing entry answers first.
        f.meta.lookup(r.parent, &r.name, f.index())?;
        return Err(fs(Errno::EINVAL));
    };
    let removed = f.meta.remove_entry(r.parent, &r.name, wanted)?;
    Ok(RemoveEntryReply {
        removed: removed.into(),
    })
}

pub(super) fn insert_entry(
    s: &InstanceSession,
    r: &InsertEntryReq,
) -> StoreResult<InsertEntryReply> {
    let replaced =
        s.fragment
            .meta
            .insert_entry(r.parent, &r.name, &(&r.entry).into(), r.replace)?;
    Ok(InsertEntryReply {
        replaced: replaced.map(EntryRef::from),
    })
}

pub(super) fn rename(s: &InstanceSession, r: &RenameReq) -> StoreResult<RenameReply> {
    let Some(mode) = convert::rename_mode(r.flags) else {
        // Bad names answer first.
        check_name(&r.old_name)?;
        check_name(&r.new_name)?;
        return Err(fs(Errno::EINVAL));
    };
    let renamed =
        s.fragment
            .meta
            .rename(r.old_parent, &r.old_name, r.new_parent, &r.new_name, mode)?;
    Ok(renamed.into())
}

pub(super) fn set_xattr(s: &InstanceSession, r: &SetXattrReq) -> StoreResult<()> {
    let Some(how) = convert::xattr_mode(r.flags) else {
        // A bad name or value answers first.
        check_xattr_name(&r.name)?;
        check_xattr_value(&r.value)?;
        return Err(fs(Errno::EINVAL));
    };
    s.fragment.meta.set_xattr(r.ino, &r.name, &r.value, how)
}
