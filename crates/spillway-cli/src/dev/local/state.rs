//! What `spillway local` keeps in `DIR/local.json`: the manager's address, and the pid
//! of every part (manager, servers, agents), so that `kill`, `start` and `down` find
//! them again.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct LocalServer {
    pub name: String,
    pub listen: String,
    pub root: PathBuf,
    pub pid: Option<i32>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct LocalSite {
    pub manager_listen: String,
    pub manager_pid: Option<i32>,
    pub agent_pid: Option<i32>,
    pub node: String,
    pub servers: Vec<LocalServer>,
    /// Agents of `--extra-node`: more compute nodes on this machine.
    #[serde(default)]
    pub extra_agents: Vec<LocalAgent>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct LocalAgent {
    pub node: String,
    pub pid: Option<i32>,
}

pub fn state_path(dir: &Path) -> PathBuf {
    dir.join("local.json")
}

pub fn load(dir: &Path) -> Result<LocalSite, String> {
    let p = state_path(dir);
    let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
}

pub fn save(dir: &Path, s: &LocalSite) -> Result<(), String> {
    let p = state_path(dir);
    let text = serde_json::to_string_pretty(s).map_err(|e| e.to_string())?;
    spillway_types::files::write_atomic(&p, text.as_bytes(), 0o644)
        .map_err(|e| format!("{}: {e}", p.display()))
}
