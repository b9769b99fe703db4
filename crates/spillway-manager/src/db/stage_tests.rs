//! Staging's database rules without servers: validation and owners, counting, records
//! replaced by newer stages, concurrency, teardown holds and hurry, lost coordinators.

use super::*;
use spillway_api::*;
use stages::ECANCELED;

const ROOTS: &[&str] = &["/pfs"];

fn roots() -> Vec<String> {
    ROOTS.iter().map(|s| s.to_string()).collect()
}

/// A database with two online nodes and a built instance owned by `owner`:
/// (db, session, instance).
fn built(owner: u32) -> (Db, u64, u64) {
    let mut db = Db::open_in_memory().unwrap();
    db.create_pool(&NewPool {
        id: "p".into(),
        granularity: 1 << 30,
        units: None,
    })
    .unwrap();
    for (n, name) in ["s0", "s1"].iter().enumerate() {
        db.create_node(&NewNode {
            id: name.to_string(),
            address: format!("127.0.0.1:{}", 7000 + n),
            pool: Some("p".into()),
            capacity: None,
        })
        .unwrap();
        db.record_heartbeat(name, Ok(10 << 30), 10).unwrap();
    }
    let s = db
        .create_session(
            Viewer::Admin,
            0,
            &NewSession {
                token: "t".into(),
                owner: Some(owner),
                creator: None,
                client_nodes: vec![],
                expiration: None,
            },
        )
        .unwrap()
        .id;
    let i = db
        .create_instance(
            Viewer::Admin,
            &NewInstancePlan {
                req: NewInstance {
                    session: s,
                    capacity: 2 << 30,
                    pool: None,
                    label: None,
                    public: None,
                    policy: None,
                    limits: None,
                    stripe_size: None,
                    expiration: None,
                },
                pool: "p".into(),
                policy: Policy::Bandwidth,
                stripe_size: 1 << 20,
                secret: vec![1; 32],
            },
        )
        .unwrap()
        .id;
    for w in db.fragment_work().unwrap() {
        db.record_fragment(w.fragment, Ok(())).unwrap();
    }
    db.advance().unwrap();
    assert!(db.instance(Viewer::Admin, i).unwrap().state.actualized);
    (db, s, i)
}

fn new_stage(
    instance: u64,
    direction: StageDirection,
    kind: StageType,
    src: &str,
    dst: &str,
) -> NewStage {
    NewStage {
        instance,
        direction,
        kind,
        source: src.into(),
        destination: dst.into(),
        pairs: vec![],
        when: None,
        owner: None,
    }
}

fn file_in(instance: u64, pfs: &str, path: &str) -> NewStage {
    new_stage(instance, StageDirection::In, StageType::File, pfs, path)
}

fn deferred_out(instance: u64, path: &str, pfs: &str) -> NewStage {
    NewStage {
        when: Some(StageWhen::JobEnd),
        ..new_stage(instance, StageDirection::Out, StageType::File, path, pfs)
    }
}

fn counts(db: &Db, i: u64, path: &str, scope: StageScope) -> (u64, u64, u64, u64, bool) {
    let c = db.stage_counts(Viewer::Admin, i, path, scope).unwrap();
    (c.complete, c.pending, c.deferred, c.failed, c.started)
}

fn ev(path: &str, state: FileState) -> FileEvent {
    FileEvent {
        path: path.into(),
        state,
        errno: if state == FileState::Failed { 13 } else { 0 },
        message: if state == FileState::Failed {
            format!("{path}: permission denied")
        } else {
            String::new()
        },
        bytes: 10,
    }
}

fn progress(events: Vec<FileEvent>, enumerated: bool, cursor: u64) -> Progress {
    Progress {
        enumerated,
        files_total: events.len() as u64,
        events,
        cursor,
        ..Default::default()
    }
}

/// Start every stage the dispatcher would start now; their ids.
fn start_all(db: &mut Db) -> Vec<u64> {
    let work = db.stage_start_work(4).unwrap();
    for w in &work {
        assert!(db.record_stage_started(w.stage, &w.node).unwrap());
    }
    work.iter().map(|w| w.stage).collect()
}

fn fragments_goal(db: &Db, i: u64) -> Vec<Goal> {
    db.fragments(Viewer::Admin, None)
        .unwrap()
        .into_iter()
        .filter(|f| f.links.instance == i)
        .map(|f| f.state.goal)
        .collect()
}

