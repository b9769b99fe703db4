//! Small files in batches: each file that one server can stage alone (a stage-in
//! file of one stripe, a stage-out inode homed there) goes to that server in a
//! `StageFilesReq` (files.rs) with others of its kind; what the server leaves
//! (ELSEWHERE) is copied the long way.

use super::paths::base_of;
use super::{Ctx, Item};
use crate::stage::{ns, temp, Failure};
use spillway_types::tunables::MAX_STAGE_BATCH_FILES;
use spillway_types::{Errno, FileKind, InodeNo, ServerIndex};
use spillway_wire::{stage_file_outcome, StageFileSpec, StageFilesReq};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

impl Ctx<'_> {
    /// Hand the files a single server can stage alone to that server in batches
    /// (`StageFilesReq`, files.rs), the servers' batches interleaved so that all work
    /// from the start; everything else follows, one item at a time.
    pub(super) fn batch(&self, items: Vec<Item>) -> Vec<Item> {
        let per = self.t.stage_batch_files.clamp(1, MAX_STAGE_BATCH_FILES);
        let mut groups: BTreeMap<u16, Vec<(StageFileSpec, Item)>> = BTreeMap::new();
        let mut rest = Vec::new();
        for item in items {
            match self.batch_spec(&item) {
                Some((server, spec)) => groups.entry(server.0).or_default().push((spec, item)),
                None => rest.push(item),
            }
        }
        let mut chunks: Vec<VecDeque<Item>> = groups
            .into_iter()
            .map(|(server, files)| {
                let mut out = VecDeque::new();
                let mut files = files.into_iter().peekable();
                while files.peek().is_some() {
                    out.push_back(Item::Batch {
                        server: ServerIndex(server),
                        files: files.by_ref().take(per).collect(),
                    });
                }
                out
            })
            .collect();
        let mut out = Vec::new();
        while chunks.iter().any(|c| !c.is_empty()) {
            for c in chunks.iter_mut() {
                out.extend(c.pop_front());
            }
        }
        out.extend(rest);
        out
    }

    /// Which server could stage this file alone, and what to tell it: stage-in, the
    /// server of the new entry (a file no bigger than a stripe, as far as the walk
    /// saw); stage-out, the inode's home (the walk found the inode). `None`: the long
    /// way (including whenever the answer needs a lookup that may fail: the long way
    /// reports it).
    pub(super) fn batch_spec(&self, item: &Item) -> Option<(ServerIndex, StageFileSpec)> {
        let Item::File {
            src,
            dst,
            dw,
            ino,
            size,
        } = item
        else {
            return None;
        };
        if self.inbound() {
            // Every server of a load-balanced instance copies each file (ranges.rs).
            if self.ldbal {
                return None;
            }
            let parent = self.parent_dir(dst).ok()?;
            if size.is_some_and(|n| parent.stripe_size != 0 && n > u64::from(parent.stripe_size)) {
                return None;
            }
            let name = base_of(dst);
            if name.is_empty() {
                return None;
            }
            let (gid, _) = ns::new_owner(&parent, &self.id, FileKind::Regular, 0);
            let server = self.inst.dentry_home(parent.ino, name.as_bytes());
            Some((
                server,
                StageFileSpec {
                    parent: parent.ino,
                    name: name.as_bytes().to_vec(),
                    gid,
                    stripe_size: parent.stripe_size,
                    stripe_width: parent.stripe_width,
                    ino: InodeNo(0),
                    pfs_path: src.clone(),
                    shown: dw.clone(),
                },
            ))
        } else {
            let ino = (*ino)?;
            Some((
                ino.home(),
                StageFileSpec {
                    parent: InodeNo(0),
                    name: Vec::new(),
                    gid: 0,
                    stripe_size: 0,
                    stripe_width: 0,
                    ino,
                    // The server writes a temporary; the rename comes after the sync.
                    pfs_path: self.temp_for(dst),
                    shown: dw.clone(),
                },
            ))
        }
    }

    /// One batch: the server's answer per file; what it leaves goes the long way.
    pub(super) fn run_batch(&self, server: ServerIndex, files: Vec<(StageFileSpec, Item)>) {
        let (specs, items): (Vec<StageFileSpec>, Vec<Item>) = files.into_iter().unzip();
        let parents: BTreeSet<InodeNo> = specs.iter().map(|s| s.parent).collect();
        let req = StageFilesReq {
            direction: self.req.direction,
            ticket: self.req.ticket.clone(),
            files: specs,
        };
        let reply = self
            .inst
            .server(server)
            .and_then(|ep| ep.call(&req))
            .and_then(|r| {
                if r.results.len() == items.len() {
                    Ok(r.results)
                } else {
                    Err(Errno::EPROTO)
                }
            });
        let results = match reply {
            Ok(r) => r,
            Err(e) => {
                for (spec, item) in req.files.iter().zip(items) {
                    if !self.inbound() {
                        self.discard(&spec.pfs_path);
                    }
                    if let Some(dw) = item.dw() {
                        let shown = temp::shown(&spec.pfs_path);
                        let f = self.server_failure(server.0, e, dw, &shown);
                        self.run.file_failed(dw.to_string(), &f);
                    }
                }
                return;
            }
        };
        let mut created = false;
        for ((res, item), spec) in results.into_iter().zip(items).zip(&req.files) {
            // Stage-out: the temporary the server wrote, and where it goes.
            let place = match &item {
                Item::File { dst, .. } if !self.inbound() => {
                    Some((spec.pfs_path.clone(), dst.clone()))
                }
                _ => None,
            };
            match res.outcome {
                stage_file_outcome::DONE => {
                    created = true;
                    self.run.add_bytes(res.bytes);
                    if let Some(dw) = item.dw() {
                        self.copied_file(dw.to_string(), res.bytes, place);
                    }
                }
                stage_file_outcome::FAILED => {
                    if let Some((tmp, _)) = &place {
                        self.discard(tmp);
                    }
                    if let Some(dw) = item.dw() {
                        let f = Failure::new(res.errno, res.message);
                        self.run.file_failed(dw.to_string(), &f);
                    }
                }
                _ => {
                    // Untouched (ELSEWHERE): the long way makes a temporary of its own.
                    if let Some((tmp, _)) = &place {
                        self.temps().remove(tmp);
                    }
                    self.one(item)
                }
            }
        }
        // The directories' times change with their new entries (as for one create).
        if created && self.inbound() {
            for p in parents {
                let _ = self.inst.touch_dir(p, 0);
            }
        }
    }
}
