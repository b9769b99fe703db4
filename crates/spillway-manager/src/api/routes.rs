//! One handler per resource and verb. Reads are filtered by who asks (the database's
//! `Viewer`); pools and nodes change only by admins; everything else by its owner or an
//! admin. Lists, reads by id and background destroys are the same for every resource:
//! `list`, `one`, `destroy` and `destroy_hurried` hold them once.

use super::stages::{hurry_of, log_dropped, with_dropped};
use super::{parse_id, ApiErr, AppState};
use crate::db::{Db, DbResult, NewInstancePlan, Viewer};
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};
use spillway_api::query::DestroyQuery;
use spillway_api::*;

type Res<T> = Result<Json<T>, ApiErr>;

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, ApiErr> {
    b.map(|Json(t)| t).map_err(|e| super::body_rejected(&e))
}

fn admin_only(c: &crate::auth::Caller, what: &str) -> Result<(), ApiErr> {
    if c.admin {
        Ok(())
    } else {
        Err(ApiErr::forbidden(format!(
            "{what} needs an admin (uid {} is not one)",
            c.uid
        )))
    }
}

pub(super) async fn versions() -> Json<Value> {
    Json(json!({"versions": [{"id": "v1", "url": spillway_api::routes::RESOURCES_DIR}]}))
}

/// The API's resources, and `mount_root`: where activations' default mount points go
/// (workload-manager tools name job mount points below it, before they exist).
pub(super) async fn resources(State(st): State<AppState>) -> Json<Value> {
    Json(
        json!({"resources": ["pools", "nodes", "sessions", "instances", "fragments",
        "configurations", "activations", "stages"], "openapi": spillway_api::routes::OPENAPI,
        "mount_root": st.cfg.mount_root}),
    )
}

pub(super) async fn openapi() -> impl IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        super::OPENAPI,
    )
}

/// `GET` of a collection: `{"<key>": [...]}`, what the caller may see.
async fn list<T>(
    st: &AppState,
    h: &HeaderMap,
    key: &'static str,
    read: fn(&Db, Viewer) -> DbResult<Vec<T>>,
) -> Res<Value>
where
    T: serde::Serialize + Send + 'static,
{
    st.read(h, move |c, db| {
        Ok(Json(json!({ key: read(db, c.viewer())? })))
    })
    .await
}

/// `GET` of one object by its numeric id.
async fn one<T: Send + 'static>(
    st: &AppState,
    h: &HeaderMap,
    id: &str,
    read: fn(&Db, Viewer, u64) -> DbResult<T>,
) -> Res<T> {
    let id = parse_id(id)?;
    st.read(h, move |c, db| Ok(Json(read(db, c.viewer(), id)?)))
        .await
}

/// `DELETE` of an object destroyed in the background: 202 with the object.
async fn destroy<T: Send + 'static>(
    st: &AppState,
    h: &HeaderMap,
    id: &str,
    destroy: fn(&mut Db, Viewer, u64) -> DbResult<T>,
) -> Result<(StatusCode, Json<T>), ApiErr> {
    let id = parse_id(id)?;
    st.change(h, move |c, db| {
        Ok((StatusCode::ACCEPTED, Json(destroy(db, c.viewer(), id)?)))
    })
    .await
}

/// `DELETE` of a session or an instance (`what`). With `?hurry=true`, pending
/// stage-outs are dropped first (`hurry`; their fragments are then not held) and the
/// answer lists them; without, the teardown waits for them.
async fn destroy_hurried<T: serde::Serialize + Send + 'static>(
    st: &AppState,
    h: &HeaderMap,
    what: &'static str,
    id: &str,
    q: Result<Query<DestroyQuery>, QueryRejection>,
    hurry: fn(&mut Db, Viewer, u64) -> DbResult<Vec<u64>>,
    destroy: fn(&mut Db, Viewer, u64) -> DbResult<T>,
) -> Result<(StatusCode, Json<Value>), ApiErr> {
    let id = parse_id(id)?;
    let hurried = hurry_of(q)?;
    st.change(h, move |c, db| {
        let dropped = if hurried {
            let d = hurry(db, c.viewer(), id)?;
            log_dropped(what, id, &d);
            Some(d)
        } else {
            None
        };
        let o = destroy(db, c.viewer(), id)?;
        Ok((StatusCode::ACCEPTED, Json(with_dropped(&o, dropped))))
    })
    .await
}