#[test]
fn paths_are_checked_and_normalised() {
    assert_eq!(norm_path("p", "//a///b/").unwrap(), "/a/b");
    assert_eq!(norm_path("p", "/").unwrap(), "/");
    assert!(norm_path("p", "a/b").is_err());
    assert!(norm_path("p", "/a/../b").is_err());
    assert_eq!(norm_path("p", "/a/./b/.").unwrap(), "/a/b");
    assert!(norm_path("p", "/a\0b").is_err());
    assert!(under("/a/b", "/a") && under("/a", "/a") && under("/a", "/"));
    assert!(!under("/ab", "/a") && !under("/a", "/a/b"));
}

#[test]
fn validation_owners_and_visibility() {
    let (mut db, s, i) = built(1000);
    let me = Viewer::User(1000);
    let other = Viewer::User(2000);
    // The owner stages as themselves.
    let st = db
        .create_stage(me, 1000, &file_in(i, "/pfs/a", "/a"), &roots())
        .unwrap();
    assert_eq!(
        (st.owner, st.session, st.state),
        (1000, s, StageState::Queued)
    );
    // Another user: forbidden; naming another owner: admins only.
    let e = db.create_stage(other, 2000, &file_in(i, "/pfs/b", "/b"), &roots());
    assert!(matches!(e, Err(DbError::Forbidden(_))), "{e:?}");
    let mut req = file_in(i, "/pfs/b", "/b");
    req.owner = Some(2000);
    assert!(matches!(
        db.create_stage(me, 1000, &req, &roots()),
        Err(DbError::Forbidden(_))
    ));
    let by_admin = db.create_stage(Viewer::Admin, 0, &req, &roots()).unwrap();
    assert_eq!(by_admin.owner, 2000);
    // Outside the PFS roots, `..`, no roots at all, job_end for a stage-in.
    for (req, word) in [
        (file_in(i, "/etc/passwd", "/c"), "PFS roots"),
        (file_in(i, "/pfsx/a", "/c"), "PFS roots"),
        (file_in(i, "/pfs/../etc", "/c"), ".."),
        (file_in(i, "/pfs/a", "/"), "root"),
        (
            NewStage {
                when: Some(StageWhen::JobEnd),
                ..file_in(i, "/pfs/a", "/c")
            },
            "stage-outs only",
        ),
    ] {
        match db.create_stage(Viewer::Admin, 0, &req, &roots()) {
            Err(DbError::Invalid(m)) => assert!(m.contains(word), "{m}"),
            other => panic!("{other:?}"),
        }
    }
    assert!(matches!(
        db.create_stage(Viewer::Admin, 0, &file_in(i, "/pfs/a", "/c"), &[]),
        Err(DbError::Invalid(_))
    ));
    assert!(matches!(
        db.create_stage(Viewer::Admin, 0, &file_in(99, "/pfs/a", "/c"), &roots()),
        Err(DbError::NotFound(_))
    ));
    // Visibility: the stage's owner and the session's owner; admins see all.
    assert_eq!(db.stages(me, &StageFilter::default()).unwrap().len(), 2);
    assert_eq!(db.stages(other, &StageFilter::default()).unwrap().len(), 1);
    assert!(matches!(db.stage(other, st.id), Err(DbError::NotFound(_))));
    assert!(matches!(
        db.stage_action(other, st.id, StageAction::Terminate),
        Err(DbError::NotFound(_))
    ));
    assert!(matches!(
        db.stage_counts(other, i, "/", StageScope::Tree),
        Err(DbError::Forbidden(_))
    ));
    let f = StageFilter {
        state: Some(StageState::Queued),
        instance: Some(i),
        session: None,
    };
    assert_eq!(db.stages(Viewer::Admin, &f).unwrap().len(), 2);
}

