//! Every setting of the manager, in one `key = value` file, with defaults and reasons.

use spillway_api::config;
use spillway_api::size::parse_size;
use spillway_api::stage_path::{StagePath, StagePathError};
use spillway_api::Policy;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct ManagerConfig {
    /// HTTPS address, e.g. `0.0.0.0:8443`.
    pub listen: String,
    /// Directory of the SQLite database (`manager.db`).
    pub state_dir: PathBuf,
    /// PEM certificate chain and private key the manager serves.
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    /// Members of this group (and root) are admins.
    pub admin_group: Option<String>,
    /// Placement policy when a request names none.
    pub policy: Policy,
    /// Pool when a request names none (default: the only pool, if there is one).
    pub default_pool: Option<String>,
    /// Stripe size of new files when an instance request names none.
    pub stripe_size: u32,
    /// Default mount points go below this; users may mount only below it.
    pub mount_root: String,
    /// How long a data-path capability is valid; agents renew at half-life.
    pub capability_lifetime: Duration,
    /// Servers are probed this often; after `node_timeout` without answer they are
    /// offline (not allocated to, instances on them not intact).
    pub heartbeat_interval: Duration,
    pub node_timeout: Duration,
    /// munged's socket (None: libmunge's default).
    pub munge_socket: Option<PathBuf>,
    /// Longest an agent's work request waits for a change.
    pub agent_wait_max: Duration,
    /// PFS paths of stages must lie under one of these (absolute, no trailing `/`).
    /// Empty: staging is refused.
    pub pfs_roots: Vec<String>,
    /// Stages of one instance running at once: the default, and the range a request
    /// is clamped to.
    pub stage_concurrency_default: u32,
    pub stage_concurrency_min: u32,
    pub stage_concurrency_max: u32,
    /// Files each running stage copies at once.
    pub stage_files_in_flight: u32,
    /// The TLS handshake and a connection's first request head must be complete within
    /// this time of the accept (a request's body within this time of its head).
    pub header_timeout: Duration,
    /// A kept-alive connection with no request in flight is closed after this time.
    pub idle_timeout: Duration,
    /// Connections open at once, all clients (None: the descriptor limit minus a
    /// reserve for the manager's own use, see `serve::derived_max_connections`).
    pub max_connections: Option<usize>,
    /// Connections open at once from one peer (a remote address, or a uid on this host).
    pub max_connections_per_peer: usize,
    /// Sessions one non-admin user may own that are not yet deleted (live or being torn
    /// down); creating one more is refused (409). Admins are not limited.
    pub max_sessions_per_user: u32,
    /// Stages one non-admin user may own that have not ended (queued, running,
    /// deferred); posting one more is refused (409). Admins are not limited.
    pub max_stages_per_user: u32,
    /// Pairs those stages may name together (a list stage counts its pairs, a file or
    /// directory stage one): what bounds one user's queue in rows, tickets to mint and
    /// database bytes when the stages are large lists. Over it: 409. Admins are not
    /// limited.
    pub max_stage_pairs_per_user: u32,
}

pub const KEYS: &[&str] = &[
    "listen",
    "state_dir",
    "tls_cert",
    "tls_key",
    "admin_group",
    "policy",
    "default_pool",
    "stripe_size",
    "mount_root",
    "capability_lifetime",
    "heartbeat_interval",
    "node_timeout",
    "munge_socket",
    "agent_wait_max",
    "pfs_roots",
    "stage_concurrency_default",
    "stage_concurrency_min",
    "stage_concurrency_max",
    "stage_files_in_flight",
    "header_timeout",
    "idle_timeout",
    "max_connections",
    "max_connections_per_peer",
    "max_sessions_per_user",
    "max_stages_per_user",
    "max_stage_pairs_per_user",
];

/// `pfs_roots`: colon- or comma-separated absolute paths, normalised (no empty, `.` or
/// `..` components, no trailing `/`).
pub fn parse_pfs_roots(v: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for part in v.split([':', ',']) {
        let p = part.trim();
        if p.is_empty() {
            continue;
        }
        // A PFS root is written as stage paths are (`StagePath::exact`).
        let norm = match StagePath::exact(p) {
            Ok(sp) => sp.into_string(),
            Err(StagePathError::Dot | StagePathError::DotDot) => {
                return Err(format!("pfs_roots: {p:?} has . or .. components"))
            }
            Err(e) => return Err(format!("pfs_roots: {p:?} {e}")),
        };
        if !out.contains(&norm) {
            out.push(norm);
        }
    }
    Ok(out)
}

