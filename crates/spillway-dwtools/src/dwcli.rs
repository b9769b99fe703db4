//! `dwcli`: create, update, remove and list the manager's resources, with DataWarp's
//! verbs and options (`dwcli create instance --label x --capacity 1TiB ...`).
//!
//! Each command is one request: `request` turns the parsed command into a method, path
//! and body (tested without a manager), `summary` turns the answer into the one line
//! printed on success.

use crate::args::{self, HostList};
use crate::connect::{self, Answer, Failure, Manager, CLI_TIMEOUT};
use crate::format::{self, Zone};
use crate::json;
use crate::render::Resource;
use clap::{ArgGroup, Parser, Subcommand};
use serde_json::Value;
use spillway_api::model::*;
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

#[derive(Subcommand, Debug, PartialEq)]
pub enum Create {
    /// A pool: a set of servers with one allocation granularity
    #[command(alias = "pools")]
    Pool {
        #[arg(long)]
        name: String,
        /// Bytes per granule, e.g. 1GiB
        #[arg(long, value_parser = args::size, value_name = "SIZE")]
        granularity: u64,
    },
    /// A storage server
    #[command(alias = "nodes")]
    Node {
        #[arg(long)]
        name: String,
        /// Data-plane address of the server
        #[arg(long, value_name = "HOST:PORT")]
        address: String,
        #[arg(long)]
        pool: Option<String>,
        /// Offer at most this much [default: what the server reports]
        #[arg(long, value_parser = args::size, value_name = "SIZE")]
        capacity: Option<u64>,
    },
    /// A session: the handle of a job or of a persistent instance
    #[command(alias = "sessions")]
    Session {
        /// Client (compute) nodes, comma-separated
        #[arg(long, value_parser = args::hosts, value_name = "HOST[,..]")]
        hosts: Option<HostList>,
        /// Owner uid [default: the caller; only admins may name another]
        #[arg(long, value_name = "UID")]
        owner: Option<u32>,
        /// Who made it, e.g. SLURM [default: CLI]
        #[arg(long)]
        creator: Option<String>,
        /// Job id, or the name of a persistent instance
        #[arg(long)]
        token: String,
        /// Epoch seconds [default: none]
        #[arg(long, value_name = "EPOCH")]
        expiration: Option<i64>,
    },
    /// An instance: capacity in a pool, for a session
    #[command(alias = "instances")]
    Instance {
        /// [default: I<id>-0]
        #[arg(long)]
        label: Option<String>,
        /// Rounded up to the pool's granularity
        #[arg(long, value_parser = args::size, value_name = "SIZE")]
        capacity: u64,
        #[arg(long, value_name = "SESS-ID")]
        session: u64,
        /// [default: the site's default pool]
        #[arg(long)]
        pool: Option<String>,
        /// bandwidth (spread over servers) or isolation (as few as possible)
        #[arg(long, value_parser = args::policy, value_name = "POLICY")]
        policy: Option<Policy>,
        /// Every user sees it [default: public unless the token is a job id]
        #[arg(long, conflicts_with = "private")]
        public: bool,
        /// Only the owner sees it
        #[arg(long)]
        private: bool,
        /// Default stripe size of new files [default: the site's]
        #[arg(long, value_parser = args::stripe_size, value_name = "SIZE")]
        stripe_size: Option<u32>,
        /// Epoch seconds [default: none]
        #[arg(long, value_name = "EPOCH")]
        expiration: Option<i64>,
    },
    /// A configuration: how an instance is used
    #[command(alias = "configurations")]
    Configuration {
        /// Mode of the root directory, octal [default: 0755]
        #[arg(long, value_parser = args::octal_mode, value_name = "MODE")]
        root_permissions: Option<u32>,
        /// Group (gid) of the root directory [default: the owner's primary group]
        #[arg(long, value_name = "GID")]
        group: Option<u32>,
        /// stripe (or striped), private, ldbal (or load_balanced)
        #[arg(long, value_parser = args::access_mode, value_name = "MODE")]
        access_mode: AccessMode,
        /// scratch, cache or swap
        #[arg(long = "type", value_parser = args::config_type, value_name = "TYPE")]
        kind: ConfigType,
        #[arg(long, value_name = "INST-ID")]
        instance: u64,
    },
    /// An activation: a configuration mounted on a session's client nodes
    #[command(alias = "activations")]
    Activation {
        /// Admins only: a path strictly below the site's mount root [default: a
        /// per-session path under it; users always get that one]
        #[arg(long, value_name = "PATH")]
        mount: Option<String>,
        #[arg(long, value_name = "SESS-ID")]
        session: u64,
        #[arg(long, value_name = "CONF-ID")]
        configuration: u64,
    },
}

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

