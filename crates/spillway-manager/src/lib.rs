//! Spillway's manager: the one control plane. Where a control request enters (`api`),
//! where state lives (`db`, SQLite), where storage is placed (`alloc`), and how goals
//! are reached on servers (`reconcile`), and how stages are started and watched (`stage`).
//!
//! * `config`     — every setting, one file.
//! * `auth`       — MUNGE identity and admin rights.
//! * `identity`   — users and groups from the name service.
//! * `capability` — the credential a mount presents to servers.
//! * `tls`        — the site CA and the manager's certificate.

pub mod alloc;
pub mod api;
pub mod auth;
pub mod capability;
pub mod config;
pub mod db;
pub mod identity;
pub mod reconcile;
pub mod stage;
pub mod tls;

use std::io::Read;
use std::net::SocketAddr;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

pub use config::ManagerConfig;

/// Bytes of an instance secret.
pub const SECRET_LEN: usize = 32;

pub fn random_secret() -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; SECRET_LEN];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
    Ok(buf)
}

/// Run the manager until SIGTERM/SIGINT.
pub fn run(
    cfg: ManagerConfig,
    verifier: Box<dyn auth::Verifier>,
    admin: reconcile::servers::AdminCredential,
) -> Result<(), String> {
    std::fs::create_dir_all(&cfg.state_dir)
        .map_err(|e| format!("cannot create {}: {e}", cfg.state_dir.display()))?;
    let db_path = cfg.state_dir.join("manager.db");
    let db = db::Db::open(&db_path).map_err(|e| format!("{}: {e}", db_path.display()))?;
    let db = Arc::new(Mutex::new(db));
    let listen: SocketAddr = cfg
        .listen
        .parse()
        .map_err(|_| format!("listen: {:?} is not ip:port", cfg.listen))?;
    // The version agents wait on starts from the clock, so an agent's version from
    // before a restart never matches by chance.
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(1);
    let (version, _) = tokio::sync::watch::channel(start);
    let version = Arc::new(version);
    let (kick_tx, kick_rx) = mpsc::channel();
    let servers = Arc::new(reconcile::servers::Servers {
        admin,
        deadline: Duration::from_secs(10),
    });
    let lp = Arc::new(reconcile::Loop {
        db: db.clone(),
        servers: servers.clone(),
        version: version.clone(),
        heartbeat_interval: cfg.heartbeat_interval,
        node_timeout: cfg.node_timeout,
    });
    lp.spawn(kick_rx)
        .map_err(|e| format!("cannot start the reconcile loop: {e}"))?;
    let stager = Arc::new(stage::Stager::new(
        db.clone(),
        servers,
        version.clone(),
        stage::StageSettings {
            pfs_roots: cfg.pfs_roots.clone(),
            files_in_flight: cfg.stage_files_in_flight,
            default_concurrency: cfg.stage_concurrency_default,
            node_timeout: cfg.node_timeout,
        },
    ));
    stager
        .spawn()
        .map_err(|e| format!("cannot start the stage dispatcher: {e}"))?;
    let state = api::AppState {
        db,
        auth: Arc::new(auth::Auth::new(verifier, cfg.admin_group.clone())),
        cfg: Arc::new(cfg.clone()),
        version,
        kick: Arc::new(Mutex::new(kick_tx)),
    };
    tls::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(async move {
        let tls = axum_server::tls_rustls::RustlsConfig::from_pem_file(&cfg.tls_cert, &cfg.tls_key)
            .await
            .map_err(|e| {
                format!(
                    "cannot load TLS certificate {} / key {}: {e}",
                    cfg.tls_cert.display(),
                    cfg.tls_key.display()
                )
            })?;
        let handle = axum_server::Handle::new();
        let h2 = handle.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("stopping");
            h2.graceful_shutdown(Some(Duration::from_secs(2)));
        });
        tracing::info!("manager listening on https://{listen}");
        axum_server::bind_rustls(listen, tls)
            .handle(handle)
            .serve(api::router(state).into_make_service_with_connect_info::<SocketAddr>())
            .await
            .map_err(|e| format!("cannot serve on {listen}: {e}"))
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
