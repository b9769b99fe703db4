//! Resources as the manager returns them, in DataWarp's JSON shapes (see the spec:
//! Slurm reads `id`, `capacity.bytes`, `links.session`, `created`, `owner`, `token` as
//! integers and strings exactly as here), and the bodies of create/update requests.
//!
//! Request bodies refuse unknown fields: a misspelt option is an error, not a default.

use serde::{Deserialize, Serialize};

/// Where an object is heading and whether it is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Goal {
    Create,
    Destroy,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub goal: Goal,
    /// The goal is reached.
    pub actualized: bool,
    /// Retries stopped after repeated failures; an admin must replace the fuse.
    pub fuse_blown: bool,
    /// Some parts reached the goal and others not.
    pub mixed: bool,
    /// Work toward the goal is under way.
    pub transitioning: bool,
}

impl State {
    /// dwstat's five-character column: goal, actualized, fuse blown, transitioning, mixed.
    pub fn column(&self) -> String {
        let mut s = String::with_capacity(5);
        s.push(match self.goal {
            Goal::Create => 'C',
            Goal::Destroy => 'D',
        });
        s.push(if self.actualized { 'A' } else { '-' });
        s.push(if self.fuse_blown { 'F' } else { '-' });
        s.push(if self.transitioning { 'T' } else { '-' });
        s.push(if self.mixed { 'M' } else { '-' });
        s
    }
}

