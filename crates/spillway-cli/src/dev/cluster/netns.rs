//! The network of a `spillway cluster up --netns`: a bridge in this (the client's)
//! namespace and, per server, a network namespace joined to the bridge by a veth pair,
//! made and removed with `ip`.

use super::state::ClusterState;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Run `cmd`; its stderr is the error if it fails.
fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// The network of a `--netns` cluster: a bridge in this (the client's) namespace and,
/// per server, a namespace joined to the bridge by a veth pair. Client and servers
/// share one subnet, `10.<subnet>.0.0/24`, so servers reach each other too (purges,
/// truncates) without forwarding.
pub struct NetPlan {
    pub bridge: String,
    /// The bridge's address: the client's source address towards every server.
    pub bridge_addr: Ipv4Addr,
}

/// The subnets `--netns` clusters take, `10.N.0.0/24`: chosen among these, at the first
/// `up`, as one no address on this host is in (see `claim_subnet`).
const SUBNETS: std::ops::RangeInclusive<u8> = 128..=254;

pub fn net_plan(subnet: u8) -> NetPlan {
    NetPlan {
        bridge: format!("spwbr{subnet}"),
        bridge_addr: Ipv4Addr::new(10, subnet, 0, 1),
    }
}

/// Namespace, host-side veth, namespace-side veth, and address of server `k`. Every
/// name carries the subnet, which no other live cluster holds (`claim_subnet`), so two
/// clusters never name (or delete) each other's links.
pub fn netns_plan(subnet: u8, k: u16) -> (String, String, String, String) {
    (
        format!("spw-{subnet}-s{k}"),
        format!("spw{subnet}h{k}"),
        format!("spw{subnet}n{k}"),
        format!("10.{subnet}.0.{}", u32::from(k) + 2),
    )
}

/// The `10.N` subnets some IPv4 address of this (root) namespace is in: other
/// clusters' bridges and anything else the host uses.
fn subnets_in_use() -> Result<std::collections::HashSet<u8>, String> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .map_err(|e| format!("ip -4 addr show: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ip -4 addr show failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(parse_subnets_in_use(&String::from_utf8_lossy(&out.stdout)))
}

/// The `10.N` (second octet) of every `inet 10.N.x.y/len` in `ip -4 -o addr` output.
fn parse_subnets_in_use(text: &str) -> std::collections::HashSet<u8> {
    let mut used = std::collections::HashSet::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            if w != "inet" {
                continue;
            }
            let Some(cidr) = words.next() else { break };
            let addr = cidr.split('/').next().unwrap_or("");
            if let Ok(ip) = addr.parse::<Ipv4Addr>() {
                let o = ip.octets();
                if o[0] == 10 {
                    used.insert(o[1]);
                }
            }
        }
    }
    used
}

/// An exclusive lock across the `cluster up`s of this host while one picks a subnet and
/// makes its bridge (which is what marks the subnet taken); released when dropped.
struct HostLock {
    _file: std::fs::File,
}

impl HostLock {
    fn take() -> Result<HostLock, String> {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::io::AsRawFd;
        let path = "/run/spillway-netns.lock";
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| format!("{path}: {e}"))?;
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(format!("{path}: {}", std::io::Error::last_os_error()));
        }
        Ok(HostLock { _file: f })
    }
}

/// Pick a `10.N.0.0/24` no address of this host is in and make its bridge, under the
/// host lock: clusters started at once never share a subnet, so a client never reaches
/// another cluster's server (which would refuse its keys). `prefer` (a resumed
/// cluster's subnet) is taken if free or already this cluster's bridge.
pub fn claim_subnet(prefer: Option<u8>, seed: u64) -> Result<u8, String> {
    let _lock = HostLock::take()?;
    if let Some(n) = prefer {
        let p = net_plan(n);
        if Path::new("/sys/class/net").join(&p.bridge).exists() {
            return Ok(n);
        }
        if subnets_in_use()?.contains(&n) {
            return Err(format!(
                "this cluster's subnet 10.{n}.0.0/24 is now used by another interface of this host; \
                 `spillway cluster down` it and start it afresh"
            ));
        }
        setup_bridge(n)?;
        return Ok(n);
    }
    let used = subnets_in_use()?;
    let span = u64::from(SUBNETS.end() - SUBNETS.start()) + 1;
    let first = (seed % span) as u8;
    for i in 0..span as u8 {
        let n = SUBNETS.start() + (first.wrapping_add(i)) % span as u8;
        let p = net_plan(n);
        if used.contains(&n) || Path::new("/sys/class/net").join(&p.bridge).exists() {
            continue;
        }
        setup_bridge(n)?;
        return Ok(n);
    }
    Err(format!(
        "no free subnet for --netns: every 10.N.0.0/24 with N in {}..={} is in use on this host",
        SUBNETS.start(),
        SUBNETS.end()
    ))
}

