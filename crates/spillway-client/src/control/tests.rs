//! The channel with a fake manager: what each request asks of the REST API (paths,
//! bodies, the uid it acts as), and how the manager's answers and errors come back.

use super::codec::tests::msg;
use super::*;
use serde_json::{json, Value};
use spillway_api::ApiError;
use std::sync::Mutex;

type Script = Box<dyn Fn(&str, &str, &Value) -> Result<Value, ApiError> + Send + Sync>;

/// Records the calls (and the uid each acts as) and answers from a script.
struct Fake {
    calls: Mutex<Vec<(String, String, Value)>>,
    uids: Mutex<Vec<u32>>,
    answer: Script,
}

impl Rest for Arc<Fake> {
    fn get(&self, uid: u32, path: &str) -> Result<Value, ApiError> {
        self.uids.lock().unwrap().push(uid);
        self.calls
            .lock()
            .unwrap()
            .push(("GET".into(), path.into(), Value::Null));
        (self.answer)("GET", path, &Value::Null)
    }
    fn send(&self, uid: u32, method: &str, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.uids.lock().unwrap().push(uid);
        self.calls
            .lock()
            .unwrap()
            .push((method.into(), path.into(), body.clone()));
        (self.answer)(method, path, body)
    }
}

fn instance() -> Arc<Instance> {
    let desc = spillway_types::InstanceDescriptor {
        instance: 7,
        servers: vec!["127.0.0.1:1".into()],
        capacity: 1 << 30,
        stripe_size: 1 << 20,
        credential: "00".into(),
        cache: false,
        ldbal: false,
        replica: None,
    };
    Arc::new(Instance::new(
        desc,
        &spillway_types::Tunables::default(),
        "test",
    ))
}

fn control(
    answer: impl Fn(&str, &str, &Value) -> Result<Value, ApiError> + Send + Sync + 'static,
) -> (Control, Arc<Fake>) {
    let fake = Arc::new(Fake {
        calls: Mutex::new(Vec::new()),
        uids: Mutex::new(Vec::new()),
        answer: Box::new(answer),
    });
    (Control::new(instance(), Some(Box::new(fake.clone()))), fake)
}

fn status(status: u16) -> ApiError {
    ApiError::Status {
        status,
        message: format!("HTTP {status}"),
        choices: None,
    }
}

const ROOT: InodeNo = spillway_types::ROOT_INODE;

#[test]
fn stage_names_the_kernels_uid_as_owner() {
    let (c, fake) = control(|_, _, _| Ok(json!({"id": 42})));
    let req = decode_request(&msg(&["stage", "in", "file", "immediate", "/pfs/a", "/x"])).unwrap();
    let a = c.handle(1000, ROOT, &req);
    assert_eq!(a, Answer::ok(vec![b"42".to_vec()]));
    let calls = fake.calls.lock().unwrap();
    let (m, p, body) = &calls[0];
    assert_eq!((m.as_str(), p.as_str()), ("POST", "/dw/v1/stages"));
    assert_eq!(body["owner"], 1000);
    assert_eq!(body["instance"], 7);
    assert_eq!(body["source"], "/pfs/a");
    assert_eq!(body["destination"], "/x");
    assert_eq!(body["type"], "file");
    assert_eq!(body["pairs"], json!([]));
}

#[test]
fn lists_go_as_pairs() {
    let (c, fake) = control(|_, _, _| Ok(json!({"id": 1})));
    let req = decode_request(&msg(&[
        "stage", "out", "list", "job_end", "/a", "/pfs/a", "/b", "/pfs/b",
    ]))
    .unwrap();
    c.handle(5, ROOT, &req);
    let body = &fake.calls.lock().unwrap()[0].2;
    assert_eq!(body["source"], "");
    assert_eq!(body["when"], "job_end");
    assert_eq!(
        body["pairs"],
        json!([{"source": "/a", "destination": "/pfs/a"}, {"source": "/b", "destination": "/pfs/b"}])
    );
}

#[test]
fn http_errors_map_to_errnos() {
    for (code, errno) in [
        (400, libc::EINVAL),
        (401, libc::EACCES),
        (403, libc::EACCES),
        (404, libc::ENOENT),
        (409, libc::EBUSY),
        (500, libc::EIO),
        (502, libc::EIO),
    ] {
        let (c, _) = control(move |_, _, _| Err(status(code)));
        let a = c.handle(1, ROOT, &Request::Concurrency { value: 3 });
        assert_eq!(a.result, -errno, "HTTP {code}");
    }
    let (c, _) = control(|_, _, _| {
        Err(ApiError::Unreachable {
            url: "https://x".into(),
            detail: "refused".into(),
        })
    });
    assert_eq!(
        c.handle(1, ROOT, &Request::Concurrency { value: 3 }).result,
        -libc::EHOSTUNREACH
    );
    // A mount without a manager.
    let c = Control::new(instance(), None);
    assert_eq!(
        c.handle(1, ROOT, &Request::Concurrency { value: 3 }).result,
        -libc::ENOTSUP
    );
}

