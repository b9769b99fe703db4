//! The secrets a developer cluster holds in the manager's place: the instance secret
//! (`DIR/instance.secret`, mode 0600, for the servers only) and the capability it mints
//! for its own client.

use super::netns::net_plan;
use super::state::ClusterState;
use crate::sys::host::hostname;
use spillway_types::capability::{self, Capability};
use spillway_types::descriptor::{decode_hex, encode_hex};
use spillway_types::InstanceDescriptor;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

/// `n` bytes from the kernel's random source.
pub fn random_bytes(n: usize) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; n];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    Ok(buf)
}

/// How long `cluster up`'s capability lasts: a developer cluster's mount should never
/// see it expire, and its client connects only from this machine's own addresses.
const DEV_CAPABILITY_SECS: u64 = 10 * 366 * 24 * 3600;

/// Where the instance secret is kept.
pub fn secret_path(dir: &Path) -> PathBuf {
    dir.join("instance.secret")
}

/// Write `text` to `path` as a private file (mode 0600 from its creation on), replacing
/// any old one in one rename: a reader (the client renewing its credential) sees the
/// old file or the new one, never a torn or readable-by-all one.
pub fn write_private(path: &Path, text: &str) -> Result<(), String> {
    spillway_types::files::write_atomic(path, text.as_bytes(), 0o600)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The instance secret of a cluster being resumed. A cluster made before capabilities
/// existed has no `instance.secret`: its descriptor's credential is the secret then.
pub fn load_secret(dir: &Path, desc: &InstanceDescriptor) -> Result<Vec<u8>, String> {
    let path = secret_path(dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => decode_hex(text.trim())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("{} is not hex", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let legacy = desc.credential_bytes();
            if legacy.is_empty() || legacy.starts_with(&capability::MAGIC) {
                return Err(format!(
                    "{} is missing: the servers' instance secret is lost",
                    path.display()
                ));
            }
            write_private(&path, &encode_hex(&legacy))?;
            Ok(legacy)
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The capability `cluster up` hands its own client: bound to the address the client
/// connects from (the bridge's with `--netns`, else loopback).
pub fn dev_capability(secret: &[u8], st: &ClusterState) -> Result<Vec<u8>, String> {
    let from = if st.servers.iter().any(|s| s.netns.is_some()) {
        net_plan(st.subnet()).bridge_addr
    } else {
        Ipv4Addr::LOCALHOST
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| format!("the clock is before 1970: {e}"))?
        .as_secs();
    let cap = Capability {
        instance: st.instance,
        node: hostname(),
        addrs: vec![IpAddr::V4(from)],
        expires: now.saturating_add(DEV_CAPABILITY_SECS),
    };
    capability::try_mint(secret, &cap)
        .ok_or_else(|| format!("host name {:?} is longer than 255 bytes", cap.node))
}
