//! A load-balanced instance is read-only to its clients (docs/cache.md §6): every
//! request that would change a name, an attribute or a byte answers EROFS. The FUSE
//! client mounts such an instance read-only, so its kernel refuses first; this is
//! what holds against a client that speaks the protocol itself with the instance's
//! credential. Peers (the stage coordinator, the manager) are not limited: a
//! stage-in is how the replicas are filled.
//!
//! The match is exhaustive on purpose: a request added to the protocol does not
//! compile here until someone decides whether it changes anything.

use spillway_wire::Request;

/// Whether `req` would change the instance.
pub(super) fn changes(req: &Request) -> bool {
    match req {
        Request::OpenReq(r) => {
            let access = r.flags & libc::O_ACCMODE as u32;
            access != libc::O_RDONLY as u32 || r.flags & libc::O_TRUNC as u32 != 0
        }
        Request::SetAttrReq(_)
        | Request::CreateReq(_)
        | Request::RemoveEntryReq(_)
        | Request::InsertEntryReq(_)
        | Request::RenameReq(_)
        | Request::CacheRemoveReq(_)
        | Request::CacheRenameReq(_)
        | Request::CacheTimesReq(_)
        | Request::LinkCountReq(_)
        | Request::TouchDirReq(_)
        | Request::SealDirReq(_)
        | Request::UnsealDirReq(_)
        | Request::ExtendSizeReq(_)
        | Request::SetLayoutReq(_)
        | Request::SetXattrReq(_)
        | Request::RemoveXattrReq(_)
        | Request::Write(..)
        | Request::WriteArenaReq(_)
        | Request::TruncateDataReq(_)
        | Request::DeleteDataReq(_)
        | Request::FallocateDataReq(_) => true,
        Request::HelloReq(_)
        | Request::FragmentCreateReq(_)
        | Request::FragmentDestroyReq(_)
        | Request::FragmentListReq(_)
        | Request::ServerStatusReq(_)
        | Request::StageStartReq(_)
        | Request::StageProgressReq(_)
        | Request::StageCancelReq(_)
        | Request::StageForgetReq(_)
        | Request::LookupReq(_)
        | Request::GetAttrReq(_)
        | Request::ReadDirReq(_)
        | Request::ReleaseReq(_)
        | Request::GetXattrReq(_)
        | Request::ListXattrReq(_)
        | Request::StatFsReq(_)
        | Request::SyncMetaReq(_)
        | Request::FragmentStatsReq(_)
        | Request::ReadLinkReq(_)
        | Request::GrantReleaseReq(_)
        | Request::WatchReq(_)
        | Request::NoticeDoneReq(_)
        | Request::NoticeWaitReq(_)
        | Request::Read(_)
        | Request::ReadInto(..)
        | Request::ArenaOfferReq(_)
        | Request::ReadArenaReq(_)
        | Request::SyncDataReq(_)
        | Request::StripeInfoReq(_)
        | Request::SeekDataReq(_)
        | Request::AllocReportReq(_)
        | Request::StageStripesReq(_)
        | Request::StageSyncReq(_)
        | Request::StageFilesReq(_)
        | Request::LockReq(_)
        | Request::GetLkReq(_)
        | Request::UnlockOwnerReq(_)
        | Request::LockRenewReq(_)
        | Request::CacheConfigReq(_)
        | Request::CacheResolveReq(_)
        | Request::CacheFlushReq(_)
        | Request::CacheStatusReq(_)
        | Request::CacheDropReq(_)
        | Request::CacheInodeReq(_)
        | Request::CacheAccessReq(_)
        | Request::LdbalConfigReq(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_types::InodeNo;
    use spillway_wire::{GetAttrReq, OpenReq};

    #[test]
    fn only_a_read_only_open_is_not_a_change() {
        let open = |flags: i32| {
            changes(&Request::OpenReq(OpenReq {
                ino: InodeNo(5),
                flags: flags as u32,
            }))
        };
        assert!(!open(libc::O_RDONLY));
        assert!(!open(libc::O_RDONLY | libc::O_NOATIME));
        assert!(open(libc::O_WRONLY));
        assert!(open(libc::O_RDWR));
        assert!(open(libc::O_RDONLY | libc::O_TRUNC));
        assert!(!changes(&Request::GetAttrReq(GetAttrReq {
            ino: InodeNo(5)
        })));
    }
}
