use super::*;

fn parse(s: &str) -> Result<JobSpec, String> {
    JobSpec::parse(s.as_bytes()).map_err(|e| e.to_string())
}

#[test]
fn the_spec_example_resolves() {
    let s = "#!/bin/bash
#SBATCH -N 4 -t 30
#DW jobdw type=scratch access_mode=striped capacity=400GiB pool=wlm_pool
#DW persistentdw name=refdb
#DW stage_in  type=directory source=/lus/proj/in  destination=$DW_JOB_STRIPED/in
#DW stage_in  type=file source=/lus/proj/db//x.db destination=${DW_PERSISTENT_STRIPED_refdb}/x.db
#DW stage_out type=file      source=$DW_JOB_STRIPED/out.h5 destination=/lus/proj/out.h5
srun ./app --tmp=$DW_JOB_PRIVATE --in=$DW_JOB_STRIPED/in
#DW stage_out type=directory source=$DW_JOB_STRIPED/ destination=/lus/proj/all/
\0";
    let j = parse(s).unwrap();
    let inst = j.instance.as_ref().unwrap();
    assert_eq!((inst.line, inst.spec.capacity), (3, 400 << 30));
    assert_eq!(j.persistent, vec!["refdb".to_string()]);
    assert_eq!(
        j.stage_in,
        vec![
            Stage {
                line: 5,
                direction: StageDirection::In,
                kind: StageKind::Directory,
                pfs: "/lus/proj/in".into(),
                instance: InstancePath {
                    target: Target::JobStriped,
                    path: "/in".into()
                },
            },
            Stage {
                line: 6,
                direction: StageDirection::In,
                kind: StageKind::File,
                pfs: "/lus/proj/db/x.db".into(),
                instance: InstancePath {
                    target: Target::Persistent("refdb".into()),
                    path: "/x.db".into()
                },
            },
        ]
    );
    assert_eq!(j.stage_out.len(), 2);
    assert_eq!(
        j.stage_out[1].line, 9,
        "a stage line after the commands counts"
    );
    assert_eq!(j.stage_out[1].instance.path, "/");
    assert_eq!(j.stage_out[1].pfs, "/lus/proj/all");
}

#[test]
fn persistent_only_jobs() {
    let j = parse("#!/bin/bash\n#SBATCH -N0\n#BB create_persistent name=refdb capacity=2TiB access=striped type=scratch\n#BB destroy_persistent name=old hurry\n").unwrap();
    assert!(j.instance.is_none());
    assert_eq!(j.create[0].name, "refdb");
    assert_eq!(j.destroy, vec![("old".to_string(), true)]);
    assert!(parse("#!/bin/sh\necho no burst buffer\n")
        .unwrap()
        .is_empty());
}

#[test]
fn every_wrong_line_is_named() {
    let s = "#!/bin/bash
#DW jobdw capacity=3.5TB
#DW stage_in type=file destination=$DW_JOB_STRIPED/x
#DW persistentdw name=1st
echo hi
";
    let e = parse(s).unwrap_err();
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 3, "{e}");
    assert!(
        lines[0].starts_with("line 2: jobdw:") && lines[0].contains("decimal"),
        "{e}"
    );
    assert!(
        lines[1].starts_with("line 3: stage_in: missing source="),
        "{e}"
    );
    assert!(lines[2].starts_with("line 4: persistentdw:"), "{e}");
}

fn refused(script: &str, line: usize, why: &str) {
    match parse(script) {
        Ok(j) => panic!("accepted: {script:?} as {j:?}"),
        Err(e) => assert!(
            e.contains(&format!("line {line}: ")) && e.contains(why),
            "{script:?}: {e:?} does not say line {line}: ...{why:?}"
        ),
    }
}

