//! The manager's side of staging (docs/staging.md): the dispatcher starts queued stages
//! on a coordinator (one of the instance's servers) and a watcher per running stage
//! long-polls its progress into the database.
//!
//! * Dispatch: every round (after any change, at least once a second) the stages the
//!   database says may start (`Db::stage_start_work`: the instance is built, fewer than
//!   its concurrency running or being started) each get a starter thread, which sends
//!   a `StageStartReq` to their coordinator, carrying the stage ticket signed there
//!   (owner, direction, paths, expiry): the servers take the stage's uid and PFS paths
//!   from it alone. The round waits for no start. A server that
//!   cannot be reached leaves the stage queued (a later round retries, maybe on another
//!   server); a refusal fails the stage with the server's reason.
//! * Watching: one thread per stage a coordinator holds (`live`), also after a manager
//!   restart. It sends the cancel a terminate or a hurry asked for, long-polls
//!   `StageProgressReq` (about a second per call) and records file events and counters;
//!   at the end it records the final state and sends `StageForgetReq`. A coordinator
//!   that answers `UNKNOWN` (it restarted) or stays unreachable past the node timeout
//!   fails the stage, naming the server; time in which the manager itself could not
//!   open a socket (out of descriptors) does not count, as for heartbeats.
//!
//! Like the reconcile loop it keeps no state of its own besides which stages have a
//! watcher and which are being started (lost with a restart: such a stage is still
//! queued in the database and started again; a coordinator takes a start of a stage it
//! already runs as a no-op): everything else is in the database.

use crate::db::{Db, FileEvent, FileState, LiveStage, Progress, StageEnd, StartWork, WatchState};
use crate::reconcile::lock;
use crate::reconcile::servers::{hello, local_exhaustion, Servers};
use spillway_api::{StageDirection, StageState, StageType};
use spillway_types::errno::errno_name;
use spillway_types::peer::Throttle;
use spillway_types::stage_ticket::{self, StageTicket};
use spillway_types::Errno;
use spillway_wire::{
    stage_kind, stage_state, Endpoint, FileState as WireFileState, Role, StageCancelReq, StageDir,
    StageForgetReq, StagePair, StageProgressReq, StageStartReq,
};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Settings of staging (from `manager.conf`).
#[derive(Clone, Debug)]
pub struct StageSettings {
    /// The site's PFS roots, as `POST /stages` checks them. They are not sent to the
    /// servers: each server stages only under its own configured roots.
    pub pfs_roots: Vec<String>,
    pub files_in_flight: u32,
    pub default_concurrency: u32,
    /// A coordinator unreachable this long has lost its stages.
    pub node_timeout: Duration,
}

pub struct Stager {
    pub db: Arc<Mutex<Db>>,
    pub servers: Arc<Servers>,
    pub version: Arc<watch::Sender<u64>>,
    pub settings: StageSettings,
    /// Stages that have a watcher thread.
    watched: Mutex<HashSet<u64>>,
    /// Stages whose start is under way (a starter thread each).
    starting: Mutex<HashSet<u64>>,
}

/// How long a stage ticket is valid from the stage's start. Every server checks it on
/// every copy request, so a stage still copying after this fails (EACCES) and must be
/// started again: a week is far beyond any stage a burst buffer's size allows at the
/// slowest PFS, yet bounds what a ticket taken from a server is good for.
pub const TICKET_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long one progress request may wait on the coordinator.
const PROGRESS_WAIT_MS: u32 = 1000;

/// Errors that mean "no answer" (the server is down or unreachable), not a refusal.
/// The shortest time between two dispatch rounds.
const MIN_ROUND_GAP: Duration = Duration::from_millis(50);

fn unreachable(e: Errno) -> bool {
    e == Errno::ETIMEDOUT || e == Errno::EIO || e == Errno::ECONNREFUSED
}

fn describe(e: Errno) -> String {
    let name = errno_name(e.0);
    format!("{name} ({})", std::io::Error::from_raw_os_error(e.0))
}

