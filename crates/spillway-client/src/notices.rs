//! Listening to the homes' notices of other mounts' changes to files open here
//! (docs/data-plane.md, "Consistency"; the servers' side is spillway-server's
//! `notices.rs`).
//!
//! This mount keeps a watching connection to each server it opened a file on, made
//! before the first such open is sent, so that no change after an open goes untold.
//! Each is read by a thread of its own: a notice drops what the kernel caches of the
//! file unless that is the version the notice carries (coherence.rs), then is
//! answered, and the writer's close or fsync returns. Not from a FUSE thread, and never
//! waiting on a file's write-back buffer: dropping a file's pages waits for the reads in
//! progress on it, and the writer may be this mount's own other file system thread.
//!
//! When a watch breaks, notices may have been lost: every file of that server open here
//! is dropped from the kernel's cache, and a new watch made.

use crate::coherence::Coherence;
use spillway_stubs::{Instance, Told, Watching, WatchingCloser};
use spillway_types::ServerIndex;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// After a watch could not be made: how long opens go on without trying again.
const RETRY_AFTER: Duration = Duration::from_secs(2);

enum State {
    /// Its thread reads the watch this closes.
    Listening(Option<WatchingCloser>),
    /// The last attempt failed at this moment.
    Failed(Instant),
}

pub(crate) struct Listeners {
    inst: Arc<Instance>,
    coherence: Arc<Coherence>,
    servers: Mutex<HashMap<ServerIndex, State>>,
}

impl Listeners {
    pub(crate) fn new(inst: Arc<Instance>, coherence: Arc<Coherence>) -> Arc<Listeners> {
        Arc::new(Listeners {
            inst,
            coherence,
            servers: Mutex::new(HashMap::new()),
        })
    }

    fn servers(&self) -> MutexGuard<'_, HashMap<ServerIndex, State>> {
        self.servers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Before this mount opens a file homed on server `s`: listen there, if not yet.
    /// A watch that cannot be made is logged and tried again at a later open; the open
    /// goes on (this mount then sees others' changes at open, lock and fsync only).
    pub(crate) fn ensure(self: &Arc<Self>, s: ServerIndex) {
        let mut servers = self.servers();
        match servers.get(&s) {
            Some(State::Listening(_)) => return,
            Some(State::Failed(at)) if at.elapsed() < RETRY_AFTER => return,
            _ => {}
        }
        // Made under the lock: opens racing to the same server wait for this one.
        let state = match self.inst.watch(s) {
            Ok(w) => {
                let closer = w.closer().ok();
                let me = Arc::downgrade(self);
                let spawned = std::thread::Builder::new()
                    .name(format!("notices {}", s.0))
                    .spawn(move || listen(me, s, w));
                match spawned {
                    Ok(_) => State::Listening(closer),
                    Err(e) => {
                        tracing::warn!(server = s.0, "cannot start a notice thread: {e}");
                        State::Failed(Instant::now())
                    }
                }
            }
            Err(e) => {
                tracing::warn!(server = s.0, "no change notices from this server: {e}");
                State::Failed(Instant::now())
            }
        };
        servers.insert(s, state);
    }
}

impl Listeners {
    /// After a watch of server `s` broke: if the server forgot this mount's opens of
    /// the files it is the home of (a restart, a broken connection: no open survives
    /// its session), open them again there, so that it tells this mount of their
    /// changes again (and does not purge one that is unlinked but still open here).
    fn reopen(&self, s: ServerIndex) {
        let Ok(now) = self.inst.session_at(s) else {
            return;
        };
        for (i, opens) in self.coherence.opens_forgotten_by(s, now) {
            let again = (0..opens).try_for_each(|_| self.inst.open(i, 0).map(|_| ()));
            match again {
                Ok(()) => self.coherence.opens_held_by(i, now),
                Err(e) => {
                    tracing::info!(%i, "an open file could not be opened again at its home: {e}")
                }
            }
        }
    }
}

impl Drop for Listeners {
    /// The mount is gone: its watches close, and their threads end.
    fn drop(&mut self) {
        for state in self.servers().values() {
            if let State::Listening(Some(c)) = state {
                c.close();
            }
        }
    }
}

/// Act on server `s`'s notices until the watch breaks; then drop what the kernel
/// caches of every file open here that `s` is the home of, and watch again. Ends
/// with the mount.
fn listen(me: Weak<Listeners>, s: ServerIndex, mut w: Watching) {
    loop {
        let next = w.next_told();
        let Some(l) = me.upgrade() else {
            return;
        };
        match next {
            Ok(told) => {
                let id = match told {
                    Told::Changed { id, attr } => {
                        if attr.ino.home() == s {
                            l.coherence.changed_elsewhere(attr);
                        }
                        id
                    }
                    Told::Other { id } => id,
                };
                // Answered whatever it said: the writer waits for the answer.
                if w.done(id).is_err() {
                    w.close();
                }
            }
            Err(e) => {
                tracing::info!(server = s.0, "change notices interrupted: {e}");
                drop(l);
                match rewatch(&me, s) {
                    Some(fresh) => w = fresh,
                    None => return,
                }
            }
        }
    }
}

/// A new watch of server `s`, trying until one is made (None: the mount is gone).
/// Every file open here that `s` is the home of is dropped from the kernel's cache,
/// as changes made meanwhile were not told.
fn rewatch(me: &Weak<Listeners>, s: ServerIndex) -> Option<Watching> {
    me.upgrade()?.coherence.drop_all_homed_on(s);
    let mut pause = Duration::from_millis(50);
    loop {
        let l = me.upgrade()?;
        match l.inst.watch(s) {
            Ok(w) => {
                let closer = w.closer().ok();
                l.servers().insert(s, State::Listening(closer));
                l.reopen(s);
                // Changes made while the new watch was being made were not told.
                l.coherence.drop_all_homed_on(s);
                return Some(w);
            }
            Err(e) => {
                tracing::debug!(server = s.0, "watching again: {e}");
                drop(l);
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}
