//! The site's long-running services started in this process (`spillway server`,
//! `spillway manager`), the logging every daemon of this binary sets up, and the TLS
//! certificates the manager serves with (`spillway tls init`).

use spillway_server::options::ServeOptions;
use std::path::Path;

/// Every daemon's logging (server, mount, manager, agent): a line that cannot be
/// written (a full disk under the log) is dropped and counted, never a panic.
pub fn init_logging(level: &str) {
    let filter = format!("{level},fuser=warn");
    if spillway_types::logging::init(&filter).is_err() {
        let _ = spillway_types::logging::init("info");
    }
}

/// `spillway server`: a storage server, until SIGTERM.
pub fn server(o: ServeOptions, log_level: &str) -> Result<(), String> {
    // Whatever the server creates is private unless it says otherwise.
    spillway_types::files::private_umask();
    init_logging(log_level);
    spillway_server::run_server(o.into_args()?)
}

/// `spillway manager`: the control plane, until SIGTERM.
pub fn manager(config: &Path, log_level: &str) -> Result<(), String> {
    init_logging(log_level);
    let cfg = spillway_manager::ManagerConfig::load(config)?;
    let munge = spillway_munge::Munge::new(cfg.munge_socket.clone());
    let verifier = Box::new(spillway_manager::auth::MungeVerifier(munge.clone()));
    let admin: spillway_manager::reconcile::servers::AdminCredential =
        std::sync::Arc::new(move || {
            munge
                .encode(b"")
                .map(String::into_bytes)
                .map_err(|e| format!("MUNGE: {e}"))
        });
    spillway_manager::run(cfg, verifier, admin)
}

/// `spillway agent`: this compute node's agent, until killed.
pub fn agent(config: &Path, log_level: &str) -> Result<(), String> {
    init_logging(log_level);
    super::agent::run(super::agent::AgentConfig::load(config)?)
}

/// `spillway tls init`: the site CA and the manager's certificate, unless `dir`
/// already holds them.
pub fn tls_init(dir: &Path, names: &[String]) -> Result<(), String> {
    if spillway_manager::tls::init(dir, names)? {
        println!(
            "created {}/{{ca.pem,ca.key,manager.pem,manager.key}}",
            dir.display()
        );
    } else {
        println!("{} already holds certificates: kept", dir.display());
    }
    Ok(())
}
