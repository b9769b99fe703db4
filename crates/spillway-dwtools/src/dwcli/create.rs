//! `dwcli create`: the resources and their options, the request each sends, and the
//! line printed once the manager made it.

use super::request::{post, Request};
use crate::args::{self, HostList};
use crate::connect::{Answer, Failure};
use crate::format;
use clap::Subcommand;
use spillway_api::model::*;
use spillway_api::paths;

#[derive(Subcommand, Debug, PartialEq)]
pub enum Create {
    /// A pool: a set of servers with one allocation granularity
    #[command(alias = "pools")]
    Pool {
        #[arg(long)]
        name: String,
        /// Bytes per granule, e.g. 1GiB
        #[arg(long, value_parser = args::size, value_name = "SIZE")]
        granularity: u64,
    },
    /// A storage server
    #[command(alias = "nodes")]
    Node {
        #[arg(long)]
        name: String,
        /// Data-plane address of the server
        #[arg(long, value_name = "HOST:PORT")]
        address: String,
        #[arg(long)]
        pool: Option<String>,
        /// Offer at most this much [default: what the server reports]
        #[arg(long, value_parser = args::size, value_name = "SIZE")]
        capacity: Option<u64>,
    },
    /// A session: the handle of a job or of a persistent instance
    #[command(alias = "sessions")]
    Session {
        /// Client (compute) nodes, comma-separated
        #[arg(long, value_parser = args::hosts, value_name = "HOST[,..]")]
        hosts: Option<HostList>,
        /// Owner uid [default: the caller; only admins may name another]
        #[arg(long, value_name = "UID")]
        owner: Option<u32>,
        /// Who made it, e.g. SLURM [default: CLI]
        #[arg(long)]
        creator: Option<String>,
        /// Job id, or the name of a persistent instance
        #[arg(long)]
        token: String,
        /// Epoch seconds [default: none]
        #[arg(long, value_name = "EPOCH")]
        expiration: Option<i64>,
    },
    /// An instance: capacity in a pool, for a session
    #[command(alias = "instances")]
    Instance {
        /// [default: I<id>-0]
        #[arg(long)]
        label: Option<String>,
        /// Rounded up to the pool's granularity
        #[arg(long, value_parser = args::size, value_name = "SIZE")]
        capacity: u64,
        #[arg(long, value_name = "SESS-ID")]
        session: u64,
        /// [default: the site's default pool]
        #[arg(long)]
        pool: Option<String>,
        /// bandwidth (spread over servers) or isolation (as few as possible)
        #[arg(long, value_parser = args::policy, value_name = "POLICY")]
        policy: Option<Policy>,
        /// Every user sees it [default: public unless the token is a job id]
        #[arg(long, conflicts_with = "private")]
        public: bool,
        /// Only the owner sees it
        #[arg(long)]
        private: bool,
        /// Default stripe size of new files [default: the site's]
        #[arg(long, value_parser = args::stripe_size, value_name = "SIZE")]
        stripe_size: Option<u32>,
        /// Epoch seconds [default: none]
        #[arg(long, value_name = "EPOCH")]
        expiration: Option<i64>,
    },
    /// A configuration: how an instance is used
    #[command(alias = "configurations")]
    Configuration {
        /// Mode of the root directory, octal [default: 0755]
        #[arg(long, value_parser = args::octal_mode, value_name = "MODE")]
        root_permissions: Option<u32>,
        /// Group (gid) of the root directory [default: the owner's primary group]
        #[arg(long, value_name = "GID")]
        group: Option<u32>,
        /// stripe (or striped), private, ldbal (or load_balanced)
        #[arg(long, value_parser = args::access_mode, value_name = "MODE")]
        access_mode: AccessMode,
        /// scratch, cache or swap
        #[arg(long = "type", value_parser = args::config_type, value_name = "TYPE")]
        kind: ConfigType,
        #[arg(long, value_name = "INST-ID")]
        instance: u64,
        /// type cache: the PFS directory to cache (docs/cache.md)
        #[arg(long, value_name = "DIR")]
        pfs: Option<String>,
        /// type cache: dirty bytes in one file that start its write-behind [default: 64MiB]
        #[arg(long, value_parser = args::size, value_name = "SIZE")]
        modified_threshold: Option<u64>,
        /// type cache: bytes read ahead past a read that missed [default: 16MiB]
        #[arg(long, value_parser = args::size, value_name = "SIZE")]
        read_ahead: Option<u64>,
        /// type cache: closing a file writes its changes to the PFS first (yes/no)
        #[arg(long, value_parser = args::yes_no, value_name = "YES|NO")]
        sync_on_close: Option<bool>,
        /// type cache: fsync writes a file's changes to the PFS (yes/no)
        #[arg(long, value_parser = args::yes_no, value_name = "YES|NO")]
        sync_to_pfs: Option<bool>,
    },
    /// An activation: a configuration mounted on a session's client nodes
    #[command(alias = "activations")]
    Activation {
        /// Admins only: a path strictly below the site's mount root [default: a
        /// per-session path under it; users always get that one]
        #[arg(long, value_name = "PATH")]
        mount: Option<String>,
        #[arg(long, value_name = "SESS-ID")]
        session: u64,
        #[arg(long, value_name = "CONF-ID")]
        configuration: u64,
    },
}

