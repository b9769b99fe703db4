//! Requests on a fragment that caches a PFS directory (docs/cache.md). Names and
//! attributes are the PFS's, answered by the namespace server (the instance's server 0,
//! `cache::pfsns`); data requests go to the stripe files as for scratch, bracketed by
//! the cache's state (`cache::stripes`): a read of what is not cached fetches it from
//! the PFS first, a write is logged for write-behind. The match is exhaustive, as in
//! dispatch.rs: a request added to the protocol does not compile here until a cache
//! answers it.

use crate::cache::pfsns::{By, PfsNamespace};
use crate::cache::wblog::LogTimes;
use crate::error::{fs, StoreError, StoreResult};
use crate::fragment::cache::CacheState;
use crate::meta::{AttrChange, NewNode, SizeChange, TimeChange};
use crate::service::convert;
use crate::service::session::InstanceSession;
use spillway_types::{Errno, FileKind, Timespec};
use spillway_wire::serve::Reply;
use spillway_wire::{
    AttrReply, BytesReply, CacheAccessReply, CacheDropReply, CacheInodeReply, CacheResolveReply,
    CacheStatusReply, Empty, InsertEntryReply, LookupReply, NamesReply, ReadArenaReply,
    ReadDirReply, RemoveEntryReply, Request, StatFsReply, StripeInfoReply,
};
use std::time::Instant;

