//! The loop side of staging: which queued stages the dispatcher starts now and on
//! which coordinator, and what it and the watchers record — started, refused, progress
//! (file events and counters), the end a coordinator reports, a coordinator lost.

use super::teardown::{early_end_error, end_records};
use super::{
    own_error_path, state_col, u, FileState, LiveStage, Progress, StageEnd, StagedPaths, StartWork,
    WatchState, EIO,
};
use crate::db::{now, Db, DbResult};
use rusqlite::{params, Connection, OptionalExtension, Row, Transaction};
use spillway_api::stage_path::StagePath;
use spillway_api::{StageDirection, StagePair, StageState, StageType};
use std::collections::{HashMap, HashSet};

/// A queued stage as the dispatcher reads it: not its paths, which a list stage has by
/// the thousand; the stage's starter reads them (`start_pairs`), outside the round.
struct Queued {
    id: i64,
    instance: i64,
    kind: StageType,
    owner: i64,
    direction: StageDirection,
}

impl Queued {
    fn from_row(r: &Row) -> rusqlite::Result<Queued> {
        Ok(Queued {
            id: r.get("id")?,
            instance: r.get("instance")?,
            kind: StageType::parse(&r.get::<_, String>("type")?).unwrap_or(StageType::File),
            owner: r.get("owner")?,
            direction: StageDirection::parse(&r.get::<_, String>("direction")?)
                .unwrap_or(StageDirection::In),
        })
    }
}

/// A stage's counters as last recorded, to tell whether a progress answer changes them.
struct Counters {
    instance: i64,
    state: String,
    enumerated: bool,
    files_total: i64,
    files_done: i64,
    files_failed: i64,
    bytes_total: i64,
    bytes_done: i64,
    cursor: i64,
}

impl Counters {
    const COLS: &'static str = "instance, state, enumerated, files_total, files_done, \
                                files_failed, bytes_total, bytes_done, cursor";

    fn from_row(r: &Row) -> rusqlite::Result<Counters> {
        Ok(Counters {
            instance: r.get("instance")?,
            state: r.get("state")?,
            enumerated: r.get("enumerated")?,
            files_total: r.get("files_total")?,
            files_done: r.get("files_done")?,
            files_failed: r.get("files_failed")?,
            bytes_total: r.get("bytes_total")?,
            bytes_done: r.get("bytes_done")?,
            cursor: r.get("cursor")?,
        })
    }

    /// `p` brings nothing new: the same counters and no file events.
    fn unchanged_by(&self, p: &Progress) -> bool {
        self.enumerated == p.enumerated
            && self.files_total == clamp(p.files_total)
            && self.files_done == clamp(p.files_done)
            && self.files_failed == clamp(p.files_failed)
            && self.bytes_total == clamp(p.bytes_total)
            && self.bytes_done == clamp(p.bytes_done)
            && self.cursor == clamp(p.cursor)
            && p.events.is_empty()
    }
}