impl Stager {
    pub fn new(
        db: Arc<Mutex<Db>>,
        servers: Arc<Servers>,
        version: Arc<watch::Sender<u64>>,
        settings: StageSettings,
    ) -> Stager {
        Stager {
            db,
            servers,
            version,
            settings,
            watched: Mutex::new(HashSet::new()),
            starting: Mutex::new(HashSet::new()),
        }
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    /// Start the dispatcher thread (watchers are started from it).
    pub fn spawn(self: Arc<Self>) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("stage-dispatch".into())
            .spawn(move || {
                // A runtime of its own only to wait for a change with a timeout: a
                // stage posted is dispatched at once, not at the next tick (a job's
                // stage-in waits for this).
                let waiter = match tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!("stage dispatcher: {e}");
                        return;
                    }
                };
                let mut rx = self.version.subscribe();
                let mut pruned = Instant::now();
                let mut last = Instant::now();
                loop {
                    // At most one round per 50 ms: every progress report also bumps
                    // the version, and a busy stage reports many times a second.
                    let since = last.elapsed();
                    if since < MIN_ROUND_GAP {
                        std::thread::sleep(MIN_ROUND_GAP - since);
                    }
                    last = Instant::now();
                    rx.borrow_and_update();
                    self.round();
                    if pruned.elapsed() >= Duration::from_secs(60) {
                        pruned = Instant::now();
                        if let Err(e) = lock(&self.db).prune_stages() {
                            tracing::error!("pruning old stages: {e}");
                        }
                    }
                    // Until something changes, or a second at most (limits and ends
                    // seen by watchers are rechecked then too).
                    let changed = waiter.block_on(async {
                        tokio::time::timeout(Duration::from_secs(1), rx.changed()).await
                    });
                    if let Ok(Err(_)) = changed {
                        // Every sender is gone: nothing will post again, but the
                        // watchers still need their starts; keep the 1 s round.
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            })?;
        Ok(())
    }