/// HTTP method of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Post,
    Patch,
    Delete,
}

/// What a create, update or rm sends: method, path, JSON body.
#[derive(Debug, PartialEq)]
pub struct Request {
    pub method: Method,
    pub path: String,
    pub body: Option<Value>,
}

fn to_json<T: serde::Serialize>(t: &T) -> Value {
    // The request types are plain structs of strings, numbers and enums, which always
    // serialise; Null would make the manager answer with a clear error anyway.
    serde_json::to_value(t).unwrap_or(Value::Null)
}

fn post<T: serde::Serialize>(collection: &str, body: &T) -> Request {
    Request {
        method: Method::Post,
        path: format!("/dw/v1/{collection}"),
        body: Some(to_json(body)),
    }
}

fn delete(collection: &str, id: &str) -> Request {
    Request {
        method: Method::Delete,
        path: format!("/dw/v1/{collection}/{}", connect::segment(id)),
        body: None,
    }
}

pub fn create_request(c: &Create) -> Request {
    match c {
        Create::Pool { name, granularity } => post(
            "pools",
            &NewPool {
                id: name.clone(),
                granularity: *granularity,
                units: None,
            },
        ),
        Create::Node {
            name,
            address,
            pool,
            capacity,
        } => post(
            "nodes",
            &NewNode {
                id: name.clone(),
                address: address.clone(),
                pool: pool.clone(),
                capacity: *capacity,
            },
        ),
        Create::Session {
            hosts,
            owner,
            creator,
            token,
            expiration,
        } => post(
            "sessions",
            &NewSession {
                token: token.clone(),
                owner: *owner,
                creator: creator.clone(),
                client_nodes: hosts.clone().map(|h| h.0).unwrap_or_default(),
                expiration: *expiration,
            },
        ),
        Create::Instance {
            label,
            capacity,
            session,
            pool,
            policy,
            public,
            private,
            stripe_size,
            expiration,
        } => post(
            "instances",
            &NewInstance {
                session: *session,
                capacity: *capacity,
                pool: pool.clone(),
                label: label.clone(),
                // Neither flag: let the manager decide (public for persistent names).
                public: match (public, private) {
                    (true, _) => Some(true),
                    (_, true) => Some(false),
                    _ => None,
                },
                policy: *policy,
                limits: None,
                stripe_size: *stripe_size,
                expiration: *expiration,
            },
        ),
        Create::Configuration {
            root_permissions,
            group,
            access_mode,
            kind,
            instance,
        } => post(
            "configurations",
            &NewConfiguration {
                instance: *instance,
                kind: *kind,
                access_mode: *access_mode,
                root_permissions: *root_permissions,
                group: *group,
            },
        ),
        Create::Activation {
            mount,
            session,
            configuration,
        } => post(
            "activations",
            &NewActivation {
                session: *session,
                configuration: *configuration,
                mount: mount.clone(),
            },
        ),
    }
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
        } => Request {
            method: Method::Patch,
            path: format!("/dw/v1/nodes/{}", connect::segment(name)),
            body: Some(to_json(&NodeUpdate {
                pool: pool.clone(),
                drain: match (drain, no_drain) {
                    (true, _) => Some(true),
                    (_, true) => Some(false),
                    _ => None,
                },
                capacity: *capacity,
                replace_fuse: replace_fuse.then_some(true),
            })),
        },
        Update::Session {
            id,
            hosts,
            replace_fuse,
        } => Request {
            method: Method::Patch,
            path: format!("/dw/v1/sessions/{id}"),
            body: Some(to_json(&SessionUpdate {
                client_nodes: hosts.clone().map(|h| h.0),
                replace_fuse: replace_fuse.then_some(true),
            })),
        },
    }
}