// ------------------------------------------------------------------ pools
pub(super) async fn list_pools(State(st): State<AppState>, h: HeaderMap) -> Res<Value> {
    list(&st, &h, "pools", |db, _| db.pools()).await
}

pub(super) async fn get_pool(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Res<Pool> {
    st.read(&h, move |_, db| Ok(Json(db.pool(&id)?))).await
}

pub(super) async fn create_pool(
    State(st): State<AppState>,
    h: HeaderMap,
    b: Result<Json<NewPool>, JsonRejection>,
) -> Result<(StatusCode, Json<Pool>), ApiErr> {
    let p = body(b)?;
    st.change(&h, move |c, db| {
        admin_only(c, "creating a pool")?;
        Ok((StatusCode::CREATED, Json(db.create_pool(&p)?)))
    })
    .await
}

pub(super) async fn delete_pool(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Res<Value> {
    st.change(&h, move |c, db| {
        admin_only(c, "removing a pool")?;
        db.delete_pool(&id)?;
        Ok(Json(json!({"deleted": id})))
    })
    .await
}

// ------------------------------------------------------------------ nodes
pub(super) async fn list_nodes(State(st): State<AppState>, h: HeaderMap) -> Res<Value> {
    list(&st, &h, "nodes", |db, _| db.nodes()).await
}

pub(super) async fn get_node(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Res<Node> {
    st.read(&h, move |_, db| Ok(Json(db.node(&id)?))).await
}

pub(super) async fn create_node(
    State(st): State<AppState>,
    h: HeaderMap,
    b: Result<Json<NewNode>, JsonRejection>,
) -> Result<(StatusCode, Json<Node>), ApiErr> {
    let n = body(b)?;
    st.change(&h, move |c, db| {
        admin_only(c, "registering a node")?;
        Ok((StatusCode::CREATED, Json(db.create_node(&n)?)))
    })
    .await
}

pub(super) async fn update_node(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Result<Json<NodeUpdate>, JsonRejection>,
) -> Res<Node> {
    let u = body(b)?;
    st.change(&h, move |c, db| {
        admin_only(c, "changing a node")?;
        Ok(Json(db.update_node(&id, &u)?))
    })
    .await
}

pub(super) async fn delete_node(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Res<Value> {
    st.change(&h, move |c, db| {
        admin_only(c, "removing a node")?;
        db.delete_node(&id)?;
        Ok(Json(json!({"deleted": id})))
    })
    .await
}

// ------------------------------------------------------------------ sessions
pub(super) async fn list_sessions(State(st): State<AppState>, h: HeaderMap) -> Res<Value> {
    list(&st, &h, "sessions", |db, v| db.sessions(v, None)).await
}

pub(super) async fn get_session(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Res<Session> {
    one(&st, &h, &id, Db::session).await
}

pub(super) async fn create_session(
    State(st): State<AppState>,
    h: HeaderMap,
    b: Result<Json<NewSession>, JsonRejection>,
) -> Result<(StatusCode, Json<Session>), ApiErr> {
    let s = body(b)?;
    st.change(&h, move |c, db| {
        // Numeric tokens name job sessions; only the workload manager (an admin) makes them.
        if !c.admin && s.token.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ApiErr::forbidden(format!(
                "token {}: numeric tokens are reserved for jobs",
                super::quoted(&s.token)
            )));
        }
        Ok((
            StatusCode::CREATED,
            Json(db.create_session(c.viewer(), c.uid, &s)?),
        ))
    })
    .await
}

pub(super) async fn update_session(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Result<Json<SessionUpdate>, JsonRejection>,
) -> Res<Session> {
    let id = parse_id(&id)?;
    let u = body(b)?;
    st.change(&h, move |c, db| {
        if u.replace_fuse == Some(true) {
            admin_only(c, "replacing a fuse")?;
        }
        Ok(Json(db.update_session(c.viewer(), id, &u)?))
    })
    .await
}

pub(super) async fn delete_session(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<DestroyQuery>, QueryRejection>,
) -> Result<(StatusCode, Json<Value>), ApiErr> {
    destroy_hurried(
        &st,
        &h,
        "session",
        &id,
        q,
        Db::hurry_session,
        Db::destroy_session,
    )
    .await
}

// ------------------------------------------------------------------ instances
pub(super) async fn list_instances(State(st): State<AppState>, h: HeaderMap) -> Res<Value> {
    list(&st, &h, "instances", |db, v| db.instances(v, None)).await
}

pub(super) async fn get_instance(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Res<Instance> {
    one(&st, &h, &id, Db::instance).await
}

pub(super) async fn create_instance(
    State(st): State<AppState>,
    h: HeaderMap,
    b: Result<Json<NewInstance>, JsonRejection>,
) -> Result<(StatusCode, Json<Instance>), ApiErr> {
    let req = body(b)?;
    let cfg = st.cfg.clone();
    st.change(&h, move |c, db| {
        let pool = match req.pool.clone().or_else(|| cfg.default_pool.clone()) {
            Some(p) => p,
            None => {
                let pools = db.pools()?;
                match pools.as_slice() {
                    [only] => only.id.clone(),
                    [] => return Err(ApiErr::new(StatusCode::CONFLICT, "no pool exists")),
                    _ => {
                        return Err(ApiErr {
                            status: StatusCode::BAD_REQUEST,
                            message: "several pools exist and no default is configured: name one"
                                .into(),
                            choices: Some(pools.into_iter().map(|p| p.id).collect()),
                        })
                    }
                }
            }
        };
        let stripe_size = req.stripe_size.unwrap_or(cfg.stripe_size);
        if stripe_size == 0
            || !stripe_size.is_multiple_of(4096)
            || stripe_size > spillway_types::tunables::MAX_STRIPE_SIZE
        {
            return Err(ApiErr::bad(format!(
                "stripe_size {stripe_size}: a multiple of 4096 up to {}",
                spillway_types::tunables::MAX_STRIPE_SIZE
            )));
        }
        let secret = crate::random_secret().map_err(ApiErr::internal)?;
        let plan = NewInstancePlan {
            policy: req.policy.unwrap_or(cfg.policy),
            req,
            pool,
            stripe_size,
            secret,
        };
        Ok((
            StatusCode::CREATED,
            Json(db.create_instance(c.viewer(), &plan)?),
        ))
    })
    .await
}

pub(super) async fn delete_instance(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<DestroyQuery>, QueryRejection>,
) -> Result<(StatusCode, Json<Value>), ApiErr> {
    destroy_hurried(
        &st,
        &h,
        "instance",
        &id,
        q,
        Db::hurry_instance,
        Db::destroy_instance,
    )
    .await
}

// ------------------------------------------------------------------ fragments
pub(super) async fn list_fragments(State(st): State<AppState>, h: HeaderMap) -> Res<Value> {
    list(&st, &h, "fragments", |db, v| db.fragments(v, None)).await
}

pub(super) async fn get_fragment(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Res<Fragment> {
    one(&st, &h, &id, Db::fragment).await
}

// ------------------------------------------------------------------ configurations
pub(super) async fn list_configurations(State(st): State<AppState>, h: HeaderMap) -> Res<Value> {
    list(&st, &h, "configurations", |db, v| {
        db.configurations(v, None)
    })
    .await
}

pub(super) async fn get_configuration(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Res<Configuration> {
    one(&st, &h, &id, Db::configuration).await
}

pub(super) async fn create_configuration(
    State(st): State<AppState>,
    h: HeaderMap,
    b: Result<Json<NewConfiguration>, JsonRejection>,
) -> Result<(StatusCode, Json<Configuration>), ApiErr> {
    let req = body(b)?;
    st.change(&h, move |c, db| {
        Ok((
            StatusCode::CREATED,
            Json(db.create_configuration(c.viewer(), &req)?),
        ))
    })
    .await
}

pub(super) async fn delete_configuration(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Configuration>), ApiErr> {
    destroy(&st, &h, &id, Db::destroy_configuration).await
}

// ------------------------------------------------------------------ activations
pub(super) async fn list_activations(State(st): State<AppState>, h: HeaderMap) -> Res<Value> {
    list(&st, &h, "activations", |db, v| db.activations(v, None)).await
}

pub(super) async fn get_activation(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Res<Activation> {
    one(&st, &h, &id, Db::activation).await
}

pub(super) async fn create_activation(
    State(st): State<AppState>,
    h: HeaderMap,
    b: Result<Json<NewActivation>, JsonRejection>,
) -> Result<(StatusCode, Json<Activation>), ApiErr> {
    let req = body(b)?;
    let root = st.cfg.mount_root.clone();
    st.change(&h, move |c, db| {
        Ok((
            StatusCode::CREATED,
            Json(db.create_activation(c.viewer(), &req, &root)?),
        ))
    })
    .await
}

pub(super) async fn delete_activation(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Activation>), ApiErr> {
    destroy(&st, &h, &id, Db::destroy_activation).await
}