#[test]
fn an_unenumerated_stage_counts_as_one_pending_or_deferred() {
    let (mut db, _, i) = built(0);
    assert_eq!(counts(&db, i, "/", StageScope::Tree), (0, 0, 0, 0, false));
    let d = db
        .create_stage(
            Viewer::Admin,
            0,
            &new_stage(
                i,
                StageDirection::In,
                StageType::Directory,
                "/pfs/in",
                "/in",
            ),
            &roots(),
        )
        .unwrap();
    // Any path at or under its instance path; a tree containing it.
    assert_eq!(counts(&db, i, "/in", StageScope::File), (0, 1, 0, 0, true));
    assert_eq!(
        counts(&db, i, "/in/x/y", StageScope::File),
        (0, 1, 0, 0, true)
    );
    assert_eq!(counts(&db, i, "/", StageScope::Tree), (0, 1, 0, 0, true));
    assert_eq!(
        counts(&db, i, "/in/x", StageScope::Tree),
        (0, 1, 0, 0, true)
    );
    assert_eq!(
        counts(&db, i, "/out", StageScope::Tree),
        (0, 0, 0, 0, false)
    );
    assert_eq!(
        counts(&db, i, "/inx", StageScope::File),
        (0, 0, 0, 0, false)
    );
    db.create_stage(Viewer::Admin, 0, &deferred_out(i, "/o", "/pfs/o"), &roots())
        .unwrap();
    assert_eq!(counts(&db, i, "/o", StageScope::File), (0, 0, 1, 0, true));
    assert_eq!(counts(&db, i, "/", StageScope::Tree), (0, 1, 1, 0, true));
    // A file with a pending or deferred stage takes no second one (409).
    assert!(matches!(
        db.create_stage(Viewer::Admin, 0, &deferred_out(i, "/o", "/pfs/p"), &roots()),
        Err(DbError::Conflict(_))
    ));
    assert!(matches!(
        db.create_stage(Viewer::Admin, 0, &file_in(i, "/pfs/a", "/in/a"), &roots()),
        Err(DbError::Conflict(_))
    ));
    // Once enumerated, the records count instead.
    start_all(&mut db);
    db.record_stage_progress(
        d.id,
        &progress(
            vec![
                ev("/in/a", FileState::Pending),
                ev("/in/b", FileState::Pending),
                ev("/in/a", FileState::Complete),
                ev("/in/c", FileState::Failed),
            ],
            true,
            4,
        ),
    )
    .unwrap();
    assert_eq!(counts(&db, i, "/in", StageScope::Tree), (1, 1, 0, 1, true));
    assert_eq!(
        counts(&db, i, "/in/a", StageScope::File),
        (1, 0, 0, 0, true)
    );
    assert_eq!(
        counts(&db, i, "/in/b", StageScope::File),
        (0, 1, 0, 0, true)
    );
    assert_eq!(
        counts(&db, i, "/in/zz", StageScope::File),
        (0, 0, 0, 0, false)
    );
    let s = db.stage(Viewer::Admin, d.id).unwrap();
    let e = s.error.unwrap();
    assert_eq!((e.path.as_str(), e.errno), ("/in/c", 13));
    // Failures in path order, paged.
    let f = db.stage_failures(Viewer::Admin, i, "", 10).unwrap();
    assert_eq!(f.failures.len(), 1);
    assert_eq!(f.failures[0].path, "/in/c");
    assert!(!f.more);
    assert!(db
        .stage_failures(Viewer::Admin, i, "/in/c", 10)
        .unwrap()
        .failures
        .is_empty());
}

#[test]
fn a_newer_stage_of_a_path_replaces_the_record() {
    let (mut db, _, i) = built(0);
    let a = db
        .create_stage(Viewer::Admin, 0, &file_in(i, "/pfs/a", "/f"), &roots())
        .unwrap();
    start_all(&mut db);
    db.record_stage_progress(a.id, &progress(vec![ev("/f", FileState::Failed)], true, 1))
        .unwrap();
    db.record_stage_end(a.id, &StageEnd::Failed("x".into()))
        .unwrap();
    assert_eq!(counts(&db, i, "/f", StageScope::File), (0, 0, 0, 1, true));
    // A failed record does not block a new stage of the path, which replaces it.
    let b = db
        .create_stage(Viewer::Admin, 0, &file_in(i, "/pfs/b", "/f"), &roots())
        .unwrap();
    assert_eq!(counts(&db, i, "/f", StageScope::File), (0, 1, 0, 0, true));
    start_all(&mut db);
    db.record_stage_progress(
        b.id,
        &progress(vec![ev("/f", FileState::Complete)], true, 1),
    )
    .unwrap();
    assert_eq!(counts(&db, i, "/f", StageScope::File), (1, 0, 0, 0, true));
    assert!(db
        .stage_failures(Viewer::Admin, i, "", 10)
        .unwrap()
        .failures
        .is_empty());
    // Two running stages over one file: the older one's late event does not replace
    // the newer one's record.
    let d = db
        .create_stage(
            Viewer::Admin,
            0,
            &new_stage(i, StageDirection::In, StageType::Directory, "/pfs/d", "/d"),
            &roots(),
        )
        .unwrap();
    start_all(&mut db);
    db.record_stage_progress(
        d.id,
        &progress(vec![ev("/d/f", FileState::Complete)], false, 1),
    )
    .unwrap();
    let e = db
        .create_stage(Viewer::Admin, 0, &file_in(i, "/pfs/e", "/d/f"), &roots())
        .unwrap();
    start_all(&mut db);
    db.record_stage_progress(
        e.id,
        &progress(vec![ev("/d/f", FileState::Pending)], true, 1),
    )
    .unwrap();
    db.record_stage_progress(
        d.id,
        &progress(vec![ev("/d/f", FileState::Failed)], true, 2),
    )
    .unwrap();
    assert_eq!(counts(&db, i, "/d/f", StageScope::File), (0, 1, 0, 0, true));
}

