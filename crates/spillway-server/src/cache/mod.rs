//! Cache instances (issue 18; design in docs/cache.md): the servers' SSDs put
//! transparently in front of one PFS directory.
//!
//! * `pfsns`   — the namespace, on the instance's server 0 only: every name, attribute
//!   and listing is the PFS directory's, reached through descriptors and single names
//!   beneath it; the inode numbers shown are this server's, mapped to PFS file handles.
//! * `stripes` — the data, on every server: which ranges of a stripe are cached, reads
//!   that miss fetched from the PFS, writes logged and written behind to the PFS.
//! * `wblog`   — the write-behind log: which ranges of which stripes are dirty (written
//!   here, not yet on the PFS), kept so that a server restart resumes write-behind.
//! * `reach`   — who may reach the PFS directory through the directories above it.
//! * `ranges`  — sets of byte ranges (a stripe's dirty ranges).
//! * `coherence` — whether a cached copy is still the PFS file's at open (the rule,
//!   and the PFS version it compares).

pub(crate) mod coherence;
pub(crate) mod pfsns;
pub(crate) mod ranges;
pub(crate) mod reach;
pub(crate) mod stripes;
pub(crate) mod wblog;

use crate::error::StoreResult;
use spillway_types::InodeNo;
use std::fs::File;

/// What the data side needs to know of a cached file to reach its PFS bytes. The
/// namespace server answers it from its handle table (`pfsns`); another server asks the
/// namespace server for it once per file and keeps the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// `struct file_handle`'s type and bytes, as `name_to_handle_at` gave them.
    pub handle_type: i32,
    pub handle: Vec<u8>,
    /// The PFS file's owner: write-behind writes as this user.
    pub uid: u32,
    pub gid: u32,
    /// The file's stripe geometry in the instance.
    pub stripe_size: u32,
    pub stripe_width: u16,
}

/// How the data side (`stripes`) reaches a cached file's bytes on the PFS. Implemented
/// over file handles by the fragment (a real PFS directory), and by plain files in the
/// tests.
pub(crate) trait PfsFiles: Send + Sync {
    /// The file opened for reading (a read that missed the cache).
    fn open_read(&self, ino: InodeNo) -> StoreResult<File>;
    /// The file opened for writing, as its owner (write-behind); `None` when the file
    /// is no longer on the PFS (its handle opens nothing: it was removed there), so its
    /// dirty ranges have nowhere to go. Any doubt (a namespace server not reached) is
    /// an error instead, which keeps them.
    fn open_write(&self, ino: InodeNo) -> StoreResult<Option<File>>;
    /// The file's stripe size in the instance.
    fn stripe_size(&self, ino: InodeNo) -> StoreResult<u32>;
}
