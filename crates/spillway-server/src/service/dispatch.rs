//! Requests to handlers. The instance match is exhaustive on purpose: a request added
//! to the protocol does not compile here until it is handled.

use crate::error::{fs, StoreResult};
use crate::registry::Registry;
use crate::service::metadata;
use crate::service::notices::{extended, notice_request, size_told};
use crate::service::session::InstanceSession;
use crate::stage::Stages;
use spillway_types::Errno;
use spillway_wire::serve::Reply;
use spillway_wire::{
    AttrReply, BytesReply, Empty, FragmentListReply, LookupReply, NamesReply, ReadArenaReply,
    ReadDirReply, Request, StatFsReply, StripeInfoReply,
};
use std::time::Instant;

/// A request on an admin session: fragment administration only.
pub(super) fn admin(registry: &Registry, stages: &Stages, req: Request) -> StoreResult<Reply> {
    match req {
        Request::FragmentCreateReq(r) => registry.create(&r).map(|()| Reply::of(&Empty {})),
        Request::FragmentDestroyReq(r) => {
            registry.destroy(r.instance).map(|()| Reply::of(&Empty {}))
        }
        Request::FragmentListReq(_) => Ok(Reply::of(&FragmentListReply {
            fragments: registry.list()?,
        })),
        Request::ServerStatusReq(_) => Ok(Reply::of(&registry.status()?)),
        Request::StageStartReq(r) => stages.start(registry, r).map(|()| Reply::of(&Empty {})),
        Request::StageProgressReq(r) => Ok(Reply::of(&stages.progress(&r))),
        Request::StageCancelReq(r) => stages.cancel(&r).map(|()| Reply::of(&Empty {})),
        Request::StageForgetReq(r) => stages.forget(&r).map(|()| Reply::of(&Empty {})),
        // Admin sessions hold no instance: no metadata or data requests.
        _ => Err(fs(Errno::EPERM)),
    }
}

