//! Spillway's manager: the one control plane. Where a control request enters (`api`),
//! where state lives (`db`, SQLite), where storage is placed (`alloc`), and how goals
//! are reached on servers (`reconcile`), and how stages are started and watched (`stage`).
//!
//! * `config`     — every setting, one file.
//! * `auth`       — MUNGE identity and admin rights.
//! * `echo`       — how error messages quote client input (cut, quoted).
//! * `identity`   — users and groups from the name service.
//! * `capability` — the credential a mount presents to servers.
//! * `tls`        — the site CA and the manager's certificate.
//! * `serve`      — the HTTPS front door: accept loop, timeouts, connection caps.

// `pub` marks what other crates may name; everything else is `pub(crate)` or narrower.
#![warn(unreachable_pub)]

pub mod alloc;
pub mod api;
pub mod auth;
pub mod capability;
pub mod config;
pub mod db;
pub mod echo;
pub mod identity;
pub mod reconcile;
pub mod serve;
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
    // Whatever the manager creates is private unless it says otherwise; its state
    // directory (the database holds every instance's secret) is 0700 even when an
    // older version made it 0755, and its TLS key 0600.
    spillway_types::files::private_umask();
    spillway_types::files::private_dir(&cfg.state_dir)
        .map_err(|e| format!("cannot create {}: {e}", cfg.state_dir.display()))?;
    spillway_types::files::make_private(&cfg.tls_key)
        .map_err(|e| format!("cannot make {} private: {e}", cfg.tls_key.display()))?;
    let db_path = cfg.state_dir.join("manager.db");
    let mut db = db::Db::open(&db_path).map_err(|e| format!("{}: {e}", db_path.display()))?;
    db.set_user_limits(db::UserLimits {
        sessions: cfg.max_sessions_per_user,
        stages: cfg.max_stages_per_user,
        stage_pairs: cfg.max_stage_pairs_per_user,
    });
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
        silence: Default::default(),
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
    // Every connection costs a descriptor: take all the system allows (systemd's soft
    // default of 1,024 is far below its hard limit), then keep a reserve of them for the
    // manager's own use (SQLite, munged, heartbeats, stages) out of the clients' reach.
    let nofile = spillway_types::rlimit::raise_nofile_limit_logged("manager");
    let derived = serve::derived_max_connections(nofile);
    let max_connections = match cfg.max_connections {
        None => derived,
        Some(n) if n > derived => {
            tracing::warn!(
                "max_connections = {n} leaves too few of the {nofile} descriptors for the \
                 manager itself; using {derived}"
            );
            derived
        }
        Some(n) => n,
    };
    let limits = serve::Limits {
        header_timeout: cfg.header_timeout,
        idle_timeout: cfg.idle_timeout,
        max_connections,
        max_connections_per_peer: cfg.max_connections_per_peer,
    };
    tracing::info!(
        descriptors = nofile,
        max_connections,
        max_connections_per_peer = limits.max_connections_per_peer,
        header_timeout_ms = limits.header_timeout.as_millis() as u64,
        idle_timeout_ms = limits.idle_timeout.as_millis() as u64,
        "connection limits"
    );
    let tls = serve::tls_config(&cfg.tls_cert, &cfg.tls_key)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Bounds the descriptors requests use besides their connection (munged).
        .max_blocking_threads(serve::BLOCKING_THREADS)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| format!("cannot serve on {listen}: {e}"))?;
        tracing::info!("manager listening on https://{listen}");
        serve::serve(listener, tls, api::router(state), limits, async {
            shutdown_signal().await;
            tracing::info!("stopping");
        })
        .await;
        Ok(())
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
