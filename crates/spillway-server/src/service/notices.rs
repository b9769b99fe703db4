//! The requests of change notices (crate::notices) and the changes that send them,
//! the same on scratch and cache instances (dispatch.rs, cache.rs).

use super::session::InstanceSession;
use crate::error::{fs, StoreResult};
use crate::notices::Sent;
use spillway_types::{Attr, Errno};
use spillway_wire::messages::setattr;
use spillway_wire::serve::Reply;
use spillway_wire::{Empty, ExtendSizeReply, Request, SetAttrReq};

/// The requests of notices (crate::notices), the same on every kind of instance.
pub(super) fn notice_request(s: &InstanceSession, req: Request) -> StoreResult<Reply> {
    let f = &*s.fragment;
    match req {
        Request::WatchReq(_) => s.watch()?,
        Request::NoticeDoneReq(r) => f.notices.done(s.mount, s.lock_id, r.id),
        Request::NoticeWaitReq(r) => s.wait_told(Sent {
            first: r.first,
            count: r.count,
        }),
        _ => return Err(fs(Errno::EPROTO)),
    }
    Ok(Reply::of(&Empty {}))
}

/// The answer to an ExtendSize that took the file from `before` to `a`: a change
/// (written bytes, a longer file) is told to the other mounts holding the file open,
/// and the writer told which notices to wait for.
pub(super) fn extended(s: &InstanceSession, before: Attr, a: Attr) -> ExtendSizeReply {
    let changed = a.size != before.size || a.mtime != before.mtime;
    let mut reply = ExtendSizeReply::of(before, a);
    if changed {
        let sent = s.changed(&reply.attr);
        reply.notice_first = sent.first;
        reply.notices = sent.count;
    }
    reply
}

/// A SetAttr that set the size (a truncate, from any mount) is told to the other mounts
/// holding the file open before it is answered: it runs on a worker, which may wait.
pub(super) fn size_told(s: &InstanceSession, r: &SetAttrReq, a: Attr) -> Attr {
    if r.valid & setattr::SIZE != 0 {
        s.wait_told(s.changed(&a));
    }
    a
}
