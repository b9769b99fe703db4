//! The command line of `spillway`: every subcommand and option (clap), and the size
//! parser every size option goes through. Only definitions live here; what each
//! command does is in `site` (what a site runs) or `dev` (development commands).

use clap::{Args, Parser, Subcommand};
use spillway_server::options::ServeOptions;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "spillway",
    version,
    about = "Spillway burst buffer: servers, mounts and local clusters"
)]
pub struct Cli {
    /// Log level (error, warn, info, debug, trace).
    #[arg(long, global = true, default_value = "info")]
    pub log_level: String,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run a storage server (until SIGTERM).
    Server(ServeOptions),
    /// Mount an instance.
    Mount(MountArgs),
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
    Run(RunArgs),
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
pub enum TlsCmd {
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
pub enum LocalCmd {
    /// Start a manager, N storage servers and an agent for this machine.
    Up(LocalUpArgs),
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
pub enum ClusterCmd {
    /// Start N servers, create an instance over them and mount it at DIR/mnt.
    Up(Box<ClusterUpArgs>),
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

// The options of `spillway mount` (a plain comment: a doc comment would be help text).
#[derive(Args)]
pub struct MountArgs {
    /// The instance descriptor (JSON).
    #[arg(long)]
    pub instance: PathBuf,
    /// Where to mount it.
    pub mountpoint: PathBuf,
    /// Stay in the foreground instead of detaching once mounted.
    #[arg(long)]
    pub foreground: bool,
    /// Log file when detached.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Write the client's pid here.
    #[arg(long)]
    pub pidfile: Option<PathBuf>,
    #[arg(long)]
    pub tunables: Option<PathBuf>,
    /// How to reach the manager (a client config: manager_url, ca_file,
    /// munge_socket) for libdatawarp's requests through this mount. Without it
    /// they are answered ENOTSUP.
    #[arg(long)]
    pub manager_config: Option<PathBuf>,
    /// Show this directory of the instance as the mount's root, creating it (with
    /// the owner, group and mode of the instance's root) if missing: a private
    /// mount's `/.spillway-private/<node>`.
    #[arg(long)]
    pub root_dir: Option<String>,
    /// This compute node's name (default: the host name). A load-balanced instance is
    /// read from the replica the name picks (docs/placement.md).
    #[arg(long)]
    pub node: Option<String>,
}

// The options of `spillway run` (a plain comment: a doc comment would be help text).
#[derive(Args)]
pub struct RunArgs {
    /// The client configuration (default: $SPILLWAY_CONFIG, else
    /// /etc/spillway/spillway.conf).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The job's user (default: the caller, or the user sudo came from).
    #[arg(long)]
    pub user: Option<String>,
    /// Compute nodes to mount on, comma-separated (default: this machine).
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// The job's token (default: a fresh number above Slurm's job ids).
    #[arg(long)]
    pub token: Option<String>,
    /// The script's working directory (default: the current one).
    #[arg(long)]
    pub chdir: Option<PathBuf>,
    pub script: PathBuf,
    /// Arguments for the script.
    #[arg(trailing_var_arg = true)]
    pub args: Vec<String>,
}

// The options of `spillway local up` (a plain comment: a doc comment would be help text).
#[derive(Args)]
pub struct LocalUpArgs {
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long, default_value_t = 2)]
    pub servers: u16,
    /// Bytes each server offers, e.g. 8GiB (GiB = G = 2^30, GB = 10^9).
    #[arg(long, default_value = "8GiB")]
    pub server_capacity: String,
    #[arg(long, default_value = "wlm_pool")]
    pub pool: String,
    /// Allocation granularity of the pool, e.g. 1GiB.
    #[arg(long, default_value = "1GiB")]
    pub granularity: String,
    /// This machine's name as a compute node (default: the host name).
    #[arg(long)]
    pub node: Option<String>,
    /// munged's socket (default: the system's).
    #[arg(long)]
    pub munge_socket: Option<PathBuf>,
    /// Placement policy: bandwidth or isolation.
    #[arg(long)]
    pub policy: Option<String>,
    /// Start the processes only: create no pool and register no server.
    #[arg(long)]
    pub bare: bool,
    /// A PFS root stages may use (repeatable): written to manager.conf's pfs_roots
    /// and to the servers' tunables (a server stages only under its own roots).
    #[arg(long = "pfs-root", value_name = "DIR")]
    pub pfs_root: Vec<PathBuf>,
    /// A group whose members are admins (manager.conf's admin_group), e.g. the
    /// SlurmUser's, so that dw_wlm_cli may drive jobs.
    #[arg(long)]
    pub admin_group: Option<String>,
    /// One more compute node on this machine (repeatable): an agent of its own,
    /// mounting below DIR/nodes/NAME.
    #[arg(long = "extra-node", value_name = "NAME")]
    pub extra_node: Vec<String>,
}

// The options of `spillway cluster up` (a plain comment: a doc comment would be help text).
#[derive(Args)]
pub struct ClusterUpArgs {
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long, default_value_t = 2)]
    pub servers: u16,
    /// Instance size (split evenly over the servers), e.g. 4G (G = GiB = 2^30,
    /// GB = 10^9; docs/cli.md).
    #[arg(long, default_value = "4G")]
    pub capacity: String,
    /// Default stripe size of new files, e.g. 8M.
    #[arg(long, default_value = "8M")]
    pub stripe_size: String,
    /// Run every server in a network namespace of its own, over veth.
    #[arg(long)]
    pub netns: bool,
    /// Mount somewhere other than DIR/mnt.
    #[arg(long)]
    pub mountpoint: Option<PathBuf>,
    /// Mode of the instance's root directory (octal).
    #[arg(long, default_value = "1777")]
    pub root_mode: String,
    /// File of `key = value` tunables for the servers and the mount (docs/cli.md);
    /// kept for later `up`s of the same cluster.
    #[arg(long)]
    pub tunables: Option<PathBuf>,
    /// Make the instance a cache of this PFS directory (docs/cache.md): the mount
    /// shows its tree. It must lie under the servers' `pfs_roots` (--tunables).
    #[arg(long, value_name = "DIR")]
    pub cache_pfs: Option<PathBuf>,
    /// With --cache-pfs, the directive's cache policies (docs/cache.md, "Policies and
    /// paths"): close returns once the file's changes are on the PFS (default no).
    #[arg(long, value_name = "yes|no")]
    pub sync_on_close: Option<String>,
    /// fsync and fdatasync write the file's changes to the PFS (default no).
    #[arg(long, value_name = "yes|no")]
    pub sync_to_pfs: Option<String>,
    /// A file with more dirty bytes on a server is written behind (default 64MiB).
    #[arg(long, value_name = "SIZE")]
    pub modified_threshold: Option<String>,
    /// How far past a missed read the servers fetch (default 16MiB, at most 1GiB).
    #[arg(long, value_name = "SIZE")]
    pub read_ahead: Option<String>,
}

/// A size option: the one parser of every tool (`spillway_api::size`: `G`/`GiB` are
/// 2^30, `GB` 10^9, a bare number bytes), its errors naming the option.
pub fn size_arg(opt: &str, v: &str) -> Result<u64, String> {
    spillway_api::size::parse_size(v).map_err(|e| format!("{opt}: {e}"))
}
