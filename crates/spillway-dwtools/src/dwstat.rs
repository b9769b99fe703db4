//! `dwstat`: DataWarp's status tables, one list request to the manager per table.

use crate::connect::{self, Failure, Manager, STAT_TIMEOUT};
use crate::format::Zone;
use crate::json;
use crate::render::{self, Resource};
use clap::builder::PossibleValue;
use clap::{Parser, ValueEnum};
use serde_json::value::RawValue;
use std::path::PathBuf;
use std::sync::OnceLock;

#[derive(Parser, Debug)]
#[command(
    name = "dwstat",
    version,
    about = "Status of the burst buffer: pools, nodes, sessions, instances, configurations, fragments, activations, stages",
    after_help = "Tables are described in docs/cli.md. Exit status: 0 success, 1 error, 2 bad usage."
)]
pub struct Cli {
    /// Client configuration file [default: $SPILLWAY_CONFIG, else /etc/spillway/spillway.conf]
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the manager's JSON answer (pretty-printed) instead of the table
    #[arg(long)]
    pub json: bool,
    /// Accepted for DataWarp scripts. Changes nothing: every table already lists every
    /// object the manager lets the caller see.
    #[arg(long)]
    pub all: bool,
    /// The tables to print, in this order [default: pools]
    #[arg(value_enum, value_name = "TABLE")]
    pub tables: Vec<Which>,
}

/// A table, or `most`. Its words are `Resource`'s (`dwcli ls` takes the same ones)
/// plus `most`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Table(Resource),
    /// pools, sessions, instances, configurations, activations
    Most,
}

impl ValueEnum for Which {
    fn value_variants<'a>() -> &'a [Self] {
        static ALL: OnceLock<Vec<Which>> = OnceLock::new();
        ALL.get_or_init(|| {
            Resource::value_variants()
                .iter()
                .map(|r| Which::Table(*r))
                .chain([Which::Most])
                .collect()
        })
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        match self {
            Which::Table(r) => r.to_possible_value(),
            Which::Most => Some(
                PossibleValue::new("most")
                    .help("pools, sessions, instances, configurations, activations"),
            ),
        }
    }
}

/// The resources to list, in order. Pools come first in `most` because scripts read
/// line 2 of `dwstat most` as the default pool's row.
pub fn plan(tables: &[Which]) -> Vec<Resource> {
    if tables.is_empty() {
        return vec![Resource::Pools];
    }
    let mut out = Vec::new();
    for t in tables {
        match t {
            Which::Table(r) => out.push(*r),
            Which::Most => out.extend([
                Resource::Pools,
                Resource::Sessions,
                Resource::Instances,
                Resource::Configurations,
                Resource::Activations,
            ]),
        }
    }
    out
}

/// The tables (or with `json` the JSON) of `resources`, one GET per resource; the
/// fragments table also needs the node list (for `gran`), fetched once.
pub fn show(
    m: &Manager,
    resources: &[Resource],
    json: bool,
    zone: Zone,
) -> Result<String, Failure> {
    let mut answers = Vec::with_capacity(resources.len());
    for r in resources {
        answers.push(m.get(r.path())?);
    }
    let raws: Vec<&RawValue> = answers.iter().map(|a| a.0.as_ref()).collect();
    let needs_nodes =
        !json && resources.contains(&Resource::Fragments) && !resources.contains(&Resource::Nodes);
    let nodes = if needs_nodes {
        Some(m.get(Resource::Nodes.path())?)
    } else {
        None
    };
    Ok(compose(
        resources,
        &raws,
        nodes.as_ref().map(|a| a.raw()),
        json,
        zone,
    )?)
}

/// The output for the answers `raws` (one per resource, in order). `nodes`: a node
/// list answer for the fragments table when `resources` has no nodes of its own.
pub fn compose(
    resources: &[Resource],
    raws: &[&RawValue],
    nodes: Option<&str>,
    json: bool,
    zone: Zone,
) -> Result<String, String> {
    if json {
        return match raws {
            [one] => Ok(json::pretty(one.get())),
            many => Ok(json::pretty(&json::merge(many)?)),
        };
    }
    let nodes_raw = resources
        .iter()
        .position(|r| *r == Resource::Nodes)
        .and_then(|i| raws.get(i).map(|r| r.get()))
        .or(nodes);
    let nodes = match nodes_raw {
        Some(raw) if resources.contains(&Resource::Fragments) => Some(render::nodes_of(raw)?),
        _ => None,
    };
    let mut tables = Vec::with_capacity(resources.len());
    for (r, raw) in resources.iter().zip(raws) {
        tables.push(render::table(*r, raw.get(), nodes.as_deref(), zone)?);
    }
    // A blank line between tables.
    Ok(tables.join("\n"))
}

