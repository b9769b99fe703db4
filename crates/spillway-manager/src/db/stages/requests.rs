//! The API side of staging: a new stage checked and recorded (`POST /stages`), stages
//! read back as the API shows them (`GET /stages`, `GET /stages/{id}`), and an
//! instance's stage concurrency. Acting on stages is `actions`.

use super::counts::{file_counts, Unenumerated};
use super::{
    lists, norm_path, owned_instance, stage_visible, state_col, u, StageFilter, StagedPaths,
    ACTIVE, EIO, MAX_PAIRS,
};
use crate::db::changes::still_wanted;
use crate::db::{now, Db, DbError, DbResult, UserLimits, Viewer};
use crate::echo::cut;
use rusqlite::{params, OptionalExtension, Row};
use spillway_api::stage_path::at_or_under;
use spillway_api::{
    NewStage, Stage, StageDirection, StageError, StagePair, StageState, StageType, StageWhen,
};

/// The columns `stage_from_row` reads (`list` as `StagedPaths::COLS` has it).
const COLS: &str = "id, instance, session, owner, direction, type, run_when, source, destination,
     pairs, state, files_total, files_done, files_failed, bytes_total, bytes_done, enumerated,
     error_path, error_errno, error_message, server, created, started, finished,
     (SELECT l.list FROM stage_lists l WHERE l.stage = id) AS list";

/// A stages row (`COLS`) as the API shows it.
fn stage_from_row(r: &Row) -> rusqlite::Result<Stage> {
    let error_path: Option<String> = r.get("error_path")?;
    let error = error_path.map(|path| -> rusqlite::Result<StageError> {
        Ok(StageError {
            path,
            errno: r
                .get::<_, Option<i64>>("error_errno")?
                .unwrap_or(EIO as i64) as i32,
            message: r
                .get::<_, Option<String>>("error_message")?
                .unwrap_or_default(),
        })
    });
    let paths = StagedPaths::from_row(r)?;
    Ok(Stage {
        id: u(r.get("id")?),
        instance: u(r.get("instance")?),
        session: u(r.get("session")?),
        owner: r.get::<_, i64>("owner")? as u32,
        direction: paths.direction,
        kind: StageType::parse(&r.get::<_, String>("type")?).unwrap_or(StageType::File),
        when: StageWhen::parse(&r.get::<_, String>("run_when")?).unwrap_or(StageWhen::Immediate),
        source: paths.source,
        destination: paths.destination,
        pairs: paths.pairs,
        state: state_col(r, "state", StageState::Failed)?,
        files_total: u(r.get("files_total")?),
        files_done: u(r.get("files_done")?),
        files_failed: u(r.get("files_failed")?),
        bytes_total: u(r.get("bytes_total")?),
        bytes_done: u(r.get("bytes_done")?),
        enumerated: r.get("enumerated")?,
        error: error.transpose()?,
        server: r.get("server")?,
        created: r.get("created")?,
        started: r.get("started")?,
        finished: r.get("finished")?,
    })
}

/// One (source, destination) pair of `direction`, its instance side and PFS side
/// checked and normalised; the PFS side must lie under one of `pfs_roots`.
fn check_pair(
    direction: StageDirection,
    pfs_roots: &[String],
    src: &str,
    dst: &str,
) -> DbResult<StagePair> {
    let (ipath, ppath) = match direction {
        StageDirection::In => (dst, src),
        StageDirection::Out => (src, dst),
    };
    let ipath = norm_path("instance path", ipath)?.into_string();
    let ppath = norm_path("PFS path", ppath)?.into_string();
    if !pfs_roots.iter().any(|r| at_or_under(&ppath, r)) {
        return Err(DbError::Invalid(format!(
            "PFS path {} is not under this site's PFS roots ({})",
            cut(&ppath),
            pfs_roots.join(", ")
        )));
    }
    Ok(match direction {
        StageDirection::In => StagePair {
            source: ppath,
            destination: ipath,
        },
        StageDirection::Out => StagePair {
            source: ipath,
            destination: ppath,
        },
    })
}

/// The paths of a new stage as they will be stored: source and destination of a file
/// or directory stage, the pairs of a list stage, each checked (`check_pair`).
fn checked_paths(req: &NewStage, pfs_roots: &[String]) -> DbResult<StagedPaths> {
    let check = |src: &str, dst: &str| check_pair(req.direction, pfs_roots, src, dst);
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
            let p = check(&req.source, &req.destination)?;
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
                .map(|p| check(&p.source, &p.destination))
                .collect::<DbResult<Vec<_>>>()?;
            (String::new(), String::new(), pairs)
        }
    };
    Ok(StagedPaths {
        direction: req.direction,
        source,
        destination,
        pairs,
    })
}