    /// One dispatch round: watchers for every live stage, a starter for each stage that
    /// may start. The round itself only reads which stages may start (no paths): each
    /// start (its pairs read, its ticket minted, the coordinator's answer awaited) runs
    /// on a thread of its own, so one user's large or slow start never holds another's,
    /// nor the next round. A start under way holds its instance's slot (`starting`) until
    /// its outcome is recorded.
    pub fn round(self: &Arc<Self>) {
        self.ensure_watchers();
        let starting = self.starting().clone();
        let work =
            match lock(&self.db).stage_start_work(self.settings.default_concurrency, &starting) {
                Ok(w) => w,
                Err(e) => {
                    tracing::error!("stage dispatch: {e}");
                    return;
                }
            };
        for w in work {
            if !self.starting().insert(w.stage) {
                continue;
            }
            let me = self.clone();
            let id = w.stage;
            let spawned = std::thread::Builder::new()
                .name(format!("stage-start-{id}"))
                .spawn(move || {
                    let changed = me.start_one(&w);
                    // Only once the outcome is recorded: a round in between would see
                    // the stage still queued and start it twice.
                    me.starting().remove(&w.stage);
                    if changed {
                        me.bump();
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(stage = id, "cannot start a stage starter: {e}");
                self.starting().remove(&id);
            }
        }
    }

    fn starting(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        self.starting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start one stage on its coordinator and record the outcome; whether anything was
    /// recorded. A server that cannot be reached leaves the stage queued for a later
    /// round (the 1 s tick, not at once: no busy retry of a server that is down).
    fn start_one(&self, w: &StartWork) -> bool {
        let r = self.start(w);
        let mut db = lock(&self.db);
        let rec = match r {
            Ok(true) => {
                tracing::info!(
                    stage = w.stage,
                    instance = w.instance,
                    server = %w.node,
                    "stage started"
                );
                db.record_stage_started(w.stage, &w.node).map(|_| ())
            }
            // Ended (terminated, dropped) while it waited: nothing to start.
            Ok(false) => return true,
            Err(e) if unreachable(e) => {
                tracing::debug!(stage = w.stage, server = %w.node, "stage start: server unreachable");
                return false;
            }
            Err(e) => {
                let msg = format!(
                    "server {} refused to start stage {}: {}",
                    w.node,
                    w.stage,
                    describe(e)
                );
                tracing::warn!(stage = w.stage, "{msg}");
                db.record_stage_refused(w.stage, &w.node, e.0.max(1), &msg)
            }
        };
        if let Err(e) = rec {
            tracing::error!(stage = w.stage, "recording a stage start: {e}");
        }
        true
    }

    /// The stage ticket of `w` (spillway_types::stage_ticket): its owner's uid, its
    /// direction and paths, valid for `TICKET_LIFETIME`, signed with its instance's
    /// secret. Signed at every start (nothing to store: a stage started again after a
    /// refusal gets a fresh one).
    fn ticket(
        &self,
        w: &StartWork,
        pairs: &[StagePair],
        direction: StageDir,
    ) -> Result<Vec<u8>, Errno> {
        let secret: Vec<u8> = lock(&self.db)
            .conn()
            .query_row(
                "SELECT secret FROM instances WHERE id = ?1",
                [w.instance as i64],
                |r| r.get(0),
            )
            .map_err(|e| {
                tracing::error!(stage = w.stage, "stage ticket: the instance's secret: {e}");
                Errno::EIO
            })?;
        let (pfs, inside): (Vec<&str>, Vec<&str>) = pairs
            .iter()
            .map(|p| {
                if direction == StageDir::In {
                    (p.source.as_str(), p.destination.as_str())
                } else {
                    (p.destination.as_str(), p.source.as_str())
                }
            })
            .unzip();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let t = StageTicket {
            instance: w.instance,
            stage: w.stage,
            uid: w.uid,
            // The ticket's direction bytes are the wire's (stage_ticket::DIRECTION_IN).
            direction: direction.into(),
            expires: now.saturating_add(TICKET_LIFETIME.as_secs()),
            pfs_paths: stage_ticket::cover(pfs),
            instance_paths: stage_ticket::cover(inside),
        };
        // The paths were normalised at POST (absolute, no ..): a refusal here means a
        // row the API would not have written. Fail the stage rather than widen it.
        stage_ticket::try_mint(&secret, &t).ok_or_else(|| {
            tracing::error!(
                stage = w.stage,
                "stage ticket: a path of the stage is not clean"
            );
            Errno::EINVAL
        })
    }

    /// Send `w`'s `StageStartReq`: true when the coordinator took it, false when the
    /// stage is no longer queued (nothing sent).
    fn start(&self, w: &StartWork) -> Result<bool, Errno> {
        let pairs = match lock(&self.db).start_pairs(w.stage) {
            Ok(Some(p)) => p,
            Ok(None) => return Ok(false),
            Err(e) => {
                tracing::error!(stage = w.stage, "stage start: its pairs: {e}");
                return Err(Errno::EIO);
            }
        };
        let ep = self
            .servers
            .admin_endpoint(&w.address)
            .map_err(|_| Errno::EIO)?;
        let direction = match w.direction {
            StageDirection::In => StageDir::In,
            StageDirection::Out => StageDir::Out,
        };
        let pairs: Vec<StagePair> = pairs
            .into_iter()
            .map(|p| StagePair {
                source: p.source,
                destination: p.destination,
            })
            .collect();
        let ticket = self.ticket(w, &pairs, direction)?;
        let req = StageStartReq {
            stage: w.stage,
            instance: w.instance,
            direction,
            kind: match w.kind {
                StageType::File => stage_kind::FILE,
                StageType::Directory => stage_kind::DIRECTORY,
                StageType::List => stage_kind::LIST,
            },
            pairs,
            ticket,
            files_in_flight: self.settings.files_in_flight,
        };
        ep.call(&req).map(|_| true)
    }

    /// A watcher thread for every live stage that has none.
    fn ensure_watchers(self: &Arc<Self>) {
        let live = match lock(&self.db).live_stages() {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("stage watchers: {e}");
                return;
            }
        };
        for l in live {
            let fresh = self
                .watched
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(l.stage);
            if !fresh {
                continue;
            }
            let me = self.clone();
            let id = l.stage;
            let spawned = std::thread::Builder::new()
                .name(format!("stage-{id}"))
                .spawn(move || {
                    me.watch(&l);
                    me.watched
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&l.stage);
                });
            if let Err(e) = spawned {
                tracing::error!(stage = id, "cannot start a stage watcher: {e}");
                self.watched
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
            }
        }
    }

    fn lost(&self, id: u64, message: &str) {
        tracing::warn!(stage = id, "{message}");
        if let Err(e) = lock(&self.db).record_stage_lost(id, message) {
            tracing::error!(stage = id, "recording a lost stage: {e}");
        }
        self.bump();
    }

    /// A coordinator cut off from the manager (not dead: stopped, or on the far side of
    /// a partition) may still be copying a stage that is now recorded as failed, and a
    /// retry would then race it for the same destination. Keep asking it to stop until
    /// it answers: a cancel taken, or a stage it does not know (it restarted).
    fn stop_where_lost(&self, ep: &Endpoint, id: u64, node: &str) {
        let mut pause = Duration::from_secs(1);
        loop {
            match ep.call(&StageCancelReq { stage: id }) {
                Ok(_) => {
                    tracing::warn!(stage = id, server = %node, "told the server to stop a stage it had lost");
                    return;
                }
                Err(e) if unreachable(e) => {}
                Err(e) => {
                    tracing::info!(stage = id, server = %node, "lost stage not running there: {}", describe(e));
                    return;
                }
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(30));
        }
    }

    /// Follow one stage on its coordinator until it ends there (or is lost).
    fn watch(&self, l: &LiveStage) {
        let id = l.stage;
        let Some(address) = l.address.clone() else {
            self.lost(
                id,
                &format!(
                    "server {} lost the stage: it is no longer a registered node",
                    l.node
                ),
            );
            return;
        };
        let admin = self.servers.admin.clone();
        let first = match (self.servers.admin)() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(stage = id, "no admin credential: {e}");
                Vec::new()
            }
        };
        let ep = Endpoint::new(
            address,
            hello(Role::Admin, 0, first),
            self.servers
                .deadline
                .max(Duration::from_millis(PROGRESS_WAIT_MS as u64 + 5000)),
            Duration::ZERO,
        )
        .with_credential_source(Box::new(move || admin().ok()));
        let mut last_ok = Instant::now();
        let mut cancel_sent = false;
        let mut local_log = Throttle::new(Duration::from_secs(10));
        loop {
            let ws: Option<WatchState> = match lock(&self.db).watch_state(id) {
                Ok(w) => w,
                Err(e) => {
                    tracing::error!(stage = id, "stage watcher: {e}");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            let Some(ws) = ws.filter(|w| w.live) else {
                return;
            };
            if ws.cancel && !cancel_sent {
                match ep.call(&StageCancelReq { stage: id }) {
                    Ok(_) => {
                        cancel_sent = true;
                        tracing::info!(stage = id, server = %l.node, "stage cancel sent");
                    }
                    Err(e) if unreachable(e) => {}
                    Err(e) => {
                        // Nothing more to ask of it; its progress tells the end.
                        cancel_sent = true;
                        tracing::warn!(stage = id, server = %l.node, "stage cancel refused: {}", describe(e));
                    }
                }
            }
            let reply = ep.call(&StageProgressReq {
                stage: id,
                cursor: ws.cursor,
                wait_ms: PROGRESS_WAIT_MS,
            });
            let r = match reply {
                Ok(r) => r,
                Err(e) if unreachable(e) => {
                    // The wire client does not say why no connection could be made:
                    // when the manager cannot open a socket now (out of descriptors or
                    // memory), that is taken to be why. It says nothing about the
                    // server, so, as for heartbeats, the run of silence starts over
                    // and the manager's own shortage never fails a stage.
                    if let Some(le) = local_exhaustion() {
                        last_ok = Instant::now();
                        if let Some(n) = local_log.allow(last_ok) {
                            tracing::error!(
                                stage = id,
                                server = %l.node,
                                "stage watcher: the manager itself cannot open a socket \
                                 ({le}); not held against the server ({n} more since the \
                                 last report)"
                            );
                        }
                        std::thread::sleep(Duration::from_millis(500));
                        continue;
                    }
                    if last_ok.elapsed() > self.settings.node_timeout {
                        self.lost(
                            id,
                            &format!(
                                "server {} lost the stage: it stopped answering mid-stage (unreachable for more than {} s)",
                                l.node,
                                self.settings.node_timeout.as_secs()
                            ),
                        );
                        self.stop_where_lost(&ep, id, &l.node);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                    continue;
                }
                Err(e) => {
                    self.lost(
                        id,
                        &format!(
                            "server {} lost the stage: it refused to report progress: {}",
                            l.node,
                            describe(e)
                        ),
                    );
                    return;
                }
            };
            last_ok = Instant::now();
            if r.state == stage_state::UNKNOWN {
                self.lost(
                    id,
                    &format!(
                        "server {} lost the stage: it restarted or stopped mid-stage",
                        l.node
                    ),
                );
                return;
            }
            let p = Progress {
                enumerated: r.enumerated,
                files_total: r.files_total,
                files_done: r.files_done,
                files_failed: r.files_failed,
                bytes_total: r.bytes_total,
                bytes_done: r.bytes_done,
                cursor: r.cursor,
                events: r
                    .events
                    .iter()
                    .map(|e| FileEvent {
                        path: e.path.clone(),
                        // A state this build does not know (a newer server's) reads
                        // as pending, as before the state was typed.
                        state: match e.file_state() {
                            Some(WireFileState::Complete) => FileState::Complete,
                            Some(WireFileState::Failed) => FileState::Failed,
                            Some(WireFileState::Pending) | None => FileState::Pending,
                        },
                        errno: e.errno,
                        message: e.message.clone(),
                        bytes: e.bytes,
                    })
                    .collect(),
            };
            match lock(&self.db).record_stage_progress(id, &p) {
                Ok(true) => self.bump(),
                Ok(false) => {}
                Err(e) => tracing::error!(stage = id, "recording stage progress: {e}"),
            }
            let end = match r.state {
                stage_state::RUNNING => continue,
                stage_state::COMPLETE => StageEnd::Complete,
                stage_state::TERMINATED => StageEnd::Terminated,
                stage_state::FAILED => StageEnd::Failed(r.error.clone()),
                other => StageEnd::Failed(format!(
                    "server {} reported an unknown stage state {other}",
                    l.node
                )),
            };
            let ended = match lock(&self.db).record_stage_end(id, &end) {
                Ok(()) => true,
                Err(e) => {
                    tracing::error!(stage = id, "recording a stage's end: {e}");
                    false
                }
            };
            if !ended {
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
            self.bump();
            let final_state = lock(&self.db)
                .watch_state(id)
                .ok()
                .flatten()
                .map(|w| w.state);
            if final_state == Some(StageState::Dropped) {
                tracing::warn!(stage = id, server = %l.node, "dropped stage-out ended on its server");
            } else {
                tracing::info!(stage = id, server = %l.node, state = ?final_state, "stage ended");
            }
            if let Err(e) = ep.call(&StageForgetReq { stage: id }) {
                tracing::debug!(stage = id, "forget: {}", describe(e));
            }
            return;
        }
    }
}
