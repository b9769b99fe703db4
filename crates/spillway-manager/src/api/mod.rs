//! The REST API under `/dw/v1/`: where every control-plane request enters. Handlers are
//! thin: authenticate, run one database change or read on a blocking thread, wake the
//! reconcile loop after a change. Nothing here waits on a storage server.
//!
//! * `error`  — JSON errors and status codes.
//! * `routes` — one handler per resource and verb.
//! * `agents` — the agents' long-poll for work and their reports.
//! * `stages` — staging: stages, per-instance counts, failures, actions, concurrency.

mod agents;
mod error;
mod routes;
mod stages;

use crate::echo::{cut, quoted};
pub use error::ApiErr;

use crate::auth::{Auth, Caller};
use crate::config::ManagerConfig;
use crate::db::Db;
use axum::http::HeaderMap;
use axum::routing::{get, post, put};
use axum::Router;
use std::sync::{mpsc, Arc, Mutex};
use tokio::sync::watch;

/// The largest request body accepted (413 beyond): the largest legitimate one, a list
/// stage of a few thousand pairs, is far below it.
pub const MAX_BODY: usize = 2 << 20;

/// The OpenAPI document, kept in the repository and served as is.
pub const OPENAPI: &str = include_str!("../../../../docs/openapi.json");

/// Whether a request changes what agents or waiting clients could care about.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Effect {
    Reads,
    Changes,
}

#[derive(Clone)]
pub struct AppState {
    pub db: Arc<Mutex<Db>>,
    pub auth: Arc<Auth>,
    pub cfg: Arc<ManagerConfig>,
    /// Bumped on every change agents or waiting clients could care about.
    pub version: Arc<watch::Sender<u64>>,
    /// Wakes the reconcile loop.
    pub kick: Arc<Mutex<mpsc::Sender<()>>>,
}

impl AppState {
    pub fn changed(&self) {
        self.version.send_modify(|v| *v += 1);
        if let Ok(k) = self.kick.lock() {
            let _ = k.send(());
        }
    }

    /// A read: authenticate and run `f` with the database (as `run`).
    pub async fn read<T, F>(&self, headers: &HeaderMap, f: F) -> Result<T, ApiErr>
    where
        T: Send + 'static,
        F: FnOnce(&Caller, &mut Db) -> Result<T, ApiErr> + Send + 'static,
    {
        self.run(headers, Effect::Reads, f).await
    }

    /// A change: authenticate, run `f` with the database (as `run`), and if it
    /// succeeded wake the reconcile loop and the agents.
    pub async fn change<T, F>(&self, headers: &HeaderMap, f: F) -> Result<T, ApiErr>
    where
        T: Send + 'static,
        F: FnOnce(&Caller, &mut Db) -> Result<T, ApiErr> + Send + 'static,
    {
        self.run(headers, Effect::Changes, f).await
    }

    /// Authenticate and run `f` with the database on a blocking thread (munged and
    /// SQLite both block). With an act-as header (`auth::ACT_AS_HEADER`, admins only)
    /// `f` gets the user it names, so every handler authorises it exactly as that user.
    async fn run<T, F>(&self, headers: &HeaderMap, effect: Effect, f: F) -> Result<T, ApiErr>
    where
        T: Send + 'static,
        F: FnOnce(&Caller, &mut Db) -> Result<T, ApiErr> + Send + 'static,
    {
        let header = headers
            .get(axum::http::header::AUTHORIZATION)
            .map(|h| {
                h.to_str()
                    .map(String::from)
                    .map_err(|_| ApiErr::bad("Authorization is not text"))
            })
            .transpose()?;
        let mut act_as = headers.get_all(crate::auth::ACT_AS_HEADER).iter();
        let as_uid =
            match (act_as.next(), act_as.next()) {
                (None, _) => None,
                (Some(v), None) => Some(v.to_str().map(String::from).map_err(|_| {
                    ApiErr::bad(format!("{} is not text", crate::auth::ACT_AS_HEADER))
                })?),
                (Some(_), Some(_)) => {
                    return Err(ApiErr::bad(format!(
                        "{} given more than once",
                        crate::auth::ACT_AS_HEADER
                    )))
                }
            };
        let st = self.clone();
        let out = tokio::task::spawn_blocking(move || {
            let real = st
                .auth
                .caller(header.as_deref())
                .map_err(|e| ApiErr::new(axum::http::StatusCode::UNAUTHORIZED, e))?;
            let caller = st
                .auth
                .act_as(real, as_uid.as_deref())
                .map_err(|e| match e {
                    crate::auth::ActAsError::Malformed(m) => ApiErr::bad(m),
                    crate::auth::ActAsError::NotAdmin(m) => ApiErr::forbidden(m),
                })?;
            if caller.uid != real.uid {
                tracing::debug!(uid = real.uid, as_uid = caller.uid, "acting as a user");
            }
            let mut db = st.db.lock().unwrap_or_else(|e| e.into_inner());
            f(&caller, &mut db)
        })
        .await
        .map_err(|e| ApiErr::internal(format!("request handler failed: {e}")))?;
        if effect == Effect::Changes && out.is_ok() {
            self.changed();
        }
        out
    }
}

