//! The bridge from the control channel to the manager's REST API: the `Rest` trait
//! (the real manager is `ApiClient`; tests fake it), the requests the channel makes
//! (paths and query strings from `spillway_api::paths`/`query`, JSON bodies in the
//! API's words), and the mapping of HTTP errors to errnos.
//!
//! Every call acts as the caller of the ioctl (`ACT_AS_HEADER` with the kernel's uid):
//! the manager authorises it exactly as that user's own call.

use super::codec::{Action, Direction, Scope, StageKind, When};
use serde_json::{json, Value};
use spillway_api::paths;
use spillway_api::query::{CountsQuery, FailuresQuery};
use spillway_api::{ApiClient, ApiError, StageScope};
use spillway_types::Errno;

/// Percent-encode a query value (everything but RFC 3986's unreserved characters and `/`).
pub use spillway_api::query::escape_query as query_escape;

/// The manager as the channel uses it (the real one is `ApiClient`; tests fake it).
/// Every call is made as the user `uid` (the caller of the ioctl).
pub trait Rest: Send + Sync {
    fn get(&self, uid: u32, path: &str) -> Result<Value, ApiError>;
    /// POST, PATCH or PUT with a JSON body.
    fn send(&self, uid: u32, method: &str, path: &str, body: &Value) -> Result<Value, ApiError>;
}

impl Rest for ApiClient {
    fn get(&self, uid: u32, path: &str) -> Result<Value, ApiError> {
        self.get_as(Some(uid), path)
    }
    fn send(&self, uid: u32, method: &str, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.send_as(Some(uid), method, path, body)
    }
}

/// HTTP errors as errnos (docs/staging.md, docs/libdatawarp.md): 400 EINVAL, 401/403
/// EACCES (another user's instance the caller may see), 404 ENOENT (also one they may
/// not see), 409 EBUSY, anything else EIO; a manager that cannot be reached EHOSTUNREACH.
pub fn api_errno(e: &ApiError) -> Errno {
    match e {
        ApiError::Status { status, .. } => Errno(match status {
            400 => libc::EINVAL,
            401 | 403 => libc::EACCES,
            404 => libc::ENOENT,
            409 => libc::EBUSY,
            _ => libc::EIO,
        }),
        ApiError::Unreachable { .. } => Errno(libc::EHOSTUNREACH),
        ApiError::Protocol(_) | ApiError::Local(_) => Errno(libc::EIO),
    }
}

fn stage_scope(s: Scope) -> StageScope {
    match s {
        Scope::File => StageScope::File,
        Scope::Tree => StageScope::Tree,
    }
}

/// A new stage as `POST` to `paths::STAGES` takes it. Its paths are instance paths.
pub(super) struct NewStage<'a> {
    pub direction: Direction,
    pub kind: StageKind,
    pub when: When,
    /// Source and destination of a file or directory stage ("" for a list).
    pub source: &'a str,
    pub destination: &'a str,
    /// The (source, destination) pairs of a list stage (none otherwise).
    pub pairs: &'a [(String, String)],
}

/// The manager's API for one instance, acting as one caller.
pub(super) struct Manager<'a> {
    pub rest: &'a dyn Rest,
    pub uid: u32,
    pub instance: u64,
}

impl Manager<'_> {
    /// Create a stage owned by the caller; the answer holds its `id`.
    pub(super) fn create_stage(&self, s: &NewStage<'_>) -> Result<Value, ApiError> {
        let body = json!({
            "instance": self.instance,
            "direction": s.direction.word(),
            "type": s.kind.word(),
            "source": s.source,
            "destination": s.destination,
            "pairs": s.pairs.iter().map(|(s, d)| json!({"source": s, "destination": d}))
                .collect::<Vec<_>>(),
            "when": s.when.word(),
            "owner": self.uid,
        });
        self.rest.send(self.uid, "POST", paths::STAGES, &body)
    }

    /// The stage counts at `path`, waiting up to `wait_secs` for the pending ones to end.
    pub(super) fn stage_counts(
        &self,
        scope: Scope,
        path: &str,
        wait_secs: Option<u32>,
    ) -> Result<Value, ApiError> {
        let q = CountsQuery {
            path: path.to_string(),
            scope: Some(stage_scope(scope)),
            wait: wait_secs.map(u64::from),
        };
        self.rest
            .get(self.uid, &paths::stage_counts(self.instance, &q))
    }

    /// Terminate, revoke or activate the stages at `path`; the answer lists them.
    pub(super) fn stage_actions(
        &self,
        action: Action,
        scope: Scope,
        path: &str,
    ) -> Result<Value, ApiError> {
        let body = json!({
            "action": action.word(),
            "path": path,
            "scope": scope.word(),
        });
        let p = paths::stage_actions(self.instance);
        self.rest.send(self.uid, "POST", &p, &body)
    }

    /// Set the instance's stage concurrency; the answer holds the value it took.
    pub(super) fn set_stage_concurrency(&self, value: u32) -> Result<Value, ApiError> {
        let p = paths::stage_concurrency(self.instance);
        self.rest
            .send(self.uid, "PUT", &p, &json!({ "value": value }))
    }

    /// Up to `limit` failed files after the instance path `after`, in path order.
    pub(super) fn stage_failures(&self, after: &str, limit: u32) -> Result<Value, ApiError> {
        let q = FailuresQuery {
            after: Some(after.to_string()),
            limit: Some(limit),
        };
        self.rest
            .get(self.uid, &paths::stage_failures(self.instance, &q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_escaped() {
        assert_eq!(query_escape("/a b&c=d%"), "/a%20b%26c%3Dd%25");
    }
}