/// A request on a client or peer session of a cache fragment.
pub(super) fn instance(s: &InstanceSession, c: &CacheState, req: Request) -> StoreResult<Reply> {
    let f = &*s.fragment;
    let empty = || Reply::of(&Empty {});
    let attr = |attr| Reply::of(&AttrReply { attr });
    // Names live on the namespace server alone: another server asked for one was sent
    // there by mistake (no client does).
    let ns = || c.ns.as_ref().ok_or(fs(Errno::ESTALE));
    // Removals and renames: a file open here loses its last name to a hidden one
    // (pfsns/hidden.rs); with a caller, they are made as the caller.
    let is_open = |ino| f.is_open(ino);
    let by = |caller| By {
        caller,
        open: Some(&is_open),
    };
    Ok(match req {
        Request::HelloReq(_) => return Err(fs(Errno::EPROTO)),
        Request::FragmentCreateReq(_)
        | Request::FragmentDestroyReq(_)
        | Request::FragmentListReq(_)
        | Request::ServerStatusReq(_)
        | Request::StageStartReq(_)
        | Request::StageProgressReq(_)
        | Request::StageCancelReq(_)
        | Request::StageForgetReq(_) => return Err(fs(Errno::EPERM)),
        // ---- metadata: the PFS directory's, on the namespace server
        n @ (Request::WatchReq(_) | Request::NoticeDoneReq(_) | Request::NoticeWaitReq(_)) => {
            super::notices::notice_request(s, n)?
        }
        Request::LookupReq(r) => Reply::of(&LookupReply::from(ns()?.lookup(r.parent, &r.name)?)),
        Request::GetAttrReq(r) => attr(ns()?.get_attr(r.ino)?),
        Request::SetAttrReq(r) => {
            if convert::setattr_has_unknown_bits(r.valid) {
                ns()?.get_attr(r.ino)?;
                return Err(fs(Errno::EINVAL));
            }
            let a = set_attr(s, c, ns()?, &AttrChange::from(&r), r.ino)?;
            attr(super::notices::size_told(s, &r, a))
        }
        Request::CreateReq(r) => {
            let open = r.open;
            let a = ns()?.create(&NewNode::from(r))?;
            if open {
                attr(s.open(a.ino)?)
            } else {
                attr(a)
            }
        }
        Request::RemoveEntryReq(r) => {
            let Some(wanted) = convert::expect(r.want) else {
                ns()?.lookup(r.parent, &r.name)?;
                return Err(fs(Errno::EINVAL));
            };
            let by = by(None);
            let removed = ns()?.remove_entry(r.parent, &r.name, wanted, &by)?;
            Reply::of(&RemoveEntryReply {
                removed: removed.into(),
            })
        }
        // The same, made on the PFS as the caller (cache/reach.rs has why).
        Request::CacheRemoveReq(r) => {
            let caller = convert::caller(&r.caller)?;
            let Some(wanted) = convert::expect(r.want) else {
                ns()?.lookup(r.parent, &r.name)?;
                return Err(fs(Errno::EINVAL));
            };
            let by = by(Some(&caller));
            let removed = ns()?.remove_entry(r.parent, &r.name, wanted, &by)?;
            Reply::of(&RemoveEntryReply {
                removed: removed.into(),
            })
        }
        Request::InsertEntryReq(r) => {
            let replaced = ns()?.insert_entry(r.parent, &r.name, &(&r.entry).into(), r.replace)?;
            Reply::of(&InsertEntryReply {
                replaced: replaced.map(Into::into),
            })
        }
        Request::RenameReq(r) => {
            let Some(mode) = convert::rename_mode(r.flags) else {
                crate::names::check_name(&r.old_name)?;
                crate::names::check_name(&r.new_name)?;
                return Err(fs(Errno::EINVAL));
            };
            let by = by(None);
            let (op, np) = (r.old_parent, r.new_parent);
            let renamed = ns()?.rename(op, &r.old_name, np, &r.new_name, mode, &by)?;
            Reply::of(&spillway_wire::RenameReply::from(renamed))
        }
        Request::CacheRenameReq(r) => {
            let caller = convert::caller(&r.caller)?;
            let Some(mode) = convert::rename_mode(r.flags) else {
                crate::names::check_name(&r.old_name)?;
                crate::names::check_name(&r.new_name)?;
                return Err(fs(Errno::EINVAL));
            };
            let (op, np) = (r.old_parent, r.new_parent);
            let by = by(Some(&caller));
            let renamed = ns()?.rename(op, &r.old_name, np, &r.new_name, mode, &by)?;
            Reply::of(&spillway_wire::RenameReply::from(renamed))
        }
        // May this caller reach the cached directory on the PFS (cache/reach.rs)?
        Request::CacheAccessReq(r) => {
            let reach = c.reach.as_ref().ok_or(fs(Errno::ESTALE))?;
            reach.check(&convert::caller(&r.caller)?)?;
            Reply::of(&CacheAccessReply {
                open_to_all: reach.open_to_all(),
            })
        }
        Request::LinkCountReq(r) => {
            let a = ns()?.link_count(r.ino, r.delta)?;
            if a.nlink == 0 && a.kind == FileKind::Regular {
                f.cache_unlinked(r.ino);
            }
            attr(a)
        }
        Request::TouchDirReq(r) => attr(ns()?.touch_dir(r.ino, r.nlink_delta)?),
        // The PFS keeps a directory being removed or replaced empty itself (rmdir and
        // rename answer ENOTEMPTY), so there is nothing to seal.
        Request::SealDirReq(_) | Request::UnsealDirReq(_) => empty(),
        Request::ReadDirReq(r) => match &c.ns {
            Some(ns) => Reply::of(&ReadDirReply::from(
                ns.read_dir(r.dir, &r.after, r.max, r.plus)?,
            )),
            // No entries here.
            None => Reply::of(&ReadDirReply {
                entries: Vec::new(),
                more: false,
            }),
        },
        // Coherence with the PFS (docs/cache.md section 7) before the open is counted.
        // A CreateReq that opens needs none: its file is new, nothing of it is cached.
        Request::OpenReq(r) => {
            f.cache_open_check(c, r.ino)?;
            attr(s.open(r.ino)?)
        }
        Request::ReleaseReq(r) => {
            s.release(r.ino);
            empty()
        }
        Request::ExtendSizeReq(r) => {
            let (before, a) = ns()?.extend_size_from(r.ino, r.size, r.touch)?;
            if r.touch {
                // A write after times were set voids them (stripes/mtime.rs).
                f.cache_written(c, r.ino, a.mtime);
            }
            Reply::of(&super::notices::extended(s, before, a))
        }
        Request::SetLayoutReq(r) => {
            c.resolver.forget(r.ino);
            attr(ns()?.set_layout(r.ino, r.stripe_size, r.stripe_width)?)
        }
        Request::SetXattrReq(r) => {
            let Some(how) = convert::xattr_mode(r.flags) else {
                crate::names::check_xattr_name(&r.name)?;
                crate::names::check_xattr_value(&r.value)?;
                return Err(fs(Errno::EINVAL));
            };
            ns()?.set_xattr(r.ino, &r.name, &r.value, how)?;
            empty()
        }
        Request::GetXattrReq(r) => Reply::of(&BytesReply {
            value: ns()?.get_xattr(r.ino, &r.name)?,
        }),
        Request::ListXattrReq(r) => Reply::of(&NamesReply {
            names: ns()?.list_xattrs(r.ino)?,
        }),
        Request::RemoveXattrReq(r) => {
            ns()?.remove_xattr(r.ino, &r.name)?;
            empty()
        }
        // Used: the dirty bytes only. Clean cached bytes are room (evicted when a
        // write needs it), so `df` shows a cache full only when its writes fill it.
        Request::StatFsReq(_) => Reply::of(&StatFsReply {
            capacity: f.data.capacity(),
            used: f.data.used().min(c.stripes.dirty_bytes()),
            inodes: match &c.ns {
                Some(ns) => ns.inode_count()?,
                None => 0,
            },
        }),
        // Names reach the PFS when they change: nothing waits here.
        Request::SyncMetaReq(_) => empty(),
        Request::FragmentStatsReq(_) => Reply::of(&f.stats_reply()?),
        Request::ReadLinkReq(r) => Reply::of(&BytesReply {
            value: ns()?.read_link(r.ino)?,
        }),
        // ---- data: the stripe files, cached from and written behind to the PFS
        Request::Write(r, bulk) => {
            let data = bulk.data();
            let len = u32::try_from(data.len()).map_err(|_| fs(Errno::EINVAL))?;
            let mut guard = c.stripes.begin_write(r.ino, r.stripe, r.offset, len);
            // A stream's write goes straight to the PFS file (stripes/stream.rs); the
            // space the client charged for it is not taken here.
            let written = match c.stripes.try_bypass(&f.resolving(c), &mut guard, data) {
                Some(n) => {
                    f.data
                        .release_grant(&s.grant, r.grant_epoch, u64::from(r.charged));
                    drop(guard);
                    n
                }
                None => {
                    let written = write_with_room(f, c, s, &r, data);
                    guard.finish(&written)?;
                    written?
                }
            };
            if r.sync {
                f.data.sync(r.ino)?;
                c.stripes.sync(&f.resolving(c), r.ino)?;
            }
            s.write_reply(written)
        }
        Request::GrantReleaseReq(r) => {
            f.data.release_grant(&s.grant, r.grant_epoch, r.bytes);
            empty()
        }
        Request::Read(r) => {
            let pfs = f.resolving(c);
            let pinned = c
                .stripes
                .prepare_read(&f.data, &pfs, r.ino, r.stripe, r.offset, r.len)?;
            let mut bytes = f.data.read(r.ino, r.stripe, r.offset, r.len)?;
            pinned.through_vec(&mut bytes)?;
            Reply::bulk(bytes)
        }
        Request::ReadInto(r, mut into) => {
            let pfs = f.resolving(c);
            let len = u32::try_from(into.as_mut_slice().len()).map_err(|_| fs(Errno::EINVAL))?;
            let pinned = c
                .stripes
                .prepare_read(&f.data, &pfs, r.ino, r.stripe, r.offset, len)?;
            let into = into.as_mut_slice();
            let got = f.data.read_into(r.ino, r.stripe, r.offset, into)?;
            let got = pinned.through(into, got as usize)?;
            Reply::of(&ReadArenaReply {
                len: u32::try_from(got).map_err(|_| fs(Errno::EINVAL))?,
            })
        }
        Request::ArenaOfferReq(_) | Request::WriteArenaReq(_) | Request::ReadArenaReq(_) => {
            return Err(fs(Errno::EPROTO))
        }
        Request::TruncateDataReq(r) => {
            // The stripes and their cached state together (the write-behind never
            // writes bytes past the new size).
            c.stripes.truncate(&f.data, r.ino, r.size, r.stripe_size)?;
            empty()
        }
        Request::SyncDataReq(r) => {
            f.data.sync(r.ino)?;
            c.stripes.sync(&f.resolving(c), r.ino)?;
            // `sync_to_pfs` is the client's next call (`CacheFlushReq` ON_FSYNC to the
            // namespace server, which asks every server of the layout).
            empty()
        }
        Request::DeleteDataReq(r) => {
            c.stripes.delete(&f.data, r.ino)?;
            c.resolver.forget(r.ino);
            empty()
        }
        Request::StripeInfoReq(r) => Reply::of(&StripeInfoReply {
            stripes: f.data.stripe_info(r.ino),
        }),
        // A hole in a stripe file may be data not fetched yet: holes are not
        // reported, and space is not preallocated, in a cache.
        Request::FallocateDataReq(_) => return Err(fs(Errno::EOPNOTSUPP)),
        Request::SeekDataReq(r) => Reply::of(&spillway_wire::SeekDataReply {
            found: if r.hole {
                Some(r.end)
            } else {
                (r.offset < r.end).then_some(r.offset)
            },
        }),
        // The namespace's block counts are the PFS's own.
        Request::AllocReportReq(_) => empty(),
        // A cache's data moves on demand: it is never staged.
        Request::StageStripesReq(_) | Request::StageSyncReq(_) | Request::StageFilesReq(_) => {
            return Err(fs(Errno::EOPNOTSUPP))
        }
        // ---- locks (crate::locks), held for this session, as for scratch
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
        // ---- the cache's own
        Request::CacheConfigReq(r) if s.peer => {
            f.configure_cache(&r)?;
            empty()
        }
        Request::CacheResolveReq(r) if s.peer => {
            let x = ns()?.resolve(r.ino)?;
            Reply::of(&CacheResolveReply {
                handle_type: x.handle_type,
                handle: x.handle,
                uid: x.uid,
                gid: x.gid,
                stripe_size: x.stripe_size,
                stripe_width: x.stripe_width,
            })
        }
        // Coherence at open, asked by the namespace server (cache/coherence.rs).
        Request::CacheInodeReq(r) if s.peer => Reply::of(&CacheInodeReply::from(
            c.stripes.inode_status(&f.data, r.ino),
        )),
        Request::CacheDropReq(r) if s.peer => Reply::of(&CacheDropReply {
            kept: !c.stripes.drop_clean(&f.data, r.ino)?,
        }),
        Request::CacheConfigReq(_)
        | Request::CacheResolveReq(_)
        | Request::CacheInodeReq(_)
        | Request::CacheDropReq(_) => return Err(fs(Errno::EPERM)),
        Request::CacheFlushReq(r) => f.cache_flush(c, r.ino, r.scope).map(|()| empty())?,
        // Times set on a file, from the namespace server (stripes/mtime.rs).
        Request::CacheTimesReq(r) if s.peer => {
            c.stripes.set_times(r.ino, LogTimes::from(&r))?;
            empty()
        }
        Request::CacheTimesReq(_) => return Err(fs(Errno::EPERM)),
        // Made load-balanced before it became a cache, or never (replicas.rs).
        Request::LdbalConfigReq(_) if s.peer => f.configure_ldbal().map(|()| empty())?,
        Request::LdbalConfigReq(_) => return Err(fs(Errno::EPERM)),
        Request::CacheStatusReq(_) => Reply::of(&CacheStatusReply {
            dirty_bytes: c.stripes.dirty_bytes(),
            dirty_files: c.stripes.dirty_inodes().len() as u64,
        }),
    })
}