pub fn rm_request(r: &Rm) -> Request {
    match r {
        Rm::Pool { name } => delete("pools", name),
        Rm::Node { name } => delete("nodes", name),
        Rm::Session { id } => delete("sessions", &id.to_string()),
        Rm::Instance { id } => delete("instances", &id.to_string()),
        Rm::Configuration { id } => delete("configurations", &id.to_string()),
        Rm::Activation { id } => delete("activations", &id.to_string()),
    }
}

/// The line printed after a successful create: `created <resource> <id> key=value ...`.
/// The id is always the third word.
pub fn create_summary(c: &Create, a: &Answer) -> Result<String, Failure> {
    Ok(match c {
        Create::Pool { .. } => {
            let p: Pool = a.parse()?;
            format!(
                "created pool {} granularity={}",
                p.id,
                format::size(p.granularity)
            )
        }
        Create::Node { .. } => {
            let n: Node = a.parse()?;
            format!(
                "created node {} address={} pool={} capacity={}",
                n.id,
                n.address,
                format::text(n.pool.as_deref().unwrap_or("")),
                format::size(n.capacity)
            )
        }
        Create::Session { .. } => {
            let s: Session = a.parse()?;
            format!("created session {} token={}", s.id, s.token)
        }
        Create::Instance { .. } => {
            let i: Instance = a.parse()?;
            format!(
                "created instance {} label={} session={} pool={} bytes={} nodes={}",
                i.id,
                format::text(&i.label),
                i.links.session,
                i.pool,
                format::size(i.capacity.bytes),
                i.capacity.nodes
            )
        }
        Create::Configuration { .. } => {
            let c: Configuration = a.parse()?;
            format!(
                "created configuration {} instance={} type={} access_mode={}",
                c.id,
                c.links.instance,
                c.kind.as_str(),
                c.access_mode.as_str()
            )
        }
        Create::Activation { .. } => {
            let x: Activation = a.parse()?;
            format!(
                "created activation {} session={} configuration={} mount={}",
                x.id, x.links.session, x.links.configuration, x.mount
            )
        }
    } + "\n")
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

/// Send one request; the answer as JSON or as its summary line.
fn send(
    m: &Manager,
    req: &Request,
    json: bool,
    summary: impl FnOnce(&Answer) -> Result<String, Failure>,
) -> Result<String, Failure> {
    let body = req.body.as_ref().unwrap_or(&Value::Null);
    let answer = match req.method {
        Method::Post => m.post(&req.path, body)?,
        Method::Patch => m.patch(&req.path, body)?,
        Method::Delete => m.delete(&req.path)?,
    };
    if json {
        Ok(json::pretty(answer.raw()))
    } else {
        summary(&answer)
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
mod tests {
    use super::*;
    use serde_json::json;
    use serde_json::value::RawValue;

    fn parse(line: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(line.split_whitespace())
    }

    fn ok(line: &str) -> Cli {
        parse(line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    /// The request a command line sends.
    fn req(line: &str) -> Request {
        match ok(line).verb {
            Verb::Create { what } => create_request(&what),
            Verb::Update { what } => update_request(&what),
            Verb::Rm { what } => rm_request(&what),
            Verb::Ls { .. } => panic!("{line}: ls sends no body"),
            Verb::Stage { .. } => panic!("{line}: see stage_command_lines"),
        }
    }

    fn post(path: &str, body: Value) -> Request {
        Request {
            method: Method::Post,
            path: path.into(),
            body: Some(body),
        }
    }

    /// The usage error of a command line, as text; its exit code must be 2.
    fn usage_error(line: &str) -> String {
        let e = parse(line).expect_err(line);
        assert_eq!(e.exit_code(), 2, "{line}: {e}");
        e.to_string()
    }

    #[test]
    fn create_pool() {
        assert_eq!(
            req("dwcli create pool --name wlm_pool --granularity 1GiB"),
            post(
                "/dw/v1/pools",
                json!({"id": "wlm_pool", "granularity": 1u64 << 30, "units": null})
            )
        );
        // plural form
        assert_eq!(
            req("dwcli create pools --name p --granularity 16M").path,
            "/dw/v1/pools"
        );
    }

    #[test]
    fn create_node() {
        assert_eq!(
            req("dwcli create node --name nid00001 --address 10.0.0.1:7000"),
            post(
                "/dw/v1/nodes",
                json!({"id": "nid00001", "address": "10.0.0.1:7000", "pool": null, "capacity": null})
            )
        );
        assert_eq!(
            req("dwcli create node --name n --address h:1 --pool wlm_pool --capacity 1TiB").body,
            Some(json!({"id": "n", "address": "h:1", "pool": "wlm_pool", "capacity": 1u64 << 40}))
        );
    }

    #[test]
    fn create_session() {
        assert_eq!(
            req("dwcli create session --hosts nid1,nid2 --owner 1017 --creator SLURM --token 169508"),
            post(
                "/dw/v1/sessions",
                json!({"token": "169508", "owner": 1017, "creator": "SLURM",
                       "client_nodes": ["nid1", "nid2"], "expiration": null})
            )
        );
        assert_eq!(
            req("dwcli create session --token refdb --expiration 1795399860").body,
            Some(json!({"token": "refdb", "owner": null, "creator": null,
                        "client_nodes": [], "expiration": 1795399860}))
        );
        assert!(usage_error("dwcli create session --hosts a,,b --token t").contains("empty host"));
        assert!(usage_error("dwcli create session --owner 1017").contains("--token"));
    }

    #[test]
    fn create_instance() {
        assert_eq!(
            req("dwcli create instance --label refdb --capacity 2TiB --session 12 --pool wlm_pool"),
            post(
                "/dw/v1/instances",
                json!({"session": 12, "capacity": 2u64 << 40, "pool": "wlm_pool",
                       "label": "refdb", "public": null, "policy": null, "limits": null,
                       "stripe_size": null, "expiration": null})
            )
        );
        let b = req(
            "dwcli create instances --capacity 400GiB --session 13 --policy isolation \
             --private --stripe-size 1M",
        )
        .body
        .unwrap_or_default();
        assert_eq!(b["public"], json!(false));
        assert_eq!(b["policy"], json!("isolation"));
        assert_eq!(b["stripe_size"], json!(1 << 20));
        let b = req("dwcli create instance --capacity 1G --session 1 --public").body;
        assert_eq!(b.unwrap_or_default()["public"], json!(true));
        assert!(
            usage_error("dwcli create instance --capacity 1G --session 1 --public --private")
                .contains("cannot be used with")
        );
        assert!(
            usage_error("dwcli create instance --capacity 3.5TB --session 1")
                .contains("decimal sizes are not accepted")
        );
        assert!(
            usage_error("dwcli create instance --capacity 1G --session 1 --policy fast")
                .contains("unknown policy")
        );
        assert!(
            usage_error("dwcli create instance --capacity 1G --session 1 --stripe-size 8G")
                .contains("too large")
        );
        assert!(
            usage_error("dwcli create instance --capacity 1G --session x").contains("--session")
        );
    }

    #[test]
    fn create_configuration() {
        assert_eq!(
            req(
                "dwcli create configuration --root-permissions 0755 --group 1017 \
                 --access-mode stripe --type scratch --instance 3"
            ),
            post(
                "/dw/v1/configurations",
                json!({"instance": 3, "type": "scratch", "access_mode": "stripe",
                       "root_permissions": 0o755, "group": 1017})
            )
        );
        for (word, mode) in [
            ("striped", "stripe"),
            ("private", "private"),
            ("ldbal", "ldbal"),
            ("load_balanced", "ldbal"),
        ] {
            let b = req(&format!(
                "dwcli create configuration --access-mode {word} --type cache --instance 1 \
                 --root-permissions 700"
            ))
            .body
            .unwrap_or_default();
            assert_eq!(b["access_mode"], json!(mode), "{word}");
            assert_eq!(b["root_permissions"], json!(0o700));
            assert_eq!(b["type"], json!("cache"));
        }
        assert!(usage_error(
            "dwcli create configuration --access-mode shared --type scratch --instance 1"
        )
        .contains("unknown access mode \"shared\""));
        assert!(usage_error(
            "dwcli create configuration --access-mode stripe --type scratch --instance 1 \
             --root-permissions 0799"
        )
        .contains("not an octal mode"));
        assert!(usage_error(
            "dwcli create configuration --access-mode stripe --type scatch --instance 1"
        )
        .contains("unknown configuration type"));
    }

    #[test]
    fn create_activation() {
        assert_eq!(
            req("dwcli create activation --mount /mnt/bb --session 12 --configuration 7"),
            post(
                "/dw/v1/activations",
                json!({"session": 12, "configuration": 7, "mount": "/mnt/bb"})
            )
        );
    }

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

    /// One object of a fixture list as the answer to a create.
    fn answer(fixture: &str, key: &str, i: usize) -> Answer {
        let v: Value = serde_json::from_str(fixture).unwrap();
        Answer(RawValue::from_string(v[key][i].to_string()).unwrap())
    }

    fn created(line: &str, a: &Answer) -> String {
        match ok(line).verb {
            Verb::Create { what } => create_summary(&what, a).unwrap(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn create_summaries() {
        let pools = include_str!("../testdata/pools.json");
        let nodes = include_str!("../testdata/nodes.json");
        let sessions = include_str!("../testdata/sessions.json");
        let insts = include_str!("../testdata/instances.json");
        let confs = include_str!("../testdata/configurations.json");
        let acts = include_str!("../testdata/activations.json");
        assert_eq!(
            created(
                "dwcli create pool --name wlm_pool --granularity 1GiB",
                &answer(pools, "pools", 0)
            ),
            "created pool wlm_pool granularity=1GiB\n"
        );
        assert_eq!(
            created(
                "dwcli create node --name nid00002 --address h:1",
                &answer(nodes, "nodes", 1)
            ),
            "created node nid00002 address=10.0.0.2:7000 pool=- capacity=0B\n"
        );
        assert_eq!(
            created(
                "dwcli create session --token refdb",
                &answer(sessions, "sessions", 0)
            ),
            "created session 12 token=refdb\n"
        );
        assert_eq!(
            created(
                "dwcli create instance --capacity 400GB --session 13",
                &answer(insts, "instances", 1)
            ),
            "created instance 4 label=I4-0 session=13 pool=wlm_pool bytes=400GiB nodes=2\n"
        );
        assert_eq!(
            created(
                "dwcli create configuration --access-mode stripe --type scratch --instance 3",
                &answer(confs, "configurations", 0)
            ),
            "created configuration 7 instance=3 type=scratch access_mode=stripe\n"
        );
        assert_eq!(
            created(
                "dwcli create activation --session 12 --configuration 7",
                &answer(acts, "activations", 1)
            ),
            "created activation 3 session=12 configuration=7 mount=/mnt/refdb\n"
        );
    }

    #[test]
    fn update_and_rm_summaries() {
        let nodes = include_str!("../testdata/nodes.json");
        let sessions = include_str!("../testdata/sessions.json");
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

    #[test]
    fn a_wrong_answer_is_an_error_not_a_panic() {
        let bad = Answer(RawValue::from_string(r#"{"id":"x"}"#.into()).unwrap());
        match ok("dwcli create session --token t").verb {
            Verb::Create { what } => {
                let e = create_summary(&what, &bad).unwrap_err().report("dwcli");
                assert!(
                    e.starts_with("dwcli: unexpected answer from the manager"),
                    "{e}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
