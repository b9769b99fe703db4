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
    /// The job instance is load-balanced (read-only replicas, docs/cache.md §6).
    JobLdbal,
    /// A load-balanced cache.
    JobLdbalCache,
    /// A persistent instance, by name, as its configuration makes it.
    Persistent(String, Flavour),
}

/// How a persistent instance is used, from its configuration: it decides the
/// variable's name and the mount point's suffix, as for a job instance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flavour {
    pub ldbal: bool,
    pub cache: bool,
}

impl Flavour {
    fn of(c: &spillway_api::Configuration) -> Flavour {
        Flavour {
            ldbal: c.access_mode == AccessMode::Ldbal,
            cache: c.kind == spillway_api::ConfigType::Cache,
        }
    }

    /// `striped_scratch`, `ldbal_cache`, ...
    fn suffix(self) -> String {
        format!(
            "{}_{}",
            if self.ldbal { "ldbal" } else { "striped" },
            if self.cache { "cache" } else { "scratch" }
        )
    }

    /// `DW_PERSISTENT_STRIPED_<name>`, `DW_PERSISTENT_LDBAL_<name>`,
    /// `DW_PERSISTENT_STRIPED_CACHE_<name>`, `DW_PERSISTENT_LDBAL_CACHE_<name>`
    /// (spec §4: only the first was seen; the others by analogy with the job
    /// instance's names).
    fn variable(self, name: &str) -> String {
        format!(
            "DW_PERSISTENT_{}{}_{name}",
            if self.ldbal { "LDBAL" } else { "STRIPED" },
            if self.cache { "_CACHE" } else { "" }
        )
    }
}

impl MountKind {
    /// The access mode of the job instance's configuration this mount shows (None:
    /// a persistent instance's, found by name).
    fn job_mode(&self) -> Option<AccessMode> {
        match self {
            MountKind::JobStriped | MountKind::JobStripedCache => Some(AccessMode::Stripe),
            MountKind::JobPrivate => Some(AccessMode::Private),
            MountKind::JobLdbal | MountKind::JobLdbalCache => Some(AccessMode::Ldbal),
            MountKind::Persistent(..) => None,
        }
    }
}

/// The mount point of one of a job's mounts.
pub fn mount_point(mount_root: &str, token: &str, kind: &MountKind) -> String {
    let root = mount_root.trim_end_matches('/');
    match kind {
        MountKind::JobStriped => format!("{root}/batch/{token}_striped_scratch"),
        MountKind::JobStripedCache => format!("{root}/batch/{token}_striped_cache"),
        MountKind::JobPrivate => format!("{root}/batch/{token}_private_scratch"),
        MountKind::JobLdbal => format!("{root}/batch/{token}_ldbal_scratch"),
        MountKind::JobLdbalCache => format!("{root}/batch/{token}_ldbal_cache"),
        MountKind::Persistent(name, f) => format!("{root}/batch/{name}_{token}_{}", f.suffix()),
    }
}

fn mount_root(api: &ApiClient) -> PhaseResult<String> {
    Ok(api.resources()?.mount_root)
}

