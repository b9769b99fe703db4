//! `spillway cluster`: a whole instance on this machine (N servers, one mount) started
//! with one command and torn down with another, leaving nothing behind. With `--netns`
//! every server runs in a network namespace of its own, reached over a veth pair, so
//! the client talks to its servers across a real network path.
//!
//! A developer cluster plays the manager's part for its instance: it generates the
//! instance secret (kept in `DIR/instance.secret`, mode 0600, for the servers only) and
//! mints the client's capability into `DIR/instance.json` (mode 0600).
//!
//! * `state`  — `DIR/cluster.json`.
//! * `netns`  — the bridge and namespaces of `--netns`.
//! * `secret` — the instance secret and the client's capability.
//! * `busy`   — busy mounts at `down` (who holds them; `--force`).
//! * `status` — `spillway cluster status`.

mod busy;
mod netns;
mod secret;
mod state;
mod status;

use crate::args::{size_arg, ClusterCmd, ClusterUpArgs};
use crate::sys::host::free_port;
use crate::sys::mounts::{is_mounted, unmount};
use crate::sys::proc::{alive, spawn_detached, stop_pid, stop_pid_within};
use busy::{busy_message, force_off, held_mounts};
use netns::{claim_subnet, delete_netns, setup_netns};
use secret::{dev_capability, load_secret, random_bytes, secret_path, write_private};
use spillway_types::descriptor::{decode_hex, encode_hex};
use spillway_types::InstanceDescriptor;
use spillway_wire::messages::*;
use spillway_wire::Endpoint;
use state::{load, save, CachePolicy, ClusterState, MountState, ServerState};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// `spillway cluster ...`.
pub fn command(cmd: ClusterCmd) -> Result<(), String> {
    match cmd {
        ClusterCmd::Up(a) => {
            // Parsed before anything starts: a bad option tears nothing down.
            let p = UpSizes {
                capacity: size_arg("--capacity", &a.capacity)?,
                stripe_size: u32::try_from(size_arg("--stripe-size", &a.stripe_size)?)
                    .map_err(|_| "stripe size too large".to_string())?,
                root_mode: u32::from_str_radix(&a.root_mode, 8)
                    .map_err(|_| format!("bad mode {}", a.root_mode))?
                    & 0o7777,
                policy: policy_args(&a)?,
            };
            // Before `up`, whose failure takes the cluster down: a running cluster
            // is left alone.
            if let Ok(st) = load(&a.dir) {
                if p.policy.given() && p.policy.over(st.cache_policy) != st.cache_policy {
                    return Err(format!(
                        "the cluster at {} keeps the cache policies of its first up ({:?}); \
                         take it down to change them",
                        a.dir.display(),
                        st.cache_policy
                    ));
                }
            }
            match up(&a, &p) {
                Ok(mnt) => {
                    println!("{}", mnt.display());
                    Ok(())
                }
                Err(e) => {
                    // Leave nothing half-started behind.
                    let _ = down(&a.dir, true, true);
                    Err(e)
                }
            }
        }
        ClusterCmd::Down {
            dir,
            keep_data,
            force,
        } => down(&dir, keep_data, force),
        ClusterCmd::Status { dir, json } => status::status(&dir, json),
        ClusterCmd::KillServer { dir, index, signal } => {
            let sig = match signal.to_ascii_uppercase().trim_start_matches("SIG") {
                "KILL" => libc::SIGKILL,
                "TERM" => libc::SIGTERM,
                other => return Err(format!("unsupported signal {other} (KILL or TERM)")),
            };
            kill_server(&dir, index, sig)
        }
        ClusterCmd::StartServer { dir, index } => start_server(&dir, index),
    }
}

/// `cluster up`'s sizes, mode and cache policies, parsed.
struct UpSizes {
    capacity: u64,
    stripe_size: u32,
    root_mode: u32,
    policy: PolicyArgs,
}

/// The cache policies given to `up` (None: not given).
#[derive(Default)]
struct PolicyArgs {
    modified_threshold: Option<u64>,
    read_ahead: Option<u64>,
    sync_on_close: Option<bool>,
    sync_to_pfs: Option<bool>,
}

impl PolicyArgs {
    fn given(&self) -> bool {
        self.modified_threshold.is_some()
            || self.read_ahead.is_some()
            || self.sync_on_close.is_some()
            || self.sync_to_pfs.is_some()
    }