#[test]
fn how_directives_fit_together() {
    refused(
        "#!/bin/sh\n#DW jobdw capacity=1G\n#DW jobdw capacity=1G\n",
        3,
        "line 2 already asks",
    );
    refused(
        "#!/bin/sh\necho\n#DW jobdw capacity=1G\n",
        3,
        "after the script's first command",
    );
    refused(
        "#!/bin/sh\necho\n#BB create_persistent name=a capacity=1G\n",
        3,
        "move it up",
    );
    refused(
        "#!/bin/sh\n#DW persistentdw name=a\n#DW persistentdw name=a\n",
        3,
        "given twice",
    );
    refused(
        "#!/bin/sh\n#DW stage_in type=file source=/a destination=$DW_JOB_STRIPED/a\n",
        2,
        "no #DW jobdw line",
    );
    refused("#!/bin/sh\n#DW jobdw capacity=1G\n#DW stage_in type=file source=/a destination=$DW_PERSISTENT_STRIPED_db/a\n", 3, "no #DW persistentdw name=db");
    refused("#!/bin/sh\n#DW jobdw capacity=1G\n#DW stage_in type=file source=$DW_JOB_STRIPED/a destination=$DW_JOB_STRIPED/b\n", 3, "is on the PFS");
    refused("#!/bin/sh\n#DW jobdw capacity=1G\n#DW stage_in type=file source=a destination=$DW_JOB_STRIPED/b\n", 3, "absolute PFS path");
    refused(
        "#!/bin/sh\n#DW jobdw capacity=1G\n#DW stage_out type=file source=/x destination=/y\n",
        3,
        "must be an instance path",
    );
    refused("#!/bin/sh\n#DW jobdw capacity=1G\n#DW stage_in type=file source=/a destination=$DW_JOB_PRIVATE/a\n", 3, "private namespaces");
    refused("#!/bin/sh\n#DW jobdw capacity=1G\n#DW stage_in type=file source=/a destination=$DW_JOB_STRIPEDX/a\n", 3, "unknown variable");
    refused(
        "#!/bin/sh\n#DW jobdw capacity=1G\n#DW stage_in type=file source=/a destination=$HOME/a\n",
        3,
        "not a DataWarp variable",
    );
    refused("#!/bin/sh\n#DW jobdw capacity=1G\n#DW stage_in type=file source=/a destination=${DW_JOB_STRIPED/a\n", 3, "unclosed");
    refused("#!/bin/sh\n#DW jobdw capacity=1G\n#DW stage_in type=file source=/a/../b destination=$DW_JOB_STRIPED/a\n", 3, ". and ..");
    refused("#!/bin/sh\n#DW jobdw capacity=1G\n#DW stage_in type=file source=/a destination=$DW_JOB_STRIPED\n", 3, "whole instance");
    refused("#!/bin/sh\n#DW jobdw capacity=1G\n#DW stage_in type=list source=/a destination=$DW_JOB_STRIPED/\n", 3, "type=list is not supported");
    refused("#!/bin/sh\n#DW swap 1GiB\n", 2, "not supported");
    refused(
        "#!/bin/sh\n#DW jobdw type=cache pfs=/lus capacity=1G\n#DW stage_in type=file source=/a destination=$DW_JOB_STRIPED/a\n",
        3,
        "is a cache of /lus",
    );
    refused(
        "#!/bin/sh\n#DW jobdw access_mode=ldbal capacity=1G\n#DW stage_in type=file source=/a destination=$DW_JOB_STRIPED/a\n",
        3,
        "its path is $DW_JOB_LDBAL",
    );
    refused(
        "#!/bin/sh\n#DW jobdw capacity=1G\n#DW stage_in type=file source=/a destination=$DW_JOB_LDBAL/a\n",
        3,
        "not a load-balanced scratch instance",
    );
    refused(
        "#!/bin/sh\n#DW jobdw access_mode=ldbal,striped capacity=1G\n",
        2,
        "cannot be combined",
    );
    refused("#!/bin/sh\n#DW jobdw access_mode=private capacity=1G\n#DW stage_in type=file source=/a destination=$DW_JOB_STRIPED/a\n", 3, "private only");
}

#[test]
fn a_cache_job_needs_no_stage_lines() {
    let j = parse("#!/bin/sh\n#DW jobdw type=cache pfs=/lus/proj capacity=1G sync_on_close=yes\n")
        .unwrap();
    let i = j.instance.unwrap();
    assert_eq!(i.spec.kind, InstanceType::Cache);
    assert_eq!(i.spec.pfs.as_deref(), Some("/lus/proj"));
    assert_eq!(i.spec.policy.sync_on_close, Some(true));
    assert!(j.stage_in.is_empty() && j.stage_out.is_empty());
}

