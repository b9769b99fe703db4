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
/// share one subnet, so servers reach each other too (purges, truncates) without
/// forwarding.
pub struct NetPlan {
    pub bridge: String,
    /// The bridge's address: the client's source address towards every server.
    pub bridge_addr: Ipv4Addr,
}

pub fn net_plan(instance: u64) -> NetPlan {
    let tag = format!("{:04x}", instance & 0xffff);
    let net = 200 + (instance % 50) as u8;
    NetPlan {
        bridge: format!("spwbr{tag}"),
        bridge_addr: Ipv4Addr::new(10, net, 0, 1),
    }
}

/// Namespace, host-side veth, namespace-side veth, and address of server `k`.
pub fn netns_plan(instance: u64, k: u16) -> (String, String, String, String) {
    let tag = format!("{:04x}", instance & 0xffff);
    let net = 200 + (instance % 50);
    (
        format!("spw-{tag}-s{k}"),
        format!("spw{tag}h{k}"),
        format!("spw{tag}n{k}"),
        format!("10.{net}.0.{}", u32::from(k) + 2),
    )
}

/// The bridge, unless it exists.
fn setup_bridge(instance: u64) -> Result<(), String> {
    let p = net_plan(instance);
    if Path::new("/sys/class/net").join(&p.bridge).exists() {
        return Ok(());
    }
    run(Command::new("ip").args(["link", "add", "name", &p.bridge, "type", "bridge"]))?;
    let cidr = format!("{}/24", p.bridge_addr);
    run(Command::new("ip").args(["addr", "add", &cidr, "dev", &p.bridge]))?;
    run(Command::new("ip").args(["link", "set", &p.bridge, "up"]))
}

/// Remove the bridge.
fn teardown_bridge(instance: u64) {
    let p = net_plan(instance);
    let _ = Command::new("ip").args(["link", "del", &p.bridge]).output();
}

/// Make server `k`'s namespace, its veth pair and the bridge (if missing); its name and
/// the address the server listens on.
pub fn setup_netns(instance: u64, k: u16) -> Result<(String, String), String> {
    if k > 250 {
        return Err("--netns supports at most 251 servers".into());
    }
    setup_bridge(instance)?;
    let bridge = net_plan(instance).bridge;
    let (ns, vh, vn, addr) = netns_plan(instance, k);
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

/// Once every server's namespace is deleted: wait for the host ends of the veth pairs
/// to go, remove any that stay, then the bridge.
pub fn teardown(st: &ClusterState) {
    for s in &st.servers {
        let (_, vh, _, _) = netns_plan(st.instance, s.index);
        let link = Path::new("/sys/class/net").join(&vh);
        let deadline = Instant::now() + Duration::from_secs(5);
        while link.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if link.exists() {
            let _ = Command::new("ip").args(["link", "del", &vh]).output();
        }
    }
    teardown_bridge(st.instance);
}
