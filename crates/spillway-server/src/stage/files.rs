//! Whole small files staged by one server alone (`StageFilesReq`).
//!
//! Servers allocate inodes so that a file's first stripe lives with its attributes
//! (placement.md), and a new file's inode is allocated where its entry is. So a file
//! of one stripe is one server's business: for stage-in, the server holding the entry
//! creates it, fills the stripe from the PFS and sets size and times, all locally; for
//! stage-out, the inode's home reads attributes and stripe and writes the PFS file. The
//! coordinator sends such files in batches, one request per batch instead of four or
//! five per file. A file that turns out not to qualify (bigger than a stripe, an
//! existing entry or inode elsewhere, an old inode whose first stripe is elsewhere) is
//! answered ELSEWHERE with nothing changed, and the coordinator copies it the long way.
//!
//! The checks are those of the long way: the PFS is opened as the owner beneath the
//! roots; the byte count must be the size the source had when opened, and the source
//! must not change meanwhile; the owner must be allowed to write (replace) or read the
//! instance file. Durability comes after, from `StageSyncReq`.

use super::ns::{check_may, regular_file, MAY_READ, MAY_WRITE};
use super::pfs::{unchanged_since, Pfs, PfsStat};
use super::Failure;
use crate::error::{fs, StoreResult};
use crate::fragment::Fragment;
use crate::meta::{AttrChange, NewNode};
use spillway_placement::dentry_server;
use spillway_types::identity::Identity;
use spillway_types::tunables::MAX_STAGE_BATCH_FILES;
use spillway_types::{Attr, Errno, FileKind, StripeIndex};
use spillway_wire::{
    stage_file_outcome, StageDir, StageFileResult, StageFileSpec, StageFilesReply, StageFilesReq,
};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

pub(crate) fn files(f: &Fragment, r: &StageFilesReq) -> StoreResult<StageFilesReply> {
    // (An unknown direction does not decode: StageDir.)
    if r.files.len() > MAX_STAGE_BATCH_FILES {
        return Err(fs(Errno::EINVAL));
    }
    let grant = super::ticket::check(f, &r.ticket, None, r.direction, "StageFiles")
        .map_err(|e| fs(Errno(e.errno)))?;
    let id = grant.identity().clone();
    let pfs = grant.pfs;
    let outcomes = if r.direction == StageDir::In {
        batch_in(f, &pfs, &id, &r.files)
    } else {
        batch_out(f, &pfs, &id, &r.files)
    };
    let results = outcomes
        .into_iter()
        .map(|o| match o {
            Ok(Some(bytes)) => StageFileResult {
                outcome: stage_file_outcome::DONE,
                errno: 0,
                message: String::new(),
                bytes,
            },
            Ok(None) => StageFileResult {
                outcome: stage_file_outcome::ELSEWHERE,
                errno: 0,
                message: String::new(),
                bytes: 0,
            },
            Err(e) => StageFileResult {
                outcome: stage_file_outcome::FAILED,
                errno: e.errno,
                message: e.message,
                bytes: 0,
            },
        })
        .collect();
    Ok(StageFilesReply { results })
}

/// `DataStore::fill_from`'s `direct` for a small file's only stripe: buffered, made
/// durable with the batch's others by one syncfs instead of a synchronous write each.
const DIRECT: bool = false;

/// `Ok(None)`: not this server's to do alone (ELSEWHERE).
type Outcome = Result<Option<u64>, Failure>;

fn store_failure(e: crate::error::StoreError, shown: &str, doing: &str) -> Failure {
    super::ns::errno_failure(e.errno(), shown, doing)
}

fn first_stripe_here(f: &Fragment, a: &Attr) -> bool {
    f.layout(a.ino, a.stripe_size, a.stripe_width)
        .server_of(StripeIndex(0))
        == f.index()
}

/// Whether this server may stage a small file in alone: not in a load-balanced
/// instance, where every server must hold it (the coordinator's long way).
fn stage_in_alone(f: &Fragment, a: &Attr) -> bool {
    !f.ldbal() && first_stripe_here(f, a)
}

