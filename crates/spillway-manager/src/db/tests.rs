//! Database rules without servers: allocation, visibility, cascades.

use super::*;
use spillway_api::*;

fn db_with_nodes(nodes: &[(&str, u64)]) -> Db {
    let mut db = Db::open_in_memory().unwrap();
    db.create_pool(&NewPool {
        id: "wlm_pool".into(),
        granularity: 1 << 30,
        units: None,
    })
    .unwrap();
    for (i, (n, cap)) in nodes.iter().enumerate() {
        db.create_node(&NewNode {
            id: n.to_string(),
            address: format!("127.0.0.1:{}", 7000 + i),
            pool: Some("wlm_pool".into()),
            capacity: None,
        })
        .unwrap();
        db.record_heartbeat(n, Ok(*cap), 10).unwrap();
    }
    db
}

fn plan(session: u64, capacity: u64) -> NewInstancePlan {
    NewInstancePlan {
        req: NewInstance {
            session,
            capacity,
            pool: None,
            label: None,
            public: None,
            policy: None,
            limits: None,
            stripe_size: None,
            expiration: None,
        },
        pool: "wlm_pool".into(),
        policy: Policy::Bandwidth,
        stripe_size: 8 << 20,
        secret: vec![7; 32],
    }
}

fn session(db: &mut Db, token: &str, owner: u32) -> u64 {
    db.create_session(
        Viewer::Admin,
        0,
        &NewSession {
            token: token.into(),
            owner: Some(owner),
            creator: None,
            client_nodes: vec!["c1".into()],
            expiration: None,
        },
    )
    .unwrap()
    .id
}

