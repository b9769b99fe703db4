//! `spillway mount`: the FUSE client of one instance, from its descriptor, detached
//! into the background once mounted (or in the foreground), and `spillway umount`.

use super::services::init_logging;
use crate::args::MountArgs;
use crate::sys::daemon;
use spillway_types::{InstanceDescriptor, Tunables};
use std::path::{Path, PathBuf};

/// Tunables: the defaults, then `path` if given.
pub fn load_tunables(path: Option<&Path>) -> Result<Tunables, String> {
    let mut t = Tunables::default();
    if let Some(p) = path {
        t.apply_file(p)?;
    }
    Ok(t)
}

/// Mount `a.instance` at `a.mountpoint`; returns when the mount ends (in the
/// foreground, or in the detached child: the parent exits once it is mounted).
pub fn mount(a: MountArgs, log_level: &str) -> Result<(), String> {
    let MountArgs {
        instance,
        mountpoint,
        foreground,
        log,
        pidfile,
        tunables,
        manager_config,
        root_dir,
        node,
    } = a;
    // The mount's pid file and log are root's alone, like its descriptor.
    spillway_types::files::private_umask();
    let desc = InstanceDescriptor::load(&instance).map_err(|e| e.to_string())?;
    if let Some(d) = &root_dir {
        spillway_client::root::parse_root_dir(d)?;
    }
    let tunables = load_tunables(tunables.as_deref())?;
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
    init_logging(log_level);
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
        node,
    });
    if let Err(e) = &result {
        // A detached parent still waiting sees the pipe close and points at
        // this log.
        tracing::error!("{e}");
    }
    result
}

/// `spillway umount`: every Spillway mount stacked at `mountpoint`.
pub fn umount(mountpoint: &Path) -> Result<(), String> {
    crate::sys::mounts::unmount(mountpoint, None)
}
