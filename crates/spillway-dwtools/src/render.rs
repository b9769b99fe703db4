//! dwstat's tables, one renderer per resource, from the manager's list answers.
//!
//! Columns and their order are DataWarp's (the compatibility spec, section 5.3): users
//! script against positions (`dwstat instances | grep <sess>`, 5th column = servers), so
//! they never change. Activations have no known DataWarp columns; ours are documented in
//! docs/cli.md.
//!
//! Failures the manager reports that no column can hold (a node's mount error, a
//! server's heartbeat error) are printed as lines after the table, each naming the
//! object, so that `dwstat ... | grep <id>` shows them too.

use crate::format::{self, Zone};
use crate::table::Table;
use serde::Deserialize;
use spillway_api::model::*;
use spillway_api::paths;
pub use spillway_types::errno::errno_name;
use std::collections::{BTreeMap, HashMap};

/// A resource that has a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Resource {
    #[value(alias = "pool")]
    Pools,
    #[value(alias = "node")]
    Nodes,
    #[value(alias = "session")]
    Sessions,
    #[value(alias = "instance")]
    Instances,
    #[value(alias = "configuration")]
    Configurations,
    #[value(alias = "fragment")]
    Fragments,
    #[value(alias = "activation")]
    Activations,
    #[value(alias = "stage")]
    Stages,
}

impl Resource {
    /// The member of the list answer: the last part of the collection's path.
    pub fn key(self) -> &'static str {
        let path = self.path();
        path.rsplit('/').next().unwrap_or(path)
    }

    /// The collection's path.
    pub fn path(self) -> &'static str {
        match self {
            Resource::Pools => paths::POOLS,
            Resource::Nodes => paths::NODES,
            Resource::Sessions => paths::SESSIONS,
            Resource::Instances => paths::INSTANCES,
            Resource::Configurations => paths::CONFIGURATIONS,
            Resource::Fragments => paths::FRAGMENTS,
            Resource::Activations => paths::ACTIVATIONS,
            Resource::Stages => paths::STAGES,
        }
    }
}

/// Every list answer's shape at once: the manager answers `{"<resource>": [...]}`, and
/// only the member asked for is expected to be present. Unknown members are ignored, so
/// a newer manager that adds paging fields still works.
#[derive(Deserialize, Default)]
struct Lists {
    pools: Option<Vec<Pool>>,
    nodes: Option<Vec<Node>>,
    sessions: Option<Vec<Session>>,
    instances: Option<Vec<Instance>>,
    configurations: Option<Vec<Configuration>>,
    fragments: Option<Vec<Fragment>>,
    activations: Option<Vec<Activation>>,
    stages: Option<Vec<Stage>>,
}

fn missing(r: Resource) -> String {
    format!(
        "unexpected answer from the manager: no \"{}\" list",
        r.key()
    )
}

fn parse(raw: &str) -> Result<Lists, String> {
    serde_json::from_str(raw).map_err(|e| format!("unexpected answer from the manager: {e}"))
}

/// The nodes of a `nodes` list answer (the fragments table needs them for `gran`).
pub fn nodes_of(raw: &str) -> Result<Vec<Node>, String> {
    parse(raw)?.nodes.ok_or_else(|| missing(Resource::Nodes))
}

/// The table of `resource` from the manager's list answer `raw`. `nodes`: the node
/// list, needed only for fragments.
pub fn table(
    resource: Resource,
    raw: &str,
    nodes: Option<&[Node]>,
    zone: Zone,
) -> Result<String, String> {
    let l = parse(raw)?;
    let m = || missing(resource);
    Ok(match resource {
        Resource::Pools => pools(&l.pools.ok_or_else(m)?),
        Resource::Nodes => self::nodes(&l.nodes.ok_or_else(m)?),
        Resource::Sessions => sessions(&l.sessions.ok_or_else(m)?, zone),
        Resource::Instances => instances(&l.instances.ok_or_else(m)?, zone),
        Resource::Configurations => configurations(&l.configurations.ok_or_else(m)?),
        Resource::Fragments => fragments(&l.fragments.ok_or_else(m)?, nodes.unwrap_or(&[])),
        Resource::Activations => activations(&l.activations.ok_or_else(m)?),
        Resource::Stages => stages(&l.stages.ok_or_else(m)?),
    })
}

pub fn pools(pools: &[Pool]) -> String {
    Table::list("pool units quantity free gran", pools, |p| {
        vec![
            format::text(&p.id),
            format::text(&p.units),
            format::granules(p.quantity, p.granularity),
            format::granules(p.free, p.granularity),
            format::size(p.granularity),
        ]
    })
}

