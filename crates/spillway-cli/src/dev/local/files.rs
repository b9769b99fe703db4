//! The configuration files of a `spillway local` site, written at `up`: the manager's
//! (`manager.conf`), the tools' (`spillway.conf`), each agent's (`agent.conf`,
//! `agent-NODE.conf`) and the servers' tunables (`server.tunables`).

use super::extra_agent_name;
use crate::args::LocalUpArgs;
use crate::sys::host::free_port;
use std::path::{Path, PathBuf};

/// `pfs_roots = ...` for manager.conf and the servers' tunables: absolute paths
/// (resolved when they exist, as the servers resolve them), colon-separated.
fn pfs_roots_line(roots: &[PathBuf]) -> Result<String, String> {
    if roots.is_empty() {
        return Ok(String::new());
    }
    let mut out = Vec::new();
    for r in roots {
        if !r.is_absolute() {
            return Err(format!("--pfs-root {}: not an absolute path", r.display()));
        }
        let r = std::fs::canonicalize(r).unwrap_or_else(|_| r.clone());
        let s = r
            .to_str()
            .filter(|s| !s.contains([':', ',', '\n', '#']))
            .ok_or_else(|| {
                format!(
                    "--pfs-root {}: the path cannot hold : , # or a newline",
                    r.display()
                )
            })?;
        out.push(s.to_string());
    }
    Ok(format!("pfs_roots = {}\n", out.join(":")))
}

/// Write `text` to `path` (the error names the path).
pub fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Write every configuration file of the site at `dir` for node `node`, with the
/// manager on a free port of loopback; the manager's address.
pub fn write_configs(dir: &Path, a: &LocalUpArgs, node: &str) -> Result<String, String> {
    let munge_line = a
        .munge_socket
        .as_ref()
        .map(|s| format!("munge_socket = {}\n", s.display()))
        .unwrap_or_default();
    let pfs_line = pfs_roots_line(&a.pfs_root)?;
    let admin_line = match &a.admin_group {
        Some(g) if g.is_empty() || g.contains(['\n', '#']) => {
            return Err(format!("--admin-group {g:?} is not a group name"))
        }
        Some(g) => format!("admin_group = {g}\n"),
        None => String::new(),
    };
    let mport = free_port()?;
    let manager_listen = format!("127.0.0.1:{mport}");
    write(
        &dir.join("manager.conf"),
        &format!(
            "# spillway local site: manager\nlisten = {manager_listen}\nstate_dir = {}\n\
             tls_cert = {}\ntls_key = {}\nmount_root = {}\ndefault_pool = {}\n\
             heartbeat_interval = 1s\nnode_timeout = 3s\n{}{munge_line}{pfs_line}{admin_line}",
            dir.join("manager").display(),
            dir.join("tls/manager.pem").display(),
            dir.join("tls/manager.key").display(),
            dir.join("mounts").display(),
            a.pool,
            a.policy
                .as_ref()
                .map(|p| format!("policy = {p}\n"))
                .unwrap_or_default(),
        ),
    )?;
    write(
        &dir.join("spillway.conf"),
        &format!(
            "# spillway local site: where dwstat/dwcli/dw_wlm_cli find the manager\n\
             manager_url = https://{manager_listen}\nca_file = {}\n{munge_line}",
            dir.join("tls/ca.pem").display()
        ),
    )?;
    write(
        &dir.join("agent.conf"),
        &format!(
            "# spillway local site: this machine's agent\nmanager_url = https://{manager_listen}\n\
             ca_file = {}\nnode = {}\nstate_dir = {}\nmount_root = {}\n{munge_line}",
            dir.join("tls/ca.pem").display(),
            node,
            dir.join("agent").display(),
            dir.join("mounts").display()
        ),
    )?;
    for n in &a.extra_node {
        let name = extra_agent_name(n);
        write(
            &dir.join(format!("{name}.conf")),
            &format!(
                "# spillway local site: compute node {n} of this machine\n\
                 manager_url = https://{manager_listen}\nca_file = {}\nnode = {n}\n\
                 state_dir = {}\nmount_prefix = {}\nmount_root = {}\n{munge_line}",
                dir.join("tls/ca.pem").display(),
                dir.join(&name).display(),
                dir.join("nodes").join(n).display(),
                dir.join("mounts").display()
            ),
        )?;
    }
    // The servers take their PFS roots from their own configuration only.
    write(
        &dir.join("server.tunables"),
        &format!("{munge_line}{pfs_line}"),
    )?;
    Ok(manager_listen)
}