// ------------------------------------------------------------------ pools
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pool {
    pub id: String,
    pub units: String,
    /// Bytes per granule.
    pub granularity: u64,
    /// Granules on the pool's online, undrained nodes.
    pub quantity: u64,
    /// Granules of those not allocated.
    pub free: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewPool {
    pub id: String,
    pub granularity: u64,
    #[serde(default)]
    pub units: Option<String>,
}

// ------------------------------------------------------------------ nodes
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub id: String,
    /// Data-plane address (`host:port`) of the storage server.
    pub address: String,
    pub pool: Option<String>,
    /// The last heartbeat was answered within the node timeout.
    pub online: bool,
    /// Taken out of allocation by an admin; its instances stay.
    pub drain: bool,
    /// Bytes the node offers (its reported capacity, or the admin's limit).
    pub capacity: u64,
    /// Bytes not allocated to fragments.
    pub free: u64,
    /// The pool's granularity (0 without a pool).
    pub granularity: u64,
    /// `ok`, `offline` or the last heartbeat error.
    pub health: String,
    /// Epoch seconds of the last answered heartbeat (0: never).
    pub last_heartbeat: i64,
    pub links: NodeLinks,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeLinks {
    pub fragments: Vec<u64>,
    pub instances: Vec<u64>,
    pub activations: Vec<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewNode {
    pub id: String,
    pub address: String,
    #[serde(default)]
    pub pool: Option<String>,
    /// Offer at most this many bytes (default: what the server reports).
    #[serde(default)]
    pub capacity: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeUpdate {
    /// Move to this pool; `""` takes the node out of every pool.
    #[serde(default)]
    pub pool: Option<String>,
    #[serde(default)]
    pub drain: Option<bool>,
    /// Limit in bytes; 0 removes the limit.
    #[serde(default)]
    pub capacity: Option<u64>,
    /// Reset the failure counter of every object on this node.
    #[serde(default)]
    pub replace_fuse: Option<bool>,
}

// ------------------------------------------------------------------ sessions
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Session {
    pub id: u64,
    /// Job id, or the name of a persistent instance.
    pub token: String,
    pub owner: u32,
    pub creator: String,
    pub created: i64,
    pub expiration: i64,
    pub expired: bool,
    pub links: SessionLinks,
    pub state: State,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionLinks {
    pub client_nodes: Vec<String>,
    pub instances: Vec<u64>,
    pub activations: Vec<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSession {
    pub token: String,
    /// Default: the caller. Only admins create sessions for others.
    #[serde(default)]
    pub owner: Option<u32>,
    #[serde(default)]
    pub creator: Option<String>,
    #[serde(default)]
    pub client_nodes: Vec<String>,
    /// Epoch seconds; 0 or absent: none.
    #[serde(default)]
    pub expiration: Option<i64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionUpdate {
    #[serde(default)]
    pub client_nodes: Option<Vec<String>>,
    #[serde(default)]
    pub replace_fuse: Option<bool>,
}

// ------------------------------------------------------------------ instances
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Spread over as many servers as the granules allow.
    Bandwidth,
    /// Pack onto as few servers as possible.
    Isolation,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Bandwidth => "bandwidth",
            Policy::Isolation => "isolation",
        }
    }

    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "bandwidth" => Some(Policy::Bandwidth),
            "isolation" => Some(Policy::Isolation),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    pub bytes: u64,
    /// Servers the instance spans.
    pub nodes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub write_window_length: u64,
    pub write_window_multiplier: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            write_window_length: 86400,
            write_window_multiplier: 10,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    pub id: u64,
    pub capacity: Capacity,
    pub created: i64,
    pub expiration: i64,
    pub expired: bool,
    /// Every fragment is on an online server.
    pub intact: bool,
    pub label: String,
    pub limits: Limits,
    pub links: InstanceLinks,
    /// Persistent instances are public: every user sees them.
    pub public: bool,
    pub state: State,
    pub pool: String,
    pub policy: Policy,
    /// Bytes asked for (capacity.bytes is this rounded up to the granularity).
    pub requested_bytes: u64,
    pub owner: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceLinks {
    pub session: u64,
    pub configurations: Vec<u64>,
    pub fragments: Vec<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewInstance {
    pub session: u64,
    /// Bytes; rounded up to the pool's granularity.
    pub capacity: u64,
    /// Default: the site's default pool.
    #[serde(default)]
    pub pool: Option<String>,
    #[serde(default)]
    pub label: Option<String>,
    /// Default: true for sessions whose token is not a job id (persistent instances).
    #[serde(default)]
    pub public: Option<bool>,
    /// Default: the site's policy.
    #[serde(default)]
    pub policy: Option<Policy>,
    #[serde(default)]
    pub limits: Option<Limits>,
    /// Default stripe size of new files, bytes.
    #[serde(default)]
    pub stripe_size: Option<u32>,
    #[serde(default)]
    pub expiration: Option<i64>,
}

// ------------------------------------------------------------------ fragments
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fragment {
    pub id: u64,
    pub capacity: u64,
    pub node: String,
    /// Position in the instance (the placement function's server index).
    pub index: u32,
    pub links: FragmentLinks,
    pub state: State,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FragmentLinks {
    pub instance: u64,
}

// ------------------------------------------------------------------ configurations
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConfigType {
    Scratch,
    Cache,
    Swap,
}

impl ConfigType {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigType::Scratch => "scratch",
            ConfigType::Cache => "cache",
            ConfigType::Swap => "swap",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessMode {
    /// One namespace shared by every client node, files striped over the servers.
    Stripe,
    /// One namespace per client node.
    Private,
    /// Read-only replicas, each client reads from one.
    Ldbal,
}

impl AccessMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::Stripe => "stripe",
            AccessMode::Private => "private",
            AccessMode::Ldbal => "ldbal",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Configuration {
    pub id: u64,
    #[serde(rename = "type")]
    pub kind: ConfigType,
    pub access_mode: AccessMode,
    /// Mode bits of the instance's root directory.
    pub root_permissions: u32,
    /// Group of the instance's root directory.
    pub group: u32,
    /// A cache configuration's PFS directory and policies (absent for scratch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pfs: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_threshold: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_ahead: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_on_close: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_to_pfs: Option<bool>,
    pub links: ConfigurationLinks,
    pub state: State,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfigurationLinks {
    pub instance: u64,
    pub activations: Vec<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewConfiguration {
    pub instance: u64,
    #[serde(rename = "type")]
    pub kind: ConfigType,
    pub access_mode: AccessMode,
    /// Default 0755.
    #[serde(default)]
    pub root_permissions: Option<u32>,
    /// Default: the owner's primary group.
    #[serde(default)]
    pub group: Option<u32>,
    /// A cache configuration: the PFS directory it caches (absolute) and its policies
    /// (docs/cache.md; absent ones take the defaults there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pfs: Option<String>,
    /// Bytes dirty in one file that start its write-behind (default 64 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_threshold: Option<u64>,
    /// Bytes read ahead past a read that missed (default 16 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_ahead: Option<u64>,
    /// Closing a file writes its changes to the PFS first (default no).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_on_close: Option<bool>,
    /// fsync writes a file's changes to the PFS (default no: the servers' SSDs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_to_pfs: Option<bool>,
}

/// The cache policies' defaults (docs/cache.md, "Policies").
pub mod cache_defaults {
    pub const MODIFIED_THRESHOLD: u64 = 64 << 20;
    pub const READ_AHEAD: u64 = 16 << 20;
}

// ------------------------------------------------------------------ activations
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Activation {
    pub id: u64,
    /// Mount point on every client node of the session.
    pub mount: String,
    pub created: i64,
    pub links: ActivationLinks,
    /// Per client node: what its agent last reported.
    pub nodes: Vec<ActivationNode>,
    pub state: State,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActivationLinks {
    pub session: u64,
    pub configuration: u64,
    pub instance: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActivationNode {
    pub node: String,
    /// `pending`, `mounted`, `unmounted` or `failed`.
    pub status: String,
    /// The agent's message when the mount or unmount failed.
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewActivation {
    pub session: u64,
    pub configuration: u64,
    /// Default: `mount_root/s<session>-c<configuration>`. Only admins may name one
    /// (strictly below the site's mount root, not overlapping another activation's).
    #[serde(default)]
    pub mount: Option<String>,
}

// ------------------------------------------------------------------ stages
/// Which way a stage copies: `in` (PFS → instance) or `out` (instance → PFS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StageDirection {
    In,
    Out,
}

impl StageDirection {
    pub fn as_str(self) -> &'static str {
        match self {
            StageDirection::In => "in",
            StageDirection::Out => "out",
        }
    }

    pub fn parse(s: &str) -> Option<StageDirection> {
        match s {
            "in" => Some(StageDirection::In),
            "out" => Some(StageDirection::Out),
            _ => None,
        }
    }
}

/// What a stage names: one file, a directory tree, or a list of file pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StageType {
    File,
    Directory,
    List,
}

impl StageType {
    pub fn as_str(self) -> &'static str {
        match self {
            StageType::File => "file",
            StageType::Directory => "directory",
            StageType::List => "list",
        }
    }

    pub fn parse(s: &str) -> Option<StageType> {
        match s {
            "file" => Some(StageType::File),
            "directory" => Some(StageType::Directory),
            "list" => Some(StageType::List),
            _ => None,
        }
    }
}

/// When a stage runs: at once, or (stage-out only) when its session is torn down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageWhen {
    Immediate,
    JobEnd,
}

impl StageWhen {
    pub fn as_str(self) -> &'static str {
        match self {
            StageWhen::Immediate => "immediate",
            StageWhen::JobEnd => "job_end",
        }
    }

    pub fn parse(s: &str) -> Option<StageWhen> {
        match s {
            "immediate" => Some(StageWhen::Immediate),
            "job_end" => Some(StageWhen::JobEnd),
            _ => None,
        }
    }
}

/// Where a stage is. `queued`, `deferred` and `running` are active; the others are
/// final.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StageState {
    /// Waiting for a slot (the instance's stage concurrency) or for the instance.
    Queued,
    /// A stage-out waiting for its session's teardown (or an activate).
    Deferred,
    Running,
    Complete,
    Failed,
    Terminated,
    Revoked,
    /// A stage-out given up by a teardown with `hurry`.
    Dropped,
}

impl StageState {
    pub const ALL: [StageState; 8] = [
        StageState::Queued,
        StageState::Deferred,
        StageState::Running,
        StageState::Complete,
        StageState::Failed,
        StageState::Terminated,
        StageState::Revoked,
        StageState::Dropped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StageState::Queued => "queued",
            StageState::Deferred => "deferred",
            StageState::Running => "running",
            StageState::Complete => "complete",
            StageState::Failed => "failed",
            StageState::Terminated => "terminated",
            StageState::Revoked => "revoked",
            StageState::Dropped => "dropped",
        }
    }

    pub fn parse(s: &str) -> Option<StageState> {
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// The stage has ended: nothing will change it any more.
    pub fn ended(self) -> bool {
        !matches!(
            self,
            StageState::Queued | StageState::Deferred | StageState::Running
        )
    }
}

/// A (source, destination) pair of a list stage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StagePair {
    pub source: String,
    pub destination: String,
}

/// Why a stage or a file failed: the file (instance path), a positive errno, a message
/// naming the file and the reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageError {
    pub path: String,
    pub errno: i32,
    pub message: String,
}

/// A stage as the manager records it (docs/staging.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    pub id: u64,
    pub instance: u64,
    pub session: u64,
    /// The uid the stage runs as.
    pub owner: u32,
    pub direction: StageDirection,
    #[serde(rename = "type")]
    pub kind: StageType,
    pub when: StageWhen,
    /// PFS path for stage-in, instance path for stage-out; empty for lists.
    pub source: String,
    pub destination: String,
    /// Lists only.
    pub pairs: Vec<StagePair>,
    pub state: StageState,
    pub files_total: u64,
    pub files_done: u64,
    pub files_failed: u64,
    pub bytes_total: u64,
    pub bytes_done: u64,
    /// Every file of the stage is known (`files_total` is final).
    pub enumerated: bool,
    pub error: Option<StageError>,
    /// The coordinating server (once started).
    pub server: Option<String>,
    pub created: i64,
    /// Epoch seconds; 0 until started / finished.
    pub started: i64,
    pub finished: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewStage {
    pub instance: u64,
    pub direction: StageDirection,
    #[serde(rename = "type")]
    pub kind: StageType,
    /// File and directory stages (empty for lists).
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub destination: String,
    /// List stages only.
    #[serde(default)]
    pub pairs: Vec<StagePair>,
    /// Default immediate; `job_end` for stage-outs only.
    #[serde(default)]
    pub when: Option<StageWhen>,
    /// The uid the stage runs as. Default: the caller; admins only may name another.
    #[serde(default)]
    pub owner: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StageAction {
    /// End a queued, deferred or running stage (a running one ends when its
    /// coordinator confirms).
    Terminate,
    /// Cancel a deferred stage-out.
    Revoke,
    /// Run a deferred stage-out now.
    Activate,
}

impl StageAction {
    pub fn as_str(self) -> &'static str {
        match self {
            StageAction::Terminate => "terminate",
            StageAction::Revoke => "revoke",
            StageAction::Activate => "activate",
        }
    }
}

/// `PATCH /stages/{id}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageUpdate {
    pub action: StageAction,
}

/// A path alone (`file`) or everything at or under it (`tree`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StageScope {
    File,
    Tree,
}

/// `POST /instances/{id}/stage_actions`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StagePathAction {
    pub action: StageAction,
    pub path: String,
    pub scope: StageScope,
}

