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
use servers::{ProbeError, Servers};
use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub struct Loop {
    pub db: Arc<Mutex<Db>>,
    pub servers: Arc<Servers>,
    pub version: Arc<watch::Sender<u64>>,
    pub heartbeat_interval: Duration,
    pub node_timeout: Duration,
    /// Heartbeat bookkeeping of this process (see `heartbeat`).
    pub silence: Mutex<Silence>,
}

/// When each node's current run of failed heartbeats began (nodes that answered last
/// have no entry), and when the manager last said it could not probe.
#[derive(Default)]
pub struct Silence {
    since: HashMap<String, Instant>,
    local_logged: Option<Instant>,
    local_suppressed: u64,
}

/// Concurrent server calls in one pass.
const PARALLEL: usize = 16;

pub(crate) fn lock(db: &Mutex<Db>) -> std::sync::MutexGuard<'_, Db> {
    db.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run `f` over `items`, at most PARALLEL at once, returning results in order. An item
/// whose thread cannot be made (the process is out of memory or threads) runs on the
/// caller's thread instead: the heartbeat thread must not die of it.
pub(crate) fn parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    enum Job<H, R> {
        Thread(H),
        Done(R),
    }
    let f = &f;
    let mut out = Vec::with_capacity(items.len());
    for chunk in items.chunks(PARALLEL) {
        let rs: Vec<R> = std::thread::scope(|s| {
            let jobs: Vec<_> = chunk
                .iter()
                .map(
                    |i| match std::thread::Builder::new().spawn_scoped(s, move || f(i)) {
                        Ok(h) => Job::Thread(h),
                        Err(_) => Job::Done(f(i)),
                    },
                )
                .collect();
            jobs.into_iter()
                .map(|j| match j {
                    Job::Thread(h) => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
                    Job::Done(r) => r,
                })
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
        let now = Instant::now();
        let mut changed = false;
        let mut local: Vec<String> = Vec::new();
        let mut silence = self.silence.lock().unwrap_or_else(|e| e.into_inner());
        silence
            .since
            .retain(|id, _| nodes.iter().any(|n| &n.id == id));
        let mut db = lock(&self.db);
        for (n, r) in nodes.iter().zip(results) {
            let r = match r {
                Ok(capacity) => {
                    silence.since.remove(&n.id);
                    Ok(capacity)
                }
                // The manager could not ask (out of descriptors, no credential): not
                // recorded at all, and the server's run of silence starts over, so
                // time the manager could not look never counts against a server.
                Err(ProbeError::Local(e)) => {
                    silence.since.remove(&n.id);
                    local.push(format!("{}: {e}", n.id));
                    continue;
                }
                Err(ProbeError::Server(e)) => {
                    tracing::debug!(node = %n.id, "heartbeat failed: {e}");
                    Err(e)
                }
            };
            // Offline only after the server itself failed every heartbeat for
            // node_timeout (and its last answer is that old, checked by the database).
            let silent_for = r
                .is_err()
                .then(|| now.duration_since(*silence.since.entry(n.id.clone()).or_insert(now)));
            let timeout = match silent_for {
                Some(d) if d <= self.node_timeout => i64::MAX,
                _ => self.node_timeout.as_secs() as i64,
            };
            match db.record_heartbeat(&n.id, r, timeout) {
                Ok(true) => {
                    changed = true;
                    tracing::info!(node = %n.id, "node online state changed");
                }
                Ok(false) => {}
                Err(e) => tracing::error!("heartbeat: {e}"),
            }
        }
        drop(db);
        if !local.is_empty() {
            let quiet = silence
                .local_logged
                .is_some_and(|t| now.duration_since(t) < Duration::from_secs(10));
            if quiet {
                silence.local_suppressed += 1;
            } else {
                tracing::error!(
                    "heartbeat: the manager itself could not probe {} server(s) (not held \
                     against them; {} more such rounds since the last report): {}",
                    local.len(),
                    silence.local_suppressed,
                    local.join("; ")
                );
                silence.local_logged = Some(now);
                silence.local_suppressed = 0;
            }
        }
        drop(silence);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn only_the_servers_own_silence_makes_it_offline() {
        // A port nobody listens on: the server is down.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = l.local_addr().unwrap().to_string();
        drop(l);
        let mut db = Db::open_in_memory().unwrap();
        db.create_node(&spillway_api::NewNode {
            id: "s0".into(),
            address,
            pool: None,
            capacity: None,
        })
        .unwrap();
        db.record_heartbeat("s0", Ok(1 << 30), 10).unwrap();
        // Its last answer is ancient, as after a long time the manager could not look.
        db.conn()
            .execute("UPDATE nodes SET last_heartbeat = 0 WHERE id = 's0'", [])
            .unwrap();
        let munged_up = Arc::new(AtomicBool::new(false));
        let up = munged_up.clone();
        let (version, _) = watch::channel(0);
        let lp = Loop {
            db: Arc::new(Mutex::new(db)),
            servers: Arc::new(Servers {
                admin: Arc::new(move || {
                    if up.load(Ordering::SeqCst) {
                        Ok(vec![1])
                    } else {
                        Err("munged is down".into())
                    }
                }),
                deadline: Duration::from_secs(2),
            }),
            version: Arc::new(version),
            heartbeat_interval: Duration::from_millis(100),
            node_timeout: Duration::from_secs(1),
            silence: Default::default(),
        };
        let online = |lp: &Loop| lock(&lp.db).node("s0").unwrap().online;
        // The manager cannot probe (no credential): never held against the server.
        for _ in 0..3 {
            lp.heartbeat();
        }
        assert!(online(&lp));
        // The server's own failures: offline only once they lasted node_timeout, however
        // old its last answer is.
        munged_up.store(true, Ordering::SeqCst);
        lp.heartbeat();
        assert!(online(&lp));
        std::thread::sleep(Duration::from_millis(600));
        lp.heartbeat();
        assert!(online(&lp));
        // A round the manager could not make starts the count over.
        munged_up.store(false, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(600));
        lp.heartbeat();
        munged_up.store(true, Ordering::SeqCst);
        lp.heartbeat();
        assert!(online(&lp));
        std::thread::sleep(Duration::from_millis(1100));
        lp.heartbeat();
        assert!(!online(&lp));
    }
}
