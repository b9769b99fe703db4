//! `create_persistent`: a named session owned by the user, its public instance and a
//! configuration. Repeating it for the same owner finds what is already there.
//!
//! A persistent cache through Slurm comes in two steps: Slurm's `create_persistent`
//! passes no PFS directory (spec §1.3), so it makes the session and the instance, and
//! the same job's `setup`, which gets the job script, makes the cache configuration
//! from the `#BB create_persistent ... type=cache pfs=DIR` line
//! (`configure_persistent_caches`; docs/cache.md, "Persistent cache instances").

use super::lookup::{find_session, live_session_of, Job};
use super::{PhaseError, PhaseResult};
use crate::directive::{CachePolicy, CreatePersistent, InstanceType};
use spillway_api::{
    AccessMode, ApiClient, ConfigType, Goal, NewConfiguration, NewInstance, NewSession, Session,
};

pub struct NewPersistent {
    pub name: String,
    pub owner: u32,
    pub pool: Option<String>,
    pub bytes: u64,
    pub access: AccessMode,
    pub kind: ConfigType,
    /// A cache's PFS directory; None for a cache made by Slurm's `create_persistent`
    /// (its configuration waits for the job's setup).
    pub pfs: Option<String>,
    pub policy: CachePolicy,
}

impl NewPersistent {
    /// The instance a `#BB create_persistent` line asks for, for `owner`.
    pub fn of(c: &CreatePersistent, owner: u32) -> NewPersistent {
        NewPersistent {
            name: c.name.clone(),
            owner,
            pool: c.pool.clone(),
            bytes: c.capacity,
            access: if c.access.ldbal {
                AccessMode::Ldbal
            } else {
                AccessMode::Stripe
            },
            kind: match c.kind {
                InstanceType::Cache => ConfigType::Cache,
                InstanceType::Scratch => ConfigType::Scratch,
            },
            pfs: c.pfs.clone(),
            policy: c.policy.clone(),
        }
    }

    fn configuration(&self, instance: u64) -> NewConfiguration {
        let cache = self.kind == ConfigType::Cache;
        NewConfiguration {
            instance,
            kind: self.kind,
            access_mode: self.access,
            root_permissions: None,
            group: None,
            pfs: self.pfs.clone().filter(|_| cache),
            modified_threshold: self.policy.modified_threshold,
            read_ahead: self.policy.read_ahead,
            sync_on_close: self.policy.sync_on_close,
            sync_to_pfs: self.policy.sync_to_pfs,
        }
    }
}

/// Returns a line with the word `created` (what Slurm looks for).
pub fn create_persistent(api: &ApiClient, p: &NewPersistent) -> PhaseResult<String> {
    if p.name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(PhaseError::Failed(format!(
            "persistent name {} starts with a digit (names of digits are job ids)",
            crate::input::shown(&p.name)
        )));
    }
    let session = owned_session(api, p)?;
    let job = Job::of(api, session.clone())?;
    let instance = match job.instance {
        Some(i) => i,
        None => api.create_instance(&NewInstance {
            session: session.id,
            capacity: p.bytes,
            pool: p.pool.clone(),
            label: None,
            public: Some(true),
            policy: None,
            limits: None,
            stripe_size: None,
            expiration: None,
        })?,
    };
    let made = format!(
        "created persistent instance {}: session {}, instance {} of {} bytes in pool {}",
        p.name, session.id, instance.id, instance.capacity.bytes, instance.pool
    );
    let configuration = match job.configurations.into_iter().next() {
        Some(c) => c,
        // Slurm's create_persistent names no directory: the job's setup gives it.
        None if p.kind == ConfigType::Cache && p.pfs.is_none() => {
            return Ok(format!(
                "{made}; a cache: its configuration is made at the job's setup, from the pfs= of its #BB create_persistent line"
            ))
        }
        None => api.create_configuration(&p.configuration(instance.id))?,
    };
    Ok(format!("{made}, configuration {}", configuration.id))
}

/// At a job's setup: the configuration of each persistent cache instance the job's
/// `#BB create_persistent ... type=cache pfs=DIR` lines made through Slurm, whose
/// `create_persistent` could not know the directory. Already configured: checked to
/// be the cache the line asks for. Returns what it did, a line each.
pub fn configure_persistent_caches(
    api: &ApiClient,
    creates: &[CreatePersistent],
    owner: u32,
) -> PhaseResult<Vec<String>> {
    let mut said = Vec::new();
    for c in creates.iter().filter(|c| c.kind == InstanceType::Cache) {
        let p = NewPersistent::of(c, owner);
        let shown = crate::input::shown(&c.name);
        let session = find_session(api, &c.name)?
            .filter(|s| s.state.goal == Goal::Create && s.owner == owner)
            .ok_or_else(|| {
                PhaseError::Failed(format!(
                    "#BB create_persistent name={shown}: no persistent instance of this name and user was created (did create_persistent run?)"
                ))
            })?;
        let job = Job::of(api, session)?;
        let instance = job.instance.as_ref().ok_or_else(|| {
            PhaseError::Failed(format!(
                "#BB create_persistent name={shown}: the persistent session has no instance"
            ))
        })?;
        match job.configurations.first() {
            None => {
                let made = api.create_configuration(&p.configuration(instance.id))?;
                said.push(format!(
                    "persistent cache {shown}: configuration {} of {}",
                    made.id,
                    crate::input::shown(p.pfs.as_deref().unwrap_or(""))
                ));
            }
            Some(have) if have.kind == ConfigType::Cache && have.pfs == p.pfs => {}
            Some(have) => {
                return Err(PhaseError::Failed(format!(
                    "#BB create_persistent name={shown}: the persistent instance is already a {} {} of {}, not the cache of {} this line asks for",
                    have.kind.as_str(),
                    have.access_mode.as_str(),
                    crate::input::shown(have.pfs.as_deref().unwrap_or("-")),
                    crate::input::shown(p.pfs.as_deref().unwrap_or("")),
                )))
            }
        }
    }
    Ok(said)
}

/// The live session named `p.name`, made now for `p.owner` if there is none. A name
/// held by another user's live instance is refused (names are global), also when two
/// users race for it: the manager makes at most one live session per token (409 for
/// the second), and the loser looks again.
fn owned_session(api: &ApiClient, p: &NewPersistent) -> PhaseResult<Session> {
    live_session_of(
        api,
        &NewSession {
            token: p.name.clone(),
            owner: Some(p.owner),
            creator: Some("CLI".into()),
            client_nodes: Vec::new(),
            expiration: None,
        },
        &format!("the persistent name {}", crate::input::shown(&p.name)),
        "is taken by another user's instance (names are global); choose another",
    )
}