pub fn nodes(nodes: &[Node]) -> String {
    let mut t = Table::with_header("node pool online drain gran capacity insts activs");
    let mut notes = String::new();
    for n in nodes {
        t.row(vec![
            format::text(&n.id),
            format::text(n.pool.as_deref().unwrap_or("")),
            format::boolean(n.online).into(),
            format::boolean(n.drain).into(),
            // 0 means "no pool": no granularity rather than a 0B one
            if n.granularity == 0 {
                "-".into()
            } else {
                format::size(n.granularity)
            },
            format::size(n.capacity),
            n.links.instances.len().to_string(),
            n.links.activations.len().to_string(),
        ]);
        // `offline` is already the online column; anything else but `ok` is the last
        // heartbeat's error, which the admin needs to see.
        if n.health != "ok" && n.health != "offline" {
            notes.push_str(&format!("node {} health: {}\n", n.id, n.health));
        }
    }
    t.render() + &notes
}

pub fn sessions(sessions: &[Session], zone: Zone) -> String {
    Table::list(
        "sess state token creator owner created expiration nodes",
        sessions,
        |s| {
            vec![
                s.id.to_string(),
                s.state.column(),
                format::text(&s.token),
                format::text(&s.creator),
                s.owner.to_string(),
                format::time(s.created, zone),
                format::expiration(s.expiration, zone),
                s.links.client_nodes.len().to_string(),
            ]
        },
    )
}

pub fn instances(instances: &[Instance], zone: Zone) -> String {
    Table::list(
        "inst state sess bytes nodes created expiration intact label public confs",
        instances,
        |i| {
            vec![
                i.id.to_string(),
                i.state.column(),
                i.links.session.to_string(),
                format::size(i.capacity.bytes),
                i.capacity.nodes.to_string(),
                format::time(i.created, zone),
                format::expiration(i.expiration, zone),
                format::boolean(i.intact).into(),
                format::text(&i.label),
                if i.public { "public" } else { "private" }.into(),
                i.links.configurations.len().to_string(),
            ]
        },
    )
}

pub fn configurations(confs: &[Configuration]) -> String {
    Table::list("conf state inst type access_type activs", confs, |c| {
        vec![
            c.id.to_string(),
            c.state.column(),
            c.links.instance.to_string(),
            c.kind.as_str().into(),
            c.access_mode.as_str().into(),
            c.links.activations.len().to_string(),
        ]
    })
}

/// `gran` is the granularity of the pool of the fragment's node (a node cannot change
/// pools while it holds fragments, so that is the instance's pool); `-` if the node is
/// not in `nodes`.
pub fn fragments(frags: &[Fragment], nodes: &[Node]) -> String {
    let gran: HashMap<&str, u64> = nodes
        .iter()
        .map(|n| (n.id.as_str(), n.granularity))
        .collect();
    let mut t = Table::with_header("frag state inst capacity gran node");
    for f in frags {
        t.row(vec![
            f.id.to_string(),
            f.state.column(),
            f.links.instance.to_string(),
            format::size(f.capacity),
            match gran.get(f.node.as_str()) {
                Some(&g) if g > 0 => format::size(g),
                _ => "-".into(),
            },
            format::text(&f.node),
        ]);
    }
    t.render()
}

/// Columns `activ state sess conf nodes mount status`: `nodes` is the number of client
/// nodes, `status` what their agents reported (see `status_summary`). After the table,
/// one line per node whose mount or unmount failed, with the agent's message.
pub fn activations(acts: &[Activation]) -> String {
    let mut t = Table::with_header("activ state sess conf nodes mount status");
    let mut notes = String::new();
    for a in acts {
        t.row(vec![
            a.id.to_string(),
            a.state.column(),
            a.links.session.to_string(),
            a.links.configuration.to_string(),
            a.nodes.len().to_string(),
            format::text(&a.mount),
            status_summary(&a.nodes),
        ]);
        for n in &a.nodes {
            if n.status == "failed" || n.error.is_some() {
                notes.push_str(&format!(
                    "activation {} on {}: {}: {}\n",
                    a.id,
                    n.node,
                    n.status,
                    n.error.as_deref().unwrap_or("no message from the agent")
                ));
            }
        }
    }
    t.render() + &notes
}