#[test]
fn load_balanced_instances_are_staged_through_their_own_variable() {
    let j = parse(
        "#!/bin/sh\n#DW jobdw access_mode=ldbal capacity=1G\n#DW stage_in type=directory source=/lus/ref destination=$DW_JOB_LDBAL/ref\n",
    )
    .unwrap();
    assert!(j.instance.as_ref().unwrap().spec.access.ldbal);
    assert_eq!(j.stage_in[0].instance.target, Target::JobStriped);
    assert_eq!(j.stage_in[0].instance.path, "/ref");
    let c = parse("#!/bin/sh\n#DW jobdw type=cache access_mode=ldbal pfs=/lus/ref capacity=1G\n")
        .unwrap();
    let i = c.instance.unwrap();
    assert!(i.spec.access.ldbal && i.spec.kind == InstanceType::Cache);
    let p = parse("#!/bin/sh\n#BB create_persistent name=ref capacity=1G access=ldbal\n").unwrap();
    assert!(p.create[0].access.ldbal);
}

#[test]
fn private_access_is_accepted_alone_or_with_striped() {
    for (modes, striped) in [
        ("private", false),
        ("striped,private", true),
        ("private,striped", true),
    ] {
        let j = parse(&format!(
            "#!/bin/sh\n#DW jobdw access_mode={modes} capacity=1G\n"
        ))
        .unwrap();
        let a = j.instance.unwrap().spec.access;
        assert!(a.private && a.striped == striped, "{modes}");
    }
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    const WORDS: &[&str] = &[
        "#DW",
        "#BB",
        "#SBATCH",
        "echo",
        "jobdw",
        "persistentdw",
        "swap",
        "stage_in",
        "stage_out",
        "create_persistent",
        "destroy_persistent",
        "hurry",
        "capacity=1GiB",
        "capacity=3.5TB",
        "capacity=0",
        "capacity=18446744073709551615",
        "capacity=2N",
        "type=scratch",
        "type=cache",
        "type=file",
        "type=directory",
        "type=list",
        "access_mode=striped,private",
        "access=ldbal",
        "pool=wlm_pool",
        "pfs=/lus",
        "name=refdb",
        "name=9x",
        "source=/lus/in",
        "source=$DW_JOB_STRIPED/out",
        "destination=$DW_JOB_STRIPED/in",
        "destination=${DW_PERSISTENT_STRIPED_refdb}/x",
        "destination=/lus/../x",
        "stripe_size=1MiB",
        "=",
        "x=",
        "\\",
        "$",
        "${",
        "\t",
        " ",
        "\u{e9}",
    ];

    fn script() -> impl Strategy<Value = Vec<u8>> {
        let line =
            prop::collection::vec(prop::sample::select(WORDS), 0..8).prop_map(|w| w.join(" "));
        prop::collection::vec(line, 0..12).prop_map(|lines| lines.join("\n").into_bytes())
    }

    /// Whatever the script, parsing ends with a spec or with messages that each name a
    /// line of the script; accepted paths are normalised.
    fn check(bytes: &[u8]) {
        let lines = bytes.split(|&b| b == b'\n').count();
        match JobSpec::parse(bytes) {
            Ok(spec) => {
                for s in spec.stage_in.iter().chain(&spec.stage_out) {
                    for p in [&s.pfs, &s.instance.path] {
                        assert!(
                            p.starts_with('/') && !p.contains("//") && !p.contains("/../"),
                            "{p}"
                        );
                        assert!(p == "/" || !p.ends_with('/'), "{p}");
                    }
                }
                if let Some(i) = &spec.instance {
                    assert!(i.spec.capacity > 0);
                }
            }
            Err(e) => {
                assert!(!e.0.is_empty());
                for err in &e.0 {
                    assert!(err.line <= lines, "{err} beyond {lines} lines");
                    assert!(!err.message.is_empty());
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]
        #[test]
        fn token_soup(bytes in script()) {
            check(&bytes);
        }

        #[test]
        fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            check(&bytes);
        }

        #[test]
        fn directive_lines_with_arbitrary_text(prefix in prop::sample::select(&["#DW ", "#BB ", "#DW jobdw ", "#DW stage_in "][..]), rest in "\\PC{0,80}") {
            check(format!("{prefix}{rest}").as_bytes());
        }
    }
}
