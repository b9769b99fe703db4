//! Mounting an instance: check the servers answer, mount with the options POSIX
//! semantics need, serve until unmounted, and unmount on SIGTERM/SIGINT.

use crate::control::{Control, Rest};
use crate::fs::SpillwayFs;
use crate::root::MountRoot;
use fuser::{Config, MountOption, Session, SessionACL};
use spillway_api::config::ClientConfig;
use spillway_api::ApiClient;
use spillway_stubs::Instance;
use spillway_types::{InstanceDescriptor, Tunables, ROOT_INODE};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

pub struct MountArgs {
    pub descriptor: InstanceDescriptor,
    pub mountpoint: PathBuf,
    pub tunables: Tunables,
    /// Where the descriptor came from (shown to `spillway stripes`; read again before
    /// each connection for a renewed credential).
    pub origin: PathBuf,
    /// Called once the file system is mounted and about to serve (daemonizing parents
    /// wait for this).
    pub ready: Option<Box<dyn FnOnce() + Send>>,
    /// How to reach the manager for libdatawarp's control channel (`--manager-config`);
    /// None: the channel answers ENOTSUP.
    pub manager: Option<ClientConfig>,
    /// The directory of the instance shown as the mount's root (`--root-dir`; a
    /// private mount's `/.spillway-private/<node>`), created if missing; None: the
    /// instance's root.
    pub root_dir: Option<String>,
    /// The compute node's name (`--node`; default: the host name): a load-balanced
    /// instance is read from the replica this name picks.
    pub node: Option<String>,
}

/// Longest a control request to the manager may take (a `wait` asks for up to 10 s).
const MANAGER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The manager's REST API with a fresh MUNGE credential (root's) per request.
fn manager_client(c: &ClientConfig) -> Result<ApiClient, String> {
    ApiClient::munge(c, MANAGER_TIMEOUT).map_err(|e| format!("manager {}: {e}", c.manager_url))
}

/// Mount and serve until unmounted. Returns when the mount is gone.
pub fn mount_foreground(args: MountArgs) -> Result<(), String> {
    let host = hostname();
    let peer_name = format!("{host}:{}", std::process::id());
    let instance = args.descriptor.instance;
    let manager: Option<Box<dyn Rest>> = match &args.manager {
        Some(c) => Some(Box::new(manager_client(c)?)),
        None => None,
    };
    let read_only = args.descriptor.ldbal;
    let node = args.node.clone().unwrap_or_else(|| host.clone());
    let inst = Arc::new(
        Instance::renewing_from(args.descriptor, &args.origin, &args.tunables, &peer_name)
            .reading_as(&node),
    );
    // Refuse to mount an instance whose servers do not answer (or refuse us): a mount
    // that fails every call later is worse than an error now.
    inst.getattr(ROOT_INODE).map_err(|e| {
        format!(
            "cannot reach the instance's root on {}: {e}",
            inst.desc.servers[0]
        )
    })?;

    let root = match &args.root_dir {
        Some(dir) => MountRoot::resolve(&inst, dir)?,
        None => MountRoot::instance(),
    };
    if !root.is_instance_root() {
        tracing::info!("the mount's root is {} ({})", root.path(), root.ino());
    }

    let notifier = Arc::new(OnceLock::new());
    let control = Arc::new(
        Control::new(inst.clone(), manager)
            .with_notifier(notifier.clone())
            .with_root(root.clone()),
    );
    let fs = SpillwayFs::new(
        inst,
        args.tunables.clone(),
        notifier.clone(),
        args.origin.clone(),
        control,
        root,
    );
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("spillway:{instance}")),
        // As a kernel option: fuser mounts with mount(2) as root and drops its own
        // Subtype there, and libdatawarp finds mounts by type `fuse.spillway`.
        MountOption::CUSTOM("subtype=spillway".into()),
        MountOption::DefaultPermissions,
        // A load-balanced instance is read-only (docs/cache.md §6): the kernel answers
        // every change EROFS before it reaches us (the servers refuse them too).
        if read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
        // Files of an instance are its users': a setuid binary or a device node in it
        // must never give anyone more than the user who put it there had.
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    config.acl = SessionACL::All;
    config.n_threads = Some(args.tunables.fuse_threads.max(1));
    config.clone_fd = true;
    let mut session = Session::new(fs, &args.mountpoint, &config)
        .map_err(|e| format!("cannot mount at {}: {e}", args.mountpoint.display()))?;
    let _ = notifier.set(session.notifier());
    set_readahead(&args.mountpoint, args.tunables.max_readahead);
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

/// Give the mount's backing device the readahead window the client asked the kernel
/// for. The kernel caps a FUSE mount's readahead at its default device window
/// (128 KiB) whatever the file system negotiates, which leaves a sequential reader
/// waiting on one request after another; the window is set where the kernel keeps it,
/// `/sys/class/bdi/MAJ:MIN/read_ahead_kb`. Found through /proc/self/mountinfo: a stat
/// of the mount point would wait for the session we have not started serving yet.
fn set_readahead(mountpoint: &std::path::Path, bytes: u32) {
    let Some(dev) = mount_device(mountpoint) else {
        tracing::warn!("readahead left at the kernel default: mount not found in mountinfo");
        return;
    };
    let knob = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    match std::fs::write(&knob, format!("{}", bytes / 1024)) {
        Ok(()) => tracing::debug!("{knob} = {} KiB", bytes / 1024),
        Err(e) => tracing::warn!("readahead left at the kernel default ({knob}: {e})"),
    }
}

/// The device number (`MAJ:MIN`) of the most recent mount at `mountpoint`.
fn mount_device(mountpoint: &std::path::Path) -> Option<String> {
    let want = std::fs::canonicalize(mountpoint).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().rev().find_map(|line| {
        let mut fields = line.split(' ');
        let dev = fields.nth(2)?;
        let at = fields.nth(1)?;
        (std::path::Path::new(&unescape_mountinfo(at)) == want).then(|| dev.to_string())
    })
}

/// mountinfo writes space, tab, newline and backslash in paths as `\ooo` octal.
pub fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).and_then(|d| {
            d.iter()
                .all(|c| (b'0'..=b'7').contains(c))
                .then(|| d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0')))
        });
        match octal {
            Some(v) if b[i] == b'\\' && v <= 0xff => {
                out.push(v as u8);
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mountinfo("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mountinfo("/x\\011y\\134z"), "/x\ty\\z");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/trailing\\"), "/trailing\\");
        assert_eq!(unescape_mountinfo("/bad\\9"), "/bad\\9");
    }
}