/// The job's mounts and the variable each is given to the job as. A cache instance's
/// mount is given twice: `DW_JOB_STRIPED_CACHE` (the DWS API's name) and
/// `DW_JOB_STRIPED_CACHED` (the spelling old scripts use; spec §4); a load-balanced
/// one as `DW_JOB_LDBAL_CACHE` and `DW_JOB_LDBAL_CACHED`, a load-balanced scratch
/// instance as `DW_JOB_LDBAL`.
/// A persistent instance's flavour comes from `flavour` (its configuration on the
/// manager).
fn mounts(
    spec: &JobSpec,
    flavour: impl Fn(&str) -> PhaseResult<Flavour>,
) -> PhaseResult<Vec<(MountKind, String)>> {
    let mut out = Vec::new();
    if let Some(i) = &spec.instance {
        if i.spec.access.ldbal {
            if i.spec.kind == InstanceType::Cache {
                for var in ["DW_JOB_LDBAL_CACHE", "DW_JOB_LDBAL_CACHED"] {
                    out.push((MountKind::JobLdbalCache, var.to_string()));
                }
            } else {
                out.push((MountKind::JobLdbal, "DW_JOB_LDBAL".to_string()));
            }
        } else if i.spec.kind == InstanceType::Cache {
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
        let f = flavour(name)?;
        out.push((MountKind::Persistent(name.clone(), f), f.variable(name)));
    }
    Ok(out)
}

/// The flavour of the persistent instance `name`, from the manager.
fn flavour_on(api: &ApiClient) -> impl Fn(&str) -> PhaseResult<Flavour> + '_ {
    |name| Ok(Flavour::of(&PersistentUse::find(api, name)?.configuration))
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
    Ok(mounts(spec, flavour_on(api))?
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
    for (kind, _) in mounts(spec, flavour_on(api))? {
        // A cache's mount is given under two names: mounted once.
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    for kind in kinds {
        let configuration = match &kind {
            MountKind::JobStriped
            | MountKind::JobStripedCache
            | MountKind::JobPrivate
            | MountKind::JobLdbal
            | MountKind::JobLdbalCache => {
                let mode = kind.job_mode().unwrap_or(AccessMode::Stripe);
                job.configuration(mode).map(|c| c.id).ok_or_else(|| {
                    PhaseError::Failed(format!(
                        "session {} has no {} configuration of its instance (was setup run?)",
                        session.id,
                        mode.as_str()
                    ))
                })?
            }
            MountKind::Persistent(name, _) => PersistentUse::find(api, name)?.configuration.id,
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
        mounts(&JobSpec::parse(script.as_bytes()).unwrap(), |_| {
            Ok(Flavour::default())
        })
        .unwrap()
    }

    #[test]
    fn a_persistent_instance_is_named_by_its_configuration() {
        let spec = JobSpec::parse(
            b"#!/bin/sh\n#DW persistentdw name=a\n#DW persistentdw name=b\n#DW persistentdw name=c\n#DW persistentdw name=d\n",
        )
        .unwrap();
        let got = mounts(&spec, |n| {
            Ok(Flavour {
                ldbal: n == "b" || n == "d",
                cache: n == "c" || n == "d",
            })
        })
        .unwrap();
        let names: Vec<&str> = got.iter().map(|(_, v)| v.as_str()).collect();
        assert_eq!(
            names,
            [
                "DW_PERSISTENT_STRIPED_a",
                "DW_PERSISTENT_LDBAL_b",
                "DW_PERSISTENT_STRIPED_CACHE_c",
                "DW_PERSISTENT_LDBAL_CACHE_d"
            ]
        );
        let points: Vec<String> = got
            .iter()
            .map(|(k, _)| mount_point("/mnt/dw", "42", k))
            .collect();
        assert_eq!(
            points,
            [
                "/mnt/dw/batch/a_42_striped_scratch",
                "/mnt/dw/batch/b_42_ldbal_scratch",
                "/mnt/dw/batch/c_42_striped_cache",
                "/mnt/dw/batch/d_42_ldbal_cache"
            ]
        );
        let err = mounts(&spec, |_| Err(PhaseError::Failed("gone".into())));
        assert!(err.is_err());
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
        let v = vars("#!/bin/sh\n#DW jobdw access_mode=ldbal capacity=1G\n");
        assert_eq!(v, vec![(MountKind::JobLdbal, "DW_JOB_LDBAL".to_string())]);
        let v = vars("#!/bin/sh\n#DW jobdw type=cache access_mode=ldbal pfs=/lus capacity=1G\n");
        assert_eq!(
            v,
            vec![
                (MountKind::JobLdbalCache, "DW_JOB_LDBAL_CACHE".to_string()),
                (MountKind::JobLdbalCache, "DW_JOB_LDBAL_CACHED".to_string()),
            ]
        );
        assert_eq!(
            mount_point("/mnt/dw", "42", &MountKind::JobLdbal),
            "/mnt/dw/batch/42_ldbal_scratch"
        );
        assert_eq!(
            mount_point("/mnt/dw", "42", &MountKind::JobLdbalCache),
            "/mnt/dw/batch/42_ldbal_cache"
        );
        let v = vars("#!/bin/sh\n#DW jobdw capacity=1G\n");
        assert_eq!(
            v,
            vec![(MountKind::JobStriped, "DW_JOB_STRIPED".to_string())]
        );
    }
}
