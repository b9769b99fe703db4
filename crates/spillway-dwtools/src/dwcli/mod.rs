//! `dwcli`: create, update, remove and list the manager's resources, with DataWarp's
//! verbs and options (`dwcli create instance --label x --capacity 1TiB ...`).
//!
//! Each command is one request: `*_request` turns the parsed command into a method,
//! path and body (tested without a manager), `*_summary` turns the answer into the one
//! line printed on success.
//!
//! * this file — the command line (global options, verbs), `main` and exit statuses.
//! * `create`, `update`, `rm` — each verb's resources, options, request and summary.
//! * `request` — a request as data, and sending it.
//! * `dwcli ls` is dwstat's tables (`crate::dwstat`), `dwcli stage` is `crate::stage`.

mod create;
mod request;
mod rm;
mod update;

pub use create::{create_request, create_summary, Create};
pub use request::{Method, Request};
pub use rm::{rm_request, rm_summary, Rm};
pub use update::{update_request, update_summary, Update};

use crate::connect::{self, Failure, CLI_TIMEOUT};
use crate::format::Zone;
use crate::render::Resource;
use clap::{Parser, Subcommand};
use request::send;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "dwcli",
    version,
    about = "Create, update, remove and list burst buffer resources",
    after_help = "Examples and output formats: docs/cli.md. Exit status: 0 success, 1 error, 2 bad usage.",
    arg_required_else_help = true
)]
pub struct Cli {
    /// Client configuration file [default: $SPILLWAY_CONFIG, else /etc/spillway/spillway.conf]
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the manager's JSON answer (pretty-printed) instead of the summary or table
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub verb: Verb,
}

#[derive(Subcommand, Debug, PartialEq)]
pub enum Verb {
    /// Create a pool, node, session, instance, configuration or activation
    #[command(arg_required_else_help = true)]
    Create {
        #[command(subcommand)]
        what: Create,
    },
    /// Change a node or a session
    #[command(arg_required_else_help = true)]
    Update {
        #[command(subcommand)]
        what: Update,
    },
    /// Remove a resource (sessions, instances, configurations and activations are
    /// destroyed in the background; dwstat shows their progress)
    #[command(arg_required_else_help = true)]
    Rm {
        #[command(subcommand)]
        what: Rm,
    },
    /// List resources: the same tables as dwstat
    #[command(arg_required_else_help = true)]
    Ls {
        #[arg(value_enum, value_name = "RESOURCE")]
        resource: Resource,
    },
    /// Stage data between the PFS and an instance; follow and change stages
    /// (exit status: 0 complete, 1 failed, 2 terminated/revoked/dropped, 3 other errors)
    #[command(arg_required_else_help = true)]
    Stage {
        #[command(subcommand)]
        cmd: crate::stage::StageCmd,
    },
}

pub fn run(cli: &Cli) -> Result<String, Failure> {
    let m = connect::client(cli.config.as_deref(), CLI_TIMEOUT)?;
    match &cli.verb {
        Verb::Ls { resource } => crate::dwstat::show(&m, &[*resource], cli.json, Zone::Local),
        Verb::Create { what } => send(&m, &create_request(what), cli.json, |a| {
            create_summary(what, a)
        }),
        Verb::Update { what } => send(&m, &update_request(what), cli.json, |a| {
            update_summary(what, a)
        }),
        Verb::Rm { what } => send(&m, &rm_request(what), cli.json, |a| rm_summary(what, a)),
        // Prints as it goes (progress); its exit status is `stage_main`'s.
        Verb::Stage { cmd } => crate::stage::run(&m, cmd, cli.json).map(|_| String::new()),
    }
}

/// Whether the command line is a `dwcli stage ...` one: its first word after the
/// global options is `stage` (its usage errors then exit 3, as its other errors).
fn is_stage_line(args: &[String]) -> bool {
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--config" => {
                it.next();
            }
            "--json" => {}
            s if s.starts_with("--config=") => {}
            s => return s == "stage",
        }
    }
    false
}

/// `dwcli stage ...`: its own exit statuses (docs/cli.md).
fn stage_main(cli: &Cli, cmd: &crate::stage::StageCmd) -> std::process::ExitCode {
    let r = connect::client(cli.config.as_deref(), CLI_TIMEOUT)
        .and_then(|m| crate::stage::run(&m, cmd, cli.json));
    match r {
        Ok(code) => std::process::ExitCode::from(code),
        Err(f) => {
            eprint!("{}", f.report("dwcli"));
            std::process::ExitCode::from(3)
        }
    }
}

pub fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) if e.use_stderr() && is_stage_line(&args) => {
            let _ = e.print();
            return std::process::ExitCode::from(3);
        }
        Err(e) => e.exit(),
    };
    if let Verb::Stage { cmd } = &cli.verb {
        return stage_main(&cli, cmd);
    }
    crate::finish("dwcli", run(&cli))
}

#[cfg(test)]
mod testing;

