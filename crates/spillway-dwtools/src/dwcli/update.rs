//! `dwcli update`: changing a node or a session, the request each sends, and the line
//! printed with the changed object.

use super::request::{patch, Request};
use crate::args::{self, HostList};
use crate::connect::{Answer, Failure};
use crate::format;
use clap::{ArgGroup, Subcommand};
use spillway_api::model::*;
use spillway_api::paths;

#[derive(Subcommand, Debug, PartialEq)]
pub enum Update {
    /// Move, drain or limit a node, or replace the blown fuses of its objects
    #[command(alias = "nodes")]
    #[command(group(ArgGroup::new("change").required(true).multiple(true)
        .args(["pool", "drain", "no_drain", "capacity", "replace_fuse"])))]
    Node {
        #[arg(long)]
        name: String,
        /// Move to this pool ("" takes the node out of its pool)
        #[arg(long)]
        pool: Option<String>,
        /// Take the node out of allocation (its instances stay)
        #[arg(long, conflicts_with = "no_drain")]
        drain: bool,
        /// Put the node back into allocation
        #[arg(long)]
        no_drain: bool,
        /// Offer at most this much (0 removes the limit)
        #[arg(long, value_parser = args::size, value_name = "SIZE")]
        capacity: Option<u64>,
        /// Reset the failure counters of every object on this node
        #[arg(long)]
        replace_fuse: bool,
    },
    /// Change a session's client nodes, or replace its blown fuses
    #[command(alias = "sessions")]
    #[command(group(ArgGroup::new("change").required(true).multiple(true)
        .args(["hosts", "replace_fuse"])))]
    Session {
        #[arg(long)]
        id: u64,
        /// The new client node list, comma-separated ("" for none)
        #[arg(long, value_parser = args::hosts, value_name = "HOST[,..]")]
        hosts: Option<HostList>,
        /// Reset the failure counters of the session's objects (admins only)
        #[arg(long)]
        replace_fuse: bool,
    },
}

pub fn update_request(u: &Update) -> Request {
    match u {
        Update::Node {
            name,
            pool,
            drain,
            no_drain,
            capacity,
            replace_fuse,
        } => patch(
            paths::node(name),
            &NodeUpdate {
                pool: pool.clone(),
                drain: match (drain, no_drain) {
                    (true, _) => Some(true),
                    (_, true) => Some(false),
                    _ => None,
                },
                capacity: *capacity,
                replace_fuse: replace_fuse.then_some(true),
            },
        ),
        Update::Session {
            id,
            hosts,
            replace_fuse,
        } => patch(
            paths::session(*id),
            &SessionUpdate {
                client_nodes: hosts.clone().map(|h| h.0),
                replace_fuse: replace_fuse.then_some(true),
            },
        ),
    }
}

pub fn update_summary(u: &Update, a: &Answer) -> Result<String, Failure> {
    Ok(match u {
        Update::Node { .. } => {
            let n: Node = a.parse()?;
            format!(
                "updated node {} pool={} online={} drain={} capacity={}",
                n.id,
                format::text(n.pool.as_deref().unwrap_or("")),
                format::boolean(n.online),
                format::boolean(n.drain),
                format::size(n.capacity)
            )
        }
        Update::Session { .. } => {
            let s: Session = a.parse()?;
            format!(
                "updated session {} state={} nodes={}",
                s.id,
                s.state.column(),
                s.links.client_nodes.len()
            )
        }
    } + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dwcli::testing::{answer, ok, req, usage_error};
    use crate::dwcli::{Cli, Method, Verb};
    use clap::Parser;
    use serde_json::json;

    #[test]
    fn update_node() {
        let r = req("dwcli update node --name nid00001 --pool wlm_pool");
        assert_eq!(r.method, Method::Patch);
        assert_eq!(r.path, "/dw/v1/nodes/nid00001");
        assert_eq!(
            r.body,
            Some(
                json!({"pool": "wlm_pool", "drain": null, "capacity": null, "replace_fuse": null})
            )
        );
        assert_eq!(
            req("dwcli update node --name n --drain --capacity 0 --replace-fuse").body,
            Some(json!({"pool": null, "drain": true, "capacity": 0, "replace_fuse": true}))
        );
        assert_eq!(
            req("dwcli update nodes --name n --no-drain").body,
            Some(json!({"pool": null, "drain": false, "capacity": null, "replace_fuse": null}))
        );
        assert!(usage_error("dwcli update node --name n --drain --no-drain")
            .contains("cannot be used with"));
        assert!(usage_error("dwcli update node --name n").contains("required"));
    }

    #[test]
    fn update_session() {
        let r = req("dwcli update session --id 13 --hosts nid3,nid4");
        assert_eq!(r.method, Method::Patch);
        assert_eq!(r.path, "/dw/v1/sessions/13");
        assert_eq!(
            r.body,
            Some(json!({"client_nodes": ["nid3", "nid4"], "replace_fuse": null}))
        );
        assert_eq!(
            req("dwcli update session --id 13 --replace-fuse").body,
            Some(json!({"client_nodes": null, "replace_fuse": true}))
        );
        // an empty list takes every client node out
        let r = Cli::try_parse_from(["dwcli", "update", "session", "--id", "1", "--hosts", ""]);
        let body = match r.map(|c| c.verb) {
            Ok(Verb::Update { what }) => update_request(&what).body,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            body,
            Some(json!({"client_nodes": [], "replace_fuse": null}))
        );
        assert!(usage_error("dwcli update session --id 13").contains("required"));
    }

    #[test]
    fn update_summaries() {
        let nodes = include_str!("../../testdata/nodes.json");
        let sessions = include_str!("../../testdata/sessions.json");
        let verb = |line: &str| ok(line).verb;
        match verb("dwcli update node --name nid00001 --drain") {
            Verb::Update { what } => assert_eq!(
                update_summary(&what, &answer(nodes, "nodes", 0)).unwrap(),
                "updated node nid00001 pool=wlm_pool online=true drain=false capacity=3.64TiB\n"
            ),
            other => panic!("{other:?}"),
        }
        match verb("dwcli update session --id 13 --hosts a") {
            Verb::Update { what } => assert_eq!(
                update_summary(&what, &answer(sessions, "sessions", 1)).unwrap(),
                "updated session 13 state=D--T- nodes=4\n"
            ),
            other => panic!("{other:?}"),
        }
    }
}