#[test]
fn counts_and_wait() {
    let (c, fake) = control(|_, p, _| {
        Ok(if p.contains("/x") {
            json!({"complete": 1, "pending": 0, "deferred": 0, "failed": 0, "started": true})
        } else if p.contains("/busy") {
            json!({"complete": 0, "pending": 3, "deferred": 0, "failed": 0, "started": true})
        } else {
            json!({"complete": 0, "pending": 0, "deferred": 0, "failed": 0, "started": false})
        })
    });
    let a = c.handle(
        1,
        ROOT,
        &Request::Counts {
            scope: Scope::File,
            path: "/x y".into(),
        },
    );
    assert_eq!(
        a.fields,
        vec![
            b"1".to_vec(),
            b"0".to_vec(),
            b"0".to_vec(),
            b"0".to_vec(),
            b"1".to_vec()
        ]
    );
    assert_eq!(
        fake.calls.lock().unwrap()[0].1,
        "/dw/v1/instances/7/stage_counts?path=/x%20y&scope=file"
    );
    let w = |path: &str, ms| {
        c.handle(
            1,
            ROOT,
            &Request::Wait {
                scope: Scope::Tree,
                path: path.into(),
                timeout_ms: ms,
            },
        )
    };
    assert_eq!(w("/x", 10000), Answer::ok(vec![b"0".to_vec()]));
    assert!(fake.calls.lock().unwrap()[1]
        .1
        .ends_with("&scope=tree&wait=10"));
    assert_eq!(w("/busy", 1).result, -libc::EAGAIN);
    assert!(fake.calls.lock().unwrap()[2].1.ends_with("&wait=1"));
    assert_eq!(w("/never", 0).result, -libc::EINVAL);
}

/// Every request acts as the caller (the manager then authorises it as that user's own
/// call); actions go through stage_actions for everyone.
#[test]
fn every_call_acts_as_the_caller() {
    let (c, fake) = control(|m, p, _| match (m, p) {
        ("POST", p) if p.ends_with("/stage_actions") => Ok(json!({"stages": [1, 2]})),
        ("POST", _) => Ok(json!({"id": 9})),
        ("PUT", _) => Ok(json!({"stage_concurrency": 2})),
        ("GET", p) if p.contains("stage_failures") => Ok(json!({"failures": [], "more": false})),
        _ => Ok(json!({"complete": 1, "pending": 0, "deferred": 0, "failed": 0, "started": true})),
    });
    let act = |uid, action, scope, path: &str| {
        c.handle(
            uid,
            ROOT,
            &Request::Action {
                action,
                scope,
                path: path.into(),
            },
        )
    };
    assert_eq!(
        act(0, Action::Terminate, Scope::File, "/d/f"),
        Answer::ok(vec![b"2".to_vec()])
    );
    assert_eq!(
        act(1000, Action::Revoke, Scope::Tree, "/d"),
        Answer::ok(vec![b"2".to_vec()])
    );
    let stage = decode_request(&msg(&["stage", "in", "file", "immediate", "/pfs/a", "/x"]));
    assert_eq!(c.handle(1001, ROOT, &stage.unwrap()).result, 0);
    assert_eq!(
        c.handle(1002, ROOT, &Request::Concurrency { value: 2 })
            .result,
        0
    );
    let counts = Request::Counts {
        scope: Scope::File,
        path: "/x".into(),
    };
    assert_eq!(c.handle(1003, ROOT, &counts).result, 0);
    let failures = Request::Failures {
        after: String::new(),
    };
    assert_eq!(c.handle(1004, ROOT, &failures).result, 0);
    assert_eq!(
        *fake.uids.lock().unwrap(),
        vec![0, 1000, 1001, 1002, 1003, 1004]
    );
    let calls = fake.calls.lock().unwrap();
    assert_eq!(calls[0].1, "/dw/v1/instances/7/stage_actions");
    assert_eq!(
        calls[1].2,
        json!({"action": "revoke", "path": "/d", "scope": "tree"})
    );
    assert_eq!(calls[2].2["owner"], 1001);
}

/// What the manager refuses the caller comes back as the API's errno: 403 (an
/// instance the caller may see but not change) EACCES, 404 (one they may not see, or
/// no stage there) ENOENT.
#[test]
fn refusals_as_the_caller_keep_the_apis_errno() {
    for (code, errno) in [(403, libc::EACCES), (404, libc::ENOENT)] {
        let (c, _) = control(move |_, _, _| Err(status(code)));
        for req in [
            Request::Concurrency { value: 1 },
            Request::Counts {
                scope: Scope::Tree,
                path: "/".into(),
            },
            Request::Action {
                action: Action::Terminate,
                scope: Scope::Tree,
                path: "/".into(),
            },
            Request::Failures {
                after: String::new(),
            },
        ] {
            assert_eq!(c.handle(1000, ROOT, &req).result, -errno, "{code} {req:?}");
        }
    }
}

