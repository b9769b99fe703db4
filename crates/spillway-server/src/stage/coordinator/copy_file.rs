//! One file or symlink the long way. Stage-in: open the PFS source as the owner,
//! create or truncate the instance file, have the servers copy its stripes, check the
//! source did not change, set size and times. Stage-out: check the instance file,
//! create the PFS temporary, have the servers copy into it, give it mode and times
//! (renamed into place after the group's sync, commit.rs).

use super::paths::base_of;
use super::Ctx;
use crate::stage::ns::{self, MAY_READ, MAY_WRITE};
use crate::stage::pfs::{fstat, unchanged_since, PfsStat};
use crate::stage::Failure;
use spillway_types::{Attr, Errno, FileKind, InodeNo};
use spillway_wire::{CreateReq, StageDir};

impl Ctx<'_> {
    /// PFS → instance, one regular file.
    pub(super) fn file_in(&self, src: &str, dst: &str) -> Result<u64, Failure> {
        let (file, st) = self.pfs.open_source(src)?;
        let parent = self.parent_dir(dst)?;
        let attr = self.create_or_truncate(&parent, base_of(dst), st.mode, dst)?;
        let r = self.copy_ranges(&attr, st.size, src, st.ino, dst, StageDir::In);
        let r = r.and_then(|()| {
            unchanged_since(&file, &st, src)?;
            self.set_size_and_times(&attr, &st, dst)
        });
        if r.is_err() && self.ldbal {
            // No client can remove what a failed copy left in a load-balanced
            // instance (it is read-only to them): its bytes are cut on every replica
            // here, so that a full instance is not kept full by a failed file.
            let mut cut = spillway_wire::SetAttrReq::of(attr.ino);
            cut.valid = spillway_wire::setattr::SIZE;
            cut.size = 0;
            if let Err(e) = self.inst.setattr(cut) {
                tracing::warn!("{dst}: freeing what a failed copy left: {e}");
            }
        }
        // The release is not waited for: nothing depends on its answer, and a release
        // lost with a broken connection is done by the server when the connection goes.
        if let Ok(ep) = self.inst.endpoint(attr.ino.home()) {
            drop(spillway_wire::OwnedCall::start(
                &ep,
                &spillway_wire::ReleaseReq { ino: attr.ino },
                Vec::new(),
            ));
        }
        r.map(|()| st.size)
    }

    /// Create the instance file (opened for this stage), or open and truncate the one
    /// that is there.
    pub(super) fn create_or_truncate(
        &self,
        parent: &Attr,
        name: &str,
        mode: u32,
        dst: &str,
    ) -> Result<Attr, Failure> {
        let req = CreateReq {
            stripe_size: parent.stripe_size,
            stripe_width: parent.stripe_width,
            open: true,
            ..self.create_req(parent, name, FileKind::Regular, mode)
        };
        // What replaces an existing file gets the mode a new one would.
        let mode = req.mode;
        // The directory's times are updated in parallel with the create (as the FUSE
        // client does): a create that fails changed nothing, the touch is harmless.
        let touch = self.inst.start_touch_dir(parent.ino, 0);
        let created = self.inst.create(req);
        if let Ok(t) = touch {
            let _ = t.wait();
        }
        match created {
            Ok(a) => Ok(a),
            Err(e) if e == Errno::EEXIST => {
                let a = self.existing(parent, name, dst)?;
                ns::regular_file(&a, || format!("{dst}: exists and is not a regular file"))?;
                ns::check_may(&a, &self.id, MAY_WRITE, dst, "write on the file")?;
                self.inst
                    .open(a.ino, 0)
                    .map_err(|e| ns::errno_failure(e, dst, "open"))?;
                let r = self
                    .inst
                    .setattr(crate::stage::replacing(&a, &self.id, mode));
                match r {
                    Ok(a) => Ok(a),
                    Err(e) => {
                        let _ = self.inst.release(a.ino);
                        Err(ns::errno_failure(e, dst, "truncate"))
                    }
                }
            }
            Err(e) => Err(ns::errno_failure(e, dst, "create")),
        }
    }

    pub(super) fn set_size_and_times(
        &self,
        a: &Attr,
        st: &PfsStat,
        dst: &str,
    ) -> Result<(), Failure> {
        self.inst
            .setattr(crate::stage::staged_size_and_times(a.ino, st))
            .map(|_| ())
            .map_err(|e| ns::errno_failure(e, dst, "setting the size and times"))
    }

    /// Instance → PFS, one regular file, written to the temporary `tmp` beside `dst`
    /// (put in place after the group's sync).
    pub(super) fn file_out(
        &self,
        src: &str,
        dst: &str,
        tmp: &str,
        ino: Option<InodeNo>,
    ) -> Result<u64, Failure> {
        let a = match ino {
            Some(i) => self
                .inst
                .getattr(i)
                .map_err(|e| ns::errno_failure(e, src, "getattr"))?,
            None => ns::resolve(&self.inst, &self.id, src)?,
        };
        ns::regular_file(&a, || format!("{src}: not a regular file"))?;
        ns::check_may(&a, &self.id, MAY_READ, src, "read on the file")?;
        // A directory or a FIFO there fails now, not after the copy.
        self.pfs.check_destination(dst)?;
        let file = self.pfs.create_temporary(tmp, a.mode & 0o7777)?;
        file.set_len(a.size)
            .map_err(|e| ns::errno_failure(Errno::from_io(&e), dst, "setting the size"))?;
        let pst = fstat(&file).map_err(|e| ns::errno_failure(Errno(e), dst, "fstat"))?;
        self.copy_ranges(&a, a.size, tmp, pst.ino, src, StageDir::Out)?;
        // Durable with the group's StageSync (syncfs of the PFS on every server of
        // the instance, this one included), not by an fsync per file; then renamed.
        self.pfs
            .set_file_attrs(&file, dst, a.mode, a.atime, a.mtime)?;
        Ok(a.size)
    }

    pub(super) fn symlink_in(&self, src: &str, dst: &str) -> Result<u64, Failure> {
        let target = self.pfs.read_link(src)?;
        let parent = self.parent_dir(dst)?;
        let name = base_of(dst);
        let req = CreateReq {
            target: target.clone(),
            ..self.create_req(&parent, name, FileKind::Symlink, 0o777)
        };
        match self.inst.create(req) {
            Ok(_) => {
                let _ = self.inst.touch_dir(parent.ino, 0);
                Ok(0)
            }
            Err(e) if e == Errno::EEXIST => {
                let a = self.existing(&parent, name, dst)?;
                let same = a.kind == FileKind::Symlink
                    && self.inst.read_link(a.ino).ok().as_deref() == Some(&target[..]);
                if same {
                    Ok(0)
                } else {
                    Err(Failure::new(
                        libc::EEXIST,
                        format!("{dst}: exists and is not the same symlink"),
                    ))
                }
            }
            Err(e) => Err(ns::errno_failure(e, dst, "symlink")),
        }
    }

    pub(super) fn symlink_out(
        &self,
        src: &str,
        dst: &str,
        ino: Option<InodeNo>,
    ) -> Result<u64, Failure> {
        let ino = match ino {
            Some(i) => i,
            None => ns::resolve(&self.inst, &self.id, src)?.ino,
        };
        let target = self
            .inst
            .read_link(ino)
            .map_err(|e| ns::errno_failure(e, src, "readlink"))?;
        self.pfs.symlink(&target, dst)?;
        Ok(0)
    }
}
