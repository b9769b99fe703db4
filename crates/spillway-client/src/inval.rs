//! Dropping the kernel's cached pages and attributes of a file whose written-behind
//! bytes were lost (writeback.rs), from a thread of its own.
//!
//! Not from the FUSE request that noticed the loss: while the kernel waits for a write
//! request it holds that write's pages locked, and invalidating them from the thread
//! that must first answer would wait forever. Here the notification waits only until
//! the requests in progress are answered.

use crate::root::MountRoot;
use crate::writeback::Invalidate;
use fuser::Notifier;
use spillway_types::InodeNo;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

/// An `Invalidate` for this mount: the inode's pages (offset 0, to the end) and its
/// attributes are dropped, so that the next read and stat ask the servers.
pub(crate) fn invalidator(notifier: Arc<OnceLock<Notifier>>, root: MountRoot) -> Invalidate {
    let (tx, rx) = mpsc::channel::<InodeNo>();
    let spawned = std::thread::Builder::new()
        .name("invalidate".into())
        .spawn(move || {
            for ino in rx {
                if let Some(n) = notifier.get() {
                    if let Err(e) = n.inval_inode(root.fuse(ino), 0, 0) {
                        tracing::debug!(%ino, "invalidation: {e}");
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start the invalidation thread: {e}");
    }
    let tx = Mutex::new(tx);
    Arc::new(move |ino| {
        // The thread only ends with the mount; a send to it cannot block.
        let _ = tx.lock().unwrap_or_else(|e| e.into_inner()).send(ino);
    })
}
