//! `setup`: the session first (Slurm must see it within seconds, spec §8.23), then the
//! job instance and its configuration (placed at once, built by the reconcile loop in
//! the background), then the job instance's stage-outs, registered as deferred so that
//! they are owed to the PFS from now on: a teardown without `hurry` runs them even if
//! `data_out` never comes.

use super::lookup::{live_session_of, Job};
use super::stages::{ensure_stage, stage_request};
use super::{PhaseError, PhaseResult};
use crate::directive::{InstanceType, JobDw};
use crate::job::{JobSpec, Target};
use spillway_api::{
    AccessMode, ApiClient, ConfigType, NewConfiguration, NewInstance, NewSession, Session,
    StageWhen,
};

/// What the workload manager says about the job.
#[derive(Clone, Debug)]
pub struct SetupRequest {
    /// The job id.
    pub token: String,
    pub owner: u32,
    pub group: u32,
    /// `--capacity pool:size` as Slurm charged it (rounded to the granularity); None:
    /// what the `#DW jobdw` line asks for, in its pool.
    pub capacity: Option<(Option<String>, u64)>,
    /// The planned compute nodes, when the scheduler already knows them.
    pub nodes: Vec<String>,
    /// `SLURM`, or `spillway-run`.
    pub creator: String,
}

pub fn setup(api: &ApiClient, spec: &JobSpec, req: &SetupRequest) -> PhaseResult<String> {
    let session = session(api, req)?;
    let mut said = format!("session {} (token {})", session.id, req.token);
    for line in super::configure_persistent_caches(api, &spec.create, req.owner)? {
        said.push_str(&format!("; {line}"));
    }
    let Some(ji) = &spec.instance else {
        return Ok(said);
    };
    let (pool, bytes) = match &req.capacity {
        Some((pool, bytes)) if *bytes > 0 => (pool.clone().or(ji.spec.pool.clone()), *bytes),
        _ => (ji.spec.pool.clone(), ji.spec.capacity),
    };
    let job = Job::of(api, session.clone())?;
    let instance = match job.instance.clone() {
        Some(i) => i,
        None => api.create_instance(&NewInstance {
            session: session.id,
            capacity: bytes,
            pool,
            label: None,
            public: Some(false),
            policy: None,
            limits: None,
            stripe_size: ji.spec.stripe_size,
            expiration: None,
        })?,
    };
    // A configuration per access mode asked for: striped (one namespace), private (one
    // per compute node); both may be asked for at once.
    // Load-balanced replicas (ldbal) are a configuration of their own: the directive
    // refuses them with another mode.
    let mut modes = Vec::new();
    if ji.spec.access.ldbal {
        modes.push(AccessMode::Ldbal);
    } else {
        if ji.spec.access.striped || !ji.spec.access.private {
            modes.push(AccessMode::Stripe);
        }
        if ji.spec.access.private {
            modes.push(AccessMode::Private);
        }
    }
    let mut confs = Vec::new();
    for mode in modes {
        let c = match job.configuration(mode) {
            Some(c) => c.clone(),
            None => {
                api.create_configuration(&configuration_of(&ji.spec, instance.id, mode, req.group))?
            }
        };
        confs.push(format!("{} {}", mode.as_str(), c.id));
    }
    said.push_str(&format!(
        ": instance {} of {} bytes in pool {}, configuration {}",
        instance.id,
        instance.capacity.bytes,
        instance.pool,
        confs.join(", ")
    ));
    let mut owed = 0;
    for s in spec
        .stage_out
        .iter()
        .filter(|s| s.instance.target == Target::JobStriped)
    {
        let want = stage_request(s, instance.id, req.owner, Some(StageWhen::JobEnd));
        let st = ensure_stage(api, &want, session.created)
            .map_err(|e| PhaseError::Failed(format!("line {}: stage_out: {e}", s.line)))?;
        owed += usize::from(st.is_some());
    }
    if owed > 0 {
        said.push_str(&format!("; {owed} stage-out(s) owed to the PFS"));
    }
    Ok(said)
}

/// The job's live session, made now if there is none.
fn session(api: &ApiClient, req: &SetupRequest) -> PhaseResult<Session> {
    live_session_of(
        api,
        &NewSession {
            token: req.token.clone(),
            owner: Some(req.owner),
            creator: Some(req.creator.clone()),
            client_nodes: req.nodes.clone(),
            expiration: None,
        },
        &format!("token {}", crate::input::shown(&req.token)),
        &format!(
            "already names another user's session, not one of uid {}",
            req.owner
        ),
    )
}

/// The configuration a job's `#DW jobdw` asks for in access mode `mode`: scratch, or a
/// cache of its `pfs=` directory with the policies it names (docs/cache.md).
fn configuration_of(j: &JobDw, instance: u64, mode: AccessMode, group: u32) -> NewConfiguration {
    let cache = j.kind == InstanceType::Cache;
    NewConfiguration {
        instance,
        kind: if cache {
            ConfigType::Cache
        } else {
            ConfigType::Scratch
        },
        access_mode: mode,
        root_permissions: None,
        group: Some(group),
        pfs: j.pfs.clone().filter(|_| cache),
        modified_threshold: j.policy.modified_threshold,
        read_ahead: j.policy.read_ahead,
        sync_on_close: j.policy.sync_on_close,
        sync_to_pfs: j.policy.sync_to_pfs,
    }
}