/// Stages (Spillway's columns; DataWarp's are not known): `files` and `bytes` are
/// `done/total` (`?` for a total not known yet: the stage has not enumerated its
/// files), `failed` the files that failed. A failed stage's reason follows the table.
pub fn stages(stages: &[Stage]) -> String {
    let mut t = Table::with_header("stage inst owner dir type state files failed bytes server");
    let mut notes = String::new();
    for s in stages {
        let (files_total, bytes_total) = if s.enumerated {
            (s.files_total.to_string(), format::size(s.bytes_total))
        } else {
            ("?".to_string(), "?".to_string())
        };
        t.row(vec![
            s.id.to_string(),
            s.instance.to_string(),
            s.owner.to_string(),
            s.direction.as_str().into(),
            s.kind.as_str().into(),
            s.state.as_str().into(),
            format!("{}/{files_total}", s.files_done),
            s.files_failed.to_string(),
            format!("{}/{bytes_total}", format::size(s.bytes_done)),
            format::text(s.server.as_deref().unwrap_or("")),
        ]);
        if let Some(e) = &s.error {
            notes.push_str(&format!(
                "stage {} {}: {}: {}: {}\n",
                s.id,
                s.state.as_str(),
                e.path,
                errno_name(e.errno),
                e.message
            ));
        }
    }
    t.render() + &notes
}

