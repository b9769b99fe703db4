//! RENAME, with RENAME_NOREPLACE and RENAME_EXCHANGE. Both names' entries may live
//! on different servers: then the new name is added before the old one goes, so a
//! failure in between leaves an extra name rather than a lost file. Link counts and
//! the directories' times and subdirectory counts follow at their homes.

use super::lookup::check_name;
use super::{SpillwayFs, R};
use fuser::RenameFlags;
use spillway_types::{Errno, FileKind, InodeNo};
use spillway_wire::messages::{rename_flags, want, Caller, EntryRef};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

impl SpillwayFs {
    /// RENAME as the kernel sends it. This client's cached entries of both names go,
    /// whatever the outcome.
    /// On a cache instance the rename is made on the PFS as `caller`.
    pub(super) fn do_rename(
        &self,
        caller: Option<Caller>,
        (op, on): (InodeNo, &OsStr),
        (np, nn): (InodeNo, &OsStr),
        flags: RenameFlags,
    ) -> R<()> {
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return Err(Errno::EINVAL);
        }
        let mut f = 0;
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            f |= rename_flags::NOREPLACE;
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            f |= rename_flags::EXCHANGE;
        }
        let r = self.rename_names(caller, op, on, np, nn, f);
        self.t.forget_entry(op, on.as_bytes());
        self.t.forget_entry(np, nn.as_bytes());
        r
    }

    fn rename_names(
        &self,
        caller: Option<Caller>,
        op: InodeNo,
        on: &OsStr,
        np: InodeNo,
        nn: &OsStr,
        flags: u32,
    ) -> R<()> {
        let (on, nn) = (check_name(on)?, check_name(nn)?);
        let exchange = flags & rename_flags::EXCHANGE != 0;
        let noreplace = flags & rename_flags::NOREPLACE != 0;
        let src = self.inst.lookup_entry(op, on)?.ok_or(Errno::ENOENT)?;
        let dst = self.inst.lookup_entry(np, nn)?;
        if let Some(d) = &dst {
            if d.ino == src.ino {
                return Ok(()); // Both names are links to one inode: POSIX says do nothing.
            }
            if noreplace {
                return Err(Errno::EEXIST);
            }
            if !exchange {
                match (
                    src.kind == FileKind::Directory,
                    d.kind == FileKind::Directory,
                ) {
                    (true, false) => return Err(Errno::ENOTDIR),
                    (false, true) => return Err(Errno::EISDIR),
                    _ => {}
                }
            }
        } else if exchange {
            return Err(Errno::ENOENT);
        }
        // A directory being replaced must be empty on every server, and stay so.
        let sealed = match &dst {
            Some(d) if !exchange && d.kind == FileKind::Directory => {
                self.inst.seal_dir(d.ino)?;
                Some(d.ino)
            }
            _ => None,
        };
        let result = match caller {
            // A cache's names are all on its namespace server.
            Some(c) => self
                .inst
                .cache_rename(c, (op, on), (np, nn), flags)
                .map(|r| r.replaced),
            None => self.rename_entries(op, on, np, nn, flags, &src, dst.as_ref(), exchange),
        };
        let replaced = match result {
            Ok(r) => r,
            Err(e) => {
                if let Some(d) = sealed {
                    self.inst.unseal_dir(d);
                }
                return Err(e);
            }
        };
        // Link counts and directory times.
        let src_is_dir = src.kind == FileKind::Directory;
        if let Some(r) = &replaced {
            if !exchange {
                let delta = if r.kind == FileKind::Directory {
                    -2
                } else {
                    -1
                };
                if let Ok(a) = self.inst.link_count(r.ino, delta) {
                    self.t.remember(&a, false);
                }
            }
        }
        let _ = self.inst.link_count(src.ino, 0); // ctime of the moved inode
        let replaced_dir = replaced.is_some_and(|r| r.kind == FileKind::Directory) && !exchange;
        if op != np {
            let moved_out = i32::from(src_is_dir);
            let moved_in = i32::from(src_is_dir) - i32::from(replaced_dir);
            let (out_delta, in_delta) = if exchange {
                let d_dir = dst.as_ref().is_some_and(|d| d.kind == FileKind::Directory);
                (
                    i32::from(d_dir) - i32::from(src_is_dir),
                    i32::from(src_is_dir) - i32::from(d_dir),
                )
            } else {
                (-moved_out, moved_in)
            };
            self.touch_dir(op, out_delta);
            self.touch_dir(np, in_delta);
        } else {
            self.touch_dir(op, -i32::from(replaced_dir));
        }
        Ok(())
    }

    /// Move the entries themselves. Returns the entry that was replaced, if any.
    #[allow(clippy::too_many_arguments)]
    fn rename_entries(
        &self,
        op: InodeNo,
        on: &[u8],
        np: InodeNo,
        nn: &[u8],
        flags: u32,
        src: &EntryRef,
        dst: Option<&EntryRef>,
        exchange: bool,
    ) -> R<Option<EntryRef>> {
        if self.inst.dentry_home(op, on) == self.inst.dentry_home(np, nn) {
            let r = self.inst.rename_local(op, on, np, nn, flags)?;
            return Ok(r.replaced);
        }
        // Across servers: add the new name first, then drop the old one, so a failure
        // in between leaves an extra name rather than a lost file.
        if exchange {
            let d = dst.cloned().ok_or(Errno::ENOENT)?;
            self.inst.insert_entry(np, nn, src.clone(), true)?;
            self.inst.insert_entry(op, on, d.clone(), true)?;
            return Ok(Some(d));
        }
        let replaced = self.inst.insert_entry(np, nn, src.clone(), dst.is_some())?;
        match self.inst.remove_entry(op, on, want::ANY) {
            Ok(_) => Ok(replaced),
            Err(e) => {
                // Put the target back as it was.
                match &replaced {
                    Some(r) => {
                        let _ = self.inst.insert_entry(np, nn, r.clone(), true);
                    }
                    None => {
                        let _ = self.inst.remove_entry(np, nn, want::ANY);
                    }
                }
                Err(e)
            }
        }
    }
}
