//! Stages (docs/staging.md): requests recorded through the API, the per-file records
//! that answer `dw_query_*`, what the stage dispatcher starts and what its watchers
//! record, and the teardown rules (deferred stage-outs activated, fragments held while a
//! stage-out is pending, `hurry` dropping them).
//!
//! Paths: instance paths are absolute from the instance root, PFS paths absolute; both
//! are kept normalised (no empty, `.` or `..` components, no trailing `/`), so "at or
//! under" is a plain prefix test.

use super::{now, Db, DbError, DbResult, Viewer};
use crate::api::{cut, quoted};
use rusqlite::{params, Connection, OptionalExtension, Transaction};
use spillway_api::*;

/// Active states, as SQL.
const ACTIVE: &str = "('queued','deferred','running')";

/// Finished stages of instances that are gone are forgotten after this long.
pub const STAGE_RETENTION_SECS: i64 = 86400;

/// At most this many pairs in one list stage.
pub const MAX_PAIRS: usize = 100_000;

/// errno values the manager itself records.
pub const EIO: i32 = 5;
/// A stage terminated or dropped before its end (Linux's ECANCELED).
pub const ECANCELED: i32 = 125;

/// A path as the API takes it: absolute, at most 4096 bytes, no NUL, components of at
/// most 255 bytes and none `..`. Repeated and trailing slashes and `.` are dropped.
pub fn norm_path(what: &str, p: &str) -> DbResult<String> {
    if !p.starts_with('/') {
        return Err(DbError::Invalid(format!(
            "{what} {} is not an absolute path",
            quoted(p)
        )));
    }
    if p.len() > 4096 || p.contains('\0') {
        return Err(DbError::Invalid(format!(
            "{what} is too long or holds a NUL byte"
        )));
    }
    let comps: Vec<&str> = p
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if comps.contains(&"..") {
        return Err(DbError::Invalid(format!(
            "{what} {} has .. components",
            quoted(p)
        )));
    }
    if comps.iter().any(|c| c.len() > 255) {
        return Err(DbError::Invalid(format!(
            "{what} {} has a name longer than 255 bytes",
            quoted(p)
        )));
    }
    Ok(format!("/{}", comps.join("/")))
}

/// `p` is `q` or lies under it (both normalised).
pub fn under(p: &str, q: &str) -> bool {
    q == "/" || p == q || (p.starts_with(q) && p.as_bytes().get(q.len()) == Some(&b'/'))
}

/// The SQL prefix parameter for "`col` at or under `p`": rows where `col = p` or
/// `substr(col, 1, length(prefix)) = prefix`.
fn prefix_of(p: &str) -> String {
    if p == "/" {
        "/".into()
    } else {
        format!("{p}/")
    }
}

const UNDER_SQL: &str = "(path = ?2 OR substr(path, 1, length(?3)) = ?3)";

/// The instance-side paths of a stage.
pub fn instance_paths(
    direction: StageDirection,
    source: &str,
    destination: &str,
    pairs: &[StagePair],
) -> Vec<String> {
    let pick = |s: &str, d: &str| match direction {
        StageDirection::In => d.to_string(),
        StageDirection::Out => s.to_string(),
    };
    if pairs.is_empty() {
        vec![pick(source, destination)]
    } else {
        pairs
            .iter()
            .map(|p| pick(&p.source, &p.destination))
            .collect()
    }
}

/// A queued stage's row: id, instance, direction, type, source, destination, pairs, owner.
type QueuedRow = (i64, i64, String, String, String, String, String, i64);
/// A stage's counters: instance, state, enumerated, files total/done/failed, bytes
/// total/done, cursor.
type CounterRow = (i64, String, bool, i64, i64, i64, i64, i64, i64);

/// A stage the dispatcher should start now.
#[derive(Clone, Debug)]
pub struct StartWork {
    pub stage: u64,
    pub instance: u64,
    pub direction: StageDirection,
    pub kind: StageType,
    /// (source, destination) pairs: one for file and directory stages.
    pub pairs: Vec<StagePair>,
    pub uid: u32,
    /// The coordinator: node name and data-plane address.
    pub node: String,
    pub address: String,
}

/// A stage its coordinator holds: watched until it ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveStage {
    pub stage: u64,
    pub node: String,
    /// None: the node is no longer registered.
    pub address: Option<String>,
}

/// What the watcher needs each round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchState {
    pub state: StageState,
    pub live: bool,
    pub cancel: bool,
    pub cursor: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileState {
    Pending,
    Complete,
    Failed,
}

impl FileState {
    fn as_str(self) -> &'static str {
        match self {
            FileState::Pending => "pending",
            FileState::Complete => "complete",
            FileState::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug)]
pub struct FileEvent {
    pub path: String,
    pub state: FileState,
    /// Positive errno of a failed file.
    pub errno: i32,
    pub message: String,
    pub bytes: u64,
}

/// One progress answer of a coordinator.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    pub enumerated: bool,
    pub files_total: u64,
    pub files_done: u64,
    pub files_failed: u64,
    pub bytes_total: u64,
    pub bytes_done: u64,
    pub events: Vec<FileEvent>,
    pub cursor: u64,
}

/// How a coordinator said a stage ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StageEnd {
    Complete,
    Failed(String),
    Terminated,
}

/// Filters of `GET /stages`.
#[derive(Clone, Debug, Default)]
pub struct StageFilter {
    pub instance: Option<u64>,
    pub session: Option<u64>,
    pub state: Option<StageState>,
}

const COLS: &str = "id, instance, session, owner, direction, type, run_when, source, destination,
     pairs, state, files_total, files_done, files_failed, bytes_total, bytes_done, enumerated,
     error_path, error_errno, error_message, server, created, started, finished";

fn u(v: i64) -> u64 {
    v.max(0) as u64
}

