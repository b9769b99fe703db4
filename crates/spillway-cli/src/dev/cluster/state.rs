//! What `spillway cluster` keeps in `DIR/cluster.json`: its instance, servers (address,
//! root, pid, namespace) and mounts, so that later commands find them again.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ServerState {
    pub index: u16,
    pub root: PathBuf,
    pub listen: String,
    pub pid: Option<i32>,
    pub netns: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct MountState {
    pub path: PathBuf,
    pub pidfile: PathBuf,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ClusterState {
    pub instance: u64,
    pub capacity: u64,
    pub stripe_size: u32,
    pub servers: Vec<ServerState>,
    pub mounts: Vec<MountState>,
    /// With `--netns`: the `N` of the cluster's subnet `10.N.0.0/24`, claimed at the
    /// first `up` (absent in the state of clusters made before it was recorded).
    #[serde(default)]
    pub netns_subnet: Option<u8>,
    /// The tunables file its servers and mounts are started with (absolute).
    #[serde(default)]
    pub tunables: Option<PathBuf>,
    /// A cache instance: the PFS directory it caches (absolute).
    #[serde(default)]
    pub cache_pfs: Option<PathBuf>,
    /// A cache instance's policies, set at its first `up`.
    #[serde(default)]
    pub cache_policy: CachePolicy,
}

/// The policies of a cache instance (the directive's keys, docs/cache.md).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachePolicy {
    pub modified_threshold: u64,
    pub read_ahead: u64,
    pub sync_on_close: bool,
    pub sync_to_pfs: bool,
}

impl Default for CachePolicy {
    fn default() -> Self {
        use spillway_api::model::cache_defaults as d;
        CachePolicy {
            modified_threshold: d::MODIFIED_THRESHOLD,
            read_ahead: d::READ_AHEAD,
            sync_on_close: false,
            sync_to_pfs: false,
        }
    }
}

impl ClusterState {
    /// The `N` of a `--netns` cluster's subnet `10.N.0.0/24` (for a state written
    /// before the subnet was recorded, the one derived from the instance id then).
    pub fn subnet(&self) -> u8 {
        self.netns_subnet
            .unwrap_or(200 + (self.instance % 50) as u8)
    }

    /// Where server `index` is in `servers`.
    pub fn position(&self, index: u16) -> Result<usize, String> {
        self.servers
            .iter()
            .position(|s| s.index == index)
            .ok_or(format!("no server {index}"))
    }
}

/// `DIR/cluster.json`.
fn state_path(dir: &Path) -> PathBuf {
    dir.join("cluster.json")
}

/// The state of the cluster at `dir`.
pub fn load(dir: &Path) -> Result<ClusterState, String> {
    let p = state_path(dir);
    let text = std::fs::read_to_string(&p)
        .map_err(|e| format!("no cluster at {} ({}: {e})", dir.display(), p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is damaged: {e}", p.display()))
}

/// Write the state (through a temporary file and a rename).
pub fn save(dir: &Path, st: &ClusterState) -> Result<(), String> {
    let text = serde_json::to_string_pretty(st).map_err(|e| e.to_string())?;
    let tmp = dir.join("cluster.json.tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, state_path(dir)).map_err(|e| format!("{}: {e}", dir.display()))
}
