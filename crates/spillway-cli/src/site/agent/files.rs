//! The agent's files and paths: per activation, in its state directory (mode 0700),
//! the instance descriptor (0600), the client's pid file and log, and a record of where
//! it is mounted; the client configuration every mount gets; and where an activation
//! is mounted on this node (below `mount_prefix`, inside the mount root).

use super::mount_root::MountRoot;
use super::Agent;
use std::path::{Path, PathBuf};

impl Agent {
    /// The instance descriptor of `activation` (its capability inside: 0600).
    pub(super) fn desc_path(&self, activation: u64) -> PathBuf {
        self.cfg
            .state_dir
            .join(format!("activation-{activation}.json"))
    }

    /// The pid file of `activation`'s client.
    pub(super) fn pid_path(&self, activation: u64) -> PathBuf {
        self.cfg
            .state_dir
            .join(format!("activation-{activation}.pid"))
    }

    /// The log of `activation`'s client.
    pub(super) fn log_path(&self, activation: u64) -> PathBuf {
        self.cfg
            .state_dir
            .join(format!("activation-{activation}.log"))
    }

    /// The client config every mount gets (`--manager-config`): how libdatawarp's
    /// requests through the mount reach the manager.
    pub(super) fn manager_config_path(&self) -> PathBuf {
        self.cfg.state_dir.join("manager.conf")
    }

    pub(super) fn write_manager_config(&self) -> Result<PathBuf, String> {
        let c = &self.cfg.client;
        // The mount daemonizes (cwd /): relative paths of the agent's config must not
        // reach it as they are.
        let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let mut text = format!(
            "# Written by the agent for its mounts (libdatawarp's control channel).\n\
             manager_url = {}\nca_file = {}\n",
            c.manager_url,
            abs(&c.ca_file).display()
        );
        if let Some(s) = &c.munge_socket {
            text.push_str(&format!("munge_socket = {}\n", abs(s).display()));
        }
        let path = self.manager_config_path();
        Self::write_private(&path, &text)?;
        Ok(path)
    }

    /// Where an activation's mount goes on this node: its path, below `mount_prefix`
    /// if one is set.
    pub(super) fn mount_point(&self, mount: &str) -> PathBuf {
        self.prefixed(Path::new(mount))
    }

    pub(super) fn prefixed(&self, p: &Path) -> PathBuf {
        match &self.cfg.mount_prefix {
            Some(pre) => pre.join(p.strip_prefix("/").unwrap_or(p)),
            None => p.to_path_buf(),
        }
    }

    /// This node's mount root, created if missing and checked (every time: a check
    /// made once at start would not see a directory changed since).
    pub(super) fn mount_root(&self) -> Result<MountRoot, String> {
        MountRoot::open(&self.prefixed(&self.cfg.mount_root))
    }

    /// The file recording where an activation is mounted here (for unmounts after a
    /// restart and for `spillway local down`).
    pub(super) fn mount_path(&self, activation: u64) -> PathBuf {
        self.cfg
            .state_dir
            .join(format!("activation-{activation}.mount"))
    }

    /// Write `text` to `path` (0600) unless it already holds it.
    pub(super) fn write_private(path: &Path, text: &str) -> Result<(), String> {
        if std::fs::read_to_string(path).ok().as_deref() == Some(text) {
            return Ok(());
        }
        spillway_types::files::write_atomic(path, text.as_bytes(), 0o600)
            .map_err(|e| format!("{}: {e}", path.display()))
    }
    /// Activations this agent holds on disk (from earlier passes or an earlier run),
    /// with their mount points on this node.
    pub(super) fn held(&self) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(&self.cfg.state_dir) else {
            return out;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = name
                .strip_prefix("activation-")
                .and_then(|r| r.strip_suffix(".mount"))
                .and_then(|r| r.parse::<u64>().ok())
            else {
                continue;
            };
            if let Ok(m) = std::fs::read_to_string(e.path()) {
                out.push((id, m));
            }
        }
        out
    }
}
