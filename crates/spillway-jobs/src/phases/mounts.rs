//! `paths`, `pre_run` and `post_run`: where the job's instances are mounted on its
//! compute nodes, mounting them there (an activation per configuration, made true by
//! each node's agent), and unmounting them after the job.
//!
//! Mount points are per job (Slurm may start the next job's pre_run on a node before
//! the last job's post_run ends there, spec §8.10) and known before anything is
//! mounted (`paths` runs first, inside slurmctld, and must not wait on storage):
//! `<mount_root>/batch/<job>_striped_scratch` for the job instance and
//! `<mount_root>/batch/<name>_<job>_striped_scratch` for a persistent one, after
//! DataWarp's `/var/opt/cray/dws/mounts/batch/...`.

use super::lookup::{Job, PersistentUse};
use super::{wait_for, PhaseError, PhaseResult, STORAGE_WAIT};
use crate::directive::InstanceType;
use crate::job::JobSpec;
use spillway_api::{
    AccessMode, Activation, ApiClient, ApiError, Goal, NewActivation, Session, SessionUpdate,
};

/// Which of a job's mounts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MountKind {
    JobStriped,
    /// The job instance is a cache (docs/cache.md): mounted as DataWarp names it.
    JobStripedCache,
    JobPrivate,
    Persistent(String),
}

/// The mount point of one of a job's mounts.
pub fn mount_point(mount_root: &str, token: &str, kind: &MountKind) -> String {
    let root = mount_root.trim_end_matches('/');
    match kind {
        MountKind::JobStriped => format!("{root}/batch/{token}_striped_scratch"),
        MountKind::JobStripedCache => format!("{root}/batch/{token}_striped_cache"),
        MountKind::JobPrivate => format!("{root}/batch/{token}_private_scratch"),
        MountKind::Persistent(name) => format!("{root}/batch/{name}_{token}_striped_scratch"),
    }
}

fn mount_root(api: &ApiClient) -> PhaseResult<String> {
    Ok(api.resources()?.mount_root)
}

/// The job's mounts and the variable each is given to the job as. A cache instance's
/// mount is given twice: `DW_JOB_STRIPED_CACHE` (the DWS API's name) and
/// `DW_JOB_STRIPED_CACHED` (the spelling old scripts use; spec §4).
fn mounts(spec: &JobSpec) -> Vec<(MountKind, String)> {
    let mut out = Vec::new();
    if let Some(i) = &spec.instance {
        if i.spec.kind == InstanceType::Cache {
            for var in ["DW_JOB_STRIPED_CACHE", "DW_JOB_STRIPED_CACHED"] {
                out.push((MountKind::JobStripedCache, var.to_string()));
            }
        } else if i.spec.access.striped || !i.spec.access.private {
            out.push((MountKind::JobStriped, "DW_JOB_STRIPED".to_string()));
        }
        if i.spec.access.private {
            out.push((MountKind::JobPrivate, "DW_JOB_PRIVATE".to_string()));
        }
    }
    for name in &spec.persistent {
        out.push((
            MountKind::Persistent(name.clone()),
            format!("DW_PERSISTENT_STRIPED_{name}"),
        ));
    }
    out
}

fn check_token(token: &str) -> PhaseResult<()> {
    let plain = !token.is_empty()
        && token.len() <= 64
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if plain {
        Ok(())
    } else {
        Err(PhaseError::Failed(format!("invalid token {token:?}")))
    }
}

/// The job's `DW_*` variables: `NAME`, value with a trailing `/` (as DataWarp's).
pub fn paths(api: &ApiClient, spec: &JobSpec, token: &str) -> PhaseResult<Vec<(String, String)>> {
    check_token(token)?;
    let root = mount_root(api)?;
    Ok(mounts(spec)
        .into_iter()
        .map(|(kind, var)| (var, format!("{}/", mount_point(&root, token, &kind))))
        .collect())
}

/// The session's live activations.
fn activations_of(api: &ApiClient, session: &Session) -> PhaseResult<Vec<Activation>> {
    Ok(api
        .list_activations()?
        .into_iter()
        .filter(|a| a.links.session == session.id && a.state.goal == Goal::Create)
        .collect())
}

