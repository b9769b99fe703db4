use super::*;
use crate::script::directives;

fn one(line: &str) -> Result<Directive, String> {
    let raw = directives(line.as_bytes()).map_err(|e| e.to_string())?;
    assert_eq!(raw.len(), 1, "{line}");
    parse(&raw[0])
        .map(|l| l.directive)
        .map_err(|e| e.to_string())
}

fn refused(line: &str, why: &str) {
    match one(line) {
        Ok(d) => panic!("{line:?} was accepted as {d:?}"),
        Err(e) => assert!(e.contains(why), "{line:?}: {e:?} does not say {why:?}"),
    }
}

#[test]
fn jobdw_with_every_key() {
    assert_eq!(
        one("#DW jobdw type=scratch access_mode=striped capacity=400GiB pool=wlm_pool stripe_size=1MiB").unwrap(),
        Directive::JobDw(JobDw {
            kind: InstanceType::Scratch,
            access: AccessModes::STRIPED,
            capacity: 400 << 30,
            pool: Some("wlm_pool".into()),
            pfs: None,
            stripe_size: Some(1 << 20),
            policy: CachePolicy::default(),
        })
    );
    // Defaults: scratch, striped, the site's default pool.
    assert_eq!(
        one("#DW jobdw capacity=1TB").unwrap(),
        Directive::JobDw(JobDw {
            kind: InstanceType::Scratch,
            access: AccessModes::STRIPED,
            capacity: 1_000_000_000_000,
            pool: None,
            pfs: None,
            stripe_size: None,
            policy: CachePolicy::default(),
        })
    );
    let Directive::JobDw(j) = one("#DW jobdw access_mode=private,striped capacity=1G").unwrap()
    else {
        panic!()
    };
    assert!(j.access.striped && j.access.private && !j.access.ldbal);
    let Directive::JobDw(j) =
        one("#DW jobdw type=cache access_mode=loadbalance pfs=/lus/x capacity=1G").unwrap()
    else {
        panic!()
    };
    assert_eq!(
        (j.kind, j.access.ldbal, j.pfs.as_deref()),
        (InstanceType::Cache, true, Some("/lus/x"))
    );
    // A cache's policies (docs/cache.md, "Policies").
    let Directive::JobDw(j) = one(
        "#DW jobdw type=cache pfs=/lus/x capacity=1G modified_threshold=8MiB read_ahead=1MiB sync_on_close=yes sync_to_pfs=no",
    )
    .unwrap() else {
        panic!()
    };
    assert_eq!(
        j.policy,
        CachePolicy {
            modified_threshold: Some(8 << 20),
            read_ahead: Some(1 << 20),
            sync_on_close: Some(true),
            sync_to_pfs: Some(false),
        }
    );
}

#[test]
fn jobdw_refusals_say_what_is_wrong() {
    refused("#DW jobdw capacity=3.5TB", "decimal");
    refused("#DW jobdw capacity=10XB", "unknown size unit");
    refused("#DW jobdw capacity=0", "more than 0");
    refused("#DW jobdw capacity=2N", "in nodes");
    refused("#DW jobdw capacity=99999999PiB", "out of range");
    refused("#DW jobdw type=scratch", "missing capacity=");
    refused(
        "#DW jobdw capacity=1GiB colour=blue",
        "unknown key \"colour\"",
    );
    refused("#DW jobdw capacity=1GiB capacity=2GiB", "given twice");
    refused("#DW jobdw capacity=", "has no value");
    refused("#DW jobdw capacity=1GiB striped", "not a key=value");
    refused(
        "#DW jobdw type=fast capacity=1GiB",
        "not one of scratch, cache",
    );
    refused(
        "#DW jobdw access_mode=mirrored capacity=1GiB",
        "not one of striped, private, ldbal",
    );
    refused(
        "#DW jobdw access_mode=striped, capacity=1GiB",
        "empty access mode",
    );
    refused(
        "#DW jobdw access_mode=ldbal,striped capacity=1GiB",
        "cannot be combined",
    );
    refused(
        "#DW jobdw type=cache access_mode=private pfs=/lus/x capacity=1GiB",
        "private is not possible on a cache",
    );
    refused("#DW jobdw type=cache capacity=1GiB", "needs pfs=");
    refused(
        "#DW jobdw pfs=/lus/x capacity=1GiB",
        "pfs= is for type=cache",
    );
    refused("#DW jobdw type=cache pfs=lus/x capacity=1GiB", "absolute");
    refused(
        "#DW jobdw capacity=1GiB sync_on_close=yes",
        "cache policies, for type=cache",
    );
    refused(
        "#DW jobdw type=cache pfs=/x capacity=1GiB sync_to_pfs=maybe",
        "not yes or no",
    );
    refused(
        "#DW jobdw type=cache pfs=/x capacity=1GiB read_ahead=2GiB",
        "more than 1GiB",
    );
    refused("#DW jobdw pool=a/b capacity=1GiB", "not a pool name");
    refused("#DW jobdw stripe_size=3MiB capacity=1GiB", "power of two");
    refused("#DW jobdw stripe_size=4KiB capacity=1GiB", "power of two");
}