fn row_to_stage(r: &rusqlite::Row) -> rusqlite::Result<Stage> {
    let pairs: String = r.get(9)?;
    let error_path: Option<String> = r.get(17)?;
    let error = error_path.map(|path| -> rusqlite::Result<StageError> {
        Ok(StageError {
            path,
            errno: r.get::<_, Option<i64>>(18)?.unwrap_or(EIO as i64) as i32,
            message: r.get::<_, Option<String>>(19)?.unwrap_or_default(),
        })
    });
    Ok(Stage {
        id: u(r.get(0)?),
        instance: u(r.get(1)?),
        session: u(r.get(2)?),
        owner: r.get::<_, i64>(3)? as u32,
        direction: StageDirection::parse(&r.get::<_, String>(4)?).unwrap_or(StageDirection::In),
        kind: StageType::parse(&r.get::<_, String>(5)?).unwrap_or(StageType::File),
        when: StageWhen::parse(&r.get::<_, String>(6)?).unwrap_or(StageWhen::Immediate),
        source: r.get(7)?,
        destination: r.get(8)?,
        pairs: serde_json::from_str(&pairs).unwrap_or_default(),
        state: StageState::parse(&r.get::<_, String>(10)?).unwrap_or(StageState::Failed),
        files_total: u(r.get(11)?),
        files_done: u(r.get(12)?),
        files_failed: u(r.get(13)?),
        bytes_total: u(r.get(14)?),
        bytes_done: u(r.get(15)?),
        enumerated: r.get(16)?,
        error: error.transpose()?,
        server: r.get(20)?,
        created: r.get(21)?,
        started: r.get(22)?,
        finished: r.get(23)?,
    })
}

/// SQL condition on the stages table (alias-free) for what `v` may see: their own
/// stages and the stages of their sessions.
fn stage_visible(v: Viewer) -> String {
    match v {
        Viewer::Admin => "1".into(),
        Viewer::User(uid) => {
            format!("(owner = {uid} OR session IN (SELECT id FROM sessions WHERE owner = {uid}))")
        }
    }
}