/// Mount the job's instances on `nodes` (the allocated compute nodes) and wait until
/// every node has mounted every one.
pub fn pre_run(
    api: &ApiClient,
    spec: &JobSpec,
    token: &str,
    nodes: &[String],
) -> PhaseResult<String> {
    check_token(token)?;
    let job = Job::find(api, token)?;
    let mut session = job.session.clone();
    let mut want_nodes = nodes.to_vec();
    want_nodes.sort();
    want_nodes.dedup();
    if want_nodes.is_empty() && session.links.client_nodes.is_empty() {
        return Err(PhaseError::Failed(
            "no compute nodes to mount on (no node list was given)".into(),
        ));
    }
    if !want_nodes.is_empty() && want_nodes != session.links.client_nodes {
        session = api.update_session(
            session.id,
            &SessionUpdate {
                client_nodes: Some(want_nodes),
                replace_fuse: None,
            },
        )?;
    }
    let root = mount_root(api)?;
    let existing = activations_of(api, &session)?;
    let mut ids = Vec::new();
    let mut kinds: Vec<MountKind> = Vec::new();
    for (kind, _) in mounts(spec) {
        // A cache's mount is given under two names: mounted once.
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    for kind in kinds {
        let configuration = match &kind {
            MountKind::JobStriped | MountKind::JobStripedCache | MountKind::JobPrivate => {
                let mode = if kind != MountKind::JobPrivate {
                    AccessMode::Stripe
                } else {
                    AccessMode::Private
                };
                job.configuration(mode).map(|c| c.id).ok_or_else(|| {
                    PhaseError::Failed(format!(
                        "session {} has no {} configuration of its instance (was setup run?)",
                        session.id,
                        mode.as_str()
                    ))
                })?
            }
            MountKind::Persistent(name) => PersistentUse::find(api, name)?.configuration.id,
        };
        let mount = mount_point(&root, token, &kind);
        let a = match existing
            .iter()
            .find(|a| a.links.configuration == configuration && a.mount == mount)
        {
            Some(a) => a.clone(),
            None => api.create_activation(&NewActivation {
                session: session.id,
                configuration,
                mount: Some(mount),
            })?,
        };
        ids.push(a.id);
    }
    for &id in &ids {
        wait_for(
            STORAGE_WAIT,
            || format!("activation {id} to be mounted on every node"),
            || {
                let a = api.activation(id)?;
                if a.state.fuse_blown {
                    return Err(PhaseError::Failed(format!(
                        "mounting {} failed: {}",
                        a.mount,
                        node_errors(&a)
                    )));
                }
                Ok(a.state.actualized.then_some(()))
            },
        )?;
    }
    Ok(format!(
        "mounted {} instance(s) on {} node(s)",
        ids.len(),
        session.links.client_nodes.len()
    ))
}

fn node_errors(a: &Activation) -> String {
    let errs: Vec<String> = a
        .nodes
        .iter()
        .filter_map(|n| n.error.as_ref().map(|e| format!("{}: {e}", n.node)))
        .collect();
    if errs.is_empty() {
        "no node reported why".into()
    } else {
        errs.join("; ")
    }
}

/// Unmount the job's instances from its nodes (the client flushes what it buffered
/// before the unmount completes) and wait until every node has. A job without a
/// session has nothing mounted.
pub fn post_run(api: &ApiClient, token: &str) -> PhaseResult<String> {
    let job = match Job::find(api, token) {
        Ok(j) => j,
        Err(PhaseError::NoSession(_)) => return Ok("nothing mounted".into()),
        Err(e) => return Err(e),
    };
    let live = activations_of(api, &job.session)?;
    for a in &live {
        match api.destroy_activation(a.id) {
            Ok(_) | Err(ApiError::Status { status: 404, .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for a in &live {
        wait_for(
            STORAGE_WAIT,
            || format!("{} to be unmounted on every node", a.mount),
            || match api.activation(a.id) {
                Err(ApiError::Status { status: 404, .. }) => Ok(Some(())),
                Ok(_) => Ok(None),
                Err(e) => Err(e.into()),
            },
        )?;
    }
    Ok(format!("unmounted {} instance(s)", live.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(script: &str) -> Vec<(MountKind, String)> {
        mounts(&JobSpec::parse(script.as_bytes()).unwrap())
    }

    #[test]
    fn a_cache_job_gets_both_spellings_of_its_variable_on_one_mount() {
        let v = vars("#!/bin/sh\n#DW jobdw type=cache pfs=/lus/p capacity=1G\n");
        assert_eq!(
            v,
            vec![
                (
                    MountKind::JobStripedCache,
                    "DW_JOB_STRIPED_CACHE".to_string()
                ),
                (
                    MountKind::JobStripedCache,
                    "DW_JOB_STRIPED_CACHED".to_string()
                ),
            ]
        );
        assert_eq!(
            mount_point("/mnt/dw/", "42", &MountKind::JobStripedCache),
            "/mnt/dw/batch/42_striped_cache"
        );
        let v = vars("#!/bin/sh\n#DW jobdw capacity=1G\n");
        assert_eq!(
            v,
            vec![(MountKind::JobStriped, "DW_JOB_STRIPED".to_string())]
        );
    }
}