fn count(k: &str, v: &str, min: u32) -> Result<u32, String> {
    v.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n >= min)
        .ok_or_else(|| format!("{k}: {v:?} is not a whole number of at least {min}"))
}

fn secs(k: &str, v: &str) -> Result<Duration, String> {
    let t = v.trim();
    let (n, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600)
    } else if let Some(n) = t.strip_suffix('d') {
        (n, 86400)
    } else {
        (t, 1)
    };
    let n: u64 = n
        .trim()
        .parse()
        .map_err(|_| format!("{k}: not a duration: {v:?} (e.g. 500ms, 5s, 10m, 24h)"))?;
    Ok(if mult == 0 {
        Duration::from_millis(n)
    } else {
        Duration::from_secs(n.saturating_mul(mult))
    })
}

impl ManagerConfig {
    /// Every default, with the two settings that have none.
    pub fn with_defaults(listen: &str, state_dir: &Path) -> ManagerConfig {
        ManagerConfig {
            listen: listen.to_string(),
            state_dir: state_dir.to_path_buf(),
            tls_cert: state_dir.join("tls/manager.pem"),
            tls_key: state_dir.join("tls/manager.key"),
            admin_group: None,
            policy: Policy::Bandwidth,
            default_pool: None,
            stripe_size: spillway_types::tunables::DEFAULT_STRIPE_SIZE,
            mount_root: "/var/opt/spillway/mounts".into(),
            capability_lifetime: Duration::from_secs(86400),
            heartbeat_interval: Duration::from_secs(2),
            node_timeout: Duration::from_secs(10),
            munge_socket: None,
            agent_wait_max: Duration::from_secs(25),
            pfs_roots: Vec::new(),
            stage_concurrency_default: 4,
            stage_concurrency_min: 1,
            stage_concurrency_max: 64,
            stage_files_in_flight: 16,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            max_connections: None,
            max_connections_per_peer: 64,
            max_sessions_per_user: 256,
            max_stages_per_user: 10_000,
            max_stage_pairs_per_user: 100_000,
        }
    }

    /// `value` within `[stage_concurrency_min, stage_concurrency_max]`.
    pub fn clamp_concurrency(&self, value: u64) -> u32 {
        let v = value.min(u32::MAX as u64) as u32;
        v.clamp(self.stage_concurrency_min, self.stage_concurrency_max)
    }