#[test]
fn concurrency_limits_running_stages_per_instance() {
    let (mut db, _, i) = built(0);
    db.set_stage_concurrency(Viewer::Admin, i, 1).unwrap();
    let ids: Vec<u64> = (0..3)
        .map(|n| {
            db.create_stage(
                Viewer::Admin,
                0,
                &file_in(i, &format!("/pfs/{n}"), &format!("/{n}")),
                &roots(),
            )
            .unwrap()
            .id
        })
        .collect();
    let w = db.stage_start_work(4).unwrap();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].stage, ids[0]);
    assert_eq!(w[0].pairs[0].source, "/pfs/0");
    // Coordinators are spread by stage id over the instance's online servers.
    assert!(["s0", "s1"].contains(&w[0].node.as_str()));
    db.record_stage_started(ids[0], &w[0].node).unwrap();
    assert!(db.stage_start_work(4).unwrap().is_empty());
    db.record_stage_end(ids[0], &StageEnd::Complete).unwrap();
    assert_eq!(db.stage_start_work(4).unwrap()[0].stage, ids[1]);
    db.set_stage_concurrency(Viewer::Admin, i, 64).unwrap();
    assert_eq!(db.stage_start_work(4).unwrap().len(), 2);
    // The site default applies without a setting of the instance.
    let (mut db2, _, i2) = built(0);
    for n in 0..3 {
        db2.create_stage(
            Viewer::Admin,
            0,
            &file_in(i2, &format!("/pfs/{n}"), &format!("/{n}")),
            &roots(),
        )
        .unwrap();
    }
    assert_eq!(db2.stage_start_work(2).unwrap().len(), 2);
    // No online server: nothing starts.
    for n in ["s0", "s1"] {
        db2.record_heartbeat(n, Err("down".into()), -1).unwrap();
    }
    assert!(db2.stage_start_work(2).unwrap().is_empty());
}

#[test]
fn a_refused_start_fails_and_a_lost_stage_fails_its_pending_files() {
    let (mut db, _, i) = built(0);
    let a = db
        .create_stage(
            Viewer::Admin,
            0,
            &new_stage(i, StageDirection::In, StageType::Directory, "/pfs/d", "/d"),
            &roots(),
        )
        .unwrap();
    let b = db
        .create_stage(Viewer::Admin, 0, &file_in(i, "/pfs/x", "/x"), &roots())
        .unwrap();
    let w = db.stage_start_work(4).unwrap();
    db.record_stage_refused(b.id, &w[1].node, 38, "server s1 refused to start stage 2")
        .unwrap();
    let sb = db.stage(Viewer::Admin, b.id).unwrap();
    assert_eq!(sb.state, StageState::Failed);
    assert_eq!(sb.error.unwrap().errno, 38);
    db.record_stage_started(a.id, "s0").unwrap();
    assert_eq!(
        db.live_stages().unwrap(),
        vec![LiveStage {
            stage: a.id,
            node: "s0".into(),
            address: Some("127.0.0.1:7000".into())
        }]
    );
    db.record_stage_progress(
        a.id,
        &progress(
            vec![
                ev("/d/1", FileState::Complete),
                ev("/d/2", FileState::Pending),
            ],
            true,
            2,
        ),
    )
    .unwrap();
    db.record_stage_lost(
        a.id,
        "server s0 lost the stage: it restarted or stopped mid-stage",
    )
    .unwrap();
    let sa = db.stage(Viewer::Admin, a.id).unwrap();
    assert_eq!(sa.state, StageState::Failed);
    let e = sa.error.unwrap();
    assert!(e.message.contains("server s0"), "{e:?}");
    assert_eq!((e.path.as_str(), e.errno), ("/d", EIO));
    assert_eq!(counts(&db, i, "/d", StageScope::Tree), (1, 0, 0, 1, true));
    let f = db.stage_failures(Viewer::Admin, i, "", 10).unwrap();
    assert_eq!(f.failures[0].errno, EIO);
    assert!(db.live_stages().unwrap().is_empty());
}

