//! `teardown`: destroy a job's (or a persistent instance's) session and wait until it
//! is gone. Without `hurry`, the manager first runs every stage-out still owed; with
//! it, those are dropped, and the answer lists them. Safe to repeat: a token with no
//! session is already torn down.

use super::lookup::find_session;
use super::{wait_for, PhaseResult, STORAGE_WAIT};
use serde::Deserialize;
use spillway_api::{ApiClient, ApiError, Goal, Session};

pub enum Teardown {
    /// No session has the token (never set up, or already torn down).
    NotFound,
    /// Gone; stage-outs dropped by `hurry`, if any.
    Done { session: u64, dropped: Vec<u64> },
}

#[derive(Deserialize)]
struct Destroyed {
    #[serde(default)]
    dropped_stages: Vec<u64>,
}

pub fn teardown(api: &ApiClient, token: &str, hurry: bool) -> PhaseResult<Teardown> {
    let Some(s) = find_session(api, token)? else {
        return Ok(Teardown::NotFound);
    };
    let mut dropped = Vec::new();
    if s.state.goal == Goal::Create || hurry {
        let q = if hurry { "?hurry=true" } else { "" };
        match api.delete::<Destroyed>(&format!("/dw/v1/sessions/{}{q}", s.id)) {
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
        || match api.get::<Session>(&format!("/dw/v1/sessions/{}", s.id)) {
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
