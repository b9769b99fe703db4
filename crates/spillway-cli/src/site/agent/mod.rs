//! The agent on a compute node: asks the manager (long poll) which activations its node
//! must have mounted, mounts them with the FUSE client at their per-session path,
//! unmounts what is no longer wanted, and reports each outcome, failures included.
//!
//! Mount points are the agent's own: only below its `mount_root`, made by root through
//! directories no user can change and never through a symbolic link, and what is
//! mounted at one is the kernel's word (see `mount_root.rs`).
//!
//! A mount whose client died (the mount then answers ENOTCONN while the mount table
//! still lists it) is noticed by a watcher thread (`health.rs`, every
//! `HEALTH_EVERY`), reported `failed` with the reason, and mounted again once nothing
//! holds the dead mount; while something does, it stays reported and is left in place.
//!
//! Capabilities never reach users: each instance descriptor (with its capability) is a
//! root-only file under the agent's state directory (mode 0700 dir, 0600 file) read by
//! the root-owned client process; rewriting it renews the capability in place.
//!
//! * `config`     — `agent.conf`.
//! * `files`      — its files per activation, and where each is mounted here.
//! * `mount_root` — where the agent may mount, and how it walks there.
//! * `health`     — whether a mount it made is still served.

mod config;
mod files;
mod health;
mod mount_root;

pub use config::AgentConfig;

use crate::sys::mounts::{self, Mounted};
use crate::sys::proc::installed_exe;
use health::{Health, Prober};
use spillway_api::{AgentHello, AgentMount, AgentReport, AgentWork, ApiClient, Goal};
use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Agent {
    cfg: AgentConfig,
    api: ApiClient,
    /// What the manager last heard from us, per activation.
    reported: HashMap<u64, String>,
    /// Failed mounts are retried after a pause, not in a tight loop.
    failed_at: HashMap<u64, Instant>,
    /// The mounts the manager last asked this node to hold, by activation: what the
    /// health watcher checks and remounts.
    wanted: HashMap<u64, AgentMount>,
    /// Activations whose mount died while in use, with the error reported for it:
    /// reported once, then retried quietly until nothing holds it (a report per retry
    /// would count a failure each time and blow the activation's fuse, after which
    /// the manager stops listing it and the busy mount would be detached under its
    /// users).
    dead_busy: HashMap<u64, String>,
    prober: Prober,
    /// The `spillway` binary each mount runs, by the path it was installed at (taken
    /// at start): an upgrade that replaces it under a running agent makes new mounts
    /// run the new binary instead of failing (`installed_exe`).
    exe: PathBuf,
}

/// Why `Agent::mount` did not mount.
enum MountFailure {
    /// Reported as `failed` at every retry (each counts against the fuse).
    Failed(String),
    /// The mount is dead but something holds it: reported once, retried quietly.
    DeadInUse(String),
}

impl From<String> for MountFailure {
    fn from(e: String) -> MountFailure {
        MountFailure::Failed(e)
    }
}

impl From<&str> for MountFailure {
    fn from(e: &str) -> MountFailure {
        MountFailure::Failed(e.to_string())
    }
}

const RETRY_FAILED: Duration = Duration::from_secs(5);
/// How often the watcher checks that the mounts reported `mounted` are still served.
const HEALTH_EVERY: Duration = Duration::from_secs(2);
const POLL_WAIT_SECS: u64 = 20;

impl Agent {
    fn report(&mut self, activation: u64, status: &str, error: Option<String>) {
        if self.reported.get(&activation).map(String::as_str) == Some(status) && error.is_none() {
            return;
        }
        let r = AgentReport {
            activation,
            status: status.into(),
            error,
        };
        match self.api.agent_report(&self.cfg.node, &r) {
            Ok(_) => {
                self.reported.insert(activation, status.into());
            }
            Err(e) => tracing::warn!(activation, "cannot report {status}: {e}"),
        }
    }