#[test]
fn terminate_and_path_actions() {
    let (mut db, _, i) = built(0);
    let a = db
        .create_stage(
            Viewer::Admin,
            0,
            &new_stage(i, StageDirection::In, StageType::Directory, "/pfs/d", "/d"),
            &roots(),
        )
        .unwrap();
    start_all(&mut db);
    db.record_stage_progress(
        a.id,
        &progress(
            vec![
                ev("/d/1", FileState::Complete),
                ev("/d/2", FileState::Pending),
            ],
            true,
            2,
        ),
    )
    .unwrap();
    // Running: terminate asks the coordinator; the stage ends when it confirms.
    let t = db
        .stage_action(Viewer::Admin, a.id, StageAction::Terminate)
        .unwrap();
    assert_eq!(t.state, StageState::Running);
    assert!(db.watch_state(a.id).unwrap().unwrap().cancel);
    db.record_stage_end(a.id, &StageEnd::Terminated).unwrap();
    assert_eq!(
        db.stage(Viewer::Admin, a.id).unwrap().state,
        StageState::Terminated
    );
    // Its pending records are gone, the complete ones stay.
    assert_eq!(counts(&db, i, "/d", StageScope::Tree), (1, 0, 0, 0, true));
    // Revoke/activate only deferred (409 otherwise).
    assert!(matches!(
        db.stage_action(Viewer::Admin, a.id, StageAction::Revoke),
        Err(DbError::Conflict(_))
    ));
    let o1 = db
        .create_stage(
            Viewer::Admin,
            0,
            &deferred_out(i, "/o/1", "/pfs/1"),
            &roots(),
        )
        .unwrap();
    let o2 = db
        .create_stage(
            Viewer::Admin,
            0,
            &deferred_out(i, "/o/2", "/pfs/2"),
            &roots(),
        )
        .unwrap();
    let a1 = StagePathAction {
        action: StageAction::Activate,
        path: "/o/1".into(),
        scope: StageScope::File,
    };
    assert_eq!(
        db.stage_path_action(Viewer::Admin, i, &a1).unwrap(),
        vec![o1.id]
    );
    assert_eq!(
        db.stage(Viewer::Admin, o1.id).unwrap().state,
        StageState::Queued
    );
    let rv = StagePathAction {
        action: StageAction::Revoke,
        path: "/o".into(),
        scope: StageScope::Tree,
    };
    assert_eq!(
        db.stage_path_action(Viewer::Admin, i, &rv).unwrap(),
        vec![o2.id]
    );
    assert!(matches!(
        db.stage_path_action(Viewer::Admin, i, &rv),
        Err(DbError::NotFound(_))
    ));
    // A terminate on a path clears a failed record even of an ended stage.
    let f = db
        .create_stage(Viewer::Admin, 0, &file_in(i, "/pfs/f", "/f"), &roots())
        .unwrap();
    for w in db.stage_start_work(4).unwrap() {
        db.record_stage_started(w.stage, &w.node).unwrap();
    }
    db.record_stage_progress(f.id, &progress(vec![ev("/f", FileState::Failed)], true, 1))
        .unwrap();
    db.record_stage_end(f.id, &StageEnd::Failed(String::new()))
        .unwrap();
    let term = StagePathAction {
        action: StageAction::Terminate,
        path: "/f".into(),
        scope: StageScope::File,
    };
    assert_eq!(
        db.stage_path_action(Viewer::Admin, i, &term).unwrap(),
        vec![f.id]
    );
    // No longer failed, and not forgotten: the path's latest stage was terminated.
    assert_eq!(counts(&db, i, "/f", StageScope::File), (0, 0, 0, 0, true));
    assert!(db
        .stage_failures(Viewer::Admin, i, "", 10)
        .unwrap()
        .failures
        .is_empty());
}