/// A client's write into its stripe file, all of it: where the fragment is full (the
/// data store fits only a prefix, or nothing), the cache makes room (clean stripes
/// evicted, dirty ones written behind: `CacheStripes::make_room`) and the rest is
/// written, within the fragment's `cache_room_wait`. A short count or ENOSPC only when
/// no room came in that time (the fragment full of data the PFS did not take): an
/// application does not retry a short write.
fn write_with_room(
    f: &crate::fragment::Fragment,
    c: &CacheState,
    s: &InstanceSession,
    r: &spillway_wire::WriteReq,
    data: &[u8],
) -> StoreResult<u32> {
    let len = u32::try_from(data.len()).map_err(|_| fs(Errno::EINVAL))?;
    if len == 0 {
        return s.write_stripe(r, data);
    }
    let mut part = r.clone();
    let mut done = 0u32;
    let mut deadline = None;
    loop {
        let at = done as usize;
        match s.write_stripe(&part, &data[at..]) {
            Ok(n) => {
                done += n;
                if done >= len {
                    return Ok(done);
                }
            }
            Err(e) if is_full_error(&e) => {}
            // What was written stands (its range is dirty): a short count.
            Err(_) if done > 0 => return Ok(done),
            Err(e) => return Err(e),
        }
        // The grant paid for the first try only; the rest claims unpromised space.
        part.offset = r.offset + done;
        part.charged = 0;
        let by = *deadline.get_or_insert_with(|| Instant::now() + c.stripes.room_wait());
        // Past the deadline no more tries, even if room was reported (bounded always).
        if !f.cache_make_room(c, u64::from(len - done), by) || Instant::now() >= by {
            return if done > 0 {
                Ok(done)
            } else {
                Err(fs(Errno::ENOSPC))
            };
        }
    }
}

