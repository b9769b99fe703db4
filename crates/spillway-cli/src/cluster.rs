//! `spillway cluster`: a whole instance on this machine (N servers, one mount) started
//! with one command and torn down with another, leaving nothing behind. With `--netns`
//! every server runs in a network namespace of its own, reached over a veth pair, so
//! the client talks to its servers across a real network path.
//!
//! A developer cluster plays the manager's part for its instance: it generates the
//! instance secret (kept in `DIR/instance.secret`, mode 0600, for the servers only) and
//! mints the client's capability into `DIR/instance.json` (mode 0600).

pub use crate::mountpoint::{alive, is_mounted, stop_pid, unmount};
use serde::{Deserialize, Serialize};
use spillway_api::size::human;
use spillway_types::capability::{self, Capability};
use spillway_types::descriptor::{decode_hex, encode_hex};
use spillway_types::InstanceDescriptor;
use spillway_wire::messages::*;
use spillway_wire::Endpoint;
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ServerState {
    pub index: u16,
    pub root: PathBuf,
    pub listen: String,
    pub pid: Option<i32>,
    pub netns: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct MountState {
    pub path: PathBuf,
    pub pidfile: PathBuf,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ClusterState {
    pub instance: u64,
    pub capacity: u64,
    pub stripe_size: u32,
    pub servers: Vec<ServerState>,
    pub mounts: Vec<MountState>,
}

pub struct UpArgs {
    pub dir: PathBuf,
    pub servers: u16,
    pub capacity: u64,
    pub stripe_size: u32,
    pub netns: bool,
    pub mountpoint: Option<PathBuf>,
    pub root_mode: u32,
}

fn state_path(dir: &Path) -> PathBuf {
    dir.join("cluster.json")
}

pub fn load(dir: &Path) -> Result<ClusterState, String> {
    let p = state_path(dir);
    let text = std::fs::read_to_string(&p)
        .map_err(|e| format!("no cluster at {} ({}: {e})", dir.display(), p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is damaged: {e}", p.display()))
}

fn save(dir: &Path, st: &ClusterState) -> Result<(), String> {
    let text = serde_json::to_string_pretty(st).map_err(|e| e.to_string())?;
    let tmp = dir.join("cluster.json.tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, state_path(dir)).map_err(|e| format!("{}: {e}", dir.display()))
}

fn random_bytes(n: usize) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; n];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    Ok(buf)
}

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

pub fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// The network of a `--netns` cluster: a bridge in this (the client's) namespace and,
/// per server, a namespace joined to the bridge by a veth pair. Client and servers
/// share one subnet, so servers reach each other too (purges, truncates) without
/// forwarding.
struct NetPlan {
    bridge: String,
    /// The bridge's address: the client's source address towards every server.
    bridge_addr: Ipv4Addr,
}

fn net_plan(instance: u64) -> NetPlan {
    let tag = format!("{:04x}", instance & 0xffff);
    let net = 200 + (instance % 50) as u8;
    NetPlan {
        bridge: format!("spwbr{tag}"),
        bridge_addr: Ipv4Addr::new(10, net, 0, 1),
    }
}

/// Namespace, host-side veth, namespace-side veth, and address of server `k`.
fn netns_plan(instance: u64, k: u16) -> (String, String, String, String) {
    let tag = format!("{:04x}", instance & 0xffff);
    let net = 200 + (instance % 50);
    (
        format!("spw-{tag}-s{k}"),
        format!("spw{tag}h{k}"),
        format!("spw{tag}n{k}"),
        format!("10.{net}.0.{}", u32::from(k) + 2),
    )
}

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

fn teardown_bridge(instance: u64) {
    let p = net_plan(instance);
    let _ = Command::new("ip").args(["link", "del", &p.bridge]).output();
}

fn setup_netns(instance: u64, k: u16) -> Result<(String, String), String> {
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

fn spawn_server(dir: &Path, s: &ServerState) -> Result<i32, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&s.root).map_err(|e| format!("{}: {e}", s.root.display()))?;
    let log_path = dir.join("logs").join(format!("server-{}.log", s.index));
    use std::os::unix::fs::OpenOptionsExt;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        // Logs name users' files: root's alone.
        .mode(0o600)
        .open(&log_path)
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    let log2 = log.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = match &s.netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.arg("server")
        .arg("--root")
        .arg(&s.root)
        .arg("--listen")
        .arg(&s.listen);
    cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
    // SAFETY: setsid is async-signal-safe; it detaches the server from our terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start server {}: {e}", s.index))?;
    Ok(child.id() as i32)
}

fn wait_listening(s: &ServerState, pid: i32) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let addr: std::net::SocketAddr = s.listen.parse().map_err(|e| format!("{}: {e}", s.listen))?;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            && s.root.join("admin.key").exists()
        {
            return Ok(());
        }
        if !alive(pid) {
            return Err(format!("server {} exited at start; see its log", s.index));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "server {} did not start listening on {}",
                s.index, s.listen
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn admin(s: &ServerState) -> Result<Endpoint, String> {
    let key_path = s.root.join("admin.key");
    let key =
        std::fs::read_to_string(&key_path).map_err(|e| format!("{}: {e}", key_path.display()))?;
    let key = decode_hex(key.trim()).ok_or_else(|| format!("{} is not hex", key_path.display()))?;
    let hello = HelloReq::new(role::ADMIN, 0, key, "spillway-cluster");
    Ok(Endpoint::new(
        s.listen.clone(),
        hello,
        Duration::from_secs(30),
        Duration::from_secs(5),
    ))
}

/// How long `cluster up`'s capability lasts: a developer cluster's mount should never
/// see it expire, and its client connects only from this machine's own addresses.
const DEV_CAPABILITY_SECS: u64 = 10 * 366 * 24 * 3600;

fn secret_path(dir: &Path) -> PathBuf {
    dir.join("instance.secret")
}

/// Write `text` to `path` as a private file (mode 0600 from its creation on), replacing
/// any old one in one rename: a reader (the client renewing its credential) sees the
/// old file or the new one, never a torn or readable-by-all one.
fn write_private(path: &Path, text: &str) -> Result<(), String> {
    spillway_types::files::write_atomic(path, text.as_bytes(), 0o600)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The instance secret of a cluster being resumed. A cluster made before capabilities
/// existed has no `instance.secret`: its descriptor's credential is the secret then.
fn load_secret(dir: &Path, desc: &InstanceDescriptor) -> Result<Vec<u8>, String> {
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
fn dev_capability(secret: &[u8], st: &ClusterState) -> Result<Vec<u8>, String> {
    let from = if st.servers.iter().any(|s| s.netns.is_some()) {
        net_plan(st.instance).bridge_addr
    } else {
        Ipv4Addr::LOCALHOST
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| format!("the clock is before 1970: {e}"))?
        .as_secs();
    let cap = Capability {
        instance: st.instance,
        node: crate::hostname(),
        addrs: vec![IpAddr::V4(from)],
        expires: now.saturating_add(DEV_CAPABILITY_SECS),
    };
    capability::try_mint(secret, &cap)
        .ok_or_else(|| format!("host name {:?} is longer than 255 bytes", cap.node))
}

pub fn up(a: UpArgs) -> Result<PathBuf, String> {
    let dir = &a.dir;
    std::fs::create_dir_all(dir.join("logs")).map_err(|e| format!("{}: {e}", dir.display()))?;
    // The servers' roots (the instance secret, metadata, data) and the logs are root's
    // alone; each server makes its own root 0700 too.
    for sub in ["logs", "servers"] {
        spillway_types::files::private_dir(&dir.join(sub))
            .map_err(|e| format!("{}: {e}", dir.join(sub).display()))?;
    }
    let dir = dir.canonicalize().map_err(|e| e.to_string())?;
    let resumed = load(&dir).ok();
    let desc_path = dir.join("instance.json");
    let (mut st, mut desc, secret) = match resumed {
        Some(st) if desc_path.exists() => {
            let d = InstanceDescriptor::load(&desc_path).map_err(|e| e.to_string())?;
            let secret = load_secret(&dir, &d)?;
            (st, d, secret)
        }
        _ => {
            if a.servers == 0 {
                return Err("a cluster needs at least one server".into());
            }
            if a.capacity < u64::from(a.servers) * (1 << 20) {
                return Err("capacity must be at least 1 MiB per server".into());
            }
            let id_bytes = random_bytes(8)?;
            let instance = u64::from_le_bytes(id_bytes.try_into().unwrap_or([7; 8])) >> 1;
            let mut servers = Vec::new();
            for k in 0..a.servers {
                let root = dir.join("servers").join(format!("s{k}"));
                let (netns, listen) = if a.netns {
                    let (ns, addr) = setup_netns(instance, k)?;
                    (Some(ns), addr)
                } else {
                    (None, format!("127.0.0.1:{}", free_port()?))
                };
                servers.push(ServerState {
                    index: k,
                    root,
                    listen,
                    pid: None,
                    netns,
                });
            }
            let st = ClusterState {
                instance,
                capacity: a.capacity,
                stripe_size: a.stripe_size,
                servers,
                mounts: Vec::new(),
            };
            let secret = random_bytes(32)?;
            write_private(&secret_path(&dir), &encode_hex(&secret))?;
            let desc = InstanceDescriptor {
                instance,
                servers: st.servers.iter().map(|s| s.listen.clone()).collect(),
                capacity: a.capacity,
                stripe_size: a.stripe_size,
                // Minted below, once the servers' addresses are settled.
                credential: String::new(),
            };
            (st, desc, secret)
        }
    };
    // A fresh capability on every `up`: a resumed cluster's client gets a full term.
    desc.credential = encode_hex(&dev_capability(&secret, &st)?);
    desc.validate().map_err(|e| e.to_string())?;
    save(&dir, &st)?;
    // Servers.
    for i in 0..st.servers.len() {
        let s = st.servers[i].clone();
        if s.pid.is_some_and(alive) {
            continue;
        }
        if let Some(ns) = &s.netns {
            if !Path::new("/run/netns").join(ns).exists() {
                setup_netns(st.instance, s.index)?;
            }
        }
        let pid = spawn_server(&dir, &s)?;
        st.servers[i].pid = Some(pid);
        save(&dir, &st)?;
        wait_listening(&s, pid)?;
    }
    // Fragments (idempotent: a resumed cluster finds them in place).
    // Fragments split the capacity exactly (the first ones take the remainder's bytes),
    // so the instance size statfs reports is the size asked for.
    let n = st.servers.len() as u64;
    for s in &st.servers {
        let per = st.capacity / n + u64::from(u64::from(s.index) < st.capacity % n);
        let ep = admin(s)?;
        ep.call(&FragmentCreateReq {
            instance: st.instance,
            index: s.index,
            peers: desc.servers.clone(),
            capacity: per,
            credential: secret.clone(),
            stripe_size: desc.stripe_size,
            root_uid: 0,
            root_gid: 0,
            root_mode: a.root_mode,
        })
        .map_err(|e| format!("creating the fragment on server {} failed: {e}", s.index))?;
    }
    write_private(&desc_path, &desc.to_json())?;
    // The mount.
    let mnt = a.mountpoint.clone().unwrap_or_else(|| dir.join("mnt"));
    mount_at(&dir, &mut st, &desc_path, &mnt)?;
    Ok(mnt)
}

fn mount_at(dir: &Path, st: &mut ClusterState, desc: &Path, mnt: &Path) -> Result<(), String> {
    if is_mounted(mnt) {
        return Ok(());
    }
    std::fs::create_dir_all(mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let tag = mnt.to_string_lossy().replace('/', "_");
    let log = dir.join("logs").join(format!("client{tag}.log"));
    let pidfile = dir.join(format!("client{tag}.pid"));
    let out = Command::new(exe)
        .arg("mount")
        .arg("--instance")
        .arg(desc)
        .arg("--log")
        .arg(&log)
        .arg("--pidfile")
        .arg(&pidfile)
        .arg(mnt)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "mount failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    st.mounts.retain(|m| m.path != mnt);
    st.mounts.push(MountState {
        path: mnt.to_path_buf(),
        pidfile,
    });
    save(dir, st)
}

pub fn down(dir: &Path, keep_data: bool, force: bool) -> Result<(), String> {
    let Ok(dir) = dir.canonicalize() else {
        return Ok(());
    };
    let st = match load(&dir) {
        Ok(s) => s,
        Err(_) if !dir.join("cluster.json").exists() => return Ok(()),
        Err(e) => return Err(e),
    };
    // Every mount of this instance: ours, and others made with `spillway mount`.
    let fsname = format!("spillway:{}", st.instance);
    let mut mounts: Vec<(PathBuf, Option<PathBuf>)> = st
        .mounts
        .iter()
        .map(|m| (m.path.clone(), Some(m.pidfile.clone())))
        .collect();
    if let Ok(text) = std::fs::read_to_string("/proc/self/mounts") {
        for l in text.lines() {
            let mut f = l.split(' ');
            if f.next() == Some(&fsname) {
                if let Some(p) = f.next() {
                    let p = PathBuf::from(p.replace("\\040", " "));
                    if !mounts.iter().any(|(m, _)| *m == p) {
                        mounts.push((p, None));
                    }
                }
            }
        }
    }
    // A busy mount: refused before anything stops, or (--force) flushed and cut off.
    let held = held_mounts(&mounts);
    if !held.is_empty() && !force {
        return Err(busy_message(&held));
    }
    let mut errors = Vec::new();
    for (m, holders) in &held {
        let pf = mounts
            .iter()
            .find(|(p, _)| p == m)
            .and_then(|(_, pf)| pf.clone());
        errors.extend(force_off(m, holders, pf.as_deref()));
    }
    for (m, pf) in &mounts {
        if let Err(e) = unmount(m, pf.as_deref()) {
            errors.push(e);
        }
    }
    for s in &st.servers {
        if let Some(pid) = s.pid {
            if alive(pid) {
                stop_pid(pid, libc::SIGTERM);
            }
        }
        if let Some(ns) = &s.netns {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
    if st.servers.iter().any(|s| s.netns.is_some()) {
        // Deleting a namespace returns before the kernel has destroyed it and its veth
        // pair: wait for the host ends to go, and remove any that stay.
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
    if keep_data {
        let mut st = st;
        for s in &mut st.servers {
            s.pid = None;
        }
        st.mounts.clear();
        save(&dir, &st)?;
    } else if let Err(e) = std::fs::remove_dir_all(&dir) {
        errors.push(format!("removing {}: {e}", dir.display()));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

type Held = Vec<(PathBuf, Vec<crate::busy::Holder>)>;

/// The mounts some process holds (files open or mapped, a working directory in them).
fn held_mounts(mounts: &[(PathBuf, Option<PathBuf>)]) -> Held {
    let mut held = Vec::new();
    for (m, _) in mounts {
        if let Ok(Some(crate::mountpoint::Mounted::Spillway(e))) = crate::mountpoint::mount_state(m)
        {
            let h = crate::busy::holders(m, e.id);
            if !h.is_empty() {
                held.push((m.clone(), h));
            }
        }
    }
    held
}

fn busy_message(held: &Held) -> String {
    let mut s = String::new();
    for (m, hs) in held {
        s.push_str(&format!("{} is busy:\n", m.display()));
        for h in hs {
            s.push_str(&format!("  {}\n", crate::busy::describe(h)));
        }
    }
    s.push_str(
        "nothing was stopped: end these processes (what they wrote may still be in the client), \
         or use --force (flushes what they wrote, then detaches the mount; they get errors after)",
    );
    s
}

/// `--force` on a held mount: flush the holders' files, detach the mount, kill its
/// client (the holders' later calls fail with ENOTCONN). Returns what went wrong.
fn force_off(m: &Path, holders: &[crate::busy::Holder], pidfile: Option<&Path>) -> Vec<String> {
    let mut errors: Vec<String> = crate::busy::flush(holders)
        .into_iter()
        .map(|f| format!("DATA NOT FLUSHED: {f}"))
        .collect();
    for h in holders {
        eprintln!(
            "spillway: --force: {} held by {}",
            m.display(),
            crate::busy::describe(h)
        );
    }
    let c = match std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) {
        Ok(c) => c,
        Err(_) => return vec![format!("{}: bad path", m.display())],
    };
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) } != 0 {
        errors.push(format!(
            "cannot detach {}: {}",
            m.display(),
            std::io::Error::last_os_error()
        ));
    }
    // The detached mount lives on for its holders until the client goes.
    let pid = pidfile
        .and_then(|pf| std::fs::read_to_string(pf).ok())
        .and_then(|t| t.trim().parse::<i32>().ok())
        .filter(|p| *p > 0);
    if let (Some(pid), Some(pf)) = (pid, pidfile) {
        if crate::mountpoint::is_client_of(pid, pf) {
            stop_pid(pid, libc::SIGKILL);
        }
    }
    if errors.is_empty() {
        eprintln!(
            "spillway: --force: {}: the holders' files were flushed; the mount is detached",
            m.display()
        );
    }
    errors
}

pub fn kill_server(dir: &Path, index: u16, signal: i32) -> Result<(), String> {
    let mut st = load(dir)?;
    let s = st
        .servers
        .iter_mut()
        .find(|s| s.index == index)
        .ok_or(format!("no server {index}"))?;
    if let Some(pid) = s.pid.take() {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(pid, signal) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if alive(pid) {
            stop_pid(pid, libc::SIGKILL);
        }
    }
    save(dir, &st)
}

pub fn start_server(dir: &Path, index: u16) -> Result<(), String> {
    let mut st = load(dir)?;
    let i = st
        .servers
        .iter()
        .position(|s| s.index == index)
        .ok_or(format!("no server {index}"))?;
    let s = st.servers[i].clone();
    if s.pid.is_some_and(alive) {
        return Ok(());
    }
    let pid = spawn_server(dir, &s)?;
    st.servers[i].pid = Some(pid);
    save(dir, &st)?;
    wait_listening(&s, pid)
}

pub fn status(dir: &Path, json: bool) -> Result<(), String> {
    let st = load(dir)?;
    let mut rows = Vec::new();
    for s in &st.servers {
        let running = s.pid.is_some_and(alive);
        let frag = if running {
            admin(s)
                .ok()
                .and_then(|ep| ep.call(&FragmentListReq {}).ok())
                .and_then(|r| r.fragments.into_iter().find(|f| f.instance == st.instance))
        } else {
            None
        };
        rows.push(serde_json::json!({
            "index": s.index,
            "listen": s.listen,
            "pid": s.pid,
            "running": running,
            "netns": s.netns,
            "capacity": frag.as_ref().map(|f| f.capacity),
            "used": frag.as_ref().map(|f| f.used),
            "inodes": frag.as_ref().map(|f| f.inodes),
        }));
    }
    if json {
        let doc =
            serde_json::json!({"instance": st.instance, "servers": rows, "mounts": st.mounts});
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!(
        "instance {}  capacity {}  stripe {}",
        st.instance,
        human(st.capacity),
        human(u64::from(st.stripe_size))
    );
    println!(
        "{:<6} {:<22} {:<8} {:>10} {:>10} {:>8}",
        "server", "address", "state", "capacity", "used", "inodes"
    );
    for r in rows {
        let n = |k: &str| r[k].as_u64().map(human).unwrap_or_else(|| "-".into());
        println!(
            "{:<6} {:<22} {:<8} {:>10} {:>10} {:>8}",
            r["index"],
            r["listen"].as_str().unwrap_or(""),
            if r["running"].as_bool() == Some(true) {
                "up"
            } else {
                "down"
            },
            n("capacity"),
            n("used"),
            r["inodes"]
                .as_u64()
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into())
        );
    }
    for m in &st.mounts {
        println!("mount  {}", m.path.display());
    }
    Ok(())
}
