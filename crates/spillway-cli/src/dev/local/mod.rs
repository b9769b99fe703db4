//! `spillway local`: a whole site on this machine — the manager, N storage servers and
//! one agent (this machine as compute node), each a real process talking real HTTPS and
//! TCP, authenticated with the real munged. What the README's demo and the control-plane
//! tests run.
//!
//! Layout of DIR: `tls/` (site CA, manager certificate), `manager.conf`, `agent.conf`,
//! `spillway.conf` (for dwstat/dwcli: `SPILLWAY_CONFIG=DIR/spillway.conf`),
//! `server.tunables`, `servers/sK/` (storage roots), `manager/` (database), `agent/`
//! (descriptors), `mounts/` (mount root), `logs/`, `local.json` (ports and pids).
//!
//! `--extra-node NAME` starts one more agent per name, as another compute node of this
//! machine: `agent-NAME.conf`, state in `agent-NAME/`, log `logs/agent-NAME.log`, and
//! its mounts below `nodes/NAME/` (the agent's `mount_prefix`), so that the nodes of one
//! session do not mount on top of each other.
//!
//! * `state` — `DIR/local.json`.
//! * `files` — the configuration files `up` writes.

mod files;
mod state;

use crate::args::{size_arg, LocalCmd, LocalUpArgs};
use crate::sys::host::{free_port, hostname};
use crate::sys::mounts::unmount;
use crate::sys::proc::{alive, spawn_detached, stop_pid};
use spillway_api::config::ClientConfig;
use spillway_api::{paths, ApiClient, NewNode, NewPool, Node};
use state::{load, save, state_path, LocalAgent, LocalServer, LocalSite};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `spillway local ...`.
pub fn command(cmd: LocalCmd) -> Result<(), String> {
    match cmd {
        LocalCmd::Up(a) => up(a),
        LocalCmd::Down { dir, keep_data } => down(&dir, keep_data),
        LocalCmd::Kill { dir, what, signal } => {
            let sig = match signal.as_str() {
                "KILL" => libc::SIGKILL,
                "TERM" => libc::SIGTERM,
                s => return Err(format!("--signal {s}: KILL or TERM")),
            };
            kill(&dir, &what, sig)
        }
        LocalCmd::Start { dir, what } => start(&dir, &what),
    }
}

/// Start `spillway <args>` in its own session with output to `logs/<name>.log`.
fn spawn(dir: &Path, name: &str, args: &[&std::ffi::OsStr]) -> Result<i32, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args(args);
    spawn_detached(cmd, &dir.join("logs").join(format!("{name}.log")), name)
}

fn client_config(dir: &Path) -> Result<ClientConfig, String> {
    ClientConfig::load(&dir.join("spillway.conf"))
}

fn admin_api(dir: &Path) -> Result<ApiClient, String> {
    ApiClient::munge(&client_config(dir)?, Duration::from_secs(10)).map_err(|e| e.to_string())
}

fn start_server(dir: &Path, s: &LocalServer) -> Result<i32, String> {
    std::fs::create_dir_all(&s.root).map_err(|e| format!("{}: {e}", s.root.display()))?;
    let tun = dir.join("server.tunables");
    spawn(
        dir,
        &s.name,
        &[
            "server".as_ref(),
            "--root".as_ref(),
            s.root.as_os_str(),
            "--listen".as_ref(),
            s.listen.as_ref(),
            "--tunables".as_ref(),
            tun.as_os_str(),
        ],
    )
}

fn start_manager(dir: &Path) -> Result<i32, String> {
    let conf = dir.join("manager.conf");
    spawn(
        dir,
        "manager",
        &["manager".as_ref(), "--config".as_ref(), conf.as_os_str()],
    )
}

/// The part name of an extra node's agent (`kill`/`start`, its log).
fn extra_agent_name(node: &str) -> String {
    format!("agent-{node}")
}

/// Start the agent `name` (`agent`, or `agent-NODE` for an extra node) with its config.
fn start_agent(dir: &Path, name: &str) -> Result<i32, String> {
    let conf = dir.join(format!("{name}.conf"));
    spawn(
        dir,
        name,
        &["agent".as_ref(), "--config".as_ref(), conf.as_os_str()],
    )
}

