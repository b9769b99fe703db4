//! The agent's configuration (`/etc/spillway/agent.conf`): how it reaches the manager,
//! which node it is, where it keeps its state and where it may mount.

use super::mount_root::DEFAULT_MOUNT_ROOT;
use crate::sys::host::hostname;
use spillway_api::config::{self, ClientConfig};
use std::path::{Path, PathBuf};

pub struct AgentConfig {
    pub client: ClientConfig,
    /// This node's name as sessions list it.
    pub node: String,
    pub state_dir: PathBuf,
    /// Source addresses of this node's mounts (empty: as the manager sees the agent).
    pub addresses: Vec<String>,
    /// Tunables file for the mounts.
    pub tunables: Option<PathBuf>,
    /// Mount every activation below this directory (at `mount_prefix/<its path>`)
    /// instead of at its path: several agents of one machine, each a compute node of
    /// its own (`spillway local up --extra-node`), must not mount on top of each other.
    pub mount_prefix: Option<PathBuf>,
    /// The only directory mounts go below (the manager's `mount_root`; below
    /// `mount_prefix` if one is set). Anything else the manager names is refused.
    pub mount_root: PathBuf,
}

const KEYS: &[&str] = &[
    "manager_url",
    "ca_file",
    "munge_socket",
    "node",
    "state_dir",
    "addresses",
    "tunables",
    "mount_prefix",
    "mount_root",
];

impl AgentConfig {
    pub fn load(path: &Path) -> Result<AgentConfig, String> {
        let m = config::read(path, KEYS)?;
        let client = ClientConfig::from_map(&m).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(AgentConfig {
            client,
            node: m.get("node").cloned().unwrap_or_else(hostname),
            state_dir: PathBuf::from(
                m.get("state_dir")
                    .map(String::as_str)
                    .unwrap_or("/var/lib/spillway/agent"),
            ),
            addresses: m
                .get("addresses")
                .map(|a| {
                    a.split(',')
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
            tunables: m.get("tunables").map(PathBuf::from),
            mount_prefix: m.get("mount_prefix").map(PathBuf::from),
            mount_root: PathBuf::from(
                m.get("mount_root")
                    .map(String::as_str)
                    .unwrap_or(DEFAULT_MOUNT_ROOT),
            ),
        })
    }
}