    /// `base` with the policies given here.
    fn over(&self, base: CachePolicy) -> CachePolicy {
        CachePolicy {
            modified_threshold: self.modified_threshold.unwrap_or(base.modified_threshold),
            read_ahead: self.read_ahead.unwrap_or(base.read_ahead),
            sync_on_close: self.sync_on_close.unwrap_or(base.sync_on_close),
            sync_to_pfs: self.sync_to_pfs.unwrap_or(base.sync_to_pfs),
        }
    }
}

/// The cache policy options of `up`, checked as the directive checks its keys.
fn policy_args(a: &ClusterUpArgs) -> Result<PolicyArgs, String> {
    let yes_no = |opt: &str, v: &Option<String>| -> Result<Option<bool>, String> {
        v.as_deref()
            .map(|v| match v.to_ascii_lowercase().as_str() {
                "yes" | "true" | "1" => Ok(true),
                "no" | "false" | "0" => Ok(false),
                _ => Err(format!("{opt}: {v:?} is not yes or no")),
            })
            .transpose()
    };
    let p = PolicyArgs {
        modified_threshold: a
            .modified_threshold
            .as_deref()
            .map(|v| size_arg("--modified-threshold", v))
            .transpose()?,
        read_ahead: a
            .read_ahead
            .as_deref()
            .map(|v| size_arg("--read-ahead", v))
            .transpose()?,
        sync_on_close: yes_no("--sync-on-close", &a.sync_on_close)?,
        sync_to_pfs: yes_no("--sync-to-pfs", &a.sync_to_pfs)?,
    };
    if p.read_ahead.is_some_and(|r| r > 1 << 30) {
        return Err("--read-ahead: more than 1GiB".into());
    }
    if p.given() && a.cache_pfs.is_none() {
        return Err(
            "--sync-on-close, --sync-to-pfs, --modified-threshold and --read-ahead are cache \
             policies, for a cache instance (--cache-pfs DIR)"
                .into(),
        );
    }
    Ok(p)
}

/// Start server `s` (in its namespace, if it has one) with its log in `DIR/logs`.
fn spawn_server(dir: &Path, s: &ServerState, tunables: Option<&Path>) -> Result<i32, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&s.root).map_err(|e| format!("{}: {e}", s.root.display()))?;
    let log_path = dir.join("logs").join(format!("server-{}.log", s.index));
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
    if let Some(t) = tunables {
        cmd.arg("--tunables").arg(t);
    }
    spawn_detached(cmd, &log_path, &format!("server {}", s.index))
}

/// Wait until server `s` (pid `pid`) listens and has written its admin key.
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

/// An admin connection to server `s` (its admin key from its root).
fn admin(s: &ServerState) -> Result<Endpoint, String> {
    let key_path = s.root.join("admin.key");
    let key =
        std::fs::read_to_string(&key_path).map_err(|e| format!("{}: {e}", key_path.display()))?;
    let key = decode_hex(key.trim()).ok_or_else(|| format!("{} is not hex", key_path.display()))?;
    let hello = HelloReq::new(Role::Admin, 0, key, "spillway-cluster");
    Ok(Endpoint::new(
        s.listen.clone(),
        hello,
        Duration::from_secs(30),
        Duration::from_secs(5),
    ))
}

