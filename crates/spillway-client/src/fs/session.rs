//! What concerns the mount as a whole rather than one inode: the INIT negotiation
//! with the kernel, statfs over all the instance's servers, and the flush at unmount.

use super::{SpillwayFs, R};
use crate::writeback::WriteBack;
use fuser::{InitFlags, KernelConfig};
use std::sync::Arc;

impl SpillwayFs {
    /// The kernel connection's capabilities and limits; fails the mount when the
    /// root cannot be reached.
    pub(super) fn do_init(&mut self, config: &mut KernelConfig) -> std::io::Result<()> {
        // Not FUSE_AUTO_INVAL_DATA: with it the kernel drops a file's page cache
        // whenever a fresh GETATTR shows a new mtime, and every write of our own moves
        // the mtime on the server, so a process reading back what it wrote (SQLite's
        // page 1 at every transaction) would read from the servers each time. Another
        // client's change is caught at open instead (`open_file` compares size and mtime
        // with what the cache holds and invalidates): close-to-open, as promised.
        let wanted = InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_MAX_PAGES;
        if let Err(missing) = config.add_capabilities(wanted) {
            tracing::warn!("kernel lacks FUSE capabilities {missing:?}");
        }
        // fcntl and flock locks held at the servers, across clients (locks.rs); with
        // `locks = node` the kernel keeps them, exclusive among this node's processes.
        let locks = InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS;
        if !self.tun.cluster_locks {
            tracing::info!("locks = node: fcntl and flock locks are local to this node");
        } else if let Err(missing) = config.add_capabilities(locks) {
            tracing::warn!("kernel lacks {missing:?}: those locks stay local to this node");
        }
        // POSIX ACLs enforced by the kernel from the xattrs it reads (acl.rs). With
        // them the VFS leaves the umask to the file system, and DONT_MASK keeps FUSE
        // from applying it before we know whether the directory has a default ACL.
        let acls = InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK;
        match config.add_capabilities(acls) {
            Ok(()) => self.acl = true,
            Err(missing) => tracing::warn!("kernel lacks {missing:?}: POSIX ACLs refused"),
        }
        // READDIRPLUS (fs/dirs.rs): listings carry attributes, so a walk costs no
        // LOOKUP per name. Not READDIRPLUS_AUTO: with it the kernel asks plain READDIR
        // for every page of a listing after the first (about 180 names in a 32 KiB
        // getdents buffer) unless a name was looked up in between, and a walk reads a
        // whole directory before it descends: `find` of a directory of 800
        // subdirectories paid a LOOKUP, a round trip to a server, for each of the 620
        // beyond the first page, though the listing held their attributes already.
        if self.tun.readdir_plus {
            let plus = InitFlags::FUSE_DO_READDIRPLUS;
            if let Err(missing) = config.add_capabilities(plus) {
                tracing::warn!("kernel lacks {missing:?}: listings without attributes");
            }
        }
        // Opens that write from the start go around the page cache (fs/files.rs); a
        // shared mapping of such a file is still allowed (and kept coherent with its
        // direct writes by the kernel), else mmap(MAP_SHARED) would fail with ENODEV.
        if self.tun.direct_writes {
            let mmap = InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
            if let Err(missing) = config.add_capabilities(mmap) {
                tracing::warn!("kernel lacks {missing:?}: every open keeps the page cache");
                self.direct_writes = false;
            }
        }
        // The kernel asks for `security.capability` before every write unless the
        // inode is marked S_NOSEC, which FUSE allows only when the file system clears
        // setuid and setgid itself: a FUSE round trip per write(2) (a third of a 4 KiB
        // random write's time, measured). With it we clear them on write
        // (`kill_privs`), chown and truncate (`kill_on_setattr`), at the home
        // (`setattr::KILL_SUIDGID`); the kernel still checks capabilities on the first
        // write after each attribute refresh.
        match config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2) {
            Ok(()) => self.killpriv = true,
            Err(missing) => tracing::info!("kernel lacks {missing:?}: it clears setuid itself"),
        }
        let _ = config.set_max_write(self.tun.max_write);
        let _ = config.set_max_readahead(self.tun.max_readahead);
        let _ = config.set_max_background(64);
        // The root must exist: fail the mount now rather than every call later.
        let root = self
            .inst
            .getattr(self.root.ino())
            .map_err(|e| std::io::Error::from_raw_os_error(e.0))?;
        self.t.remember(&root, true);
        Ok(())
    }

    /// The instance's (total bytes, free bytes, inodes in use) over all its fragments.
    pub(super) fn do_statfs(&self) -> R<(u64, u64, u64)> {
        let frags = self.inst.statfs()?;
        let inodes: u64 = frags.iter().map(|f| f.inodes).sum();
        if self.inst.desc.ldbal {
            // Every server holds every byte (docs/cache.md section 6): the instance
            // holds what its smallest replica holds, and what fits in it.
            let total = frags.iter().map(|f| f.capacity).min().unwrap_or(0);
            let free = frags
                .iter()
                .map(|f| f.capacity.saturating_sub(f.used))
                .min()
                .unwrap_or(0);
            return Ok((total, free, inodes));
        }
        let total: u64 = frags.iter().map(|f| f.capacity).sum();
        // DataWarp: free = servers × free space of the fullest fragment.
        let min_free = frags
            .iter()
            .map(|f| f.capacity.saturating_sub(f.used))
            .min()
            .unwrap_or(0);
        let free = (min_free.saturating_mul(frags.len() as u64)).min(total);
        Ok((total, free, inodes))
    }

    /// Push every file's write-back at unmount; a failure is logged, as nobody is left
    /// to tell.
    pub(super) fn flush_all(&self) {
        let wbs: Vec<Arc<WriteBack>> = self
            .t
            .nodes()
            .values()
            .filter_map(|n| n.wb.clone())
            .collect();
        for wb in wbs {
            if let Err(e) = wb.flush() {
                tracing::error!("flush at unmount failed: {e}");
            }
        }
    }
}