/// The per-node statuses in one word: the status itself when every node has the same
/// one (`mounted`), else `status:count` pairs (`mounted:3,failed:1`) in lifecycle order
/// (pending, mounted, unmounted, failed, then any other alphabetically); `-` without
/// client nodes.
pub fn status_summary(nodes: &[ActivationNode]) -> String {
    const ORDER: [&str; 4] = ["pending", "mounted", "unmounted", "failed"];
    let mut counts: BTreeMap<(usize, &str), usize> = BTreeMap::new();
    for n in nodes {
        let rank = ORDER
            .iter()
            .position(|s| *s == n.status)
            .unwrap_or(ORDER.len());
        *counts.entry((rank, n.status.as_str())).or_default() += 1;
    }
    match counts.len() {
        0 => "-".into(),
        1 => counts
            .keys()
            .next()
            .map(|(_, s)| format::text(s))
            .unwrap_or_default(),
        _ => counts
            .iter()
            .map(|((_, s), c)| format!("{}:{c}", format::text(s)))
            .collect::<Vec<_>>()
            .join(","),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOLS: &str = include_str!("../testdata/pools.json");
    const NODES: &str = include_str!("../testdata/nodes.json");
    const SESSIONS: &str = include_str!("../testdata/sessions.json");
    const INSTANCES: &str = include_str!("../testdata/instances.json");
    const CONFIGURATIONS: &str = include_str!("../testdata/configurations.json");
    const FRAGMENTS: &str = include_str!("../testdata/fragments.json");
    const ACTIVATIONS: &str = include_str!("../testdata/activations.json");

    fn render(r: Resource, raw: &str) -> String {
        let nodes = nodes_of(NODES).unwrap();
        table(r, raw, Some(&nodes), Zone::Utc).unwrap()
    }

    /// A golden table: the literal below without its first newline.
    fn golden(text: &str) -> String {
        text.strip_prefix('\n').unwrap_or(text).to_string()
    }

    #[test]
    fn pools_table() {
        assert_eq!(
            render(Resource::Pools, POOLS),
            golden(
                r"
pool     units quantity free    gran
wlm_pool bytes 7.28TiB  7.28TiB 1GiB
small    bytes 160MiB   48MiB   16MiB
"
            )
        );
    }

    #[test]
    fn nodes_table_with_heartbeat_error_after_it() {
        assert_eq!(
            render(Resource::Nodes, NODES),
            golden(
                r"
node     pool     online drain gran capacity insts activs
nid00001 wlm_pool true   false 1GiB 3.64TiB  2     1
nid00002 -        false  true  -    0B       0     0
nid00003 wlm_pool false  false 1GiB 1TiB     1     0
node nid00003 health: heartbeat: connection refused
"
            )
        );
    }

    #[test]
    fn sessions_table() {
        assert_eq!(
            render(Resource::Sessions, SESSIONS),
            golden(
                r"
sess state token  creator owner created             expiration          nodes
12   CA--- refdb  CLI     1017  2026-11-22T02:10:00 never               0
13   D--T- 169508 SLURM   1017  2026-11-22T02:11:00 2026-11-23T02:11:00 4
"
            )
        );
    }

    #[test]
    fn instances_table_fifth_column_is_servers() {
        let out = render(Resource::Instances, INSTANCES);
        assert_eq!(
            out,
            golden(
                r"
inst state sess bytes  nodes created             expiration          intact label public  confs
3    CA--- 12   2TiB   1     2026-11-22T02:10:00 never               true   refdb public  1
4    C-FTM 13   400GiB 2     2026-11-22T02:11:01 2026-11-23T02:11:00 false  I4-0  private 2
"
            )
        );
        // `dwstat instances | grep <sess>`, then the 5th column, as users script it
        let row = out.lines().find(|l| l.contains(" 13 ")).unwrap_or_default();
        assert_eq!(row.split_whitespace().nth(4), Some("2"));
    }

    #[test]
    fn configurations_table() {
        assert_eq!(
            render(Resource::Configurations, CONFIGURATIONS),
            golden(
                r"
conf state inst type    access_type activs
7    CA--- 3    scratch stripe      0
8    CA--- 4    scratch private     1
9    D--T- 4    swap    ldbal       0
"
            )
        );
    }

    #[test]
    fn fragments_table_granularity_from_the_node() {
        assert_eq!(
            render(Resource::Fragments, FRAGMENTS),
            golden(
                r"
frag state inst capacity gran node
5    CA--- 3    2TiB     1GiB nid00001
6    CA--- 4    200GiB   1GiB nid00001
7    C-F-- 4    200GiB   1GiB nid00003
10   D--T- 11   1GiB     -    gone01
"
            )
        );
    }

    #[test]
    fn activations_table_shows_failures() {
        assert_eq!(
            render(Resource::Activations, ACTIVATIONS),
            golden(
                r"
activ state sess conf nodes mount                          status
2     C--TM 13   8    4     /var/opt/spillway/mounts/13/ss pending:1,mounted:2,failed:1
3     CA--- 12   7    1     /mnt/refdb                     mounted
4     D-F-- 12   7    0     /mnt/empty                     -
activation 2 on nid00102: failed: mount: /var/opt/spillway/mounts/13/ss: fuse: device not found
"
            )
        );
    }

    #[test]
    fn empty_lists_print_the_header() {
        for (r, header) in [
            (Resource::Pools, "pool units quantity free gran\n"),
            (
                Resource::Nodes,
                "node pool online drain gran capacity insts activs\n",
            ),
            (
                Resource::Sessions,
                "sess state token creator owner created expiration nodes\n",
            ),
            (
                Resource::Instances,
                "inst state sess bytes nodes created expiration intact label public confs\n",
            ),
            (
                Resource::Configurations,
                "conf state inst type access_type activs\n",
            ),
            (Resource::Fragments, "frag state inst capacity gran node\n"),
            (
                Resource::Activations,
                "activ state sess conf nodes mount status\n",
            ),
        ] {
            let raw = format!("{{\"{}\":[]}}", r.key());
            assert_eq!(table(r, &raw, None, Zone::Utc).unwrap(), header);
        }
    }

    #[test]
    fn wrong_answers_are_errors() {
        let e = table(Resource::Pools, r#"{"sessions":[]}"#, None, Zone::Utc).unwrap_err();
        assert!(e.contains("no \"pools\" list"), "{e}");
        let e = table(Resource::Pools, r#"{"pools":[{"id":1}]}"#, None, Zone::Utc).unwrap_err();
        assert!(e.starts_with("unexpected answer from the manager"), "{e}");
        assert!(table(Resource::Pools, "not json", None, Zone::Utc).is_err());
    }

    #[test]
    fn status_summaries() {
        let n = |s: &str| ActivationNode {
            node: "n".into(),
            status: s.into(),
            error: None,
        };
        assert_eq!(status_summary(&[]), "-");
        assert_eq!(status_summary(&[n("mounted"), n("mounted")]), "mounted");
        assert_eq!(
            status_summary(&[n("failed"), n("mounted"), n("weird"), n("unmounted")]),
            "mounted:1,unmounted:1,failed:1,weird:1"
        );
    }

    #[test]
    fn state_columns() {
        let st = |goal, actualized, fuse_blown, transitioning, mixed| State {
            goal,
            actualized,
            fuse_blown,
            mixed,
            transitioning,
        };
        assert_eq!(
            st(Goal::Create, true, false, false, false).column(),
            "CA---"
        );
        assert_eq!(
            st(Goal::Destroy, false, false, true, false).column(),
            "D--T-"
        );
        assert_eq!(
            st(Goal::Destroy, false, false, false, false).column(),
            "D----"
        );
        assert_eq!(st(Goal::Create, false, true, true, true).column(), "C-FTM");
    }
}