/// Start the cluster at `a.dir` (or resume it: what runs is kept, what is stopped is
/// started again), and mount it; the mount point.
fn up(a: &ClusterUpArgs, p: &UpSizes) -> Result<PathBuf, String> {
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
            if p.capacity < u64::from(a.servers) * (1 << 20) {
                return Err("capacity must be at least 1 MiB per server".into());
            }
            let id_bytes = random_bytes(8)?;
            let instance = u64::from_le_bytes(id_bytes.try_into().unwrap_or([7; 8])) >> 1;
            let netns_subnet = if a.netns {
                Some(claim_subnet(None, instance)?)
            } else {
                None
            };
            let mut servers = Vec::new();
            for k in 0..a.servers {
                let root = dir.join("servers").join(format!("s{k}"));
                let (netns, listen) = if let Some(subnet) = netns_subnet {
                    let (ns, addr) = setup_netns(subnet, k).inspect_err(|_| {
                        // Nothing is recorded yet: undo what this `up` made.
                        netns::abandon(subnet, k);
                    })?;
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
                capacity: p.capacity,
                stripe_size: p.stripe_size,
                servers,
                mounts: Vec::new(),
                netns_subnet,
                tunables: None,
                cache_pfs: match &a.cache_pfs {
                    Some(d) => Some(
                        d.canonicalize()
                            .map_err(|e| format!("{}: {e}", d.display()))?,
                    ),
                    None => None,
                },
                cache_policy: p.policy.over(CachePolicy::default()),
            };
            let secret = random_bytes(32)?;
            write_private(&secret_path(&dir), &encode_hex(&secret))?;
            let desc = InstanceDescriptor {
                instance,
                servers: st.servers.iter().map(|s| s.listen.clone()).collect(),
                capacity: p.capacity,
                stripe_size: p.stripe_size,
                // Minted below, once the servers' addresses are settled.
                credential: String::new(),
                cache: st.cache_pfs.is_some(),
                ldbal: false,
                replica: None,
            };
            (st, desc, secret)
        }
    };
    if let Some(t) = &a.tunables {
        // Checked here, so a typo fails `up` rather than every server and the mount.
        let mut check = spillway_types::Tunables::default();
        check.apply_file(t)?;
        st.tunables = Some(
            t.canonicalize()
                .map_err(|e| format!("{}: {e}", t.display()))?,
        );
    }
    if let Some(pfs) = &st.cache_pfs {
        // The servers may open the cached directory only beneath their pfs_roots.
        let own = cache_tunables_path(&dir);
        if st.tunables.as_deref() != Some(own.as_path()) {
            write_cache_tunables(&own, st.tunables.as_deref(), pfs)?;
            st.tunables = Some(own);
        }
    }
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
                let subnet = claim_subnet(Some(st.subnet()), st.instance)?;
                setup_netns(subnet, s.index)?;
            }
        }
        let pid = spawn_server(&dir, &s, st.tunables.as_deref())?;
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
            root_mode: p.root_mode,
        })
        .map_err(|e| format!("creating the fragment on server {} failed: {e}", s.index))?;
    }
    if let Some(pfs) = &st.cache_pfs {
        configure_cache(&st, &desc, &secret, pfs)?;
    }
    write_private(&desc_path, &desc.to_json())?;
    // The mount.
    let mnt = a.mountpoint.clone().unwrap_or_else(|| dir.join("mnt"));
    mount_at(&dir, &mut st, &desc_path, &mnt)?;
    Ok(mnt)
}

/// The tunables file of a cache cluster: the one given to `up` (if any) with the
/// cached directory added to its `pfs_roots`.
fn cache_tunables_path(dir: &Path) -> PathBuf {
    dir.join("tunables.cache")
}

/// Write `out`: the text of `given` (if any), then a `pfs_roots` line naming its roots
/// and `pfs` (unless one of them already holds it), which the servers read last.
fn write_cache_tunables(out: &Path, given: Option<&Path>, pfs: &Path) -> Result<(), String> {
    let mut text = match given {
        Some(t) => std::fs::read_to_string(t).map_err(|e| format!("{}: {e}", t.display()))?,
        None => String::new(),
    };
    let mut t = spillway_types::Tunables::default();
    t.apply_text(&text)?;
    let mut roots = t.pfs_roots;
    if !roots.iter().any(|r| pfs.starts_with(r)) {
        let p = pfs
            .to_str()
            .filter(|p| !p.contains([':', ',', '#', '\n']))
            .ok_or_else(|| {
                format!(
                    "--cache-pfs {}: a path with ':', ',', '#' or a newline cannot be named in \
                 pfs_roots; name a directory above it in a tunables file (--tunables)",
                    pfs.display()
                )
            })?;
        roots.push(p.to_string());
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str("# added by `spillway cluster up --cache-pfs`: the cached directory\n");
    text.push_str(&format!("pfs_roots = {}\n", roots.join(":")));
    // Checked as the servers will read it.
    spillway_types::Tunables::default().apply_text(&text)?;
    std::fs::write(out, text).map_err(|e| format!("{}: {e}", out.display()))
}

/// Make every fragment a cache of `pfs`, owned by the directory's owner, with the
/// cluster's policies (docs/cache.md), as the manager does for a cache configuration.
fn configure_cache(
    st: &ClusterState,
    desc: &InstanceDescriptor,
    secret: &[u8],
    pfs: &Path,
) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(pfs).map_err(|e| format!("{}: {e}", pfs.display()))?;
    let req = CacheConfigReq {
        pfs_dir: pfs.to_string_lossy().into_owned(),
        uid: m.uid(),
        gid: m.gid(),
        modified_threshold: st.cache_policy.modified_threshold,
        read_ahead: st.cache_policy.read_ahead,
        sync_on_close: st.cache_policy.sync_on_close,
        sync_to_pfs: st.cache_policy.sync_to_pfs,
    };
    for s in &st.servers {
        let hello = HelloReq::new(Role::Peer, st.instance, secret.to_vec(), "spillway-cluster");
        let ep = Endpoint::new(
            desc.servers[usize::from(s.index)].clone(),
            hello,
            Duration::from_secs(30),
            Duration::from_secs(5),
        );
        ep.call(&req).map_err(|e| {
            format!(
                "making server {} a cache of {} failed: {e} (the servers open it as its owner, \
                 beneath their pfs_roots)",
                s.index,
                pfs.display()
            )
        })?;
    }
    Ok(())
}

