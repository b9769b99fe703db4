//! The REST API against arbitrary input: any method, path, header and body must get a
//! well-formed JSON answer with a status below 500 (never a panic or a hang), whoever
//! asks. The router runs in-process over an in-memory database; identities come from a
//! fake verifier (MUNGE itself is exercised by the pytest suite against a real munged).

use axum::body::Body;
use axum::http::{Request, StatusCode};
use proptest::prelude::*;
use spillway_api::paths;
use spillway_manager::api::{router, AppState};
use spillway_manager::auth::{Auth, FakeVerifier as Fake};
use spillway_manager::db::Db;
use spillway_manager::ManagerConfig;
use std::sync::{mpsc, Arc, Mutex};
use tower::ServiceExt;

fn state() -> AppState {
    let db = Db::open_in_memory().expect("db");
    let (kick, _rx) = mpsc::channel();
    // The receiver is dropped: kicks are ignored, as with no reconcile loop.
    let (version, _) = tokio::sync::watch::channel(1);
    AppState {
        db: Arc::new(Mutex::new(db)),
        auth: Arc::new(Auth::new(Box::new(Fake), None)),
        cfg: Arc::new(ManagerConfig {
            pfs_roots: vec!["/pfs".into()],
            ..ManagerConfig::with_defaults("127.0.0.1:1", std::path::Path::new("/nonexistent"))
        }),
        version: Arc::new(version),
        kick: Arc::new(Mutex::new(kick)),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

async fn call(
    st: &AppState,
    method: &str,
    path: &str,
    who: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, serde_json::Value) {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    if let Some(w) = who {
        b = b.header("authorization", format!("MUNGE cred={w}"));
    }
    let Ok(mut req) = b.body(Body::from(body)) else {
        return (StatusCode::BAD_REQUEST, serde_json::Value::Null);
    };
    // What the real server adds to every request.
    let peer: std::net::SocketAddr = ([127, 0, 0, 1], 40000).into();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    let resp = router(st.clone())
        .oneshot(req)
        .await
        .expect("router answers");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 24)
        .await
        .expect("body");
    let v = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, v)
}

const PATHS: &[&str] = &[
    "/dw/v1/pools",
    "/dw/v1/pools/wlm_pool",
    "/dw/v1/nodes",
    "/dw/v1/nodes/s0",
    "/dw/v1/sessions",
    "/dw/v1/sessions/1",
    "/dw/v1/instances",
    "/dw/v1/instances/1",
    "/dw/v1/fragments",
    "/dw/v1/fragments/1",
    "/dw/v1/configurations",
    "/dw/v1/configurations/1",
    "/dw/v1/activations",
    "/dw/v1/activations/1",
    "/dw/v1/agents/c1",
    "/dw/v1/agents/c1/reports",
    "/dw/v1/agents/c1/work?version=x",
    "/dw/v1/sessions/18446744073709551616",
    "/dw/v1/stages",
    "/dw/v1/stages/1",
    "/dw/v1/stages/1?wait=1",
    "/dw/v1/stages/1?wait=100000000000000000000",
    "/dw/v1/stages?state=queued&instance=1&session=1",
    "/dw/v1/stages?state=bogus",
    "/dw/v1/instances/1/stage_actions",
    "/dw/v1/instances/1/stage_counts?path=/&scope=tree",
    "/dw/v1/instances/1/stage_counts?path=%2Fa%2F..&scope=file&wait=0",
    "/dw/v1/instances/1/stage_counts",
    "/dw/v1/instances/1/stage_failures?after=/a&limit=5",
    "/dw/v1/instances/1/stage_failures?limit=-1",
    "/dw/v1/instances/1/stage_concurrency",
    "/dw/v1/instances/2/stage_concurrency",
    "/dw/v1/sessions/1?hurry=true",
    "/dw/v1/instances/1?hurry=true",
    "/dw/v1/instances/1?hurry=sometimes",
    "/dw/v1/%ff",
];
const METHODS: &[&str] = &["GET", "POST", "PATCH", "PUT", "DELETE"];