/// The fragment (or the disk under it) has no room for the write.
fn is_full_error(e: &StoreError) -> bool {
    match e {
        StoreError::Fs(e) => *e == Errno::ENOSPC,
        StoreError::Full(_) => true,
        StoreError::Io(e) => e.raw_os_error() == Some(libc::ENOSPC),
        _ => false,
    }
}

/// SetAttr of a cached file: a size change cuts the cached stripes on every server
/// first (so write-behind never writes bytes past the new size), then the PFS file.
/// A change of times is first given to every server of the file's layout, which keep
/// it while they hold writes of the file not yet on the PFS and leave it on the PFS
/// file after each write-behind of them (`CacheTimesReq`, stripes/mtime.rs), then set
/// on the PFS file: a write-behind landing after the times were set would otherwise
/// move the mtime to its own time, and `tar -x`, `cp -p`, `rsync -a` would lose the
/// times they set (issue 30, item 14; docs/cache.md "File times"). "Now" is this
/// server's clock, read once, so that the servers and the PFS keep the same time.
fn set_attr(
    s: &InstanceSession,
    c: &CacheState,
    ns: &PfsNamespace,
    ch: &AttrChange,
    ino: spillway_types::InodeNo,
) -> StoreResult<spillway_types::Attr> {
    let mut ch = *ch;
    let ch = &mut ch;
    if let Some(SizeChange::Set(size)) = ch.size {
        let a = ns.get_attr(ino)?;
        if a.kind == FileKind::Regular {
            s.fragment.cache_truncate(c, &a, size)?;
        }
    }
    if ch.atime.is_some() || ch.mtime.is_some() {
        let now = Timespec::now();
        let at = |t: &mut Option<TimeChange>| {
            if let Some(TimeChange::Now) = t {
                *t = Some(TimeChange::At(now));
            }
            match t {
                Some(TimeChange::At(t)) => Some(*t),
                _ => None,
            }
        };
        let times = LogTimes {
            atime: at(&mut ch.atime),
            mtime: at(&mut ch.mtime),
            set_at: now,
            void: false,
        };
        // A no-op for what is not a regular file (cache_times looks).
        s.fragment.cache_times(c, ino, &times)?;
    }
    ns.set_attr(ino, ch)
}
