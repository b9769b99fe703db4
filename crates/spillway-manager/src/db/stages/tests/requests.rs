//! Staging's API side in the database: path rules, validation and owners, counting,
//! records replaced by newer stages, terminate/revoke/activate by path, list stages,
//! per-user limits.

use super::*;
use spillway_api::stage_path::at_or_under as under;

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
    for w in db.stage_start_work(4, &Default::default()).unwrap() {
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
    let w = db.stage_start_work(4, &Default::default()).unwrap();
    assert_eq!(db.start_pairs(w[0].stage).unwrap().unwrap(), s.pairs);
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
        stage_pairs: 1000,
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

#[test]
fn stage_pairs_per_user_are_limited() {
    let user = Viewer::User(1001);
    let (mut db, _, i) = built(1001);
    db.set_user_limits(UserLimits {
        sessions: 10,
        stages: 100,
        stage_pairs: 10,
    });
    let list = |dir: &str, n: usize| NewStage {
        pairs: (0..n)
            .map(|k| StagePair {
                source: format!("/pfs/{dir}/{k}"),
                destination: format!("/{dir}/{k}"),
            })
            .collect(),
        ..new_stage(i, StageDirection::In, StageType::List, "", "")
    };
    // 6 pairs and a file stage (one): 7 held.
    let l = db
        .create_stage(user, 1001, &list("a", 6), &roots())
        .unwrap();
    db.create_stage(user, 1001, &file_in(i, "/pfs/f", "/f"), &roots())
        .unwrap();
    // 4 more would be 11: refused, naming the limit and the counts.
    let e = db
        .create_stage(user, 1001, &list("b", 4), &roots())
        .unwrap_err();
    assert!(matches!(e, DbError::Conflict(_)), "{e}");
    let m = e.to_string();
    assert!(
        m.contains("max_stage_pairs_per_user is 10")
            && m.contains("7 files")
            && m.contains("names 4"),
        "{m}"
    );
    // 3 fit exactly.
    db.create_stage(user, 1001, &list("c", 3), &roots())
        .unwrap();
    assert!(db
        .create_stage(user, 1001, &file_in(i, "/pfs/g", "/g"), &roots())
        .is_err());
    // An ended stage no longer counts: the list's 6 pairs are free again.
    db.stage_action(Viewer::Admin, l.id, StageAction::Terminate)
        .unwrap();
    db.create_stage(user, 1001, &list("e", 6), &roots())
        .unwrap();
    // Admins are not limited, even staging as the user; what they stage as the user
    // counts as the user's.
    db.create_stage(
        Viewer::Admin,
        0,
        &NewStage {
            owner: Some(1001),
            ..list("d", 20)
        },
        &roots(),
    )
    .unwrap();
    assert!(db
        .create_stage(user, 1001, &file_in(i, "/pfs/h", "/h"), &roots())
        .is_err());
}

#[test]
fn a_list_is_stored_once_and_compactly() {
    let (mut db, _, i) = built(0);
    let pairs: Vec<StagePair> = (0..18_000)
        .map(|k| StagePair {
            source: format!("/pfs/b/run/in/f{k:05}"),
            destination: format!("/in/f{k:05}"),
        })
        .collect();
    let s = db
        .create_stage(
            Viewer::Admin,
            0,
            &NewStage {
                pairs: pairs.clone(),
                ..new_stage(i, StageDirection::In, StageType::List, "", "")
            },
            &roots(),
        )
        .unwrap();
    assert_eq!(s.pairs, pairs);
    let (row, list, count): (String, i64, i64) = db
        .conn()
        .query_row(
            "SELECT s.pairs, length(l.list), l.count FROM stages s
             JOIN stage_lists l ON l.stage = s.id WHERE s.id = ?1",
            [s.id as i64],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    // Not in the stages row (rewritten whole at every update), once in stage_lists, in
    // under 8 bytes a pair (it was 50 as JSON).
    assert_eq!((row.as_str(), count), ("[]", 18_000));
    assert!(list < 18_000 * 8, "{list}");
    assert_eq!(db.start_pairs(s.id).unwrap().unwrap(), pairs);
    // Gone with its stage.
    db.conn()
        .execute("DELETE FROM stages WHERE id = ?1", [s.id as i64])
        .unwrap();
    db.prune_stages().unwrap();
    let left: i64 = db
        .conn()
        .query_row("SELECT COUNT(*) FROM stage_lists", [], |r| r.get(0))
        .unwrap();
    assert_eq!(left, 0);
}
