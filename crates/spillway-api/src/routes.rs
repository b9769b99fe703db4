//! The manager's routes as the router matches them (axum's `{name}` captures): one
//! constant per route, so the route table and the callers (`paths`, whose tests pin
//! every builder to its pattern here) cannot drift apart.

/// The API's versions (also answered with a trailing `/`).
pub const VERSIONS: &str = "/dw";
pub const VERSIONS_DIR: &str = "/dw/";
/// The version's resources and `mount_root` (also answered with a trailing `/`, the
/// form the versions list gives).
pub const RESOURCES: &str = "/dw/v1";
pub const RESOURCES_DIR: &str = "/dw/v1/";
/// The OpenAPI document.
pub const OPENAPI: &str = "/dw/v1/openapi.json";

pub const POOLS: &str = "/dw/v1/pools";
pub const POOL: &str = "/dw/v1/pools/{id}";
pub const NODES: &str = "/dw/v1/nodes";
pub const NODE: &str = "/dw/v1/nodes/{id}";
pub const SESSIONS: &str = "/dw/v1/sessions";
pub const SESSION: &str = "/dw/v1/sessions/{id}";
pub const INSTANCES: &str = "/dw/v1/instances";
pub const INSTANCE: &str = "/dw/v1/instances/{id}";
pub const FRAGMENTS: &str = "/dw/v1/fragments";
pub const FRAGMENT: &str = "/dw/v1/fragments/{id}";
pub const CONFIGURATIONS: &str = "/dw/v1/configurations";
pub const CONFIGURATION: &str = "/dw/v1/configurations/{id}";
pub const ACTIVATIONS: &str = "/dw/v1/activations";
pub const ACTIVATION: &str = "/dw/v1/activations/{id}";
pub const STAGES: &str = "/dw/v1/stages";
pub const STAGE: &str = "/dw/v1/stages/{id}";

/// Staging per instance (libdatawarp's calls).
pub const STAGE_ACTIONS: &str = "/dw/v1/instances/{id}/stage_actions";
pub const STAGE_COUNTS: &str = "/dw/v1/instances/{id}/stage_counts";
pub const STAGE_FAILURES: &str = "/dw/v1/instances/{id}/stage_failures";
pub const STAGE_CONCURRENCY: &str = "/dw/v1/instances/{id}/stage_concurrency";

/// The agents' hello, long poll and reports.
pub const AGENT: &str = "/dw/v1/agents/{node}";
pub const AGENT_WORK: &str = "/dw/v1/agents/{node}/work";
pub const AGENT_REPORTS: &str = "/dw/v1/agents/{node}/reports";