#[test]
fn pool_counts_granules_of_online_undrained_nodes() {
    let mut db = db_with_nodes(&[("s0", 10 << 30), ("s1", (5 << 30) + 7)]);
    let p = db.pool("wlm_pool").unwrap();
    assert_eq!((p.quantity, p.free), (15, 15));
    db.update_node(
        "s1",
        &NodeUpdate {
            drain: Some(true),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(db.pool("wlm_pool").unwrap().quantity, 10);
}

#[test]
fn capacity_rounds_up_and_spreads() {
    let mut db = db_with_nodes(&[("s0", 10 << 30), ("s1", 10 << 30)]);
    let s = session(&mut db, "refdb", 1000);
    let i = db
        .create_instance(Viewer::Admin, &plan(s, (3 << 30) - 5))
        .unwrap();
    assert_eq!(i.capacity.bytes, 3 << 30);
    assert_eq!(i.capacity.nodes, 2);
    assert!(i.public, "a named session's instance is persistent");
    assert_eq!(db.pool("wlm_pool").unwrap().free, 17);
}

#[test]
fn no_space_says_what_is_free() {
    let mut db = db_with_nodes(&[("s0", 2 << 30)]);
    let s = session(&mut db, "123", 1000);
    let e = db
        .create_instance(Viewer::Admin, &plan(s, 3 << 30))
        .unwrap_err();
    match e {
        DbError::NoSpace(m) => assert!(m.contains("2GiB free"), "{m}"),
        e => panic!("{e:?}"),
    }
}

#[test]
fn drained_and_offline_nodes_are_avoided() {
    let mut db = db_with_nodes(&[("s0", 10 << 30), ("s1", 10 << 30), ("s2", 10 << 30)]);
    db.update_node(
        "s1",
        &NodeUpdate {
            drain: Some(true),
            ..Default::default()
        },
    )
    .unwrap();
    // s2 stops answering and its timeout passes.
    db.conn()
        .execute("UPDATE nodes SET last_heartbeat = 0 WHERE id = 's2'", [])
        .unwrap();
    assert!(db.record_heartbeat("s2", Err("down".into()), 10).unwrap());
    let s = session(&mut db, "1", 1000);
    let i = db
        .create_instance(Viewer::Admin, &plan(s, 3 << 30))
        .unwrap();
    let frags = db.fragments(Viewer::Admin, None).unwrap();
    assert!(frags.iter().all(|f| f.node == "s0"), "{frags:?}");
    assert_eq!(i.capacity.nodes, 1);
}

#[test]
fn users_see_their_own_and_public_objects() {
    let mut db = db_with_nodes(&[("s0", 10 << 30)]);
    let mine = session(&mut db, "42", 1000);
    let theirs = session(&mut db, "43", 2000);
    let persistent = session(&mut db, "shared", 2000);
    db.create_instance(Viewer::Admin, &plan(theirs, 1)).unwrap();
    db.create_instance(Viewer::Admin, &plan(persistent, 1))
        .unwrap();
    let me = Viewer::User(1000);
    let ids: Vec<u64> = db
        .sessions(me, None)
        .unwrap()
        .iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, vec![mine, persistent]);
    assert_eq!(db.instances(me, None).unwrap().len(), 1);
    // A session the user may not see answers exactly as a missing one; one they may
    // see (it holds a public instance) 403, without naming its owner.
    let missing = theirs + 1000;
    let text = |r: Result<_, DbError>, id: u64| match r {
        Err(DbError::NotFound(m)) => m.replace(&id.to_string(), "N"),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        text(db.destroy_session(me, theirs).map(|_| ()), theirs),
        text(db.destroy_session(me, missing).map(|_| ()), missing)
    );
    assert_eq!(
        text(db.create_instance(me, &plan(theirs, 1)).map(|_| ()), theirs),
        text(
            db.create_instance(me, &plan(missing, 1)).map(|_| ()),
            missing
        )
    );
    let hidden = db.instances(Viewer::Admin, None).unwrap()[0].id;
    assert_eq!(
        text(db.destroy_instance(me, hidden).map(|_| ()), hidden),
        text(db.destroy_instance(me, 999).map(|_| ()), 999)
    );
    match db.destroy_session(me, persistent) {
        Err(DbError::Forbidden(m)) => assert!(!m.contains("2000"), "{m}"),
        other => panic!("{other:?}"),
    }
    let public = db.instances(me, None).unwrap()[0].id;
    match db.destroy_instance(me, public) {
        Err(DbError::Forbidden(m)) => assert!(!m.contains("2000"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn tokens_are_unique_while_live() {
    let mut db = db_with_nodes(&[]);
    session(&mut db, "refdb", 1000);
    let e = db
        .create_session(
            Viewer::User(2000),
            2000,
            &NewSession {
                token: "refdb".into(),
                owner: None,
                creator: None,
                client_nodes: vec![],
                expiration: None,
            },
        )
        .unwrap_err();
    assert!(matches!(e, DbError::Conflict(_)));
}

#[test]
fn destroy_cascades_once_servers_and_agents_are_done() {
    let mut db = db_with_nodes(&[("s0", 10 << 30)]);
    let s = session(&mut db, "refdb", 1000);
    let i = db.create_instance(Viewer::Admin, &plan(s, 1)).unwrap();
    let c = db
        .create_configuration(
            Viewer::Admin,
            &NewConfiguration {
                instance: i.id,
                kind: ConfigType::Scratch,
                access_mode: AccessMode::Stripe,
                root_permissions: None,
                group: None,
                pfs: None,
                modified_threshold: None,
                read_ahead: None,
                sync_on_close: None,
                sync_to_pfs: None,
            },
        )
        .unwrap();
    let a = db
        .create_activation(
            Viewer::Admin,
            &NewActivation {
                session: s,
                configuration: c.id,
                mount: None,
            },
            "/var/opt/spillway/mounts",
        )
        .unwrap();
    assert_eq!(a.mount, format!("/var/opt/spillway/mounts/s{s}-c{}", c.id));
    // Build: fragment, then configuration, then the agent mounts.
    let f = db.fragment_work().unwrap();
    assert_eq!(f.len(), 1);
    db.record_fragment(f[0].fragment, Ok(())).unwrap();
    db.advance().unwrap();
    assert!(
        db.mount_work("c1").unwrap().is_empty(),
        "configuration not applied yet"
    );
    let cw = db.config_work().unwrap();
    db.record_config(cw[0].configuration, Ok(())).unwrap();
    db.advance().unwrap();
    let w = db.mount_work("c1").unwrap();
    assert_eq!(w.len(), 1);
    db.agent_report(
        "c1",
        &AgentReport {
            activation: a.id,
            status: "mounted".into(),
            error: None,
        },
    )
    .unwrap();
    db.advance().unwrap();
    assert!(db.session(Viewer::Admin, s).unwrap().state.actualized);
    // Destroy: the agent must unmount before the fragment goes.
    db.destroy_session(Viewer::Admin, s).unwrap();
    db.advance().unwrap();
    assert!(db.destroy_work().unwrap().is_empty());
    let w = db.mount_work("c1").unwrap();
    assert_eq!(w[0].goal, Goal::Destroy);
    db.agent_report(
        "c1",
        &AgentReport {
            activation: a.id,
            status: "unmounted".into(),
            error: None,
        },
    )
    .unwrap();
    db.advance().unwrap();
    let d = db.destroy_work().unwrap();
    assert_eq!(d.len(), 1);
    db.record_destroyed(d[0].fragment, Ok(())).unwrap();
    db.advance().unwrap();
    assert!(db.sessions(Viewer::Admin, None).unwrap().is_empty());
    assert!(db.instances(Viewer::Admin, None).unwrap().is_empty());
}

#[test]
fn refused_calls_blow_the_fuse_transient_ones_do_not() {
    let mut db = db_with_nodes(&[("s0", 10 << 30)]);
    let s = session(&mut db, "x1", 1000);
    db.create_instance(Viewer::Admin, &plan(s, 1)).unwrap();
    let f = db.fragment_work().unwrap()[0].fragment;
    for _ in 0..20 {
        db.record_fragment(f, Err(CallError::Transient("down".into())))
            .unwrap();
    }
    assert_eq!(db.fragment_work().unwrap().len(), 1);
    for _ in 0..FUSE_LIMIT {
        db.record_fragment(f, Err(CallError::Refused("no".into())))
            .unwrap();
    }
    assert!(db.fragment_work().unwrap().is_empty());
    assert!(db.fragment(Viewer::Admin, f).unwrap().state.fuse_blown);
}

fn configuration(db: &mut Db, instance: u64, access_mode: AccessMode) -> DbResult<Configuration> {
    db.create_configuration(
        Viewer::Admin,
        &NewConfiguration {
            instance,
            kind: ConfigType::Scratch,
            access_mode,
            root_permissions: None,
            group: None,
            pfs: None,
            modified_threshold: None,
            read_ahead: None,
            sync_on_close: None,
            sync_to_pfs: None,
        },
    )
}

/// An activation of configuration `c` in session `s`, mounted below /mnt.
fn activate(db: &mut Db, s: u64, c: u64) -> Activation {
    db.create_activation(
        Viewer::Admin,
        &NewActivation {
            session: s,
            configuration: c,
            mount: None,
        },
        "/mnt",
    )
    .unwrap()
}

/// Every fragment built and every configuration applied, as the reconcile loop would;
/// returns the configurations' work.
fn build(db: &mut Db) -> Vec<ConfigWork> {
    for f in db.fragment_work().unwrap() {
        db.record_fragment(f.fragment, Ok(())).unwrap();
    }
    db.advance().unwrap();
    let cws = db.config_work().unwrap();
    for cw in &cws {
        db.record_config(cw.configuration, Ok(())).unwrap();
    }
    db.advance().unwrap();
    cws
}

#[test]
fn private_configurations_are_for_job_instances_and_say_so_to_the_agent() {
    let mut db = db_with_nodes(&[("s0", 10 << 30)]);
    // A persistent instance (a named session) is shared by jobs: no private mode.
    let named = session(&mut db, "refdb", 1000);
    let i = db.create_instance(Viewer::Admin, &plan(named, 1)).unwrap();
    let e = configuration(&mut db, i.id, AccessMode::Private).unwrap_err();
    assert!(
        matches!(&e, DbError::Invalid(m) if m.contains("job instances")),
        "{e:?}"
    );
    // Load-balanced replicas are for persistent instances too, alone on their
    // instance: every server holds whole replicas (docs/cache.md section 6).
    let ldbal = configuration(&mut db, i.id, AccessMode::Ldbal).unwrap();
    assert_eq!(ldbal.access_mode, AccessMode::Ldbal);
    let e = configuration(&mut db, i.id, AccessMode::Stripe).unwrap_err();
    assert!(
        matches!(&e, DbError::Invalid(m) if m.contains("load-balanced")),
        "{e:?}"
    );
    // A job's instance takes both: a striped and a private configuration.
    let job = session(&mut db, "4242", 1000);
    let i = db.create_instance(Viewer::Admin, &plan(job, 1)).unwrap();
    let striped = configuration(&mut db, i.id, AccessMode::Stripe).unwrap();
    let private = configuration(&mut db, i.id, AccessMode::Private).unwrap();
    assert_eq!(private.access_mode, AccessMode::Private);
    // ... and then no load-balanced one.
    assert!(configuration(&mut db, i.id, AccessMode::Ldbal).is_err());
    for c in [&striped, &private] {
        activate(&mut db, job, c.id);
    }
    build(&mut db);
    let w = db.mount_work("c1").unwrap();
    let private_of = |suffix: String| {
        w.iter()
            .find(|m| m.mount.ends_with(&suffix))
            .map(|m| m.private)
    };
    assert_eq!(w.len(), 2);
    assert_eq!(private_of(format!("-c{}", striped.id)), Some(false));
    assert_eq!(private_of(format!("-c{}", private.id)), Some(true));
}

#[test]
fn sessions_per_user_are_limited() {
    let mut db = Db::open_in_memory().unwrap();
    db.set_user_limits(UserLimits {
        sessions: 2,
        stages: 10,
        stage_pairs: 100,
    });
    let new = |t: &str| NewSession {
        token: t.into(),
        owner: None,
        creator: None,
        client_nodes: vec![],
        expiration: None,
    };
    let a = db
        .create_session(Viewer::User(1001), 1001, &new("a"))
        .unwrap()
        .id;
    db.create_session(Viewer::User(1001), 1001, &new("b"))
        .unwrap();
    // At the limit: refused (409), the message names the limit; nothing recorded.
    let e = db
        .create_session(Viewer::User(1001), 1001, &new("c"))
        .unwrap_err();
    assert!(matches!(e, DbError::Conflict(_)), "{e}");
    assert!(e.to_string().contains("max_sessions_per_user is 2"), "{e}");
    assert_eq!(db.sessions(Viewer::User(1001), None).unwrap().len(), 2);
    // Another user has their own count.
    db.create_session(Viewer::User(1002), 1002, &new("d"))
        .unwrap();
    // Admins (Slurm making job sessions) are not limited; what they make for the user
    // is the user's and counts against the user's own creates.
    let e_id = session(&mut db, "e", 1001);
    assert_eq!(db.sessions(Viewer::User(1001), None).unwrap().len(), 3);
    // A session being destroyed counts until its row is gone.
    db.destroy_session(Viewer::User(1001), a).unwrap();
    let e = db
        .create_session(Viewer::User(1001), 1001, &new("c"))
        .unwrap_err();
    assert!(e.to_string().contains("being destroyed"), "{e}");
    db.advance().unwrap();
    db.destroy_session(Viewer::Admin, e_id).unwrap();
    db.advance().unwrap();
    // Destroyed (gone): one left, so one more fits, and then no more.
    db.create_session(Viewer::User(1001), 1001, &new("c"))
        .unwrap();
    assert!(db
        .create_session(Viewer::User(1001), 1001, &new("f"))
        .is_err());
}

#[test]
fn a_load_balanced_activation_spreads_its_nodes_evenly_over_the_replicas() {
    let mut db = db_with_nodes(&[("s0", 10 << 30), ("s1", 10 << 30)]);
    let nodes = ["c3", "c1", "c2"];
    let s = db
        .create_session(
            Viewer::Admin,
            0,
            &NewSession {
                token: "5151".into(),
                owner: Some(1000),
                creator: None,
                client_nodes: nodes.iter().map(|n| n.to_string()).collect(),
                expiration: None,
            },
        )
        .unwrap()
        .id;
    let i = db
        .create_instance(Viewer::Admin, &plan(s, 2 << 30))
        .unwrap();
    let c = configuration(&mut db, i.id, AccessMode::Ldbal).unwrap();
    let a = activate(&mut db, s, c.id);
    let cws = build(&mut db);
    assert!(!cws.is_empty() && cws.iter().all(|cw| cw.ldbal));
    // By rank among the sorted names (c1, c2, c3), turned by the activation id.
    for (rank, node) in ["c1", "c2", "c3"].iter().enumerate() {
        let w = db.mount_work(node).unwrap();
        assert_eq!(w.len(), 1, "{node}");
        assert!(w[0].ldbal && w[0].servers.len() == 2);
        let want = ((rank as u64 + a.id) % 2) as u16;
        assert_eq!(w[0].replica, Some(want), "{node}");
    }
}
