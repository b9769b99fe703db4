//! Stages (docs/staging.md): requests recorded through the API, the per-file records
//! that answer `dw_query_*`, what the stage dispatcher starts and what its watchers
//! record, and the teardown rules (deferred stage-outs activated, fragments held while a
//! stage-out is pending, `hurry` dropping them).
//!
//! As `db/` splits the API side (`changes`) from the loop side (`reconcile`):
//!
//! * this file — the types other modules use, who may see and stage on what, the rows
//!   every part reads (`StagedPaths`), the path rules' SQL form.
//! * `requests` — the API side: create, list and read stages.
//! * `actions`  — the API side: terminate, revoke, activate by id or by path.
//! * `counts`   — per-file counts (`dw_query_*`), failures, what covers a path.
//! * `teardown` — ending stages early (terminate, hurry), teardown holds, pruning.
//! * `dispatch` — the loop side: starting queued stages, what their watchers record.
//! * `lists`    — the stored form of a list stage's pairs (`stage_lists`).
//!
//! Paths: instance paths are absolute from the instance root, PFS paths absolute; both
//! are kept normalised ([`StagePath`]: no empty, `.` or `..` components, no trailing
//! `/`), so "at or under" is a plain prefix test, in Rust (`at_or_under`) and in SQL
//! (`UNDER_SQL` with `prefix_of`).

mod actions;
mod counts;
mod dispatch;
mod lists;
mod requests;
mod teardown;

#[cfg(test)]
mod tests;

use super::{DbError, DbResult, Viewer};
use crate::echo::quoted;
use rusqlite::{Connection, OptionalExtension, Row};
use spillway_api::stage_path::{StagePath, StagePathError};
use spillway_api::{StageDirection, StagePair, StageState, StageType};

/// Active states, as SQL.
const ACTIVE: &str = "('queued','deferred','running')";

/// Finished stages of instances that are gone are forgotten after this long.
pub(super) const STAGE_RETENTION_SECS: i64 = 86400;

/// At most this many pairs in one list stage.
pub(super) const MAX_PAIRS: usize = 100_000;

/// errno values the manager itself records.
pub const EIO: i32 = 5;
/// A stage terminated or dropped before its end (Linux's ECANCELED).
pub(super) const ECANCELED: i32 = 125;

/// A path as the API takes it ([`StagePath::parse`]): absolute, at most 4096 bytes, no
/// NUL, components of at most 255 bytes and none `..`. Repeated and trailing slashes
/// and `.` are dropped. `what` names it in the error.
pub fn norm_path(what: &str, p: &str) -> DbResult<StagePath> {
    StagePath::parse(p).map_err(|e| {
        DbError::Invalid(match e {
            // The path itself is not echoed: it may be huge or hold a NUL.
            StagePathError::TooLong | StagePathError::Nul => {
                format!("{what} is too long or holds a NUL byte")
            }
            StagePathError::NotAbsolute
            | StagePathError::DotDot
            | StagePathError::Dot
            | StagePathError::NameTooLong => format!("{what} {} {e}", quoted(p)),
        })
    })
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

/// "`path` at or under `?2`", with `?3` bound to `prefix_of(?2)`.
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

/// A stage the dispatcher should start now.
#[derive(Clone, Debug)]
pub struct StartWork {
    pub stage: u64,
    pub instance: u64,
    pub direction: StageDirection,
    pub kind: StageType,
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

/// A count or id column (never negative when the manager wrote it) as unsigned.
fn u(v: i64) -> u64 {
    v.max(0) as u64
}

/// A state column; `or` for a value this manager does not know.
fn state_col(r: &Row, col: &str, or: StageState) -> rusqlite::Result<StageState> {
    Ok(StageState::parse(&r.get::<_, String>(col)?).unwrap_or(or))
}

/// The paths a stage's row names: its direction with its source and destination (file
/// and directory stages) or its pairs (list stages: `stage_lists`, or the JSON `pairs`
/// column of a row written before it).
struct StagedPaths {
    direction: StageDirection,
    source: String,
    destination: String,
    pairs: Vec<StagePair>,
}

impl StagedPaths {
    /// The columns `from_row` reads (unqualified: `s.direction` reads as well; the
    /// query's table must have an `id`, which `stage_lists` has not).
    const COLS: &'static str = "direction, source, destination, pairs, \
         (SELECT l.list FROM stage_lists l WHERE l.stage = id) AS list";

    fn from_row(r: &Row) -> rusqlite::Result<StagedPaths> {
        let list: Option<Vec<u8>> = r.get("list")?;
        let pairs = match list {
            Some(b) => lists::decode(&b).unwrap_or_default(),
            None => serde_json::from_str(&r.get::<_, String>("pairs")?).unwrap_or_default(),
        };
        Ok(StagedPaths {
            direction: StageDirection::parse(&r.get::<_, String>("direction")?)
                .unwrap_or(StageDirection::In),
            source: r.get("source")?,
            destination: r.get("destination")?,
            pairs,
        })
    }

    /// The stage's instance-side paths.
    fn instance_paths(&self) -> Vec<String> {
        instance_paths(self.direction, &self.source, &self.destination, &self.pairs)
    }

    /// (source, destination) pairs: the one pair of a file or directory stage.
    fn into_pairs(self) -> Vec<StagePair> {
        if self.pairs.is_empty() {
            vec![StagePair {
                source: self.source,
                destination: self.destination,
            }]
        } else {
            self.pairs
        }
    }

    /// Those of stage `id`, if it exists.
    fn of(conn: &Connection, id: u64) -> DbResult<Option<(i64, StagedPaths)>> {
        Ok(conn
            .query_row(
                &format!(
                    "SELECT instance, {} FROM stages WHERE id = ?1",
                    StagedPaths::COLS
                ),
                [id as i64],
                |r| Ok((r.get("instance")?, StagedPaths::from_row(r)?)),
            )
            .optional()?)
    }
}

/// The instance path a stage's own error names when no file is to blame: its first
/// instance path ("" for a stage that is gone).
fn own_error_path(conn: &Connection, id: u64) -> DbResult<String> {
    Ok(StagedPaths::of(conn, id)?
        .and_then(|(_, s)| s.instance_paths().into_iter().next())
        .unwrap_or_default())
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
            "SELECT i.session AS session, i.goal AS goal, s.owner AS owner
             FROM instances i JOIN sessions s ON s.id = i.session WHERE i.id = ?1",
            [id as i64],
            |r| Ok((r.get("session")?, r.get("goal")?, r.get("owner")?)),
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

#[cfg(test)]
mod norm_path_tests {
    use super::*;

    fn message(what: &str, p: &str) -> String {
        match norm_path(what, p) {
            Err(DbError::Invalid(m)) => m,
            other => panic!("{p:?}: {other:?}"),
        }
    }

    /// The API's 400 messages, word for word.
    #[test]
    fn refusals_name_what_and_the_path() {
        assert_eq!(
            message("instance path", "a/b"),
            "instance path \"a/b\" is not an absolute path"
        );
        assert_eq!(
            message("PFS path", "/a/../b"),
            "PFS path \"/a/../b\" has .. components"
        );
        // A long path is echoed cut, as every echo of input is.
        let long = format!("/{}", "n".repeat(256));
        assert_eq!(
            message("path", &long),
            format!("path {} has a name longer than 255 bytes", quoted(&long))
        );
        assert_eq!(
            message("path", "/a\0b"),
            "path is too long or holds a NUL byte"
        );
        assert_eq!(
            message("path", &"/a".repeat(2049)),
            "path is too long or holds a NUL byte"
        );
    }
}
