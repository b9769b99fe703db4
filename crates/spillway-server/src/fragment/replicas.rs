//! Load-balanced instances (docs/cache.md §6): every server holds a whole replica of
//! every file, and the instance is read-only to its clients.
//!
//! What changes on a server is small and all here: where a file's stripes are
//! (`layout`: every stripe is this server's), which servers a change to a
//! file's data must reach (`data_servers`: all of them), and a marker file that
//! makes the mode survive a restart. The namespace is placed as in any instance;
//! the service answers a client's changes EROFS (service/readonly.rs).

use super::Fragment;
use crate::error::{fs, StoreResult};
use spillway_placement::Layout;
use spillway_types::{Errno, InodeNo, ServerIndex};
use std::path::Path;
use std::sync::atomic::Ordering;

/// The marker file: present (empty, 0600) when the fragment holds whole replicas.
pub(crate) const LDBAL_FILE: &str = "ldbal";

/// Whether the fragment directory `dir` was made load-balanced.
pub(super) fn marked(dir: &Path) -> bool {
    dir.join(LDBAL_FILE).exists()
}

impl Fragment {
    /// Whether this fragment holds whole replicas (a load-balanced instance).
    pub(crate) fn ldbal(&self) -> bool {
        self.ldbal.load(Ordering::SeqCst)
    }

    /// `LdbalConfigReq`: hold whole replicas from now on. Only while the fragment
    /// holds nothing but the root: files placed the striped way would have stripes
    /// on one server only, and a client reading another replica would see holes.
    pub(crate) fn configure_ldbal(&self) -> StoreResult<()> {
        if self.ldbal() {
            return Ok(());
        }
        let root_here = u64::from(self.index() == spillway_types::ROOT_INODE.home());
        if self.meta.inode_count()? > root_here || self.cache().is_some() {
            return Err(fs(Errno::EEXIST));
        }
        spillway_types::files::write_atomic(
            &self.dir.join(LDBAL_FILE),
            b"",
            spillway_types::files::PRIVATE_FILE_MODE,
        )?;
        self.ldbal.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Where the stripes of a file of this geometry are, as this server stores and
    /// stages them: each its own in a load-balanced instance, else the placement.
    pub(crate) fn layout(&self, ino: InodeNo, stripe_size: u32, width: u16) -> Layout {
        if self.ldbal() {
            Layout::replica(stripe_size, self.index(), self.config.count())
        } else {
            Layout::of(ino, stripe_size, width, self.config.count())
        }
    }

    /// The servers holding some of a file of `layout`: every server of a
    /// load-balanced instance, else the layout's.
    pub(crate) fn data_servers(&self, layout: &Layout) -> Vec<ServerIndex> {
        if self.ldbal() {
            (0..self.config.count()).map(ServerIndex).collect()
        } else {
            layout.servers().collect()
        }
    }
}
