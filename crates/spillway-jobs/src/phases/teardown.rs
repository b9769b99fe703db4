//! `teardown`: destroy a job's (or a persistent instance's) session and wait until it
//! is gone. Without `hurry`, the manager first runs every stage-out still owed; with
//! it, those are dropped, and the answer lists them. Safe to repeat: a token with no
//! session is already torn down.

use super::lookup::find_session;
use super::{wait_for, PhaseError, PhaseResult, STORAGE_WAIT};
use spillway_api::{ApiClient, ApiError, Goal, Session};

pub enum Teardown {
    /// No session has the token (never set up, or already torn down).
    NotFound,
    /// Gone; stage-outs dropped by `hurry`, if any.
    Done { session: u64, dropped: Vec<u64> },
}

/// Tear down the session of `token` as the workload manager: Slurm's teardown of its
/// own job (the token is the job id Slurm chose, the session was made by its setup
/// for the job's user). A teardown on behalf of a user names the user:
/// [`teardown_for`].
pub fn teardown(api: &ApiClient, token: &str, hurry: bool) -> PhaseResult<Teardown> {
    let Some(s) = find_session(api, token)? else {
        return Ok(Teardown::NotFound);
    };
    destroy(api, s, hurry)
}

/// Tear down the session of `token` on behalf of the user `uid`: a job's
/// `#BB destroy_persistent name=` (the token is the instance's name), or a job's own
/// teardown when the caller chose the token (`spillway run --token`). Refused unless
/// `uid` owns the session: whoever runs the tool (root running `spillway run --user`,
/// the SlurmUser running `dw_wlm_cli`, both admins on the manager) lends the job no
/// right over other users' sessions. An admin removes another user's session
/// explicitly, with `dwcli rm session <id>`.
pub fn teardown_for(api: &ApiClient, token: &str, hurry: bool, uid: u32) -> PhaseResult<Teardown> {
    let Some(s) = find_session(api, token)? else {
        return Ok(Teardown::NotFound);
    };
    may_tear_down(&s, token, uid)?;
    destroy(api, s, hurry)
}

/// The owner check of [`teardown_for`]. The message names neither the owner nor the
/// session: a user learns only that the name is not theirs.
pub fn may_tear_down(s: &Session, token: &str, uid: u32) -> PhaseResult<()> {
    if s.owner == uid {
        return Ok(());
    }
    let shown = crate::input::shown(token);
    Err(PhaseError::Refused(
        if token.bytes().all(|b| b.is_ascii_digit()) {
            format!(
                "token {shown} names another user's session, not one of uid {uid}: a job tears down only its own session"
            )
        } else {
            format!(
                "the persistent instance {shown} belongs to another user, not to uid {uid}: only its owner may destroy it (an administrator removes it with `dwcli rm session`)"
            )
        },
    ))
}

fn destroy(api: &ApiClient, s: Session, hurry: bool) -> PhaseResult<Teardown> {
    let mut dropped = Vec::new();
    if s.state.goal == Goal::Create || hurry {
        match api.destroy_session(s.id, hurry) {
            Ok(d) => dropped = d.dropped_stages,
            Err(ApiError::Status { status: 404, .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    wait_for(
        STORAGE_WAIT,
        || {
            format!(
                "session {} to be torn down (dwstat sessions shows what is left)",
                s.id
            )
        },
        || match api.session(s.id) {
            Err(ApiError::Status { status: 404, .. }) => Ok(Some(())),
            Ok(_) => Ok(None),
            Err(e) => Err(e.into()),
        },
    )?;
    Ok(Teardown::Done {
        session: s.id,
        dropped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(owner: u32, token: &str) -> Session {
        serde_json::from_value(serde_json::json!({
            "id": 7, "token": token, "owner": owner, "creator": "CLI",
            "created": 1_700_000_000, "expiration": 0, "expired": false,
            "links": {"client_nodes": [], "instances": [], "activations": []},
            "state": {"goal": "create", "actualized": true, "fuse_blown": false,
                      "mixed": false, "transitioning": false}
        }))
        .expect("a session")
    }

    #[test]
    fn only_the_owner_tears_down() {
        assert!(may_tear_down(&session(1001, "refdb"), "refdb", 1001).is_ok());
        let e = may_tear_down(&session(1002, "refdb"), "refdb", 1001).unwrap_err();
        assert!(matches!(e, PhaseError::Refused(_)));
        let m = e.to_string();
        assert!(
            m.contains("belongs to another user") && m.contains("only its owner"),
            "{m}"
        );
        assert!(!m.contains("1002"), "the owner is not revealed: {m}");
        // Root (uid 0) has no right of its own here: the job's user is who acts.
        assert!(may_tear_down(&session(1002, "refdb"), "refdb", 0).is_err());
        let m = may_tear_down(&session(1002, "4242"), "4242", 1001)
            .unwrap_err()
            .to_string();
        assert!(m.contains("only its own session"), "{m}");
    }
}
