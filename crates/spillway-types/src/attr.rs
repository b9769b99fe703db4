//! File attributes as the servers store them and the client reports them.

use crate::ids::InodeNo;

/// The privilege bits a write, truncate or chown takes from `mode`, as the kernel's
/// `file_remove_privs` does: set-user-ID, and set-group-ID only with group execute
/// (without it the bit marks mandatory locking, not privilege). The client judges by it
/// whether to ask, the home (and a cache's PFS namespace) clears them by it.
pub fn privilege_bits(mode: u32) -> u32 {
    let mut kill = mode & libc::S_ISUID;
    if mode & libc::S_IXGRP != 0 {
        kill |= mode & libc::S_ISGID;
    }
    kill
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FileKind {
    Regular = 1,
    Directory = 2,
    Symlink = 3,
    Fifo = 4,
    Socket = 5,
    CharDevice = 6,
    BlockDevice = 7,
}

impl FileKind {
    pub fn from_u8(v: u8) -> Option<FileKind> {
        Some(match v {
            1 => FileKind::Regular,
            2 => FileKind::Directory,
            3 => FileKind::Symlink,
            4 => FileKind::Fifo,
            5 => FileKind::Socket,
            6 => FileKind::CharDevice,
            7 => FileKind::BlockDevice,
            _ => return None,
        })
    }

    /// The kind named by the `S_IFMT` bits of a mode.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::Regular,
            libc::S_IFDIR => FileKind::Directory,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            _ => return None,
        })
    }

    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::Regular => libc::S_IFREG,
            FileKind::Directory => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
            FileKind::CharDevice => libc::S_IFCHR,
            FileKind::BlockDevice => libc::S_IFBLK,
        }
    }
}

/// Seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

impl Timespec {
    pub fn now() -> Timespec {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }

    pub fn to_system_time(self) -> std::time::SystemTime {
        use std::time::{Duration, UNIX_EPOCH};
        if self.sec >= 0 {
            UNIX_EPOCH + Duration::new(self.sec as u64, self.nsec)
        } else {
            UNIX_EPOCH - Duration::from_secs(self.sec.unsigned_abs())
                + Duration::from_nanos(u64::from(self.nsec))
        }
    }

    pub fn from_system_time(t: std::time::SystemTime) -> Timespec {
        match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Timespec {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                if d.subsec_nanos() == 0 {
                    Timespec {
                        sec: -(d.as_secs() as i64),
                        nsec: 0,
                    }
                } else {
                    Timespec {
                        sec: -(d.as_secs() as i64) - 1,
                        nsec: 1_000_000_000 - d.subsec_nanos(),
                    }
                }
            }
        }
    }
}

/// What a server knows of an inode. `mode` holds permission bits (incl. setuid, setgid,
/// sticky) only; the type is `kind`. Stripe geometry is fixed when data is first written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: InodeNo,
    pub kind: FileKind,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// Bytes per stripe; a multiple of 4 KiB.
    pub stripe_size: u32,
    /// How many servers the file's stripes rotate over (at most the instance's count).
    pub stripe_width: u16,
    /// Space the file's stripes occupy on the servers, in 512-byte units (`st_blocks`),
    /// as the servers last reported it to the home (docs/data-plane.md, "Allocation").
    /// 0 for kinds without data.
    pub blocks: u64,
}
