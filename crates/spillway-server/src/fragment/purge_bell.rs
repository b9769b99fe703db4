//! The purge thread's doorbell. Fragments ring it when they log a purge; the purge
//! thread (`crate::purge`) waits on it. It lives here, below both, so that a fragment
//! needs nothing of the purge thread (which walks the registry of fragments): the
//! dependency runs one way, purge → registry → fragment.

use crossbeam_channel::{bounded, Receiver, Sender};

/// Wakes the purge thread. Rings coalesce: one pass handles all logged purges.
#[derive(Clone)]
pub(crate) struct PurgeWaker(Sender<()>);

impl PurgeWaker {
    pub(crate) fn wake(&self) {
        let _ = self.0.try_send(());
    }
}

/// A new doorbell: the waker for the fragments, the receiver for the purge thread.
pub(crate) fn doorbell() -> (PurgeWaker, Receiver<()>) {
    let (tx, rx) = bounded(1);
    (PurgeWaker(tx), rx)
}
