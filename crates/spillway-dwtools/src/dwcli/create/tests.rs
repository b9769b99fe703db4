//! `dwcli create` command lines: the request each sends, its usage errors, and the
//! summary line of the manager's answer.

use super::*;
use crate::dwcli::testing::{answer, ok, post, req, usage_error};
use crate::dwcli::Verb;
use serde_json::json;
use serde_json::value::RawValue;

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
    assert!(usage_error("dwcli create instance --capacity 1G --session x").contains("--session"));
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

fn created(line: &str, a: &Answer) -> String {
    match ok(line).verb {
        Verb::Create { what } => create_summary(&what, a).unwrap(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn create_summaries() {
    let pools = include_str!("../../../testdata/pools.json");
    let nodes = include_str!("../../../testdata/nodes.json");
    let sessions = include_str!("../../../testdata/sessions.json");
    let insts = include_str!("../../../testdata/instances.json");
    let confs = include_str!("../../../testdata/configurations.json");
    let acts = include_str!("../../../testdata/activations.json");
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