/// The `dw_query_*` counts of a path or a tree.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageCounts {
    pub complete: u64,
    pub pending: u64,
    pub deferred: u64,
    pub failed: u64,
    /// Some stage ever covered the path (else libdatawarp answers -EINVAL).
    pub started: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageFailure {
    pub path: String,
    pub errno: i32,
    pub message: String,
    pub stage: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageFailures {
    pub failures: Vec<StageFailure>,
    pub more: bool,
}

/// `PUT /instances/{id}/stage_concurrency`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageConcurrency {
    pub value: u64,
}

// ------------------------------------------------------------------ agents
/// What an agent must make true on its node: the activations to mount or unmount.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentWork {
    /// Changes whenever the answer would change; the agent passes it back to wait.
    pub version: u64,
    pub mounts: Vec<AgentMount>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentMount {
    pub activation: u64,
    pub goal: Goal,
    pub mount: String,
    /// The instance descriptor (servers, stripe size, capability) as JSON text. Only
    /// present while the goal is create.
    pub descriptor: Option<String>,
    /// The directory of the instance this node's mount shows as its root
    /// (`spillway mount --root-dir`): for a private configuration the node's own
    /// namespace, [`private_root_dir`]; absent: the instance's root. Absent from
    /// older managers' answers, ignored by older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_dir: Option<String>,
}

