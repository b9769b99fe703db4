//! `create_persistent`: a named session owned by the user, its public instance and a
//! configuration. Repeating it for the same owner finds what is already there.

use super::lookup::{live_session_of, Job};
use super::{PhaseError, PhaseResult};
use spillway_api::{
    AccessMode, ApiClient, ConfigType, NewConfiguration, NewInstance, NewSession, Session,
};

pub struct NewPersistent {
    pub name: String,
    pub owner: u32,
    pub pool: Option<String>,
    pub bytes: u64,
    pub access: AccessMode,
    pub kind: ConfigType,
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
    let configuration = match job.configurations.into_iter().next() {
        Some(c) => c,
        None => api.create_configuration(&NewConfiguration {
            instance: instance.id,
            kind: p.kind,
            access_mode: p.access,
            root_permissions: None,
            group: None,
            // A persistent cache has no PFS directory through Slurm (docs/cache.md,
            // open question 1): refused when its directive is read.
            pfs: None,
            modified_threshold: None,
            read_ahead: None,
            sync_on_close: None,
            sync_to_pfs: None,
        })?,
    };
    Ok(format!(
        "created persistent instance {}: session {}, instance {} of {} bytes in pool {}, configuration {}",
        p.name, session.id, instance.id, instance.capacity.bytes, instance.pool, configuration.id
    ))
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
