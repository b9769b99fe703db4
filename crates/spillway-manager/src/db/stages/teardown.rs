//! Stages that end early and stages that outlive their instance: terminating, `hurry`
//! dropping stage-outs, what an early end leaves in the records and the stage's error,
//! the teardown rules inside the reconcile loop (deferred stage-outs activated,
//! stage-ins ended, fragments held while a stage-out is pending) and pruning.

use super::{
    own_error_path, owned_instance, u, StagedPaths, ACTIVE, ECANCELED, EIO, STAGE_RETENTION_SECS,
};
use crate::db::{now, Db, DbError, DbResult, Viewer};
use rusqlite::{params, OptionalExtension, Transaction};
use spillway_api::StageState;

/// A stage ended before its files did (`terminated`, or `dropped` by hurry): its
/// pending, deferred and failed records take that state, and every path the stage
/// named gets such a record unless a newer stage (or this one's own outcome) holds it.
/// So the path's newest record is about this, its latest stage: `dw_query_*` answers
/// "started, nothing complete, pending, deferred or failed" and `dw_wait_*` returns,
/// instead of forgetting the stage (EINVAL) or answering about an older one.
pub(super) fn end_records(tx: &Transaction, id: u64, state: &str) -> DbResult<()> {
    tx.execute(
        "UPDATE stage_files SET state = ?2, errno = 0, message = ''
         WHERE stage = ?1 AND state IN ('pending', 'deferred', 'failed')",
        params![id as i64, state],
    )?;
    let Some((instance, paths)) = StagedPaths::of(tx, id)? else {
        return Ok(());
    };
    let mut up = tx.prepare_cached(
        "INSERT INTO stage_files(instance, path, stage, state, errno, message, bytes)
         VALUES (?1, ?2, ?3, ?4, 0, '', 0)
         ON CONFLICT(instance, path) DO UPDATE SET stage = excluded.stage,
             state = excluded.state, errno = 0, message = '', bytes = 0
         WHERE excluded.stage > stage_files.stage",
    )?;
    for path in paths.instance_paths() {
        up.execute(params![instance, path, id as i64, state])?;
    }
    Ok(())
}

/// What a stage that ended early left, for its `error` (kept if it has one already):
/// `how` is "terminated" or "dropped by a hurried teardown", `was` the state it was in.
pub(super) fn early_end_error(
    tx: &Transaction,
    id: u64,
    how: &str,
    was: StageState,
) -> DbResult<()> {
    let row: Option<(String, i64)> = tx
        .query_row(
            "SELECT direction, files_done FROM stages WHERE id = ?1",
            [id as i64],
            |r| Ok((r.get("direction")?, r.get("files_done")?)),
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
    let path = own_error_path(tx, id)?;
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
pub(super) fn terminate_in(tx: &Transaction, id: u64, state: StageState) -> DbResult<()> {
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
            .query_map([*i as i64], |r| Ok((r.get("id")?, r.get("state")?)))?
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

impl Db {
    /// `DELETE /sessions/{id}?hurry=true`, before the destroy goal is set: checks that
    /// `v` may destroy the session, drops its instances' stage-outs.
    pub fn hurry_session(&mut self, v: Viewer, session: u64) -> DbResult<Vec<u64>> {
        let tx = self.conn_mut().transaction()?;
        let owner: Option<i64> = tx
            .query_row(
                "SELECT owner FROM sessions WHERE id = ?1",
                [session as i64],
                |r| r.get("owner"),
            )
            .optional()?;
        let owner = owner.ok_or_else(|| DbError::NotFound(format!("no session {session}")))?;
        if let Viewer::User(uid) = v {
            if owner as u32 != uid {
                return Err(crate::db::views::refusal(&tx, uid, "session", session));
            }
        }
        let insts: Vec<u64> = tx
            .prepare("SELECT id FROM instances WHERE session = ?1 ORDER BY id")?
            .query_map([session as i64], |r| r.get::<_, i64>("id"))?
            .map(|r| r.map(u))
            .collect::<Result<_, _>>()?;
        let dropped = drop_stage_outs(&tx, &insts)?;
        tx.commit()?;
        Ok(dropped)
    }

    /// `DELETE /instances/{id}?hurry=true`, before the destroy goal is set.
    pub fn hurry_instance(&mut self, v: Viewer, instance: u64) -> DbResult<Vec<u64>> {
        let tx = self.conn_mut().transaction()?;
        owned_instance(&tx, v, instance)?;
        let dropped = drop_stage_outs(&tx, &[instance])?;
        tx.commit()?;
        Ok(dropped)
    }

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
            .query_map([], |r| Ok((r.get("id")?, r.get("instance")?)))?
            .collect::<Result<_, _>>()?;
        for (id, inst) in stuck {
            let path = own_error_path(tx, id as u64)?;
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
        let tx = self.conn_mut().transaction()?;
        let n = tx.execute(
            &format!(
                "DELETE FROM stages WHERE state NOT IN {ACTIVE} AND live = 0 AND finished < ?1
                   AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = stages.instance)"
            ),
            [now() - STAGE_RETENTION_SECS],
        )?;
        // Their lists go with them.
        tx.execute(
            "DELETE FROM stage_lists WHERE NOT EXISTS
                 (SELECT 1 FROM stages s WHERE s.id = stage_lists.stage)",
            [],
        )?;
        tx.commit()?;
        Ok(n)
    }
}