#[test]
fn a_terminated_stage_is_the_latest_of_its_path_not_forgotten() {
    let (mut db, _s, i) = built(0);
    // A complete stage of /f, then a new one terminated while queued: the answer is
    // about the new one (started, nothing complete), not EINVAL, not the old one.
    let a = db
        .create_stage(Viewer::Admin, 0, &file_in(i, "/pfs/f", "/f"), &roots())
        .unwrap();
    start_all(&mut db);
    db.record_stage_progress(
        a.id,
        &progress(vec![ev("/f", FileState::Complete)], true, 1),
    )
    .unwrap();
    db.record_stage_end(a.id, &StageEnd::Complete).unwrap();
    assert_eq!(counts(&db, i, "/f", StageScope::File), (1, 0, 0, 0, true));
    let b = db
        .create_stage(Viewer::Admin, 0, &file_in(i, "/pfs/f", "/f"), &roots())
        .unwrap();
    let t = db
        .stage_action(Viewer::Admin, b.id, StageAction::Terminate)
        .unwrap();
    assert_eq!(t.state, StageState::Terminated);
    let e = t.error.expect("a terminated stage says what it left");
    assert_eq!(e.errno, ECANCELED);
    assert!(e.message.contains("before it started"), "{}", e.message);
    assert_eq!(counts(&db, i, "/f", StageScope::File), (0, 0, 0, 0, true));
    // A running stage-out terminated mid-copy: its pending record becomes terminated
    // (dw_wait returns, dw_query says started), the complete one of another file stays.
    let o = db
        .create_stage(
            Viewer::Admin,
            0,
            &NewStage {
                pairs: vec![
                    StagePair {
                        source: "/o1".into(),
                        destination: "/pfs/o1".into(),
                    },
                    StagePair {
                        source: "/o2".into(),
                        destination: "/pfs/o2".into(),
                    },
                ],
                ..new_stage(i, StageDirection::Out, StageType::List, "", "")
            },
            &roots(),
        )
        .unwrap();
    start_all(&mut db);
    db.record_stage_progress(
        o.id,
        &progress(
            vec![ev("/o1", FileState::Pending), ev("/o2", FileState::Pending)],
            true,
            2,
        ),
    )
    .unwrap();
    db.record_stage_progress(
        o.id,
        &progress(vec![ev("/o1", FileState::Complete)], true, 3),
    )
    .unwrap();
    db.stage_action(Viewer::Admin, o.id, StageAction::Terminate)
        .unwrap();
    assert_eq!(counts(&db, i, "/o2", StageScope::File), (0, 1, 0, 0, true));
    db.record_stage_end(o.id, &StageEnd::Terminated).unwrap();
    assert_eq!(counts(&db, i, "/o1", StageScope::File), (1, 0, 0, 0, true));
    assert_eq!(counts(&db, i, "/o2", StageScope::File), (0, 0, 0, 0, true));
    let st = db.stage(Viewer::Admin, o.id).unwrap();
    assert_eq!(st.state, StageState::Terminated);
    assert!(
        st.error.unwrap().message.contains("not put in place"),
        "a stage-out terminated mid-copy says what it left on the PFS"
    );
}

#[test]
fn teardown_activates_deferred_stage_outs_and_holds_fragments_until_they_end() {
    let (mut db, s, i) = built(0);
    let out = db
        .create_stage(Viewer::Admin, 0, &deferred_out(i, "/r", "/pfs/r"), &roots())
        .unwrap();
    let sin = db
        .create_stage(Viewer::Admin, 0, &file_in(i, "/pfs/x", "/x"), &roots())
        .unwrap();
    // Nothing runs yet for the test's purpose: the stage-in is queued when teardown comes.
    db.destroy_session(Viewer::Admin, s).unwrap();
    db.advance().unwrap();
    assert_eq!(
        db.stage(Viewer::Admin, out.id).unwrap().state,
        StageState::Queued
    );
    assert_eq!(
        db.stage(Viewer::Admin, sin.id).unwrap().state,
        StageState::Terminated
    );
    // New stages: 409.
    assert!(matches!(
        db.create_stage(Viewer::Admin, 0, &file_in(i, "/pfs/y", "/y"), &roots()),
        Err(DbError::Conflict(_))
    ));
    // Held: the fragments keep their create goal while the stage-out is pending.
    assert_eq!(fragments_goal(&db, i), vec![Goal::Create, Goal::Create]);
    assert!(db.destroy_work().unwrap().is_empty());
    // The instance is being destroyed but built: the stage-out starts there.
    let w = db.stage_start_work(4).unwrap();
    assert_eq!(w.len(), 1);
    db.record_stage_started(out.id, &w[0].node).unwrap();
    db.advance().unwrap();
    assert_eq!(fragments_goal(&db, i), vec![Goal::Create, Goal::Create]);
    db.record_stage_end(out.id, &StageEnd::Complete).unwrap();
    db.advance().unwrap();
    assert_eq!(fragments_goal(&db, i), vec![Goal::Destroy, Goal::Destroy]);
    for d in db.destroy_work().unwrap() {
        db.record_destroyed(d.fragment, Ok(())).unwrap();
    }
    db.advance().unwrap();
    assert!(db.instances(Viewer::Admin, None).unwrap().is_empty());
    // The stage's record outlives its instance.
    assert_eq!(
        db.stage(Viewer::Admin, out.id).unwrap().state,
        StageState::Complete
    );
}

