//! The directories of a stage: made (or found) before any file is copied, writable
//! for the owner while being filled, given their own modes and times at the end; and
//! the instance directory a stage-in name goes in.

use super::paths::{base_of, parent_of};
use super::{Ctx, Item};
use crate::stage::ns;
use crate::stage::Failure;
use spillway_types::{Attr, Errno, FileKind};
use spillway_wire::{setattr, CreateReq, SetAttrReq};
use std::collections::HashMap;
use std::sync::MutexGuard;

impl Ctx<'_> {
    pub(super) fn dirs(&self) -> MutexGuard<'_, HashMap<String, Attr>> {
        self.dirs.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn make_dir(&self, item: &Item) -> Result<(), Failure> {
        let Item::Dir { dst, mode, .. } = item else {
            return Ok(());
        };
        // Made writable for the owner while being filled (as cp does); the real mode
        // is set at the end.
        let working = mode | 0o700;
        if !self.inbound() {
            return self.pfs.mkdir(dst, working);
        }
        let parent = self.parent_dir(dst)?;
        let name = base_of(dst);
        let req = self.create_req(&parent, name, FileKind::Directory, working);
        let attr = match self.inst.create(req) {
            Ok(a) => {
                let _ = self.inst.touch_dir(parent.ino, 1);
                a
            }
            Err(e) if e == Errno::EEXIST => {
                let a = self.existing(&parent, name, dst)?;
                if a.kind != FileKind::Directory {
                    return Err(Failure::new(
                        libc::ENOTDIR,
                        format!("{dst}: exists and is not a directory"),
                    ));
                }
                ns::check_dir_writable(&a, &self.id, dst)?;
                a
            }
            Err(e) => return Err(ns::errno_failure(e, dst, "mkdir")),
        };
        self.dirs().insert(dst.clone(), attr);
        Ok(())
    }

    pub(super) fn finish_dir(&self, item: &Item) -> Result<(), Failure> {
        let Item::Dir {
            dst,
            mode,
            atime,
            mtime,
            ..
        } = item
        else {
            return Ok(());
        };
        if !self.inbound() {
            return self.pfs.set_dir_attrs(dst, *mode, *atime, *mtime);
        }
        let Some(a) = self.dirs().get(dst.as_str()).cloned() else {
            return Ok(());
        };
        // Only the owner may change modes and times (as utimensat/chmod would say).
        if a.uid != self.id.uid && self.id.uid != 0 {
            return Ok(());
        }
        let mode = (mode & 0o7777) | (a.mode & libc::S_ISGID);
        self.inst
            .setattr(SetAttrReq {
                valid: setattr::MODE | setattr::ATIME | setattr::MTIME,
                mode,
                atime: *atime,
                mtime: *mtime,
                ..SetAttrReq::of(a.ino)
            })
            .map(|_| ())
            .map_err(|e| ns::errno_failure(e, dst, "setting mode and times"))
    }

    /// The create of `name` in the instance directory `parent` as the owner, with the
    /// group (and for a directory the setgid bit) that `parent` passes on.
    pub(super) fn create_req(
        &self,
        parent: &Attr,
        name: &str,
        kind: FileKind,
        mode: u32,
    ) -> CreateReq {
        let (gid, mode) = ns::new_owner(parent, &self.id, kind, mode);
        CreateReq::new(parent.ino, name, kind, mode, self.id.uid, gid)
    }

    /// The entry `name` of `parent` that a create found there (EEXIST).
    pub(super) fn existing(&self, parent: &Attr, name: &str, dst: &str) -> Result<Attr, Failure> {
        self.inst
            .lookup(parent.ino, name.as_bytes())
            .map(|(_, a)| a)
            .map_err(|e| ns::errno_failure(e, dst, "lookup"))
    }

    /// The instance directory a stage-in name goes in (made by this stage, or looked
    /// up with the owner's permissions).
    pub(super) fn parent_dir(&self, dst: &str) -> Result<Attr, Failure> {
        let parent = parent_of(dst);
        if let Some(a) = self.dirs().get(parent.trim_end_matches('/')) {
            return Ok(a.clone());
        }
        let (p, _) = ns::resolve_parent(&self.inst, &self.id, dst)?;
        ns::check_dir_writable(&p, &self.id, dst)?;
        Ok(p)
    }
}
