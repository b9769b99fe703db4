//! `dw_wlm_cli`'s argv, exactly as Slurm 22.05 builds it (spec §1.3). Options are
//! matched by name, never by position (`paths` puts `--job` before `--token`).

use std::collections::BTreeMap;

/// The options of one call: `--function` and the rest, by name.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Call {
    pub function: String,
    values: BTreeMap<String, String>,
    flags: Vec<String>,
}

/// Options that take no value.
const FLAGS: &[&str] = &["--hurry"];
/// Options that take a value, by function (`--function` itself aside).
fn known(function: &str) -> Option<&'static [&'static str]> {
    Some(match function {
        "pools" | "show_instances" | "show_sessions" | "show_configurations" => &[],
        "job_process" => &["--job"],
        "setup" => &[
            "--token",
            "--caller",
            "--user",
            "--groupid",
            "--capacity",
            "--job",
            "--nodehostnamefile",
            "--nidlistfile",
        ],
        "data_in" | "data_out" | "post_run" => &["--token", "--job"],
        "real_size" => &["--token"],
        "paths" => &["--job", "--token", "--pathfile"],
        "pre_run" => &[
            "--token",
            "--job",
            "--nodehostnamefile",
            "--nidlistfile",
            "--jobexecutionnodefile",
        ],
        "teardown" => &["--token", "--job", "--hurry"],
        "create_persistent" => &["-c", "-t", "-u", "-C", "-a", "-T"],
        _ => return None,
    })
}

/// Why argv was refused. `Unknown` starts with the words Slurm's `real_size` handling
/// looks for (`invalid function`).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ArgError {
    Unknown(String),
    Bad(String),
}

impl std::fmt::Display for ArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArgError::Unknown(func) => {
                write!(f, "invalid function {}", spillway_jobs::input::shown(func))
            }
            ArgError::Bad(m) => write!(f, "{m}"),
        }
    }
}

impl Call {
    /// Parse argv after `argv[0]`.
    pub(super) fn parse(args: &[String]) -> Result<Call, ArgError> {
        let mut function = None;
        let mut rest = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--function" {
                let f = it
                    .next()
                    .ok_or_else(|| ArgError::Bad("--function needs a value".into()))?;
                if function.replace(f.clone()).is_some() {
                    return Err(ArgError::Bad("--function given twice".into()));
                }
            } else {
                rest.push(a.clone());
            }
        }
        let function = function.ok_or_else(|| ArgError::Bad("missing --function <name>".into()))?;
        let opts = known(&function).ok_or_else(|| ArgError::Unknown(function.clone()))?;
        let mut call = Call {
            function,
            ..Call::default()
        };
        let mut it = rest.into_iter();
        while let Some(a) = it.next() {
            if !opts.contains(&a.as_str()) {
                return Err(ArgError::Bad(format!(
                    "{}: unknown option {}",
                    call.function,
                    spillway_jobs::input::shown(&a)
                )));
            }
            if FLAGS.contains(&a.as_str()) {
                call.flags.push(a);
                continue;
            }
            let v = it
                .next()
                .ok_or_else(|| ArgError::Bad(format!("{a} needs a value")))?;
            if call.values.insert(a.clone(), v).is_some() {
                return Err(ArgError::Bad(format!("{a} given twice")));
            }
        }
        Ok(call)
    }

    pub(super) fn get(&self, opt: &str) -> Option<&str> {
        self.values.get(opt).map(String::as_str)
    }

    pub(super) fn need(&self, opt: &str) -> Result<&str, ArgError> {
        self.get(opt)
            .ok_or_else(|| ArgError::Bad(format!("{}: missing {opt} <value>", self.function)))
    }

    pub(super) fn flag(&self, f: &str) -> bool {
        self.flags.iter().any(|x| x == f)
    }
}

/// `--capacity <pool>:<size>` (setup: humanised, `wlm_pool:200GiB`, or `0`) and `-C
/// <pool>:<bytes>` (create_persistent): the pool (None when empty) and the bytes.
pub(super) fn capacity(v: &str) -> Result<(Option<String>, u64), String> {
    let (pool, size) = match v.rsplit_once(':') {
        Some((p, s)) => (Some(p), s),
        None => (None, v),
    };
    let unit = size.trim_start_matches(|c: char| c.is_ascii_digit());
    if matches!(unit.to_ascii_lowercase().as_str(), "n" | "node" | "nodes")
        && unit.len() < size.len()
    {
        return Err(format!(
            "capacity {}: sizes in nodes are not supported; ask for bytes",
            spillway_jobs::input::shown(v)
        ));
    }
    let bytes = spillway_api::size::parse_size(size)
        .map_err(|e| format!("capacity {}: {e}", spillway_jobs::input::shown(v)))?;
    let pool = pool.filter(|p| !p.is_empty()).map(str::to_string);
    Ok((pool, bytes))
}

/// The most compute nodes one job's node list may name (ranges of nids expand).
pub(super) const MAX_NODES: usize = 1 << 20;

