//! `spillway`: the developer's and admin's front door to the data plane.
//!
//! * `spillway server`  — run a storage server.
//! * `spillway mount`   — mount an instance (FUSE client) from its descriptor.
//! * `spillway umount`  — unmount it.
//! * `spillway cluster` — a whole instance on this machine: up, down, status, and
//!   killing/starting single servers for failure tests.
//! * `spillway stripes` — where a file's stripes live.
//! * `spillway manager` — the control plane (REST over HTTPS, reconcile loop).
//! * `spillway agent`   — a compute node's agent (mounts activations).
//! * `spillway tls init` — the site CA and the manager's certificate.
//! * `spillway local`   — a whole site (manager, servers, agent) on this machine.
//! * `spillway run`     — a `#DW` job script through the burst-buffer phases, without
//!   Slurm.
//!
//! ## Layout: three layers
//!
//! * `site` — what a site runs: `server`, `manager`, `agent`, `mount`/`umount`, `run`,
//!   `stripes`/`setstripe`, `tls init` (`site::services`, `site::agent`, `site::mount`,
//!   `site::run`, `site::stripes`).
//! * `dev`  — development commands, never run by a site: `cluster` (`dev::cluster`)
//!   and `local` (`dev::local`).
//! * `sys`  — the operating system: processes (`sys::proc`), this host (`sys::host`),
//!   mounts (`sys::mounts`), daemonizing (`sys::daemon`), SIGPIPE (`sys::pipe`).
//!
//! `args` holds the command line's definitions and `main.rs` dispatches to the layers.
//!
//! **Rules** (checked by the workspace's layering test):
//! * `crate::site` does not use `crate::dev`: the site-run code (agent, mount, run,
//!   services, stripes) never depends on the development commands.
//! * `crate::sys` uses neither `crate::site` nor `crate::dev`.

mod args;
mod dev;
mod site;
mod sys;

use args::{Cli, Cmd, TlsCmd};
use clap::Parser;

fn run(cli: Cli) -> Result<(), String> {
    let level = cli.log_level.as_str();
    match cli.cmd {
        Cmd::Server(o) => site::services::server(o, level),
        Cmd::Mount(a) => site::mount::mount(a, level),
        Cmd::Umount { mountpoint } => site::mount::umount(&mountpoint),
        Cmd::Cluster { cmd } => dev::cluster::command(cmd),
        Cmd::Manager { config } => site::services::manager(&config, level),
        Cmd::Agent { config } => site::services::agent(&config, level),
        Cmd::Tls {
            cmd: TlsCmd::Init { dir, names },
        } => site::services::tls_init(&dir, &names),
        Cmd::Local { cmd } => dev::local::command(cmd),
        Cmd::Run(a) => {
            let status = site::run::run(a)?;
            std::process::exit(status);
        }
        Cmd::Stripes { path, json } => site::stripes::show(&path, json),
        Cmd::Setstripe { path, size, width } => {
            site::stripes::setstripe(&path, size.as_deref(), width)
        }
    }
}

fn main() {
    let cli = Cli::parse();
    // One-shot commands end quietly on a closed stdout (`| head`); daemons and `run`
    // keep SIGPIPE ignored (`sys/pipe.rs`).
    if matches!(
        cli.cmd,
        Cmd::Stripes { .. }
            | Cmd::Setstripe { .. }
            | Cmd::Cluster { .. }
            | Cmd::Local { .. }
            | Cmd::Tls { .. }
            | Cmd::Umount { .. }
    ) {
        sys::pipe::default_sigpipe();
    }
    if let Err(e) = run(cli) {
        // Not eprintln!: a daemon's stderr is its log, which may be on a full disk.
        spillway_types::logging::stderr_line(&format!("spillway: {e}"));
        std::process::exit(1);
    }
}