/// A coordinator's count as an SQLite integer.
fn clamp(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// A stage's state, if the stage exists.
fn state_of(conn: &Connection, id: u64) -> DbResult<Option<String>> {
    Ok(conn
        .query_row("SELECT state FROM stages WHERE id = ?1", [id as i64], |r| {
            r.get("state")
        })
        .optional()?)
}

impl Db {
    /// How many more stages `instance` may run now (its concurrency, or
    /// `default_concurrency`, less those running), and its online servers by fragment
    /// order, each once.
    fn start_room(
        &self,
        instance: i64,
        default_concurrency: u32,
    ) -> DbResult<(i64, Vec<(String, String)>)> {
        let limit: Option<i64> = self
            .conn()
            .query_row(
                "SELECT concurrency FROM stage_limits WHERE instance = ?1",
                [instance],
                |r| r.get("concurrency"),
            )
            .optional()?;
        let running: i64 = self.conn().query_row(
            "SELECT COUNT(*) FROM stages WHERE instance = ?1 AND state = 'running'",
            [instance],
            |r| r.get(0),
        )?;
        let limit = limit.unwrap_or(default_concurrency as i64).max(1);
        let mut st = self.conn().prepare_cached(
            "SELECT n.id AS id, n.address AS address FROM fragments f JOIN nodes n ON n.id = f.node
             WHERE f.instance = ?1 AND n.online = 1 ORDER BY f.idx",
        )?;
        let mut nodes: Vec<(String, String)> = st
            .query_map([instance], |r| Ok((r.get("id")?, r.get("address")?)))?
            .collect::<Result<_, _>>()?;
        let mut seen = HashSet::new();
        nodes.retain(|(n, _)| seen.insert(n.clone()));
        Ok((limit - running, nodes))
    }

    /// The queued stages to start now: instances whose fragments are all built (and
    /// told to hold replicas, if a configuration is load-balanced: a file staged in
    /// before would be on one server only), fewer stages running or `starting` (whose
    /// starts are under way) than their concurrency, oldest stage first; the
    /// coordinator is one of the instance's online servers, spread by stage id.
    pub fn stage_start_work(
        &self,
        default_concurrency: u32,
        starting: &HashSet<u64>,
    ) -> DbResult<Vec<StartWork>> {
        let queued: Vec<Queued> = {
            let mut st = self.conn().prepare_cached(
                "SELECT id, instance, type, owner, direction FROM stages s WHERE s.state = 'queued'
                   AND EXISTS (SELECT 1 FROM fragments f WHERE f.instance = s.instance)
                   AND NOT EXISTS (SELECT 1 FROM fragments f WHERE f.instance = s.instance
                                   AND (f.goal <> 'create' OR f.actualized = 0))
                   AND NOT EXISTS (SELECT 1 FROM configurations c WHERE c.instance = s.instance
                                   AND c.access_mode = 'ldbal' AND c.actualized = 0)
                 ORDER BY s.id",
            )?;
            let rows = st
                .query_map([], Queued::from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            rows
        };
        let mut out = Vec::new();
        // Per instance: stages it may still start, and its servers. A start under way
        // holds a slot of its instance as a running stage does.
        let mut room: HashMap<i64, (i64, Vec<(String, String)>)> = HashMap::new();
        for q in &queued {
            if starting.contains(&(q.id as u64)) {
                if let Some((free, _)) = room.get_mut(&q.instance) {
                    *free -= 1;
                } else {
                    let (free, nodes) = self.start_room(q.instance, default_concurrency)?;
                    room.insert(q.instance, (free - 1, nodes));
                }
            }
        }
        for q in queued {
            if starting.contains(&(q.id as u64)) {
                continue;
            }
            let (free, nodes) = match room.entry(q.instance) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(self.start_room(q.instance, default_concurrency)?)
                }
            };
            if *free <= 0 || nodes.is_empty() {
                continue;
            }
            *free -= 1;
            let (node, address) = nodes[(q.id as usize) % nodes.len()].clone();
            out.push(StartWork {
                stage: q.id as u64,
                instance: q.instance as u64,
                direction: q.direction,
                kind: q.kind,
                uid: q.owner as u32,
                node,
                address,
            });
        }
        Ok(out)
    }

    /// The (source, destination) pairs of a stage about to start (the one pair of a
    /// file or directory stage), or None if it is no longer queued.
    pub fn start_pairs(&self, id: u64) -> DbResult<Option<Vec<StagePair>>> {
        Ok(self
            .conn()
            .query_row(
                &format!(
                    "SELECT {} FROM stages WHERE id = ?1 AND state = 'queued'",
                    StagedPaths::COLS
                ),
                [id as i64],
                |r| StagedPaths::from_row(r).map(StagedPaths::into_pairs),
            )
            .optional()?)
    }

    /// The coordinator accepted the stage. False if the stage changed meanwhile (it
    /// was terminated or dropped while the start was under way): it is then marked for
    /// a cancel, so its watcher stops it on the server and forgets it.
    pub fn record_stage_started(&mut self, id: u64, node: &str) -> DbResult<bool> {
        let n = self.conn().execute(
            "UPDATE stages SET state = 'running', server = ?2, started = ?3, live = 1,
                 cursor = 0, cancel = 0 WHERE id = ?1 AND state = 'queued'",
            params![id as i64, node, now()],
        )?;
        if n == 0 {
            self.conn().execute(
                "UPDATE stages SET server = COALESCE(server, ?2), live = 1, cancel = 1, cursor = 0
                 WHERE id = ?1",
                params![id as i64, node],
            )?;
        }
        Ok(n > 0)
    }

    /// The coordinator refused to start the stage: it fails with that reason.
    pub fn record_stage_refused(
        &mut self,
        id: u64,
        node: &str,
        errno: i32,
        message: &str,
    ) -> DbResult<()> {
        let path = own_error_path(self.conn(), id)?;
        self.conn().execute(
            "UPDATE stages SET state = 'failed', server = ?2, finished = ?3, error_path = ?4,
                 error_errno = ?5, error_message = ?6 WHERE id = ?1 AND state = 'queued'",
            params![id as i64, node, now(), path, errno, message],
        )?;
        Ok(())
    }

    /// Stages their coordinators hold.
    pub fn live_stages(&self) -> DbResult<Vec<LiveStage>> {
        let mut st = self.conn().prepare_cached(
            "SELECT s.id AS id, COALESCE(s.server, '') AS server, n.address AS address
             FROM stages s LEFT JOIN nodes n ON n.id = s.server WHERE s.live = 1 ORDER BY s.id",
        )?;
        let rows = st
            .query_map([], |r| {
                Ok(LiveStage {
                    stage: u(r.get("id")?),
                    node: r.get("server")?,
                    address: r.get("address")?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn watch_state(&self, id: u64) -> DbResult<Option<WatchState>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT state, live, cancel, cursor FROM stages WHERE id = ?1",
                [id as i64],
                |r| {
                    Ok(WatchState {
                        state: state_col(r, "state", StageState::Failed)?,
                        live: r.get("live")?,
                        cancel: r.get("cancel")?,
                        cursor: u(r.get("cursor")?),
                    })
                },
            )
            .optional()?)
    }

    /// A progress answer: file events (a newer stage of a path replaces the older
    /// record) and counters. Returns whether anything changed.
    pub fn record_stage_progress(&mut self, id: u64, p: &Progress) -> DbResult<bool> {
        let tx = self.conn_mut().transaction()?;
        let row: Option<Counters> = tx
            .query_row(
                &format!("SELECT {} FROM stages WHERE id = ?1", Counters::COLS),
                [id as i64],
                Counters::from_row,
            )
            .optional()?;
        let Some(was) = row else {
            return Ok(false);
        };
        if was.unchanged_by(p) {
            return Ok(false);
        }
        // Records only while the stage runs: a terminated or dropped stage's late
        // events would bring back records its end removed.
        if was.state == "running" {
            record_events(&tx, id, was.instance, p)?;
        }
        tx.execute(
            "UPDATE stages SET enumerated = ?2, files_total = ?3, files_done = ?4,
                 files_failed = ?5, bytes_total = ?6, bytes_done = ?7, cursor = ?8 WHERE id = ?1",
            params![
                id as i64,
                p.enumerated,
                clamp(p.files_total),
                clamp(p.files_done),
                clamp(p.files_failed),
                clamp(p.bytes_total),
                clamp(p.bytes_done),
                clamp(p.cursor)
            ],
        )?;
        tx.commit()?;
        Ok(true)
    }

    /// The coordinator says the stage ended. A stage dropped by hurry stays dropped;
    /// a terminated one loses its pending and failed records. The coordinator no
    /// longer needs to be watched (the caller forgets it there).
    pub fn record_stage_end(&mut self, id: u64, end: &StageEnd) -> DbResult<()> {
        let tx = self.conn_mut().transaction()?;
        let Some(state) = state_of(&tx, id)? else {
            return Ok(());
        };
        let t = now();
        if state == "running" {
            match end {
                StageEnd::Complete => {
                    tx.execute(
                        "UPDATE stages SET state = 'complete' WHERE id = ?1",
                        [id as i64],
                    )?;
                }
                StageEnd::Failed(msg) => {
                    let path = own_error_path(&tx, id)?;
                    tx.execute(
                        "UPDATE stages SET state = 'failed',
                             error_path = COALESCE(error_path, ?2),
                             error_errno = COALESCE(error_errno, ?3),
                             error_message = COALESCE(error_message, ?4) WHERE id = ?1",
                        params![
                            id as i64,
                            path,
                            EIO,
                            if msg.is_empty() {
                                "the stage failed"
                            } else {
                                msg.as_str()
                            }
                        ],
                    )?;
                }
                StageEnd::Terminated => {
                    tx.execute(
                        "UPDATE stages SET state = 'terminated' WHERE id = ?1",
                        [id as i64],
                    )?;
                    end_records(&tx, id, "terminated")?;
                    early_end_error(&tx, id, "terminated", StageState::Running)?;
                }
            }
        } else {
            forget_pending(&tx, id)?;
        }
        no_longer_live(&tx, id, t)?;
        tx.commit()?;
        Ok(())
    }

    /// The coordinator lost the stage (restarted, or unreachable past the node
    /// timeout): a running stage fails with `message`, its pending records fail with
    /// EIO.
    pub fn record_stage_lost(&mut self, id: u64, message: &str) -> DbResult<()> {
        let tx = self.conn_mut().transaction()?;
        let Some(state) = state_of(&tx, id)? else {
            return Ok(());
        };
        if state == "running" {
            let path = own_error_path(&tx, id)?;
            tx.execute(
                "UPDATE stages SET state = 'failed', error_path = ?2, error_errno = ?3,
                     error_message = ?4 WHERE id = ?1",
                params![id as i64, path, EIO, message],
            )?;
            tx.execute(
                "UPDATE stage_files SET state = 'failed', errno = ?2, message = ?3
                 WHERE stage = ?1 AND state = 'pending'",
                params![id as i64, EIO, message],
            )?;
        } else {
            forget_pending(&tx, id)?;
        }
        no_longer_live(&tx, id, now())?;
        tx.commit()?;
        Ok(())
    }
}

/// The file events of a running stage's progress answer: each replaces the record of
/// its path unless a newer stage holds it; the first failure becomes the stage's error.
fn record_events(tx: &Transaction, id: u64, instance: i64, p: &Progress) -> DbResult<()> {
    let mut up = tx.prepare_cached(
        "INSERT INTO stage_files(instance, path, stage, state, errno, message, bytes)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT(instance, path) DO UPDATE SET stage = excluded.stage,
             state = excluded.state, errno = excluded.errno,
             message = excluded.message, bytes = excluded.bytes
         WHERE excluded.stage >= stage_files.stage",
    )?;
    for e in &p.events {
        let Ok(path) = StagePath::parse(&e.path) else {
            tracing::warn!(stage = id, path = %e.path, "coordinator reported a bad path");
            continue;
        };
        let path = path.as_str();
        let failed = e.state == FileState::Failed;
        up.execute(params![
            instance,
            path,
            id as i64,
            e.state.as_str(),
            if failed { e.errno.max(1) } else { 0 },
            e.message,
            clamp(e.bytes)
        ])?;
        if failed {
            tx.execute(
                "UPDATE stages SET error_path = ?2, error_errno = ?3, error_message = ?4
                 WHERE id = ?1 AND error_path IS NULL",
                params![id as i64, path, e.errno.max(1), e.message],
            )?;
        }
    }
    Ok(())
}

/// A stage that no longer runs keeps no pending records.
fn forget_pending(tx: &Transaction, id: u64) -> DbResult<()> {
    tx.execute(
        "DELETE FROM stage_files WHERE stage = ?1 AND state = 'pending'",
        [id as i64],
    )?;
    Ok(())
}

/// The stage runs nowhere any more: not live, no cancel owed, finished at `t` unless
/// it already was.
fn no_longer_live(tx: &Transaction, id: u64, t: i64) -> DbResult<()> {
    tx.execute(
        "UPDATE stages SET live = 0, cancel = 0,
             finished = CASE WHEN finished = 0 THEN ?2 ELSE finished END WHERE id = ?1",
        params![id as i64, t],
    )?;
    Ok(())
}