/// Wait until the manager answers over HTTPS (as root, so MUNGE works too).
fn wait_manager(dir: &Path, pid: i32) -> Result<(), String> {
    let api = admin_api(dir)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match api.get::<serde_json::Value>(paths::POOLS) {
            Ok(_) => return Ok(()),
            Err(e) => {
                if !alive(pid) {
                    return Err(format!(
                        "the manager exited at start; see {}",
                        dir.join("logs/manager.log").display()
                    ));
                }
                if Instant::now() > deadline {
                    return Err(format!("the manager does not answer: {e}"));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `spillway local up`: the site at `a.dir`, started and (unless `--bare`) with its
/// pool made and its servers registered and online.
pub fn up(a: LocalUpArgs) -> Result<(), String> {
    let server_capacity = size_arg("--server-capacity", &a.server_capacity)?;
    let granularity = size_arg("--granularity", &a.granularity)?;
    let node = a.node.clone().unwrap_or_else(hostname);
    let dir = &a.dir;
    if state_path(dir).exists() {
        return Err(format!(
            "{} already holds a local site: `spillway local down --dir {}` first",
            dir.display(),
            dir.display()
        ));
    }
    if a.servers == 0 {
        return Err("--servers must be at least 1".into());
    }
    for n in &a.extra_node {
        // The name becomes file names here.
        if !spillway_api::valid_node_name(n) || *n == node {
            return Err(format!(
                "--extra-node {n:?}: a node name (A-Z a-z 0-9 _ . -, not starting with . or -) other than --node"
            ));
        }
    }
    for sub in ["logs", "servers", "manager", "agent", "mounts"] {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    // What holds secrets or metadata (the manager's database, the servers' roots, the
    // agent's descriptors, logs naming users' files) is root's alone; the site
    // directory itself stays readable for spillway.conf and tls/ca.pem.
    for sub in ["logs", "servers", "manager", "agent"] {
        spillway_types::files::private_dir(&dir.join(sub))
            .map_err(|e| format!("{}: {e}", dir.join(sub).display()))?;
    }
    let dir = &std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    spillway_manager::tls::init(&dir.join("tls"), &[])?;
    let manager_listen = files::write_configs(dir, &a, &node)?;
    let mut site = LocalSite {
        manager_listen,
        manager_pid: None,
        agent_pid: None,
        node: node.clone(),
        servers: Vec::new(),
        extra_agents: a
            .extra_node
            .iter()
            .map(|n| LocalAgent {
                node: n.clone(),
                pid: None,
            })
            .collect(),
    };
    for k in 0..a.servers {
        let s = LocalServer {
            name: format!("server{k}"),
            listen: format!("127.0.0.1:{}", free_port()?),
            root: dir.join("servers").join(format!("s{k}")),
            pid: None,
        };
        site.servers.push(s);
    }
    for i in 0..site.servers.len() {
        let pid = start_server(dir, &site.servers[i])?;
        site.servers[i].pid = Some(pid);
    }
    site.manager_pid = Some(start_manager(dir)?);
    save(dir, &site)?;
    wait_manager(dir, site.manager_pid.unwrap_or(0))?;
    if a.bare {
        start_agents(dir, &mut site)?;
        save(dir, &site)?;
        println!(
            "local site up (bare: no pool, no nodes) in {}",
            dir.display()
        );
        return Ok(());
    }
    let api = admin_api(dir)?;
    if let Err(e) = api.post::<_, serde_json::Value>(
        paths::POOLS,
        &NewPool {
            id: a.pool.clone(),
            granularity,
            units: None,
        },
    ) {
        return Err(format!("cannot create pool {}: {e}", a.pool));
    }
    for s in &site.servers {
        api.post::<_, serde_json::Value>(
            paths::NODES,
            &NewNode {
                id: s.name.clone(),
                address: s.listen.clone(),
                pool: Some(a.pool.clone()),
                capacity: Some(server_capacity),
            },
        )
        .map_err(|e| format!("cannot register {}: {e}", s.name))?;
    }
    // Servers count once their first heartbeat is in.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes: serde_json::Value = api.get(paths::NODES).map_err(|e| e.to_string())?;
        let nodes: Vec<Node> =
            serde_json::from_value(nodes["nodes"].clone()).map_err(|e| e.to_string())?;
        if nodes.iter().all(|n| n.online) {
            break;
        }
        if Instant::now() > deadline {
            let down: Vec<_> = nodes.iter().filter(|n| !n.online).map(|n| &n.id).collect();
            return Err(format!(
                "servers not online after 30 s: {down:?}; see {}/logs",
                dir.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    start_agents(dir, &mut site)?;
    save(dir, &site)?;
    println!("local site up in {}", dir.display());
    println!("  manager  https://{}", site.manager_listen);
    for s in &site.servers {
        println!("  {}  {}  {}", s.name, s.listen, s.root.display());
    }
    println!("  agent    node {}", site.node);
    for x in &site.extra_agents {
        println!(
            "  {}  node {}, mounts below {}",
            extra_agent_name(&x.node),
            x.node,
            dir.join("nodes").join(&x.node).display()
        );
    }
    println!(
        "use it: export SPILLWAY_CONFIG={}/spillway.conf; dwstat most",
        dir.display()
    );
    Ok(())
}

/// The agent of this machine, then those of the extra nodes.
fn start_agents(dir: &Path, site: &mut LocalSite) -> Result<(), String> {
    site.agent_pid = Some(start_agent(dir, "agent")?);
    for x in &mut site.extra_agents {
        x.pid = Some(start_agent(dir, &extra_agent_name(&x.node))?);
    }
    Ok(())
}

/// Stop one part (`manager`, `agent`, `agent-NODE`, `serverK`) with `signal`.
pub fn kill(dir: &Path, what: &str, signal: i32) -> Result<(), String> {
    let mut site = load(dir)?;
    let extra = site
        .extra_agents
        .iter_mut()
        .find(|x| extra_agent_name(&x.node) == what);
    let pid = match what {
        "manager" => site.manager_pid.take(),
        "agent" => site.agent_pid.take(),
        _ if extra.is_some() => extra.and_then(|x| x.pid.take()),
        name => site
            .servers
            .iter_mut()
            .find(|s| s.name == name)
            .ok_or_else(|| format!("no part {name:?} (manager, agent, server0..)"))?
            .pid
            .take(),
    };
    if let Some(pid) = pid {
        stop_pid(pid, signal);
    }
    save(dir, &site)
}

/// Start one stopped part again with its configuration.
pub fn start(dir: &Path, what: &str) -> Result<(), String> {
    let dir = &std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut site = load(dir)?;
    match what {
        "manager" => {
            if site.manager_pid.is_some_and(alive) {
                return Err("the manager is running".into());
            }
            let pid = start_manager(dir)?;
            site.manager_pid = Some(pid);
            save(dir, &site)?;
            wait_manager(dir, pid)?;
        }
        "agent" => {
            if site.agent_pid.is_some_and(alive) {
                return Err("the agent is running".into());
            }
            site.agent_pid = Some(start_agent(dir, "agent")?);
        }
        name if name.starts_with("agent-") => {
            let x = site
                .extra_agents
                .iter_mut()
                .find(|x| extra_agent_name(&x.node) == name)
                .ok_or_else(|| format!("no part {name:?} (no such --extra-node)"))?;
            if x.pid.is_some_and(alive) {
                return Err(format!("{name} is running"));
            }
            x.pid = Some(start_agent(dir, name)?);
        }
        name => {
            let i = site
                .servers
                .iter()
                .position(|s| s.name == name)
                .ok_or_else(|| format!("no part {name:?} (manager, agent, server0..)"))?;
            if site.servers[i].pid.is_some_and(alive) {
                return Err(format!("{name} is running"));
            }
            site.servers[i].pid = Some(start_server(dir, &site.servers[i])?);
        }
    }
    save(dir, &site)
}

/// Unmount what an agent left mounted (its state directory records each mount point).
fn unmount_left(agent_dir: &Path) {
    let Ok(rd) = std::fs::read_dir(agent_dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(id) = name
            .strip_prefix("activation-")
            .and_then(|r| r.strip_suffix(".mount"))
        {
            if let Ok(m) = std::fs::read_to_string(e.path()) {
                let pid = agent_dir.join(format!("activation-{id}.pid"));
                // Every mount stacked there and the client process, mounted or not.
                if let Err(err) = unmount(Path::new(&m), Some(&pid)) {
                    eprintln!("spillway: {m}: {err}");
                }
            }
        }
    }
}

/// `spillway local down`: the agents (then what they left mounted), the manager and
/// the servers stopped, and DIR removed unless `keep_data`.
pub fn down(dir: &Path, keep_data: bool) -> Result<(), String> {
    let site = load(dir)?;
    // The agents first, so they do not remount what we take down.
    let agents = std::iter::once(("agent".to_string(), site.agent_pid)).chain(
        site.extra_agents
            .iter()
            .map(|x| (extra_agent_name(&x.node), x.pid)),
    );
    let mut agent_dirs = Vec::new();
    for (name, pid) in agents {
        if let Some(pid) = pid {
            stop_pid(pid, libc::SIGTERM);
        }
        agent_dirs.push(dir.join(name));
    }
    // Mounts the agents left.
    for agent_dir in &agent_dirs {
        unmount_left(agent_dir);
    }
    if let Some(pid) = site.manager_pid {
        stop_pid(pid, libc::SIGTERM);
    }
    for s in &site.servers {
        if let Some(pid) = s.pid {
            stop_pid(pid, libc::SIGTERM);
        }
    }
    if keep_data {
        let _ = std::fs::remove_file(state_path(dir));
        return Ok(());
    }
    // Never recurse into a live mount: that would delete an instance's files through it.
    let canon = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let prefix = format!("{}/", canon.display());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    if let Some(m) = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .find(|m| m.starts_with(&prefix))
    {
        return Err(format!(
            "{m} is still mounted: not removing {}",
            dir.display()
        ));
    }
    {
        std::fs::remove_dir_all(dir)
            .map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
    }
    Ok(())
}