/// A user's unended stages and the pairs they name, against `max_stages_per_user` and
/// `max_stage_pairs_per_user`, for one more stage of `pairs` pairs (1 for a file or
/// directory stage). Both bound what one user's queue costs every other user: rows the
/// dispatcher reads, lists it turns into tickets, bytes of the database. A list stage
/// written before `stage_lists` existed counts its JSON array's length.
fn check_user_limits(
    tx: &rusqlite::Transaction,
    uid: u32,
    limits: UserLimits,
    pairs: usize,
) -> DbResult<()> {
    let (held, held_pairs): (i64, i64) = tx.query_row(
        &format!(
            "SELECT COUNT(*), COALESCE(SUM(COALESCE(
                 (SELECT l.count FROM stage_lists l WHERE l.stage = s.id),
                 MAX(json_array_length(s.pairs), 1))), 0)
             FROM stages s WHERE s.owner = ?1 AND s.state IN {ACTIVE}"
        ),
        [uid as i64],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    if held >= i64::from(limits.stages) {
        return Err(DbError::Conflict(format!(
            "uid {uid} already has {held} stages not yet ended (queued, running or \
             deferred); max_stages_per_user is {}: wait for some to end or terminate them",
            limits.stages
        )));
    }
    if held_pairs.saturating_add(pairs as i64) > i64::from(limits.stage_pairs) {
        return Err(DbError::Conflict(format!(
            "uid {uid} already has {held_pairs} files named by stages not yet ended \
             (queued, running or deferred; a list stage counts its pairs, another stage \
             one) and this stage names {pairs}; max_stage_pairs_per_user is {}: wait for \
             some to end or terminate them",
            limits.stage_pairs
        )));
    }
    Ok(())
}

impl Db {
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
        let paths = checked_paths(req, pfs_roots)?;
        let ipaths = paths.instance_paths();
        if req.kind != StageType::Directory {
            if let Some(p) = ipaths.iter().find(|p| *p == "/") {
                return Err(DbError::Invalid(format!(
                    "instance path {p} is the instance's root directory: use a directory stage"
                )));
            }
        }
        let limits = self.user_limits();
        let tx = self
            .conn_mut()
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let (session, goal) = owned_instance(&tx, v, req.instance)?;
        still_wanted("instance", req.instance, &goal)?;
        refuse_cache(&tx, req.instance)?;
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
            check_user_limits(&tx, uid, limits, paths.pairs.len().max(1))?;
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
                paths.source,
                paths.destination,
                // The pairs go to stage_lists, once.
                "[]",
                state.as_str(),
                now()
            ],
        )?;
        let id = tx.last_insert_rowid() as u64;
        if !paths.pairs.is_empty() {
            tx.execute(
                "INSERT INTO stage_lists(stage, count, list) VALUES (?1, ?2, ?3)",
                params![
                    id as i64,
                    paths.pairs.len() as i64,
                    lists::encode(&paths.pairs)
                ],
            )?;
        }
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
                stage_from_row,
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
            .query_row(&sql, [id as i64], stage_from_row)
            .optional()?
            .ok_or_else(|| DbError::NotFound(format!("no stage {id}")))
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
}

/// A cache instance is never staged: its files are the PFS directory's, read through
/// on demand and written behind (docs/cache.md). A stage asked of one is refused at
/// the call (400; libdatawarp's `-EINVAL`), not accepted and failed later.
fn refuse_cache(tx: &rusqlite::Transaction<'_>, instance: u64) -> DbResult<()> {
    use rusqlite::OptionalExtension;
    let pfs: Option<String> = tx
        .query_row(
            "SELECT cc.pfs FROM configurations c JOIN cache_configs cc ON cc.configuration = c.id
              WHERE c.instance = ?1 AND c.type = 'cache' AND c.goal = 'create' LIMIT 1",
            [instance as i64],
            |r| r.get(0),
        )
        .optional()?;
    match pfs {
        Some(dir) => Err(DbError::Invalid(format!(
            "instance {instance} is a cache of {}: its files are the PFS's, fetched on \
             demand and written behind, so it is not staged (to have a file's changes on \
             the PFS now: dw_wait_sync_complete, or the sync_on_close/sync_to_pfs policies)",
            cut(&dir)
        ))),
        None => Ok(()),
    }
}