/// Make the bridge of `subnet` with its address.
fn setup_bridge(subnet: u8) -> Result<(), String> {
    let p = net_plan(subnet);
    run(Command::new("ip").args(["link", "add", "name", &p.bridge, "type", "bridge"]))?;
    let cidr = format!("{}/24", p.bridge_addr);
    let made = run(Command::new("ip").args(["addr", "add", &cidr, "dev", &p.bridge]))
        .and_then(|()| run(Command::new("ip").args(["link", "set", &p.bridge, "up"])));
    if made.is_err() {
        teardown_bridge(subnet);
    }
    made
}

/// Remove the bridge.
fn teardown_bridge(subnet: u8) {
    let p = net_plan(subnet);
    let _ = Command::new("ip").args(["link", "del", &p.bridge]).output();
}

/// Make server `k`'s namespace and its veth pair, on the bridge of `subnet` (claimed
/// first, `claim_subnet`); its name and the address the server listens on.
pub fn setup_netns(subnet: u8, k: u16) -> Result<(String, String), String> {
    if k > 250 {
        return Err("--netns supports at most 251 servers".into());
    }
    let bridge = net_plan(subnet).bridge;
    let (ns, vh, vn, addr) = netns_plan(subnet, k);
    // A namespace of this name is a leftover of a cluster that is gone (the subnet was
    // free, so no live cluster holds it).
    let _ = Command::new("ip").args(["netns", "del", &ns]).output();
    run(Command::new("ip").args(["netns", "add", &ns]))?;
    run(Command::new("ip").args(["link", "add", &vh, "type", "veth", "peer", "name", &vn]))?;
    run(Command::new("ip").args(["link", "set", &vn, "netns", &ns]))?;
    run(Command::new("ip").args(["link", "set", &vh, "master", &bridge]))?;
    run(Command::new("ip").args(["link", "set", &vh, "up"]))?;
    run(Command::new("ip").args([
        "netns",
        "exec",
        &ns,
        "ip",
        "addr",
        "add",
        &format!("{addr}/24"),
        "dev",
        &vn,
    ]))?;
    run(Command::new("ip").args(["netns", "exec", &ns, "ip", "link", "set", &vn, "up"]))?;
    run(Command::new("ip").args(["netns", "exec", &ns, "ip", "link", "set", "lo", "up"]))?;
    Ok((ns, format!("{addr}:7000")))
}

/// Delete a server's namespace (the kernel destroys it, and its veth pair, after this
/// returns: `teardown` waits for that).
pub fn delete_netns(ns: &str) {
    let _ = Command::new("ip").args(["netns", "del", ns]).output();
}

/// Undo a first `up` that failed making server `upto`'s namespace: the namespaces and
/// veth pairs of servers `0..=upto`, and the bridge.
pub fn abandon(subnet: u8, upto: u16) {
    for k in 0..=upto {
        let (ns, vh, _, _) = netns_plan(subnet, k);
        delete_netns(&ns);
        let _ = Command::new("ip").args(["link", "del", &vh]).output();
    }
    teardown_bridge(subnet);
}

/// Once every server's namespace is deleted: wait for the host ends of the veth pairs
/// to go, remove any that stay, then the bridge.
pub fn teardown(st: &ClusterState) {
    for s in &st.servers {
        let (_, vh, _, _) = netns_plan(st.subnet(), s.index);
        let link = Path::new("/sys/class/net").join(&vh);
        let deadline = Instant::now() + Duration::from_secs(5);
        while link.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if link.exists() {
            let _ = Command::new("ip").args(["link", "del", &vh]).output();
        }
    }
    teardown_bridge(st.subnet());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_in_use_reads_ip_addr_output() {
        let text = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n\
                    7: spwbr201    inet 10.201.0.1/24 scope global spwbr201\\ valid_lft forever\n\
                    9: eth0    inet 10.3.4.5/16 brd 10.3.255.255 scope global eth0\n\
                    10: x    inet 192.168.1.2/24 scope global x\n\
                    11: y    inet garbage/24\n\
                    12: z    inet";
        let used = parse_subnets_in_use(text);
        let mut v: Vec<u8> = used.into_iter().collect();
        v.sort();
        assert_eq!(v, vec![3, 201]);
    }

    #[test]
    fn names_fit_interface_name_limits() {
        let (ns, vh, vn, addr) = netns_plan(254, 250);
        assert!(vh.len() <= 15 && vn.len() <= 15, "{vh} {vn}");
        assert!(net_plan(254).bridge.len() <= 15);
        assert_eq!(ns, "spw-254-s250");
        assert_eq!(addr, "10.254.0.252");
    }
}
