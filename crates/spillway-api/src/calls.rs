//! The typed calls of the control plane: one method of `ApiClient` per request the
//! workload-manager phases, the dw tools and the agent make, taking the request types
//! of `model` and answering its resources. Each is the path of `paths` plus the generic
//! `get`/`post`/... of `client`, so the bytes sent are the same as a hand-written call's.
//! Callers that print the manager's JSON as received (`dwcli --json`) use `paths` with
//! the generic calls instead.

use crate::model::*;
use crate::paths;
use crate::query::{DestroyQuery, StageListQuery, WaitQuery, WorkQuery};
use crate::{ApiClient, ApiError};
use serde::Deserialize;
use serde_json::Value;

type R<T> = Result<T, ApiError>;

/// What the API's root (`GET /dw/v1`) tells callers: where activations' default mount
/// points go (the resource list and OpenAPI link are for people).
#[derive(Clone, Debug, Deserialize)]
pub struct Resources {
    pub mount_root: String,
}

/// The answer of a `DELETE` with `?hurry=true`: the stage-outs it dropped (the rest of
/// the answer is the object being destroyed).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Destroyed {
    #[serde(default)]
    pub dropped_stages: Vec<u64>,
}

/// The lists, each under its collection's key (`{"pools": [...]}`).
#[derive(Deserialize)]
struct Pools {
    pools: Vec<Pool>,
}
#[derive(Deserialize)]
struct Nodes {
    nodes: Vec<Node>,
}
#[derive(Deserialize)]
struct Sessions {
    sessions: Vec<Session>,
}
#[derive(Deserialize)]
struct Instances {
    instances: Vec<Instance>,
}
#[derive(Deserialize)]
struct Configurations {
    configurations: Vec<Configuration>,
}
#[derive(Deserialize)]
struct Activations {
    activations: Vec<Activation>,
}
#[derive(Deserialize)]
struct Stages {
    stages: Vec<Stage>,
}

impl ApiClient {
    pub fn resources(&self) -> R<Resources> {
        self.get(paths::RESOURCES)
    }

    // -------------------------------------------------------------- lists
    pub fn list_pools(&self) -> R<Vec<Pool>> {
        Ok(self.get::<Pools>(paths::POOLS)?.pools)
    }

    pub fn list_nodes(&self) -> R<Vec<Node>> {
        Ok(self.get::<Nodes>(paths::NODES)?.nodes)
    }

    pub fn list_sessions(&self) -> R<Vec<Session>> {
        Ok(self.get::<Sessions>(paths::SESSIONS)?.sessions)
    }

    pub fn list_instances(&self) -> R<Vec<Instance>> {
        Ok(self.get::<Instances>(paths::INSTANCES)?.instances)
    }

    pub fn list_configurations(&self) -> R<Vec<Configuration>> {
        Ok(self
            .get::<Configurations>(paths::CONFIGURATIONS)?
            .configurations)
    }

    pub fn list_activations(&self) -> R<Vec<Activation>> {
        Ok(self.get::<Activations>(paths::ACTIVATIONS)?.activations)
    }

    pub fn list_stages(&self, q: &StageListQuery) -> R<Vec<Stage>> {
        Ok(self.get::<Stages>(&paths::stages_where(q))?.stages)
    }

    // -------------------------------------------------------------- one object
    pub fn session(&self, id: u64) -> R<Session> {
        self.get(&paths::session(id))
    }

    pub fn instance(&self, id: u64) -> R<Instance> {
        self.get(&paths::instance(id))
    }

    pub fn configuration(&self, id: u64) -> R<Configuration> {
        self.get(&paths::configuration(id))
    }

    pub fn activation(&self, id: u64) -> R<Activation> {
        self.get(&paths::activation(id))
    }

    /// A stage, once it has ended or after `wait_secs` (at most the manager's
    /// `WAIT_MAX`), whichever comes first.
    pub fn stage_waiting(&self, id: u64, wait_secs: u64) -> R<Stage> {
        self.get(&paths::stage_waiting(
            id,
            &WaitQuery {
                wait: Some(wait_secs),
            },
        ))
    }

    // -------------------------------------------------------------- changes
    pub fn create_session(&self, s: &NewSession) -> R<Session> {
        self.post(paths::SESSIONS, s)
    }

    pub fn create_instance(&self, i: &NewInstance) -> R<Instance> {
        self.post(paths::INSTANCES, i)
    }

    pub fn create_configuration(&self, c: &NewConfiguration) -> R<Configuration> {
        self.post(paths::CONFIGURATIONS, c)
    }

    pub fn create_activation(&self, a: &NewActivation) -> R<Activation> {
        self.post(paths::ACTIVATIONS, a)
    }

    pub fn create_stage(&self, s: &NewStage) -> R<Stage> {
        self.post(paths::STAGES, s)
    }

    pub fn update_session(&self, id: u64, u: &SessionUpdate) -> R<Session> {
        self.patch(&paths::session(id), u)
    }

    pub fn update_stage(&self, id: u64, u: &StageUpdate) -> R<Stage> {
        self.patch(&paths::stage(id), u)
    }

    /// Destroy a session; with `hurry`, its pending stage-outs are dropped (and listed).
    pub fn destroy_session(&self, id: u64, hurry: bool) -> R<Destroyed> {
        self.delete(&paths::session_destroy(
            id,
            &DestroyQuery {
                hurry: hurry.then_some(true),
            },
        ))
    }

    pub fn destroy_activation(&self, id: u64) -> R<Activation> {
        self.delete(&paths::activation(id))
    }

    // -------------------------------------------------------------- agents
    /// Register `node` and the addresses its mounts come from; answers what the
    /// manager recorded.
    pub fn agent_hello(&self, node: &str, hello: &AgentHello) -> R<Value> {
        self.put(&paths::agent(node), hello)
    }

    /// The work of `node`: at once without `version`, else when it differs from
    /// `version` or after `wait_secs`.
    pub fn agent_work(&self, node: &str, version: Option<u64>, wait_secs: u64) -> R<AgentWork> {
        let q = WorkQuery {
            version,
            wait: version.map(|_| wait_secs),
        };
        self.get(&paths::agent_work(node, &q))
    }

    pub fn agent_report(&self, node: &str, r: &AgentReport) -> R<Value> {
        self.post(&paths::agent_reports(node), r)
    }
}