    fn mount(&mut self, m: &AgentMount) -> Result<(), MountFailure> {
        let desc = m.descriptor.as_deref().ok_or("no descriptor")?;
        let desc_path = self.desc_path(m.activation);
        // Always (re)written: a renewed capability reaches the client on its next connect.
        Self::write_private(&desc_path, desc)?;
        let instance = spillway_types::InstanceDescriptor::parse(desc)
            .map_err(|e| format!("bad descriptor: {e}"))?
            .instance;
        let root = self.mount_root()?;
        // Made component by component below the root, never through a symlink, each a
        // root-owned directory no one else may write: the path handed to mount(2) below
        // names this very directory (no user can swap any part of it).
        let mp = root.prepare(&self.mount_point(&m.mount))?;
        let mnt = &mp.path;
        let mnt_text = mnt
            .to_str()
            .ok_or_else(|| format!("mount point {} is not UTF-8", mnt.display()))?;
        Self::write_private(&self.mount_path(m.activation), mnt_text)?;
        if let Mounted::Spillway(e) = &mp.mounted {
            if e.source != format!("spillway:{instance}") {
                return Err(MountFailure::Failed(format!(
                    "{} holds another instance's mount ({}): not mounting over it",
                    mnt.display(),
                    e.source
                )));
            }
            match self.prober.check(mnt, &self.pid_path(m.activation)) {
                Health::Alive => return Ok(()),
                // The walk checked every directory of the path: it names this mount.
                Health::Dead(why) => self.clear_dead(m.activation, mnt, &why)?,
            }
        }
        let mut cmd = Command::new(&self.exe);
        cmd.arg("mount")
            .arg("--instance")
            .arg(&desc_path)
            .arg("--log")
            .arg(self.log_path(m.activation))
            .arg("--pidfile")
            .arg(self.pid_path(m.activation));
        if let Some(t) = &self.cfg.tunables {
            cmd.arg("--tunables").arg(t);
        }
        // A private configuration: this node's own directory of the instance.
        if let Some(r) = &m.root_dir {
            cmd.arg("--root-dir").arg(r);
        }
        // The replica a load-balanced instance is read from is chosen by this name.
        cmd.arg("--node").arg(&self.cfg.node);
        cmd.arg("--manager-config")
            .arg(self.write_manager_config()?);
        let out = cmd.arg(mnt).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(MountFailure::Failed(format!(
                "mount of {} failed: {}",
                mnt.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Take a dead mount of `activation` away from `mnt` so that it can be mounted
    /// again: only if nothing holds it (a busy dead mount stays, and this fails saying
    /// why); then its old client, if still there, is stopped.
    fn clear_dead(&mut self, activation: u64, mnt: &Path, why: &str) -> Result<(), MountFailure> {
        if !mounts::umount_if_idle(mnt)? {
            return Err(MountFailure::DeadInUse(format!(
                "the mount at {} is dead ({why}) and still in use (open files or working \
                 directories in it): left in place, remounted once nothing holds it",
                mnt.display()
            )));
        }
        tracing::info!(activation, "unmounted the dead mount at {}", mnt.display());
        Ok(mounts::stop_client(&self.pid_path(activation))?)
    }

    /// Mount `m` unless it is mounted and served; report the outcome.
    fn ensure_mounted(&mut self, m: &AgentMount) {
        match self.mount(m) {
            Ok(()) => {
                self.failed_at.remove(&m.activation);
                self.dead_busy.remove(&m.activation);
                self.report(m.activation, "mounted", None);
            }
            Err(failure) => {
                self.failed_at.insert(m.activation, Instant::now());
                let e = match failure {
                    MountFailure::Failed(e) => e,
                    MountFailure::DeadInUse(e) => {
                        if self.dead_busy.get(&m.activation) == Some(&e) {
                            return; // reported already; still held
                        }
                        self.dead_busy.insert(m.activation, e.clone());
                        e
                    }
                };
                tracing::warn!(activation = m.activation, "{e}");
                self.reported.remove(&m.activation);
                self.report(m.activation, "failed", Some(e));
            }
        }
    }

    /// The watcher's pass: every mount reported `mounted` that has died is reported
    /// `failed` with the reason, then mounted again where that is safe; dead mounts
    /// still held are retried here (every RETRY_FAILED), so that the main loop keeps
    /// its long poll meanwhile instead of polling the manager twice a second for as
    /// long as a process holds one.
    fn check_health(&mut self) {
        let retry: Vec<AgentMount> = self
            .dead_busy
            .keys()
            .filter(|id| {
                self.failed_at
                    .get(id)
                    .is_none_or(|t| t.elapsed() >= RETRY_FAILED)
            })
            .filter_map(|id| self.wanted.get(id).cloned())
            .collect();
        for m in retry {
            self.ensure_mounted(&m);
        }
        let held: Vec<AgentMount> = self
            .wanted
            .values()
            .filter(|m| self.reported.get(&m.activation).map(String::as_str) == Some("mounted"))
            .cloned()
            .collect();
        for m in held {
            let mnt = self.mount_point(&m.mount);
            let Health::Dead(why) = self.prober.check(&mnt, &self.pid_path(m.activation)) else {
                continue;
            };
            let msg = format!("the mount at {} died: {why}", mnt.display());
            tracing::warn!(activation = m.activation, "{msg}; mounting it again");
            self.reported.remove(&m.activation);
            self.report(m.activation, "failed", Some(msg));
            self.ensure_mounted(&m);
        }
    }

    /// Unmount an activation mounted at `mnt` (this node's mount point): every mount
    /// stacked there, its client process, and the directory.
    fn unmount(&mut self, activation: u64, mnt: &Path) -> Result<(), String> {
        let root = self.mount_root()?;
        if root.contains(mnt) {
            root.unmount(mnt, Some(&self.pid_path(activation)))?;
        } else if std::fs::read_to_string(self.mount_path(activation))
            .is_ok_and(|m| Path::new(&m) == mnt)
        {
            // Mounted by an agent from before mount roots (our own record says so):
            // take it down where it is, but never make or remove anything there.
            mounts::unmount(mnt, Some(&self.pid_path(activation)))?;
        }
        // Otherwise never mounted here (this agent refuses such paths): nothing to do.
        for p in [
            self.desc_path(activation),
            self.mount_path(activation),
            self.log_path(activation),
        ] {
            let _ = std::fs::remove_file(p);
        }
        Ok(())
    }

    fn apply(&mut self, work: &AgentWork) {
        self.wanted = work
            .mounts
            .iter()
            .filter(|m| m.goal == Goal::Create)
            .map(|m| (m.activation, m.clone()))
            .collect();
        self.dead_busy.retain(|id, _| self.wanted.contains_key(id));
        for m in &work.mounts {
            match m.goal {
                Goal::Create => {
                    if let Some(t) = self.failed_at.get(&m.activation) {
                        if t.elapsed() < RETRY_FAILED {
                            continue;
                        }
                    }
                    self.ensure_mounted(m);
                }
                Goal::Destroy => match self.unmount(m.activation, &self.mount_point(&m.mount)) {
                    Ok(()) => self.report(m.activation, "unmounted", None),
                    Err(e) => {
                        tracing::warn!(activation = m.activation, "{e}");
                        self.reported.remove(&m.activation);
                        self.report(m.activation, "failed", Some(e));
                    }
                },
            }
        }
        self.failed_at
            .retain(|id, _| work.mounts.iter().any(|m| m.activation == *id));
        // Whatever we hold that the manager no longer lists goes (an activation deleted
        // while we were mounting it, or one from before a restart).
        for (id, mount) in self.held() {
            if !work.mounts.iter().any(|m| m.activation == id) {
                tracing::info!(activation = id, mount, "no longer wanted: unmounting");
                if let Err(e) = self.unmount(id, Path::new(&mount)) {
                    tracing::warn!(activation = id, "{e}");
                }
                self.reported.remove(&id);
            }
        }
    }
}

/// The agent's state, even if a thread panicked holding it (it is plain data: a
/// panic must not stop the mounts from being looked after).
fn lock(a: &Mutex<Agent>) -> std::sync::MutexGuard<'_, Agent> {
    a.lock().unwrap_or_else(|p| p.into_inner())
}

/// Run until killed.
pub fn run(cfg: AgentConfig) -> Result<(), String> {
    if cfg.mount_prefix.as_ref().is_some_and(|p| !p.is_absolute()) || !cfg.mount_root.is_absolute()
    {
        return Err("mount_root and mount_prefix must be absolute paths".into());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&cfg.state_dir)
        .map_err(|e| format!("cannot create {}: {e}", cfg.state_dir.display()))?;
    std::fs::set_permissions(&cfg.state_dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("{}: {e}", cfg.state_dir.display()))?;
    // Two clients: the long poll's, used without the agent's lock, and the reports'.
    let client = |t| ApiClient::munge(&cfg.client, t).map_err(|e| e.to_string());
    let poll = client(Duration::from_secs(POLL_WAIT_SECS + 15))?;
    let api = client(Duration::from_secs(POLL_WAIT_SECS + 15))?;
    let agent = Agent {
        cfg,
        api,
        reported: HashMap::new(),
        failed_at: HashMap::new(),
        wanted: HashMap::new(),
        dead_busy: HashMap::new(),
        prober: Prober::default(),
        exe: installed_exe()?,
    };
    // Made now so that a site's misconfiguration shows at start; each mount checks again.
    if let Err(e) = agent.mount_root() {
        tracing::error!("mount root: {e} (every mount will fail until this is fixed)");
    }
    let node = agent.cfg.node.clone();
    let addresses = agent.cfg.addresses.clone();
    // The long poll holds no lock; applying work and the watcher's checks take it.
    let agent = Arc::new(Mutex::new(agent));
    {
        let agent = agent.clone();
        std::thread::Builder::new()
            .name("mount-health".into())
            .spawn(move || loop {
                std::thread::sleep(HEALTH_EVERY);
                lock(&agent).check_health();
            })
            .map_err(|e| format!("cannot start the mount watcher: {e}"))?;
    }
    let mut version: Option<u64> = None;
    let mut said_hello = false;
    let mut backoff = Duration::from_millis(200);
    loop {
        if !said_hello {
            let hello = AgentHello {
                addresses: addresses.clone(),
            };
            match poll.agent_hello(&node, &hello) {
                Ok(v) => {
                    tracing::info!("registered with the manager as {node}: {v}");
                    said_hello = true;
                }
                Err(e) => {
                    tracing::warn!("cannot register with the manager: {e}");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
        }
        match poll.agent_work(&node, version, POLL_WAIT_SECS) {
            Ok(work) => {
                backoff = Duration::from_millis(200);
                let mut a = lock(&agent);
                a.apply(&work);
                // Dead mounts still held are the watcher's to retry.
                let retrying = a.failed_at.keys().any(|id| !a.dead_busy.contains_key(id));
                drop(a);
                // A failed mount is retried after its pause even if nothing changes.
                version = if !retrying {
                    Some(work.version)
                } else {
                    std::thread::sleep(Duration::from_millis(500));
                    None
                };
            }
            Err(e) => {
                tracing::warn!("manager: {e}");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
                version = None;
                said_hello = false;
            }
        }
    }
}