/// The directory of an instance that holds the compute nodes' private namespaces
/// (access mode `private`): `/.spillway-private/<node>` each. A striped mount of the
/// same instance shows it like any other directory.
pub const PRIVATE_DIR: &str = ".spillway-private";

/// Whether `node` is a valid compute node name: 1 to 64 of `A-Z a-z 0-9 _ . -`, not
/// starting with `.` or `-` (so it is always a plain file name too).
pub fn valid_node_name(node: &str) -> bool {
    !node.is_empty()
        && node.len() <= 64
        && !node.starts_with(['.', '-'])
        && node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// The instance path of `node`'s private namespace, `/.spillway-private/<node>`; None
/// for a name that is not a valid node name (never a path built from one).
pub fn private_root_dir(node: &str) -> Option<String> {
    valid_node_name(node).then(|| format!("/{PRIVATE_DIR}/{node}"))
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentReport {
    pub activation: u64,
    /// `mounted`, `unmounted` or `failed`.
    pub status: String,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentHello {
    /// Source addresses the node's mounts reach servers from (capabilities bind to
    /// them). Empty: the address the manager sees the agent connect from.
    #[serde(default)]
    pub addresses: Vec<String>,
}

// ------------------------------------------------------------------ errors
/// Every 4xx answer carries one.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    /// For a bad choice field: the valid values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choices: Option<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_column() {
        let s = State {
            goal: Goal::Destroy,
            actualized: false,
            fuse_blown: false,
            mixed: false,
            transitioning: true,
        };
        assert_eq!(s.column(), "D--T-");
    }

    #[test]
    fn private_namespaces_are_built_from_checked_names_only() {
        assert_eq!(
            private_root_dir("compute0").as_deref(),
            Some("/.spillway-private/compute0")
        );
        assert_eq!(
            private_root_dir("nid00012.ib-0_a").as_deref(),
            Some("/.spillway-private/nid00012.ib-0_a")
        );
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "-x",
            "a/b",
            "a b",
            "a\0",
            "\u{e9}",
            &"n".repeat(65),
        ] {
            assert_eq!(private_root_dir(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn agent_mounts_without_a_root_dir_read_and_write_as_before() {
        let old = r#"{"activation":1,"goal":"create","mount":"/m","descriptor":null}"#;
        let m: AgentMount = serde_json::from_str(old).unwrap();
        assert_eq!(m.root_dir, None);
        assert_eq!(serde_json::to_string(&m).unwrap(), old);
        let private = AgentMount {
            root_dir: private_root_dir("c0"),
            ..m
        };
        let text = serde_json::to_string(&private).unwrap();
        assert!(
            text.contains(r#""root_dir":"/.spillway-private/c0""#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<AgentMount>(&text).unwrap(), private);
    }

    #[test]
    fn request_bodies_refuse_unknown_fields() {
        let e = serde_json::from_str::<NewPool>(r#"{"id":"p","granularity":1,"gran":2}"#);
        assert!(e.is_err());
        let c: NewConfiguration =
            serde_json::from_str(r#"{"instance":1,"type":"scratch","access_mode":"stripe"}"#)
                .unwrap();
        assert_eq!(c.kind, ConfigType::Scratch);
    }
}
