//! Requests that can never be met: a `#DW jobdw` or `#BB create_persistent` asking for
//! more capacity than its pool holds in total, or naming a pool that does not exist.
//! Slurm would keep such a job pending forever (`BurstBufferResources`), exactly like
//! a job waiting for a busy pool; `job_process` and `spillway run` refuse it at
//! submit instead, with a message per line.
//!
//! "In total" is every node of the pool, online or not, drained or not (each node's
//! capacity in whole granules): a request that fits once a node is back is only
//! waiting, and is let through. A request without `pool=` is checked against the
//! largest pool (Slurm's `DefaultPool`, which decides it, is not known here): it is
//! refused only when no pool could hold it.

use crate::error::{ScriptError, ScriptErrors};
use crate::job::JobSpec;
use spillway_api::size::human;
use spillway_api::{ApiClient, ApiError, Node, Pool};

/// A pool's whole size: granularity and how many granules its nodes hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolTotal {
    pub id: String,
    pub granularity: u64,
    pub bytes: u64,
    pub nodes: usize,
}

/// Every pool's total, from the manager's pool and node lists (database reads only,
/// fast enough for the submit RPC).
pub fn pool_totals(api: &ApiClient) -> Result<Vec<PoolTotal>, ApiError> {
    let pools = api.list_pools()?;
    let nodes = api.list_nodes()?;
    Ok(totals(&pools, &nodes))
}

fn totals(pools: &[Pool], nodes: &[Node]) -> Vec<PoolTotal> {
    pools
        .iter()
        .map(|p| {
            let mine: Vec<&Node> = nodes
                .iter()
                .filter(|n| n.pool.as_deref() == Some(p.id.as_str()))
                .collect();
            let granules: u64 = mine
                .iter()
                .map(|n| n.capacity.checked_div(p.granularity).unwrap_or(0))
                .fold(0u64, u64::saturating_add);
            PoolTotal {
                id: p.id.clone(),
                granularity: p.granularity,
                bytes: granules.saturating_mul(p.granularity),
                nodes: mine.len(),
            }
        })
        .collect()
}

/// What of `spec` can never fit in `pools`, one error per request (empty: all may fit).
pub fn impossible(spec: &JobSpec, pools: &[PoolTotal]) -> Vec<ScriptError> {
    let mut out = Vec::new();
    if let Some(ji) = &spec.instance {
        if let Some(m) = never_fits(ji.spec.capacity, ji.spec.pool.as_deref(), pools) {
            out.push(ScriptError::at(ji.line, format!("#DW jobdw: {m}")));
        }
    }
    for c in &spec.create {
        if let Some(m) = never_fits(c.capacity, c.pool.as_deref(), pools) {
            out.push(ScriptError::whole(format!(
                "#BB create_persistent name={}: {m}",
                c.name
            )));
        }
    }
    out
}

/// Refuse `spec` if any request in it can never fit (for job_process and spillway run).
pub fn check(spec: &JobSpec, pools: &[PoolTotal]) -> Result<(), ScriptErrors> {
    let errs = impossible(spec, pools);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ScriptErrors(errs))
    }
}