/// PFS → instance. In phases, so that the owner's identity is taken on once and the
/// metadata is written in two transactions for the whole batch: open every source
/// (as the owner); create every entry; fill each stripe and check it; set every size
/// and times.
fn batch_in(f: &Fragment, pfs: &Pfs, id: &Identity, specs: &[StageFileSpec]) -> Vec<Outcome> {
    let mut out: Vec<Option<Outcome>> = vec![None; specs.len()];
    let opened = match pfs.as_owner(|| {
        specs
            .iter()
            .map(|s| pfs.open_source(&s.pfs_path))
            .collect::<Vec<_>>()
    }) {
        Ok(v) => v,
        Err(e) => return vec![Err(e); specs.len()],
    };
    // Ask for every source's data now: the reads of the whole batch go to the disk
    // at once instead of one file at a time as each is copied.
    for (file, _) in opened.iter().flatten() {
        // SAFETY: the descriptor is open; the call only starts readahead.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED) };
    }
    let default_stripe = f.home().default_stripe_size;
    let mut todo = Vec::new();
    let mut creates = Vec::new();
    for (i, (s, o)) in specs.iter().zip(opened).enumerate() {
        let (file, st) = match o {
            Ok(x) => x,
            Err(e) => {
                out[i] = Some(Err(e));
                continue;
            }
        };
        let stripe_size = if s.stripe_size == 0 {
            default_stripe
        } else {
            s.stripe_size
        };
        let entry_here = dentry_server(s.parent, &s.name, f.config.count()) == f.index();
        if st.size > u64::from(stripe_size) || !entry_here {
            out[i] = Some(Ok(None));
            continue;
        }
        creates.push(NewNode {
            stripe_size,
            stripe_width: s.stripe_width,
            ..NewNode::new(
                s.parent,
                s.name.clone(),
                FileKind::Regular,
                st.mode & 0o7777,
                id.uid,
                s.gid,
            )
        });
        todo.push((i, file, st));
    }
    let created = match f.meta.create_many(&creates, f.home()) {
        Ok(v) => v,
        Err(e) => {
            let e = e.errno();
            for (i, _, _) in todo {
                out[i] = Some(Err(super::ns::errno_failure(e, &specs[i].shown, "create")));
            }
            return finish(out);
        }
    };
    let mut held = Vec::new();
    let mut sizes = Vec::new();
    let mut sized = Vec::new();
    for ((i, file, st), c) in todo.into_iter().zip(created) {
        let s = &specs[i];
        let attr = match c {
            Ok(a) => {
                f.stats.files_created.fetch_add(1, Ordering::Relaxed);
                a
            }
            Err(e) if e.errno() == Errno::EEXIST => match replaceable(f, id, s, &st) {
                Ok(Some(a)) => a,
                Ok(None) => {
                    out[i] = Some(Ok(None));
                    continue;
                }
                Err(e) => {
                    out[i] = Some(Err(e));
                    continue;
                }
            },
            Err(e) => {
                out[i] = Some(Err(store_failure(e, &s.shown, "create")));
                continue;
            }
        };
        if !stage_in_alone(f, &attr) {
            // A new inode always qualifies (placement.md); an old instance's may not.
            out[i] = Some(Ok(None));
            continue;
        }
        // Held open until sized: an unlink meanwhile must not purge it under us.
        if let Err(e) = f.open_inode(attr.ino) {
            out[i] = Some(Err(store_failure(e, &s.shown, "open")));
            continue;
        }
        held.push(attr.ino);
        match fill(f, &file, &st, &attr, s) {
            Ok(()) => {
                let change = AttrChange::from(&super::staged_size_and_times(attr.ino, &st));
                sizes.push((attr.ino, change));
                sized.push((i, st.size));
            }
            Err(e) => out[i] = Some(Err(e)),
        }
    }
    match f.meta.set_attr_many(&sizes) {
        Ok(rs) => {
            for ((i, size), r) in sized.into_iter().zip(rs) {
                out[i] =
                    Some(r.map(|_| Some(size)).map_err(|e| {
                        store_failure(e, &specs[i].shown, "setting the size and times")
                    }));
            }
        }
        Err(e) => {
            let e = e.errno();
            for (i, _) in sized {
                let why =
                    super::ns::errno_failure(e, &specs[i].shown, "setting the size and times");
                out[i] = Some(Err(why));
            }
        }
    }
    for ino in held {
        f.release(ino, 1);
    }
    finish(out)
}

/// Every file has its outcome by now; one that somehow has none is not claimed done.
fn finish(out: Vec<Option<Outcome>>) -> Vec<Outcome> {
    out.into_iter()
        .map(|o| o.unwrap_or_else(|| Err(Failure::new(libc::EIO, "no outcome (internal error)"))))
        .collect()
}

/// The existing entry of a stage-in, emptied for the new contents, when this server
/// holds all of it and the owner may write it; `None` when the long way must decide.
fn replaceable(
    f: &Fragment,
    id: &Identity,
    s: &StageFileSpec,
    st: &PfsStat,
) -> Result<Option<Attr>, Failure> {
    let found = f
        .meta
        .lookup(s.parent, &s.name, f.index())
        .map_err(|e| store_failure(e, &s.shown, "lookup"))?;
    let Some(a) = found.attr else {
        return Ok(None);
    };
    if a.kind != FileKind::Regular
        || !stage_in_alone(f, &a)
        || a.size > u64::from(a.stripe_size)
        || st.size > u64::from(a.stripe_size)
    {
        return Ok(None);
    }
    check_may(&a, id, MAY_WRITE, &s.shown, "write on the file")?;
    f.set_attr(a.ino, &AttrChange::from(&super::replacing(&a, id, st.mode)))
        .map(Some)
        .map_err(|e| store_failure(e, &s.shown, "truncate"))
}