#[test]
fn other_directives() {
    assert_eq!(
        one("#DW persistentdw name=refdb").unwrap(),
        Directive::PersistentDw {
            name: "refdb".into()
        }
    );
    assert_eq!(
        one("#DW swap 3TiB pool=sm").unwrap(),
        Directive::Swap {
            bytes: 3 << 40,
            pool: Some("sm".into())
        }
    );
    assert_eq!(
        one("#DW stage_in type=directory source=/lus/in destination=$DW_JOB_STRIPED/in").unwrap(),
        Directive::Stage(StageLine {
            direction: StageDirection::In,
            kind: StageKind::Directory,
            source: "/lus/in".into(),
            destination: "$DW_JOB_STRIPED/in".into(),
        })
    );
    assert_eq!(
        one("#BB create_persistent name=refdb capacity=2TiB access=striped type=scratch").unwrap(),
        Directive::CreatePersistent(CreatePersistent {
            name: "refdb".into(),
            capacity: 2 << 40,
            access: AccessModes::STRIPED,
            kind: InstanceType::Scratch,
            pool: None,
            pfs: None,
            policy: CachePolicy::default(),
        })
    );
    let Directive::CreatePersistent(c) =
        one("#BB create_persistent name=b capacity=48 access_mode=striped pool=p").unwrap()
    else {
        panic!()
    };
    assert_eq!((c.capacity, c.pool.as_deref()), (48, Some("p")));
    assert_eq!(
        one("#BB destroy_persistent name=refdb hurry").unwrap(),
        Directive::DestroyPersistent {
            name: "refdb".into(),
            hurry: true
        }
    );
    assert_eq!(
        one("#BB destroy_persistent name=refdb").unwrap(),
        Directive::DestroyPersistent {
            name: "refdb".into(),
            hurry: false
        }
    );
}

#[test]
fn other_refusals() {
    refused(
        "#DW stage_in type=file destination=$DW_JOB_STRIPED/x",
        "missing source=",
    );
    refused(
        "#DW stage_out type=file source=$DW_JOB_STRIPED/x",
        "missing destination=",
    );
    refused(
        "#DW stage_in source=/a destination=$DW_JOB_STRIPED/x",
        "missing type=",
    );
    refused(
        "#DW stage_in type=tree source=/a destination=$DW_JOB_STRIPED/x",
        "not one of file, directory, list",
    );
    refused(
        "#BB create_persistent name=1abc capacity=1GiB",
        "starts with a digit",
    );
    refused(
        "#BB create_persistent name=my-db capacity=1GiB",
        "not a persistent name",
    );
    refused("#BB create_persistent name=refdb", "missing capacity=");
    refused(
        "#BB create_persistent name=refdb capacity=1.5GiB",
        "decimal",
    );
    refused(
        "#BB create_persistent name=r capacity=1G access=striped access_mode=striped",
        "not both",
    );
    refused(
        "#BB create_persistent name=r capacity=1G access=private",
        "for job instances",
    );
    refused(
        "#BB create_persistent name=r capacity=1G type=cache",
        "type=cache needs pfs=",
    );
    refused(
        "#BB create_persistent name=r capacity=1G pfs=/lus/x",
        "pfs= is for type=cache",
    );
    refused(
        "#BB create_persistent name=r capacity=1G sync_on_close=yes",
        "cache policies",
    );
    refused(
        "#BB create_persistent name=r capacity=1G type=cache pfs=lus/x",
        "pfs",
    );
    refused("#BB destroy_persistent name=r now", "neither");
    refused("#BB destroy_persistent hurry", "missing name=");
    refused("#DW persistentdw", "missing name=");
    refused("#DW persistentdw name=9", "starts with a digit");
    refused("#DW swap", "missing the size");
    refused("#DW swap 1GiB 2GiB", "unexpected");
    refused(
        "#DW create_persistent name=a capacity=1G",
        "refused by Slurm; write #BB",
    );
    refused("#BB jobdw capacity=1G", "write #DW jobdw");
    refused("#DW stagein type=file", "unknown directive #DW stagein");
    refused("#BB create name=x", "unknown directive #BB create");
    refused("#DW", "with no command");
    refused("#DWjobdw capacity=1G", "put a space");
}

#[test]
fn a_persistent_cache_names_its_directory_and_policies() {
    let Directive::CreatePersistent(c) = one(
        "#BB create_persistent name=ref capacity=1GiB type=cache access=ldbalance pfs=/lus/ref sync_on_close=yes read_ahead=4MiB",
    )
    .unwrap() else {
        panic!("not a create_persistent");
    };
    assert_eq!(c.kind, InstanceType::Cache);
    assert!(c.access.ldbal);
    assert_eq!(c.pfs.as_deref(), Some("/lus/ref"));
    assert_eq!(c.policy.sync_on_close, Some(true));
    assert_eq!(c.policy.read_ahead, Some(4 << 20));
}
