//! Mounting an instance: check the servers answer, mount with the options POSIX
//! semantics need, serve until unmounted, and unmount on SIGTERM/SIGINT.

use crate::fs::SpillwayFs;
use crate::instance::Instance;
use fuser::{Config, MountOption, Session, SessionACL};
use spillway_types::{InstanceDescriptor, Tunables, ROOT_INODE};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

pub struct MountArgs {
    pub descriptor: InstanceDescriptor,
    pub mountpoint: PathBuf,
    pub tunables: Tunables,
    /// Where the descriptor came from (shown to `spillway stripes`).
    pub origin: PathBuf,
    /// Called once the file system is mounted and about to serve (daemonizing parents
    /// wait for this).
    pub ready: Option<Box<dyn FnOnce() + Send>>,
}

/// Mount and serve until unmounted. Returns when the mount is gone.
pub fn mount_foreground(args: MountArgs) -> Result<(), String> {
    let host = hostname();
    let peer_name = format!("{host}:{}", std::process::id());
    let instance = args.descriptor.instance;
    let inst = Arc::new(Instance::new(args.descriptor, &args.tunables, &peer_name));
    // Refuse to mount an instance whose servers do not answer (or refuse us): a mount
    // that fails every call later is worse than an error now.
    inst.getattr(ROOT_INODE).map_err(|e| {
        format!(
            "cannot reach the instance's root on {}: {e}",
            inst.desc.servers[0]
        )
    })?;

    let notifier = Arc::new(OnceLock::new());
    let fs = SpillwayFs::new(
        inst,
        args.tunables.clone(),
        notifier.clone(),
        args.origin.clone(),
    );
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("spillway:{instance}")),
        MountOption::Subtype("spillway".into()),
        MountOption::DefaultPermissions,
        MountOption::RW,
        MountOption::Dev,
        MountOption::Suid,
    ];
    config.acl = SessionACL::All;
    config.n_threads = Some(args.tunables.fuse_threads.max(1));
    config.clone_fd = true;
    let mut session = Session::new(fs, &args.mountpoint, &config)
        .map_err(|e| format!("cannot mount at {}: {e}", args.mountpoint.display()))?;
    let _ = notifier.set(session.notifier());
    let mut unmounter = session.unmount_callable();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let mp = args.mountpoint.clone();
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            tracing::info!("signal received: unmounting {}", mp.display());
            if let Err(e) = unmounter.unmount() {
                tracing::warn!("unmount failed ({e}); detaching lazily");
                let c =
                    std::ffi::CString::new(mp.as_os_str().as_encoded_bytes()).unwrap_or_default();
                // SAFETY: c is a valid NUL-terminated path.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    });
    tracing::info!(
        "instance {instance} mounted at {}",
        args.mountpoint.display()
    );
    if let Some(ready) = args.ready {
        ready();
    }
    session
        .run()
        .map_err(|e| format!("file system session ended with an error: {e}"))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
