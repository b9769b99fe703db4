//! The purge thread. Handlers only log a purge (one transaction) and ring the doorbell;
//! this thread does the slow part (deleting stripes here and on peers) outside any
//! request, so a handler never waits on another server for a purge and the worker pool
//! cannot deadlock on it. Pending purges are retried every `RETRY_INTERVAL`.

use crate::registry::Registry;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub(crate) const RETRY_INTERVAL: Duration = Duration::from_secs(2);

// The doorbell is the fragments' (they ring it): defined below them, so that
// fragment code never reaches up to this thread (no import cycle).
pub(crate) use crate::fragment::purge_bell::{doorbell, PurgeWaker};

pub(crate) struct Purger {
    stop: Arc<AtomicBool>,
    waker: PurgeWaker,
    thread: Option<JoinHandle<()>>,
}

impl Purger {
    pub(crate) fn start(
        registry: Arc<Registry>,
        waker: PurgeWaker,
        rx: Receiver<()>,
    ) -> std::io::Result<Purger> {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("purge".into())
            .spawn(move || run(&registry, &rx, &s2))?;
        Ok(Purger {
            stop,
            waker,
            thread: Some(thread),
        })
    }

    /// Stop after the purge in progress (at most one round of peer calls).
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Purger {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(registry: &Registry, rx: &Receiver<()>, stop: &AtomicBool) {
    // Pending counts per instance, to log when purges start and stop being stuck
    // rather than on every retry.
    let mut stuck: HashMap<u64, usize> = HashMap::new();
    while !stop.load(Ordering::SeqCst) {
        for frag in registry.all() {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let instance = frag.config.instance;
            let left = frag.purge_pass();
            let before = stuck.get(&instance).copied().unwrap_or(0);
            if left > 0 && before == 0 {
                tracing::warn!(
                    instance,
                    "{left} purges waiting for unreachable servers; retrying"
                );
            } else if left == 0 && before > 0 {
                tracing::info!(instance, "pending purges completed");
            }
            if left > 0 {
                stuck.insert(instance, left);
            } else {
                stuck.remove(&instance);
            }
        }
        match rx.recv_timeout(RETRY_INTERVAL) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}
