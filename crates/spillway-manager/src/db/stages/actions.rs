//! The API's actions on stages: terminate, revoke or activate one stage
//! (`PATCH /stages/{id}`), or every stage at a path of an instance
//! (`POST /instances/{id}/stage_actions`, what `dw_terminate_*`, `dw_revoke_*` and
//! `dw_activate_*` send).

use super::counts::active_stages;
use super::teardown::terminate_in;
use super::{norm_path, owned_instance, prefix_of, u, UNDER_SQL};
use crate::db::{now, Db, DbError, DbResult, Viewer};
use crate::echo::cut;
use rusqlite::{params, ToSql, Transaction};
use spillway_api::stage_path::at_or_under;
use spillway_api::{Stage, StageAction, StagePathAction, StageScope, StageState};

/// "At `path`" (file scope) or "at or under `path`" (tree scope) as SQL on a `path`
/// column: `sql` uses `?2` (and `?3`); `params` binds them after a first parameter.
struct PathMatch {
    sql: &'static str,
    path: String,
    prefix: Option<String>,
}

impl PathMatch {
    fn new(scope: StageScope, path: &str) -> PathMatch {
        match scope {
            StageScope::File => PathMatch {
                sql: "path = ?2",
                path: path.to_string(),
                prefix: None,
            },
            StageScope::Tree => PathMatch {
                sql: UNDER_SQL,
                path: path.to_string(),
                prefix: Some(prefix_of(path)),
            },
        }
    }

    /// `?1` = `first`, then the path parameters.
    fn params<'a>(&'a self, first: &'a dyn ToSql) -> Vec<&'a dyn ToSql> {
        let mut p: Vec<&dyn ToSql> = vec![first, &self.path];
        if let Some(prefix) = &self.prefix {
            p.push(prefix);
        }
        p
    }
}

/// A deferred stage that will never run.
fn revoke(tx: &Transaction, id: u64) -> DbResult<()> {
    tx.execute(
        "UPDATE stages SET state = 'revoked', finished = ?2 WHERE id = ?1 AND state = 'deferred'",
        params![id as i64, now()],
    )?;
    Ok(())
}

/// A deferred stage queued to run now.
fn activate(tx: &Transaction, id: u64) -> DbResult<()> {
    tx.execute(
        "UPDATE stages SET state = 'queued' WHERE id = ?1 AND state = 'deferred'",
        [id as i64],
    )?;
    Ok(())
}

impl Db {
    /// `PATCH /stages/{id}`.
    pub fn stage_action(&mut self, v: Viewer, id: u64, action: StageAction) -> DbResult<Stage> {
        let s = self.stage(v, id)?;
        let tx = self.conn_mut().transaction()?;
        // Re-read the state inside the transaction.
        let state: String =
            tx.query_row("SELECT state FROM stages WHERE id = ?1", [id as i64], |r| {
                r.get("state")
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
                    revoke(&tx, id)?;
                } else {
                    activate(&tx, id)?;
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
        let path = norm_path("path", &a.path)?.into_string();
        let at = PathMatch::new(a.scope, &path);
        let tx = self.conn_mut().transaction()?;
        owned_instance(&tx, v, instance)?;
        let fits = |paths: &[String]| {
            paths.iter().any(|q| match a.scope {
                StageScope::File => *q == path,
                StageScope::Tree => at_or_under(q, &path),
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
        let states = match a.action {
            StageAction::Terminate => "('pending', 'failed', 'deferred')",
            _ => "('deferred')",
        };
        let holders: Vec<(u64, String)> = {
            let mut st = tx.prepare(&format!(
                "SELECT DISTINCT f.stage AS stage, s.state AS state
                 FROM stage_files f JOIN stages s ON s.id = f.stage
                 WHERE f.instance = ?1 AND f.state IN {states} AND {}",
                at.sql.replace("path", "f.path")
            ))?;
            let inst = instance as i64;
            let rows = st
                .query_map(at.params(&inst).as_slice(), |r| {
                    Ok((u(r.get("stage")?), r.get("state")?))
                })?
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
                    let stage = *id as i64;
                    tx.execute(
                        &format!(
                            "UPDATE stage_files SET state = 'terminated', errno = 0, message = ''
                             WHERE stage = ?1 AND state IN ('pending', 'failed') AND {}",
                            at.sql
                        ),
                        at.params(&stage).as_slice(),
                    )?;
                }
                StageAction::Revoke => revoke(&tx, *id)?,
                StageAction::Activate => activate(&tx, *id)?,
            }
        }
        tx.commit()?;
        Ok(hits.into_iter().map(|(id, _)| id).collect())
    }
}
