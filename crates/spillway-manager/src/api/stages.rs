//! Staging's part of the API (docs/staging.md): stages, the per-instance queries and
//! actions libdatawarp needs, and long polls (`?wait=`) on the version watch.

use super::{parse_id, ApiErr, AppState};
use crate::auth::Caller;
use crate::db::{Db, StageFilter};
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::{json, Value};
use spillway_api::query::{CountsQuery, DestroyQuery, FailuresQuery, StageListQuery, WaitQuery};
use spillway_api::*;
use std::time::{Duration, Instant};

type Res<T> = Result<Json<T>, ApiErr>;

/// The longest `?wait=` (seconds).
pub(super) const WAIT_MAX: u64 = 60;

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, ApiErr> {
    b.map(|Json(t)| t).map_err(|e| super::body_rejected(&e))
}

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiErr> {
    q.map(|Query(t)| t).map_err(|e| {
        ApiErr::bad(format!(
            "invalid query: {}",
            crate::echo::cut_to(&e.body_text(), crate::echo::LIBRARY_TEXT_MAX)
        ))
    })
}

fn wait_of(w: Option<u64>) -> Result<Duration, ApiErr> {
    match w {
        Some(s) if s > WAIT_MAX => {
            Err(ApiErr::bad(format!("wait={s}: at most {WAIT_MAX} seconds")))
        }
        s => Ok(Duration::from_secs(s.unwrap_or(0))),
    }
}

/// Answer `read` at once, or when `done` holds, or when `wait` is up: the caller is
/// authenticated once (a MUNGE credential works once), then the read is repeated after
/// every change of the version watch.
async fn long_poll<T, F, D>(
    st: &AppState,
    h: &HeaderMap,
    wait: Duration,
    read: F,
    done: D,
) -> Result<T, ApiErr>
where
    T: Send + 'static,
    F: Fn(&Caller, &mut Db) -> Result<T, ApiErr> + Clone + Send + 'static,
    D: Fn(&T) -> bool,
{
    // Subscribed before the first read: no change after it is missed.
    let mut rx = st.version.subscribe();
    let first = read.clone();
    let (caller, mut v) = st.read(h, move |c, db| Ok((*c, first(c, db)?))).await?;
    let deadline = Instant::now() + wait;
    while !done(&v) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match tokio::time::timeout(left, rx.changed()).await {
            Ok(Ok(())) => {
                rx.borrow_and_update();
            }
            _ => break,
        }
        let db = st.db.clone();
        let again = read.clone();
        v = tokio::task::spawn_blocking(move || {
            let mut db = db.lock().unwrap_or_else(|e| e.into_inner());
            again(&caller, &mut db)
        })
        .await
        .map_err(|e| ApiErr::internal(format!("request handler failed: {e}")))??;
    }
    Ok(v)
}

// ------------------------------------------------------------------ stages
pub(super) async fn create_stage(
    State(st): State<AppState>,
    h: HeaderMap,
    b: Result<Json<NewStage>, JsonRejection>,
) -> Result<(StatusCode, Json<Stage>), ApiErr> {
    let req = body(b)?;
    let roots = st.cfg.pfs_roots.clone();
    st.change(&h, move |c, db| {
        let s = db.create_stage(c.viewer(), c.uid, &req, &roots)?;
        tracing::info!(
            stage = s.id,
            instance = s.instance,
            owner = s.owner,
            direction = s.direction.as_str(),
            "stage recorded"
        );
        Ok((StatusCode::CREATED, Json(s)))
    })
    .await
}

pub(super) async fn list_stages(
    State(st): State<AppState>,
    h: HeaderMap,
    q: Result<Query<StageListQuery>, QueryRejection>,
) -> Res<Value> {
    let q = query(q)?;
    let state = match q.state.as_deref() {
        None | Some("") => None,
        Some(s) => Some(StageState::parse(s).ok_or_else(|| {
            ApiErr {
                status: StatusCode::BAD_REQUEST,
                message: format!("unknown stage state {}", super::quoted(s)),
                choices: Some(
                    StageState::ALL
                        .iter()
                        .map(|s| s.as_str().to_string())
                        .collect(),
                ),
            }
        })?),
    };
    let f = StageFilter {
        instance: q.instance,
        session: q.session,
        state,
    };
    st.read(&h, move |c, db| {
        Ok(Json(json!({"stages": db.stages(c.viewer(), &f)?})))
    })
    .await
}