/// A request on a client or peer session of one instance.
pub(super) fn instance(s: &InstanceSession, req: Request) -> StoreResult<Reply> {
    let f = &*s.fragment;
    if f.is_closed() {
        return Err(fs(Errno::ESTALE));
    }
    // A load-balanced instance's clients read only (service/readonly.rs).
    if f.ldbal() && !s.peer && crate::service::readonly::changes(&req) {
        return Err(fs(Errno::EROFS));
    }
    if let Some(c) = f.cache() {
        return crate::service::cache::instance(s, c, req);
    }
    let empty = || Reply::of(&Empty {});
    let attr = |attr| Reply::of(&AttrReply { attr });
    Ok(match req {
        Request::HelloReq(_) => return Err(fs(Errno::EPROTO)),
        Request::FragmentCreateReq(_)
        | Request::FragmentDestroyReq(_)
        | Request::FragmentListReq(_)
        | Request::ServerStatusReq(_)
        | Request::StageStartReq(_)
        | Request::StageProgressReq(_)
        | Request::StageCancelReq(_)
        | Request::StageForgetReq(_) => {
            return Err(fs(Errno::EPERM));
        }
        // ---- metadata
        Request::LookupReq(r) => Reply::of(&LookupReply::from(f.meta.lookup(
            r.parent,
            &r.name,
            f.index(),
        )?)),
        Request::GetAttrReq(r) => attr(f.meta.get_attr(r.ino)?),
        Request::SetAttrReq(r) => attr(size_told(s, &r, metadata::set_attr(s, &r)?)),
        Request::CreateReq(r) => attr(metadata::create(s, r)?),
        Request::RemoveEntryReq(r) => Reply::of(&metadata::remove_entry(s, &r)?),
        Request::InsertEntryReq(r) => Reply::of(&metadata::insert_entry(s, &r)?),
        Request::RenameReq(r) => Reply::of(&metadata::rename(s, &r)?),
        Request::LinkCountReq(r) => attr(f.link_count(r.ino, r.delta)?),
        Request::TouchDirReq(r) => attr(f.meta.touch_dir(r.ino, r.nlink_delta)?),
        Request::SealDirReq(r) => f.meta.seal_dir(r.ino).map(|()| empty())?,
        Request::UnsealDirReq(r) => f.meta.unseal_dir(r.ino).map(|()| empty())?,
        Request::ReadDirReq(r) => Reply::of(&ReadDirReply::from(f.meta.read_dir(
            r.dir,
            &r.after,
            r.max,
            r.plus.then(|| f.index()),
        )?)),
        n @ (Request::WatchReq(_) | Request::NoticeDoneReq(_) | Request::NoticeWaitReq(_)) => {
            notice_request(s, n)?
        }
        Request::OpenReq(r) => attr(s.open(r.ino)?),
        Request::ReleaseReq(r) => {
            s.release(r.ino);
            empty()
        }
        Request::ExtendSizeReq(r) => {
            let (before, a) = f.meta.extend_size_from(r.ino, r.size, r.touch)?;
            if r.sync {
                f.meta.sync()?;
            }
            Reply::of(&extended(s, before, a))
        }
        Request::SetLayoutReq(r) => {
            attr(
                f.meta
                    .set_layout(r.ino, r.stripe_size, r.stripe_width, f.home().count)?,
            )
        }
        Request::SetXattrReq(r) => metadata::set_xattr(s, &r).map(|()| empty())?,
        Request::GetXattrReq(r) => Reply::of(&BytesReply {
            value: f.meta.get_xattr(r.ino, &r.name)?,
        }),
        Request::ListXattrReq(r) => Reply::of(&NamesReply {
            names: f.meta.list_xattrs(r.ino)?,
        }),
        Request::RemoveXattrReq(r) => f.meta.remove_xattr(r.ino, &r.name).map(|()| empty())?,
        Request::StatFsReq(_) => Reply::of(&StatFsReply {
            capacity: f.data.capacity(),
            used: f.data.used(),
            inodes: f.meta.inode_count()?,
        }),
        Request::SyncMetaReq(_) => f.meta.sync().map(|()| empty())?,
        Request::FragmentStatsReq(_) => Reply::of(&f.stats_reply()?),
        Request::ReadLinkReq(r) => Reply::of(&BytesReply {
            value: f.meta.read_link(r.ino)?,
        }),
        // ---- data
        Request::Write(r, bulk) => {
            let written = s.write_stripe(&r, bulk.data())?;
            if r.sync {
                f.data.sync(r.ino)?;
            }
            s.write_reply(written)
        }
        Request::GrantReleaseReq(r) => {
            f.data.release_grant(&s.grant, r.grant_epoch, r.bytes);
            empty()
        }
        Request::Read(r) => Reply::bulk(f.data.read(r.ino, r.stripe, r.offset, r.len)?),
        Request::ReadInto(r, mut into) => Reply::of(&ReadArenaReply {
            len: f
                .data
                .read_into(r.ino, r.stripe, r.offset, into.as_mut_slice())?,
        }),
        // Turned into Write and ReadInto, or answered, by the wire layer (serve.rs).
        Request::ArenaOfferReq(_) | Request::WriteArenaReq(_) | Request::ReadArenaReq(_) => {
            return Err(fs(Errno::EPROTO))
        }
        Request::TruncateDataReq(r) => {
            f.data.truncate(r.ino, r.size, r.stripe_size)?;
            // Before the reply: the home's SetAttr answer then has the new st_blocks.
            f.report_after_change(r.ino);
            empty()
        }
        Request::SyncDataReq(r) => f.data.sync(r.ino).map(|()| empty())?,
        Request::DeleteDataReq(r) => f.data.delete(r.ino).map(|()| empty())?,
        Request::StripeInfoReq(r) => Reply::of(&StripeInfoReply {
            stripes: f.data.stripe_info(r.ino),
        }),
        Request::FallocateDataReq(r) => f.fallocate_data(&r).map(|()| empty())?,
        Request::SeekDataReq(r) => Reply::of(&spillway_wire::SeekDataReply {
            found: f.seek_data(&r)?,
        }),
        // Only the instance's servers report allocation (fragment/allocs.rs).
        Request::AllocReportReq(_) if !s.peer => return Err(fs(Errno::EPERM)),
        Request::AllocReportReq(r) => f.record_allocs(&r).map(|()| empty())?,
        // A client holding a capability must not make the server touch the PFS as
        // someone: stage copies are for the instance's own servers.
        Request::StageStripesReq(_) | Request::StageSyncReq(_) | Request::StageFilesReq(_)
            if !s.peer =>
        {
            return Err(fs(Errno::EPERM));
        }
        Request::StageFilesReq(r) => Reply::of(&crate::stage::files::files(f, &r)?),
        Request::StageStripesReq(r) => Reply::of(&crate::stage::copy::stripes(f, &r)?),
        Request::StageSyncReq(r) => crate::stage::copy::sync(f, &r).map(|()| empty())?,
        // ---- locks (crate::locks), held for this session
        Request::LockReq(r) => Reply::of(&spillway_wire::LockReply {
            held: f.locks.set(s.lock_id, &r, Instant::now()).map_err(fs)?,
        }),
        Request::GetLkReq(r) => Reply::of(&spillway_wire::GetLkReply {
            conflict: f.locks.test(s.lock_id, &r, Instant::now()).map_err(fs)?,
        }),
        Request::UnlockOwnerReq(r) => {
            f.locks.unlock_owner(s.lock_id, &r);
            empty()
        }
        Request::LockRenewReq(_) => Reply::of(&f.locks.renew(s.lock_id, Instant::now())),
        // ---- cache instances (service/cache.rs once configured)
        Request::CacheConfigReq(r) if s.peer => f.configure_cache(&r).map(|()| empty())?,
        Request::CacheConfigReq(_) => return Err(fs(Errno::EPERM)),
        Request::LdbalConfigReq(_) if s.peer => f.configure_ldbal().map(|()| empty())?,
        Request::LdbalConfigReq(_) => return Err(fs(Errno::EPERM)),
        // Not a cache: nothing to resolve, flush, check or drop.
        Request::CacheResolveReq(_)
        | Request::CacheFlushReq(_)
        | Request::CacheInodeReq(_)
        | Request::CacheDropReq(_)
        | Request::CacheAccessReq(_)
        | Request::CacheRemoveReq(_)
        | Request::CacheRenameReq(_)
        | Request::CacheTimesReq(_) => return Err(fs(Errno::EOPNOTSUPP)),
        Request::CacheStatusReq(_) => Reply::of(&spillway_wire::CacheStatusReply {
            dirty_bytes: 0,
            dirty_files: 0,
        }),
    })
}
