//! Finding a job's objects on the manager again from its token.

use super::{PhaseError, PhaseResult};
use spillway_api::{AccessMode, ApiClient, Configuration, Goal, Instance, Session};

/// The session of `token`: the live one (goal create) if there is one, else one being
/// torn down, else None.
pub fn find_session(api: &ApiClient, token: &str) -> PhaseResult<Option<Session>> {
    let mut found: Option<Session> = None;
    for s in api
        .list_sessions()?
        .into_iter()
        .filter(|s| s.token == token)
    {
        let better = match &found {
            None => true,
            Some(f) => f.state.goal != Goal::Create && s.state.goal == Goal::Create,
        };
        if better {
            found = Some(s);
        }
    }
    Ok(found)
}

/// A job's session with its instance and that instance's configurations (none for
/// jobs that only use persistent instances).
pub struct Job {
    pub session: Session,
    pub instance: Option<Instance>,
    pub configurations: Vec<Configuration>,
}

impl Job {
    pub fn find(api: &ApiClient, token: &str) -> PhaseResult<Job> {
        let session =
            find_session(api, token)?.ok_or_else(|| PhaseError::NoSession(token.into()))?;
        Job::of(api, session)
    }

    /// The job of a session already in hand (its instance and configurations fetched).
    pub fn of(api: &ApiClient, session: Session) -> PhaseResult<Job> {
        let instance = match session.links.instances.first() {
            Some(id) => Some(api.instance(*id)?),
            None => None,
        };
        let mut configurations = Vec::new();
        for id in instance.iter().flat_map(|i| &i.links.configurations) {
            configurations.push(api.configuration(*id)?);
        }
        Ok(Job {
            session,
            instance,
            configurations,
        })
    }

    /// The job instance's configuration of this access mode.
    pub fn configuration(&self, mode: AccessMode) -> Option<&Configuration> {
        self.configurations.iter().find(|c| c.access_mode == mode)
    }
}

/// A persistent instance a job attaches (`#DW persistentdw name=`).
pub struct PersistentUse {
    pub name: String,
    pub session: Session,
    pub instance: Instance,
    pub configuration: Configuration,
}

impl PersistentUse {
    pub fn find(api: &ApiClient, name: &str) -> PhaseResult<PersistentUse> {
        let missing = || PhaseError::Failed(format!("no persistent instance named {name:?}"));
        let session = find_session(api, name)?
            .filter(|s| s.state.goal == Goal::Create)
            .ok_or_else(missing)?;
        let iid = session.links.instances.first().ok_or_else(missing)?;
        let instance = api.instance(*iid)?;
        let cid = instance.links.configurations.first().ok_or_else(|| {
            PhaseError::Failed(format!(
                "the persistent instance {name:?} has no configuration yet"
            ))
        })?;
        let configuration = api.configuration(*cid)?;
        Ok(PersistentUse {
            name: name.to_string(),
            session,
            instance,
            configuration,
        })
    }
}

/// The live session of `token`, made now as `new` if there is none; `what` names the
/// token in messages ("token 42", "the persistent name scratch1"). A live session of
/// the token owned by another user is refused (`taken`: why); the manager makes at most
/// one live session per token (409 for a second, also when two callers race), and the
/// loser looks again.
pub(super) fn live_session_of(
    api: &ApiClient,
    new: &spillway_api::NewSession,
    what: &str,
    taken: &str,
) -> PhaseResult<Session> {
    let owner = new.owner;
    for _ in 0..2 {
        if let Some(s) = find_session(api, &new.token)?.filter(|s| s.state.goal == Goal::Create) {
            if Some(s.owner) != owner {
                return Err(PhaseError::Refused(format!("{what} {taken}")));
            }
            return Ok(s);
        }
        match api.create_session(new) {
            Ok(s) => return Ok(s),
            // Made by a concurrent call in between: look again.
            Err(spillway_api::ApiError::Status { status: 409, .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(PhaseError::Failed(format!(
        "{what} is in use by a session being torn down; try again when it is gone"
    )))
}

/// Wait until `instance` is built: every fragment on its server. A blown fuse (the
/// servers refused it repeatedly) fails at once with the reason.
pub(super) fn wait_built(api: &ApiClient, id: u64) -> PhaseResult<Instance> {
    super::wait_for(
        super::STORAGE_WAIT,
        || format!("instance {id} to be built on its servers"),
        || {
            let i = api.instance(id)?;
            if i.state.goal != Goal::Create {
                return Err(PhaseError::Failed(format!(
                    "instance {id} is being destroyed"
                )));
            }
            if i.state.fuse_blown {
                return Err(PhaseError::Failed(format!(
                    "instance {id} could not be built: its servers refused it repeatedly (dwstat instances/fragments show the state)"
                )));
            }
            Ok(i.state.actualized.then_some(i))
        },
    )
}