    pub fn load(path: &Path) -> Result<ManagerConfig, String> {
        let m = config::read(path, KEYS)?;
        let get = |k: &str| m.get(k).map(String::as_str);
        let need = |k: &str| get(k).ok_or_else(|| format!("{}: {k} is not set", path.display()));
        let state_dir = PathBuf::from(need("state_dir")?);
        let mut c = ManagerConfig {
            listen: need("listen")?.to_string(),
            tls_cert: get("tls_cert")
                .map(PathBuf::from)
                .unwrap_or_else(|| state_dir.join("tls/manager.pem")),
            tls_key: get("tls_key")
                .map(PathBuf::from)
                .unwrap_or_else(|| state_dir.join("tls/manager.key")),
            state_dir,
            admin_group: get("admin_group")
                .filter(|s| !s.is_empty())
                .map(String::from),
            policy: match get("policy") {
                None => Policy::Bandwidth,
                Some(p) => Policy::parse(p)
                    .ok_or_else(|| format!("policy: {p:?} is not bandwidth or isolation"))?,
            },
            default_pool: get("default_pool")
                .filter(|s| !s.is_empty())
                .map(String::from),
            stripe_size: match get("stripe_size") {
                None => spillway_types::tunables::DEFAULT_STRIPE_SIZE,
                Some(s) => {
                    let n = parse_size(s).map_err(|e| format!("stripe_size: {e}"))?;
                    u32::try_from(n)
                        .ok()
                        .filter(|n| {
                            *n > 0
                                && n.is_multiple_of(4096)
                                && *n <= spillway_types::tunables::MAX_STRIPE_SIZE
                        })
                        .ok_or("stripe_size: a multiple of 4KiB up to 64MiB")?
                }
            },
            mount_root: get("mount_root")
                .unwrap_or("/var/opt/spillway/mounts")
                .trim_end_matches('/')
                .to_string(),
            capability_lifetime: get("capability_lifetime")
                .map(|v| secs("capability_lifetime", v))
                .transpose()?
                .unwrap_or(Duration::from_secs(86400)),
            heartbeat_interval: get("heartbeat_interval")
                .map(|v| secs("heartbeat_interval", v))
                .transpose()?
                .unwrap_or(Duration::from_secs(2)),
            node_timeout: get("node_timeout")
                .map(|v| secs("node_timeout", v))
                .transpose()?
                .unwrap_or(Duration::from_secs(10)),
            munge_socket: get("munge_socket").map(PathBuf::from),
            agent_wait_max: get("agent_wait_max")
                .map(|v| secs("agent_wait_max", v))
                .transpose()?
                .unwrap_or(Duration::from_secs(25)),
            pfs_roots: get("pfs_roots")
                .map(parse_pfs_roots)
                .transpose()?
                .unwrap_or_default(),
            stage_concurrency_min: get("stage_concurrency_min")
                .map(|v| count("stage_concurrency_min", v, 1))
                .transpose()?
                .unwrap_or(1),
            stage_concurrency_max: get("stage_concurrency_max")
                .map(|v| count("stage_concurrency_max", v, 1))
                .transpose()?
                .unwrap_or(64),
            stage_concurrency_default: get("stage_concurrency_default")
                .map(|v| count("stage_concurrency_default", v, 1))
                .transpose()?
                .unwrap_or(4),
            stage_files_in_flight: get("stage_files_in_flight")
                .map(|v| count("stage_files_in_flight", v, 1))
                .transpose()?
                .unwrap_or(16),
            header_timeout: get("header_timeout")
                .map(|v| secs("header_timeout", v))
                .transpose()?
                .unwrap_or(Duration::from_secs(10)),
            idle_timeout: get("idle_timeout")
                .map(|v| secs("idle_timeout", v))
                .transpose()?
                .unwrap_or(Duration::from_secs(30)),
            max_connections: get("max_connections")
                .map(|v| count("max_connections", v, 1).map(|n| n as usize))
                .transpose()?,
            max_connections_per_peer: get("max_connections_per_peer")
                .map(|v| count("max_connections_per_peer", v, 1).map(|n| n as usize))
                .transpose()?
                .unwrap_or(64),
            max_sessions_per_user: get("max_sessions_per_user")
                .map(|v| count("max_sessions_per_user", v, 1))
                .transpose()?
                .unwrap_or(256),
            max_stages_per_user: get("max_stages_per_user")
                .map(|v| count("max_stages_per_user", v, 1))
                .transpose()?
                .unwrap_or(10_000),
            max_stage_pairs_per_user: get("max_stage_pairs_per_user")
                .map(|v| count("max_stage_pairs_per_user", v, 1))
                .transpose()?
                .unwrap_or(100_000),
        };
        if c.stage_concurrency_min > c.stage_concurrency_max {
            return Err(format!(
                "stage_concurrency_min ({}) is above stage_concurrency_max ({})",
                c.stage_concurrency_min, c.stage_concurrency_max
            ));
        }
        // The default lies in the range (clamped, as a request's value is).
        c.stage_concurrency_default = c.clamp_concurrency(c.stage_concurrency_default as u64);
        if !c.mount_root.starts_with('/') {
            return Err(format!("mount_root must be absolute: {}", c.mount_root));
        }
        if c.capability_lifetime < Duration::from_secs(60) {
            return Err("capability_lifetime: at least 60s".into());
        }
        for (k, v) in [
            ("header_timeout", c.header_timeout),
            ("idle_timeout", c.idle_timeout),
        ] {
            if v < Duration::from_millis(100) || v > Duration::from_secs(3600) {
                return Err(format!("{k}: between 100ms and 1h"));
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(secs("k", "500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(secs("k", "5").unwrap(), Duration::from_secs(5));
        assert_eq!(secs("k", "2h").unwrap(), Duration::from_secs(7200));
        assert!(secs("k", "fast").is_err());
    }

    #[test]
    fn loads_with_defaults() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.conf");
        std::fs::write(&p, "listen = 127.0.0.1:1\nstate_dir = /x\n").unwrap();
        let c = ManagerConfig::load(&p).unwrap();
        assert_eq!(c.tls_cert, PathBuf::from("/x/tls/manager.pem"));
        assert_eq!(c.policy, Policy::Bandwidth);
        std::fs::write(&p, "listen = a\nstate_dir = /x\npolicy = fast\n").unwrap();
        assert!(ManagerConfig::load(&p).unwrap_err().contains("policy"));
    }

    #[test]
    fn staging_keys() {
        assert_eq!(
            parse_pfs_roots("/lus/a:/gpfs//b/, /lus/a").unwrap(),
            vec!["/lus/a".to_string(), "/gpfs/b".to_string()]
        );
        assert!(parse_pfs_roots("lus").unwrap_err().contains("absolute"));
        assert!(parse_pfs_roots("/a/../b").is_err());
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.conf");
        std::fs::write(&p, "listen = a\nstate_dir = /x\n").unwrap();
        let c = ManagerConfig::load(&p).unwrap();
        assert!(c.pfs_roots.is_empty());
        assert_eq!(
            (
                c.stage_concurrency_default,
                c.stage_concurrency_min,
                c.stage_concurrency_max,
                c.stage_files_in_flight
            ),
            (4, 1, 64, 16)
        );
        assert_eq!(c.clamp_concurrency(0), 1);
        assert_eq!(c.clamp_concurrency(1 << 40), 64);
        std::fs::write(
            &p,
            "listen = a\nstate_dir = /x\npfs_roots = /pfs\nstage_concurrency_max = 2\n",
        )
        .unwrap();
        let c = ManagerConfig::load(&p).unwrap();
        assert_eq!(c.pfs_roots, vec!["/pfs".to_string()]);
        assert_eq!(c.stage_concurrency_default, 2);
        std::fs::write(
            &p,
            "listen = a\nstate_dir = /x\nstage_concurrency_min = 5\nstage_concurrency_max = 2\n",
        )
        .unwrap();
        assert!(ManagerConfig::load(&p).unwrap_err().contains("above"));
        std::fs::write(
            &p,
            "listen = a\nstate_dir = /x\nstage_files_in_flight = 0\n",
        )
        .unwrap();
        assert!(ManagerConfig::load(&p).is_err());
    }

    #[test]
    fn per_user_limits() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.conf");
        std::fs::write(&p, "listen = a\nstate_dir = /x\n").unwrap();
        let c = ManagerConfig::load(&p).unwrap();
        assert_eq!(
            (c.max_sessions_per_user, c.max_stages_per_user),
            (256, 10_000)
        );
        let w = ManagerConfig::with_defaults("a", Path::new("/x"));
        assert_eq!(
            (w.max_sessions_per_user, w.max_stages_per_user),
            (256, 10_000)
        );
        std::fs::write(
            &p,
            "listen = a\nstate_dir = /x\nmax_sessions_per_user = 3\nmax_stages_per_user = 5\n",
        )
        .unwrap();
        let c = ManagerConfig::load(&p).unwrap();
        assert_eq!((c.max_sessions_per_user, c.max_stages_per_user), (3, 5));
        assert_eq!(c.max_stage_pairs_per_user, 100_000);
        assert_eq!(w.max_stage_pairs_per_user, 100_000);
        std::fs::write(
            &p,
            "listen = a\nstate_dir = /x\nmax_stage_pairs_per_user = 7\n",
        )
        .unwrap();
        assert_eq!(ManagerConfig::load(&p).unwrap().max_stage_pairs_per_user, 7);
        for bad in [
            "max_sessions_per_user = 0",
            "max_stages_per_user = many",
            "max_stage_pairs_per_user = 0",
        ] {
            std::fs::write(&p, format!("listen = a\nstate_dir = /x\n{bad}\n")).unwrap();
            let e = ManagerConfig::load(&p).unwrap_err();
            assert!(e.contains(bad.split(' ').next().unwrap()), "{e}");
        }
    }
}