#[test]
fn hurry_drops_stage_outs_and_a_running_one_holds_until_its_cancel_is_confirmed() {
    let (mut db, s, i) = built(1000);
    let run = db
        .create_stage(
            Viewer::Admin,
            0,
            &new_stage(i, StageDirection::Out, StageType::File, "/a", "/pfs/a"),
            &roots(),
        )
        .unwrap();
    start_all(&mut db);
    let queued = db
        .create_stage(
            Viewer::Admin,
            0,
            &new_stage(i, StageDirection::Out, StageType::File, "/b", "/pfs/b"),
            &roots(),
        )
        .unwrap();
    let deferred = db
        .create_stage(Viewer::Admin, 0, &deferred_out(i, "/c", "/pfs/c"), &roots())
        .unwrap();
    // Only the owner (or an admin) may.
    assert!(matches!(
        db.hurry_session(Viewer::User(2000), s),
        Err(DbError::Forbidden(_))
    ));
    let dropped = db.hurry_session(Viewer::User(1000), s).unwrap();
    assert_eq!(dropped, vec![run.id, queued.id, deferred.id]);
    for id in &dropped {
        let st = db.stage(Viewer::Admin, *id).unwrap();
        assert_eq!(st.state, StageState::Dropped);
        assert!(st.finished > 0);
        // Never silently: the stage says what the drop left.
        let e = st.error.expect("a dropped stage says why");
        assert_eq!(e.errno, ECANCELED);
        assert!(
            e.message.starts_with("dropped by a hurried teardown"),
            "{}",
            e.message
        );
    }
    assert!(db
        .stage(Viewer::Admin, run.id)
        .unwrap()
        .error
        .unwrap()
        .message
        .contains("while copying"));
    assert!(db
        .stage(Viewer::Admin, deferred.id)
        .unwrap()
        .error
        .unwrap()
        .message
        .contains("before it was activated"));
    // The paths' latest stage is the dropped one: started, nothing deferred.
    assert_eq!(counts(&db, i, "/c", StageScope::File), (0, 0, 0, 0, true));
    db.destroy_session(Viewer::User(1000), s).unwrap();
    db.advance().unwrap();
    // The running one is cancelled on its coordinator, which holds the fragments...
    let ws = db.watch_state(run.id).unwrap().unwrap();
    assert!(ws.live && ws.cancel);
    assert_eq!(fragments_goal(&db, i), vec![Goal::Create, Goal::Create]);
    // ...until it confirms; the stage stays dropped.
    db.record_stage_end(run.id, &StageEnd::Terminated).unwrap();
    db.advance().unwrap();
    assert_eq!(fragments_goal(&db, i), vec![Goal::Destroy, Goal::Destroy]);
    assert_eq!(
        db.stage(Viewer::Admin, run.id).unwrap().state,
        StageState::Dropped
    );
    // A repeated hurry drops nothing more.
    assert!(db.hurry_session(Viewer::Admin, s).unwrap().is_empty());
}

#[test]
fn a_stage_out_of_an_instance_never_built_fails_at_teardown() {
    let (mut db, s, i) = built(0);
    let o = db
        .create_stage(Viewer::Admin, 0, &deferred_out(i, "/r", "/pfs/r"), &roots())
        .unwrap();
    // The instance loses a fragment's build (as if it had never been built).
    db.conn()
        .execute(
            "UPDATE fragments SET actualized = 0 WHERE instance = ?1",
            [i as i64],
        )
        .unwrap();
    db.destroy_session(Viewer::Admin, s).unwrap();
    db.advance().unwrap();
    let st = db.stage(Viewer::Admin, o.id).unwrap();
    assert_eq!(st.state, StageState::Failed);
    assert!(st.error.unwrap().message.contains("before it was built"));
    assert_eq!(fragments_goal(&db, i), vec![Goal::Destroy, Goal::Destroy]);
}

