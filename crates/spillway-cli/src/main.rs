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

mod agent;
mod busy;
mod cluster;
mod daemon;
mod local;
mod mounthealth;
mod mountpoint;
mod pipe;
mod run;
mod stripes;

use clap::{Parser, Subcommand};
use spillway_types::{InstanceDescriptor, Tunables};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "spillway",
    version,
    about = "Spillway burst buffer: servers, mounts and local clusters"
)]
struct Cli {
    /// Log level (error, warn, info, debug, trace).
    #[arg(long, global = true, default_value = "info")]
    log_level: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a storage server (until SIGTERM).
    Server {
        /// Storage root: fragments, metadata and stripes live below it.
        #[arg(long)]
        root: PathBuf,
        /// Address to listen on, e.g. 127.0.0.1:7000.
        #[arg(long)]
        listen: String,
        /// File of `key = value` tunables (`pfs_roots = /pfs:/scratch` names the PFS
        /// directories stages may use; without it the server refuses every stage).
        #[arg(long)]
        tunables: Option<PathBuf>,
    },
    /// Mount an instance.
    Mount {
        /// The instance descriptor (JSON).
        #[arg(long)]
        instance: PathBuf,
        /// Where to mount it.
        mountpoint: PathBuf,
        /// Stay in the foreground instead of detaching once mounted.
        #[arg(long)]
        foreground: bool,
        /// Log file when detached.
        #[arg(long)]
        log: Option<PathBuf>,
        /// Write the client's pid here.
        #[arg(long)]
        pidfile: Option<PathBuf>,
        #[arg(long)]
        tunables: Option<PathBuf>,
        /// How to reach the manager (a client config: manager_url, ca_file,
        /// munge_socket) for libdatawarp's requests through this mount. Without it
        /// they are answered ENOTSUP.
        #[arg(long)]
        manager_config: Option<PathBuf>,
        /// Show this directory of the instance as the mount's root, creating it (with
        /// the owner, group and mode of the instance's root) if missing: a private
        /// mount's `/.spillway-private/<node>`.
        #[arg(long)]
        root_dir: Option<String>,
    },
    /// Unmount a Spillway mount (the client process then exits).
    Umount { mountpoint: PathBuf },
    /// A local cluster on this machine.
    Cluster {
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
    /// Show the stripes of a file on a Spillway mount and the servers holding them.
    Stripes {
        path: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Run the manager (until SIGTERM).
    Manager {
        #[arg(long, default_value = "/etc/spillway/manager.conf")]
        config: PathBuf,
    },
    /// Run a compute node's agent (until killed).
    Agent {
        #[arg(long, default_value = "/etc/spillway/agent.conf")]
        config: PathBuf,
    },
    /// The site's TLS certificates.
    Tls {
        #[command(subcommand)]
        cmd: TlsCmd,
    },
    /// A whole site (manager, servers, agent) on this machine.
    Local {
        #[command(subcommand)]
        cmd: LocalCmd,
    },
    /// Run a #DW job script on this site without Slurm: validate, setup, stage in,
    /// paths, pre-run, the script (as its user, with the DW_* variables), post-run,
    /// stage out, teardown. Exits with the script's status.
    Run {
        /// The client configuration (default: $SPILLWAY_CONFIG, else
        /// /etc/spillway/spillway.conf).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The job's user (default: the caller, or the user sudo came from).
        #[arg(long)]
        user: Option<String>,
        /// Compute nodes to mount on, comma-separated (default: this machine).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// The job's token (default: a fresh number above Slurm's job ids).
        #[arg(long)]
        token: Option<String>,
        /// The script's working directory (default: the current one).
        #[arg(long)]
        chdir: Option<PathBuf>,
        script: PathBuf,
        /// Arguments for the script.
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Set the stripe size and/or width of an empty file, or of a directory (the
    /// default for files created in it afterwards; subdirectories do not inherit).
    Setstripe {
        path: PathBuf,
        /// Stripe size, a multiple of 4 KiB up to 64 MiB (e.g. 1M; sizes: docs/cli.md).
        #[arg(long)]
        size: Option<String>,
        /// Number of servers the stripes rotate over (0: all).
        #[arg(long)]
        width: Option<u16>,
    },
}

#[derive(Subcommand)]
enum TlsCmd {
    /// Create DIR/{ca.pem,ca.key,manager.pem,manager.key} unless they exist.
    Init {
        #[arg(long, default_value = "/etc/spillway/tls")]
        dir: PathBuf,
        /// Extra host names or addresses the manager's certificate is valid for.
        #[arg(long = "name")]
        names: Vec<String>,
    },
}

#[derive(Subcommand)]
enum LocalCmd {
    /// Start a manager, N storage servers and an agent for this machine.
    Up {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 2)]
        servers: u16,
        /// Bytes each server offers, e.g. 8GiB (GiB = G = 2^30, GB = 10^9).
        #[arg(long, default_value = "8GiB")]
        server_capacity: String,
        #[arg(long, default_value = "wlm_pool")]
        pool: String,
        /// Allocation granularity of the pool, e.g. 1GiB.
        #[arg(long, default_value = "1GiB")]
        granularity: String,
        /// This machine's name as a compute node (default: the host name).
        #[arg(long)]
        node: Option<String>,
        /// munged's socket (default: the system's).
        #[arg(long)]
        munge_socket: Option<PathBuf>,
        /// Placement policy: bandwidth or isolation.
        #[arg(long)]
        policy: Option<String>,
        /// Start the processes only: create no pool and register no server.
        #[arg(long)]
        bare: bool,
        /// A PFS root stages may use (repeatable): written to manager.conf's pfs_roots
        /// and to the servers' tunables (a server stages only under its own roots).
        #[arg(long = "pfs-root", value_name = "DIR")]
        pfs_root: Vec<PathBuf>,
        /// A group whose members are admins (manager.conf's admin_group), e.g. the
        /// SlurmUser's, so that dw_wlm_cli may drive jobs.
        #[arg(long)]
        admin_group: Option<String>,
        /// One more compute node on this machine (repeatable): an agent of its own,
        /// mounting below DIR/nodes/NAME.
        #[arg(long = "extra-node", value_name = "NAME")]
        extra_node: Vec<String>,
    },
    /// Unmount what the agent mounted, stop everything and (unless --keep-data)
    /// remove DIR.
    Down {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        keep_data: bool,
    },
    /// Stop one part: manager, agent or serverK (failure tests).
    Kill {
        #[arg(long)]
        dir: PathBuf,
        what: String,
        /// KILL or TERM.
        #[arg(long, default_value = "KILL")]
        signal: String,
    },
    /// Start a stopped part again.
    Start {
        #[arg(long)]
        dir: PathBuf,
        what: String,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Start N servers, create an instance over them and mount it at DIR/mnt.
    Up {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 2)]
        servers: u16,
        /// Instance size (split evenly over the servers), e.g. 4G (G = GiB = 2^30,
        /// GB = 10^9; docs/cli.md).
        #[arg(long, default_value = "4G")]
        capacity: String,
        /// Default stripe size of new files, e.g. 8M.
        #[arg(long, default_value = "8M")]
        stripe_size: String,
        /// Run every server in a network namespace of its own, over veth.
        #[arg(long)]
        netns: bool,
        /// Mount somewhere other than DIR/mnt.
        #[arg(long)]
        mountpoint: Option<PathBuf>,
        /// Mode of the instance's root directory (octal).
        #[arg(long, default_value = "1777")]
        root_mode: String,
    },
    /// Unmount everything, stop the servers, remove namespaces and (unless
    /// --keep-data) the cluster directory. A mount some process holds (open files,
    /// a working directory) stops it, naming the processes, unless --force.
    Down {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        keep_data: bool,
        /// Take busy mounts down too: flush what their holders wrote, detach the mount
        /// and stop its client (the holders get errors after); fails if a flush fails.
        #[arg(long)]
        force: bool,
    },
    /// Servers, fragments, usage.
    Status {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Stop one server abruptly (failure tests).
    KillServer {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        index: u16,
        /// KILL or TERM.
        #[arg(long, default_value = "KILL")]
        signal: String,
    },
    /// Start a stopped server again on its root and address.
    StartServer {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        index: u16,
    },
}

/// Every daemon's logging (server, mount, manager, agent): a line that cannot be
/// written (a full disk under the log) is dropped and counted, never a panic.
fn init_logging(level: &str) {
    let filter = format!("{level},fuser=warn");
    if spillway_types::logging::init(&filter).is_err() {
        let _ = spillway_types::logging::init("info");
    }
}

fn local_cmd(cmd: LocalCmd) -> Result<(), String> {
    match cmd {
        LocalCmd::Up {
            dir,
            servers,
            server_capacity,
            pool,
            granularity,
            node,
            munge_socket,
            policy,
            bare,
            pfs_root,
            admin_group,
            extra_node,
        } => local::up(local::UpArgs {
            dir,
            servers,
            server_capacity: size_arg("--server-capacity", &server_capacity)?,
            pool,
            granularity: size_arg("--granularity", &granularity)?,
            node: node.unwrap_or_else(hostname),
            munge_socket,
            policy,
            bare,
            pfs_roots: pfs_root,
            admin_group,
            extra_nodes: extra_node,
        }),
        LocalCmd::Down { dir, keep_data } => local::down(&dir, keep_data),
        LocalCmd::Kill { dir, what, signal } => {
            let sig = match signal.as_str() {
                "KILL" => libc::SIGKILL,
                "TERM" => libc::SIGTERM,
                s => return Err(format!("--signal {s}: KILL or TERM")),
            };
            local::kill(&dir, &what, sig)
        }
        LocalCmd::Start { dir, what } => local::start(&dir, &what),
    }
}

/// A size option: the one parser of every tool (`spillway_api::size`: `G`/`GiB` are
/// 2^30, `GB` 10^9, a bare number bytes), its errors naming the option.
fn size_arg(opt: &str, v: &str) -> Result<u64, String> {
    spillway_api::size::parse_size(v).map_err(|e| format!("{opt}: {e}"))
}

fn load_tunables(path: &Option<PathBuf>) -> Result<Tunables, String> {
    let mut t = Tunables::default();
    if let Some(p) = path {
        t.apply_file(p)?;
    }
    Ok(t)
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.cmd {
        Cmd::Server {
            root,
            listen,
            tunables,
        } => {
            // Whatever the server creates is private unless it says otherwise.
            spillway_types::files::private_umask();
            init_logging(&cli.log_level);
            let tunables = load_tunables(&tunables)?;
            spillway_server::run_server(spillway_server::ServerArgs {
                root,
                listen,
                tunables,
            })
        }
        Cmd::Mount {
            instance,
            mountpoint,
            foreground,
            log,
            pidfile,
            tunables,
            manager_config,
            root_dir,
        } => {
            // The mount's pid file and log are root's alone, like its descriptor.
            spillway_types::files::private_umask();
            let desc = InstanceDescriptor::load(&instance).map_err(|e| e.to_string())?;
            if let Some(d) = &root_dir {
                spillway_client::root::parse_root_dir(d)?;
            }
            let tunables = load_tunables(&tunables)?;
            let manager = match &manager_config {
                Some(p) => Some(spillway_api::config::ClientConfig::load(p)?),
                None => None,
            };
            if !mountpoint.is_dir() {
                return Err(format!(
                    "mount point {} is not a directory",
                    mountpoint.display()
                ));
            }
            let mountpoint = mountpoint.canonicalize().map_err(|e| e.to_string())?;
            let mut ready = if foreground {
                None
            } else {
                let log = log.unwrap_or_else(|| PathBuf::from("/dev/null"));
                Some(daemon::daemonize(&log)?)
            };
            init_logging(&cli.log_level);
            if let Some(p) = &pidfile {
                std::fs::write(p, format!("{}\n", std::process::id()))
                    .map_err(|e| format!("{}: {e}", p.display()))?;
            }
            let notify: Option<Box<dyn FnOnce() + Send>> = ready.take().map(|mut r| {
                let f: Box<dyn FnOnce() + Send> = Box::new(move || r.ok());
                f
            });
            let origin = instance.canonicalize().unwrap_or(instance);
            let result = spillway_client::mount_foreground(spillway_client::MountArgs {
                descriptor: desc,
                mountpoint,
                tunables,
                origin,
                ready: notify,
                manager,
                root_dir,
            });
            if let Err(e) = &result {
                // A detached parent still waiting sees the pipe close and points at
                // this log.
                tracing::error!("{e}");
            }
            result
        }
        Cmd::Umount { mountpoint } => cluster::unmount(&mountpoint, None),
        Cmd::Cluster { cmd } => cluster_cmd(cmd),
        Cmd::Manager { config } => {
            init_logging(&cli.log_level);
            let cfg = spillway_manager::ManagerConfig::load(&config)?;
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
        Cmd::Agent { config } => {
            init_logging(&cli.log_level);
            agent::run(agent::AgentConfig::load(&config)?)
        }
        Cmd::Tls {
            cmd: TlsCmd::Init { dir, names },
        } => {
            if spillway_manager::tls::init(&dir, &names)? {
                println!(
                    "created {}/{{ca.pem,ca.key,manager.pem,manager.key}}",
                    dir.display()
                );
            } else {
                println!("{} already holds certificates: kept", dir.display());
            }
            Ok(())
        }
        Cmd::Local { cmd } => local_cmd(cmd),
        Cmd::Run {
            config,
            user,
            nodes,
            token,
            chdir,
            script,
            args,
        } => {
            let status = run::run(run::RunArgs {
                script,
                script_args: args,
                config,
                user,
                nodes,
                token,
                chdir,
            })?;
            std::process::exit(status);
        }
        Cmd::Stripes { path, json } => stripes::show(&path, json),
        Cmd::Setstripe { path, size, width } => {
            if size.is_none() && width.is_none() {
                return Err("give --size and/or --width".into());
            }
            if let Some(s) = size {
                let bytes = size_arg("--size", &s)?;
                stripes::set(&path, "user.spillway.stripe_size", bytes)?;
            }
            if let Some(w) = width {
                stripes::set(&path, "user.spillway.stripe_width", u64::from(w))?;
            }
            stripes::show(&path, false)
        }
    }
}

fn cluster_cmd(cmd: ClusterCmd) -> Result<(), String> {
    match cmd {
        ClusterCmd::Up {
            dir,
            servers,
            capacity,
            stripe_size,
            netns,
            mountpoint,
            root_mode,
        } => {
            let capacity = size_arg("--capacity", &capacity)?;
            let stripe = size_arg("--stripe-size", &stripe_size)?;
            let stripe_size =
                u32::try_from(stripe).map_err(|_| "stripe size too large".to_string())?;
            let root_mode = u32::from_str_radix(&root_mode, 8)
                .map_err(|_| format!("bad mode {root_mode}"))?
                & 0o7777;
            let args = cluster::UpArgs {
                dir: dir.clone(),
                servers,
                capacity,
                stripe_size,
                netns,
                mountpoint,
                root_mode,
            };
            match cluster::up(args) {
                Ok(mnt) => {
                    println!("{}", mnt.display());
                    Ok(())
                }
                Err(e) => {
                    // Leave nothing half-started behind.
                    let _ = cluster::down(&dir, true, true);
                    Err(e)
                }
            }
        }
        ClusterCmd::Down {
            dir,
            keep_data,
            force,
        } => cluster::down(&dir, keep_data, force),
        ClusterCmd::Status { dir, json } => cluster::status(&dir, json),
        ClusterCmd::KillServer { dir, index, signal } => {
            let sig = match signal.to_ascii_uppercase().trim_start_matches("SIG") {
                "KILL" => libc::SIGKILL,
                "TERM" => libc::SIGTERM,
                other => return Err(format!("unsupported signal {other} (KILL or TERM)")),
            };
            cluster::kill_server(&dir, index, sig)
        }
        ClusterCmd::StartServer { dir, index } => cluster::start_server(&dir, index),
    }
}

fn main() {
    let cli = Cli::parse();
    // One-shot commands end quietly on a closed stdout (`| head`); daemons and `run`
    // keep SIGPIPE ignored (pipe.rs).
    if matches!(
        cli.cmd,
        Cmd::Stripes { .. }
            | Cmd::Setstripe { .. }
            | Cmd::Cluster { .. }
            | Cmd::Local { .. }
            | Cmd::Tls { .. }
            | Cmd::Umount { .. }
    ) {
        pipe::default_sigpipe();
    }
    if let Err(e) = run(cli) {
        // Not eprintln!: a daemon's stderr is its log, which may be on a full disk.
        spillway_types::logging::stderr_line(&format!("spillway: {e}"));
        std::process::exit(1);
    }
}

/// This machine's host name (its name as a compute node).
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}