/// Compute nodes from `--nodehostnamefile` (a hostname per line) or `--nidlistfile`
/// (Cray: numbers and ranges `1-3`, a line each, meaning `nid00001`...).
pub(super) fn nodes(call: &Call) -> Result<Vec<String>, String> {
    use spillway_jobs::input;
    // A regular file of bounded size (Slurm writes it; anything else is refused).
    let read = |p: &str| {
        let bytes = input::read_regular(
            std::path::Path::new(p),
            input::MAX_NODE_LIST_BYTES,
            "the node list",
        )?;
        String::from_utf8(bytes)
            .map_err(|_| format!("the node list {} is not UTF-8 text", input::cut(p, 200)))
    };
    let mut out = Vec::new();
    if let Some(p) = call.get("--nodehostnamefile") {
        out.extend(
            read(p)?
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string),
        );
    } else if let Some(p) = call.get("--nidlistfile") {
        for item in read(p)?
            .split([',', '\n'])
            .map(str::trim)
            .filter(|l| !l.is_empty())
        {
            let (a, b) = item.split_once('-').unwrap_or((item, item));
            let bad = || {
                format!(
                    "node list {}: {} is not a nid number or range",
                    input::cut(p, 200),
                    input::shown(item)
                )
            };
            let a: u32 = a.parse().map_err(|_| bad())?;
            let b: u32 = b.parse().map_err(|_| bad())?;
            if b < a || b - a > 100_000 {
                return Err(bad());
            }
            out.extend((a..=b).map(|n| format!("nid{n:05}")));
            if out.len() > MAX_NODES {
                return Err(format!(
                    "node list {}: more than {MAX_NODES} nodes",
                    input::cut(p, 200)
                ));
            }
        }
    }
    if out.len() > MAX_NODES {
        return Err(format!("the node list names more than {MAX_NODES} nodes"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(args: &str) -> Result<Call, ArgError> {
        let v: Vec<String> = args.split_whitespace().map(str::to_string).collect();
        Call::parse(&v)
    }

    #[test]
    fn slurms_argv_orders() {
        let c = call("--function paths --job /s/hash.3/job.13/script --token 13 --pathfile /s/hash.3/job.13/path").unwrap();
        assert_eq!(
            (c.need("--token"), c.need("--pathfile")),
            (Ok("13"), Ok("/s/hash.3/job.13/path"))
        );
        let c = call("--function setup --token 13 --caller SLURM --user 1001 --groupid 1001 --capacity wlm_pool:1GiB --job /s/script --nodehostnamefile /s/client_nids").unwrap();
        assert_eq!(c.get("--capacity"), Some("wlm_pool:1GiB"));
        let c = call("--function teardown --token 13 --job /s/script --hurry").unwrap();
        assert!(c.flag("--hurry"));
        let c = call("--function create_persistent -c CLI -t refdb -u 1001 -C wlm_pool:1073741824 -a striped -T scratch").unwrap();
        assert_eq!((c.get("-t"), c.get("-T")), (Some("refdb"), Some("scratch")));
        assert_eq!(call("--function pools").unwrap().function, "pools");
    }

    #[test]
    fn refusals() {
        assert_eq!(
            call("--function frobnicate").unwrap_err().to_string(),
            "invalid function \"frobnicate\""
        );
        assert!(call("--token 1").is_err());
        assert!(call("--function paths --job").is_err());
        assert!(call("--function paths --jbo x")
            .unwrap_err()
            .to_string()
            .contains("unknown option"));
        assert!(call("--function data_in --token 1 --token 2").is_err());
    }

    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        const WORDS: &[&str] = &[
            "--function",
            "setup",
            "paths",
            "teardown",
            "pools",
            "create_persistent",
            "--token",
            "--job",
            "--pathfile",
            "--capacity",
            "--hurry",
            "-C",
            "-t",
            "wlm_pool:1GiB",
            "p:0",
            "p:2N",
            ":",
            "1.5GiB",
            "99999999999999999999",
            "",
            "--",
        ];

        proptest! {
            /// Whatever Slurm (or anyone) passes: a call or a refusal, never a panic.
            #[test]
            fn any_argv(words in prop::collection::vec(prop_oneof![
                prop::sample::select(WORDS).prop_map(str::to_string),
                "\\PC{0,12}",
            ], 0..10)) {
                if let Ok(c) = Call::parse(&words) {
                    prop_assert!(known(&c.function).is_some());
                }
                for w in &words {
                    let _ = capacity(w);
                }
            }
        }
    }

    #[test]
    fn capacities() {
        assert_eq!(
            capacity("wlm_pool:200GiB"),
            Ok((Some("wlm_pool".into()), 200 << 30))
        );
        assert_eq!(
            capacity("wlm_pool:1073741824"),
            Ok((Some("wlm_pool".into()), 1 << 30))
        );
        assert_eq!(capacity("0"), Ok((None, 0)));
        assert_eq!(capacity("p:0"), Ok((Some("p".into()), 0)));
        assert!(capacity("p:2N").unwrap_err().contains("nodes"));
        assert!(capacity("p:1.5GiB").is_err());
    }
}
