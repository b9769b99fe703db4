//! `dwcli rm`: removing a resource, the request it sends, and the line printed (pools
//! and nodes are gone at once, the others are destroyed in the background).

use super::request::{delete, Request};
use crate::connect::{Answer, Failure};
use clap::Subcommand;
use spillway_api::model::*;
use spillway_api::paths;

#[derive(Subcommand, Debug, PartialEq)]
pub enum Rm {
    /// Remove an empty pool
    #[command(alias = "pools")]
    Pool {
        #[arg(long, visible_alias = "id")]
        name: String,
    },
    /// Remove a node that holds no fragments
    #[command(alias = "nodes")]
    Node {
        #[arg(long, visible_alias = "id")]
        name: String,
    },
    /// Destroy a session and everything in it
    #[command(alias = "sessions")]
    Session {
        #[arg(long)]
        id: u64,
    },
    /// Destroy an instance and its configurations
    #[command(alias = "instances")]
    Instance {
        #[arg(long)]
        id: u64,
    },
    /// Destroy a configuration and its activations
    #[command(alias = "configurations")]
    Configuration {
        #[arg(long)]
        id: u64,
    },
    /// Unmount and destroy an activation
    #[command(alias = "activations")]
    Activation {
        #[arg(long)]
        id: u64,
    },
}

pub fn rm_request(r: &Rm) -> Request {
    match r {
        Rm::Pool { name } => delete(paths::pool(name)),
        Rm::Node { name } => delete(paths::node(name)),
        Rm::Session { id } => delete(paths::session(*id)),
        Rm::Instance { id } => delete(paths::instance(*id)),
        Rm::Configuration { id } => delete(paths::configuration(*id)),
        Rm::Activation { id } => delete(paths::activation(*id)),
    }
}

/// Pools and nodes are gone when the answer comes; the others are destroyed in the
/// background, so the line says so and gives the state to follow in dwstat.
pub fn rm_summary(r: &Rm, a: &Answer) -> Result<String, Failure> {
    #[derive(serde::Deserialize)]
    struct Stated {
        id: u64,
        state: State,
    }
    let destroying = |kind: &str| -> Result<String, Failure> {
        let s: Stated = a.parse()?;
        Ok(format!(
            "destroying {kind} {} state={}",
            s.id,
            s.state.column()
        ))
    };
    Ok(match r {
        Rm::Pool { name } => format!("removed pool {name}"),
        Rm::Node { name } => format!("removed node {name}"),
        Rm::Session { .. } => destroying("session")?,
        Rm::Instance { .. } => destroying("instance")?,
        Rm::Configuration { .. } => destroying("configuration")?,
        Rm::Activation { .. } => destroying("activation")?,
    } + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dwcli::testing::{answer, ok, req, usage_error};
    use crate::dwcli::{Method, Verb};
    use serde_json::value::RawValue;

    #[test]
    fn rm_every_resource() {
        for (line, path) in [
            ("dwcli rm pool --name wlm_pool", "/dw/v1/pools/wlm_pool"),
            ("dwcli rm node --name nid00001", "/dw/v1/nodes/nid00001"),
            ("dwcli rm nodes --id nid00001", "/dw/v1/nodes/nid00001"),
            ("dwcli rm session --id 12", "/dw/v1/sessions/12"),
            ("dwcli rm instance --id 3", "/dw/v1/instances/3"),
            ("dwcli rm configuration --id 7", "/dw/v1/configurations/7"),
            ("dwcli rm activations --id 2", "/dw/v1/activations/2"),
        ] {
            let r = req(line);
            assert_eq!(
                (r.method, r.path.as_str(), r.body),
                (Method::Delete, path, None)
            );
        }
        assert!(usage_error("dwcli rm session --id abc").contains("--id"));
        assert!(usage_error("dwcli rm session").contains("--id"));
    }

    #[test]
    fn rm_summaries() {
        let sessions = include_str!("../../testdata/sessions.json");
        let verb = |line: &str| ok(line).verb;
        match verb("dwcli rm session --id 13") {
            Verb::Rm { what } => assert_eq!(
                rm_summary(&what, &answer(sessions, "sessions", 1)).unwrap(),
                "destroying session 13 state=D--T-\n"
            ),
            other => panic!("{other:?}"),
        }
        let deleted = Answer(RawValue::from_string(r#"{"deleted":"wlm_pool"}"#.into()).unwrap());
        match verb("dwcli rm pool --name wlm_pool") {
            Verb::Rm { what } => assert_eq!(
                rm_summary(&what, &deleted).unwrap(),
                "removed pool wlm_pool\n"
            ),
            other => panic!("{other:?}"),
        }
    }
}
