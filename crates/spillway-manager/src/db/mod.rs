//! The manager's state in SQLite: every resource, its goal and whether it is reached.
//! All reads the REST API and Slurm need are answered from here, never from servers.
//!
//! * `schema`  — the tables.
//! * `views`   — rows to the API's JSON resources, filtered by who asks.
//! * `changes` — creates, updates and destroy goals asked for through the API.
//! * `reconcile` — what the reconcile loop reads and records.
//! * `stages/`  — staging: requests and actions, file counts, dispatch and watching,
//!   teardown (split API side / loop side as above).

mod changes;
mod reconcile;
mod schema;
mod stages;
mod views;

pub use changes::NewInstancePlan;
pub use reconcile::{
    unmount_item, CacheWork, CallError, ConfigWork, DestroyFragment, FragmentWork, MountWork,
    NodeProbe,
};
pub use stages::{
    instance_paths, norm_path, FileEvent, FileState, LiveStage, Progress, StageEnd, StageFilter,
    StartWork, WatchState, EIO,
};

use rusqlite::{Connection, OptionalExtension};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Forbidden(String),
    /// The request cannot be placed: not enough free space in the pool.
    #[error("{0}")]
    NoSpace(String),
    #[error("database: {0}")]
    Sql(#[from] rusqlite::Error),
}

pub type DbResult<T> = Result<T, DbError>;

/// Who a read is for: admins see everything; a user sees their own objects and
/// public (persistent) instances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Viewer {
    Admin,
    User(u32),
}

pub struct Db {
    conn: Connection,
    limits: UserLimits,
}

/// How many objects one unprivileged user may hold (`max_sessions_per_user`,
/// `max_stages_per_user` in manager.conf): without a bound one user could fill the
/// database and the reconcile loop's and stage dispatcher's work with rows every other
/// user waits behind. Admins (Slurm making job sessions for users) are not limited;
/// Slurm's own limits bound them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserLimits {
    /// Sessions the user owns that are not yet deleted (goal create, or being torn down).
    pub sessions: u32,
    /// Stages the user owns that have not ended (queued, running, deferred).
    pub stages: u32,
    /// Pairs those stages name (a list stage its pairs, another stage one).
    pub stage_pairs: u32,
}

impl Default for UserLimits {
    fn default() -> UserLimits {
        UserLimits {
            sessions: 256,
            stages: 10_000,
            stage_pairs: 100_000,
        }
    }
}

/// Consecutive failures after which an object is no longer retried (the fuse blows).
pub const FUSE_LIMIT: i64 = 8;

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Db {
    /// Open (or create) the database at `path`, mode 0600 with its WAL and shared
    /// memory files: it holds every instance's secret. SQLite would create it 0644 and
    /// its WAL with the database's mode, so the file is made (or made private) first.
    pub fn open(path: &Path) -> DbResult<Db> {
        let private = |p: &Path| {
            spillway_types::files::make_private(p)
                .map_err(|e| DbError::Invalid(format!("cannot make {} private: {e}", p.display())))
        };
        spillway_types::files::precreate_private(path)
            .map_err(|e| DbError::Invalid(format!("cannot create {}: {e}", path.display())))?;
        for suffix in ["-wal", "-shm", "-journal"] {
            let mut side = path.as_os_str().to_owned();
            side.push(suffix);
            private(Path::new(&side))?;
        }
        let conn = Connection::open(path)?;
        Self::init(conn)
    }

    pub fn open_in_memory() -> DbResult<Db> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(conn: Connection) -> DbResult<Db> {
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // WAL: readers (dwstat, Slurm's polls) never wait on the reconcile loop's writes
        // and a crash loses at most the transaction being written.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.execute_batch(schema::SCHEMA)?;
        let version: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
                r.get(0)
            })
            .optional()?;
        match version {
            None => {
                conn.execute(
                    "INSERT INTO meta(key, value) VALUES ('schema', ?1)",
                    [schema::VERSION.to_string()],
                )?;
            }
            Some(v) if v == schema::VERSION.to_string() => {}
            Some(v) => {
                return Err(DbError::Invalid(format!(
                    "database schema version {v}; this manager knows version {}",
                    schema::VERSION
                )))
            }
        }
        Ok(Db {
            conn,
            limits: UserLimits::default(),
        })
    }

    /// The per-user limits creates are checked against (defaults until set).
    pub fn set_user_limits(&mut self, limits: UserLimits) {
        self.limits = limits;
    }

    pub(crate) fn user_limits(&self) -> UserLimits {
        self.limits
    }

    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }

    pub(crate) fn conn_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

/// A goal column to the API enum.
pub(crate) fn goal_of(s: &str) -> spillway_api::Goal {
    if s == "destroy" {
        spillway_api::Goal::Destroy
    } else {
        spillway_api::Goal::Create
    }
}

/// The state object of a row: `transitioning` while the goal is not reached and the
/// fuse is intact.
pub(crate) fn state_of(
    goal: &str,
    actualized: bool,
    failures: i64,
    mixed: bool,
) -> spillway_api::State {
    let fuse_blown = failures >= FUSE_LIMIT;
    spillway_api::State {
        goal: goal_of(goal),
        actualized,
        fuse_blown,
        mixed,
        transitioning: !actualized && !fuse_blown,
    }
}

#[cfg(test)]
mod tests;