#[test]
fn failures_page_and_cursor() {
    let (c, fake) = control(|_, _, _| {
        Ok(json!({"failures": [
            {"path": "/a", "errno": 2, "message": "m", "stage": 1},
            {"path": "/b", "errno": 13, "message": "m", "stage": 1},
        ], "more": false}))
    });
    let a = c.handle(
        1,
        ROOT,
        &Request::Failures {
            after: "/0 0".into(),
        },
    );
    assert_eq!(
        a.fields,
        vec![
            b"0".to_vec(),
            b"/a".to_vec(),
            b"-2".to_vec(),
            b"/b".to_vec(),
            b"-13".to_vec()
        ]
    );
    assert!(fake.calls.lock().unwrap()[0]
        .1
        .contains("stage_failures?after=/0%200&limit="));
    // A page too long for one message is cut, and says there is more.
    let long = format!("/{}", "p".repeat(4000));
    let (c, _) = control(move |_, _, _| {
        let f: Vec<Value> = (0..10)
            .map(|i| json!({"path": format!("{long}{i}"), "errno": 5, "message": "", "stage": 1}))
            .collect();
        Ok(json!({"failures": f, "more": false}))
    });
    let a = c.handle(
        1,
        ROOT,
        &Request::Failures {
            after: String::new(),
        },
    );
    assert_eq!(a.fields[0], b"1");
    assert_eq!(a.fields.len(), 1 + 2 * 4);
    assert!(a.encode().len() <= IOC_LEN);
}

/// A private mount (root.rs): requests carry mount paths, the manager gets instance
/// paths below the node's directory, and failures come back as mount paths, only the
/// mount's own.
#[test]
fn a_private_mount_speaks_mount_paths() {
    let dir = InodeNo((1 << 48) | 9);
    let (c, fake) = control(|m, p, _| {
        Ok(match (m, p) {
            ("POST", _) => json!({"id": 3}),
            ("GET", p) if p.contains("stage_failures") => json!({"failures": [
                {"path": "/.spillway-private/c0/a", "errno": 2, "message": "m", "stage": 1},
                {"path": "/.spillway-private/c0/d/b", "errno": 13, "message": "m", "stage": 1},
                {"path": "/.spillway-private/c0x/z", "errno": 5, "message": "m", "stage": 2},
            ], "more": true}),
            _ => json!({"complete": 1, "pending": 0, "deferred": 0, "failed": 0, "started": true}),
        })
    });
    let c = c.with_root(MountRoot::at(dir, "/.spillway-private/c0"));
    let stage_in = decode_request(&msg(&["stage", "in", "file", "immediate", "/pfs/a", "/x"]));
    assert_eq!(c.handle(1000, dir, &stage_in.unwrap()).result, 0);
    let stage_out = decode_request(&msg(&["stage", "out", "list", "job_end", "/a", "/pfs/a"]));
    assert_eq!(c.handle(1000, dir, &stage_out.unwrap()).result, 0);
    let counts = Request::Counts {
        scope: Scope::Tree,
        path: "/".into(),
    };
    assert_eq!(c.handle(1000, dir, &counts).result, 0);
    let first = c.handle(
        1000,
        dir,
        &Request::Failures {
            after: String::new(),
        },
    );
    // The third failure is another directory's: the walk ends there.
    assert_eq!(
        first.fields,
        vec![
            b"0".to_vec(),
            b"/a".to_vec(),
            b"-2".to_vec(),
            b"/d/b".to_vec(),
            b"-13".to_vec()
        ]
    );
    let next = c.handle(
        1000,
        dir,
        &Request::Failures {
            after: "/d/b".into(),
        },
    );
    assert_eq!(next.result, 0);
    let calls = fake.calls.lock().unwrap();
    assert_eq!(calls[0].2["destination"], "/.spillway-private/c0/x");
    assert_eq!(calls[0].2["source"], "/pfs/a");
    assert_eq!(
        calls[1].2["pairs"],
        json!([{"source": "/.spillway-private/c0/a", "destination": "/pfs/a"}])
    );
    assert!(calls[2]
        .1
        .contains("stage_counts?path=/.spillway-private/c0&scope=tree"));
    assert!(calls[3]
        .1
        .contains("stage_failures?after=/.spillway-private/c0/&limit="));
    assert!(calls[4]
        .1
        .contains("stage_failures?after=/.spillway-private/c0/d/b&limit="));
}
