//! The reconcile loop: drives servers toward every object's goal, idempotently, from
//! what the database says. It keeps no state of its own, so a restarted manager (or a
//! restarted server) simply resumes: a fragment build repeated is a no-op on the server,
//! a destroy of what is gone counts as done.
//!
//! * `servers` — the calls to storage servers.
//!
//! Two threads: heartbeats (probe every node, mark it online/offline) and the pass
//! (build and destroy fragments, apply configurations, roll up states). Agents are not
//! called: they long-poll the API for their work and report back.

pub mod servers;

use crate::db::Db;
use servers::Servers;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub struct Loop {
    pub db: Arc<Mutex<Db>>,
    pub servers: Arc<Servers>,
    pub version: Arc<watch::Sender<u64>>,
    pub heartbeat_interval: Duration,
    pub node_timeout: Duration,
}

/// Concurrent server calls in one pass.
const PARALLEL: usize = 16;

pub(crate) fn lock(db: &Mutex<Db>) -> std::sync::MutexGuard<'_, Db> {
    db.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run `f` over `items`, at most PARALLEL at once, returning results in order.
pub(crate) fn parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let mut out = Vec::with_capacity(items.len());
    for chunk in items.chunks(PARALLEL) {
        let rs: Vec<R> = std::thread::scope(|s| {
            let hs: Vec<_> = chunk.iter().map(|i| s.spawn(|| f(i))).collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
        out.extend(rs);
    }
    out
}

impl Loop {
    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    /// One heartbeat round over every node.
    pub fn heartbeat(&self) {
        let nodes = match lock(&self.db).nodes_to_probe() {
            Ok(n) => n,
            Err(e) => {
                tracing::error!("heartbeat: {e}");
                return;
            }
        };
        let results = parallel(&nodes, |n| self.servers.probe(&n.address));
        let mut changed = false;
        let mut db = lock(&self.db);
        for (n, r) in nodes.iter().zip(results) {
            if let Err(e) = &r {
                tracing::debug!(node = %n.id, "heartbeat failed: {e}");
            }
            match db.record_heartbeat(&n.id, r, self.node_timeout.as_secs() as i64) {
                Ok(true) => {
                    changed = true;
                    tracing::info!(node = %n.id, "node online state changed");
                }
                Ok(false) => {}
                Err(e) => tracing::error!("heartbeat: {e}"),
            }
        }
        drop(db);
        if changed {
            self.bump();
        }
    }

    /// One pass toward every goal. Returns whether more work is pending right away.
    pub fn pass(&self) -> Result<(), crate::db::DbError> {
        // The fingerprint is taken before the first roll-up: a cascade that roll-up
        // makes (a session's destroy reaching its activations) is news for agents.
        let (build, destroy, configs, before) = {
            let mut db = lock(&self.db);
            let before = db.fingerprint()?;
            db.advance()?;
            (
                db.fragment_work()?,
                db.destroy_work()?,
                db.config_work()?,
                before,
            )
        };
        if !build.is_empty() || !destroy.is_empty() || !configs.is_empty() {
            let built = parallel(&build, |w| self.servers.create_fragment(w));
            let gone = parallel(&destroy, |w| {
                self.servers.destroy_fragment(&w.address, w.instance)
            });
            let applied = parallel(&configs, |w| self.servers.apply_config(w));
            let mut db = lock(&self.db);
            for (w, r) in build.iter().zip(built) {
                if let Err(e) = &r {
                    tracing::warn!(
                        fragment = w.fragment,
                        instance = w.instance,
                        "build failed: {e}"
                    );
                }
                db.record_fragment(w.fragment, r)?;
            }
            for (w, r) in destroy.iter().zip(gone) {
                if let Err(e) = &r {
                    tracing::warn!(
                        fragment = w.fragment,
                        instance = w.instance,
                        "destroy failed: {e}"
                    );
                }
                db.record_destroyed(w.fragment, r)?;
            }
            for (w, r) in configs.iter().zip(applied) {
                if let Err(e) = &r {
                    tracing::warn!(configuration = w.configuration, "configuration failed: {e}");
                }
                db.record_config(w.configuration, r)?;
            }
        }
        let after = {
            let mut db = lock(&self.db);
            db.advance()?;
            db.fingerprint()?
        };
        if after != before {
            self.bump();
        }
        Ok(())
    }

    /// Start both threads. `kick` wakes the pass early (after an API change).
    pub fn spawn(self: Arc<Self>, kick: mpsc::Receiver<()>) -> std::io::Result<()> {
        let hb = self.clone();
        std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || loop {
                let t0 = Instant::now();
                hb.heartbeat();
                std::thread::sleep(hb.heartbeat_interval.saturating_sub(t0.elapsed()));
            })?;
        std::thread::Builder::new()
            .name("reconcile".into())
            .spawn(move || {
                let mut backoff = Duration::from_millis(200);
                loop {
                    match self.pass() {
                        Ok(()) => backoff = Duration::from_millis(200),
                        Err(e) => {
                            tracing::error!("reconcile pass: {e}");
                            backoff = (backoff * 2).min(Duration::from_secs(5));
                        }
                    }
                    // Wait for a change, or retry failed work after a second. A change
                    // that came in while the pass ran is already queued.
                    match kick.recv_timeout(Duration::from_secs(1).max(backoff)) {
                        Ok(()) => while kick.try_recv().is_ok() {},
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
            })?;
        Ok(())
    }
}