pub fn router(state: AppState) -> Router {
    use routes::*;
    // The patterns are spillway-api's, which the callers' paths are built from.
    use spillway_api::routes as route;
    Router::new()
        .route(route::VERSIONS, get(versions))
        .route(route::VERSIONS_DIR, get(versions))
        .route(route::RESOURCES, get(resources))
        .route(route::RESOURCES_DIR, get(resources))
        .route(route::OPENAPI, get(openapi))
        .route(route::POOLS, get(list_pools).post(create_pool))
        .route(route::POOL, get(get_pool).delete(delete_pool))
        .route(route::NODES, get(list_nodes).post(create_node))
        .route(
            route::NODE,
            get(get_node).patch(update_node).delete(delete_node),
        )
        .route(route::SESSIONS, get(list_sessions).post(create_session))
        .route(
            route::SESSION,
            get(get_session)
                .patch(update_session)
                .delete(delete_session),
        )
        .route(route::INSTANCES, get(list_instances).post(create_instance))
        .route(route::INSTANCE, get(get_instance).delete(delete_instance))
        .route(route::FRAGMENTS, get(list_fragments))
        .route(route::FRAGMENT, get(get_fragment))
        .route(
            route::CONFIGURATIONS,
            get(list_configurations).post(create_configuration),
        )
        .route(
            route::CONFIGURATION,
            get(get_configuration).delete(delete_configuration),
        )
        .route(
            route::ACTIVATIONS,
            get(list_activations).post(create_activation),
        )
        .route(
            route::ACTIVATION,
            get(get_activation).delete(delete_activation),
        )
        .route(
            route::STAGES,
            get(stages::list_stages).post(stages::create_stage),
        )
        .route(
            route::STAGE,
            get(stages::get_stage).patch(stages::update_stage),
        )
        .route(route::STAGE_ACTIONS, post(stages::stage_actions))
        .route(route::STAGE_COUNTS, get(stages::stage_counts))
        .route(route::STAGE_FAILURES, get(stages::stage_failures))
        .route(route::STAGE_CONCURRENCY, put(stages::set_stage_concurrency))
        .route(route::AGENT, put(agents::hello))
        .route(route::AGENT_WORK, get(agents::work))
        .route(route::AGENT_REPORTS, post(agents::report))
        .fallback(fallback)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::map_response(json_errors))
        .with_state(state)
}

/// Errors made by axum itself (a method a resource does not have, a malformed path or
/// query) come as plain text; every error this API answers is JSON.
async fn json_errors(resp: axum::response::Response) -> axum::response::Response {
    use axum::response::IntoResponse;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    // axum's texts may quote the input (a query's unknown field, a path segment): read
    // a bounded amount and keep at most LIBRARY_TEXT_MAX characters of it.
    let text = axum::body::to_bytes(resp.into_body(), 64 << 10)
        .await
        .map(|b| {
            crate::echo::cut_to(
                String::from_utf8_lossy(&b).trim(),
                crate::echo::LIBRARY_TEXT_MAX,
            )
        })
        .unwrap_or_default();
    let reason = status.canonical_reason().unwrap_or("error");
    let message = if text.is_empty() {
        reason.to_string()
    } else {
        format!("{reason}: {text}")
    };
    ApiErr::new(status, message).into_response()
}

async fn fallback(method: axum::http::Method, uri: axum::http::Uri) -> ApiErr {
    ApiErr::new(
        axum::http::StatusCode::NOT_FOUND,
        format!("no such resource: {method} {}", cut(uri.path())),
    )
}

/// A JSON body axum refused: over `MAX_BODY` (413), else what serde said (400).
pub fn body_rejected(e: &axum::extract::rejection::JsonRejection) -> ApiErr {
    if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiErr::new(
            e.status(),
            format!("request body larger than {MAX_BODY} bytes"),
        )
    } else {
        ApiErr::from_json(&e.body_text())
    }
}

/// A numeric id from the path.
pub fn parse_id(s: &str) -> Result<u64, ApiErr> {
    s.parse::<u64>()
        .map_err(|_| ApiErr::bad(format!("{} is not a numeric id", quoted(s))))
}