/// The instance's session, checking that `v` may stage on it: NotFound without such
/// an instance, for a user who does not own its session `views::refusal` (Forbidden if
/// they may see it, else NotFound as for a missing one). Also its goal.
fn owned_instance(conn: &Connection, v: Viewer, id: u64) -> DbResult<(u64, String)> {
    let row: Option<(i64, String, i64)> = conn
        .query_row(
            "SELECT i.session, i.goal, s.owner FROM instances i JOIN sessions s ON s.id = i.session
             WHERE i.id = ?1",
            [id as i64],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    let (session, goal, owner) =
        row.ok_or_else(|| DbError::NotFound(format!("no instance {id}")))?;
    if let Viewer::User(uid) = v {
        if owner as u32 != uid {
            return Err(super::views::refusal(conn, uid, "instance", id));
        }
    }
    Ok((session as u64, goal))
}

/// An active stage of an instance with its instance paths.
struct ActiveStage {
    id: u64,
    state: StageState,
    enumerated: bool,
    paths: Vec<String>,
}

fn active_stages(conn: &Connection, instance: u64) -> DbResult<Vec<ActiveStage>> {
    let mut st = conn.prepare_cached(&format!(
        "SELECT id, state, enumerated, direction, source, destination, pairs FROM stages
         WHERE instance = ?1 AND state IN {ACTIVE} ORDER BY id"
    ))?;
    let rows = st
        .query_map([instance as i64], |r| {
            let dir = StageDirection::parse(&r.get::<_, String>(3)?).unwrap_or(StageDirection::In);
            let pairs: Vec<StagePair> =
                serde_json::from_str(&r.get::<_, String>(6)?).unwrap_or_default();
            let source: String = r.get(4)?;
            let destination: String = r.get(5)?;
            Ok(ActiveStage {
                id: u(r.get(0)?),
                state: StageState::parse(&r.get::<_, String>(1)?).unwrap_or(StageState::Queued),
                enumerated: r.get(2)?,
                paths: instance_paths(dir, &source, &destination, &pairs),
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

fn add_record(c: &mut StageCounts, state: &str, n: u64) {
    match state {
        "complete" => c.complete += n,
        "pending" => c.pending += n,
        "deferred" => c.deferred += n,
        "failed" => c.failed += n,
        _ => {}
    }
}

fn add_unenumerated(c: &mut StageCounts, state: StageState) {
    if state == StageState::Deferred {
        c.deferred += 1;
    } else {
        c.pending += 1;
    }
}

/// The counts of `path` (normalised) in `instance`. For a file, at most one count is
/// non-zero: the newest of its record and the unenumerated stages covering it decides.
/// Also the id of the stage behind a pending or deferred count of a file.
fn counts_in(
    conn: &Connection,
    instance: u64,
    path: &str,
    scope: StageScope,
) -> DbResult<(StageCounts, Option<u64>)> {
    if scope == StageScope::File {
        return file_counts(conn, instance, path, &Unenumerated::of(conn, instance)?);
    }
    let mut c = StageCounts::default();
    let unenumerated: Vec<ActiveStage> = active_stages(conn, instance)?
        .into_iter()
        .filter(|s| !s.enumerated)
        .filter(|s| s.paths.iter().any(|q| under(path, q) || under(q, path)))
        .collect();
    match scope {
        StageScope::File => {}
        StageScope::Tree => {
            for s in &unenumerated {
                add_unenumerated(&mut c, s.state);
            }
            let mut st = conn.prepare_cached(&format!(
                "SELECT state, COUNT(*) FROM stage_files WHERE instance = ?1 AND {UNDER_SQL}
                 GROUP BY state"
            ))?;
            let rows = st
                .query_map(params![instance as i64, path, prefix_of(path)], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut any = !unenumerated.is_empty();
            for (state, n) in rows {
                any |= n > 0;
                add_record(&mut c, &state, u(n));
            }
            c.started = any;
        }
    }
    Ok((c, None))
}

/// The active stages of an instance not yet enumerated, by the instance paths they
/// name (the newest stage of each path): which stage covers a file is a lookup of the
/// file and its ancestors, not a scan of every stage. A new list stage checks each of
/// its (up to `MAX_PAIRS`) paths against it: with a scan, two large list stages made
/// that pairs × pairs JSON parses under the database lock, stalling every request.
struct Unenumerated {
    newest: std::collections::HashMap<String, (u64, StageState)>,
}

impl Unenumerated {
    fn of(conn: &Connection, instance: u64) -> DbResult<Unenumerated> {
        let mut newest = std::collections::HashMap::new();
        for s in active_stages(conn, instance)?
            .into_iter()
            .filter(|s| !s.enumerated)
        {
            for p in s.paths {
                let e = newest.entry(p).or_insert((s.id, s.state));
                if s.id > e.0 {
                    *e = (s.id, s.state);
                }
            }
        }
        Ok(Unenumerated { newest })
    }

    /// The newest stage naming `path` or a directory above it.
    fn covering(&self, path: &str) -> Option<(u64, StageState)> {
        let mut best: Option<(u64, StageState)> = None;
        let mut at = path;
        loop {
            if let Some(&(id, state)) = self.newest.get(at) {
                if best.is_none_or(|(b, _)| id > b) {
                    best = Some((id, state));
                }
            }
            if at == "/" || at.is_empty() {
                return best;
            }
            at = match at.rfind('/') {
                Some(0) => "/",
                Some(i) => &at[..i],
                None => return best,
            };
        }
    }
}

/// The counts of the file `path` (normalised) in `instance`: at most one count is
/// non-zero, the newest of its record and the unenumerated stages covering it decides.
/// Also the id of the stage behind a pending or deferred count.
fn file_counts(
    conn: &Connection,
    instance: u64,
    path: &str,
    unenumerated: &Unenumerated,
) -> DbResult<(StageCounts, Option<u64>)> {
    let mut c = StageCounts::default();
    let rec: Option<(i64, String)> = conn
        .query_row(
            "SELECT stage, state FROM stage_files WHERE instance = ?1 AND path = ?2",
            params![instance as i64, path],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    match (unenumerated.covering(path), rec) {
        (Some((id, state)), Some((rs, _))) if id > u(rs) => {
            add_unenumerated(&mut c, state);
            Ok((c_started(c), Some(id)))
        }
        (Some((id, state)), None) => {
            add_unenumerated(&mut c, state);
            Ok((c_started(c), Some(id)))
        }
        (_, Some((rs, state))) => {
            add_record(&mut c, &state, 1);
            let blocking = (state == "pending" || state == "deferred").then_some(u(rs));
            c.started = true;
            Ok((c, blocking))
        }
        (None, None) => Ok((c, None)),
    }
}

fn c_started(mut c: StageCounts) -> StageCounts {
    c.started = true;
    c
}

/// The instance path a stage's own error names when no file is to blame.
fn stage_path(conn: &Connection, id: u64) -> DbResult<String> {
    let row: Option<(String, String, String, String)> = conn
        .query_row(
            "SELECT direction, source, destination, pairs FROM stages WHERE id = ?1",
            [id as i64],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?;
    let Some((dir, s, d, pairs)) = row else {
        return Ok(String::new());
    };
    let dir = StageDirection::parse(&dir).unwrap_or(StageDirection::In);
    let pairs: Vec<StagePair> = serde_json::from_str(&pairs).unwrap_or_default();
    Ok(instance_paths(dir, &s, &d, &pairs)
        .into_iter()
        .next()
        .unwrap_or_default())
}

/// A stage ended before its files did (`terminated`, or `dropped` by hurry): its
/// pending, deferred and failed records take that state, and every path the stage
/// named gets such a record unless a newer stage (or this one's own outcome) holds it.
/// So the path's newest record is about this, its latest stage: `dw_query_*` answers
/// "started, nothing complete, pending, deferred or failed" and `dw_wait_*` returns,
/// instead of forgetting the stage (EINVAL) or answering about an older one.
fn end_records(tx: &Transaction, id: u64, state: &str) -> DbResult<()> {
    tx.execute(
        "UPDATE stage_files SET state = ?2, errno = 0, message = ''
         WHERE stage = ?1 AND state IN ('pending', 'deferred', 'failed')",
        params![id as i64, state],
    )?;
    let row: Option<(i64, String, String, String, String)> = tx
        .query_row(
            "SELECT instance, direction, source, destination, pairs FROM stages WHERE id = ?1",
            [id as i64],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .optional()?;
    let Some((instance, dir, source, destination, pairs)) = row else {
        return Ok(());
    };
    let dir = StageDirection::parse(&dir).unwrap_or(StageDirection::In);
    let pairs: Vec<StagePair> = serde_json::from_str(&pairs).unwrap_or_default();
    let mut up = tx.prepare_cached(
        "INSERT INTO stage_files(instance, path, stage, state, errno, message, bytes)
         VALUES (?1, ?2, ?3, ?4, 0, '', 0)
         ON CONFLICT(instance, path) DO UPDATE SET stage = excluded.stage,
             state = excluded.state, errno = 0, message = '', bytes = 0
         WHERE excluded.stage > stage_files.stage",
    )?;
    for path in instance_paths(dir, &source, &destination, &pairs) {
        up.execute(params![instance, path, id as i64, state])?;
    }
    Ok(())
}

/// What a stage that ended early left, for its `error` (kept if it has one already):
/// `how` is "terminated" or "dropped by a hurried teardown", `when` where it was.
fn early_end_error(tx: &Transaction, id: u64, how: &str, was: StageState) -> DbResult<()> {
    let row: Option<(String, i64)> = tx
        .query_row(
            "SELECT direction, files_done FROM stages WHERE id = ?1",
            [id as i64],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let Some((dir, done)) = row else {
        return Ok(());
    };
    let out = dir == "out";
    let message = match (was, out) {
        (StageState::Running, true) => format!(
            "{how} while copying: {done} file(s) were complete and in place on the PFS; the \
             others were not put in place (each such destination keeps its old content, or \
             stays absent) and their temporaries were removed"
        ),
        (StageState::Running, false) => format!(
            "{how} while copying: {done} file(s) were complete; files not complete in the \
             instance hold whatever the copy had written"
        ),
        (StageState::Deferred, true) => {
            format!("{how} before it was activated: nothing was written to the PFS")
        }
        _ if out => format!("{how} before it started: nothing was written to the PFS"),
        _ => format!("{how} before it started: nothing was written to the instance"),
    };
    let path = stage_path(tx, id)?;
    tx.execute(
        "UPDATE stages SET error_path = ?2, error_errno = ?3, error_message = ?4
         WHERE id = ?1 AND error_path IS NULL",
        params![id as i64, path, ECANCELED, message],
    )?;
    Ok(())
}

/// End a queued or deferred stage now (`terminated`), or ask the coordinator to stop
/// a running one. Terminating turns the stage's pending and failed records into
/// `terminated` ones (`end_records`).
fn terminate_in(tx: &Transaction, id: u64, state: StageState) -> DbResult<()> {
    match state {
        StageState::Queued | StageState::Deferred => {
            tx.execute(
                "UPDATE stages SET state = 'terminated', finished = ?2 WHERE id = ?1",
                params![id as i64, now()],
            )?;
            end_records(tx, id, "terminated")?;
            early_end_error(tx, id, "terminated", state)?;
        }
        StageState::Running => {
            tx.execute("UPDATE stages SET cancel = 1 WHERE id = ?1", [id as i64])?;
        }
        _ => {}
    }
    Ok(())
}

impl Db {
    // ------------------------------------------------------------------ the API
    /// Record a new stage. `pfs_roots`: the site's; a PFS path must lie under one.
    pub fn create_stage(
        &mut self,
        v: Viewer,
        caller_uid: u32,
        req: &NewStage,
        pfs_roots: &[String],
    ) -> DbResult<Stage> {
        let owner = match (req.owner, v) {
            (Some(o), Viewer::User(uid)) if o != uid => {
                return Err(DbError::Forbidden(format!(
                    "only admins stage as another user (you are uid {uid})"
                )))
            }
            (Some(o), _) => o,
            (None, _) => caller_uid,
        };
        let when = req.when.unwrap_or(StageWhen::Immediate);
        if when == StageWhen::JobEnd && req.direction == StageDirection::In {
            return Err(DbError::Invalid(
                "when \"job_end\" is for stage-outs only".into(),
            ));
        }
        if pfs_roots.is_empty() {
            return Err(DbError::Invalid(
                "staging is not set up on this site: the manager has no pfs_roots".into(),
            ));
        }
        // (instance side, PFS side) of each pair, checked and normalised.
        let check_pair = |src: &str, dst: &str| -> DbResult<StagePair> {
            let (ipath, ppath) = match req.direction {
                StageDirection::In => (dst, src),
                StageDirection::Out => (src, dst),
            };
            let ipath = norm_path("instance path", ipath)?;
            let ppath = norm_path("PFS path", ppath)?;
            if !pfs_roots.iter().any(|r| under(&ppath, r)) {
                return Err(DbError::Invalid(format!(
                    "PFS path {} is not under this site's PFS roots ({})",
                    cut(&ppath),
                    pfs_roots.join(", ")
                )));
            }
            Ok(match req.direction {
                StageDirection::In => StagePair {
                    source: ppath,
                    destination: ipath,
                },
                StageDirection::Out => StagePair {
                    source: ipath,
                    destination: ppath,
                },
            })
        };
        let (source, destination, pairs) = match req.kind {
            StageType::File | StageType::Directory => {
                if !req.pairs.is_empty() {
                    return Err(DbError::Invalid(
                        "pairs are for list stages; file and directory stages take source and destination".into(),
                    ));
                }
                if req.source.is_empty() || req.destination.is_empty() {
                    return Err(DbError::Invalid(format!(
                        "a {} stage needs a source and a destination",
                        req.kind.as_str()
                    )));
                }
                let p = check_pair(&req.source, &req.destination)?;
                (p.source, p.destination, Vec::new())
            }
            StageType::List => {
                if !req.source.is_empty() || !req.destination.is_empty() {
                    return Err(DbError::Invalid(
                        "a list stage takes pairs only (source and destination stay empty)".into(),
                    ));
                }
                if req.pairs.is_empty() {
                    return Err(DbError::Invalid(
                        "a list stage needs at least one pair".into(),
                    ));
                }
                if req.pairs.len() > MAX_PAIRS {
                    return Err(DbError::Invalid(format!(
                        "a list stage takes at most {MAX_PAIRS} pairs"
                    )));
                }
                let pairs = req
                    .pairs
                    .iter()
                    .map(|p| check_pair(&p.source, &p.destination))
                    .collect::<DbResult<Vec<_>>>()?;
                (String::new(), String::new(), pairs)
            }
        };
        let ipaths = instance_paths(req.direction, &source, &destination, &pairs);
        if req.kind != StageType::Directory {
            if let Some(p) = ipaths.iter().find(|p| *p == "/") {
                return Err(DbError::Invalid(format!(
                    "instance path {p} is the instance's root directory: use a directory stage"
                )));
            }
        }
        let stage_limit = self.user_limits().stages;
        let tx = self
            .conn_mut()
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let (session, goal) = owned_instance(&tx, v, req.instance)?;
        if goal != "create" {
            return Err(DbError::Conflict(format!(
                "instance {} is being destroyed",
                req.instance
            )));
        }
        if req.kind != StageType::Directory {
            let unenumerated = Unenumerated::of(&tx, req.instance)?;
            for p in &ipaths {
                let (c, blocking) = file_counts(&tx, req.instance, p, &unenumerated)?;
                if c.pending > 0 || c.deferred > 0 {
                    return Err(DbError::Conflict(format!(
                        "{} already has a pending or deferred stage{}: wait for it or terminate it",
                        cut(p),
                        blocking
                            .map(|b| format!(" (stage {b})"))
                            .unwrap_or_default()
                    )));
                }
            }
        }
        if let Viewer::User(uid) = v {
            // Inside the immediate transaction of the insert: two concurrent posts of
            // one user cannot both pass.
            let held: i64 = tx.query_row(
                &format!("SELECT COUNT(*) FROM stages WHERE owner = ?1 AND state IN {ACTIVE}"),
                [uid as i64],
                |r| r.get(0),
            )?;
            if held >= i64::from(stage_limit) {
                return Err(DbError::Conflict(format!(
                    "uid {uid} already has {held} stages not yet ended (queued, running or \
                     deferred); max_stages_per_user is {stage_limit}: wait for some to end or \
                     terminate them"
                )));
            }
        }
        let state = if when == StageWhen::JobEnd {
            StageState::Deferred
        } else {
            StageState::Queued
        };
        tx.execute(
            "INSERT INTO stages(instance, session, owner, direction, type, run_when, source,
                 destination, pairs, state, created)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            params![
                req.instance as i64,
                session as i64,
                owner as i64,
                req.direction.as_str(),
                req.kind.as_str(),
                when.as_str(),
                source,
                destination,
                serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".into()),
                state.as_str(),
                now()
            ],
        )?;
        let id = tx.last_insert_rowid() as u64;
        tx.commit()?;
        self.stage(Viewer::Admin, id)
    }

    pub fn stages(&self, v: Viewer, f: &StageFilter) -> DbResult<Vec<Stage>> {
        let sql = format!(
            "SELECT {COLS} FROM stages WHERE {}
               AND (?1 IS NULL OR instance = ?1) AND (?2 IS NULL OR session = ?2)
               AND (?3 IS NULL OR state = ?3)
             ORDER BY id",
            stage_visible(v)
        );
        let mut st = self.conn().prepare_cached(&sql)?;
        let rows = st
            .query_map(
                params![
                    f.instance.map(|i| i as i64),
                    f.session.map(|i| i as i64),
                    f.state.map(|s| s.as_str())
                ],
                row_to_stage,
            )?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// One stage, if `v` may see it.
    pub fn stage(&self, v: Viewer, id: u64) -> DbResult<Stage> {
        let sql = format!(
            "SELECT {COLS} FROM stages WHERE id = ?1 AND {}",
            stage_visible(v)
        );
        self.conn()
            .query_row(&sql, [id as i64], row_to_stage)
            .optional()?
            .ok_or_else(|| DbError::NotFound(format!("no stage {id}")))
    }

    /// `PATCH /stages/{id}`.
    pub fn stage_action(&mut self, v: Viewer, id: u64, action: StageAction) -> DbResult<Stage> {
        let s = self.stage(v, id)?;
        let tx = self.conn_mut().transaction()?;
        // Re-read the state inside the transaction.
        let state: String =
            tx.query_row("SELECT state FROM stages WHERE id = ?1", [id as i64], |r| {
                r.get(0)
            })?;
        let state = StageState::parse(&state).unwrap_or(s.state);
        match action {
            StageAction::Terminate => {
                if state.ended() {
                    return Err(DbError::Conflict(format!(
                        "stage {id} has ended ({})",
                        state.as_str()
                    )));
                }
                terminate_in(&tx, id, state)?;
            }
            StageAction::Revoke | StageAction::Activate => {
                if state != StageState::Deferred {
                    return Err(DbError::Conflict(format!(
                        "stage {id} is {}: only deferred stages can be {}",
                        state.as_str(),
                        if action == StageAction::Revoke {
                            "revoked"
                        } else {
                            "activated"
                        }
                    )));
                }
                if action == StageAction::Revoke {
                    tx.execute(
                        "UPDATE stages SET state = 'revoked', finished = ?2 WHERE id = ?1",
                        params![id as i64, now()],
                    )?;
                } else {
                    tx.execute(
                        "UPDATE stages SET state = 'queued' WHERE id = ?1",
                        [id as i64],
                    )?;
                }
            }
        }
        tx.commit()?;
        self.stage(Viewer::Admin, id)
    }

    /// `POST /instances/{id}/stage_actions`: the ids of the stages acted on.
    pub fn stage_path_action(
        &mut self,
        v: Viewer,
        instance: u64,
        a: &StagePathAction,
    ) -> DbResult<Vec<u64>> {
        let path = norm_path("path", &a.path)?;
        let tx = self.conn_mut().transaction()?;
        owned_instance(&tx, v, instance)?;
        let fits = |paths: &[String]| {
            paths.iter().any(|q| match a.scope {
                StageScope::File => *q == path,
                StageScope::Tree => under(q, &path),
            })
        };
        let mut hits: Vec<(u64, StageState)> = active_stages(&tx, instance)?
            .into_iter()
            .filter(|s| match a.action {
                StageAction::Terminate => true,
                _ => s.state == StageState::Deferred,
            })
            .filter(|s| fits(&s.paths))
            .map(|s| (s.id, s.state))
            .collect();
        // Stages holding a record there: pending or failed ones for terminate (which
        // clears them), deferred ones for revoke and activate.
        let (cond, prefix) = match a.scope {
            StageScope::File => ("path = ?2", path.clone()),
            StageScope::Tree => (UNDER_SQL, prefix_of(&path)),
        };
        let states = match a.action {
            StageAction::Terminate => "('pending', 'failed', 'deferred')",
            _ => "('deferred')",
        };
        let holders: Vec<(u64, String)> = {
            let mut st = tx.prepare(&format!(
                "SELECT DISTINCT f.stage, s.state FROM stage_files f JOIN stages s ON s.id = f.stage
                 WHERE f.instance = ?1 AND f.state IN {states} AND {}",
                cond.replace("path", "f.path")
            ))?;
            let mut p: Vec<&dyn rusqlite::ToSql> = vec![];
            let inst = instance as i64;
            p.push(&inst);
            p.push(&path);
            if a.scope == StageScope::Tree {
                p.push(&prefix);
            }
            let rows = st
                .query_map(p.as_slice(), |r| Ok((u(r.get(0)?), r.get(1)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            rows
        };
        for (id, state) in holders {
            let state = StageState::parse(&state).unwrap_or(StageState::Failed);
            if a.action != StageAction::Terminate && state != StageState::Deferred {
                continue;
            }
            if !hits.iter().any(|(h, _)| *h == id) {
                hits.push((id, state));
            }
        }
        if hits.is_empty() {
            return Err(DbError::NotFound(format!(
                "no stage of instance {instance} to {} at {}{}",
                a.action.as_str(),
                cut(&path),
                if a.scope == StageScope::Tree {
                    " or under it"
                } else {
                    ""
                }
            )));
        }
        hits.sort_by_key(|(id, _)| *id);
        for (id, state) in &hits {
            match a.action {
                StageAction::Terminate => {
                    terminate_in(&tx, *id, *state)?;
                    // A terminate clears failures of the path even of ended stages
                    // (the file is then no longer a failed stage, as in DataWarp).
                    let sql = format!(
                        "UPDATE stage_files SET state = 'terminated', errno = 0, message = ''
                         WHERE stage = ?1 AND state IN ('pending', 'failed') AND {}",
                        match a.scope {
                            StageScope::File => "path = ?2",
                            StageScope::Tree => "(path = ?2 OR substr(path, 1, length(?3)) = ?3)",
                        }
                    );
                    if a.scope == StageScope::File {
                        tx.execute(&sql, params![*id as i64, path])?;
                    } else {
                        tx.execute(&sql, params![*id as i64, path, prefix_of(&path)])?;
                    }
                }
                StageAction::Revoke => {
                    tx.execute(
                        "UPDATE stages SET state = 'revoked', finished = ?2 WHERE id = ?1 AND state = 'deferred'",
                        params![*id as i64, now()],
                    )?;
                }
                StageAction::Activate => {
                    tx.execute(
                        "UPDATE stages SET state = 'queued' WHERE id = ?1 AND state = 'deferred'",
                        [*id as i64],
                    )?;
                }
            }
        }
        tx.commit()?;
        Ok(hits.into_iter().map(|(id, _)| id).collect())
    }

    /// `GET /instances/{id}/stage_counts`.
    pub fn stage_counts(
        &self,
        v: Viewer,
        instance: u64,
        path: &str,
        scope: StageScope,
    ) -> DbResult<StageCounts> {
        let path = norm_path("path", path)?;
        owned_instance(self.conn(), v, instance)?;
        Ok(counts_in(self.conn(), instance, &path, scope)?.0)
    }

    /// `GET /instances/{id}/stage_failures`: failed records after `after` in path
    /// order, at most `limit`.
    pub fn stage_failures(
        &self,
        v: Viewer,
        instance: u64,
        after: &str,
        limit: u32,
    ) -> DbResult<StageFailures> {
        owned_instance(self.conn(), v, instance)?;
        let limit = limit.clamp(1, 10_000);
        let mut st = self.conn().prepare_cached(
            "SELECT path, errno, message, stage FROM stage_files
             WHERE instance = ?1 AND state = 'failed' AND path > ?2 ORDER BY path LIMIT ?3",
        )?;
        let mut failures = st
            .query_map(params![instance as i64, after, limit as i64 + 1], |r| {
                Ok(StageFailure {
                    path: r.get(0)?,
                    errno: r.get::<_, i64>(1)? as i32,
                    message: r.get(2)?,
                    stage: u(r.get(3)?),
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let more = failures.len() > limit as usize;
        failures.truncate(limit as usize);
        Ok(StageFailures { failures, more })
    }

    /// Record an instance's stage concurrency (already clamped by the caller).
    pub fn set_stage_concurrency(&mut self, v: Viewer, instance: u64, value: u32) -> DbResult<u32> {
        owned_instance(self.conn(), v, instance)?;
        self.conn().execute(
            "INSERT INTO stage_limits(instance, concurrency) VALUES (?1, ?2)
             ON CONFLICT(instance) DO UPDATE SET concurrency = ?2",
            params![instance as i64, value as i64],
        )?;
        Ok(value)
    }

    /// `hurry`: the stage-outs of `instances` that are queued, deferred or running
    /// become `dropped` (running ones are also cancelled on their coordinator, which
    /// holds the fragments until it confirms). Their pending records go.
    fn drop_stage_outs(tx: &Transaction, instances: &[u64]) -> DbResult<Vec<u64>> {
        let mut dropped = Vec::new();
        for i in instances {
            let ids: Vec<(i64, String)> = tx
                .prepare_cached(&format!(
                    "SELECT id, state FROM stages WHERE instance = ?1 AND direction = 'out'
                     AND state IN {ACTIVE} ORDER BY id"
                ))?
                .query_map([*i as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            for (id, state) in ids {
                tx.execute(
                    "UPDATE stages SET state = 'dropped', finished = ?2,
                         cancel = CASE WHEN ?3 = 'running' THEN 1 ELSE cancel END
                     WHERE id = ?1",
                    params![id, now(), state],
                )?;
                end_records(tx, id as u64, "dropped")?;
                let was = StageState::parse(&state).unwrap_or(StageState::Queued);
                early_end_error(tx, id as u64, "dropped by a hurried teardown", was)?;
                dropped.push(id as u64);
            }
        }
        Ok(dropped)
    }

    /// `DELETE /sessions/{id}?hurry=true`, before the destroy goal is set: checks that
    /// `v` may destroy the session, drops its instances' stage-outs.
    pub fn hurry_session(&mut self, v: Viewer, session: u64) -> DbResult<Vec<u64>> {
        let tx = self.conn_mut().transaction()?;
        let owner: Option<i64> = tx
            .query_row(
                "SELECT owner FROM sessions WHERE id = ?1",
                [session as i64],
                |r| r.get(0),
            )
            .optional()?;
        let owner = owner.ok_or_else(|| DbError::NotFound(format!("no session {session}")))?;
        if let Viewer::User(uid) = v {
            if owner as u32 != uid {
                return Err(super::views::refusal(&tx, uid, "session", session));
            }
        }
        let insts: Vec<u64> = tx
            .prepare("SELECT id FROM instances WHERE session = ?1 ORDER BY id")?
            .query_map([session as i64], |r| r.get::<_, i64>(0))?
            .map(|r| r.map(u))
            .collect::<Result<_, _>>()?;
        let dropped = Self::drop_stage_outs(&tx, &insts)?;
        tx.commit()?;
        Ok(dropped)
    }

    /// `DELETE /instances/{id}?hurry=true`, before the destroy goal is set.
    pub fn hurry_instance(&mut self, v: Viewer, instance: u64) -> DbResult<Vec<u64>> {
        let tx = self.conn_mut().transaction()?;
        owned_instance(&tx, v, instance)?;
        let dropped = Self::drop_stage_outs(&tx, &[instance])?;
        tx.commit()?;
        Ok(dropped)
    }

    // ------------------------------------------------------------------ teardown
    /// Inside `advance`, after destroy goals have flowed down and before fragments are
    /// given up: an instance being destroyed activates its deferred stage-outs, ends its
    /// stage-ins, and fails the stage-outs that can never run (the instance was never
    /// built).
    pub(crate) fn stage_teardown(tx: &Transaction) -> DbResult<()> {
        tx.execute_batch(&format!(
            "UPDATE stages SET state = 'queued'
              WHERE state = 'deferred' AND direction = 'out'
                AND instance IN (SELECT id FROM instances WHERE goal = 'destroy');
             DELETE FROM stage_files WHERE state IN ('pending', 'failed', 'deferred') AND stage IN (
               SELECT id FROM stages WHERE direction = 'in' AND state IN ('queued', 'deferred')
                 AND instance IN (SELECT id FROM instances WHERE goal = 'destroy'));
             UPDATE stages SET state = 'terminated', finished = {now}
              WHERE direction = 'in' AND state IN ('queued', 'deferred')
                AND instance IN (SELECT id FROM instances WHERE goal = 'destroy');
             UPDATE stages SET cancel = 1
              WHERE direction = 'in' AND state = 'running' AND cancel = 0
                AND instance IN (SELECT id FROM instances WHERE goal = 'destroy');",
            now = now()
        ))?;
        // Stage-outs of an instance that will never be built, or whose instance is gone.
        let stuck: Vec<(i64, i64)> = tx
            .prepare_cached(
                "SELECT s.id, s.instance FROM stages s WHERE s.state = 'queued' AND (
                   NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = s.instance)
                   OR s.instance IN (SELECT i.id FROM instances i WHERE i.goal = 'destroy' AND (
                      NOT EXISTS (SELECT 1 FROM fragments f WHERE f.instance = i.id)
                      OR EXISTS (SELECT 1 FROM fragments f WHERE f.instance = i.id
                                 AND (f.actualized = 0 OR f.goal = 'destroy')))))",
            )?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        for (id, inst) in stuck {
            let path = stage_path(tx, id as u64)?;
            tx.execute(
                "UPDATE stages SET state = 'failed', finished = ?2, error_path = ?3,
                     error_errno = ?4, error_message = ?5 WHERE id = ?1",
                params![
                    id,
                    now(),
                    path,
                    EIO,
                    format!(
                        "instance {inst} is destroyed before it was built: stage {id} cannot run"
                    )
                ],
            )?;
        }
        Ok(())
    }

    /// SQL condition (on an instance id column `col`) that holds its fragments: a
    /// stage-out that is queued, deferred or running, or any stage its coordinator
    /// still holds (a cancel not yet confirmed).
    pub(crate) fn stage_hold_sql(col: &str) -> String {
        format!(
            "NOT EXISTS (SELECT 1 FROM stages s WHERE s.instance = {col}
               AND ((s.direction = 'out' AND s.state IN {ACTIVE}) OR s.live = 1))"
        )
    }

    /// After instances are deleted: their file records and limits go.
    pub(crate) fn stage_forget_instances(tx: &Transaction, gone: &[i64]) -> DbResult<()> {
        for i in gone {
            tx.execute("DELETE FROM stage_files WHERE instance = ?1", [i])?;
            tx.execute("DELETE FROM stage_limits WHERE instance = ?1", [i])?;
        }
        Ok(())
    }

    /// Finished stages of instances that are gone, older than the retention.
    pub fn prune_stages(&mut self) -> DbResult<usize> {
        Ok(self.conn().execute(
            &format!(
                "DELETE FROM stages WHERE state NOT IN {ACTIVE} AND live = 0 AND finished < ?1
                   AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = stages.instance)"
            ),
            [now() - STAGE_RETENTION_SECS],
        )?)
    }

    // ------------------------------------------------------------------ dispatch
    /// The queued stages to start now: instances whose fragments are all built, fewer
    /// stages running than their concurrency, oldest stage first; the coordinator is
    /// one of the instance's online servers, spread by stage id.
    pub fn stage_start_work(&self, default_concurrency: u32) -> DbResult<Vec<StartWork>> {
        let queued: Vec<QueuedRow> = {
            let mut st = self.conn().prepare_cached(
                "SELECT s.id, s.instance, s.direction, s.type, s.source, s.destination, s.pairs, s.owner
                 FROM stages s WHERE s.state = 'queued'
                   AND EXISTS (SELECT 1 FROM fragments f WHERE f.instance = s.instance)
                   AND NOT EXISTS (SELECT 1 FROM fragments f WHERE f.instance = s.instance
                                   AND (f.goal <> 'create' OR f.actualized = 0))
                 ORDER BY s.id",
            )?;
            let rows = st
                .query_map([], |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows
        };
        let mut out = Vec::new();
        let mut slots: std::collections::HashMap<i64, i64> = std::collections::HashMap::new();
        let mut servers: std::collections::HashMap<i64, Vec<(String, String)>> =
            std::collections::HashMap::new();
        for (id, inst, dir, kind, source, destination, pairs, owner) in queued {
            if let std::collections::hash_map::Entry::Vacant(slot) = slots.entry(inst) {
                let limit: Option<i64> = self
                    .conn()
                    .query_row(
                        "SELECT concurrency FROM stage_limits WHERE instance = ?1",
                        [inst],
                        |r| r.get(0),
                    )
                    .optional()?;
                let running: i64 = self.conn().query_row(
                    "SELECT COUNT(*) FROM stages WHERE instance = ?1 AND state = 'running'",
                    [inst],
                    |r| r.get(0),
                )?;
                let limit = limit.unwrap_or(default_concurrency as i64).max(1);
                slot.insert(limit - running);
                let mut st = self.conn().prepare_cached(
                    "SELECT n.id, n.address FROM fragments f JOIN nodes n ON n.id = f.node
                     WHERE f.instance = ?1 AND n.online = 1 ORDER BY f.idx",
                )?;
                let mut nodes: Vec<(String, String)> = st
                    .query_map([inst], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                let mut seen = std::collections::HashSet::new();
                nodes.retain(|(n, _)| seen.insert(n.clone()));
                servers.insert(inst, nodes);
            }
            let free = slots.get_mut(&inst);
            let Some(free) = free.filter(|f| **f > 0) else {
                continue;
            };
            let nodes = servers.get(&inst).map(Vec::as_slice).unwrap_or(&[]);
            if nodes.is_empty() {
                continue;
            }
            *free -= 1;
            let (node, address) = nodes[(id as usize) % nodes.len()].clone();
            let pairs: Vec<StagePair> = serde_json::from_str(&pairs).unwrap_or_default();
            out.push(StartWork {
                stage: id as u64,
                instance: inst as u64,
                direction: StageDirection::parse(&dir).unwrap_or(StageDirection::In),
                kind: StageType::parse(&kind).unwrap_or(StageType::File),
                pairs: if pairs.is_empty() {
                    vec![StagePair {
                        source,
                        destination,
                    }]
                } else {
                    pairs
                },
                uid: owner as u32,
                node,
                address,
            });
        }
        Ok(out)
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
        let path = stage_path(self.conn(), id)?;
        self.conn().execute(
            "UPDATE stages SET state = 'failed', server = ?2, finished = ?3, error_path = ?4,
                 error_errno = ?5, error_message = ?6 WHERE id = ?1 AND state = 'queued'",
            params![id as i64, node, now(), path, errno, message],
        )?;
        Ok(())
    }

    // ------------------------------------------------------------------ watching
    /// Stages their coordinators hold.
    pub fn live_stages(&self) -> DbResult<Vec<LiveStage>> {
        let mut st = self.conn().prepare_cached(
            "SELECT s.id, COALESCE(s.server, ''), n.address FROM stages s
             LEFT JOIN nodes n ON n.id = s.server WHERE s.live = 1 ORDER BY s.id",
        )?;
        let rows = st
            .query_map([], |r| {
                Ok(LiveStage {
                    stage: u(r.get(0)?),
                    node: r.get(1)?,
                    address: r.get(2)?,
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
                        state: StageState::parse(&r.get::<_, String>(0)?)
                            .unwrap_or(StageState::Failed),
                        live: r.get(1)?,
                        cancel: r.get(2)?,
                        cursor: u(r.get(3)?),
                    })
                },
            )
            .optional()?)
    }

    /// A progress answer: file events (a newer stage of a path replaces the older
    /// record) and counters. Returns whether anything changed.
    pub fn record_stage_progress(&mut self, id: u64, p: &Progress) -> DbResult<bool> {
        let tx = self.conn_mut().transaction()?;
        let row: Option<CounterRow> = tx
            .query_row(
                "SELECT instance, state, enumerated, files_total, files_done, files_failed,
                        bytes_total, bytes_done, cursor FROM stages WHERE id = ?1",
                [id as i64],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                        r.get(8)?,
                    ))
                },
            )
            .optional()?;
        let Some((instance, state, en, ft, fd, ff, bt, bd, cursor)) = row else {
            return Ok(false);
        };
        let clamp = |v: u64| v.min(i64::MAX as u64) as i64;
        let same = en == p.enumerated
            && ft == clamp(p.files_total)
            && fd == clamp(p.files_done)
            && ff == clamp(p.files_failed)
            && bt == clamp(p.bytes_total)
            && bd == clamp(p.bytes_done)
            && cursor == clamp(p.cursor)
            && p.events.is_empty();
        if same {
            return Ok(false);
        }
        // Records only while the stage runs: a terminated or dropped stage's late
        // events would bring back records its end removed.
        if state == "running" {
            let mut up = tx.prepare_cached(
                "INSERT INTO stage_files(instance, path, stage, state, errno, message, bytes)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT(instance, path) DO UPDATE SET stage = excluded.stage,
                     state = excluded.state, errno = excluded.errno,
                     message = excluded.message, bytes = excluded.bytes
                 WHERE excluded.stage >= stage_files.stage",
            )?;
            for e in &p.events {
                let Ok(path) = norm_path("path", &e.path) else {
                    tracing::warn!(stage = id, path = %e.path, "coordinator reported a bad path");
                    continue;
                };
                up.execute(params![
                    instance,
                    path,
                    id as i64,
                    e.state.as_str(),
                    if e.state == FileState::Failed {
                        e.errno.max(1)
                    } else {
                        0
                    },
                    e.message,
                    clamp(e.bytes)
                ])?;
                if e.state == FileState::Failed {
                    tx.execute(
                        "UPDATE stages SET error_path = ?2, error_errno = ?3, error_message = ?4
                         WHERE id = ?1 AND error_path IS NULL",
                        params![id as i64, path, e.errno.max(1), e.message],
                    )?;
                }
            }
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
        let state: Option<String> = tx
            .query_row("SELECT state FROM stages WHERE id = ?1", [id as i64], |r| {
                r.get(0)
            })
            .optional()?;
        let Some(state) = state else {
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
                    let path = stage_path(&tx, id)?;
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
            tx.execute(
                "DELETE FROM stage_files WHERE stage = ?1 AND state = 'pending'",
                [id as i64],
            )?;
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
        let state: Option<String> = tx
            .query_row("SELECT state FROM stages WHERE id = ?1", [id as i64], |r| {
                r.get(0)
            })
            .optional()?;
        let Some(state) = state else {
            return Ok(());
        };
        if state == "running" {
            let path = stage_path(&tx, id)?;
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
            tx.execute(
                "DELETE FROM stage_files WHERE stage = ?1 AND state = 'pending'",
                [id as i64],
            )?;
        }
        no_longer_live(&tx, id, now())?;
        tx.commit()?;
        Ok(())
    }
}

/// The stage runs nowhere any more: not live, no cancel owed, finished at `t` unless
/// it already was.
fn no_longer_live(tx: &rusqlite::Transaction<'_>, id: u64, t: i64) -> DbResult<()> {
    tx.execute(
        "UPDATE stages SET live = 0, cancel = 0,
             finished = CASE WHEN finished = 0 THEN ?2 ELSE finished END WHERE id = ?1",
        params![id as i64, t],
    )?;
    Ok(())
}

#[cfg(test)]
mod covering_tests {
    use super::*;

    #[test]
    fn the_newest_stage_of_a_path_or_an_ancestor_covers_it() {
        let mut newest = std::collections::HashMap::new();
        newest.insert("/a".to_string(), (3, StageState::Queued));
        newest.insert("/a/b/f".to_string(), (2, StageState::Deferred));
        newest.insert("/ab".to_string(), (9, StageState::Queued));
        let u = Unenumerated { newest };
        assert_eq!(u.covering("/a/b/f").map(|c| c.0), Some(3));
        assert_eq!(u.covering("/a").map(|c| c.0), Some(3));
        assert_eq!(u.covering("/a/bc").map(|c| c.0), Some(3));
        // `/ab` is no ancestor of `/a/...`, nor `/a` of `/ab`.
        assert_eq!(u.covering("/ab/x").map(|c| c.0), Some(9));
        assert_eq!(u.covering("/b"), None);
        let mut newest = std::collections::HashMap::new();
        newest.insert("/".to_string(), (1, StageState::Queued));
        let root = Unenumerated { newest };
        assert_eq!(root.covering("/x/y").map(|c| c.0), Some(1));
        assert_eq!(root.covering("/").map(|c| c.0), Some(1));
    }
}
