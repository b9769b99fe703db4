//! The burst-buffer phases of one job, on the manager's REST API. Slurm's
//! `dw_wlm_cli` calls, `burst_buffer.lua` and `spillway run` all drive these same
//! functions; none keeps state between calls: the job is found again from its token
//! (the job id, or a persistent instance's name) each time, so every phase can be
//! repeated (Slurm repeats teardown forever, and re-runs phases after a restart).
//!
//! | phase | what it does on the manager |
//! |---|---|
//! | `setup` | session (token, owner) at once; then the job instance, its configuration, and the job instance's stage-outs registered as deferred (owed from now on) |
//! | `data_in` | waits for the instance to be built; posts the stage-ins (as the owner) and waits for them |
//! | `paths` | the `DW_*` variables: mount points of the job's configurations, from the database only |
//! | `pre_run` | the session's client nodes; an activation per configuration; waits until every node mounted |
//! | `post_run` | removes the activations; waits until every node unmounted (and so flushed) |
//! | `data_out` | runs the stage-outs (the deferred ones activated) and waits for them |
//! | `teardown` | destroys the session (with `hurry`, owed stage-outs are dropped and listed); waits until it is gone |
//!
//! `fits`: requests that can never be met (more than a pool holds), refused at submit.

pub mod fits;
mod lookup;
mod mounts;
mod persistent;
mod setup;
pub mod shown;
mod stages;
mod teardown;

pub use lookup::{find_session, Job, PersistentUse};
pub use mounts::{mount_point, paths, post_run, pre_run, MountKind};
pub use persistent::{configure_persistent_caches, create_persistent, NewPersistent};
pub use setup::{setup, SetupRequest};
pub use stages::{data_in, data_out};
pub use teardown::{may_tear_down, teardown, teardown_for, Teardown};

use spillway_api::ApiError;
use std::fmt;
use std::time::{Duration, Instant};

/// Why a phase failed.
#[derive(Debug)]
pub enum PhaseError {
    /// No session has this token (Slurm: `No matching session` counts as done for
    /// data_in, data_out and teardown).
    NoSession(String),
    Api(ApiError),
    /// The phase ran and something in it failed (a stage, a mount).
    Failed(String),
    /// The user the phase acts for may not do this (another user's session).
    Refused(String),
}

impl From<ApiError> for PhaseError {
    fn from(e: ApiError) -> Self {
        PhaseError::Api(e)
    }
}

impl fmt::Display for PhaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The words Slurm looks for.
            PhaseError::NoSession(t) => write!(f, "No matching session for token {t}"),
            PhaseError::Api(e) => write!(f, "{e}"),
            PhaseError::Failed(m) | PhaseError::Refused(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for PhaseError {}

impl PhaseError {
    /// The manager could not be reached or failed inside (5xx): worth asking again
    /// after a pause (it may be restarting). A refusal (4xx), a failed stage or mount,
    /// or an answer of the wrong shape is not.
    pub fn is_transient(&self) -> bool {
        match self {
            PhaseError::Api(ApiError::Unreachable { .. }) => true,
            PhaseError::Api(ApiError::Status { status, .. }) => *status >= 500,
            _ => false,
        }
    }
}

pub type PhaseResult<T> = Result<T, PhaseError>;

/// How long a phase waits for storage (an instance to be built, nodes to mount or
/// unmount, a session to go) before it fails and says what it was waiting for. Below
/// Slurm's default OtherTimeout (300 s), so that the tool answers before it is killed;
/// the next call (Slurm retries teardown, re-runs pre_run) picks up where it stopped.
pub const STORAGE_WAIT: Duration = Duration::from_secs(240);

/// Poll `check` until it gives a value, an error, or `limit` passes (then `Failed`
/// with `what`). Polls start fast (a local manager answers in milliseconds) and back
/// off to half a second.
pub(crate) fn wait_for<T>(
    limit: Duration,
    what: impl Fn() -> String,
    mut check: impl FnMut() -> PhaseResult<Option<T>>,
) -> PhaseResult<T> {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(20);
    loop {
        if let Some(v) = check()? {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(PhaseError::Failed(format!(
                "gave up after {} s waiting for {}",
                limit.as_secs(),
                what()
            )));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}