/// Bodies near valid ones: the right keys with wrong types, huge numbers, unicode.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let value = prop_oneof![
        Just("1".to_string()),
        Just("-1".to_string()),
        Just("18446744073709551615".to_string()),
        Just("1e309".to_string()),
        Just("\"\"".to_string()),
        Just("\"s0\"".to_string()),
        Just("\"../../etc\"".to_string()),
        Just("null".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        Just("true".to_string()),
        Just("\"in\"".to_string()),
        Just("\"out\"".to_string()),
        Just("\"file\"".to_string()),
        Just("\"list\"".to_string()),
        Just("\"/pfs/a\"".to_string()),
        Just("\"/a\"".to_string()),
        Just("\"job_end\"".to_string()),
        Just("\"terminate\"".to_string()),
        Just("\"activate\"".to_string()),
        Just("\"tree\"".to_string()),
        Just("[{\"source\":\"/pfs/a\",\"destination\":\"/b\"}]".to_string()),
        "[a-z\u{00e9}\u{1F600}]{0,20}".prop_map(|s| format!("{s:?}")),
    ];
    let key = prop_oneof![
        Just("id"),
        Just("granularity"),
        Just("units"),
        Just("address"),
        Just("pool"),
        Just("capacity"),
        Just("drain"),
        Just("token"),
        Just("owner"),
        Just("client_nodes"),
        Just("session"),
        Just("instance"),
        Just("type"),
        Just("access_mode"),
        Just("mount"),
        Just("configuration"),
        Just("root_permissions"),
        Just("policy"),
        Just("status"),
        Just("activation"),
        Just("addresses"),
        Just("direction"),
        Just("source"),
        Just("destination"),
        Just("pairs"),
        Just("when"),
        Just("action"),
        Just("path"),
        Just("scope"),
        Just("value"),
        Just("bogus"),
    ];
    prop_oneof![
        proptest::collection::vec((key, value), 0..6).prop_map(|kv| {
            let inner: Vec<String> = kv.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}", inner.join(",")).into_bytes()
        }),
        proptest::collection::vec(any::<u8>(), 0..64),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]
    #[test]
    fn never_a_server_error(
        m in proptest::sample::select(METHODS),
        p in proptest::sample::select(PATHS),
        who in proptest::sample::select(&[Some("root"), Some("user"), Some("forged"), None][..]),
        b in body(),
    ) {
        let st = state();
        let rt = rt();
        rt.block_on(async {
            // Something to act on: a pool, a node, a session with an instance.
            call(&st, "POST", paths::POOLS, Some("root"), br#"{"id":"wlm_pool","granularity":1024}"#.to_vec()).await;
            call(&st, "POST", paths::NODES, Some("root"), br#"{"id":"s0","address":"127.0.0.1:9","pool":"wlm_pool"}"#.to_vec()).await;
            call(&st, "POST", paths::SESSIONS, Some("user"), br#"{"token":"t","client_nodes":["c1"]}"#.to_vec()).await;
            // An instance with a deferred and a queued stage.
            st.db.lock().expect("db").record_heartbeat("s0", Ok(1 << 40), 10).expect("heartbeat");
            call(&st, "POST", paths::INSTANCES, Some("user"), br#"{"session":1,"capacity":1024}"#.to_vec()).await;
            call(&st, "POST", paths::STAGES, Some("user"), br#"{"instance":1,"direction":"out","type":"file","source":"/a","destination":"/pfs/a","when":"job_end"}"#.to_vec()).await;
            call(&st, "POST", paths::STAGES, Some("user"), br#"{"instance":1,"direction":"in","type":"directory","source":"/pfs/d","destination":"/d"}"#.to_vec()).await;
            let (status, v) = call(&st, m, p, who, b).await;
            prop_assert!(status.as_u16() < 500, "{m} {p}: {status} {v}");
            if status.is_client_error() {
                prop_assert!(v.get("error").and_then(|e| e.as_str()).is_some_and(|e| !e.is_empty()), "{m} {p}: {status} {v}");
            }
            Ok(())
        })?;
    }
}

#[test]
fn stage_calls_answer_the_documented_way() {
    let st = state();
    rt().block_on(async {
        call(&st, "POST", "/dw/v1/pools", Some("root"), br#"{"id":"wlm_pool","granularity":1024}"#.to_vec()).await;
        call(&st, "POST", "/dw/v1/nodes", Some("root"), br#"{"id":"s0","address":"127.0.0.1:9","pool":"wlm_pool"}"#.to_vec()).await;
        st.db.lock().expect("db").record_heartbeat("s0", Ok(1 << 40), 10).expect("heartbeat");
        let (s, _) = call(&st, "POST", "/dw/v1/sessions", Some("user"), br#"{"token":"t"}"#.to_vec()).await;
        assert_eq!(s, StatusCode::CREATED);
        let (s, v) = call(&st, "POST", "/dw/v1/instances", Some("user"), br#"{"session":1,"capacity":1024}"#.to_vec()).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        let (s, v) = call(&st, "POST", "/dw/v1/stages", Some("user"),
            br#"{"instance":1,"direction":"out","type":"file","source":"/a","destination":"/pfs/a","when":"job_end"}"#.to_vec()).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        assert_eq!(v["state"], "deferred");
        assert_eq!(v["owner"], 4242);
        // wait: answers when the time is up (the stage is deferred).
        let t0 = std::time::Instant::now();
        let (s, v) = call(&st, "GET", "/dw/v1/stages/1?wait=1", Some("user"), vec![]).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert!(t0.elapsed() >= std::time::Duration::from_millis(900));
        let (s, v) = call(&st, "GET", "/dw/v1/instances/1/stage_counts?path=/a", Some("user"), vec![]).await;
        assert_eq!((s, v), (StatusCode::OK, serde_json::json!({"complete":0,"pending":0,"deferred":1,"failed":0,"started":true})));
        let (s, v) = call(&st, "PUT", "/dw/v1/instances/1/stage_concurrency", Some("user"), br#"{"value":0}"#.to_vec()).await;
        assert_eq!((s, v), (StatusCode::OK, serde_json::json!({"stage_concurrency": 1})));
        let (s, v) = call(&st, "DELETE", "/dw/v1/sessions/1?hurry=true", Some("user"), vec![]).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{v}");
        assert_eq!(v["dropped_stages"], serde_json::json!([1]));
        let (_, v) = call(&st, "GET", "/dw/v1/stages/1", Some("user"), vec![]).await;
        assert_eq!(v["state"], "dropped");
        let (s, _) = call(&st, "GET", "/dw/v1/stages/1", Some("forged"), vec![]).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
    });
}

#[test]
fn agent_long_poll_returns_after_its_wait() {
    let st = state();
    rt().block_on(async {
        let t0 = std::time::Instant::now();
        let (status, v) = call(
            &st,
            "GET",
            "/dw/v1/agents/c1/work?version=1&wait=1",
            Some("root"),
            vec![],
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert!(t0.elapsed() >= std::time::Duration::from_millis(900));
        assert_eq!(v["mounts"], serde_json::json!([]));
        // Users may not poll for work (it carries capabilities).
        let (status, _) = call(&st, "GET", "/dw/v1/agents/c1/work", Some("user"), vec![]).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
    });
}
