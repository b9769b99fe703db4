//! The path (and query string) of every request a caller makes: one builder per route
//! of `routes`, so no caller writes `"/dw/v1/..."` itself. Names (pools, nodes,
//! agents' nodes) are percent-encoded as path segments; numeric ids need no encoding.
//! The tests pin each builder to its route pattern.

use crate::query::{
    escape_segment, CountsQuery, DestroyQuery, FailuresQuery, StageListQuery, WaitQuery, WorkQuery,
};
use crate::routes;

/// The routes without captures are their own paths.
pub use crate::routes::{
    ACTIVATIONS, CONFIGURATIONS, FRAGMENTS, INSTANCES, NODES, POOLS, RESOURCES, SESSIONS, STAGES,
};

/// `pattern` with its one capture (`{id}`, `{node}`) replaced by `value`.
fn fill(pattern: &str, value: &str) -> String {
    match (pattern.find('{'), pattern.find('}')) {
        (Some(a), Some(b)) if a < b => format!("{}{value}{}", &pattern[..a], &pattern[b + 1..]),
        // Every pattern passed here has a capture (the tests check each one).
        _ => pattern.to_string(),
    }
}

pub fn pool(name: &str) -> String {
    fill(routes::POOL, &escape_segment(name))
}

pub fn node(name: &str) -> String {
    fill(routes::NODE, &escape_segment(name))
}

pub fn session(id: u64) -> String {
    fill(routes::SESSION, &id.to_string())
}

/// `DELETE` of a session, with `?hurry=` if asked.
pub fn session_destroy(id: u64, q: &DestroyQuery) -> String {
    session(id) + &q.encode()
}

pub fn instance(id: u64) -> String {
    fill(routes::INSTANCE, &id.to_string())
}

/// `DELETE` of an instance, with `?hurry=` if asked.
pub fn instance_destroy(id: u64, q: &DestroyQuery) -> String {
    instance(id) + &q.encode()
}

pub fn fragment(id: u64) -> String {
    fill(routes::FRAGMENT, &id.to_string())
}

pub fn configuration(id: u64) -> String {
    fill(routes::CONFIGURATION, &id.to_string())
}

pub fn activation(id: u64) -> String {
    fill(routes::ACTIVATION, &id.to_string())
}

/// The stages the query selects (all with an empty query).
pub fn stages_where(q: &StageListQuery) -> String {
    format!("{STAGES}{}", q.encode())
}

pub fn stage(id: u64) -> String {
    fill(routes::STAGE, &id.to_string())
}

/// A stage, answered when it ends or `q.wait` seconds pass.
pub fn stage_waiting(id: u64, q: &WaitQuery) -> String {
    stage(id) + &q.encode()
}

pub fn stage_actions(instance: u64) -> String {
    fill(routes::STAGE_ACTIONS, &instance.to_string())
}

pub fn stage_counts(instance: u64, q: &CountsQuery) -> String {
    fill(routes::STAGE_COUNTS, &instance.to_string()) + &q.encode()
}

pub fn stage_failures(instance: u64, q: &FailuresQuery) -> String {
    fill(routes::STAGE_FAILURES, &instance.to_string()) + &q.encode()
}

pub fn stage_concurrency(instance: u64) -> String {
    fill(routes::STAGE_CONCURRENCY, &instance.to_string())
}

/// An agent's hello (`PUT`).
pub fn agent(node: &str) -> String {
    fill(routes::AGENT, &escape_segment(node))
}

/// An agent's long poll for work.
pub fn agent_work(node: &str, q: &WorkQuery) -> String {
    fill(routes::AGENT_WORK, &escape_segment(node)) + &q.encode()
}

pub fn agent_reports(node: &str) -> String {
    fill(routes::AGENT_REPORTS, &escape_segment(node))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StageScope;

    #[test]
    fn builders_fill_their_patterns() {
        let id = |p: &str| p.replace("{id}", "42");
        let named = |p: &str| p.replace("{node}", "nid1");
        assert_eq!(pool("42"), id(routes::POOL));
        assert_eq!(node("42"), id(routes::NODE));
        assert_eq!(session(42), id(routes::SESSION));
        assert_eq!(instance(42), id(routes::INSTANCE));
        assert_eq!(fragment(42), id(routes::FRAGMENT));
        assert_eq!(configuration(42), id(routes::CONFIGURATION));
        assert_eq!(activation(42), id(routes::ACTIVATION));
        assert_eq!(stage(42), id(routes::STAGE));
        assert_eq!(stage_actions(42), id(routes::STAGE_ACTIONS));
        assert_eq!(stage_concurrency(42), id(routes::STAGE_CONCURRENCY));
        assert_eq!(
            stage_failures(42, &FailuresQuery::default()),
            id(routes::STAGE_FAILURES)
        );
        let counts = CountsQuery {
            path: "/".into(),
            scope: None,
            wait: None,
        };
        assert_eq!(
            stage_counts(42, &counts),
            id(routes::STAGE_COUNTS) + "?path=/"
        );
        assert_eq!(agent("nid1"), named(routes::AGENT));
        assert_eq!(
            agent_work("nid1", &WorkQuery::default()),
            named(routes::AGENT_WORK)
        );
        assert_eq!(agent_reports("nid1"), named(routes::AGENT_REPORTS));
    }

    #[test]
    fn paths_as_sent() {
        assert_eq!(pool("wlm_pool"), "/dw/v1/pools/wlm_pool");
        assert_eq!(node("a/b"), "/dw/v1/nodes/a%2Fb");
        assert_eq!(
            session_destroy(12, &DestroyQuery { hurry: Some(true) }),
            "/dw/v1/sessions/12?hurry=true"
        );
        assert_eq!(
            instance_destroy(3, &DestroyQuery::default()),
            "/dw/v1/instances/3"
        );
        assert_eq!(
            stages_where(&StageListQuery {
                session: Some(9),
                ..Default::default()
            }),
            "/dw/v1/stages?session=9"
        );
        assert_eq!(stages_where(&StageListQuery::default()), "/dw/v1/stages");
        assert_eq!(
            stage_waiting(7, &WaitQuery { wait: Some(30) }),
            "/dw/v1/stages/7?wait=30"
        );
        assert_eq!(
            stage_counts(
                7,
                &CountsQuery {
                    path: "/x y".into(),
                    scope: Some(StageScope::File),
                    wait: None
                }
            ),
            "/dw/v1/instances/7/stage_counts?path=/x%20y&scope=file"
        );
        assert_eq!(
            stage_failures(
                7,
                &FailuresQuery {
                    after: Some("/d/".into()),
                    limit: Some(1000)
                }
            ),
            "/dw/v1/instances/7/stage_failures?after=/d/&limit=1000"
        );
        assert_eq!(
            agent_work(
                "nid1",
                &WorkQuery {
                    version: Some(3),
                    wait: Some(25)
                }
            ),
            "/dw/v1/agents/nid1/work?version=3&wait=25"
        );
    }
}
