//! Spillway's storage server. Holds one fragment per instance it serves under its
//! storage root (layout in FORMAT.md) and answers the wire protocol's admin, metadata
//! and data requests.
//!
//! * `service`  — the handshake and the request handlers (errno boundary).
//! * `registry` — the fragments of this server.
//! * `fragment` — one fragment: its stores, open handles, peers, purges.
//! * `meta`     — the metadata store (SQLite).
//! * `data`     — the stripe store (files, index, fd cache).
//! * `purge`    — the thread deleting the data of purged inodes.
//! * `locks`    — fcntl/OFD/flock locks of the inodes homed here, per client session.
//! * `notices`  — which mounts hold the inodes homed here open, and telling them of
//!   each other's changes.
//! * `cache`    — cache instances (issue 18; being built): the write-behind log.
//! * `stage`    — the stage engine: copies between the PFS and instances
//!   (docs/staging.md).
//! * `options`  — the command-line options of `spillway server` and `spillway-server`.
//! * `auth`, `names`, `error`, `signals` — credentials, name checks, the error type,
//!   shutdown signals.

// `pub` marks what other crates may name; everything else is `pub(crate)` or narrower.
#![warn(unreachable_pub)]

mod auth;
mod cache;
mod data;
mod error;
mod fragment;
mod locks;
mod meta;
mod names;
mod notices;
pub mod options;
mod purge;
mod registry;
mod service;
mod signals;
mod stage;

pub use error::StoreError;

use registry::Registry;
use service::SpillwayService;
use spillway_types::Tunables;
use spillway_wire::serve::Server;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct ServerArgs {
    pub root: PathBuf,
    pub listen: String,
    pub tunables: Tunables,
}

/// A server running in this process.
pub struct RunningServer {
    addr: SocketAddr,
    wire: Option<Server>,
    purger: Option<purge::Purger>,
    registry: Arc<Registry>,
}

impl RunningServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop: no new connections, every connection closed, running requests finished,
    /// the purge thread stopped, every database checkpointed and closed. Idempotent.
    pub fn stop(&mut self) {
        if let Some(mut w) = self.wire.take() {
            w.stop();
        }
        if let Some(mut p) = self.purger.take() {
            p.stop();
        }
        self.registry.close_all();
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Start a server on `root` serving `listener`, in this process.
pub fn start_in_process(
    root: impl AsRef<Path>,
    listener: TcpListener,
    tunables: Tunables,
) -> Result<RunningServer, String> {
    let root = root.as_ref();
    // Private (0700), also when an older version made it 0755: it holds the admin key,
    // every instance's secret, metadata and data (FORMAT.md, "Modes").
    spillway_types::files::private_dir(root)
        .map_err(|e| format!("cannot create storage root {}: {e}", root.display()))?;
    let admin_key = auth::load_or_create_admin_key(root)?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("listener has no address: {e}"))?;
    let (waker, doorbell) = purge::doorbell();
    let env = fragment::FragmentEnv {
        tunables: tunables.clone(),
        waker: waker.clone(),
        open_pfs_dir: stage::pfs::open_cache_dir,
    };
    let registry = Arc::new(Registry::load(&root.join("fragments"), env)?);
    for f in registry.all() {
        match f.purge_orphans() {
            Ok(0) => {}
            Ok(n) => tracing::info!(instance = f.config.instance, "purging {n} orphaned inodes"),
            Err(e) => tracing::warn!(instance = f.config.instance, "cannot list orphans: {e}"),
        }
        // Temporaries of stage-outs this server coordinated when it stopped.
        stage::clean_leftovers(&f);
    }
    // Also resumes the purges a previous run left pending.
    let purger = purge::Purger::start(registry.clone(), waker, doorbell)
        .map_err(|e| format!("cannot start purge thread: {e}"))?;
    let munge = spillway_munge::Munge::new(tunables.munge_socket.clone());
    let stages = Arc::new(stage::Stages::new(tunables.clone()));
    let service = Arc::new(SpillwayService::new(
        registry.clone(),
        stages,
        admin_key,
        munge,
        tunables.arena_max,
    ));
    let wire = Server::start(listener, service, tunables.server_workers)
        .map_err(|e| format!("cannot start serving on {addr}: {e}"))?;
    tracing::info!(%addr, root = %root.display(), "storage server running");
    Ok(RunningServer {
        addr,
        wire: Some(wire),
        purger: Some(purger),
        registry,
    })
}

/// Run a server until SIGTERM or SIGINT, then stop it cleanly. Call before starting
/// other threads: the signals are blocked for every thread started afterwards.
pub fn run_server(args: ServerArgs) -> Result<(), String> {
    let signals = signals::TermSignals::block()?;
    // Every connection (clients, peer servers, the manager's calls) costs a descriptor:
    // take all the system allows, not systemd's soft default of 1,024 (a server at 1,024
    // runs out long before its handshake caps, spillway_wire::serve, refuse anyone).
    spillway_types::rlimit::raise_nofile_limit_logged("storage server");
    let listener = TcpListener::bind(&args.listen)
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let mut server = start_in_process(&args.root, listener, args.tunables)?;
    let sig = signals.wait();
    tracing::info!("signal {sig}: stopping");
    server.stop();
    tracing::info!("stopped");
    Ok(())
}