/// Copy the source into the file's only stripe and check the byte count and that
/// the source did not change meanwhile.
fn fill(
    f: &Fragment,
    file: &std::fs::File,
    st: &PfsStat,
    attr: &Attr,
    s: &StageFileSpec,
) -> Result<(), Failure> {
    let src = &s.pfs_path;
    // Fits one stripe (checked), so fits u32.
    let len = st.size as u32;
    let n = f
        .data
        .fill_from(attr.ino, 0, 0, len, file, 0, DIRECT)
        .map_err(|e| store_failure(e, &s.shown, "copying from the PFS"))?;
    if n != st.size {
        return Err(Failure::new(
            libc::EIO,
            format!(
                "{src}: ended at byte {n} but held {} bytes when the stage opened it",
                st.size
            ),
        ));
    }
    unchanged_since(file, st, src)?;
    f.stats.stage_bytes_read.fetch_add(n, Ordering::Relaxed);
    Ok(())
}

/// Instance → PFS, in phases like `batch_in`: check every inode (here, one stripe,
/// readable by the owner); create every PFS file (as the owner); copy each stripe;
/// give every PFS file its mode and times (as the owner).
fn batch_out(f: &Fragment, pfs: &Pfs, id: &Identity, specs: &[StageFileSpec]) -> Vec<Outcome> {
    let mut out: Vec<Option<Outcome>> = vec![None; specs.len()];
    let mut todo = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        match staged_out_here(f, id, s) {
            Ok(Some(a)) => match f.open_inode(a.ino) {
                Ok(_) => todo.push((i, a)),
                Err(e) => out[i] = Some(Err(store_failure(e, &s.shown, "open"))),
            },
            Ok(None) => out[i] = Some(Ok(None)),
            Err(e) => out[i] = Some(Err(e)),
        }
    }
    // The coordinator names a temporary beside each destination (temp.rs): created
    // new (O_EXCL), renamed into place by the coordinator once durable. A plain path
    // (a peer of an older version) is created or truncated in place, as before.
    let created = pfs.as_owner(|| {
        todo.iter()
            .map(|(i, a)| {
                let p = &specs[*i].pfs_path;
                let (_, last) = super::temp::split(p);
                if super::temp::parse(last).is_some() {
                    pfs.create_temporary(p, a.mode & 0o7777)
                } else {
                    pfs.create_destination(p, a.mode & 0o7777)
                }
            })
            .collect::<Vec<_>>()
    });
    let created = match created {
        Ok(v) => v,
        Err(e) => todo.iter().map(|_| Err(e.clone())).collect(),
    };
    let mut copied = Vec::new();
    for ((i, a), file) in todo.iter().zip(created) {
        match file.and_then(|file| drain(f, a, &specs[*i], &file).map(|()| file)) {
            Ok(file) => copied.push((*i, a, file)),
            Err(e) => out[*i] = Some(Err(e)),
        }
    }
    let attrs = pfs.as_owner(|| {
        copied
            .iter()
            .map(|(i, a, file)| {
                pfs.set_file_attrs(file, &specs[*i].pfs_path, a.mode, a.atime, a.mtime)
                    .map(|()| Some(a.size))
            })
            .collect::<Vec<_>>()
    });
    match attrs {
        Ok(rs) => {
            for ((i, _, _), r) in copied.iter().zip(rs) {
                out[*i] = Some(r);
            }
        }
        Err(e) => {
            for (i, _, _) in &copied {
                out[*i] = Some(Err(e.clone()));
            }
        }
    }
    for (_, a) in &todo {
        f.release(a.ino, 1);
    }
    finish(out)
}

/// The inode of a stage-out when this server can stage it alone: homed here, its only
/// stripe here. Errors are the long way's (not a file, not readable by the owner).
fn staged_out_here(
    f: &Fragment,
    id: &Identity,
    s: &StageFileSpec,
) -> Result<Option<Attr>, Failure> {
    if s.ino.home() != f.index() {
        return Ok(None);
    }
    let a = f
        .meta
        .get_attr(s.ino)
        .map_err(|e| store_failure(e, &s.shown, "getattr"))?;
    regular_file(&a, || format!("{}: not a regular file", s.shown))?;
    check_may(&a, id, MAY_READ, &s.shown, "read on the file")?;
    if !first_stripe_here(f, &a) || a.size > u64::from(a.stripe_size) {
        return Ok(None);
    }
    Ok(Some(a))
}

/// Copy the only stripe into the (created, empty) PFS file; the rest up to the size
/// is a hole.
fn drain(f: &Fragment, a: &Attr, s: &StageFileSpec, file: &std::fs::File) -> Result<(), Failure> {
    let dst = &s.pfs_path;
    let n = f
        .data
        .drain_to(a.ino, 0, a.size, file, None, 0)
        .map_err(|e| store_failure(e, &s.shown, "copying to the PFS"))?;
    if n < a.size {
        file.set_len(a.size)
            .map_err(|e| super::ns::errno_failure(Errno::from_io(&e), dst, "setting the size"))?;
    }
    f.stats.stage_bytes_written.fetch_add(n, Ordering::Relaxed);
    Ok(())
}