/// Mount the instance of `desc` at `mnt` (unless mounted) and record it.
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
        .args(
            st.tunables
                .iter()
                .flat_map(|t| [std::ffi::OsStr::new("--tunables"), t.as_os_str()]),
        )
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

/// Take the cluster at `dir` down: its mounts (a busy one only with `force`), servers
/// and namespaces, and (unless `keep_data`) the directory. Nothing there: nothing to do.
fn down(dir: &Path, keep_data: bool, force: bool) -> Result<(), String> {
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
    // A cache's servers may hold bytes written through the mount and not yet on the
    // PFS: each writes them there as its fragment is destroyed, or refuses while it
    // cannot. Nothing stops then (kept data resumes writing behind at a `down
    // --keep-data` and `up`, so that needs no flush).
    if st.cache_pfs.is_some() && !keep_data {
        write_back_cache(&st)?;
    }
    for s in &st.servers {
        if let Some(pid) = s.pid {
            if alive(pid) {
                stop_pid(pid, libc::SIGTERM);
            }
        }
        if let Some(ns) = &s.netns {
            delete_netns(ns);
        }
    }
    if st.servers.iter().any(|s| s.netns.is_some()) {
        netns::teardown(&st);
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

/// Destroy every running server's fragment of a cache cluster, which writes its dirty
/// bytes to the PFS first, server 0 (the namespace) last. A server that cannot (the PFS unwritable, full) answers an
/// error, and the servers are left running, still writing behind, with the reason.
fn write_back_cache(st: &ClusterState) -> Result<(), String> {
    let mut refused = Vec::new();
    // The namespace server (0) last: the others reach the PFS files through it.
    for s in st.servers.iter().rev() {
        if !s.pid.is_some_and(alive) {
            continue;
        }
        let r = admin(s).and_then(|ep| {
            ep.call(&FragmentDestroyReq {
                instance: st.instance,
            })
            .map_err(|e| e.to_string())
        });
        if let Err(e) = r {
            refused.push(format!("server {}: {e}", s.index));
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the cache still holds data written through it that could not be written to {} ({}); \
         the mounts are gone but the servers keep running and keep writing it behind: \
         make the PFS writable and run `spillway cluster down` again \
         (or `--keep-data` to stop them with the data kept)",
        st.cache_pfs
            .as_ref()
            .map_or_else(String::new, |p| p.display().to_string()),
        refused.join("; ")
    ))
}

/// Stop server `index` with `signal` (SIGKILL if it outlives 15 s).
fn kill_server(dir: &Path, index: u16, signal: i32) -> Result<(), String> {
    let mut st = load(dir)?;
    let i = st.position(index)?;
    if let Some(pid) = st.servers[i].pid.take() {
        stop_pid_within(pid, signal, Duration::from_secs(15));
    }
    save(dir, &st)
}

/// Start server `index` again on its root and address.
fn start_server(dir: &Path, index: u16) -> Result<(), String> {
    let mut st = load(dir)?;
    let i = st.position(index)?;
    let s = st.servers[i].clone();
    if s.pid.is_some_and(alive) {
        return Ok(());
    }
    let pid = spawn_server(dir, &s, st.tunables.as_deref())?;
    st.servers[i].pid = Some(pid);
    save(dir, &st)?;
    wait_listening(&s, pid)
}
