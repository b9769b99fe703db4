//! How answers reach the kernel: attributes as it should see them, and one small
//! function per reply type turning a `do_*` outcome (`R<T>`) into the reply, so the
//! FUSE methods in fs.rs stay one-line adapters and every errno leaves through `fe`.

use super::files::Created;
use super::lookup::Fresh;
use super::{SpillwayFs, R};
use fuser::{
    FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr,
};
use spillway_types::tunables::MAX_NAME_LEN;
use spillway_types::{Attr, Errno, FileKind};

/// An errno as fuser carries it to the kernel.
pub(super) fn fe(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e.0)
}

/// The kernel's file type of an inode kind.
pub(super) fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

impl SpillwayFs {
    /// Attributes as the kernel should see them: a file this client is writing is at
    /// least as long as what it wrote.
    pub(super) fn fuse_attr(&self, a: &Attr) -> FileAttr {
        let size = match self.t.writeback(a.ino) {
            Some(wb) => a.size.max(wb.end()),
            None => a.size,
        };
        FileAttr {
            ino: self.fuse_ino(a.ino),
            size,
            // Regular files: what their stripes occupy, as the servers reported it to
            // the home (fs/sparse.rs); other kinds hold no stripes.
            blocks: if a.kind == FileKind::Regular {
                a.blocks
            } else {
                size.div_ceil(512)
            },
            atime: a.atime.to_system_time(),
            mtime: a.mtime.to_system_time(),
            ctime: a.ctime.to_system_time(),
            crtime: a.mtime.to_system_time(),
            kind: file_type(a.kind),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            // A file's stripe is its best I/O size. A directory's is glibc's
            // opendir buffer (st_blksize, up to 1 MiB), and the kernel allocates and
            // maps a buffer of that size for every getdents: 4 KiB, as ext4 says,
            // keeps a walk from spending its time in the page allocator.
            blksize: if a.kind == FileKind::Regular {
                a.stripe_size.min(1 << 20)
            } else {
                4096
            },
            flags: 0,
        }
    }

    pub(super) fn reply_entry(&self, reply: ReplyEntry, r: R<Attr>) {
        match r {
            Ok(a) => {
                self.t.remember(&a, true);
                reply.entry(&self.tun.entry_ttl, &self.fuse_attr(&a), Generation(0));
            }
            Err(e) => reply.error(fe(e)),
        }
    }

    pub(super) fn reply_attr(&self, reply: ReplyAttr, r: R<Attr>) {
        match r {
            Ok(a) => {
                self.t.remember(&a, false);
                reply.attr(
                    &self.attr_ttl_of(&a, self.tun.attr_ttl),
                    &self.fuse_attr(&a),
                );
            }
            Err(e) => reply.error(fe(e)),
        }
    }

    /// Answer a LOOKUP: a cached entry with the lifetime it has left, one just
    /// fetched (remembered: the kernel counts the answer as a lookup), or a negative
    /// entry (node id 0) for a name that is not there.
    pub(super) fn reply_lookup(&self, reply: ReplyEntry, r: R<Option<Fresh>>) {
        match r {
            Ok(Some(Fresh::Cached(a, ttl))) => {
                reply.entry(&ttl, &self.fuse_attr(&a), Generation(0))
            }
            Ok(Some(Fresh::Fetched(a))) => self.reply_entry(reply, Ok(a)),
            Ok(None) => {
                let mut none = self.fuse_attr(&self.negative_template());
                none.ino = INodeNo(0);
                reply.entry(&self.tun.negative_ttl, &none, Generation(0));
            }
            Err(e) => reply.error(fe(e)),
        }
    }

    /// Answer a GETATTR: cached attributes with the lifetime they have left, or
    /// those just fetched from the home (remembered).
    pub(super) fn reply_getattr(&self, reply: ReplyAttr, r: R<Fresh>) {
        match r {
            Ok(Fresh::Cached(a, ttl)) => {
                reply.attr(&self.attr_ttl_of(&a, ttl), &self.fuse_attr(&a))
            }
            Ok(Fresh::Fetched(a)) => self.reply_attr(reply, Ok(a)),
            Err(e) => reply.error(fe(e)),
        }
    }

    /// Answer a CREATE: a file it made (already remembered by `do_create`), or one
    /// another client made meanwhile (fs/existing.rs).
    pub(super) fn reply_create(&self, reply: ReplyCreate, r: R<Created>) {
        match r {
            Ok(Created::New((attr, fh, f))) => reply.created(
                &self.tun.entry_ttl,
                &self.fuse_attr(&attr),
                Generation(0),
                FileHandle(fh),
                f,
            ),
            Ok(Created::Existing(opened)) => self.reply_existing(opened, reply),
            Err(e) => reply.error(fe(e)),
        }
    }

    pub(super) fn data(reply: ReplyData, r: R<impl std::ops::Deref<Target = [u8]>>) {
        match r {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(fe(e)),
        }
    }

    pub(super) fn empty(reply: ReplyEmpty, r: R<()>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fe(e)),
        }
    }

    pub(super) fn xattr_reply(reply: ReplyXattr, size: u32, data: R<Vec<u8>>) {
        match data {
            Err(e) => reply.error(fe(e)),
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(fuser::Errno::ERANGE),
            Ok(v) => reply.data(&v),
        }
    }

    /// An OPEN's handle and flags (FOPEN_KEEP_CACHE or none).
    pub(super) fn opened(reply: ReplyOpen, r: R<(u64, FopenFlags)>) {
        match r {
            Ok((fh, f)) => reply.opened(FileHandle(fh), f),
            Err(e) => reply.error(fe(e)),
        }
    }

    /// Bytes taken by a WRITE.
    pub(super) fn written(reply: ReplyWrite, r: R<usize>) {
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(fe(e)),
        }
    }

    /// A READDIR whose entries `do_readdir` added to the reply.
    pub(super) fn listed(reply: ReplyDirectory, r: R<()>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fe(e)),
        }
    }

    /// A READDIRPLUS whose entries `do_readdirplus` added to the reply.
    pub(super) fn listed_plus(reply: ReplyDirectoryPlus, r: R<()>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fe(e)),
        }
    }

    /// The instance's space and inodes (`do_statfs`) in 4 KiB blocks; the free
    /// inodes are a nominal u32::MAX, as the servers allocate them as they go.
    pub(super) fn reply_statfs(reply: ReplyStatfs, r: R<(u64, u64, u64)>) {
        match r {
            Ok((total, free, inodes)) => {
                let bs = 4096u64;
                let ffree = u64::from(u32::MAX);
                reply.statfs(
                    total / bs,
                    free / bs,
                    free / bs,
                    inodes + ffree,
                    ffree,
                    bs as u32,
                    MAX_NAME_LEN as u32,
                    bs as u32,
                )
            }
            Err(e) => reply.error(fe(e)),
        }
    }

    /// Where an lseek(SEEK_DATA/SEEK_HOLE) landed.
    pub(super) fn offset(reply: ReplyLseek, r: R<i64>) {
        match r {
            Ok(at) => reply.offset(at),
            Err(e) => reply.error(fe(e)),
        }
    }
}