pub fn run(cli: &Cli) -> Result<String, Failure> {
    let resources = plan(&cli.tables);
    let m = connect::client(cli.config.as_deref(), STAT_TIMEOUT)?;
    show(&m, &resources, cli.json, Zone::Local)
}

pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    crate::finish("dwstat", run(&cli))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("dwstat").chain(args.iter().copied()))
    }

    #[test]
    fn default_is_pools() {
        let c = parse(&[]).unwrap();
        assert_eq!(plan(&c.tables), vec![Resource::Pools]);
        assert!(!c.json && !c.all && c.config.is_none());
    }

    #[test]
    fn every_table_and_option() {
        let c = parse(&["--config", "/x.conf", "--json", "sessions", "--all"]).unwrap();
        assert_eq!(c.config, Some(PathBuf::from("/x.conf")));
        assert!(c.json && c.all);
        assert_eq!(plan(&c.tables), vec![Resource::Sessions]);
        for (word, r) in [
            ("pools", Resource::Pools),
            ("nodes", Resource::Nodes),
            ("sessions", Resource::Sessions),
            ("instances", Resource::Instances),
            ("configurations", Resource::Configurations),
            ("fragments", Resource::Fragments),
            ("activations", Resource::Activations),
            ("instance", Resource::Instances),
        ] {
            assert_eq!(plan(&parse(&[word]).unwrap().tables), vec![r], "{word}");
        }
    }

    #[test]
    fn most_starts_with_pools() {
        let c = parse(&["most"]).unwrap();
        assert_eq!(
            plan(&c.tables),
            vec![
                Resource::Pools,
                Resource::Sessions,
                Resource::Instances,
                Resource::Configurations,
                Resource::Activations
            ]
        );
    }

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_string()).unwrap()
    }

    #[test]
    fn most_prints_tables_in_a_row_default_pool_on_line_2() {
        let rs = plan(&[Which::Most]);
        let answers: Vec<Box<RawValue>> = [
            include_str!("../testdata/pools.json"),
            include_str!("../testdata/sessions.json"),
            include_str!("../testdata/instances.json"),
            include_str!("../testdata/configurations.json"),
            include_str!("../testdata/activations.json"),
        ]
        .iter()
        .map(|t| raw(t))
        .collect();
        let raws: Vec<&RawValue> = answers.iter().map(|a| a.as_ref()).collect();
        let out = compose(&rs, &raws, None, false, Zone::Utc).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "pool     units quantity free    gran");
        assert_eq!(lines[1], "wlm_pool bytes 7.28TiB  7.28TiB 1GiB");
        assert_eq!(lines[3], "");
        assert!(lines[4].starts_with("sess state token"), "{out}");
        let headers: Vec<&str> = out
            .split("\n\n")
            .map(|t| t.split_whitespace().next().unwrap_or(""))
            .collect();
        assert_eq!(headers, ["pool", "sess", "inst", "conf", "activ"]);

        let json = compose(&rs, &raws, None, true, Zone::Utc).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 5);
        assert_eq!(v["pools"][0]["id"], "wlm_pool");
        // as received: the manager's field order, not sorted keys
        assert!(
            json.starts_with("{\n  \"pools\": [\n    {\n      \"id\": \"wlm_pool\""),
            "{json}"
        );
    }

    #[test]
    fn fragments_take_gran_from_a_separate_node_answer() {
        let f = raw(include_str!("../testdata/fragments.json"));
        let nodes = include_str!("../testdata/nodes.json");
        let out = compose(&[Resource::Fragments], &[&f], Some(nodes), false, Zone::Utc).unwrap();
        assert!(
            out.contains("\n5    CA--- 3    2TiB     1GiB nid00001\n"),
            "{out}"
        );
        // without nodes the column is "-", never a guess
        let out = compose(&[Resource::Fragments], &[&f], None, false, Zone::Utc).unwrap();
        assert!(
            out.contains("\n5    CA--- 3    2TiB     -    nid00001\n"),
            "{out}"
        );
    }

    #[test]
    fn unknown_table_is_a_usage_error() {
        let e = parse(&["namespaces"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert_eq!(parse(&["--bogus"]).unwrap_err().exit_code(), 2);
    }
}