pub fn create_request(c: &Create) -> Request {
    match c {
        Create::Pool { name, granularity } => post(
            paths::POOLS,
            &NewPool {
                id: name.clone(),
                granularity: *granularity,
                units: None,
            },
        ),
        Create::Node {
            name,
            address,
            pool,
            capacity,
        } => post(
            paths::NODES,
            &NewNode {
                id: name.clone(),
                address: address.clone(),
                pool: pool.clone(),
                capacity: *capacity,
            },
        ),
        Create::Session {
            hosts,
            owner,
            creator,
            token,
            expiration,
        } => post(
            paths::SESSIONS,
            &NewSession {
                token: token.clone(),
                owner: *owner,
                creator: creator.clone(),
                client_nodes: hosts.clone().map(|h| h.0).unwrap_or_default(),
                expiration: *expiration,
            },
        ),
        Create::Instance {
            label,
            capacity,
            session,
            pool,
            policy,
            public,
            private,
            stripe_size,
            expiration,
        } => post(
            paths::INSTANCES,
            &NewInstance {
                session: *session,
                capacity: *capacity,
                pool: pool.clone(),
                label: label.clone(),
                // Neither flag: let the manager decide (public for persistent names).
                public: match (public, private) {
                    (true, _) => Some(true),
                    (_, true) => Some(false),
                    _ => None,
                },
                policy: *policy,
                limits: None,
                stripe_size: *stripe_size,
                expiration: *expiration,
            },
        ),
        Create::Configuration {
            root_permissions,
            group,
            access_mode,
            kind,
            instance,
            pfs,
            modified_threshold,
            read_ahead,
            sync_on_close,
            sync_to_pfs,
        } => post(
            paths::CONFIGURATIONS,
            &NewConfiguration {
                instance: *instance,
                kind: *kind,
                access_mode: *access_mode,
                root_permissions: *root_permissions,
                group: *group,
                pfs: pfs.clone(),
                modified_threshold: *modified_threshold,
                read_ahead: *read_ahead,
                sync_on_close: *sync_on_close,
                sync_to_pfs: *sync_to_pfs,
            },
        ),
        Create::Activation {
            mount,
            session,
            configuration,
        } => post(
            paths::ACTIVATIONS,
            &NewActivation {
                session: *session,
                configuration: *configuration,
                mount: mount.clone(),
            },
        ),
    }
}

/// The line printed after a successful create: `created <resource> <id> key=value ...`.
/// The id is always the third word.
pub fn create_summary(c: &Create, a: &Answer) -> Result<String, Failure> {
    Ok(match c {
        Create::Pool { .. } => {
            let p: Pool = a.parse()?;
            format!(
                "created pool {} granularity={}",
                p.id,
                format::size(p.granularity)
            )
        }
        Create::Node { .. } => {
            let n: Node = a.parse()?;
            format!(
                "created node {} address={} pool={} capacity={}",
                n.id,
                n.address,
                format::text(n.pool.as_deref().unwrap_or("")),
                format::size(n.capacity)
            )
        }
        Create::Session { .. } => {
            let s: Session = a.parse()?;
            format!("created session {} token={}", s.id, s.token)
        }
        Create::Instance { .. } => {
            let i: Instance = a.parse()?;
            format!(
                "created instance {} label={} session={} pool={} bytes={} nodes={}",
                i.id,
                format::text(&i.label),
                i.links.session,
                i.pool,
                format::size(i.capacity.bytes),
                i.capacity.nodes
            )
        }
        Create::Configuration { .. } => {
            let c: Configuration = a.parse()?;
            format!(
                "created configuration {} instance={} type={} access_mode={}",
                c.id,
                c.links.instance,
                c.kind.as_str(),
                c.access_mode.as_str()
            )
        }
        Create::Activation { .. } => {
            let x: Activation = a.parse()?;
            format!(
                "created activation {} session={} configuration={} mount={}",
                x.id, x.links.session, x.links.configuration, x.mount
            )
        }
    } + "\n")
}

#[cfg(test)]
mod tests;