#[test]
fn a_start_that_crossed_a_terminate_is_cancelled_on_the_server() {
    let (mut db, _, i) = built(0);
    let a = db
        .create_stage(Viewer::Admin, 0, &file_in(i, "/pfs/a", "/a"), &roots())
        .unwrap();
    let w = db.stage_start_work(4).unwrap();
    // Terminated while the start was on its way.
    db.stage_action(Viewer::Admin, a.id, StageAction::Terminate)
        .unwrap();
    assert!(!db.record_stage_started(a.id, &w[0].node).unwrap());
    let ws = db.watch_state(a.id).unwrap().unwrap();
    assert_eq!(ws.state, StageState::Terminated);
    assert!(ws.live && ws.cancel);
    db.record_stage_end(a.id, &StageEnd::Complete).unwrap();
    assert_eq!(
        db.stage(Viewer::Admin, a.id).unwrap().state,
        StageState::Terminated
    );
    assert!(db.live_stages().unwrap().is_empty());
}

#[test]
fn lists_take_pairs_and_check_every_one() {
    let (mut db, _, i) = built(0);
    let req = NewStage {
        pairs: vec![
            StagePair {
                source: "/pfs/a".into(),
                destination: "/l/a".into(),
            },
            StagePair {
                source: "/pfs/b".into(),
                destination: "/l//b".into(),
            },
        ],
        ..new_stage(i, StageDirection::In, StageType::List, "", "")
    };
    let s = db.create_stage(Viewer::Admin, 0, &req, &roots()).unwrap();
    assert_eq!(s.pairs[1].destination, "/l/b");
    assert_eq!(counts(&db, i, "/l/b", StageScope::File), (0, 1, 0, 0, true));
    assert_eq!(counts(&db, i, "/l", StageScope::Tree), (0, 1, 0, 0, true));
    let w = db.stage_start_work(4).unwrap();
    assert_eq!(w[0].pairs.len(), 2);
    let mut bad = req.clone();
    bad.pairs[1].source = "/etc/shadow".into();
    assert!(matches!(
        db.create_stage(Viewer::Admin, 0, &bad, &roots()),
        Err(DbError::Invalid(_))
    ));
}

#[test]
fn the_fingerprint_changes_with_any_table_empty() {
    // No stages, no activations: a change elsewhere must still show.
    let (mut db, s, _) = built(0);
    let before = db.fingerprint().unwrap();
    assert!(!before.is_empty());
    db.destroy_session(Viewer::Admin, s).unwrap();
    db.advance().unwrap();
    assert_ne!(db.fingerprint().unwrap(), before);
}

#[test]
fn stages_per_user_are_limited() {
    let user = Viewer::User(1001);
    let (mut db, _, i) = built(1001);
    db.set_user_limits(UserLimits {
        sessions: 10,
        stages: 2,
    });
    // A list stage counts once, however many pairs it has.
    let list = NewStage {
        pairs: ["/a", "/b", "/c"]
            .iter()
            .map(|p| StagePair {
                source: format!("/pfs{p}"),
                destination: p.to_string(),
            })
            .collect(),
        ..new_stage(i, StageDirection::In, StageType::List, "", "")
    };
    let l = db.create_stage(user, 1001, &list, &roots()).unwrap();
    // A deferred stage-out has not ended: it counts.
    db.create_stage(user, 1001, &deferred_out(i, "/o", "/pfs/o"), &roots())
        .unwrap();
    let e = db
        .create_stage(user, 1001, &file_in(i, "/pfs/x", "/x"), &roots())
        .unwrap_err();
    assert!(matches!(e, DbError::Conflict(_)), "{e}");
    assert!(e.to_string().contains("max_stages_per_user is 2"), "{e}");
    // Admins are not limited, even staging as the user.
    let admin = db
        .create_stage(
            Viewer::Admin,
            0,
            &NewStage {
                owner: Some(1001),
                ..file_in(i, "/pfs/x", "/x")
            },
            &roots(),
        )
        .unwrap();
    assert_eq!(admin.owner, 1001);
    // Running stages count; ended ones do not.
    let started = start_all(&mut db);
    assert!(started.contains(&l.id) && started.contains(&admin.id));
    assert!(db
        .create_stage(user, 1001, &file_in(i, "/pfs/y", "/y"), &roots())
        .is_err());
    db.record_stage_end(l.id, &StageEnd::Complete).unwrap();
    db.record_stage_end(admin.id, &StageEnd::Failed("x".into()))
        .unwrap();
    db.create_stage(user, 1001, &file_in(i, "/pfs/y", "/y"), &roots())
        .unwrap();
    assert!(db
        .create_stage(user, 1001, &file_in(i, "/pfs/z", "/z"), &roots())
        .is_err());
}
