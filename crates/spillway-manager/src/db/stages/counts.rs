//! What `dw_query_*` and `dw_wait_*` read: the counts of a file or a tree of an
//! instance (from the per-file records, and the active stages not yet enumerated that
//! name it), which stage covers a path, and the failed records.
//!
//! A file counts once: the newest of its record and the unenumerated stages covering
//! it decides whether it is complete, pending, deferred or failed.

use super::{norm_path, state_col};
use super::{owned_instance, prefix_of, u, StagedPaths, ACTIVE, UNDER_SQL};
use crate::db::{Db, DbResult, Viewer};
use rusqlite::{params, Connection, OptionalExtension, Row};
use spillway_api::stage_path::at_or_under;
use spillway_api::{StageCounts, StageFailure, StageFailures, StageScope, StageState};
use std::collections::HashMap;

/// An active stage of an instance with its instance paths.
pub(super) struct ActiveStage {
    pub(super) id: u64,
    pub(super) state: StageState,
    pub(super) enumerated: bool,
    pub(super) paths: Vec<String>,
}

impl ActiveStage {
    fn from_row(r: &Row) -> rusqlite::Result<ActiveStage> {
        Ok(ActiveStage {
            id: u(r.get("id")?),
            state: state_col(r, "state", StageState::Queued)?,
            enumerated: r.get("enumerated")?,
            paths: StagedPaths::from_row(r)?.instance_paths(),
        })
    }
}

/// The active (queued, deferred, running) stages of `instance`, oldest first.
pub(super) fn active_stages(conn: &Connection, instance: u64) -> DbResult<Vec<ActiveStage>> {
    let mut st = conn.prepare_cached(&format!(
        "SELECT id, state, enumerated, {} FROM stages
         WHERE instance = ?1 AND state IN {ACTIVE} ORDER BY id",
        StagedPaths::COLS
    ))?;
    let rows = st
        .query_map([instance as i64], ActiveStage::from_row)?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// `n` records in `state` (a `stage_files` state).
fn add_record(c: &mut StageCounts, state: &str, n: u64) {
    match state {
        "complete" => c.complete += n,
        "pending" => c.pending += n,
        "deferred" => c.deferred += n,
        "failed" => c.failed += n,
        _ => {}
    }
}

/// A stage not yet enumerated counts as one pending (or deferred) file.
fn add_unenumerated(c: &mut StageCounts, state: StageState) {
    if state == StageState::Deferred {
        c.deferred += 1;
    } else {
        c.pending += 1;
    }
}

/// The counts of `path` (normalised) in `instance`. For a file, at most one count is
/// non-zero (`file_counts`); for a tree, every record at or under it, and each
/// unenumerated stage naming a path at, under or above it once.
fn counts_in(
    conn: &Connection,
    instance: u64,
    path: &str,
    scope: StageScope,
) -> DbResult<StageCounts> {
    if scope == StageScope::File {
        let unenumerated = Unenumerated::of(conn, instance)?;
        return Ok(file_counts(conn, instance, path, &unenumerated)?.0);
    }
    let mut c = StageCounts::default();
    let unenumerated: Vec<ActiveStage> = active_stages(conn, instance)?
        .into_iter()
        .filter(|s| !s.enumerated)
        .filter(|s| {
            s.paths
                .iter()
                .any(|q| at_or_under(path, q) || at_or_under(q, path))
        })
        .collect();
    for s in &unenumerated {
        add_unenumerated(&mut c, s.state);
    }
    let mut st = conn.prepare_cached(&format!(
        "SELECT state, COUNT(*) AS n FROM stage_files WHERE instance = ?1 AND {UNDER_SQL}
         GROUP BY state"
    ))?;
    let rows = st
        .query_map(params![instance as i64, path, prefix_of(path)], |r| {
            Ok((r.get::<_, String>("state")?, r.get::<_, i64>("n")?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut any = !unenumerated.is_empty();
    for (state, n) in rows {
        any |= n > 0;
        add_record(&mut c, &state, u(n));
    }
    c.started = any;
    Ok(c)
}

/// The active stages of an instance not yet enumerated, by the instance paths they
/// name (the newest stage of each path): which stage covers a file is a lookup of the
/// file and its ancestors, not a scan of every stage. A new list stage checks each of
/// its (up to `MAX_PAIRS`) paths against it: with a scan, two large list stages made
/// that pairs × pairs JSON parses under the database lock, stalling every request.
pub(super) struct Unenumerated {
    newest: HashMap<String, (u64, StageState)>,
}

impl Unenumerated {
    pub(super) fn of(conn: &Connection, instance: u64) -> DbResult<Unenumerated> {
        let mut newest = HashMap::new();
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
pub(super) fn file_counts(
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
            |r| Ok((r.get("stage")?, r.get("state")?)),
        )
        .optional()?;
    // An unenumerated stage decides if it is newer than the record (or there is none).
    let newer = unenumerated
        .covering(path)
        .filter(|(id, _)| rec.as_ref().is_none_or(|(rs, _)| *id > u(*rs)));
    match (newer, rec) {
        (Some((id, state)), _) => {
            add_unenumerated(&mut c, state);
            c.started = true;
            Ok((c, Some(id)))
        }
        (None, Some((rs, state))) => {
            add_record(&mut c, &state, 1);
            let blocking = (state == "pending" || state == "deferred").then_some(u(rs));
            c.started = true;
            Ok((c, blocking))
        }
        (None, None) => Ok((c, None)),
    }
}

impl Db {
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
        counts_in(self.conn(), instance, path.as_str(), scope)
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
                    path: r.get("path")?,
                    errno: r.get::<_, i64>("errno")? as i32,
                    message: r.get("message")?,
                    stage: u(r.get("stage")?),
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let more = failures.len() > limit as usize;
        failures.truncate(limit as usize);
        Ok(StageFailures { failures, more })
    }
}

#[cfg(test)]
mod covering_tests {
    use super::*;

    #[test]
    fn the_newest_stage_of_a_path_or_an_ancestor_covers_it() {
        let mut newest = HashMap::new();
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
        let mut newest = HashMap::new();
        newest.insert("/".to_string(), (1, StageState::Queued));
        let root = Unenumerated { newest };
        assert_eq!(root.covering("/x/y").map(|c| c.0), Some(1));
        assert_eq!(root.covering("/").map(|c| c.0), Some(1));
    }
}
