//! Staging's loop side in the database: concurrency, refused and lost starts,
//! terminated and dropped stages as the latest of their paths, teardown holds, hurry,
//! stages that can never run.

use super::*;
use std::collections::HashSet;

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
    let w = db.stage_start_work(4, &Default::default()).unwrap();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].stage, ids[0]);
    assert_eq!(db.start_pairs(ids[0]).unwrap().unwrap()[0].source, "/pfs/0");
    // Coordinators are spread by stage id over the instance's online servers.
    assert!(["s0", "s1"].contains(&w[0].node.as_str()));
    db.record_stage_started(ids[0], &w[0].node).unwrap();
    assert!(db
        .stage_start_work(4, &Default::default())
        .unwrap()
        .is_empty());
    db.record_stage_end(ids[0], &StageEnd::Complete).unwrap();
    assert_eq!(
        db.stage_start_work(4, &Default::default()).unwrap()[0].stage,
        ids[1]
    );
    // A start under way holds its instance's slot as a running stage does, and is
    // not handed out again.
    let under_way: HashSet<u64> = [ids[1]].into();
    assert!(db.stage_start_work(4, &under_way).unwrap().is_empty());
    db.set_stage_concurrency(Viewer::Admin, i, 64).unwrap();
    assert_eq!(
        db.stage_start_work(4, &Default::default()).unwrap().len(),
        2
    );
    let w = db.stage_start_work(4, &under_way).unwrap();
    assert_eq!(w.iter().map(|w| w.stage).collect::<Vec<_>>(), vec![ids[2]]);
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
    assert_eq!(
        db2.stage_start_work(2, &Default::default()).unwrap().len(),
        2
    );
    // No online server: nothing starts.
    for n in ["s0", "s1"] {
        db2.record_heartbeat(n, Err("down".into()), -1).unwrap();
    }
    assert!(db2
        .stage_start_work(2, &Default::default())
        .unwrap()
        .is_empty());
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
    let w = db.stage_start_work(4, &Default::default()).unwrap();
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
    let w = db.stage_start_work(4, &Default::default()).unwrap();
    assert_eq!(w.len(), 1);
    db.record_stage_started(out.id, &w[0].node).unwrap();
    db.advance().unwrap();
    assert_eq!(fragments_goal(&db, i), vec![Goal::Create, Goal::Create]);
    db.record_stage_end(out.id, &StageEnd::Complete).unwrap();
    db.advance().unwrap();
    assert_eq!(fragments_goal(&db, i), vec![Goal::Destroy, Goal::Destroy]);
    // Fragment 0 last (a cache's others reach the PFS through its namespace): one
    // round for fragment 1, then fragment 0.
    let first = db.destroy_work().unwrap();
    assert_eq!(first.len(), 1);
    db.record_destroyed(first[0].fragment, Ok(())).unwrap();
    let second = db.destroy_work().unwrap();
    assert_eq!(second.len(), 1);
    assert_ne!(second[0].fragment, first[0].fragment);
    db.record_destroyed(second[0].fragment, Ok(())).unwrap();
    assert!(db.destroy_work().unwrap().is_empty());
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
    let w = db.stage_start_work(4, &Default::default()).unwrap();
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
