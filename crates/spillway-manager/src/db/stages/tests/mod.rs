//! Staging's database rules without servers, with the fixtures both halves share:
//!
//! * `requests` — the API side: path rules, validation and owners, counting, records
//!   replaced by newer stages, path actions, list stages, per-user limits.
//! * `lifecycle` — the loop side: concurrency, refused and lost starts, terminated and
//!   dropped stages, teardown holds and hurry.

mod lifecycle;
mod requests;

use super::ECANCELED;
use crate::db::*;
use spillway_api::*;

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
    let work = db.stage_start_work(4, &Default::default()).unwrap();
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