fn never_fits(bytes: u64, pool: Option<&str>, pools: &[PoolTotal]) -> Option<String> {
    let asked = format!("capacity {} ({bytes} bytes)", human(bytes));
    match pool {
        Some(name) => {
            let Some(p) = pools.iter().find(|p| p.id == name) else {
                let names: Vec<&str> = pools.iter().map(|p| p.id.as_str()).collect();
                return Some(format!(
                    "pool={name}: no such pool (pools: {})",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ));
            };
            (bytes > p.bytes).then(|| {
                format!(
                    "{asked} is more than pool {} holds in total ({} on {} node(s)): the job could never start; ask for at most {}",
                    p.id,
                    human(p.bytes),
                    p.nodes,
                    human(p.bytes)
                )
            })
        }
        None => {
            // Slurm chooses the pool (its DefaultPool): refuse only what none can hold.
            let largest = pools.iter().max_by_key(|p| p.bytes)?;
            (bytes > largest.bytes).then(|| {
                format!(
                    "{asked} is more than any pool holds in total (the largest, {}, holds {} on {} node(s)): the job could never start",
                    largest.id,
                    human(largest.bytes),
                    largest.nodes
                )
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_api::NodeLinks;

    const G: u64 = 1 << 30;

    fn node(id: &str, pool: Option<&str>, capacity: u64, online: bool) -> Node {
        Node {
            id: id.into(),
            address: "h:1".into(),
            pool: pool.map(str::to_string),
            online,
            drain: false,
            capacity,
            free: capacity,
            granularity: G,
            health: "ok".into(),
            last_heartbeat: 0,
            links: NodeLinks {
                fragments: vec![],
                instances: vec![],
                activations: vec![],
            },
        }
    }

    fn pool(id: &str, granularity: u64) -> Pool {
        Pool {
            id: id.into(),
            units: "bytes".into(),
            granularity,
            quantity: 0,
            free: 0,
        }
    }

    fn spec(script: &str) -> JobSpec {
        JobSpec::parse(script.as_bytes()).expect("a valid script")
    }

    #[test]
    fn totals_count_whole_granules_of_every_node() {
        let t = totals(
            &[pool("wlm", G), pool("small", 4 * G), pool("empty", G)],
            &[
                node("a", Some("wlm"), 8 * G + 5, true),
                // Offline nodes still count: the request only waits for them.
                node("b", Some("wlm"), 8 * G, false),
                node("c", Some("small"), 7 * G, true),
                node("d", None, 100 * G, true),
            ],
        );
        assert_eq!(t[0].bytes, 16 * G);
        assert_eq!(t[0].nodes, 2);
        assert_eq!(t[1].bytes, 4 * G);
        assert_eq!(t[2].bytes, 0);
        assert_eq!(
            totals(&[pool("z", 0)], &[node("a", Some("z"), G, true)])[0].bytes,
            0
        );
    }

    #[test]
    fn what_never_fits_is_refused() {
        let pools = vec![
            PoolTotal {
                id: "wlm".into(),
                granularity: G,
                bytes: 16 * G,
                nodes: 2,
            },
            PoolTotal {
                id: "small".into(),
                granularity: G,
                bytes: 4 * G,
                nodes: 1,
            },
        ];
        let ok = spec("#!/bin/sh\n#DW jobdw capacity=16GiB pool=wlm\n");
        assert!(check(&ok, &pools).is_ok());
        let ok = spec("#!/bin/sh\n#DW jobdw capacity=10GiB\n");
        assert!(check(&ok, &pools).is_ok(), "the largest pool holds it");

        let big = spec("#!/bin/sh\n#SBATCH -N1\n#DW jobdw capacity=17GiB pool=wlm\n");
        let e = check(&big, &pools).unwrap_err().to_string();
        assert!(e.starts_with("line 3: #DW jobdw: capacity 17GiB"), "{e}");
        assert!(
            e.contains("more than pool wlm holds in total (16GiB on 2 node(s))"),
            "{e}"
        );

        let e = check(&spec("#DW jobdw capacity=5GiB pool=small\n"), &pools).unwrap_err();
        assert!(e.to_string().contains("pool small"), "{e}");

        let e = check(&spec("#DW jobdw capacity=1TB\n"), &pools)
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than any pool holds"), "{e}");

        let e = check(&spec("#DW jobdw capacity=1GiB pool=nosuch\n"), &pools).unwrap_err();
        assert!(
            e.to_string().contains("no such pool (pools: wlm, small)"),
            "{e}"
        );

        let e = check(
            &spec("#BB create_persistent name=big capacity=20GiB pool=wlm\n"),
            &pools,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("#BB create_persistent name=big: capacity 20GiB"),
            "{e}"
        );
    }

    #[test]
    fn without_pools_nothing_is_judged_but_named_pools() {
        assert!(check(&spec("#DW jobdw capacity=1GiB\n"), &[]).is_ok());
        assert!(check(&spec("#DW jobdw capacity=1GiB pool=x\n"), &[]).is_err());
    }
}