#[cfg(test)]
mod tests {
    use super::testing::{ok, usage_error};
    use super::*;
    use crate::render::Resource;
    use serde_json::json;
    use spillway_api::model::{StageDirection, StageType, StageWhen};

    #[test]
    fn ls_every_resource() {
        for (line, r) in [
            ("dwcli ls pools", Resource::Pools),
            ("dwcli ls nodes", Resource::Nodes),
            ("dwcli ls node", Resource::Nodes),
            ("dwcli ls sessions", Resource::Sessions),
            ("dwcli ls instances --json", Resource::Instances),
            ("dwcli ls configuration", Resource::Configurations),
            ("dwcli ls fragments", Resource::Fragments),
            ("dwcli ls activations", Resource::Activations),
            ("dwcli ls stages", Resource::Stages),
        ] {
            let c = ok(line);
            assert_eq!(c.verb, Verb::Ls { resource: r }, "{line}");
            assert_eq!(c.json, line.ends_with("--json"));
        }
    }

    #[test]
    fn stage_command_lines() {
        use crate::stage::{new_stage, StageCmd};
        let stage_of = |line: &str| match ok(line).verb {
            Verb::Stage { cmd } => cmd,
            other => panic!("{other:?}"),
        };
        match stage_of("dwcli stage in --instance 3 --file /pfs/a /in/a") {
            StageCmd::In(a) => {
                let b = new_stage(StageDirection::In, &a, None).unwrap();
                assert_eq!(
                    serde_json::to_value(&b).unwrap(),
                    json!({"instance": 3, "direction": "in", "type": "file", "source": "/pfs/a",
                           "destination": "/in/a", "pairs": [], "when": null, "owner": null})
                );
            }
            other => panic!("{other:?}"),
        }
        match stage_of(
            "dwcli stage out --instance 3 --directory /out /pfs/out --defer --owner 1017",
        ) {
            StageCmd::Out(a) => {
                let b = new_stage(StageDirection::Out, &a, None).unwrap();
                assert_eq!(b.kind, StageType::Directory);
                assert_eq!(b.when, Some(StageWhen::JobEnd));
                assert_eq!(b.owner, Some(1017));
            }
            other => panic!("{other:?}"),
        }
        match stage_of("dwcli stage in --instance 3 --list pairs.txt") {
            StageCmd::In(a) => {
                let b = new_stage(StageDirection::In, &a, Some("/p/a /a\n/p/b /b\n")).unwrap();
                assert_eq!(b.kind, StageType::List);
                assert_eq!(b.pairs.len(), 2);
                assert!(b.source.is_empty());
            }
            other => panic!("{other:?}"),
        }
        match stage_of("dwcli stage in --instance 3 --file /pfs/a /a --defer") {
            StageCmd::In(a) => assert!(new_stage(StageDirection::In, &a, None).is_err()),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            stage_of("dwcli stage wait 7 --timeout 30"),
            StageCmd::Wait {
                id: 7,
                timeout: Some(30)
            }
        );
        assert_eq!(
            stage_of("dwcli stage status --instance 3"),
            StageCmd::Status {
                id: None,
                instance: Some(3)
            }
        );
        assert_eq!(stage_of("dwcli stage cancel 9"), StageCmd::Cancel { id: 9 });
        assert_eq!(stage_of("dwcli stage revoke 9"), StageCmd::Revoke { id: 9 });
        assert_eq!(
            stage_of("dwcli stage activate 9"),
            StageCmd::Activate { id: 9 }
        );
        // Usage errors.
        usage_error("dwcli stage in --instance 3 /a /b");
        usage_error("dwcli stage in --instance 3 --file --directory /a /b");
        usage_error("dwcli stage in --instance 3 --file /a");
        usage_error("dwcli stage in --instance 3 --list l /a /b");
        usage_error("dwcli stage out --instance 3 --file /a /b --timeout 3");
        usage_error("dwcli stage wait x");
        let args = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert!(is_stage_line(&args("dwcli --config /x stage wait")));
        assert!(is_stage_line(&args("dwcli --json stage")));
        assert!(!is_stage_line(&args("dwcli create session --token stage")));
    }

    #[test]
    fn global_options_anywhere() {
        let c = ok("dwcli --config /x.conf create session --token t --json");
        assert_eq!(c.config, Some(PathBuf::from("/x.conf")));
        assert!(c.json);
    }

    #[test]
    fn bad_usage() {
        usage_error("dwcli");
        usage_error("dwcli create");
        usage_error("dwcli frobnicate pool");
        usage_error("dwcli create namespace --id 1");
        usage_error("dwcli update instance --id 1 --replace-fuse");
        usage_error("dwcli ls namespaces");
        assert!(usage_error("dwcli create pool --name p --granularity 1.5GiB").contains("decimal"));
        assert!(usage_error("dwcli create pool --name p --granularity 1XB")
            .contains("unknown size unit"));
    }
}