pub(super) async fn get_stage(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<WaitQuery>, QueryRejection>,
) -> Res<Stage> {
    let id = parse_id(&id)?;
    let wait = wait_of(query(q)?.wait)?;
    let s = long_poll(
        &st,
        &h,
        wait,
        move |c, db| Ok(db.stage(c.viewer(), id)?),
        |s: &Stage| s.state.ended(),
    )
    .await?;
    Ok(Json(s))
}

pub(super) async fn update_stage(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Result<Json<StageUpdate>, JsonRejection>,
) -> Res<Stage> {
    let id = parse_id(&id)?;
    let u = body(b)?;
    st.change(&h, move |c, db| {
        let s = db.stage_action(c.viewer(), id, u.action)?;
        tracing::info!(
            stage = id,
            action = u.action.as_str(),
            uid = c.uid,
            "stage action"
        );
        Ok(Json(s))
    })
    .await
}

// ------------------------------------------------------------------ per instance
pub(super) async fn stage_actions(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Result<Json<StagePathAction>, JsonRejection>,
) -> Res<Value> {
    let id = parse_id(&id)?;
    let a = body(b)?;
    st.change(&h, move |c, db| {
        let ids = db.stage_path_action(c.viewer(), id, &a)?;
        tracing::info!(instance = id, action = a.action.as_str(), path = %a.path, stages = ?ids, "stage action on a path");
        Ok(Json(json!({"stages": ids})))
    })
    .await
}

pub(super) async fn stage_counts(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<CountsQuery>, QueryRejection>,
) -> Res<StageCounts> {
    let id = parse_id(&id)?;
    let q = query(q)?;
    let wait = wait_of(q.wait)?;
    let scope = q.scope.unwrap_or(StageScope::File);
    let path = q.path;
    let c = long_poll(
        &st,
        &h,
        wait,
        move |c, db| Ok(db.stage_counts(c.viewer(), id, &path, scope)?),
        |c: &StageCounts| c.pending == 0,
    )
    .await?;
    Ok(Json(c))
}

pub(super) async fn stage_failures(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<FailuresQuery>, QueryRejection>,
) -> Res<StageFailures> {
    let id = parse_id(&id)?;
    let q = query(q)?;
    let after = q.after.unwrap_or_default();
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > 10_000 {
        return Err(ApiErr::bad(format!("limit={limit}: 1 to 10000")));
    }
    st.read(&h, move |c, db| {
        Ok(Json(db.stage_failures(c.viewer(), id, &after, limit)?))
    })
    .await
}

pub(super) async fn set_stage_concurrency(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Result<Json<StageConcurrency>, JsonRejection>,
) -> Res<Value> {
    let id = parse_id(&id)?;
    let v = body(b)?;
    let applied = st.cfg.clamp_concurrency(v.value);
    st.change(&h, move |c, db| {
        let applied = db.set_stage_concurrency(c.viewer(), id, applied)?;
        Ok(Json(json!({"stage_concurrency": applied})))
    })
    .await
}

// ------------------------------------------------------------------ teardown
/// `?hurry=true` of a DELETE: whether it was given.
pub(super) fn hurry_of(q: Result<Query<DestroyQuery>, QueryRejection>) -> Result<bool, ApiErr> {
    Ok(query(q)?.hurry.unwrap_or(false))
}

/// Log each stage-out a hurried teardown dropped (never silently).
pub(super) fn log_dropped(what: &str, id: u64, dropped: &[u64]) {
    for s in dropped {
        tracing::warn!(
            stage = s,
            "stage-out {s} dropped: {what} {id} torn down with hurry before it ended"
        );
    }
}

/// The answer of a DELETE with hurry: the object plus `dropped_stages`.
pub(super) fn with_dropped<T: serde::Serialize>(obj: &T, dropped: Option<Vec<u64>>) -> Value {
    let mut v = serde_json::to_value(obj).unwrap_or(Value::Null);
    if let (Some(d), Some(m)) = (dropped, v.as_object_mut()) {
        m.insert("dropped_stages".into(), json!(d));
    }
    v
}
