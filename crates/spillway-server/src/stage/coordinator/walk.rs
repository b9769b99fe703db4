//! Enumeration: what a stage is to make and copy, as `Item`s. A file or list stage
//! names its pairs; a directory stage walks the PFS tree (stage-in, as the owner) or
//! the instance tree (stage-out, with the owner's permissions), parents before what
//! they hold.

use super::paths::{join, ts};
use super::{Ctx, Item};
use crate::stage::ns::{self, MAY_EXEC, MAY_READ};
use crate::stage::Failure;
use spillway_types::FileKind;
use spillway_wire::stage_kind;

impl Ctx<'_> {
    pub(super) fn enumerate(&self) -> Result<Vec<Item>, Failure> {
        match self.req.kind {
            stage_kind::FILE | stage_kind::LIST => {
                if self.req.kind == stage_kind::FILE && self.req.pairs.len() != 1 {
                    return Err(Failure::new(libc::EINVAL, "a file stage names one pair"));
                }
                Ok(self
                    .req
                    .pairs
                    .iter()
                    .map(|p| {
                        let dw = if self.inbound() {
                            p.destination.clone()
                        } else {
                            p.source.clone()
                        };
                        Item::File {
                            src: p.source.clone(),
                            dst: p.destination.clone(),
                            dw,
                            ino: None,
                            size: None,
                        }
                    })
                    .collect())
            }
            stage_kind::DIRECTORY => {
                let [p] = self.req.pairs.as_slice() else {
                    return Err(Failure::new(
                        libc::EINVAL,
                        "a directory stage names one pair",
                    ));
                };
                if self.inbound() {
                    self.enumerate_pfs_tree(&p.source, &p.destination)
                } else {
                    self.enumerate_instance_tree(&p.source, &p.destination)
                }
            }
            k => Err(Failure::new(
                libc::EINVAL,
                format!("unknown stage type {k}"),
            )),
        }
    }

    /// Stage-in of a tree: into the instance directory `dst`, which must be writable,
    /// or which is made (its parent must exist), as `cp -a src dst` does, with the
    /// source directory's mode and times. The PFS tree is walked as the owner.
    pub(super) fn enumerate_pfs_tree(&self, src: &str, dst: &str) -> Result<Vec<Item>, Failure> {
        let mut out = Vec::new();
        match ns::resolve(&self.inst, &self.id, dst) {
            Ok(top) => {
                if top.kind != FileKind::Directory {
                    return Err(Failure::new(
                        libc::ENOTDIR,
                        format!("{dst}: the destination is not a directory"),
                    ));
                }
                ns::check_dir_writable(&top, &self.id, dst)?;
                self.dirs()
                    .insert(dst.trim_end_matches('/').to_string(), top);
            }
            Err(f) if f.errno == libc::ENOENT => {
                let st = self.pfs.lstat(src)?;
                out.push(Item::Dir {
                    dst: dst.trim_end_matches('/').to_string(),
                    mode: st.mode,
                    atime: ts(st.atime),
                    mtime: ts(st.mtime),
                });
            }
            Err(f) => return Err(f),
        }
        let entries = self.pfs.walk(src)?;
        out.extend(entries.into_iter().map(|(rel, st)| {
            let rel = rel.to_string_lossy().into_owned();
            let (s, d) = (join(src, &rel), join(dst, &rel));
            if st.is_dir() {
                Item::Dir {
                    dst: d,
                    mode: st.mode,
                    atime: ts(st.atime),
                    mtime: ts(st.mtime),
                }
            } else if st.is_file() {
                Item::File {
                    src: s,
                    dw: d.clone(),
                    dst: d,
                    ino: None,
                    size: Some(st.size),
                }
            } else if st.is_symlink() {
                Item::Symlink {
                    src: s,
                    dw: d.clone(),
                    dst: d,
                    ino: None,
                }
            } else {
                Item::Bad {
                    failure: Failure::new(
                        libc::EINVAL,
                        format!("{s}: not a regular file, directory or symlink"),
                    ),
                    dw: d,
                }
            }
        }));
        Ok(out)
    }

    /// Stage-out of a tree: into the PFS directory `dst`, or made (its parent must
    /// exist) with the instance directory's mode and times; the instance tree is
    /// walked with the owner's read and search permission on every directory.
    pub(super) fn enumerate_instance_tree(
        &self,
        src: &str,
        dst: &str,
    ) -> Result<Vec<Item>, Failure> {
        let top = ns::resolve(&self.inst, &self.id, src)?;
        if top.kind != FileKind::Directory {
            return Err(Failure::new(
                libc::ENOTDIR,
                format!("{src}: not a directory"),
            ));
        }
        let mut out = Vec::new();
        match self.pfs.lstat(dst) {
            Ok(st) if st.is_dir() => {}
            Ok(_) => {
                return Err(Failure::new(
                    libc::ENOTDIR,
                    format!("{dst}: the destination is not a directory"),
                ))
            }
            Err(f) if f.errno == libc::ENOENT => out.push(Item::Dir {
                dst: dst.trim_end_matches('/').to_string(),
                mode: top.mode,
                atime: top.atime,
                mtime: top.mtime,
            }),
            Err(f) => return Err(f),
        }
        let mut stack = vec![(top, String::new())];
        while let Some((dir, rel)) = stack.pop() {
            let shown = join(src, &rel);
            ns::check_may(
                &dir,
                &self.id,
                MAY_READ | MAY_EXEC,
                &shown,
                "listing the directory",
            )?;
            let mut entries = self
                .inst
                .read_dir(dir.ino, self.t.readdir_page, true)
                .map_err(|e| ns::errno_failure(e, &shown, "readdir"))?;
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            let mut subdirs = Vec::new();
            for e in entries {
                let name = String::from_utf8_lossy(&e.name).into_owned();
                let child = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                let (s, d) = (join(src, &child), join(dst, &child));
                match e.entry.kind {
                    FileKind::Directory => {
                        // Listed with its attributes (one round trip per directory,
                        // not one per subdirectory); asked again only if it vanished.
                        let a = match e.attr {
                            Some(a) => a,
                            None => self
                                .inst
                                .getattr(e.entry.ino)
                                .map_err(|er| ns::errno_failure(er, &s, "getattr"))?,
                        };
                        out.push(Item::Dir {
                            dst: d,
                            mode: a.mode,
                            atime: a.atime,
                            mtime: a.mtime,
                        });
                        subdirs.push((a, child));
                    }
                    FileKind::Regular => out.push(Item::File {
                        dw: s.clone(),
                        src: s,
                        dst: d,
                        ino: Some(e.entry.ino),
                        size: None,
                    }),
                    FileKind::Symlink => out.push(Item::Symlink {
                        dw: s.clone(),
                        src: s,
                        dst: d,
                        ino: Some(e.entry.ino),
                    }),
                    _ => out.push(Item::Bad {
                        failure: Failure::new(
                            libc::EINVAL,
                            format!("{s}: not a regular file, directory or symlink"),
                        ),
                        dw: s,
                    }),
                }
            }
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(out)
    }

    /// Bytes to copy, as far as they are known before copying: stage-in sizes from the
    /// PFS (the walk's, or an lstat of each listed file); stage-out sizes are found
    /// while copying.
    pub(super) fn known_bytes(&self, items: &[Item]) -> u64 {
        if !self.inbound() {
            return 0;
        }
        items
            .iter()
            .filter_map(|i| match i {
                Item::File { size: Some(n), .. } => Some(*n),
                Item::File { src, .. } => self.pfs.lstat(src).ok().map(|s| s.size),
                _ => None,
            })
            .sum()
    }
}
